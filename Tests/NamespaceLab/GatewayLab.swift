public import Foundation
import Glibc
public import Basics
public import Tunnel
import Device

/// A gateway with several users at once: a server namespace running `agent serve` (answering on
/// 198.51.100.7), and `clients` laptop namespaces, each with one uplink (`eth0`, 10.60.N.2) into
/// the server's namespace and its own `agent up` in split mode (10.77.0.0/24 into the tunnel).
/// Client N's inner address is 10.77.0.(10+N). Processes and namespaces go on deinit.
///
/// With `gateways` above one, that many `agent serve` processes share the server namespace, as
/// two instances on one host during a planned restart do: gateway G answers on 198.51.100.(7+G)
/// port 51820+G with a key of its own and TUN device roamG, all with 10.77.0.1/24; each routes
/// the inner addresses of the sessions it holds to its own device. Clients list them in order.
public final class GatewayLab {
    public let server: NamespaceLab
    public let laptops: [NamespaceLab]
    /// Keys, configurations and logs.
    public let directory: String
    private let agent: URL
    private var processes: [Process] = []
    /// Each gateway's process, by index, while it runs.
    private var gatewayProcesses: [Int: Process] = [:]
    private var clientProcesses: [Int: Process] = [:]
    public let gateways: Int
    /// Each gateway's public key, by index.
    public let serverKeys: [PublicKey]
    public static let serverInner = IPAddress("10.77.0.1")!
    public static let port: UInt16 = 51820

    /// Client `n`'s inner address.
    public func inner(_ n: Int) -> IPAddress { .v4(0x0A4D_000A + UInt32(n)) }

    /// Each client's public key, by index (its user is `userN`).
    public private(set) var clientKeys: [PublicKey] = []

    /// `extraUsers` are more users every gateway serves (lines of its `users:` list), for clients
    /// a test runs itself. `protocols` gives client N's `protocol:` (the default, 3, when absent).
    /// With `usersFrom` (a PostgreSQL URL), every gateway reads its users from there instead
    /// (snapshot `usersG.snapshot` in the lab's directory, session records as `gwG`). With
    /// `spread`, client N prefers gateway N modulo the gateways (the others come after it in order).
    /// With `stream`, every gateway also takes TLS on TCP 443 of its own address only, and every
    /// client has the stream transport (`tcp: 443`); `dropUDP` then leaves them only that.
    public init(clients: Int, gateways: Int = 1, drainPeriod: String = "0", offload: Bool = true, extraUsers: [String] = [],
                protocols: [Int] = [], usersFrom: String? = nil, spread: Bool = false, stream: Bool = false,
                agent: URL = RoamingLab.builtAgent) throws {
        self.agent = agent
        self.gateways = gateways
        server = try NamespaceLab()
        for g in 0..<gateways { try server.ip("address add 198.51.100.\(7 + g)/32 dev lo") }
        var laptops: [NamespaceLab] = []
        for n in 0..<clients {
            let laptop = try NamespaceLab()
            try laptop.attach(to: server, device: "eth0", peer: "lap\(n)", address: "10.60.\(n).2", gateway: "10.60.\(n).1")
            laptops.append(laptop)
        }
        self.laptops = laptops
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("roam-gateway-\(getpid())-\(server.name.split(separator: "-").last ?? "")").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        let serverKeys = try (0..<gateways).map { _ in try PrivateKey.generate() }
        self.serverKeys = serverKeys.map(\.publicKey)
        for (g, key) in serverKeys.enumerated() { try secret(key.revealBase64(), "server\(g).key") }
        func servers(for n: Int) -> String {
            gateways == 1
                ? "server: 198.51.100.7:\(Self.port)\nserver-key: \(serverKeys[0].publicKey.base64)"
                : "servers:\n" + (0..<gateways).map { g in
                    let priority = spread && g == n % gateways ? 0 : 100
                    return "  - {name: gw\(g), address: 198.51.100.\(7 + g):\(Int(Self.port) + g), key: \(serverKeys[g].publicKey.base64), "
                        + "priority: \(priority)}"
                }.joined(separator: "\n")
        }
        var users: [String] = []
        var clientKeys: [PublicKey] = []
        for n in 0..<clients {
            let key = try PrivateKey.generate()
            clientKeys.append(key.publicKey)
            try secret(key.revealBase64(), "client\(n).key")
            users.append("  - {name: user\(n), public-key: \(key.publicKey.base64), addresses: [\(inner(n))]}")
            let servers = servers(for: n)
            try """
                \(servers)
                private-key-file: \(directory)/client\(n).key
                mode: split
                routes: [10.77.0.0/24]
                tunnel: {offload: \(offload)}
                \(n < protocols.count ? "protocol: \(protocols[n])" : "")
                \(stream ? "tcp: 443" : "")
                """.write(toFile: directory + "/client\(n).yaml", atomically: true, encoding: .utf8)
        }
        self.clientKeys = clientKeys
        for g in 0..<gateways {
            let userLines = usersFrom.map { "users-from:\n  url: \"\($0)\"\n  snapshot: \(directory)/users\(g).snapshot\n  gateway: gw\(g)" }
                ?? "users:\n" + (users + extraUsers).joined(separator: "\n")
            try secret("""
                listen-port: \(Int(Self.port) + g)
                private-key-file: \(directory)/server\(g).key
                tunnel: {name: roam\(g), addresses: [10.77.0.1/24], offload: \(offload)}
                drain-period: \(drainPeriod)
                \(stream ? "tcp: {port: 443, addresses: [198.51.100.\(7 + g)]}" : "")
                \(userLines)
                """, Self.serverConfig(g))
        }
    }

    /// The server's namespace drops every UDP datagram from the laptops whose side of the link
    /// `laptops` names (an nftables interface pattern: all of them unless said), whose gateways
    /// then answer over TLS on TCP only, with `stream`.
    public func dropUDP(from laptops: String = "lap*") throws {
        try server.nft("add table inet noudp")
        try server.nft("add chain inet noudp in { type filter hook prerouting priority -300 ; }")
        try server.nft("add rule inet noudp in iifname \"\(laptops)\" meta l4proto udp counter drop")
    }

    private static func serverConfig(_ g: Int) -> String { g == 0 ? "server.yaml" : "server\(g).yaml" }
    /// Gateway `g`'s log (the first one's is server.log).
    public static func serverLog(_ g: Int) -> String { g == 0 ? "server.log" : "server\(g).log" }

    deinit {
        endAll(processes)
        try? FileManager.default.removeItem(atPath: directory)
    }

    /// Starts the server, then every client (or those of `only`), and returns once every tunnel is up.
    public func start(only: [Int]? = nil) throws {
        for g in 0..<gateways { try startGateway(g) }
        let clients = only ?? Array(laptops.indices)
        for n in clients { try startClient(n, waitingForTunnel: false) }
        for n in clients {
            guard labWait(seconds: 10, { self.log("client\(n).log").contains("msg=\"tunnel up\"") }) else {
                throw NamespaceLab.Failure(description: "client \(n) did not come up: \(log("client\(n).log"))")
            }
        }
    }

    /// Starts client `n`'s agent (again, after `stopClient`: its log goes on); with
    /// `waitingForTunnel`, returns once it says its tunnel is up, else throws with its log.
    public func startClient(_ n: Int, waitingForTunnel: Bool = true, seconds: Double = 10) throws {
        let before = log("client\(n).log").components(separatedBy: "msg=\"tunnel up\"").count
        let process = try startInside(laptops[n], agent, ["up", "--config", directory + "/client\(n).yaml", "--control",
                                                          directory + "/agent\(n).sock"], log: directory + "/client\(n).log")
        processes.append(process)
        clientProcesses[n] = process
        guard waitingForTunnel else { return }
        guard labWait(seconds: seconds, { self.log("client\(n).log").components(separatedBy: "msg=\"tunnel up\"").count > before }) else {
            throw NamespaceLab.Failure(description: "client \(n) did not come up: \(log("client\(n).log"))")
        }
    }

    /// Stops client `n`'s agent (SIGTERM) and waits for it to end.
    public func stopClient(_ n: Int) {
        guard let process = clientProcesses[n] else { return }
        endAll([process])
        clientProcesses[n] = nil
    }

    /// For every client, a probe stream (every `interval`) to port 5006+N and a checked TCP
    /// stream (4 MB/s) to port 5100+N of the server's inner address. Stop the probes when done.
    public func traffic(probeInterval: Duration = .milliseconds(20)) throws -> (probes: [ProbeStream], streams: [TCPStream]) {
        var probes: [ProbeStream] = []
        var streams: [TCPStream] = []
        for (n, laptop) in laptops.enumerated() {
            probes.append(try ProbeStream(from: SocketAddress(inner(n), port: 0), in: laptop,
                                          to: SocketAddress(Self.serverInner, port: UInt16(5006 + n)), in: server,
                                          interval: probeInterval))
            streams.append(try TCPStream(to: SocketAddress(Self.serverInner, port: UInt16(5100 + n)), listenerIn: server,
                                         from: laptop, bytesPerSecond: 4 << 20))
        }
        return (probes, streams)
    }

    /// Starts gateway `g` and returns once it serves.
    public func startGateway(_ g: Int) throws {
        let name = Self.serverLog(g)
        let before = log(name).components(separatedBy: "msg=serving").count
        let process = try startInside(server, agent, ["serve", "--config", directory + "/" + Self.serverConfig(g),
                                                      "--control", controlPath(g)], log: directory + "/" + name)
        processes.append(process)
        gatewayProcesses[g] = process
        guard labWait(seconds: 10, { self.log(name).components(separatedBy: "msg=serving").count > before }) else {
            throw NamespaceLab.Failure(description: "agent serve \(g) did not come up: \(log(name))")
        }
    }

    /// Sends `signal` to gateway `g`'s agent (SIGKILL: its machine loses power; SIGTERM: it
    /// stops, draining first if it has a drain period).
    public func signalGateway(_ g: Int, _ signal: Int32) {
        guard let process = gatewayProcesses[g], process.isRunning else { return }
        kill(process.processIdentifier, signal)
    }

    /// Gateway `g`'s control socket.
    public func controlPath(_ g: Int) -> String { directory + "/server\(g).sock" }

    /// Runs `agent drain` for gateway `g` and returns what it printed.
    public func drainGateway(_ g: Int) throws -> String {
        try NamespaceLab.capture(agent, ["drain", "--control", controlPath(g)]).output
    }

    /// Whether gateway `g`'s agent still runs.
    public func gatewayRuns(_ g: Int) -> Bool { gatewayProcesses[g]?.isRunning ?? false }

    /// The server agent's process (`ip netns exec` runs it in its own place).
    public var serverPID: Int32? { gatewayProcesses[0]?.processIdentifier }

    public func log(_ name: String) -> String { (try? String(contentsOfFile: directory + "/" + name, encoding: .utf8)) ?? "" }

    private func launch(in lab: NamespaceLab, _ arguments: [String], log: String) throws {
        processes.append(try startInside(lab, agent, arguments, log: directory + "/" + log))
    }

    private func secret(_ text: String, _ name: String) throws { try writeSecret(text, to: directory + "/" + name) }
}
