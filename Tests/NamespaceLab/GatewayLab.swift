public import Foundation
import Glibc
public import PathMonitor
import Tunnel

/// A gateway with several users at once: a server namespace running `agent serve` (answering on
/// 198.51.100.7), and `clients` laptop namespaces, each with one uplink (`eth0`, 10.60.N.2) into
/// the server's namespace and its own `agent up` in split mode (10.77.0.0/24 into the tunnel).
/// Client N's inner address is 10.77.0.(10+N). Processes and namespaces go on deinit.
public final class GatewayLab {
    public let server: NamespaceLab
    public let laptops: [NamespaceLab]
    /// Keys, configurations and logs.
    public let directory: String
    private let agent: URL
    private var processes: [Process] = []
    public static let serverInner = IPAddress("10.77.0.1")!
    public static let port: UInt16 = 51820

    /// Client `n`'s inner address.
    public func inner(_ n: Int) -> IPAddress { .v4(0x0A4D_000A + UInt32(n)) }

    public init(clients: Int, agent: URL = RoamingLab.builtAgent) throws {
        self.agent = agent
        server = try NamespaceLab()
        try server.ip("address add 198.51.100.7/32 dev lo")
        var laptops: [NamespaceLab] = []
        for n in 0..<clients {
            let laptop = try NamespaceLab()
            try laptop.ip("link add eth0 type veth peer name lap\(n) netns \(server.name)")
            try laptop.ip("address add 10.60.\(n).2/24 dev eth0")
            try laptop.ip("link set eth0 up")
            try server.ip("address add 10.60.\(n).1/24 dev lap\(n)")
            try server.ip("link set lap\(n) up")
            try laptop.ip("route add default via 10.60.\(n).1 dev eth0")
            laptops.append(laptop)
        }
        self.laptops = laptops
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("roam-gateway-\(getpid())-\(server.name.split(separator: "-").last ?? "")").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        let serverKey = try PrivateKey.generate()
        try secret(serverKey.revealBase64(), "server.key")
        var users: [String] = []
        for n in 0..<clients {
            let key = try PrivateKey.generate()
            try secret(key.revealBase64(), "client\(n).key")
            users.append("  - {name: user\(n), public-key: \(key.publicKey.base64), addresses: [\(inner(n))]}")
            try """
                server: 198.51.100.7:\(Self.port)
                server-key: \(serverKey.publicKey.base64)
                private-key-file: \(directory)/client\(n).key
                mode: split
                routes: [10.77.0.0/24]
                """.write(toFile: directory + "/client\(n).yaml", atomically: true, encoding: .utf8)
        }
        try secret("""
            listen-port: \(Self.port)
            private-key-file: \(directory)/server.key
            tunnel: {name: roam0, addresses: [10.77.0.1/24]}
            users:
            \(users.joined(separator: "\n"))
            """, "server.yaml")
    }

    deinit {
        for process in processes where process.isRunning { process.terminate() }
        for process in processes {
            let deadline = Date().addingTimeInterval(5)
            while process.isRunning && Date() < deadline { usleep(10_000) }
            if process.isRunning { kill(process.processIdentifier, SIGKILL) }
        }
        try? FileManager.default.removeItem(atPath: directory)
    }

    /// Starts the server, then every client, and returns once every tunnel is up.
    public func start() throws {
        try launch(in: server, ["serve", "--config", directory + "/server.yaml"], log: "server.log")
        guard waitFor(seconds: 10, { self.log("server.log").contains("msg=serving") }) else {
            throw NamespaceLab.Failure(description: "agent serve did not come up: \(log("server.log"))")
        }
        for (n, laptop) in laptops.enumerated() {
            try launch(in: laptop, ["up", "--config", directory + "/client\(n).yaml", "--control", directory + "/agent\(n).sock"],
                       log: "client\(n).log")
        }
        for n in laptops.indices {
            guard waitFor(seconds: 10, { self.log("client\(n).log").contains("msg=\"tunnel up\"") }) else {
                throw NamespaceLab.Failure(description: "client \(n) did not come up: \(log("client\(n).log"))")
            }
        }
    }

    /// The server agent's process (`ip netns exec` runs it in its own place).
    public var serverPID: Int32? { processes.first?.processIdentifier }

    public func log(_ name: String) -> String { (try? String(contentsOfFile: directory + "/" + name, encoding: .utf8)) ?? "" }

    public func waitFor(seconds: Double, _ condition: () -> Bool) -> Bool {
        let deadline = LabClock.now + .milliseconds(Int64(seconds * 1000))
        while LabClock.now < deadline {
            if condition() { return true }
            usleep(10_000)
        }
        return condition()
    }

    private func launch(in lab: NamespaceLab, _ arguments: [String], log: String) throws {
        let process = Process()
        process.executableURL = NamespaceLab.ipTool
        process.arguments = ["netns", "exec", lab.name, agent.path] + arguments
        let path = directory + "/" + log
        _ = FileManager.default.createFile(atPath: path, contents: nil)
        let handle = FileHandle(forWritingAtPath: path)
        process.standardError = handle
        process.standardOutput = handle
        try process.run()
        processes.append(process)
    }

    private func secret(_ text: String, _ name: String) throws {
        let path = directory + "/" + name
        _ = FileManager.default.createFile(atPath: path, contents: nil, attributes: [.posixPermissions: 0o600])
        try (text + "\n").write(toFile: path, atomically: false, encoding: .utf8)
    }
}
