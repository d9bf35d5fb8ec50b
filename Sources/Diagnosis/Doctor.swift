public import Topology
public import Basics
import Netlink
import PathMonitor
public import Device

/// What `agent doctor` looked at on this machine, now: gathered at the edge (netlink dumps, a
/// look-up, a handshake sent, nftables listed, the agent asked), judged by `Doctor.findings`.
public struct DoctorFacts: Sendable {
    /// The wall clock: seconds since 1970 and the same as people read it.
    public var clock: WallClock
    public var agent: AgentFact
    /// Each configured server, in the configuration's order.
    public var servers: [ServerFacts]
    public var lockdown: LockdownFacts
    /// The kernel's policy rules, or why they could not be read.
    public var rules: Result<[RoutingRule], DoctorError>
    /// The configuration's routing mode (which rules come before the tunnel's).
    public var mode: RoutingMode
    /// Every uplink the kernel knows (not loopback, not the tunnel), for the evidence of a
    /// missing route.
    public var uplinks: [Uplink]
    /// The main table's default routes, as `ip route` would say them.
    public var defaultRoutes: [String]
    /// The connectivity check; nil when there was no uplink to make it over.
    public var portal: PortalFact?
    /// What the path to the first server reached carries; nil without a route to one.
    public var pathMTU: PathMTUFacts?
    /// resolv.conf as applications read it.
    public var systemResolvers: SystemResolvers?
    /// The systemd units that run this configuration; nil for one they do not run.
    public var units: UnitFacts?

    public init(clock: WallClock, agent: AgentFact, servers: [ServerFacts], lockdown: LockdownFacts,
                rules: Result<[RoutingRule], DoctorError>, mode: RoutingMode, uplinks: [Uplink], defaultRoutes: [String]) {
        self.clock = clock
        self.agent = agent
        self.servers = servers
        self.lockdown = lockdown
        self.rules = rules
        self.mode = mode
        self.uplinks = uplinks
        self.defaultRoutes = defaultRoutes
    }
}

/// Why something could not be looked at, in words.
public struct DoctorError: Error, Equatable, Sendable, CustomStringConvertible {
    public var description: String
    public init(_ description: String) { self.description = description }
}

/// The wall clock when the doctor ran.
public struct WallClock: Equatable, Sendable {
    public var unixSeconds: Int64
    /// RFC 3339, UTC.
    public var text: String
    public init(unixSeconds: Int64, text: String) {
        self.unixSeconds = unixSeconds
        self.text = text
    }
}

/// What the agent's control socket said.
public enum AgentFact: Equatable, Sendable {
    /// No control socket at `socket`.
    case notRunning(socket: String)
    /// A socket that did not answer `status` (a permission, an agent that hangs).
    case unanswered(socket: String, why: String)
    case running(AgentStatus)
}

/// The parts of the agent's status the doctor speaks of.
public struct AgentStatus: Equatable, Sendable {
    public var state: String
    public var server: String?
    /// The path as people read it: `eth0 from 10.20.0.57 over udp`.
    public var path: String?
    /// The last transition's reason and when it was.
    public var reason: String?
    public var since: String?
    /// The login page the agent's connectivity check was sent to, while it waits behind a portal.
    public var portal: String?
    public var mtu: AgentMTU?
    /// Nil when the agent leaves DNS alone.
    public var dns: AgentDNS?
    public var upkeep: [AgentUpkeep]
    public init(state: String, server: String? = nil, path: String? = nil, reason: String? = nil, since: String? = nil,
                portal: String? = nil, mtu: AgentMTU? = nil, dns: AgentDNS? = nil, upkeep: [AgentUpkeep] = []) {
        self.state = state
        self.server = server
        self.path = path
        self.reason = reason
        self.since = since
        self.portal = portal
        self.mtu = mtu
        self.dns = dns
        self.upkeep = upkeep
    }
}

/// An interface the machine could reach the gateway through.
public struct Uplink: Equatable, Sendable {
    public var name: String
    public var isUp: Bool
    public var hasCarrier: Bool
    public var addresses: [IPAddress]
    public init(name: String, isUp: Bool, hasCarrier: Bool, addresses: [IPAddress]) {
        self.name = name
        self.isUp = isUp
        self.hasCarrier = hasCarrier
        self.addresses = addresses
    }
}

/// One server of the configuration and what was seen of it.
public struct ServerFacts: Sendable {
    public var name: String
    public var host: String
    public var port: UInt16
    public var lookup: Lookup
    /// The uplinks that reach each address, best first (`NetworkModel.paths(to:)`).
    public var routes: [AddressRoutes]
    /// The handshake initiation sent over UDP.
    public var udp: Probe
    /// TLS on TCP to the `tcp` port, when the configuration has `tcp:`; nil otherwise.
    public var stream: Probe?
    public var streamPort: UInt16?

    public init(name: String, host: String, port: UInt16, lookup: Lookup, routes: [AddressRoutes], udp: Probe,
                stream: Probe? = nil, streamPort: UInt16? = nil) {
        self.name = name
        self.host = host
        self.port = port
        self.lookup = lookup
        self.routes = routes
        self.udp = udp
        self.stream = stream
        self.streamPort = streamPort
    }
}

/// The paths to one of a server's addresses.
public struct AddressRoutes: Sendable {
    public var address: IPAddress
    public var paths: [Path]
    public init(address: IPAddress, paths: [Path]) {
        self.address = address
        self.paths = paths
    }
}

/// How a server's name became addresses.
public enum Lookup: Equatable, Sendable {
    /// The configuration names an address: nothing to look up.
    case literal
    case resolved([IPAddress], took: Duration)
    /// `temporary`: no answer (no name server reachable), not a name that does not exist.
    case failed(String, temporary: Bool, took: Duration)
}

/// One attempt to hear from the gateway.
public enum Probe: Equatable, Sendable {
    /// Not made, and why (no route, no address, a key only root may read).
    case notTried(String)
    /// `answer` came back from `from` after `rtt`; `via` is the path it left by.
    case answered(Answer, from: String, rtt: Duration, via: String)
    /// Nothing came back to `tries` attempts, each waited for `wait`; `stoppedByLockdown`:
    /// packets the lockdown stopped meanwhile.
    case silent(tries: Int, wait: Duration, via: String, stoppedByLockdown: UInt64)
    /// The socket or the stream failed, in words (refused, unreachable, reset, TLS);
    /// `stoppedByLockdown`: packets the lockdown stopped meanwhile (its drop refuses a send).
    case failed(String, via: String, stoppedByLockdown: UInt64 = 0)
}

/// What answered a probe.
public enum Answer: Equatable, Sendable {
    /// A handshake response that proves the gateway's key (`version` 2 or 3).
    case response(version: UInt8)
    /// The gateway refused this client's key or credentials (an authenticated verdict).
    case rejected
    /// A cookie reply bound to the initiation: the gateway is there, under load or before a
    /// password check.
    case cookieReply
    /// A "session unknown" hint from the gateway's address.
    case sessionUnknown
    /// TCP and TLS came up (`suite`); `gateway`: the gateway answered the initiation inside.
    indirect case tls(suite: String?, gateway: Answer?)
    /// A datagram that is none of the above (another service on the port, a forged answer).
    case unexpected(bytes: Int)
}

/// The lockdown as the configuration wants it and as nftables has it.
public struct LockdownFacts: Equatable, Sendable {
    /// `lockdown: on` in the configuration.
    public var configured: Bool
    /// The tables loaded, or why they could not be listed.
    public var tables: Result<LoadedTables, DoctorError>
    public init(configured: Bool, tables: Result<LoadedTables, DoctorError>) {
        self.configured = configured
        self.tables = tables
    }
}

/// Roam's nftables tables that are loaded.
public struct LoadedTables: Equatable, Sendable {
    /// `inet roam`: the lockdown.
    public var lockdown: Bool
    /// `inet roam_guard`: a running agent's guard.
    public var guarded: Bool
    /// `inet roam_boot`: the boot holder's guard.
    public var boot: Bool
    public init(lockdown: Bool, guarded: Bool, boot: Bool) {
        self.lockdown = lockdown
        self.guarded = guarded
        self.boot = boot
    }
}

/// One thing the doctor says: how bad, what, what it saw, what to do.
public struct Finding: Equatable, Sendable {
    public enum Severity: String, Comparable, Sendable {
        case ok, warning, problem
        public static func < (a: Severity, b: Severity) -> Bool { a.rank < b.rank }
        private var rank: Int { self == .ok ? 0 : self == .warning ? 1 : 2 }
    }

    /// What was checked.
    public enum Check: String, Sendable {
        case agent, clock, lookup, route, udp, stream, portal, mtu, lockdown, resolvers, rules, upkeep, units
    }

    public var check: Check
    public var severity: Severity
    /// The server it is about, for a server's checks.
    public var server: String?
    public var title: String
    public var evidence: [String]
    /// What to do; nil when nothing is to be done.
    public var fix: String?

    public init(_ check: Check, _ severity: Severity, server: String? = nil, _ title: String, evidence: [String] = [], fix: String? = nil) {
        self.check = check
        self.severity = severity
        self.server = server
        self.title = title
        self.evidence = evidence
        self.fix = fix
    }
}

/// The doctor's judgement: facts in, findings out, no I/O.
public enum Doctor {
    /// 2024-01-01T00:00:00Z: a clock before it is wrong (the release is younger), and the
    /// gateway refuses a handshake dated before the last one it accepted.
    public static let earliestPlausibleTime: Int64 = 1_704_067_200

    /// A look-up slower than this is worth a word: every reconnect to a new address waits for it.
    public static let slowLookup: Duration = .seconds(2)

    /// Every finding, in the order a person should read them: the agent, the clock, each server
    /// (name, route, UDP, TLS), the network (a captive portal, the path MTU), the lockdown, the
    /// resolvers, the policy rules, what others keep taking away, and the systemd units.
    public static func findings(_ facts: DoctorFacts) -> [Finding] {
        var found = [agent(facts.agent), clock(facts.clock)]
        for server in facts.servers {
            found += [lookup(server), route(server, facts)].compactMap { $0 }
            found.append(udp(server, streamWorks: server.stream?.answered == true))
            if let stream = server.stream { found.append(self.stream(stream, server: server)) }
        }
        found += [portal(facts.portal, agent: facts.agent), pathMTU(facts.pathMTU, agent: facts.agent)].compactMap { $0 }
        found.append(lockdown(facts.lockdown, agent: facts.agent))
        found += [resolvers(facts.systemResolvers, agent: facts.agent), rules(facts.rules, mode: facts.mode), upkeep(facts.agent),
                  units(facts.units)].compactMap { $0 }
        return found
    }

    /// 0 when nothing is a problem, 1 otherwise: the command's exit status.
    public static func exitStatus(_ findings: [Finding]) -> Int32 {
        findings.contains { $0.severity == .problem } ? 1 : 0
    }

    // MARK: The agent

    static func agent(_ fact: AgentFact) -> Finding {
        switch fact {
        case .notRunning(let socket):
            return Finding(.agent, .problem, "The agent is not running", evidence: ["no control socket at \(socket)"],
                           fix: "start it: systemctl start roam-client (or roam@NAME for a profile), or agent up --config FILE")
        case .unanswered(let socket, let why):
            return Finding(.agent, .warning, "The agent's control socket did not answer", evidence: ["\(socket): \(why)"],
                           fix: "run the doctor as root or as a member of the 'roam' group; if the agent hangs, restart its service")
        case .running(let status):
            var evidence = ["state \(status.state)"]
            if let server = status.server { evidence.append("server \(server)") }
            if let path = status.path { evidence.append("path \(path)") }
            if let reason = status.reason { evidence.append("last transition: \(reason)" + (status.since.map { " at \($0)" } ?? "")) }
            let (severity, title, fix): (Finding.Severity, String, String?) = switch status.state {
            case "connected": (.ok, "The agent is connected", nil)
            case "failed": (.problem, "The gateway refused this client", "check 'username' and 'password-file', or ask the gateway's operator to add this client's public key (agent pubkey); then agent reconnect")
            case "paused": (.warning, "The tunnel is paused (agent down)", "agent up connects again")
            case "portal": (.warning, "This network holds everything back behind a captive portal", "log in through the portal window: agent portal")
            case "disconnected": (.ok, "An on-demand rule keeps the tunnel down on this network", nil)
            case "offline": (.problem, "The agent sees no network to reach the gateway through", "connect to a network; the findings below say what is missing")
            case "backing-off": (.problem, "The agent cannot reach the gateway and is waiting before it tries again", "the findings below say what fails; agent reconnect tries again at once")
            case "sleeping": (.warning, "The agent was told the machine is suspending", "agent wake, if the machine is awake")
            default: (.warning, "The agent is not connected yet (\(status.state))", "wait a few seconds and run the doctor again; the findings below say what fails")
            }
            return Finding(.agent, severity, title, evidence: evidence, fix: fix)
        }
    }

    // MARK: The clock

    static func clock(_ clock: WallClock) -> Finding {
        guard clock.unixSeconds >= earliestPlausibleTime else {
            return Finding(.clock, .problem, "The clock is wrong: it says \(clock.text)", evidence: ["the wall clock reads \(clock.text), before 2024"],
                           fix: "set the time (timedatectl set-ntp true, or date -s): every handshake carries it, and a gateway refuses one dated before the last it accepted")
        }
        return Finding(.clock, .ok, "The clock is plausible", evidence: ["the wall clock reads \(clock.text)"])
    }

    // MARK: A server

    static func lookup(_ server: ServerFacts) -> Finding? {
        switch server.lookup {
        case .literal:
            return nil
        case .resolved(let addresses, let took):
            let evidence = ["\(server.host) is \(addresses.map(\.description).joined(separator: ", ")) (in \(milliseconds(took)))"]
            guard took < slowLookup else {
                return Finding(.lookup, .warning, server: server.name, "The gateway's name resolves, slowly", evidence: evidence,
                               fix: "the name servers answer slowly; every move to a new address waits for them")
            }
            return Finding(.lookup, .ok, server: server.name, "The gateway's name resolves", evidence: evidence)
        case .failed(let why, let temporary, let took):
            let evidence = [why + " (after \(milliseconds(took)))"]
            if temporary {
                return Finding(.lookup, .problem, server: server.name, "The gateway's name gets no answer", evidence: evidence,
                               fix: "no name server answered: check the network's resolvers (resolv.conf) and that the network is up")
            }
            return Finding(.lookup, .problem, server: server.name, "The gateway's name does not exist", evidence: evidence,
                           fix: "check 'server' in the configuration (the spelling, the domain)")
        }
    }

    static func route(_ server: ServerFacts, _ facts: DoctorFacts) -> Finding? {
        guard !server.routes.isEmpty else { return nil }
        let reached = server.routes.filter { !$0.paths.isEmpty }
        guard reached.isEmpty else {
            let evidence = reached.flatMap { routes in
                routes.paths.enumerated().map { rank, path in
                    "to \(routes.address): " + describe(path) + (rank == 0 ? " (the kernel's choice)" : "")
                }
            }
            return Finding(.route, .ok, server: server.name, "A route leads to the gateway through \(reached[0].paths[0].interface)",
                           evidence: evidence)
        }
        var evidence = ["no uplink routes \(server.routes.map(\.address.description).joined(separator: ", "))"]
        evidence += facts.defaultRoutes.isEmpty ? ["no default route"] : facts.defaultRoutes.map { "route: \($0)" }
        evidence += facts.uplinks.map { uplink in
            let state = !uplink.isUp ? "down" : !uplink.hasCarrier ? "up, no carrier" : "up"
            let addresses = uplink.addresses.isEmpty ? "no address" : uplink.addresses.map(\.description).joined(separator: ", ")
            return "\(uplink.name): \(state), \(addresses)"
        }
        let usable = facts.uplinks.filter { $0.isUp && $0.hasCarrier }
        let fix = if usable.isEmpty {
            "no uplink is up with a carrier: plug in the cable, or join a Wi-Fi network"
        } else if usable.allSatisfy({ $0.addresses.isEmpty }) {
            "no uplink has an address: the network's DHCP did not answer; reconnect to it, or check its settings"
        } else if facts.defaultRoutes.isEmpty {
            "the network gave no default route (a gateway): reconnect to it, or check its DHCP or router settings"
        } else {
            "the routes do not cover the gateway's address \(server.routes[0].address.family == .v6 ? "(IPv6: the network may have no IPv6)" : ""): check the network's settings"
        }
        return Finding(.route, .problem, server: server.name, "No route to the gateway", evidence: evidence, fix: fix)
    }

    static func udp(_ server: ServerFacts, streamWorks: Bool) -> Finding {
        let target = "\(server.host) port \(server.port)"
        switch server.udp {
        case .notTried(let why):
            return Finding(.udp, .warning, server: server.name, "Not checked whether the gateway answers over UDP", evidence: [why])
        case .answered(let answer, let from, let rtt, let via):
            let seen = "\(words(answer)) from \(from) in \(milliseconds(rtt)), sent from \(via)"
            switch answer {
            case .rejected:
                return Finding(.udp, .problem, server: server.name, "The gateway answers over UDP and refuses this client", evidence: [seen],
                               fix: "ask the gateway's operator to add this client's public key (agent pubkey), or check 'username' and 'password-file'")
            case .unexpected:
                return Finding(.udp, .problem, server: server.name, "Something else answers at \(target)", evidence: [seen],
                               fix: "check 'server' (address and port) in the configuration, and 'server-key': the answer did not come from a gateway holding that key")
            default:
                return Finding(.udp, .ok, server: server.name, "The gateway answers over UDP", evidence: [seen])
            }
        case .silent(let tries, let wait, let via, let stopped):
            let evidence = ["\(tries) handshake initiations to \(target) from \(via), none answered within \(milliseconds(wait)) each"]
            if stopped > 0 { return stoppedByLockdown(server, evidence: evidence, stopped: stopped) }
            let fix = streamWorks
                ? "this network drops UDP to the gateway, and TLS gets through: the agent carries the tunnel over TLS here"
                : "UDP to port \(server.port) is dropped on this network, or the gateway is down, or 'server-key' is not its key (a gateway drops an initiation it cannot authenticate): try another network, check that the gateway runs, or add 'tcp:' to use TLS where UDP is blocked"
            return Finding(.udp, .problem, server: server.name, "The gateway does not answer over UDP", evidence: evidence, fix: fix)
        case .failed(let why, let via, let stopped):
            if stopped > 0 { return stoppedByLockdown(server, evidence: ["from \(via): \(why)"], stopped: stopped) }
            return Finding(.udp, .problem, server: server.name, "Cannot send to the gateway over UDP", evidence: ["from \(via): \(why)"],
                           fix: "the machine refused to send: check its firewall (nft list ruleset) and the route above")
        }
    }

    /// The lockdown lets through only the running agent's own sockets: the doctor's handshake
    /// tells nothing of the gateway then.
    static func stoppedByLockdown(_ server: ServerFacts, evidence: [String], stopped: UInt64) -> Finding {
        Finding(.udp, .warning, server: server.name, "Not checked whether the gateway answers over UDP: the lockdown stopped the doctor's packets",
                evidence: evidence + ["the lockdown stopped \(stopped) packets meanwhile; it lets through only the running agent's own sockets"],
                fix: "the agent's status above says whether its own session gets through")
    }

    static func stream(_ probe: Probe, server: ServerFacts) -> Finding {
        let target = "\(server.host) port \(server.streamPort.map(String.init) ?? "?")"
        switch probe {
        case .notTried(let why):
            return Finding(.stream, .warning, server: server.name, "Not checked whether TLS reaches the gateway", evidence: [why])
        case .answered(let answer, let from, let rtt, let via):
            let seen = "TCP and TLS to \(from) up in \(milliseconds(rtt)) from \(via)"
            guard case .tls(let suite, let inside) = answer else {
                return Finding(.stream, .ok, server: server.name, "The gateway answers over TLS", evidence: [seen])
            }
            var evidence = [seen + (suite.map { " (\($0))" } ?? "")]
            guard let inside else {
                evidence.append("no answer to the handshake initiation inside")
                return Finding(.stream, .problem, server: server.name, "TLS to \(target) opens, but no gateway answers inside it", evidence: evidence,
                               fix: "a middlebox may intercept TLS on this network, or 'server-key' is not the gateway's key")
            }
            evidence.append("inside: \(words(inside))")
            if inside == .rejected {
                return Finding(.stream, .problem, server: server.name, "The gateway answers over TLS and refuses this client", evidence: evidence,
                               fix: "ask the gateway's operator to add this client's public key (agent pubkey), or check 'username' and 'password-file'")
            }
            return Finding(.stream, .ok, server: server.name, "The gateway answers over TLS (tcp: \(server.streamPort.map(String.init) ?? "?"))", evidence: evidence)
        case .silent(_, let wait, let via, let stopped):
            var evidence = ["no TCP connection to \(target) from \(via) within \(milliseconds(wait))"]
            if stopped > 0 { evidence.append("the lockdown stopped \(stopped) packets meanwhile") }
            return Finding(.stream, .problem, server: server.name, "TLS to the gateway gets no answer", evidence: evidence,
                           fix: "the network drops TCP to port \(server.streamPort.map(String.init) ?? "?") too, or the gateway has no 'tcp:': try another network, or a proxy ('tcp: {proxy: ...}')")
        case .failed(let why, let via, _):
            return Finding(.stream, .problem, server: server.name, "TLS to the gateway fails", evidence: ["from \(via): \(why)"],
                           fix: "check that the gateway's configuration has 'tcp:' on port \(server.streamPort.map(String.init) ?? "?"), and that this network lets TCP to it out")
        }
    }

    // MARK: The machine

    static func lockdown(_ facts: LockdownFacts, agent: AgentFact) -> Finding {
        let tables: LoadedTables
        switch facts.tables {
        case .failure(let why):
            return Finding(.lockdown, .warning, "Not checked whether the lockdown is loaded", evidence: [why.description],
                           fix: "run the doctor as root to read nftables")
        case .success(let loaded): tables = loaded
        }
        let runs = if case .notRunning = agent { false } else { true }
        var evidence = ["lockdown \(facts.configured ? "on" : "off") in the configuration; the agent \(runs ? "runs" : "does not run")"]
        evidence.append("table inet roam " + (tables.lockdown ? "loaded" : "not loaded"))
        evidence.append("table inet roam_guard " + (tables.guarded ? "loaded" : "not loaded"))
        if tables.boot { evidence.append("table inet roam_boot loaded (the boot holder)") }
        switch (facts.configured, runs) {
        case (true, true):
            guard tables.lockdown else {
                return Finding(.lockdown, .problem, "The lockdown is missing while the agent runs", evidence: evidence,
                               fix: "something deleted it; the agent loads it again: if it stays missing, restart the agent's service")
            }
            guard tables.guarded else {
                return Finding(.lockdown, .warning, "The lockdown is loaded but not guarded", evidence: evidence,
                               fix: "any root process may delete it (nft flush ruleset): the guard needs Linux 5.12 or later")
            }
            return Finding(.lockdown, .ok, "The lockdown is loaded and guarded", evidence: evidence)
        case (true, false):
            guard tables.lockdown || tables.boot else {
                return Finding(.lockdown, .ok, "The lockdown is not loaded: no agent runs", evidence: evidence)
            }
            return Finding(.lockdown, .warning, "The lockdown is loaded and no agent runs: nothing leaves this machine", evidence: evidence,
                           fix: "start the agent (systemctl start roam-client), or open the machine with agent lockdown off")
        case (false, _):
            guard tables.lockdown else { return Finding(.lockdown, .ok, "No lockdown is loaded, as the configuration says", evidence: evidence) }
            return Finding(.lockdown, .warning, "A lockdown is loaded though this configuration says 'lockdown: off'", evidence: evidence,
                           fix: "another profile's agent may hold it (agent profiles); if none runs, agent lockdown off removes it")
        }
    }

    static func rules(_ rules: Result<[RoutingRule], DoctorError>, mode: RoutingMode) -> Finding? {
        guard mode.socketMark != nil else { return nil }
        switch rules {
        case .failure(let why):
            return Finding(.rules, .warning, "Not checked whether other policy rules decide before the tunnel's", evidence: [why.description])
        case .success(let rules):
            let before = mode.rulesBefore(in: rules)
            guard before.isEmpty else {
                return Finding(.rules, .warning, "Another tunnel's policy rules decide before Roam's", evidence: before.map { "rule \($0)" },
                               fix: "what those tables route does not go into Roam's tunnel: stop the other VPN (tailscale down, ...), run it in split mode, or give its rule a priority after Roam's")
            }
            return Finding(.rules, .ok, "No other policy rule decides before Roam's", evidence: ["\(rules.count) rules read"])
        }
    }

    // MARK: Words

    static func describe(_ path: Path) -> String {
        "\(path.interface) from \(path.source)" + (path.gateway.map { " via \($0)" } ?? " on-link") + " metric \(path.metric)"
    }

    static func words(_ answer: Answer) -> String {
        switch answer {
        case .response(let version): "a handshake response (version \(version)) proving the gateway's key"
        case .rejected: "a refusal of this client's key or credentials, proving the gateway's key"
        case .cookieReply: "a cookie reply bound to the initiation (the gateway is under load or wants proof of the address)"
        case .sessionUnknown: "a 'session unknown' hint"
        case .tls(let suite, let inside): "TLS" + (suite.map { " (\($0))" } ?? "") + (inside.map { ", then " + words($0) } ?? "")
        case .unexpected(let bytes): "\(bytes) bytes that are no answer of the gateway's"
        }
    }

    static func milliseconds(_ duration: Duration) -> String {
        let ns = duration.nanoseconds
        if ns >= 1_000_000_000 { return duration.seconds(decimals: 1) + " s" }
        if ns >= 10_000_000 { return "\(ns / 1_000_000) ms" }
        return "\(Double(ns / 10_000) / 100) ms"
    }
}

extension Probe {
    /// Whether the gateway answered (anything but a refusal or a stranger's datagram).
    public var answered: Bool {
        guard case .answered(let answer, _, _, _) = self else { return false }
        switch answer {
        case .unexpected, .rejected: return false
        case .tls(_, let inside): return inside != nil && inside != .rejected
        default: return true
        }
    }
}
