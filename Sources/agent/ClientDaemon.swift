import ConfigReader
import Glibc
import Lockdown
import PathMonitor
import Reconnector
import Synchronization
import SystemDNS
import Tunnel

/// The always-on client: the path monitor's facts and the data plane's notices go into the
/// Reconnector; its actions come out as sockets, handshakes and probes. One thread decides;
/// the data plane runs on its own threads and never waits for a decision.
final class ClientDaemon: @unchecked Sendable {
    private var settings: ClientSettings
    /// Where the settings came from, read again on SIGHUP.
    private let configPath: String
    /// Set when a reload changed more than tunables: the caller starts the agent afresh.
    private(set) var restartRequested = false
    private let key: PrivateKey
    private let credentials: Credentials?
    /// Where the server is now; a server named by host follows its name (see `resolveServer`).
    private var server: SocketAddress
    /// A lookup of the server's name is running; another was asked for meanwhile.
    private var resolving = false
    private var resolveAgain = false
    /// The session is being moved to the server's new address: no lookups meanwhile.
    private var following = false
    private let log: OperatorLog
    private var machine: Reconnector
    private let monitor: LiveMonitor
    private var client: TunnelClient?
    private var clientThread: OSThread?
    private var tun: TunDevice?
    private var routes: TunnelRoutes?
    /// One socket per path the session uses or tries.
    private var sockets: [Path.ID: UDPSocket] = [:]
    private var probes: [UInt64: Path.ID] = [:]
    private var nextProbe: UInt64 = 1
    private var suspends: SuspendDetector
    /// Notices and signals from other threads, with a pipe that wakes the deciding thread.
    private let inbox = Mutex<[Event]>([])
    private let wakeup: (read: Int32, write: Int32)
    private var running = true
    /// When the suspend hook announced a suspend (CLOCK_BOOTTIME, so the sleep counts).
    private var sleptAt: Instant?
    private let systemd = SystemdNotifier()
    private var readySent = false
    /// WATCHDOG=1 pings, only when the unit asks for them (WatchdogSec=).
    private let watchdog = SystemdNotifier.watchdogInterval()
    private var nextPing: Instant?
    private let control: ControlSocket
    private let power = PowerEvents()
    private var lastTransition: Transition?
    /// Decisions that bound, rebound or handshook, since start.
    private var attempts = 0
    private var flaps = FlapSummary()
    /// Before the tunnel first comes up, how long attempts on a usable path may go unanswered
    /// before the agent gives up; nil waits for ever. Once up, it never gives up by itself.
    private let waitForServer: Duration?
    /// Since when attempts have gone unanswered, before the tunnel first came up (reset while offline).
    private var unansweredSince: Instant?
    /// Why the agent gave up, when it did: the caller exits with it.
    private(set) var failure: String?
    /// The lockdown firewall, when the configuration wants it (the default).
    private let firewall: Firewall?
    /// Routes that take traffic around a full tunnel, as last logged.
    private var divertingRoutes: [DivertingRoute] = []
    /// Who hears of the tunnel's resolvers; nil with `dns: {manager: off}`.
    private let dns: TunnelDNS?
    /// Why the tunnel has no resolvers of its own, as last logged.
    private var dnsProblem: String?

    enum Event: Sendable {
        case notice(ClientNotice)
        case signal(Int32)
        /// What a lookup of the server's name gave.
        case resolved(Result<[IPAddress], ResolverError>)
    }

    init(settings: ClientSettings, configPath: String, key: PrivateKey, credentials: Credentials?, server: SocketAddress,
         log: OperatorLog, control: ControlSocket, waitForServer: Duration?, firewall: Firewall?) throws {
        self.waitForServer = waitForServer
        self.firewall = firewall
        self.configPath = configPath
        self.control = control
        self.settings = settings
        self.key = key
        self.credentials = credentials
        self.server = server
        self.log = log
        dns = switch settings.dns.manager {
        case .off: nil
        case .auto: TunnelDNS(manager: nil)
        case .resolved: TunnelDNS(manager: .resolved)
        case .resolvConf: TunnelDNS(manager: .resolvConf)
        }
        var fds: [Int32] = [0, 0]
        guard pipe(&fds) == 0 else { throw AgentError("cannot create a pipe: \(String(cString: strerror(errno)))") }
        for fd in fds {
            _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
            _ = fcntl(fd, F_SETFD, FD_CLOEXEC)  // not inherited by a restart
        }
        wakeup = (fds[0], fds[1])
        let clocks = SuspendDetector.clocks()
        suspends = SuspendDetector(monotonic: clocks.monotonic, boottime: clocks.boottime)
        machine = Reconnector(config: settings.reconnect, power: PowerSupply.current(), seed: UInt64(getpid()),
                              now: Instant.now())
        do {
            monitor = try LiveMonitor(endpoint: server.ip, tunnelInterface: settings.tunnel.name)
        } catch {
            throw AgentError("cannot read the routing tables: \(error)")
        }
    }

    deinit {
        close(wakeup.read)
        close(wakeup.write)
    }

    /// Hands an event to the deciding thread (from any thread, signal threads included).
    func post(_ event: Event) {
        inbox.withLock { $0.append(event) }
        var byte: UInt8 = 1
        _ = write(wakeup.write, &byte, 1)
    }

    /// Decides until SIGTERM/SIGINT, then takes the tunnel down.
    func run() {
        networkChanged()
        feed(.paths(monitor.paths))
        if let watchdog { nextPing = Instant.now() + watchdog }
        while running {
            let now = Instant.now()
            if let due = nextPing, let watchdog, due <= now {
                systemd.notify("WATCHDOG=1")
                nextPing = now + watchdog
            }
            let wakeAt = [machine.nextDeadline, nextPing, flaps.nextDue, giveUpAt].compactMap { $0 }.min()
            let timeout = wakeAt.map { max($0 - now, .zero) }
            let descriptors = [monitor.fileDescriptor, wakeup.read, control.fileDescriptor] + (power.map { [$0.fileDescriptor] } ?? [])
            let ready = (try? pollReadable(descriptors, timeout: timeout)) ?? []
            if let power, ready.contains(power.fileDescriptor), power.drain() {
                let source = PowerSupply.current()
                if source != machine.power {
                    log("info", "power", ["source": source.rawValue])
                    feed(.powerChanged(source))
                }
            }
            if ready.contains(control.fileDescriptor) { control.serve { answer($0) } }
            if let slept = checkSuspend() { woke(after: slept) }
            if ready.contains(monitor.fileDescriptor) {
                for event in monitor.next(timeout: .zero) {
                    switch event {
                    case .paths(let paths, _): feed(.paths(paths))
                    case .resynced(_, let paths?): feed(.paths(paths))
                    default: break
                    }
                }
                networkChanged()
            }
            if ready.contains(wakeup.read) {
                var bytes = [UInt8](repeating: 0, count: 64)
                while read(wakeup.read, &bytes, bytes.count) > 0 {}
                for event in inbox.withLock({ list in defer { list.removeAll() }; return list }) { handle(event) }
            }
            let after = Instant.now()
            report(flaps.tick(now: after))
            for (kind, due) in machine.timers.sorted(by: { $0.value < $1.value }) where due <= after {
                feed(.timerFired(kind))
            }
            if let giveUpAt, giveUpAt <= after, let waitForServer {
                let path = machine.state.path.map { " over \($0.interface)" } ?? ""
                giveUp("no answer from the server \(server) in \(waitForServer.short)\(path): check that it runs, its "
                    + "address and port, that UDP reaches it, and that 'server-key' is its public key")
            }
        }
        systemd.notify("STOPPING=1")
        control.remove()
        client?.close()
        try? routes?.remove()
        // Like the lockdown: a restart in place keeps the resolvers, so names never leak meanwhile.
        if let dns, dns.applied != nil, failure == nil, !restartRequested {
            do {
                try dns.revert()
                log("info", "dns restored", ["via": dns.manager.rawValue])
            } catch {
                log("error", "cannot take the tunnel's resolvers back", ["error": "\(error)"])
            }
        }
        // Only an operator's stop opens the machine again; a restart in place or a give-up
        // (systemd starts the agent again) keeps it closed.
        if let firewall, failure == nil, !restartRequested {
            do {
                try firewall.remove()
                log("info", "lockdown removed")
            } catch {
                log("error", "cannot remove the lockdown firewall; remove it with 'agent lockdown off'", ["error": "\(error)"])
            }
        }
    }

    /// What the firewall and the operator need to know of a change in links, addresses or routes.
    private func networkChanged() {
        let model = monitor.tracker.model
        do {
            try firewall?.localNetworksChanged(model.localNetworks)
        } catch {
            log("error", "cannot follow the local subnets in the lockdown", ["error": "\(error)"])
        }
        do {
            if try dns?.reassert() == true { log("info", "dns written again: resolv.conf had been replaced", ["via": "resolv.conf"]) }
        } catch {
            log("error", "cannot write the tunnel's resolvers again", ["error": "\(error)"])
        }
        // Full mode only: split mode routes around the tunnel by design.
        guard settings.mode.socketMark != nil else { return }
        let diverting = model.routesAroundTheTunnel
        for route in diverting where !divertingRoutes.contains(route) {
            log("warning", "a route on an uplink takes traffic around the tunnel",
                ["route": route.description, "lockdown": firewall == nil ? "off: that traffic leaves in clear" : "on: that traffic is stopped"])
        }
        divertingRoutes = diverting
    }

    private func checkSuspend() -> Duration? {
        let clocks = SuspendDetector.clocks()
        return suspends.check(monotonic: clocks.monotonic, boottime: clocks.boottime)
    }

    private func handle(_ event: Event) {
        switch event {
        case .signal(SIGTSTP):
            sleptAt = Instant.now()
            feed(.sleep)
        case .signal(SIGCONT):
            // The gap between the clocks says how long the machine really slept; the hook's
            // announcement says when it went; both cover a suspend the hook missed.
            let gap = checkSuspend() ?? .zero
            let announced = sleptAt.map { Instant.now() - $0 } ?? .zero
            sleptAt = nil
            feed(.powerChanged(PowerSupply.current()))
            woke(after: max(gap, announced))
        case .signal(SIGHUP):
            reload()
        case .signal:
            log("info", "stopping")
            running = false
        case .resolved(let result):
            resolved(result)
        case .notice(let notice):
            switch notice {
            case .handshakeCompleted(let rtt, let pushed):
                attachTunnel()
                useResolvers(pushed)
                feed(.handshakeSucceeded(rtt: rtt))
            case .rejected where tun == nil:
                giveUp("the server rejected this client: check 'username' and 'password-file', or that the server's "
                    + "users list this client's public key")
            case .rejected: feed(.handshakeFailed(.rejected("the server refused this client's key or credentials")))
            case .sessionUnknown: feed(.handshakeFailed(.sessionUnknown))
            case .probeEcho(let id, let rtt):
                if let path = probes.removeValue(forKey: id) { feed(.probeReply(on: path, rtt: rtt)) }
            case .dataSent: feed(.dataSent)
            case .dataReceived: feed(.dataReceived)
            }
        }
    }

    /// SIGHUP: reads the configuration again. Tunables (the `reconnect` section) apply at once
    /// and the tunnel stays; a change to the server, keys, credentials, tunnel device or routing
    /// mode takes the tunnel down and starts the agent afresh; a file with a mistake changes nothing.
    private func reload() {
        let fresh: ClientSettings
        do {
            let (reader, root) = try YAMLReader.load(configPath)
            fresh = try reader.client(root)
        } catch {
            log("error", "configuration not reloaded; the running one stays", ["error": "\(error)"])
            return
        }
        guard fresh.sameTunnel(as: settings) else {
            log("warning", "configuration reloaded: the tunnel itself changed; restarting")
            restartRequested = true
            running = false
            return
        }
        let changed = fresh.reconnect != settings.reconnect || fresh.persistentKeepalive != settings.persistentKeepalive
        settings = fresh
        machine.config = fresh.reconnect
        client?.setPersistentKeepalive(fresh.persistentKeepalive)
        log("info", "configuration reloaded", ["tunnel": "kept", "tunables": changed ? "changed" : "unchanged"])
    }

    /// When the agent gives up on a server that never answered: only before the tunnel first
    /// came up, and only counting time with a usable path.
    private var giveUpAt: Instant? {
        guard tun == nil, let unansweredSince, let waitForServer else { return nil }
        return unansweredSince + waitForServer
    }

    /// After a suspend the machine may be on another network, where the server's name may
    /// resolve elsewhere. The time asleep was no time without an answer.
    private func woke(after slept: Duration) {
        unansweredSince = nil
        feed(.wake(sleptFor: slept))
        resolveServer()
    }

    /// Looks the server's name up again, off this thread: on a new path the name may resolve
    /// elsewhere (split-horizon DNS), and a server that stopped answering may have moved. One
    /// lookup at a time; asks made meanwhile are folded into one more.
    private func resolveServer() {
        guard settings.server.address == nil else { return }  // a literal address never moves
        guard !resolving else { resolveAgain = true; return }
        resolving = true
        let host = settings.server.host
        let mark = settings.mode.socketMark
        let tunnelResolvers = dns?.applied?.resolvers ?? []
        do {
            try OSThread.detach { [weak self] in
                self?.post(.resolved(Result { () throws(ResolverError) in
                    try Resolver.addresses(of: host, mark: mark, avoiding: tunnelResolvers)
                }))
            }
        } catch {
            resolving = false
            log("warning", "cannot look up the server's name", ["error": "\(error)"])
        }
    }

    /// Follows the server to a new address when its name no longer gives the current one.
    private func resolved(_ result: Result<[IPAddress], ResolverError>) {
        resolving = false
        defer { if resolveAgain { resolveAgain = false; resolveServer() } }
        let addresses: [IPAddress]
        switch result {
        case .success(let list): addresses = list
        case .failure(let error):
            return log("warning", "server name not resolved; keeping its address", ["server": "\(server)", "error": "\(error)"])
        }
        guard !addresses.contains(server.ip) else { return }
        // Not one the tunnel's own routes would carry, nor one no uplink reaches (IPv6 on an
        // IPv4-only network): either would strand the session.
        guard let address = addresses.first(where: {
            !settings.mode.wouldLoop(to: $0) && !monitor.tracker.model.paths(to: $0).isEmpty
        }) else {
            return log("warning", "the server's name gives no address this machine can use now; keeping its address",
                       ["server": "\(server)", "addresses": addresses.map(\.description).joined(separator: ",")])
        }
        let moved = SocketAddress(address, port: server.port)
        do {
            try firewall?.serve(moved)
        } catch {
            return log("error", "cannot open the lockdown firewall to the server's new address; keeping the old one",
                       ["to": "\(moved)", "error": "\(error)"])
        }
        log("info", "server address changed", ["server": settings.server.host, "from": "\(server)", "to": "\(moved)"])
        server = moved
        client?.setServer(moved)
        probes.removeAll()  // an echo from the old address proves nothing about the new one
        following = true
        defer { following = false }
        if let paths = monitor.retarget(to: address) { feed(.paths(paths)) }
        feed(.serverMoved)
    }

    /// READY=1 for systemd, once: when the tunnel is up, or when there is no network to bring
    /// it up on (then STATUS= tells the rest).
    private func notifyReady() {
        guard !readySent else { return }
        readySent = true
        systemd.notify("READY=1")
    }

    /// Stops before the tunnel ever came up, with `reason` for the operator and the exit status.
    private func giveUp(_ reason: String) {
        log("error", "giving up", ["reason": reason])
        failure = reason
        running = false
    }

    private func report(_ lines: [FlapSummary.Line]) {
        for line in lines { log(line.level, line.message, line.fields) }
    }

    private func feed(_ input: Input) {
        if case .paths(let paths) = input { report(flaps.paths(Set(paths.map(\.interface)), now: Instant.now())) }
        let now = Instant.now()
        let actions = machine.handle(input, now: now)
        if actions.contains(where: { switch $0 { case .bind, .rebind, .handshake: true; default: false } }) {
            attempts += 1
            if tun == nil, unansweredSince == nil { unansweredSince = now }
        }
        // A new path or attempts that fail: the moments the server's name may give another
        // address. (Not while following a move, which would only ask the same question again.)
        if !following, actions.contains(where: { action in
            switch action {
            case .rebind: true
            case .report(let t): if case .backingOff = t.to { true } else { false }
            default: false
            }
        }) {
            resolveServer()
        }
        // No path is not an unanswered server: waiting for a network has no deadline.
        if machine.state == .offline || machine.state == .sleeping { unansweredSince = nil }
        // With no network there is nothing to wait for: a boot without one must not stall on us.
        if machine.state == .offline { notifyReady() }
        for action in actions { perform(action) }
    }

    /// The answer to an operator's request on the control socket.
    private func answer(_ request: ControlRequest?) -> String {
        switch request {
        case .status?: return status.map { LogLine.logfmt([$0]) }.joined(separator: "\n")
        case .statusJSON?:
            return LogLine.json(status, numbers: Set(["attempts", "budget_left", "packets_in", "packets_out", "bytes_in", "bytes_out",
                                                      "drops"] + BlockCause.allCases.map(\.counter)))
        case .reconnect?:
            feed(.reconnectRequested)
            return "reconnecting"
        case .sleep?:
            handle(.signal(SIGTSTP))
            return "sleeping"
        case .wake?:
            handle(.signal(SIGCONT))
            return "awake"
        case nil:
            return "unknown request; ask one of: " + ControlRequest.allCases.map(\.rawValue).joined(separator: ", ")
        }
    }

    private var status: [(String, String)] {
        var fields: [(String, String)] = [("state", machine.state.name)]
        if let path = machine.state.path {
            fields += [("interface", path.interface), ("kind", path.kind.rawValue), ("source", "\(path.source)")]
        }
        if let rtt = machine.roundTripTime { fields.append(("rtt", rtt.short)) }
        if let t = lastTransition {
            fields += [("since", wallClock(ago: Instant.now() - t.at)), ("for", (Instant.now() - t.at).short),
                       ("last_transition", "\(t.from.name) -> \(t.to.name)"),
                       ("reason", t.reason.description), ("trigger", t.trigger)]
        }
        fields += [("attempts", "\(attempts)"), ("budget_left", "\(machine.tokens)"), ("power", machine.power.rawValue)]
        if let client {
            let traffic = client.traffic
            fields += [("packets_in", "\(traffic.packetsIn)"), ("packets_out", "\(traffic.packetsOut)"),
                       ("bytes_in", "\(traffic.bytesIn)"), ("bytes_out", "\(traffic.bytesOut)"),
                       ("drops", "\(client.drops.total)"), ("drops_by_cause", client.drops.description),
                       ("no_session_drops", "\(traffic.noSession)")]
        }
        fields.append(("lockdown", firewall == nil ? "off" : "on"))
        if let firewall {
            let counters = firewall.counters()
            fields += BlockCause.allCases.map { ($0.counter, "\(counters[$0] ?? 0)") }
        }
        if let dns {
            fields += [("dns", dns.applied?.description ?? "none"), ("dns_manager", dns.manager.rawValue)]
        }
        if let dnsProblem { fields.append(("dns_problem", dnsProblem)) }
        if !divertingRoutes.isEmpty {
            fields.append(("diverting_routes", divertingRoutes.map(\.description).joined(separator: "; ")))
        }
        return fields
    }

    private func perform(_ action: Action) {
        switch action {
        case .bind(let path, _), .rebind(let path, _):
            guard let socket = socket(for: path) else { return }
            if let client {
                client.rebind(to: socket)
            } else {
                start(on: socket)
            }
            forgetSocketsNotOn(machine.paths)
        case .handshake(let path, _):
            if let socket = socket(for: path), client?.socket !== socket { client?.rebind(to: socket) }
            client?.startHandshake()
        case .probe(let path):
            guard let socket = socket(for: path) else { return }
            let id = nextProbe
            nextProbe += 1
            probes[id] = path.id
            if probes.count > 64, let oldest = probes.keys.min() { probes[oldest] = nil }
            client?.probe(id: id, via: socket)
        case .reportFailure(let reason):
            log("error", "the tunnel cannot come up without help", ["reason": reason.description])
        case .report(let transition):
            lastTransition = transition
            systemd.notify("STATUS=\(transition.to.name)"
                + (transition.to.path.map { " on \($0.interface)" } ?? "") + ": \(transition.reason)")
            log("info", "transition", transition.fields)
        case .armTimer, .cancelTimer, .quiesce:
            break  // the loop sleeps until machine.nextDeadline; quiesced means no timers
        }
    }

    /// The socket bound to `path`'s interface and source, made on first use.
    private func socket(for path: Path) -> UDPSocket? {
        if let socket = sockets[path.id] { return socket }
        do {
            let socket = try UDPSocket(bindingTo: SocketAddress(path.source, port: 0), device: path.interface,
                                       mark: settings.mode.socketMark)
            sockets[path.id] = socket
            return socket
        } catch {
            log("warning", "cannot open a socket on \(path.interface)", ["error": "\(error)"])
            return nil
        }
    }

    private func forgetSocketsNotOn(_ paths: [Path]) {
        for id in sockets.keys where !paths.contains(where: { $0.id == id }) {
            if let socket = sockets.removeValue(forKey: id) { client?.forget(candidate: socket) }
        }
    }

    private func start(on socket: UDPSocket) {
        do {
            let core = try ClientCore(privateKey: key, serverKey: settings.serverKey, credentials: credentials)
            let client = try TunnelClient(core: core, socket: socket, server: server, answersHints: false,
                                          persistentKeepalive: settings.persistentKeepalive,
                                          log: { [log] message in log("info", message) },
                                          notify: { [weak self] notice in self?.post(.notice(notice)) })
            self.client = client
            clientThread = try OSThread { client.run() }
        } catch {
            log("error", "cannot start the session", ["error": "\(error)"])
        }
    }

    /// The TUN device comes up once, after the first handshake tells our inner address, and
    /// stays through every reconnect.
    private func attachTunnel() {
        guard tun == nil, let client else { return }
        let prefixes = client.addresses.compactMap { Prefix($0, length: $0.family.bitWidth) }
        do {
            let device = try TunDevice(name: settings.tunnel.name, mtu: settings.tunnel.mtu, addresses: prefixes)
            routes = try TunnelRoutes(settings.mode, device: device)
            tun = device
            client.attach(device)
            notifyReady()
            log("info", "tunnel up", ["tunnel": device.name, "addresses": prefixes.map(\.description).joined(separator: ",")])
        } catch {
            giveUp("cannot configure the tunnel device: \(error)")
        }
    }
}

extension ClientDaemon {
    /// Gives the system the tunnel's resolvers after each handshake: the configuration's own
    /// (`dns`), else the server's. A list the server got wrong is refused and the session stays.
    private func useResolvers(_ pushed: Result<DNSSettings, DNSSettingsError>) {
        guard let dns, let tun else { return }
        var wanted: DNSSettings
        if let override = settings.dns.override {
            wanted = override
        } else {
            switch pushed {
            case .success(let settings): wanted = settings
            case .failure(let error):
                return noResolvers("the server's resolvers are refused: \(error)", level: "warning")
            }
        }
        // Split mode: a resolver outside the tunnel's routes would be asked in clear.
        let outside = wanted.resolvers.filter { !settings.mode.carries($0) }
        if !outside.isEmpty {
            log("warning", "resolvers outside the split routes are not used: they would be asked in clear",
                ["resolvers": outside.map(\.description).joined(separator: ",")])
            wanted = (try? DNSSettings(resolvers: wanted.resolvers.filter { settings.mode.carries($0) },
                                       searchDomains: wanted.searchDomains)) ?? .none
        }
        guard wanted != dns.applied else { return }
        guard !wanted.resolvers.isEmpty else {
            return noResolvers("neither the server nor 'dns' gives resolvers for the tunnel" + (firewall == nil ? ""
                : "; with the lockdown on, names resolve only through resolvers the tunnel reaches"), level: "warning")
        }
        do {
            try dns.apply(wanted, interface: (tun.index, tun.name), routeAll: settings.mode.socketMark != nil)
            dnsProblem = nil
            log("info", "dns", ["resolvers": wanted.resolvers.map(\.description).joined(separator: ","),
                                "search": wanted.searchDomains.joined(separator: ","), "via": dns.manager.rawValue])
        } catch {
            noResolvers("\(error)", level: "error")
        }
    }

    private func noResolvers(_ reason: String, level: String) {
        guard reason != dnsProblem else { return }
        dnsProblem = reason
        log(level, "no tunnel dns", ["reason": reason])
    }
}

extension ClientSettings {
    /// Whether `other` describes the same tunnel: everything but the tunables.
    func sameTunnel(as other: ClientSettings) -> Bool {
        server == other.server && serverKey == other.serverKey && privateKeyFile == other.privateKeyFile
            && username == other.username && passwordFile == other.passwordFile && tunnel == other.tunnel
            && mode == other.mode && lockdown == other.lockdown && allowLAN == other.allowLAN && dns == other.dns
    }
}
