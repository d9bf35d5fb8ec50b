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
            try laptop.attach(to: server, device: "eth0", peer: "lap\(n)", address: "10.60.\(n).2", gateway: "10.60.\(n).1")
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
        endAll(processes)
        try? FileManager.default.removeItem(atPath: directory)
    }

    /// Starts the server, then every client, and returns once every tunnel is up.
    public func start() throws {
        try launch(in: server, ["serve", "--config", directory + "/server.yaml"], log: "server.log")
        guard labWait(seconds: 10, { self.log("server.log").contains("msg=serving") }) else {
            throw NamespaceLab.Failure(description: "agent serve did not come up: \(log("server.log"))")
        }
        for (n, laptop) in laptops.enumerated() {
            try launch(in: laptop, ["up", "--config", directory + "/client\(n).yaml", "--control", directory + "/agent\(n).sock"],
                       log: "client\(n).log")
        }
        for n in laptops.indices {
            guard labWait(seconds: 10, { self.log("client\(n).log").contains("msg=\"tunnel up\"") }) else {
                throw NamespaceLab.Failure(description: "client \(n) did not come up: \(log("client\(n).log"))")
            }
        }
    }

    /// The server agent's process (`ip netns exec` runs it in its own place).
    public var serverPID: Int32? { processes.first?.processIdentifier }

    public func log(_ name: String) -> String { (try? String(contentsOfFile: directory + "/" + name, encoding: .utf8)) ?? "" }

    private func launch(in lab: NamespaceLab, _ arguments: [String], log: String) throws {
        processes.append(try startInside(lab, agent, arguments, log: directory + "/" + log))
    }

    private func secret(_ text: String, _ name: String) throws { try writeSecret(text, to: directory + "/" + name) }
}
