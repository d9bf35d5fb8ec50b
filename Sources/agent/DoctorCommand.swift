import Topology
import ArgumentParser
import Basics
import ConfigReader
import Control
import ControlWire
import Device
import Diagnosis
import Glibc
import Lockdown
import Netlink
import PathMonitor
import Settings
import Streams
import Synchronization
import SystemDNS
import Tunnel

/// `agent doctor`: what stands between this machine and its gateway now, in words a person can
/// act on. It only looks: the facts are gathered here, `Doctor.findings` judges them.
struct DoctorCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "doctor",
        abstract: "Say why the tunnel does not come up: what is wrong on this machine and network now, and what to do.",
        discussion: """
            Checks, in order: whether the agent runs and what its status says (state, path, last transition); the \
            clock; for each server of the configuration, that its name resolves (and how long it took), which \
            uplink and source address the kernel's route to it takes, or that there is none; that the gateway \
            answers a handshake initiation over UDP (the one `agent up` sends, with this client's key: a response, \
            a cookie reply or a refusal proves it is there; three tries, 1.5 s each); with 'tcp:', that TCP and \
            TLS to its port come up and the gateway answers inside; whether Roam's nftables tables are loaded as \
            the configuration and the agent's state call for; and (full mode) whether another VPN's policy rules \
            decide before Roam's. Each finding has a severity (ok, warning, problem), what was seen, and what to \
            do. It changes nothing on the machine: no route, rule, firewall, resolver or link; its sockets carry \
            the session's mark and are closed at once. With the lockdown loaded by a running agent, only the \
            agent's own sockets pass, so the doctor's handshake is stopped and said to be. Run it as root: \
            nftables, the mark and the key file need it. Exit status: 0 when no finding is a problem, 1 \
            otherwise, 2 for a configuration it cannot read. \
            Does not yet check: the gateway's certificate or a proxy's answer apart from the stream as a whole, \
            IPv6 and IPv4 separately when a name has both (the first address with a route is tried), the clock \
            against the gateway's, captive portals (the agent's status says when it found one), or the path MTU.
            """)

    @Option(help: "The client configuration file (as roam-client's `agent up` reads it).")
    var config = "/etc/roam/client.yaml"
    @OptionGroup var control: ControlOptions
    @Flag(help: "Print the findings as one JSON object.")
    var json = false

    /// Initiations sent over UDP before the gateway counts as silent, and how long each waits.
    static let tries = 3
    static let wait: Duration = .milliseconds(1500)
    /// How long TCP, the proxy and TLS may take, and then the answer inside.
    static let streamWait: Duration = .seconds(5)

    func run() throws {
        let (reader, root) = try YAMLReader.load(config, as: .clientConfiguration)
        let settings = try reader.client(root)
        let facts = DoctorFacts.gather(settings, control: control.control)
        let findings = Doctor.findings(facts)
        print(json ? Self.json(findings).text : Self.text(findings))
        if Doctor.exitStatus(findings) != 0 { throw ExitCode(Doctor.exitStatus(findings)) }
    }

    /// One block per finding: severity and title, then what was seen and what to do, indented.
    static func text(_ findings: [Finding]) -> String {
        findings.map { finding in
            let label = switch finding.severity { case .ok: "ok     "; case .warning: "warning"; case .problem: "PROBLEM" }
            var lines = ["\(label)  " + (finding.server.map { "[\($0)] " } ?? "") + finding.title]
            lines += finding.evidence.map { "         seen: \($0)" }
            if let fix = finding.fix { lines.append("         do:   \(fix)") }
            return lines.joined(separator: "\n")
        }.joined(separator: "\n")
    }

    static func json(_ findings: [Finding]) -> JSON {
        .object([
            ("ok", .bool(Doctor.exitStatus(findings) == 0)),
            ("problems", .int(Int64(findings.count { $0.severity == .problem }))),
            ("warnings", .int(Int64(findings.count { $0.severity == .warning }))),
            ("findings", .array(findings.map { finding in
                .object([("check", .string(finding.check.rawValue)), ("severity", .string(finding.severity.rawValue)),
                         ("server", finding.server.map(JSON.string) ?? .null), ("title", .string(finding.title)),
                         ("evidence", .array(finding.evidence.map(JSON.string))), ("fix", finding.fix.map(JSON.string) ?? .null)])
            })),
        ])
    }
}

extension DoctorFacts {
    /// Looks at the machine, the network and the agent for `settings`.
    static func gather(_ settings: ClientSettings, control: String) -> DoctorFacts {
        // Without root the mark, nftables and the key cannot be used: the checks that need them say so.
        let privileged = Preflight.hasNetworkAdmin(processStatus: SystemFiles.text("/proc/self/status") ?? "")
        let mark = privileged ? settings.mode.socketMark : nil
        let model = try? Self.network(tunnel: settings.tunnel.name)
        let lockdown = privileged ? try? Lockdown() : nil
        // The key and the credentials, as `agent up` reads them: a version 2 gateway refuses a
        // password user's handshake without them.
        let key: Result<(PrivateKey, Credentials?), DoctorError> = Result { (try loadPrivateKey(settings.privateKeyFile), try UpCommand.credentials(settings)) }
            .mapError { DoctorError("the private key or the password cannot be read: \($0)") }
        let agent = Self.agent(at: control)
        // A version 2 handshake the gateway accepts takes the place of a rekey the running agent
        // may have in flight, and moves the timestamps it checks: with an agent running, the
        // doctor sends none (version 3's first message leaves the gateway's state alone).
        let quiet: String? = if settings.protocolVersion == 2, case .running = agent {
            "with protocol 2, a handshake would disturb the running agent's session on the gateway; its status says how the gateway answers"
        } else {
            nil
        }
        var servers: [ServerFacts] = []
        for entry in settings.servers {
            servers.append(Self.server(entry, settings: settings, model: model, mark: mark, key: key, lockdown: lockdown, quiet: quiet))
        }
        return DoctorFacts(
            clock: Self.clock(), agent: agent, servers: servers,
            lockdown: LockdownFacts(configured: settings.lockdown, tables: Self.tables(lockdown)),
            rules: Result { () throws(NetlinkError) in try NetlinkSocket().rules() }.mapError { DoctorError("cannot read the policy rules: \($0)") },
            mode: settings.mode, uplinks: model.map(Self.uplinks) ?? [], defaultRoutes: model.map(Self.defaultRoutes) ?? [])
    }

    static func clock() -> WallClock {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        return WallClock(unixSeconds: Int64(ts.tv_sec), text: wallClock(ago: .zero))
    }

    static func agent(at socket: String) -> AgentFact {
        guard access(socket, F_OK) == 0 else { return .notRunning(socket: socket) }
        do {
            let answer = try ControlClient.ask(.status, at: socket)
            guard let status = answer["status"] else { return .unanswered(socket: socket, why: "no status in \(answer.text)") }
            let path = status["path"].flatMap { path -> String? in
                guard let interface = path["interface"]?.string else { return nil }
                return interface + (path["source"]?.string.map { " from \($0)" } ?? "") + (path["transport"]?.string.map { " over \($0)" } ?? "")
            }
            let server = status["server"].flatMap { server in
                server["name"]?.string.map { $0 + (server["address"]?.string.map { " (\($0))" } ?? "") }
            }
            let transition = status["last_transition"]
            return .running(AgentStatus(state: status["state"]?.string ?? "unknown", server: server, path: path,
                                        reason: transition?["reason"]?.string, since: transition?["at"]?.string))
        } catch {
            return .unanswered(socket: socket, why: "\(error)")
        }
    }

    /// The kernel's links, addresses and routes now, from one dump.
    static func network(tunnel: String) throws(NetlinkError) -> NetworkModel {
        var decoder = NetlinkDecoder()
        var model = NetworkModel(tunnelInterface: tunnel)
        for change in try NetlinkSocket().dump(decoder: &decoder) { model.apply(LinkClassifier.refine(change)) }
        return model
    }

    static func uplinks(_ model: NetworkModel) -> [Uplink] {
        model.links.values.filter { $0.kind != .loopback && $0.kind != .tunnel && $0.name != model.tunnelInterface }
            .sorted { $0.index < $1.index }
            .map { Uplink(name: $0.name, isUp: $0.isUp, hasCarrier: $0.hasCarrier, addresses: model.usableAddresses(on: $0.index)) }
    }

    static func defaultRoutes(_ model: NetworkModel) -> [String] {
        model.routes.values.filter { $0.table == Route.mainTable && $0.destination.length == 0 && $0.type == .unicast }
            .flatMap { route in
                route.nextHops.map { hop in
                    "default" + (hop.gateway.map { " via \($0)" } ?? "") + " dev \(model.links[hop.linkIndex]?.name ?? "if\(hop.linkIndex)") metric \(route.metric)"
                }
            }.sorted()
    }

    static func tables(_ lockdown: Lockdown?) -> Result<LoadedTables, DoctorError> {
        guard let lockdown else { return .failure(DoctorError("nftables cannot be read without root (or CAP_NET_ADMIN)")) }
        do {
            return .success(LoadedTables(lockdown: try lockdown.isInstalled(), guarded: try lockdown.isInstalled(LockdownPolicy.guardTable),
                                         boot: try lockdown.isInstalled(LockdownPolicy.bootGuardTable)))
        } catch {
            return .failure(DoctorError("\(error)"))
        }
    }

    /// What the lockdown has stopped so far, all causes; nil without one to read.
    static func stopped(_ lockdown: Lockdown?) -> UInt64? {
        (try? lockdown?.counters()).map { $0.values.reduce(0, +) }
    }

    /// Packets the lockdown stopped since it counted `before`.
    static func increase(since before: UInt64?, _ lockdown: Lockdown?) -> UInt64 {
        guard let before, let after = stopped(lockdown), after > before else { return 0 }
        return after - before
    }

    static func server(_ entry: ServerEntry, settings: ClientSettings, model: NetworkModel?, mark: UInt32?,
                       key: Result<(PrivateKey, Credentials?), DoctorError>, lockdown: Lockdown?, quiet: String? = nil) -> ServerFacts {
        let port = entry.endpoint.port ?? 0
        var facts = ServerFacts(name: entry.name, host: entry.endpoint.host, port: port, lookup: .literal, routes: [],
                                udp: .notTried("no address to send to"), streamPort: settings.stream?.port)
        var addresses: [IPAddress]
        if let address = entry.endpoint.address {
            addresses = [address]
        } else {
            let started = Instant.now()
            do throws(ResolverError) {
                addresses = try Resolver.addresses(of: entry.endpoint.host, mark: mark)
                facts.lookup = .resolved(addresses, took: Instant.now() - started)
            } catch {
                facts.lookup = .failed("\(error)", temporary: error.isTemporary, took: Instant.now() - started)
                addresses = []
            }
        }
        guard let model else {
            facts.udp = .notTried("the kernel's routes could not be read")
            return facts
        }
        facts.routes = addresses.map { AddressRoutes(address: $0, paths: model.paths(to: $0)) }
        guard let target = facts.routes.first(where: { !$0.paths.isEmpty }) else {
            if !addresses.isEmpty { facts.udp = .notTried("no route to send over") }
            if settings.stream != nil { facts.stream = .notTried("no route to send over") }
            return facts
        }
        if let quiet {
            facts.udp = .notTried(quiet)
            if settings.stream != nil { facts.stream = .notTried(quiet) }
            return facts
        }
        let path = target.paths[0]
        let gateway = SocketAddress(target.address, port: port)
        let core: ClientCore
        do {
            let (privateKey, credentials) = try key.get()
            core = try ClientCore(privateKey: privateKey, serverKey: entry.key, credentials: credentials,
                                  version: settings.protocolVersion, cipher: settings.cipher)
        } catch {
            facts.udp = .notTried("\(error)")
            if settings.stream != nil { facts.stream = .notTried("\(error)") }
            return facts
        }
        facts.udp = udpProbe(gateway, over: path, core: core, mark: mark, lockdown: lockdown)
        if let stream = settings.stream {
            facts.stream = streamProbe(gateway, entry: entry, stream: stream, settings: settings, over: path, core: core, mark: mark, lockdown: lockdown)
        }
        return facts
    }

    /// Handshake initiations over UDP from `path`'s interface and source, with the session's mark.
    static func udpProbe(_ gateway: SocketAddress, over path: Path, core: ClientCore, mark: UInt32?, lockdown: Lockdown?) -> Probe {
        let via = "\(path.interface) (\(path.source))"
        let before = stopped(lockdown)
        let socket: UDPSocket
        do {
            socket = try UDPSocket(bindingTo: SocketAddress(path.source, port: 0), device: path.interface, mark: mark)
        } catch {
            return .failed("\(error)", via: via)
        }
        var core = core
        var stranger: Int?
        for _ in 0..<DoctorCommand.tries {
            switch exchange(with: gateway, through: socket, core: &core, wait: DoctorCommand.wait) {
            case .answered(let answer, let from, let rtt):
                if case .unexpected(let bytes) = answer { stranger = bytes; continue }
                return .answered(answer, from: "\(from)", rtt: rtt, via: via)
            case .failed(let why): return .failed(why, via: via, stoppedByLockdown: increase(since: before, lockdown))
            case .silent: continue
            }
        }
        if let stranger { return .answered(.unexpected(bytes: stranger), from: "\(gateway)", rtt: .zero, via: via) }
        return .silent(tries: DoctorCommand.tries, wait: DoctorCommand.wait, via: via, stoppedByLockdown: increase(since: before, lockdown))
    }

    /// TCP and TLS to the gateway's `tcp` port from `path` (through the proxy, when there is one),
    /// then a handshake initiation inside.
    static func streamProbe(_ gateway: SocketAddress, entry: ServerEntry, stream: ClientStreamSettings, settings: ClientSettings,
                            over path: Path, core: ClientCore, mark: UInt32?, lockdown: Lockdown?) -> Probe {
        let via = "\(path.interface) (\(path.source))"
        let target = SocketAddress(gateway.ip, port: stream.port)
        let context: TLSContext
        let proxy: HTTPProxy?
        do {
            context = try TLSContext.client(serverName: stream.serverName ?? entry.endpoint.host)
            proxy = try ClientDaemon.CoreRunner.proxy(settings)
        } catch {
            return .notTried("\(error)")
        }
        let before = stopped(lockdown)
        let started = Instant.now()
        let done = Semaphore()
        let first = Mutex<StreamCarrier.Event?>(nil)
        let carrier = StreamCarrier.open(to: target, as: gateway, host: entry.endpoint.address == nil ? entry.endpoint.host : nil,
                                         from: path.source, device: path.interface, mark: mark, proxy: proxy, context: context,
                                         timeout: DoctorCommand.streamWait) { _, event in
            let isFirst = first.withLock { told in
                defer { if told == nil { told = event } }
                return told == nil
            }
            if isFirst { done.signal() }
        }
        defer { carrier.close() }
        // The carrier says how the opening went within its timeout, whatever happens.
        done.wait()
        let opened = Instant.now() - started
        switch first.withLock({ $0 }) {
        case .opened:
            var core = core
            let inside: Answer? = switch exchange(with: gateway, through: carrier, core: &core, wait: DoctorCommand.streamWait) {
            case .answered(let answer, _, _): answer
            default: nil
            }
            return .answered(.tls(suite: carrier.suite, gateway: inside), from: "\(target)", rtt: opened, via: via)
        case .failed(let why) where why.contains("no answer") || why.contains("timed out"):
            return .silent(tries: 1, wait: DoctorCommand.streamWait, via: via, stoppedByLockdown: increase(since: before, lockdown))
        case .failed(let why): return .failed(why, via: via)
        case nil: return .failed("the stream said nothing", via: via)
        }
    }

    enum Exchange {
        case answered(Answer, from: SocketAddress, rtt: Duration)
        case silent
        case failed(String)
    }

    /// One handshake initiation through `carrier` and what came back within `wait`. Nothing
    /// more is sent: no identity after a version 3 response, so the gateway holds no session;
    /// a version 2 session the response made is left unused (a goodbye would end the agent's
    /// session with it), and none is made while an agent runs (`gather`).
    static func exchange(with gateway: SocketAddress, through carrier: any PacketCarrier, core: inout ClientCore, wait: Duration) -> Exchange {
        let sent = Instant.now()
        let datagrams: [[UInt8]]
        do throws(CryptoError) {
            datagrams = try core.initiation(now: sent, wallClock: .now())
        } catch {
            return .failed("\(error)")
        }
        for datagram in datagrams {
            let refused: DeviceError? = datagram.withUnsafeBytes { bytes in
                do throws(DeviceError) {
                    _ = try carrier.send(bytes, to: gateway)
                    return nil
                } catch {
                    return error
                }
            }
            if let refused { return .failed("\(refused)") }
        }
        var buffer = [UInt8](repeating: 0, count: 65_536)
        let deadline = sent + wait
        var stranger: (Int, SocketAddress)?
        while case let now = Instant.now(), now < deadline {
            let received: Result<(length: Int, peer: SocketAddress, segment: Int)?, DeviceError> = buffer.withUnsafeMutableBytes { bytes in
                do throws(DeviceError) {
                    return .success(try carrier.receiveJoined(into: bytes, timeout: deadline - now))
                } catch {
                    return .failure(error)
                }
            }
            let got: (length: Int, peer: SocketAddress, segment: Int)
            switch received {
            case .failure(let error): return .failed("\(error)")
            case .success(nil): continue
            case .success(let some?): got = some
            }
            var datagram = Array(buffer[0..<min(got.length, max(got.segment, 1))])
            let (version, type) = (datagram.first ?? 0, datagram.count > 1 ? datagram[1] : 0)
            let rtt = Instant.now() - sent
            switch core.receive(&datagram, fromServer: got.peer == gateway, now: .now()) {
            case .established:
                // No goodbye: on the gateway it would first promote the doctor's session over the
                // agent's, then end both. An unused session is replaced by the next handshake.
                return .answered(.response(version: version), from: got.peer, rtt: rtt)
            case .rejected: return .answered(.rejected, from: got.peer, rtt: rtt)
            case .cookie: return .answered(.cookieReply, from: got.peer, rtt: rtt)
            case .send: return .answered(type == 5 ? .cookieReply : .response(version: version), from: got.peer, rtt: rtt)
            case .sessionUnknown: return .answered(.sessionUnknown, from: got.peer, rtt: rtt)
            default:
                // A hint names a session the doctor never had: still the gateway's voice, from its address.
                if type == 4, got.peer == gateway, datagram.count == 8 { return .answered(.sessionUnknown, from: got.peer, rtt: rtt) }
                stranger = (datagram.count, got.peer)
            }
        }
        if let (bytes, peer) = stranger { return .answered(.unexpected(bytes: bytes), from: peer, rtt: Instant.now() - sent) }
        return .silent
    }
}
