public import Foundation
import Glibc
public import Basics
public import Tunnel
public import Device

/// The VPN a roaming run drives: Roam's own `agent serve` / `agent up`, or Debian's
/// wireguard-go (userspace WireGuard) configured the way wg-quick would, on the same topology.
public enum TunnelUnderTest: String, CaseIterable, Sendable {
    case roam
    case wireguardGo = "wireguard-go"
}

/// Split: only the tunnel's prefix goes into the tunnel. Full: the default route does, and
/// the VPN's own packets must still find the physical uplink.
public enum LabRouting: String, CaseIterable, Sendable {
    case split
    case full
}

/// A laptop namespace (`eth0` 10.20.0.57, metric 100; `wifi0` 192.168.1.23, metric 600) and a
/// server namespace that is also the router (`eth-l`, `wifi-l`; the server answers on
/// 198.51.100.7), with a VPN server and client running between them as real processes.
public final class RoamingLab {
    public let vpn: TunnelUnderTest
    public let routing: LabRouting
    public let laptop: NamespaceLab
    public let server: NamespaceLab
    /// Keys, configurations and logs; removed on deinit.
    public let directory: String
    private let agent: URL
    public private(set) var client: Process?
    private var serverProcess: Process?
    /// Added to the environment of the processes the lab starts in the laptop (e.g. the bus
    /// address of a `LabResolved`).
    public var laptopEnvironment: [String: String] = [:]
    private var processes: [Process] = []
    private let names: (server: String, client: String)
    nonisolated(unsafe) private static var counter = 0
    private static let counterLock = NSLock()

    public var serverInner: IPAddress { IPAddress(vpn == .roam ? "10.77.0.1" : "10.88.0.1")! }
    public var clientInner: IPAddress { IPAddress(vpn == .roam ? "10.77.0.2" : "10.88.0.2")! }
    /// The server's outer UDP port.
    public var port: UInt16 { vpn == .roam ? 51820 : 51821 }
    /// The client's tunnel device.
    public var tunnelDevice: String { names.client }
    public var controlSocket: String { directory + "/agent.sock" }
    /// The laptop's resolv.conf as DHCP on its wired uplink would write it.
    public static let laptopResolvConf = "# from DHCP on eth0\nnameserver 10.20.0.1\nsearch home.example\n"
    /// Where `ip netns exec` finds the laptop's resolv.conf.
    public var laptopResolvConfPath: String { "/etc/netns/\(laptop.name)/resolv.conf" }

    /// The `agent` binary SwiftPM builds beside the test bundle or benchmark that is running.
    public static let builtAgent = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
        .appendingPathComponent("agent")

    /// Builds the lab with its keys and configurations; `startServer()` and `startClient()`
    /// start the VPN. `agent` is the Roam binary (unused for wireguard-go).
    public init(vpn: TunnelUnderTest, routing: LabRouting, agent: URL = builtAgent) throws {
        self.vpn = vpn
        self.routing = routing
        self.agent = agent
        (laptop, server) = try NamespaceLab.laptopAndServer()
        // The laptop's own resolv.conf (bind-mounted by `ip netns exec`): an agent that writes
        // the tunnel's resolvers must never reach the host's.
        try laptop.setResolvConf(Self.laptopResolvConf)
        Self.counterLock.lock()
        Self.counter += 1
        let n = Self.counter
        Self.counterLock.unlock()
        // wireguard-go's control sockets (/run/wireguard/NAME.sock) are shared by every namespace.
        names = vpn == .roam ? ("roam0", "roam0") : ("wgs\(getpid() % 100_000)x\(n)", "wgl\(getpid() % 100_000)x\(n)")
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("roam-lab-\(getpid())-\(n)").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true,
                                                attributes: [.posixPermissions: 0o700])
        try writeKeysAndConfigurations()
    }

    deinit {
        endAll(processes)
        if vpn == .wireguardGo {
            for name in [names.server, names.client] { unlink("/run/wireguard/\(name).sock") }
        }
        try? FileManager.default.removeItem(atPath: directory)
    }

    // MARK: Processes

    /// Starts the VPN server and returns when it serves.
    @discardableResult
    public func startServer() throws -> LabInstant {
        switch vpn {
        case .roam:
            let process = try start(in: server, agent, ["serve", "--config", directory + "/server.yaml"], log: "server.log")
            serverProcess = process
            // One more "msg=serving" than before; a server that stopped (a refused configuration) fails at once.
            let served = { self.log("server.log").components(separatedBy: "msg=serving").count - 1 > self.servings }
            guard waitFor(seconds: 10, { served() || !process.isRunning }), served() else {
                throw NamespaceLab.Failure(description: "agent serve did not come up: \(log("server.log"))")
            }
            servings += 1
        case .wireguardGo:
            let process = try start(in: server, URL(fileURLWithPath: "/usr/bin/wireguard-go"), ["-f", names.server], log: "server.log")
            serverProcess = process
            guard waitFor(seconds: 10, { access("/run/wireguard/\(self.names.server).sock", F_OK) == 0 }) else {
                throw NamespaceLab.Failure(description: "wireguard-go (server) did not come up: \(log("server.log"))")
            }
            try wg(server, "set \(names.server) listen-port \(port) private-key \(directory)/wg-server.key peer \(key("wg-client.pub")) allowed-ips 10.88.0.2/32")
            try server.ip("address add 10.88.0.1/24 dev \(names.server)")
            try server.ip("link set \(names.server) up")
        }
        return LabClock.now
    }
    private var servings = 0

    /// Stops the server (SIGTERM) and waits until it is gone.
    public func stopServer() {
        guard let process = serverProcess else { return }
        process.terminate()
        _ = waitFor(seconds: 5) { !process.isRunning }
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
        serverProcess = nil
        _ = waitFor(seconds: 2) { (try? self.server.ip("link show \(self.names.server)")) == nil }
    }

    /// Starts the client and returns once its tunnel device carries the tunnel's routes.
    /// `inside` runs Roam's agent within the namespace (e.g. a `UnitSandbox`'s command).
    public func startClient(_ extra: [String] = [], waitForTunnel: Bool = true, inside: [String] = []) throws {
        switch vpn {
        case .roam:
            // The log outlives a restart: this agent's tunnel is the next one it tells of.
            let upBefore = log("client.log").ranges(of: "msg=\"tunnel up\"").count
            client = try start(in: laptop, agent, ["up", "--config", directory + "/client.yaml", "--control", controlSocket] + extra,
                               log: "client.log", inside: inside)
            guard waitForTunnel else { return }
            guard waitFor(seconds: 10, { self.log("client.log").ranges(of: "msg=\"tunnel up\"").count > upBefore }) else {
                throw NamespaceLab.Failure(description: "agent up did not come up: \(log("client.log"))")
            }
        case .wireguardGo:
            let name = names.client
            client = try start(in: laptop, URL(fileURLWithPath: "/usr/bin/wireguard-go"), ["-f", name], log: "client.log")
            guard waitFor(seconds: 10, { access("/run/wireguard/\(name).sock", F_OK) == 0 }) else {
                throw NamespaceLab.Failure(description: "wireguard-go (client) did not come up: \(log("client.log"))")
            }
            let allowed = routing == .full ? "0.0.0.0/0" : "10.88.0.0/24"
            try wg(laptop, "set \(name) private-key \(directory)/wg-client.key peer \(key("wg-server.pub")) endpoint 198.51.100.7:\(port) allowed-ips \(allowed)")
            try laptop.ip("address add 10.88.0.2/24 dev \(name)")
            try laptop.ip("link set \(name) up")
            if routing == .full {
                // What wg-quick does: the tunnel's own packets carry a mark and use the main
                // table; everything else goes into the tunnel.
                try wg(laptop, "set \(name) fwmark 51821")
                try laptop.ip("route add default dev \(name) table 51821")
                try laptop.ip("rule add not fwmark 51821 table 51821")
                try laptop.ip("rule add table main suppress_prefixlength 0")
            }
        }
    }

    public var clientPID: Int32? { client.map(\.processIdentifier) }

    /// The operator's stop (`agent stop`): returns what it printed once the client is gone.
    @discardableResult
    public func stopClient() throws -> String {
        let said = try control("stop")
        if let client {
            // Bounded: an agent that did not take the stop is ended, and the test told why.
            if !waitFor(seconds: 20, { !client.isRunning }) {
                kill(client.processIdentifier, SIGKILL)
                client.waitUntilExit()
                throw NamespaceLab.Failure(description: "the client did not stop; 'agent stop' said: \(said)")
            }
            client.waitUntilExit()
        }
        return said
    }

    /// Adds `text` (YAML list items) to the server configuration's users; before `startServer()`.
    public func addServerUsers(_ text: String) throws {
        let path = directory + "/server.yaml"
        try (String(contentsOfFile: path, encoding: .utf8) + "\n" + text).write(toFile: path, atomically: false, encoding: .utf8)
    }

    /// Adds `text` (top-level keys) to the client's or the server's configuration file.
    public func configure(_ side: String, _ text: String) throws {
        try editConfiguration(side) { $0 + "\n" + text + "\n" }
    }

    /// Rewrites the client's or the server's configuration file with `edit` (e.g. before a reload).
    public func editConfiguration(_ side: String, _ edit: (String) -> String) throws {
        let path = directory + "/\(side).yaml"
        try edit(String(contentsOfFile: path, encoding: .utf8)).write(toFile: path, atomically: false, encoding: .utf8)
    }

    /// The server's public key, as clients pin it.
    public var serverPublicKey: PublicKey? {
        PrivateKey(base64: key("server.key")).map(\.publicKey)
    }

    /// Runs `agent ARGUMENTS` in the laptop namespace to its end (ended by PID after `seconds`)
    /// and returns its exit status and everything it printed. `wrapper` runs the whole command
    /// (e.g. unshare); `inside` runs the agent within the namespace (e.g. setpriv).
    public func runAgent(_ arguments: [String], wrapper: [String] = [], inside: [String] = [], seconds: Double = 20)
        throws -> (status: Int32, output: String)
    {
        let process = Process()
        let command = wrapper + [NamespaceLab.ipTool.path, "netns", "exec", laptop.name] + inside + [agent.path] + arguments
        process.executableURL = URL(fileURLWithPath: command[0])
        process.arguments = Array(command.dropFirst())
        process.environment = ProcessInfo.processInfo.environment.merging(laptopEnvironment) { $1 }
        let path = directory + "/run-\(runs).log"
        runs += 1
        _ = FileManager.default.createFile(atPath: path, contents: nil)
        let handle = FileHandle(forWritingAtPath: path)
        process.standardOutput = handle
        process.standardError = handle
        try process.run()
        processes.append(process)
        if !waitFor(seconds: seconds, { !process.isRunning }) {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
        process.waitUntilExit()
        return (process.terminationStatus, log("run-\(runs - 1).log"))
    }
    private var runs = 0

    /// SIGTSTP for Roam (its suspend hook's signal); wireguard-go knows no suspend, so it is
    /// stopped like the rest of a suspending machine (SIGSTOP).
    public func suspendClient() {
        guard let pid = clientPID else { return }
        kill(pid, vpn == .roam ? SIGTSTP : SIGSTOP)
    }

    public func resumeClient() {
        guard let pid = clientPID else { return }
        kill(pid, SIGCONT)
    }

    // MARK: Observations

    /// What the early-boot unit does before any interface is up: `agent lockdown on` from the
    /// client's configuration.
    public func loadBootLockdown() throws {
        let (status, output) = try runAgent(["lockdown", "on", "--config", directory + "/client.yaml"])
        guard status == 0 else { throw NamespaceLab.Failure(description: "agent lockdown on: \(output)") }
    }

    /// The boot lockdown, held (`agent lockdown on --hold`): returns once its guard is loaded.
    public func startBootHolder() throws -> Process {
        let holder = try start(in: laptop, agent, ["lockdown", "on", "--hold", "--config", directory + "/client.yaml", "--runtime", directory],
                               log: "holder.log")
        guard waitFor(seconds: 10, { self.nftTables().contains("table inet roam_boot") }) else {
            throw NamespaceLab.Failure(description: "agent lockdown on --hold did not hold: \(log("holder.log"))")
        }
        return holder
    }

    /// The laptop's nftables tables, as `nft list tables` prints them.
    public func nftTables() -> String {
        (try? NamespaceLab.capture(NamespaceLab.ipTool, ["netns", "exec", laptop.name, "nft", "list", "tables"]))?.output ?? ""
    }

    /// Whether the lockdown table is loaded in the laptop.
    public func lockdownLoaded() -> Bool { nftTables().contains("table inet roam") }

    /// A tap on the router's side of both uplinks that judges what the laptop sends: in full
    /// mode only the session, DHCP and neighbour discovery may leave; in split mode nothing for
    /// the tunnel's prefix may.
    /// `interfaces` in `lab` (a router between the laptop and the server) instead, with the same rule.
    public func leakTap(servers: [IPAddress] = [IPAddress("198.51.100.7")!], web: [SocketAddress] = [],
                        on interfaces: [String] = ["eth-l", "wifi-l"], in lab: NamespaceLab? = nil) throws -> LeakTap {
        let rule: LeakTap.Rule = routing == .full ? .full(servers: servers, port: port, web: web)
            : .split([Prefix(serverInner, length: 24)!])
        return try LeakTap(interfaces, in: lab ?? server, rule: rule)
    }

    /// Applications on the laptop that keep trying: a host on the internet (UDP and TCP), the
    /// LAN's resolver, IPv6 on the LAN, and (split mode) the tunnel's own prefix.
    public func leakBait() throws -> LeakBait {
        var targets = [SocketAddress(IPAddress("198.51.100.7")!, port: 9999), SocketAddress(IPAddress("198.51.100.7")!, port: 80),
                       SocketAddress(IPAddress("10.20.0.1")!, port: 53), SocketAddress(IPAddress("fd00:20::1")!, port: 9999)]
        if routing == .split { targets.append(SocketAddress(serverInner, port: 9999)) }
        return try LeakBait(from: laptop, targets: targets)
    }

    public func log(_ name: String) -> String { (try? String(contentsOfFile: directory + "/" + name, encoding: .utf8)) ?? "" }

    /// Roam's `agent status --json` as strings, nested fields by dotted keys (`path.interface`),
    /// lists joined by commas (empty for wireguard-go or a stopped agent).
    public func status() -> [String: String] {
        guard vpn == .roam, let output = try? control("status", "--json"),
              let answer = try? JSONSerialization.jsonObject(with: Data(output.utf8)) as? [String: Any],
              let object = answer["status"] as? [String: Any] else { return [:] }
        var flat: [String: String] = [:]
        func add(_ value: Any, _ key: String) {
            switch value {
            case let nested as [String: Any]: for (k, v) in nested { add(v, key + "." + k) }
            case let list as [Any]: flat[key] = list.map { "\($0)" }.joined(separator: ",")
            case is NSNull: flat[key] = "none"
            default: flat[key] = "\(value)"
            }
        }
        for (key, value) in object { add(value, key) }
        return flat
    }

    /// Runs an `agent` control command (status, reconnect, ...) against Roam's client and returns
    /// what it printed; only the control socket is needed, not the namespaces.
    public func control(_ arguments: String...) throws -> String {
        try NamespaceLab.capture(agent, arguments + ["--control", controlSocket]).output
    }

    /// Polls every 20 ms for up to `seconds` until `name`'s log contains `text`.
    public func wait(for text: String, in name: String, seconds: Double = 5) -> Bool {
        waitFor(seconds: seconds) { self.log(name).contains(text) }
    }

    /// Roam's reconnect attempts so far (binds, rebinds, handshakes).
    public func attempts() -> Int? { status()["attempts"].flatMap { Int($0) } }

    /// CPU time the client has used, all threads (from the scheduler's nanosecond counters).
    public func clientCPU() -> Duration { clientPID.map(Self.cpu(of:)) ?? .zero }

    /// CPU time the server has used, all threads.
    public func serverCPU() -> Duration { serverPID.map(Self.cpu(of:)) ?? .zero }

    /// The server's process (`ip netns exec` runs the agent in its own place).
    public var serverPID: Int32? { serverProcess.map(\.processIdentifier) }

    /// CPU time process `pid` has used, all threads.
    public static func cpu(of pid: Int32) -> Duration {
        var total: Int64 = 0
        for task in (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? [] {
            let text = (try? String(contentsOfFile: "/proc/\(pid)/task/\(task)/schedstat", encoding: .utf8)) ?? ""
            total += text.split(separator: " ").first.flatMap { Int64($0) } ?? 0
        }
        return .nanoseconds(total)
    }

    /// Voluntary context switches of all the client's threads: how often it woke up.
    public func clientWakeups() -> Int {
        guard let pid = clientPID else { return 0 }
        var total = 0
        for task in (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? [] {
            let text = (try? String(contentsOfFile: "/proc/\(pid)/task/\(task)/status", encoding: .utf8)) ?? ""
            for line in text.split(separator: "\n") where line.hasPrefix("voluntary_ctxt_switches:") {
                total += Int(line.split(separator: "\t").last ?? "") ?? 0
            }
        }
        return total
    }

    /// The client's resident memory in kB: (VmRSS, RssAnon).
    public func clientMemory() -> (rss: Int, anonymous: Int) {
        guard let pid = clientPID else { return (0, 0) }
        let text = (try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)) ?? ""
        func field(_ name: String) -> Int {
            text.split(separator: "\n").first { $0.hasPrefix(name + ":") }
                .flatMap { Int($0.split(separator: " ").dropLast().last ?? "") } ?? 0
        }
        return (field("VmRSS"), field("RssAnon"))
    }

    /// The tunnel device as the kernel shows it: index, flags, MTU, addresses and the routes
    /// into it. A reconnect must leave all of it as it was.
    public func tunnelSnapshot() -> String {
        let name = tunnelDevice
        // Its MTU follows the path (path MTU discovery); everything else stays.
        let link = ((try? laptop.ip("-o link show \(name)")) ?? "absent")
            .replacingOccurrences(of: " mtu [0-9]+", with: "", options: .regularExpression)
        let addresses = (try? laptop.ip("-o address show dev \(name)")) ?? ""
        let routes = ((try? laptop.ip("route show table all dev \(name)")) ?? "")
            .split(separator: "\n").filter { !$0.contains("linkdown") }.sorted().joined(separator: "\n")
        return [link, addresses, routes].joined(separator: "\n")
    }

    /// The server-side index of the router's interface facing the laptop's `eth0`.
    public func serverIndex(of interface: String) -> Int32? {
        guard let line = try? server.ip("-o link show \(interface)") else { return nil }
        return Int32(line.prefix { $0 != ":" })
    }

    /// Polls `condition` every 10 ms for up to `seconds`.
    public func waitFor(seconds: Double, _ condition: () -> Bool) -> Bool { labWait(seconds: seconds, condition) }

    // MARK: Setup

    private func writeKeysAndConfigurations() throws {
        switch vpn {
        case .roam:
            let serverKey = try PrivateKey.generate()
            let clientKey = try PrivateKey.generate()
            try secret(serverKey.revealBase64(), "server.key")
            try secret(clientKey.revealBase64(), "client.key")
            // Owner-only, as `agent serve` demands of a file with users in it.
            try secret("""
                listen-port: \(port)
                private-key-file: \(directory)/server.key
                tunnel: {name: roam0, addresses: [10.77.0.1/24]}
                users:
                  - {name: alice, public-key: \(clientKey.publicKey.base64), addresses: [10.77.0.2]}
                """, "server.yaml")
            try """
                server: 198.51.100.7:\(port)
                server-key: \(serverKey.publicKey.base64)
                private-key-file: \(directory)/client.key
                mode: \(routing.rawValue)
                \(routing == .split ? "routes: [10.77.0.0/24]" : "")
                """.write(toFile: directory + "/client.yaml", atomically: true, encoding: .utf8)
        case .wireguardGo:
            for side in ["server", "client"] {
                let key = try NamespaceLab.capture(URL(fileURLWithPath: "/usr/bin/wg"), ["genkey"]).output
                try secret(key.trimmingCharacters(in: .whitespacesAndNewlines), "wg-\(side).key")
                let pub = try shell("/usr/bin/wg pubkey < \(directory)/wg-\(side).key")
                try pub.write(toFile: directory + "/wg-\(side).pub", atomically: true, encoding: .utf8)
            }
        }
    }

    private func key(_ name: String) -> String {
        ((try? String(contentsOfFile: directory + "/" + name, encoding: .utf8)) ?? "").trimmingCharacters(in: .whitespacesAndNewlines)
    }

    private func secret(_ text: String, _ name: String) throws { try writeSecret(text, to: directory + "/" + name) }

    private func wg(_ lab: NamespaceLab, _ arguments: String) throws {
        let (status, output) = try NamespaceLab.capture(NamespaceLab.ipTool,
            ["netns", "exec", lab.name, "/usr/bin/wg"] + arguments.split(separator: " ").map(String.init))
        guard status == 0 else { throw NamespaceLab.Failure(description: "wg \(arguments): \(output)") }
    }

    private func shell(_ command: String) throws -> String {
        let (status, output) = try NamespaceLab.capture(URL(fileURLWithPath: "/bin/sh"), ["-c", command])
        guard status == 0 else { throw NamespaceLab.Failure(description: "\(command): \(output)") }
        return output.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// Starts `executable` inside `lab` (within `inside`); its output goes to `log` in the lab's directory.
    private func start(in lab: NamespaceLab, _ executable: URL, _ arguments: [String], log: String, inside: [String] = []) throws -> Process {
        let environment = lab === laptop ? ProcessInfo.processInfo.environment.merging(laptopEnvironment) { $1 } : nil
        let process = try startInside(lab, executable, arguments, log: directory + "/" + log, environment: environment, inside: inside)
        processes.append(process)
        return process
    }
}
