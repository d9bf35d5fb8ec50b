import SystemDNS
import Logging
import Observability
import ConfigReader
import Glibc
import Lockdown
import PathMonitor
import Reconnector
import Tunnel

/// The always-on client, one direction of flow: facts (the path monitor, the data plane's
/// notices, signals, the operator's requests, timers) go into the Reconnector; its actions go
/// to `SessionEffects`, which carries them out. Other threads only post into the mailbox; one
/// thread decides, and the data plane never waits for a decision. The daemon itself stays on
/// the thread that made it: other threads get only its `mailbox`.
final class ClientDaemon {
    /// Everything another thread may tell the deciding thread.
    enum Event: Sendable {
        case notice(ClientNotice)
        case signal(Int32)
        /// What a look-up of server `server`'s name gave.
        case lookedUp(server: Int, Result<[IPAddress], ResolverError>)
        /// An operator's request from the control socket, to answer through `ControlServer.reply`.
        case control(ControlServer.Call)
        /// A connectivity check over the path ended.
        case connectivity(Connectivity, Path.ID)
        /// Something found out about a network for the on-demand rules (a probe's answer).
        case found(NetworkFact)
    }

    /// The only state shared across threads: where other threads (signal handlers included)
    /// post events for the deciding thread.
    let mailbox: Mailbox<Event>
    /// The deciding thread's state; nothing else touches it.
    private let loop: Loop

    /// `servers` are the configured servers with every address their names gave (the agent
    /// starts on the first server, on the first address an uplink reaches, and changes family
    /// when the uplinks do).
    init(settings: ClientSettings, configPath: String, key: PrivateKey, credentials: Credentials?, servers: [ResolvedServer],
         log: Logger, control: ControlSocket, waitForServer: Duration?, firewall: Firewall?) throws {
        let mailbox = try Mailbox<Event>()
        self.mailbox = mailbox
        let server = try ControlServer(socket: control) { [weak mailbox] call in mailbox?.post(.control(call)) }
        loop = try Loop(settings: settings, configPath: configPath, key: key, credentials: credentials,
                        servers: servers, log: log, control: server,
                        waitForServer: waitForServer, firewall: firewall, mailbox: mailbox)
    }

    /// Decides until SIGTERM/SIGINT or a reason to stop; call once, on the deciding thread.
    func run() { loop.run() }

    /// Why the agent gave up, when it did: the caller exits with it.
    var failure: String? { loop.failure }
    /// The server address the session uses (read before run() or after it returns).
    var server: SocketAddress { loop.server }
    /// A reload changed more than tunables: the caller starts the agent afresh.
    var restartRequested: Bool { loop.restartRequested }
}

extension ClientDaemon {
    /// The deciding thread: a poll over the monitor, the mailbox (where the control socket's
    /// requests arrive too) and the power supply, with the core's next deadline as its timeout.
    private final class Loop {
        private var settings: ClientSettings
        /// Where the settings came from, read again on SIGHUP.
        private let configPath: String
        private(set) var restartRequested = false
        private(set) var failure: String?
        var server: SocketAddress { effects.server }
        private let log: Logger
        private let mailbox: Mailbox<Event>
        /// Every decision: the session's state machine and what lies around it.
        private var core: AgentCore
        private var machine: Reconnector {
            get { core.machine }
            set { core.machine = newValue }
        }
        private let monitor: LiveMonitor
        private let effects: SessionEffects
        /// What the effects being carried out produced, fed once the current event's are done.
        private var produced: [AgentEvent] = []
        private var service: ServiceReporter
        private var suspends: SuspendDetector
        /// When the suspend hook announced a suspend (CLOCK_BOOTTIME, so the sleep counts).
        private var sleptAt: Instant?
        private let control: ControlServer
        private let power = PowerEvents()
        private var lastTransition: Transition?
        /// Decisions that bound, rebound or handshook, since start.
        private var attempts = 0
        private var flaps = FlapSummary()
        private var running = true
        private let metrics = ClientMetrics()
        private var metricsFile: MetricsFile?
        /// While connected, the metrics file is written again this often (and on every transition).
        static let metricsRefresh = Duration.seconds(60)
        private var metricsDue: Instant?
        /// Who opened the portal window, while one is open: only they (or root) close it.
        private var windowOwner: UInt32?
        /// Finds out what the on-demand rules ask about the network, and follows its notices.
        private let facts: FactFinder
        /// Where the budget, the backoff and the dead-path verdicts outlive this process (the
        /// runtime directory, beside the control socket), and what was written there last.
        private let memoryPath: String
        private var savedMemory: Reconnector.Memory?

        init(settings: ClientSettings, configPath: String, key: PrivateKey, credentials: Credentials?, servers: [ResolvedServer],
             log: Logger, control: ControlServer, waitForServer: Duration?, firewall: Firewall?,
             mailbox: Mailbox<Event>) throws {
            self.settings = settings
            self.configPath = configPath
            self.log = log
            self.control = control
            self.mailbox = mailbox
            guard let first = servers.first?.addresses.first, let port = settings.server.port else {
                throw AgentError("the server has no address")
            }
            let clocks = SuspendDetector.clocks()
            suspends = SuspendDetector(monotonic: clocks.monotonic, boottime: clocks.boottime)
            service = ServiceReporter(now: Instant.now())
            memoryPath = control.path.parentDirectory + "/reconnect-state"
            flaps.window = settings.reconnect.flapStableAfter
            metricsFile = settings.metricsFile.map(MetricsFile.init)
            facts = FactFinder(log: log)
            do {
                monitor = try LiveMonitor(endpoint: first, tunnelInterface: settings.tunnel.name)
            } catch {
                throw AgentError("cannot read the routing tables: \(error)")
            }
            // The core starts on the first address an uplink reaches now (a dual-stack server on
            // an IPv4-only network); the lockdown lets the session reach every one of them.
            core = AgentCore(Self.restoredMachine(settings: settings, memoryPath: memoryPath, log: log), startupWait: waitForServer,
                             model: monitor.tracker.model,
                             servers: servers.map { ServerBook.Entry(named: $0.entry.endpoint.address == nil, addresses: $0.addresses) },
                             rules: settings.onDemand)
            effects = SessionEffects(settings: settings, key: key, credentials: credentials, servers: servers,
                                     server: SocketAddress(core.serverAddress, port: port),
                                     firewall: firewall, log: log, notify: { [weak mailbox] notice in mailbox?.post(.notice(notice)) })
        }

        func run() {
            do {
                try control.start()
            } catch {
                log.error("cannot serve the control socket; status and commands are unavailable", metadata: ["error": "\(error)"])
            }
            effects.networkObserved(core.network.model)
            feed(.start)
            while running {
                let now = Instant.now()
                service.tick(now: now)
                let wakeAt = [core.nextDeadline, service.nextDeadline, flaps.nextDue, metricsDue,
                              effects.firewall?.retryDue].compactMap { $0 }.min()
                let descriptors = [monitor.fileDescriptor, mailbox.fileDescriptor] + (power.map { [$0.fileDescriptor] } ?? [])
                    + facts.fileDescriptors
                let ready = (try? pollReadable(descriptors, timeout: wakeAt.map { max($0 - now, .zero) })) ?? []
                if let power, ready.contains(power.fileDescriptor), power.drain() { powerMayHaveChanged() }
                if let slept = checkSuspend() { woke(after: slept) }
                if ready.contains(monitor.fileDescriptor) { monitorSpoke() }
                for fact in facts.noticesArrived(ready: ready, about: core.onDemand.network, tunnelSearch: tunnelSearch) {
                    feed(.networkFact(fact))
                }
                if ready.contains(mailbox.fileDescriptor) {
                    for event in mailbox.take() { handle(event) }
                }
                let after = Instant.now()
                report(flaps.tick(now: after))
                if let due = metricsDue, due <= after { writeMetrics() }
                if let due = effects.firewall?.retryDue, due <= after { effects.retryFirewall() }
                for (kind, due) in core.timers.sorted(by: { $0.value < $1.value }) where due <= after {
                    feed(.timerFired(kind))
                }
            }
            service.stopping()
            writeMetrics()
            control.publish(ControlProtocol.event("stopped", [("why", .string(failure ?? (restartRequested ? "restarting" : "stopped")))]))
            control.stop()
            effects.close(operatorStop: failure == nil && !restartRequested)
        }

        // MARK: Facts in

        /// Every change the kernel reported goes to the core.
        private func monitorSpoke() {
            var changes: [NetworkChange] = []
            for event in monitor.next(timeout: .zero) {
                switch event {
                case .paths(_, _, let change), .ignored(_, _, let change): changes.append(change)
                case .resynced(let difference, _):
                    // The kernel dropped messages: a fresh dump stands in for them.
                    metrics.resynced()
                    log.warning("netlink overrun; routing state read again",
                                metadata: ["changes": .stringConvertible(difference.count), "resyncs": .stringConvertible(monitor.resyncs)])
                    changes += difference
                case .reopened(let error):
                    log.warning("netlink socket failed; reopened", error: error, metadata: ["reopens": .stringConvertible(monitor.reopens)])
                }
            }
            for change in changes { feed(.network(change)) }
            effects.networkObserved(core.network.model)
        }

        /// One on-demand probe over `path`, outside the tunnel, made as the connectivity check is.
        private func startProbe(_ probe: OnDemandRule.Probe, via path: Path, generation: UInt64) {
            guard let url = CheckURL(probe.url) else {
                return produced.append(.networkFact(.probeAnswered(probe, generation: generation, false)))
            }
            log.info("on-demand probe", metadata: ["path": "\(path.interface)", "url": "\(probe.url)"])
            run(PortalCheck(url: url, expect: probe.expect), via: path) {
                .found(.probeAnswered(probe, generation: generation, $0 == .online))
            }
        }

        /// The tunnel's own search domains, which resolv.conf holds beside the network's.
        private var tunnelSearch: [String] { effects.dns?.applied?.searchDomains ?? [] }

        /// Makes `check` over `path` on a thread of its own (marked sockets, the tunnel's resolvers
        /// avoided) and posts what `answer` makes of its result.
        private func run(_ check: PortalCheck, via path: Path, answer: @escaping @Sendable (Connectivity) -> Event) {
            let mark = settings.mode.socketMark
            let avoiding = effects.dns?.applied?.resolvers ?? []
            do {
                try OSThread.detach { [weak mailbox] in
                    mailbox?.post(answer(check.run(via: path, mark: mark, avoiding: avoiding)))
                }
            } catch {
                mailbox.post(answer(.unknown("cannot start its thread: \(error)")))
            }
        }

        /// What the rules decided (or wait for), for the operator.
        private func report(_ decision: OnDemandDecision) {
            switch decision {
            case .decided(let verdict):
                log.notice("on-demand", metadata: ["rule": "\(verdict.rule)", "action": "\(verdict.action.rawValue)",
                                                   "path": "\(verdict.interface)", "lockdown": "\(verdict.liftsLockdown ? "lifted" : "kept")"])
            case .waiting(let rule, let wanted, let path):
                let interface = core.network.model.links[path.linkIndex]?.name ?? "link \(path.linkIndex)"
                log.info("on-demand waits", metadata: ["rule": "\(rule)", "path": "\(interface)",
                                                       "for": "\(wanted.map(\.description).joined(separator: ","))"])
            }
        }

        private func powerMayHaveChanged() {
            let source = PowerSupply.current()
            guard source != machine.power else { return }
            log.info("power", metadata: ["source": "\(source.rawValue)"])
            feed(.powerChanged(source))
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
                log.info("stopping")
                feed(.request(.stop))
                running = false
            case .lookedUp(let index, let result):
                lookedUp(index, result)
            case .notice(let notice):
                handle(notice)
            case .control(let call):
                answer(call)
            case .connectivity(let result, let id):
                checked(result, on: id)
            case .found(let fact):
                if case .probeAnswered(let probe, _, let expected) = fact {
                    log.info("on-demand probe answered", metadata: ["url": "\(probe.url)", "expected": "\(expected)"])
                }
                feed(.networkFact(fact))
            }
        }

        private func handle(_ notice: ClientNotice) {
            switch notice {
            case .handshakeCompleted(let rtt, let dns, let sized):
                do {
                    try effects.handshakeCompleted(dns: dns)
                } catch {
                    return feed(.tunnelFailed(error.message))
                }
                metrics.handshake("completed")
                metrics.tunnelMTU(effects.tunnelMTU)
                feed(.handshakeCompleted(rtt: rtt, sizedProbes: sized, carriesIPv6: effects.tunnelCarriesIPv6))
            case .rejected:
                metrics.handshake("rejected")
                feed(.handshakeRejected)
            case .sessionUnknown: feed(.sessionUnknown)
            case .probeEcho(let id, let rtt, let size): feed(.probeEcho(id: id, rtt: rtt, size: size))
            case .dataSent: feed(.dataSent)
            case .dataReceived: feed(.dataReceived)
            case .serverDraining: feed(.serverDraining)
            case .handoverReady(let rtt, let dns, let sized):
                do {
                    try effects.handshakeCompleted(dns: dns)
                } catch {
                    return feed(.tunnelFailed(error.message))
                }
                metrics.handshake("completed")
                feed(.handoverReady(rtt: rtt, sizedProbes: sized, carriesIPv6: effects.tunnelCarriesIPv6))
            case .handoverRejected:
                metrics.handshake("rejected")
                feed(.handoverRejected)
            }
        }

        /// SIGHUP: reads the configuration again. Tunables (the `reconnect` section) apply at once
        /// and the tunnel stays; a change to the server, keys, credentials, tunnel device, routing
        /// mode, lockdown or DNS takes the tunnel down and starts the agent afresh; a file with a
        /// mistake changes nothing.
        private func reload() {
            let fresh: ClientSettings
            do {
                let (reader, root) = try YAMLReader.load(configPath, as: .clientConfiguration)
                fresh = try reader.client(root)
            } catch {
                log.error("configuration not reloaded; the running one stays", metadata: ["error": "\(error)"])
                return
            }
            guard fresh.sameTunnel(as: settings) else {
                log.warning("configuration reloaded: the tunnel itself changed; restarting")
                restartRequested = true
                running = false
                return
            }
            let changed = fresh.reconnect != settings.reconnect || fresh.persistentKeepalive != settings.persistentKeepalive
                || fresh.portal != settings.portal
                || fresh.metricsFile != settings.metricsFile
            if fresh.metricsFile != settings.metricsFile {
                metricsFile = fresh.metricsFile.map(MetricsFile.init)
                writeMetrics()
            }
            do {
                try effects.firewall?.allowCheck(ports: fresh.checkPorts)
            } catch {
                log.error("the lockdown could not follow the connectivity check's new port", metadata: ["error": "\(error)"])
            }
            settings = fresh
            feed(.rulesChanged(fresh.onDemand))
            machine.config = fresh.reconnect
            effects.setPersistentKeepalive(fresh.persistentKeepalive)
            log.info("configuration reloaded", metadata: ["tunnel": "kept", "tunables": "\(changed ? "changed" : "unchanged")"])
        }

        /// After a suspend the machine may be on another network, where the server's name may
        /// resolve elsewhere. The time asleep was no time without an answer.
        private func woke(after slept: Duration) {
            feed(.wake(sleptFor: slept))
        }

        /// Looks up server `index`'s name for the core, off the deciding thread.
        private func lookUp(_ index: Int) {
            let entry = settings.servers[index]
            guard entry.endpoint.address == nil else {
                return produced.append(.serverLookedUp(server: index, addresses: [entry.endpoint.host].compactMap { IPAddress($0) }))
            }
            do {
                try ServerLookup.start(entry.endpoint.host, mark: settings.mode.socketMark,
                                       avoiding: effects.dns?.applied?.resolvers ?? []) { [weak mailbox] result in
                    mailbox?.post(.lookedUp(server: index, result))
                }
            } catch {
                log.warning("cannot look up the server's name", metadata: ["error": "\(error)"])
                produced.append(.serverLookedUp(server: index, addresses: nil))
            }
        }

        /// A look-up ended: its usable addresses (none the tunnel's own routes would carry) go
        /// to the core, which follows the server when its name moved.
        private func lookedUp(_ index: Int, _ result: Result<[IPAddress], ResolverError>) {
            let name = settings.servers[index].name
            switch result {
            case .success(let addresses):
                let usable = addresses.filter { !settings.mode.wouldLoop(to: $0) }
                feed(.serverLookedUp(server: index, addresses: usable))
                if index == machine.server, !usable.contains(core.serverAddress), core.servers.pending == nil {
                    log.warning("the server's name gives no address this machine can use now; keeping its address",
                                metadata: ["server": "\(name)", "addresses": "\(addresses.map(\.description).joined(separator: ","))"])
                }
            case .failure(let error):
                log.warning("server name not resolved; keeping its address", metadata: ["server": "\(name)", "error": "\(error)"])
                feed(.serverLookedUp(server: index, addresses: nil))
            }
        }

        /// Stops before the tunnel ever came up, with `reason` for the operator and the exit status.
        private func giveUp(_ reason: String) {
            log.error("giving up", metadata: ["reason": "\(reason)"])
            failure = reason
            running = false
        }

        private func report(_ lines: [FlapSummary.Line]) {
            for line in lines { log.log(level: line.level, "\(line.message)", metadata: Logger.Metadata(line.fields.map { ($0.0, Logger.MetadataValue.string($0.1)) }) { $1 }) }
        }

        /// Starts a connectivity check over `path` on a thread of its own; its result comes back
        /// through the mailbox.
        private func checkConnectivity(via path: Path) {
            log.info("connectivity check", metadata: ["path": "\(path.interface)", "url": "\(settings.portal.url.text)"])
            run(settings.portal, via: path) { .connectivity($0, path.id) }
        }

        private func checked(_ result: Connectivity, on id: Path.ID) {
            let interface = core.network.model.links[id.linkIndex]?.name ?? "link \(id.linkIndex)"
            switch result {
            case .online:
                metrics.checked("online")
                if case .portal = machine.state {
                    log.info("connectivity check passed: the portal is open", metadata: ["path": "\(interface)"])
                } else {
                    log.warning("connectivity check passed: the network reaches the internet, the server does not answer",
                                metadata: ["path": "\(interface)", "server": "\(effects.server)"])
                }
            case .portal(let url):
                metrics.checked("portal")
                log.info("connectivity check: captive portal", metadata: ["path": "\(interface)", "url": "\(url)"])
            case .unknown(let why):
                metrics.checked("unknown")
                log.warning("connectivity check failed", metadata: ["path": "\(interface)", "error": "\(why)"])
            }
            feed(.connectivity(result, on: id))
        }

        // MARK: Decisions out

        /// An event into the core the replays run too; its effects are carried out here, in order.
        private func feed(_ event: AgentEvent) {
            var next = [event]
            // What the effects produce is fed after them, in order (a bound keeps a runaway
            // exchange from holding the loop; none has more than a few rounds).
            for round in 0... {
                guard running, !next.isEmpty else { break }
                guard round < 1000 else {
                    log.error("effects kept producing events; the rest are dropped", metadata: ["left": "\(next.count)"])
                    break
                }
                let event = next.removeFirst()
                let pathsBefore = machine.paths
                let out = core.handle(event, now: Instant.now())
                var made: [Transition] = []
                var attempted = false
                for effect in out {
                    switch effect {
                    case .transition(let transition): made.append(transition)
                    case .bind, .handshake: attempted = true
                    default: break
                    }
                    perform(effect)
                }
                if attempted { attempts += 1 }
                if machine.paths != pathsBefore { report(flaps.paths(Set(machine.paths.map(\.interface)), now: Instant.now())) }
                // Told to watchers once the machine has settled: the status they get beside each
                // transition is the one it led to.
                if control.watched {
                    for transition in made {
                        control.publish(ControlProtocol.event("transition", [("transition", transitionJSON(transition)), ("status", statusJSON)]))
                    }
                }
                if !made.isEmpty { writeMetrics() }
                // No window in the core, none in effect: a cgroup made for a window the core did not
                // open goes (a closing nftables refuses is the firewall's to retry).
                if machine.portalWindowUntil == nil {
                    windowOwner = nil
                    if effects.portalWindow != nil || effects.portalCgroup != nil { effects.closePortalWindow() }
                }
                next += produced
                produced = []
            }
            saveMemory()
        }

        /// Carries one of the core's effects out on the session's sockets, the lockdown and the
        /// resolvers.
        private func perform(_ effect: Effect) {
            switch effect {
            case .bind(let path, _, _): effects.bind(path, paths: machine.paths)
            case .handshake(let path, _): effects.handshake(on: path)
            case .resendHandshake(let path):
                metrics.resentHandshake()
                effects.handshake(on: path)
            case .probe(let id, let path, let size):
                if size == nil { metrics.probed() } else { metrics.sizeProbed() }
                effects.probe(id, via: path, size: size)
            case .setTunnelMTU(let mtu):
                effects.setTunnelMTU(mtu)
                metrics.tunnelMTU(effects.tunnelMTU)
            case .reportFailure(let reason):
                log.error("the tunnel cannot come up without help", metadata: ["reason": "\(reason.description)"])
            case .transition(let transition):
                lastTransition = transition
                service.transition(transition)
                metrics.record(transition)
                log.info("transition", metadata: transition.metadata)
            case .useServer(let index, let address): effects.useServer(index, at: address)
            case .prepareHandover(let index, let address, let path): effects.prepareHandover(to: index, at: address, on: path)
            case .lookUpServer(let index): lookUp(index)
            case .allowServer(let index, let address):
                produced.append(.serverAllowed(server: index, address: address, effects.allow(index, address)))
            case .useAddress(let address, let why): effects.useAddress(address, why: why)
            case .localNetworks(let prefixes): effects.localNetworksChanged(prefixes)
            case .completeHandover: effects.completeHandover()
            case .cancelHandover: effects.cancelHandover()
            case .disconnect: effects.disconnect()
            case .checkConnectivity(let path): checkConnectivity(via: path)
            case .openPortalWindow(let path, let url, _):
                metrics.portalWindow(open: true)
                effects.openPortalWindow(via: path, portal: url)
            case .closePortalWindow:
                metrics.portalWindow(open: false)
                effects.closePortalWindow()
            case .liftLockdown(let interface):
                metrics.lockdownLifted(true)
                effects.liftLockdown(interface: interface)
            case .restoreLockdown:
                metrics.lockdownLifted(false)
                effects.restoreLockdown()
            case .ready: service.ready()
            case .giveUp(.noAnswer(let wait, let interface)):
                let path = interface.map { " over \($0)" } ?? ""
                giveUp("no answer from the server \(effects.server) in \(wait.short)\(path): check that it runs, its "
                    + "address and port, that UDP reaches it, and that 'server-key' is its public key")
            case .giveUp(.rejected):
                giveUp("the server rejected this client: check 'username' and 'password-file', or that the server's "
                    + "users list this client's public key")
            case .giveUp(.tunnelFailed(let why)): giveUp(why)
            case .findOut(.probe(let probe, let path, let generation)): startProbe(probe, via: path, generation: generation)
            case .findOut(let request):
                if let fact = facts.read(request, tunnelSearch: tunnelSearch) { produced.append(.networkFact(fact)) }
            case .followNotices(let notices): facts.follow(notices)
            case .onDemandDecided(let decision): report(decision)
            }
        }

        /// The machine as the previous process of the agent left it, if it left anything usable.
        private static func restoredMachine(settings: ClientSettings, memoryPath: String, log: Logger) -> Reconnector {
            let now = Instant.now()
            let power = PowerSupply.current()
            let seed = UInt64(getpid())
            let names = settings.servers.map(\.name)
            guard let text = SystemFiles.text(memoryPath) else {
                return Reconnector(config: settings.reconnect, power: power, seed: seed, now: now, servers: names)
            }
            guard let memory = Reconnector.Memory(text: text) else {
                log.warning("reconnect state unreadable; starting with a full budget", metadata: ["file": "\(memoryPath)"])
                return Reconnector(config: settings.reconnect, power: power, seed: seed, now: now, servers: names)
            }
            let machine = Reconnector(config: settings.reconnect, power: power, seed: seed, now: now, memory: memory, servers: names)
            log.info("reconnect state restored", metadata: ["budget_left": "\(machine.tokens)", "dead_paths": "\(memory.dead.count)"])
            return machine
        }

        /// The metrics file, now; again in a minute while connected. Idle and not connected,
        /// nothing wakes for it.
        private func writeMetrics() {
            guard var file = metricsFile else { return }
            if let client = effects.client { metrics.sync(client) }
            if let error = file.write(metrics.exposition()) {
                log.warning("cannot write the metrics file", metadata: ["error": "\(error)"])
            }
            metricsFile = file
            metricsDue = machine.state.name == "connected" ? Instant.now() + Self.metricsRefresh : nil
        }

        private func saveMemory() {
            let memory = machine.memory
            guard memory != savedMemory else { return }
            do {
                try SystemFiles.write(memory.text, to: memoryPath, mode: 0o600)
            } catch {
                if savedMemory != nil || error.code != ENOENT {
                    log.warning("cannot keep the reconnect state", metadata: ["file": "\(memoryPath)", "error": "\(error)"])
                }
            }
            savedMemory = memory
        }

        // MARK: The operator

        /// Answers an operator's request from the control socket.
        private func answer(_ call: ControlServer.Call) {
            let done = { (message: String) in
                call.reply(ControlProtocol.answer([("message", .string(message)), ("state", .string(self.machine.state.name))]))
            }
            switch call.command {
            case .status:
                call.reply(ControlProtocol.answer([("status", statusJSON)]))
            case .watch:
                call.reply(ControlProtocol.event("status", [("status", statusJSON)]), watch: true)
            case .reconnect:
                if case .paused = machine.state { return done("down: `agent up` connects again") }
                if case .disconnected(let rule, _) = machine.state {
                    return done("the on-demand rule '\(rule)' keeps the tunnel down on this network")
                }
                feed(.request(.reconnect))
                done("reconnecting")
            case .sleep:
                handle(.signal(SIGTSTP))
                done("sleeping")
            case .wake:
                handle(.signal(SIGCONT))
                done("awake")
            case .down:
                if case .paused = machine.state { return done("down already") }
                feed(.request(.pause))
                done("down: the session is closed; the tunnel device" + (effects.firewall == nil ? "" : " and the lockdown") + " stay")
            case .up:
                guard case .paused = machine.state else { return done("up already (\(machine.state.name))") }
                feed(.request(.resume))
                done("connecting")
            case .drain:
                call.reply(ControlFailure(code: "not-here", message: "drain is for a server (agent serve --control); this is a client").line)
            case .portalOpen:
                openPortalWindow(call)
            case .portalClose:
                guard mayChangeWindow(call.peer) else {
                    return call.reply(ControlFailure(code: "not-permitted", message: "the portal window is another user's").line)
                }
                feed(.request(.closePortalWindow))
                done("portal window closed")
            }
        }

        /// `agent portal`: the asking process goes into the window's cgroup, then the window opens.
        private func openPortalWindow(_ call: ControlServer.Call) {
            let refuse = { (code: String, message: String) in call.reply(ControlFailure(code: code, message: message).line) }
            guard case .portal(let path, let url) = machine.state else {
                return refuse("no-portal", "no captive portal found (the agent is \(machine.state.name)); a window opens only "
                    + "after the connectivity check found one")
            }
            guard let firewall = effects.firewall, firewall.supportsPortalWindow else {
                return refuse("not-needed", "without a full tunnel's lockdown the portal is reachable as it is: log in at \(url)")
            }
            let opening = machine.portalWindowUntil == nil
            if !opening, !mayChangeWindow(call.peer) {
                return refuse("not-permitted", "the portal window is another user's")
            }
            do {
                // Into the open window's cgroup, or a new one.
                try effects.joinPortalWindow(call.peer, runtimeDirectory: control.path.parentDirectory)
            } catch {
                log.error("cannot open the portal window", metadata: ["error": "\(error.message)", "pid": "\(call.peer.pid)"])
                return refuse("failed", error.message)
            }
            if opening {
                windowOwner = call.peer.uid
                feed(.request(.openPortalWindow))
                guard effects.portalWindow != nil else {
                    feed(.request(.closePortalWindow))  // which takes the cgroup away too
                    return refuse("failed", "the lockdown could not be opened for the window (see the agent's log)")
                }
                log.notice("portal window opened", metadata: ["pid": "\(call.peer.pid)", "uid": "\(call.peer.uid)", "url": "\(url)"])
            }
            let left = (machine.portalWindowUntil ?? Instant.now()) - Instant.now()
            let resolvers = (effects.portalWindow?.resolvers ?? []).map { JSON.string($0.description) }
            call.reply(ControlProtocol.answer([("message", .string("portal window open")), ("url", .string(url)),
                                               ("interface", .string(path.interface)), ("for_ms", left.milliseconds),
                                               ("resolvers", .array(resolvers))]))
        }

        /// Only the one who opened the portal window (or root) closes it or adds to it.
        private func mayChangeWindow(_ peer: PeerProcess) -> Bool {
            windowOwner.map { peer.uid == 0 || peer.uid == $0 } ?? true
        }

        /// A transition as the control socket gives it.
        private func transitionJSON(_ t: Transition) -> JSON {
            var fields: [(String, JSON)] = [
                ("at", .string(wallClock(ago: Instant.now() - t.at))), ("from", .string(t.from.name)), ("to", .string(t.to.name)),
                ("trigger", .string(t.trigger)), ("reason", .string(t.reason.description)),
                ("path", t.to.path.map(Self.pathJSON) ?? .null),
            ]
            if case .switching(_, let candidate, _) = t.to { fields.append(("candidate", Self.pathJSON(candidate))) }
            if let server = t.server { fields.append(("server", .string(server))) }
            fields.append(("attempt", .int(Int64(t.attempt))))
            if let next = t.nextRetry { fields.append(("next_retry_ms", (next - t.at).milliseconds)) }
            fields.append(("coalesced", .int(Int64(t.coalesced))))
            return .object(fields)
        }

        private static func pathJSON(_ path: Path) -> JSON {
            .object([("interface", .string(path.interface)), ("kind", .string(path.kind.rawValue)), ("source", .string("\(path.source)"))])
        }

        /// The client's status, typed (docs/CONTROL.md).
        private var statusJSON: JSON {
            let now = Instant.now()
            var server: [(String, JSON)] = [("name", .string(effects.serverName)), ("address", .string("\(effects.server)"))]
            if let next = machine.handover { server.append(("handover_to", .string(settings.servers[next].name))) }
            var fields: [(String, JSON)] = [
                ("role", .string("client")), ("state", .string(machine.state.name)), ("server", .object(server)),
                ("path", machine.state.path.map(Self.pathJSON) ?? .null),
                ("rtt_ms", machine.roundTripTime.map(\.milliseconds) ?? .null),
                ("mtu", .object([("tunnel", .int(Int64(effects.tunnelMTU))), ("configured", .int(Int64(settings.tunnel.mtu))),
                                 ("floor", .int(Int64(machine.floorMTU))),
                                 ("searching", .bool(machine.isSearchingPathMTU)),
                                 ("size_probes", .int(Int64(machine.sizeProbes)))])),
            ]
            if let t = lastTransition {
                fields += [("since", .string(wallClock(ago: now - t.at))), ("for_ms", (now - t.at).milliseconds),
                           ("last_transition", transitionJSON(t))]
            }
            if case .portal(_, let url) = machine.state {
                var portal: [(String, JSON)] = [("url", .string(url))]
                if let until = machine.portalWindowUntil { portal.append(("window_ms", (until - now).milliseconds)) }
                if let due = machine.timers[.recheck] { portal.append(("next_check_ms", (due - now).milliseconds)) }
                fields.append(("portal", .object(portal)))
            }
            if case .disconnected(let rule, let lifted) = machine.state {
                fields.append(("on_demand", .object([("rule", .string(rule)), ("lockdown_lifted", .bool(lifted != nil))])))
            }
            fields += [("attempts", .int(Int64(attempts))), ("budget_left", .int(Int64(machine.tokens))),
                       ("connectivity_checks", .int(Int64(machine.connectivityChecks))),
                       ("power", .string(machine.power.rawValue))]
            if let client = effects.client {
                let traffic = client.traffic
                fields += [("traffic", .traffic(traffic)),
                           ("drops", .drops(client.drops, traffic, extra: [("no_session", .count(traffic.noSession))]))]
            }
            fields.append(("offload", effects.offload.map { .string($0.description) } ?? .null))
            var lockdown: [(String, JSON)] = [("enabled", .bool(effects.firewall != nil))]
            if let firewall = effects.firewall {
                let counters = firewall.counters()
                lockdown.append(("blocked", .object(BlockCause.allCases.map { ($0.rawValue, .int(Int64(clamping: counters[$0] ?? 0))) })))
                lockdown += [("open_on", firewall.trustedInterface.map { .string($0) } ?? .null),
                             ("refused_loads", .int(Int64(firewall.refusals)))]
            }
            fields.append(("lockdown", .object(lockdown)))
            if let dns = effects.dns {
                var entry: [(String, JSON)] = [("manager", .string(dns.manager.rawValue))]
                if let applied = dns.applied {
                    entry += [("resolvers", .array(applied.resolvers.map { .string("\($0)") })),
                              ("search", .array(applied.searchDomains.map { .string($0) }))]
                }
                entry.append(("problem", effects.dnsProblem.map { .string($0) } ?? .null))
                fields.append(("dns", .object(entry)))
            }
            fields.append(("diverting_routes", .array(effects.divertingRoutes.map { .string($0.description) })))
            return .object(fields)
        }
    }
}

extension ClientSettings {
    /// Whether `other` describes the same tunnel: everything but the tunables.
    func sameTunnel(as other: ClientSettings) -> Bool {
        servers == other.servers && privateKeyFile == other.privateKeyFile
            && username == other.username && passwordFile == other.passwordFile && tunnel == other.tunnel
            && mode == other.mode && lockdown == other.lockdown && allowLAN == other.allowLAN && dns == other.dns
    }
}
