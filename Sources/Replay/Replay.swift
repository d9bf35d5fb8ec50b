public import Topology
import Glibc
public import Basics
public import Reconnector
import Netlink

/// What a replay found: the transitions, the counts the expectations speak of, and every
/// broken invariant or unmet expectation.
public struct ReplayReport: Sendable {
    public var transitions: [Transition] = []
    /// Decisions that bound, rebound or handshook.
    public var attempts = 0
    public var handshakes = 0
    /// Initiations sent again within an attempt (not attempts, not handshakes of their own).
    public var resends = 0
    public var probes = 0
    /// Probes padded to a size, for the path's MTU.
    public var sizeProbes = 0
    /// The tunnel device's MTU at the end.
    public var tunnelMTU = 0
    /// Packets the server started, and those of them that never reached the agent's session.
    public var fromServer = 0
    public var lostFromServer = 0
    /// Persistent keepalives the agent's data plane sent.
    public var keepalives = 0
    /// Connectivity checks (plain HTTP requests outside the tunnel) the agent made.
    public var checks = 0
    /// Longest time the tunnel did not work while some uplink could have carried it.
    public var maxOutage: Duration = .zero
    /// Every stretch the tunnel did not work while some uplink could have carried it, in order.
    public var outages: [Range<Instant>] = []
    /// What others took away and the agent put back; the fights it held off; the longest time
    /// anything it keeps was missing.
    public var restores = 0
    public var holds = 0
    /// `agent exclude` requests granted and refused, and the exclusions the lockdown let through.
    public var excluded = 0
    public var exclusionsRefused = 0
    public var exclusionsOpened = 0
    /// Portal window requests told no window is needed.
    public var portalWindowsNotNeeded = 0
    /// Portal window requests that failed.
    public var portalWindowsFailed = 0
    /// Interfaces the operator was told flap (the first line of each flapping spell).
    public var flapNotices = 0
    /// Restarts of the agent in place that a reload changing the tunnel asked for.
    public var restartsInPlace = 0
    /// Proxy addresses the lockdown let through, and those it refused (a proxy named by host).
    public var proxiesAllowed = 0
    public var proxiesRefused = 0
    /// Look-ups of the server's name that gave nothing the session can use.
    public var serverNamesUnusable = 0
    /// Servers whose every address at start lay inside the tunnel's own routes, told of.
    public var serversCarried = 0
    /// Watchdog pings, and requests for more time to start, told to the service manager.
    public var watchdogPings = 0
    public var startExtensions = 0
    /// When the metrics file was written, on the agent's clock.
    public var metricsWrites: [Instant] = []
    /// Each decision on the tunnel's resolvers, when it was given.
    public var resolvers: [(at: Instant, decision: ResolverDecision)] = []
    /// Tunnel devices set up.
    public var tunnelsAttached = 0
    public var maxMissing: Duration = .zero
    /// Events fed to the core.
    public var inputs = 0
    /// Network changes applied to the model.
    public var networkChanges = 0
    public var finalState: State = .offline
    /// When and why the agent gave up, when it did (its process ended there).
    public var gaveUp: (at: Instant, why: GiveUp)?
    /// When the agent stopped, and whether its stop opened the machine.
    public var stopped: (at: Instant, opensMachine: Bool)?
    /// CPU time the replay took on its thread.
    public var cpuTime: Duration = .zero
    /// Invariants the state machine broke: always a bug.
    public var violations: [String] = []
    /// Expectations of the scenario that did not hold.
    public var failures: [String] = []

    public var passed: Bool { violations.isEmpty && failures.isEmpty }

    /// Every event fed to the core, in order, when the replay was asked to keep it.
    public var trace: [(at: Instant, event: AgentEvent)] = []
    /// The network as the first dump showed it, before the clock started: the trace's network
    /// changes apply to it.
    public var initialNetwork = NetworkModel()
}

/// A scenario that cannot run: an event names a link that does not exist, and the like.
public struct ReplayError: Error, CustomStringConvertible, Sendable {
    public var file: String
    public var line: Int
    public var message: String
    public var description: String { "\(file):\(line): \(message)" }
}

/// Replays a scenario through the real NetworkModel and Reconnector on a virtual clock.
///
/// The replay is also the world: it answers handshakes and probes as the server would over
/// the paths that really pass traffic, delivers application data, and wakes the core for its
/// timers on the world's clock. It drives the core as the daemon does (`CoreRunning`) and
/// checks the machine's invariants after every input.
public struct Replay {
    public let scenario: Scenario
    /// The kernel's network: its links, addresses and routes, and the paths it would take to
    /// the address the agent's session sends to.
    var kernel: PathTracker
    var decoder = NetlinkDecoder()
    /// The core the daemon runs; the world carries out its effects.
    package var core: AgentCore
    var reconnector: Reconnector { core.reconnector }
    /// The event being fed, the state before it, whether it logged a transition, and the core's
    /// attempts and the tokens its machine had taken before it.
    var feeding: (event: AgentEvent, before: State, reported: Bool, attempts: Int, tokens: Int) = (.sleep, .offline, false, 0, 0)
    var now = Instant.zero
    var queue = EventQueue()
    var report = ReplayReport()
    var onTransition: (Transition) -> Void = { _ in }

    // The world.
    var dropped: Set<String> = []
    /// Interfaces behind a closed captive portal, with its login page: UDP is dropped and a
    /// connectivity check gets a redirect there.
    var portals: [String: String] = [:]
    /// The lockdown lets a portal window's process tree out.
    var windowOpen = false
    /// What each network lets out (none named: everything), and the middleboxes that reset
    /// streams that long after they opened.
    var filters: [String: LinkFilter] = [:]
    var streamResets: [String: Duration] = [:]
    /// The agent's streams, by their path: when each is open (TCP, TLS and the proxy's CONNECT
    /// done); one that never opens (its SYN dropped) is absent, its socket in `sockets` all the same.
    var streamReady: [Path.ID: Instant] = [:]
    /// Where the agent's streams reach the proxy named by host on each network, as the lockdown
    /// was opened to it (`Effect.proxyAt`): the runner dials that address.
    var proxyAt: [NetworkKey: IPAddress] = [:]
    /// What the proxy's name gives on each interface's network now (`proxy-dns`).
    var proxyNames: [String: [IPAddress]]
    /// What on-demand rules can learn of the network behind each link.
    var networks: [String: NetworkFacts] = [:]
    /// What a network says of itself and what its probes find, as the scenario describes it.
    struct NetworkFacts: Equatable {
        var ssid: String?
        var gatewayMAC: String?
        var domains: [String]?
        var probes: Set<String> = []
        var tlsKey: KeyPin?
        /// It relays the probes' connections to the servers elsewhere: they see its address.
        var relaysProbes = false
    }
    /// The agent's configuration file as it is now (a reload changes it; a new process reads it).
    var configured: (config: Config, rules: OnDemandRules)
    /// The user who runs `agent portal` in a scenario.
    static let user: UInt32 = 1000
    /// The kernel notices the agent follows for its rules.
    var notices = FactNotices()
    /// An on-demand rule has the lockdown lifted.
    var lockdownLifted = false
    var checkTimes: [Instant] = []
    var rtt: [String: Duration] = [:]
    /// Per link: loss each way, per address family, and jitter, drawn from a generator seeded by
    /// the scenario.
    var lossUp: [String: Double] = [:]
    var lossDown: [String: Double] = [:]
    var lossV4: [String: Double] = [:]
    var lossV6: [String: Double] = [:]
    var jitter: [String: Duration] = [:]
    var pathMTU: [String: Int] = [:]
    var natTimeout: [String: Duration] = [:]
    /// When the laptop last sent through each link: a NAT's mapping lives from there. A mapping
    /// made after the last one expired is a new one (a new outside port): its count goes up.
    var lastSent: [String: Instant] = [:]
    var natMapping: [String: Int] = [:]
    var chance: SeededRandom
    /// Each gateway as the world sees it.
    var gateways: [Gateway]
    struct Gateway {
        var up = true
        /// It holds the agent's session.
        var hasSession = false
        /// When it last heard an authenticated packet: it drops sessions idle longer than the
        /// session lifetime, as the real server does.
        var heardAt = Instant.zero
        /// Where it last heard the agent from, as the real server records it from every
        /// authenticated packet: the path, the socket on it, and the NAT mapping. The packets
        /// it starts go there.
        var endpoint: ClientEndpoint?
    }
    /// The gateway the agent talks to, and the one it prepares a session with.
    var target = 0
    var standby: Int?
    /// What each gateway's name gives, in the resolver's order: the addresses it answers at.
    var names: [[IPAddress]]
    /// Where the agent's session sends (the address the kernel's paths are to), and where the
    /// session it prepares does.
    var sendingTo: IPAddress { kernel.endpoint }
    var standbyAddress: IPAddress?
    var serverUp: Bool {
        get { gateways[target].up }
        set { gateways[target].up = newValue }
    }
    var serverHasSession: Bool {
        get { gateways[target].hasSession }
        set { gateways[target].hasSession = newValue }
    }
    var serverHeardAt: Instant {
        get { gateways[target].heardAt }
        set { gateways[target].heardAt = newValue }
    }
    var lastHint: Instant?
    var acceptsAuth = true
    var sleeping = false
    var sleptAt = Instant.zero

    // The driver's view.
    var socket: Path.ID?
    /// The agent's sockets, one per path, made on first use and kept while their path is one
    /// of the current paths at a bind, as the daemon's effects keep them: a new one is a new
    /// port, where nothing the server sent to the old one arrives.
    var sockets: [Path.ID: Int] = [:]
    var socketsMade = 0
    /// Links whose addresses the kernel refuses to bind a socket to (`refuse-bind`): the next
    /// `times` binds, or until `until`.
    var bindRefusals: [String: (times: Int?, until: Instant?)] = [:]
    /// The data plane's clocks for its liveness notices, whose rules are `LivenessNotices`.
    var lastArrival: Instant?
    var lastReported: Instant?
    var lastSentReport: Instant?
    var awaitingReply = false
    /// When the application last sent: a persistent keepalive goes after that much silence.
    var lastAppSent = Instant.zero
    /// The application's stream and the server's, and their generations: a tick of a replaced
    /// phase is dropped.
    var clientStream: TrafficPhase?
    var serverStream: TrafficPhase?
    var streams = (client: 0, server: 0)
    /// Packets the server started: sent, arrived, and still on their way (not lost when the
    /// replay ends).
    var fromServer = (sent: 0, delivered: 0, inFlight: 0)
    var keepalives = 0
    var clientHasSession = false
    /// Which keys the client holds. A hint names the receiver index of the packet that drew it,
    /// and the client's data plane drops one that names keys it no longer holds.
    var clientKeys = 0
    /// The core's timers as the world's queue holds them (on the agent's clock).
    var armed: [TimerKind: Instant] = [:]
    var handshakeGeneration = 0
    var handshakeInFlight: Path.ID?
    /// The tunnel device's MTU as the agent set it.
    var tunnelMTU: Int
    var outageStart: Instant?
    /// What others took away, since when; who keeps taking it, until when.
    var missing: [Holding: Instant] = [:]
    var takers: [Holding: (by: String?, until: Instant)] = [:]
    /// Attempts, each with the most generous power source in force since the previous one.
    var attemptLog: [(at: Instant, power: PowerSource, budgeted: Bool)] = []
    var acSinceLastAttempt = false
    var pathAtResults: [String?] = []
    var stateAtResults: [String] = []
    var handshakeTimes: [Instant] = []
    var probeTimes: [Instant] = []
    /// When an authenticated answer from the server last reached the agent's session, if the
    /// agent holds one (a restart or "session unknown" ends it).
    var lastHeard: Instant?
    /// The data plane's rule for the server's hints (`HintLatch`, as the client's protocol core keeps it).
    var hints = HintLatch()
    var restarts: UInt64 = 0
    /// The agent's clock minus the world's: negative after the clock stepped back.
    var skew = Duration.zero

    let keepsTrace: Bool

    /// `keepTrace` keeps every fact fed in, for the benchmark to replay without the world.
    public init(_ scenario: Scenario, keepTrace: Bool = false) {
        keepsTrace = keepTrace
        self.scenario = scenario
        kernel = PathTracker(model: NetworkModel(tunnelInterface: scenario.tunnelInterface), endpoint: scenario.server)
        core = AgentCore(Reconnector(config: scenario.config, power: scenario.power, seed: scenario.seed,
                                     servers: scenario.gateways), startupWait: scenario.waitForServer,
                         model: kernel.model, servers: [])
        names = scenario.gateways.map { scenario.gatewayAddresses[$0] ?? scenario.serverAddresses }
        gateways = Array(repeating: Gateway(), count: scenario.gateways.count)
        clientStream = scenario.traffic.map { TrafficPhase(every: $0) }
        serverStream = scenario.serverTraffic
        tunnelMTU = scenario.config.maxMTU
        configured = (scenario.config, scenario.onDemand)
        proxyNames = scenario.proxyDNS
        chance = SeededRandom(seed: scenario.seed ^ 0x6C6F_7373)
    }

    /// Runs the whole timeline; `onTransition` sees each operator log line as it happens.
    public mutating func run(onTransition: @escaping (Transition) -> Void = { _ in }) throws(ReplayError) -> ReplayReport {
        self.onTransition = onTransition
        let cpuAtStart = Self.threadCPUTime()
        // The initial network is what the first dump shows: the model starts from it.
        for event in scenario.network { try applyNetwork(event, report: false) }
        report.initialNetwork = kernel.model
        startAgent(power: scenario.power, seed: scenario.seed, now: .zero)
        for (i, event) in scenario.timeline.enumerated() { queue.push(event.at, .timeline(i)) }
        for (i, check) in scenario.expect.pathAt.enumerated() { queue.push(check.at, .checkpoint(i)) }
        for (i, check) in scenario.expect.stateAt.enumerated() { queue.push(check.at, .stateCheck(i)) }
        pathAtResults = Array(repeating: nil, count: scenario.expect.pathAt.count)
        stateAtResults = Array(repeating: "", count: scenario.expect.stateAt.count)
        if let phase = clientStream { queue.push(.zero + phase.every, .traffic(0)) }
        if let phase = serverStream { queue.push(.zero + phase.every, .serverTraffic(0)) }
        if let every = scenario.persistentKeepalive { queue.push(.zero + every, .keepalive) }
        feed(.start)
        updateOutage()

        while let next = queue.pop(), next.at <= scenario.until {
            // After an unannounced suspend, overdue timers fire at once, as CLOCK_BOOTTIME ones do.
            now = max(now, next.at)
            switch next.what {
            case .timeline(let i): try play(scenario.timeline[i])
            case .timer(let kind, let at):
                // Only the latest arming of a kind counts.
                if armed[kind] == at {
                    armed[kind] = nil
                    feed(.timerFired(kind))
                }
            case .deliver(let input, let generation, let via):
                // Answers in flight when the machine slept or the clock jumped are lost, and so
                // are those whose link lost its carrier or the address they were sent to.
                guard !sleeping, next.at == now, reaches(via) else { break }
                if case .handshakeCompleted = input, generation != handshakeGeneration { break }
                if case .handshakeRejected = input, generation != handshakeGeneration { break }
                // A hint drawn by a packet on keys replaced since (a handshake completed while it
                // was on its way) is about them, not about the session now.
                if case .sessionUnknown = input, generation != clientKeys { break }
                deliver(input)
            case .answer(let input):
                // A check or a look-up always ends with an answer (its own timeout at worst),
                // whatever happened meanwhile.
                feed(input)
            case .echo(let id, let rtt, let size, let via):
                guard !sleeping, next.at == now, reaches(via) else { break }
                arrived(reporting: false)
                feed(.probeEcho(id: id, rtt: rtt, size: size))
            case .traffic(let generation):
                // A sleeping machine sends nothing, and its sleep costs no ticks: the wake
                // starts them again.
                guard generation == streams.client, let phase = clientStream else { break }
                if sleeping { trafficPaused = true; break }
                sendTraffic(size: phase.size ?? scenario.trafficSize)
                queue.push(now + phase.every, .traffic(generation))
            case .serverTraffic(let generation):
                // The server sends on while the laptop sleeps: those packets are lost.
                guard generation == streams.server, let phase = serverStream else { break }
                serverSends(size: phase.size ?? scenario.trafficSize)
                queue.push(now + phase.every, .serverTraffic(generation))
            case .fromServer(let endpoint):
                fromServer.inFlight -= 1
                if !sleeping, next.at == now, reaches(endpoint), clientHasSession {
                    fromServer.delivered += 1
                    arrived()
                }
            case .keepalive:
                guard let every = scenario.persistentKeepalive else { break }
                let due = lastAppSent + every
                if due <= now {
                    sendKeepalive(persistent: true)
                    queue.push(now + every, .keepalive)
                } else {
                    queue.push(due, .keepalive)
                }
            case .retake(let holding):
                if let taker = takers[holding], now < taker.until, missing[holding] == nil, !(lockdownLifted && holding != .lockdown) {
                    take(holding, by: taker.by)
                }
            case .streamBroke(let id, let socket, let why):
                // Only the stream it was about: one opened since is another connection.
                guard sockets[id] == socket else { break }
                sockets[id] = nil
                streamReady[id] = nil
                if !sleeping { feed(.streamFailed(id, why: why)) }
            case .checkpoint(let i):
                pathAtResults[i] = reconnector.state.path?.name
            case .stateCheck(let i):
                stateAtResults[i] = reconnector.state.name
            case .restartAgent: restartAgent()
            }
            updateOutage()
        }
        now = max(now, scenario.until)
        endOutage()
        for since in missing.values { report.maxMissing = max(report.maxMissing, now - since) }
        report.finalState = reconnector.state
        report.tunnelMTU = tunnelMTU
        report.fromServer = fromServer.sent - fromServer.inFlight
        report.lostFromServer = report.fromServer - fromServer.delivered
        report.keepalives = keepalives
        checkBudget()
        report.cpuTime = Self.threadCPUTime() - cpuAtStart
        checkExpectations()
        return report
    }

    static func threadCPUTime() -> Duration {
        var ts = timespec()
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts)
        return .seconds(ts.tv_sec) + .nanoseconds(ts.tv_nsec)
    }

    // MARK: Timeline

    mutating func play(_ event: TimedEvent) throws(ReplayError) {
        switch event.event {
        case .link, .linkRemoved, .addressAdded, .addressRemoved, .routeAdded, .routeRemoved, .change, .netlink:
            try applyNetwork(event)
        case .sleep:
            feed(.sleep)
            sleeping = true
            sleptAt = now
        case .wake:
            sleeping = false
            feed(.wake(sleptFor: now - sleptAt))
            if trafficPaused, let phase = clientStream {
                trafficPaused = false
                queue.push(now + phase.every, .traffic(streams.client))
            }
        case .clockJump(let length):
            // A handshake in flight across a suspend was lost with the machine's network state.
            handshakeInFlight = nil
            now = now + length
            feed(.wake(sleptFor: length))
        case .stop(let who):
            feed(.request(.stop(who)))
        case .clockBack(let step):
            // Only the agent's clock moves: answers in flight still come, timers keep their waits.
            skew = skew - step
        case .power(let source):
            if reconnector.power == .ac || source == .ac { acSinceLastAttempt = true }
            feed(.powerChanged(source))
        case .server(.moved):
            // The server answers at other addresses now, and its name gives them; the agent
            // hears of it when it looks the name up.
            names[target] = names[target].map(Self.moved)
        case .server(let change):
            serverHasSession = false
            serverUp = change != .down
            breakStreams()
        case .gateway(let index, .drain):
            // Said through the session, so it reaches the agent only while that works.
            guard index == target, !sleeping, clientHasSession, serverHasSession, let socket, passes(socket) else { break }
            let at = arrival(socket)
            if !lost(socket, up: false, arriving: at) { queue.push(at, .deliver(.serverDraining, generation: 0, via: socket)) }
        case .gateway(let index, let change):
            gateways[index].hasSession = false
            gateways[index].up = change == .up
            if index == target { breakStreams() }
        case .drop(let name): dropped.insert(name)
        case .refuseBind(let name, let times, let length): bindRefusals[name] = (times, length.map { now + $0 })
        case .restore(let name): dropped.remove(name)
        case .portal(let name, let url): portals[name] = url
        case .login(let name): portals[name] = nil
        case .proxyDNS(let dev, let addresses): proxyNames[dev] = addresses
        case .portalWindow(let open):
            // `agent portal`, run by the user who logs in; its command ends, or it is closed.
            feed(.request(open ? .openPortalWindow(by: Self.user) : .closePortalWindow(by: Self.user)))
        case .auth(let accepts): acceptsAuth = accepts
        case .traffic(let phase):
            // A new phase starts now: its first packet goes at once.
            clientStream = phase
            streams.client += 1
            trafficPaused = false
            if phase != nil { queue.push(now, .traffic(streams.client)) }
        case .serverTraffic(let phase):
            serverStream = phase
            streams.server += 1
            if phase != nil { queue.push(now, .serverTraffic(streams.server)) }
        case .forgedHint:
            // It names the session in use, so it reaches the agent while the agent holds one;
            // nothing in the world changes (the server keeps the session).
            if !sleeping, clientHasSession, socket.map(reaches) == true { deliver(.sessionUnknown) }
        case .reconnect:
            // The operator asked for fresh keys: the old session no longer counts as alive.
            lastHeard = nil
            feed(.request(.reconnect))
        case .reload(let config, let rules, let changes):
            configured = (config, rules)  // a new process, if the tunnel changed, reads them too
            feed(.reloaded(Reload(config: config, rules: rules, tunnelChanges: changes, metricsFile: scenario.heartbeats.metricsFile)))
        case .operatorPause(let down):
            feed(.request(down ? .pause : .resume))
        case .exclude: feed(.request(.exclude(by: Self.user)))
        case .taken(let holding, let by, let fighting):
            // With the lockdown lifted by a rule, the tunnel's routing and resolvers are away already.
            if lockdownLifted && holding != .lockdown { break }
            if let fighting { takers[holding] = (by, now + fighting) }
            take(holding, by: by)
        case .restart: restartAgent()
        }
    }

    /// The agent's process ends and a new one starts: what the real agent keeps across
    /// processes, and nothing else. The new process reads the clock the old one read (stepped
    /// back, if it was), not the world's.
    mutating func restartAgent() {
        restarts += 1
        startAgent(power: reconnector.power, seed: scenario.seed &+ restarts, now: now + skew, memory: reconnector.memory)
        target = 0
        standby = nil
        socket = nil
        sockets.removeAll()
        awaitingReply = false
        clientHasSession = false
        clientKeys += 1
        lastHeard = nil
        armed.removeAll()
        handshakeInFlight = nil
        handshakeGeneration += 1
        windowOpen = false  // the new process loads the lockdown whole
        lockdownLifted = false
        notices = FactNotices()
        // The new process loads the lockdown and, once the tunnel is up, its routes and resolvers whole.
        for holding in Array(missing.keys) { putBack(holding) }
        feed(.start)
    }
    var trafficPaused = false
    /// The world refused to lift the lockdown and the core has not heard yet.
    var liftRefusalOnItsWay = false
    /// The lockdown refused a change: the core hears it as damage, as the daemon's does (the
    /// table is uncertain to it), and puts it back; the world's table stayed as it was.
    var lockdownUncertain = false
    /// This process of the agent has its tunnel device.
    var deviceAttached = false

    /// A new process of the agent: it looks the servers' names up as it starts (what the world's
    /// names give now), and starts on the first address an uplink reaches.
    mutating func startAgent(power: PowerSource, seed: UInt64, now: Instant, memory: Reconnector.Memory? = nil) {
        deviceAttached = false
        proxyAt = [:]  // a new process knows no proxy address yet
        let reconnector = if let memory {
            Reconnector(config: configured.config, power: power, seed: seed, now: now, memory: memory, servers: scenario.gateways)
        } else {
            Reconnector(config: configured.config, power: power, seed: seed, servers: scenario.gateways)
        }
        core = AgentCore(reconnector, startupWait: scenario.waitForServer, model: kernel.model,
                         servers: names.map { ServerBook.Entry(named: true, addresses: $0) }, rules: configured.rules,
                         exclusionAllowed: scenario.exclusionAllowed, portalWindows: scenario.portalWindows,
                         tunnelCarries: scenario.splitRoutes,
                         resolvers: scenario.serverDNS.map { _ in
                             ResolverChoice(override: nil, carried: scenario.splitRoutes.isEmpty ? [.any(.v4), .any(.v6)] : scenario.splitRoutes,
                                            lockdown: true)
                         }, proxyNamed: scenario.proxyNamed, heartbeats: scenario.heartbeats)
        _ = kernel.retarget(to: core.serverAddress)
    }

    /// An address of the server after it moved: the next one up.
    static func moved(_ address: IPAddress) -> IPAddress {
        switch address {
        case .v4(let bits): .v4(bits &+ 1)
        case .v6(let high, let low): .v6(high, low &+ 1)
        }
    }

    /// Each change goes to the kernel's network, then to the agent.
    mutating func applyNetwork(_ event: TimedEvent, report feeding: Bool = true) throws(ReplayError) {
        var described: String?
        if case .link(let spec) = event.event { described = spec.name }
        let before = described.flatMap { networks[$0] }
        for change in try resolve(event) {
            report.networkChanges += 1
            _ = kernel.apply(change)
            guard feeding else { continue }
            feed(.network(change))
        }
        if feeding, let described { noticeFacts(on: described, before: before) }
    }

    /// Turns a named event into model changes, as the kernel would report them.
    mutating func resolve(_ event: TimedEvent) throws(ReplayError) -> [NetworkChange] {
        let model = kernel.model
        func index(_ name: String) throws(ReplayError) -> Int32 {
            guard let link = model.link(named: name) else {
                throw ReplayError(file: scenario.file, line: event.line, message: "no link named '\(name)' at \(now)s")
            }
            return link.index
        }
        switch event.event {
        case .change(let change):
            return [change]
        case .netlink(let bytes):
            let before = decoder.malformed
            let changes = decoder.decode(bytes).changes
            if decoder.malformed > before {
                throw ReplayError(file: scenario.file, line: event.line, message: "malformed netlink message")
            }
            return changes.map { change in
                guard case .linkChanged(var link) = change, let kind = scenario.linkKinds[link.name] else { return change }
                link.kind = kind
                return .linkChanged(link)
            }
        case .link(let spec):
            if let rtt = spec.rtt { self.rtt[spec.name] = rtt }
            if let share = spec.lossUp { lossUp[spec.name] = share }
            if let share = spec.lossDown { lossDown[spec.name] = share }
            if let share = spec.lossV4 { lossV4[spec.name] = share }
            if let share = spec.lossV6 { lossV6[spec.name] = share }
            if let spread = spec.jitter { jitter[spec.name] = spread }
            if let mtu = spec.pathMTU { pathMTU[spec.name] = mtu }
            if let timeout = spec.natTimeout { natTimeout[spec.name] = timeout }
            var facts = networks[spec.name] ?? NetworkFacts()
            if let ssid = spec.ssid { facts.ssid = ssid }
            if let mac = spec.gatewayMAC { facts.gatewayMAC = mac }
            if let domains = spec.dnsDomains { facts.domains = domains }
            if let urls = spec.probeAnswers { facts.probes = Set(urls) }
            if let key = spec.tlsKey { facts.tlsKey = key }
            if let relays = spec.relaysProbes { facts.relaysProbes = relays }
            if let filter = spec.blocks { filters[spec.name] = filter }
            if let after = spec.streamResetAfter { streamResets[spec.name] = after > .zero ? after : nil }
            networks[spec.name] = facts
            let old = model.link(named: spec.name)
            let index = spec.index ?? old?.index ?? (model.links.keys.max().map { $0 + 1 } ?? 2)
            let link = Link(index: index, name: spec.name, kind: spec.kind ?? old?.kind ?? .other,
                            isUp: spec.up ?? old?.isUp ?? true, hasCarrier: spec.carrier ?? old?.hasCarrier ?? true,
                            mtu: spec.mtu ?? old?.mtu ?? 1500)
            return [.linkChanged(link)]
        case .linkRemoved(let name):
            return [.linkRemoved(index: try index(name))]
        case .addressAdded(let dev, let prefix, let flags):
            return [.addressAdded(Address(linkIndex: try index(dev), prefix: prefix, flags: flags))]
        case .addressRemoved(let dev, let prefix):
            return [.addressRemoved(Address.Key(linkIndex: try index(dev), prefix: prefix))]
        case .routeAdded(let spec):
            var hops: [NextHop] = []
            for hop in spec.hops { hops.append(NextHop(gateway: hop.gateway, linkIndex: try index(hop.dev))) }
            return [.routeAdded(Route(table: spec.table, destination: spec.to, type: spec.type, nextHops: hops,
                                      metric: spec.metric ?? 0, preferredSource: spec.source))]
        case .routeRemoved(let spec):
            var devs: [Int32] = []
            for hop in spec.hops { devs.append(try index(hop.dev)) }
            let keys = model.routes.values.filter { route in
                route.table == spec.table && route.destination == spec.to
                    && (spec.metric == nil || route.metric == spec.metric)
                    && (devs.isEmpty || route.nextHops.contains { devs.contains($0.linkIndex) })
            }.map(\.key)
            guard !keys.isEmpty else {
                throw ReplayError(file: scenario.file, line: event.line, message: "no route to \(spec.to) to delete at \(now)s")
            }
            return keys.map { .routeRemoved($0) }
        default:
            return []
        }
    }
}
