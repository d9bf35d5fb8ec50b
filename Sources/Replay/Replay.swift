public import Topology
import Glibc
public import Basics
import PathMonitor
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
    private var kernel: PathTracker
    private var decoder = NetlinkDecoder()
    /// The core the daemon runs; the world carries out its effects.
    package var core: AgentCore
    private var reconnector: Reconnector { core.reconnector }
    /// The event being fed, the state before it, whether it logged a transition, and the core's
    /// attempts and the tokens its machine had taken before it.
    private var feeding: (event: AgentEvent, before: State, reported: Bool, attempts: Int, tokens: Int) = (.sleep, .offline, false, 0, 0)
    private var now = Instant.zero
    private var queue = EventQueue()
    private var report = ReplayReport()
    private var onTransition: (Transition) -> Void = { _ in }

    // The world.
    private var dropped: Set<String> = []
    /// Interfaces behind a closed captive portal, with its login page: UDP is dropped and a
    /// connectivity check gets a redirect there.
    private var portals: [String: String] = [:]
    /// The lockdown lets a portal window's process tree out.
    private var windowOpen = false
    /// What each network lets out (none named: everything), and the middleboxes that reset
    /// streams that long after they opened.
    private var filters: [String: LinkFilter] = [:]
    private var streamResets: [String: Duration] = [:]
    /// The agent's streams, by their path: when each is open (TCP, TLS and the proxy's CONNECT
    /// done); one that never opens (its SYN dropped) is absent, its socket in `sockets` all the same.
    private var streamReady: [Path.ID: Instant] = [:]
    /// Where the agent's streams reach the proxy named by host on each network, as the lockdown
    /// was opened to it (`Effect.proxyAt`): the runner dials that address.
    private var proxyAt: [NetworkKey: IPAddress] = [:]
    /// What the proxy's name gives on each interface's network now (`proxy-dns`).
    private var proxyNames: [String: [IPAddress]]
    /// What on-demand rules can learn of the network behind each link.
    private var networks: [String: NetworkFacts] = [:]
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
    private var configured: (config: Config, rules: OnDemandRules)
    /// The user who runs `agent portal` in a scenario.
    static let user: UInt32 = 1000
    /// The kernel notices the agent follows for its rules.
    private var notices = FactNotices()
    /// An on-demand rule has the lockdown lifted.
    private var lockdownLifted = false
    private var checkTimes: [Instant] = []
    private var rtt: [String: Duration] = [:]
    /// Per link: loss each way, per address family, and jitter, drawn from a generator seeded by
    /// the scenario.
    private var lossUp: [String: Double] = [:]
    private var lossDown: [String: Double] = [:]
    private var lossV4: [String: Double] = [:]
    private var lossV6: [String: Double] = [:]
    private var jitter: [String: Duration] = [:]
    private var pathMTU: [String: Int] = [:]
    private var natTimeout: [String: Duration] = [:]
    /// When the laptop last sent through each link: a NAT's mapping lives from there. A mapping
    /// made after the last one expired is a new one (a new outside port): its count goes up.
    private var lastSent: [String: Instant] = [:]
    private var natMapping: [String: Int] = [:]
    private var chance: SeededRandom
    /// Each gateway as the world sees it.
    private var gateways: [Gateway]
    private struct Gateway {
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
    private var target = 0
    private var standby: Int?
    /// What each gateway's name gives, in the resolver's order: the addresses it answers at.
    private var names: [[IPAddress]]
    /// Where the agent's session sends (the address the kernel's paths are to), and where the
    /// session it prepares does.
    private var sendingTo: IPAddress { kernel.endpoint }
    private var standbyAddress: IPAddress?
    private var serverUp: Bool {
        get { gateways[target].up }
        set { gateways[target].up = newValue }
    }
    private var serverHasSession: Bool {
        get { gateways[target].hasSession }
        set { gateways[target].hasSession = newValue }
    }
    private var serverHeardAt: Instant {
        get { gateways[target].heardAt }
        set { gateways[target].heardAt = newValue }
    }
    private var lastHint: Instant?
    private var acceptsAuth = true
    private var sleeping = false
    private var sleptAt = Instant.zero

    // The driver's view.
    private var socket: Path.ID?
    /// The agent's sockets, one per path, made on first use and kept while their path is one
    /// of the current paths at a bind, as the daemon's effects keep them: a new one is a new
    /// port, where nothing the server sent to the old one arrives.
    private var sockets: [Path.ID: Int] = [:]
    private var socketsMade = 0
    /// Links whose addresses the kernel refuses to bind a socket to (`refuse-bind`): the next
    /// `times` binds, or until `until`.
    private var bindRefusals: [String: (times: Int?, until: Instant?)] = [:]
    /// The data plane's clocks for its liveness notices, whose rules are `LivenessNotices`.
    private var lastArrival: Instant?
    private var lastReported: Instant?
    private var lastSentReport: Instant?
    private var awaitingReply = false
    /// When the application last sent: a persistent keepalive goes after that much silence.
    private var lastAppSent = Instant.zero
    /// The application's stream and the server's, and their generations: a tick of a replaced
    /// phase is dropped.
    private var clientStream: TrafficPhase?
    private var serverStream: TrafficPhase?
    private var streams = (client: 0, server: 0)
    /// Packets the server started: sent, arrived, and still on their way (not lost when the
    /// replay ends).
    private var fromServer = (sent: 0, delivered: 0, inFlight: 0)
    private var keepalives = 0
    private var clientHasSession = false
    /// Which keys the client holds. A hint names the receiver index of the packet that drew it,
    /// and the client's data plane drops one that names keys it no longer holds.
    private var clientKeys = 0
    /// The core's timers as the world's queue holds them (on the agent's clock).
    private var armed: [TimerKind: Instant] = [:]
    private var handshakeGeneration = 0
    private var handshakeInFlight: Path.ID?
    /// The tunnel device's MTU as the agent set it.
    private var tunnelMTU: Int
    private var outageStart: Instant?
    /// What others took away, since when; who keeps taking it, until when.
    private var missing: [Holding: Instant] = [:]
    private var takers: [Holding: (by: String?, until: Instant)] = [:]
    /// Attempts, each with the most generous power source in force since the previous one.
    private var attemptLog: [(at: Instant, power: PowerSource, budgeted: Bool)] = []
    private var acSinceLastAttempt = false
    private var pathAtResults: [String?] = []
    private var stateAtResults: [String] = []
    private var handshakeTimes: [Instant] = []
    private var probeTimes: [Instant] = []
    /// When an authenticated answer from the server last reached the agent's session, if the
    /// agent holds one (a restart or "session unknown" ends it).
    private var lastHeard: Instant?
    /// The data plane's rule for the server's hints (`HintLatch`, as the client's protocol core keeps it).
    private var hints = HintLatch()
    private var restarts: UInt64 = 0
    /// The agent's clock minus the world's: negative after the clock stepped back.
    private var skew = Duration.zero

    private let keepsTrace: Bool

    /// `keepTrace` keeps every fact fed in, for the benchmark to replay without the world.
    public init(_ scenario: Scenario, keepTrace: Bool = false) {
        keepsTrace = keepTrace
        self.scenario = scenario
        kernel = PathTracker(model: NetworkModel(tunnelInterface: scenario.tunnelInterface), endpoint: scenario.server)
        core = AgentCore(Reconnector(config: scenario.config, power: scenario.power, seed: scenario.seed,
                                     servers: scenario.gateways), startupWait: scenario.waitForServer,
                         model: kernel.model, servers: [])
        names = Array(repeating: scenario.serverAddresses, count: scenario.gateways.count)
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

    private static func threadCPUTime() -> Duration {
        var ts = timespec()
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts)
        return .seconds(ts.tv_sec) + .nanoseconds(ts.tv_nsec)
    }

    // MARK: Timeline

    private mutating func play(_ event: TimedEvent) throws(ReplayError) {
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
            feed(.reloaded(Reload(config: config, rules: rules, tunnelChanges: changes)))
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
    private mutating func restartAgent() {
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
    private var trafficPaused = false
    /// The world refused to lift the lockdown and the core has not heard yet.
    private var liftRefusalOnItsWay = false
    /// This process of the agent has its tunnel device.
    private var deviceAttached = false

    /// A new process of the agent: it looks the servers' names up as it starts (what the world's
    /// names give now), and starts on the first address an uplink reaches.
    private mutating func startAgent(power: PowerSource, seed: UInt64, now: Instant, memory: Reconnector.Memory? = nil) {
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
                         }, proxyNamed: scenario.proxyNamed)
        _ = kernel.retarget(to: core.serverAddress)
    }

    /// An address of the server after it moved: the next one up.
    private static func moved(_ address: IPAddress) -> IPAddress {
        switch address {
        case .v4(let bits): .v4(bits &+ 1)
        case .v6(let high, let low): .v6(high, low &+ 1)
        }
    }

    /// Each change goes to the kernel's network, then to the agent.
    private mutating func applyNetwork(_ event: TimedEvent, report feeding: Bool = true) throws(ReplayError) {
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
    private mutating func resolve(_ event: TimedEvent) throws(ReplayError) -> [NetworkChange] {
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

    // MARK: The world

    private func interface(of id: Path.ID) -> String? { kernel.model.links[id.linkIndex]?.name }

    /// True when a packet can still arrive on this path: its link has carrier and its address.
    private func reaches(_ id: Path.ID) -> Bool {
        guard let link = kernel.model.links[id.linkIndex], link.isUsable else { return false }
        return kernel.model.addresses.values.contains { $0.linkIndex == id.linkIndex && $0.ip == id.source }
    }

    /// True when a packet the server sent to `endpoint` can arrive: the socket is still open and
    /// its path still reaches.
    private func reaches(_ endpoint: ClientEndpoint) -> Bool {
        sockets[endpoint.path] == endpoint.socket && reaches(endpoint.path)
    }

    /// True when packets sent from this path reach the server (the gateway talked to, unless
    /// named): it is up and answers at the address they go to.
    private func passes(_ id: Path.ID, gateway: Int? = nil) -> Bool {
        let to = gateway == nil ? sendingTo : standbyAddress
        guard !sleeping, gateways[gateway ?? target].up, let to, names[gateway ?? target].contains(to),
              isCurrent(id), let name = interface(of: id), !dropped.contains(name) else { return false }
        switch id.transport {
        case .udp: return portals[name] == nil && filter(name).passesUDP
        // The stream carries once open; a portal that appeared meanwhile intercepts what follows.
        case .stream: return streamReady[id] != nil && portals[name] == nil
        }
    }

    /// True when `id`'s uplink and source are one of the kernel's paths to the server now (the
    /// source may be one the link no longer prefers), whatever the transport.
    private func isCurrent(_ id: Path.ID) -> Bool {
        let udp = id.over(.udp)
        return kernel.paths.contains { $0.id == udp || ($0.linkIndex == id.linkIndex && $0.otherSources.contains(id.source)) }
    }

    private func filter(_ name: String) -> LinkFilter { filters[name] ?? .none }

    /// How a stream opened now over `id` fares: it opens after that many round trips (TCP,
    /// TLS, the proxy's CONNECT), fails after that long and why, or never opens (its SYN dropped:
    /// only the attempt's own timeout ends it).
    private enum StreamOutcome { case opens(roundTrips: Int), fails(after: Duration, String), silent }

    private func streamOutcome(_ id: Path.ID) -> StreamOutcome {
        guard !sleeping, reaches(id), let name = interface(of: id), !dropped.contains(name) else { return .silent }
        let rtt = roundTrip(id)
        // A portal intercepts HTTPS: TLS fails on its certificate.
        if portals[name] != nil { return .fails(after: rtt * 2, "TLS failed: the certificate is not the gateway's") }
        switch filter(name) {
        case .allButTCP443 where scenario.streamPort != 443: return .silent
        case .allButProxy where scenario.streamProxy == nil: return .fails(after: rtt, "connection refused")
        default: break
        }
        if scenario.proxyNamed {
            // The runner dials the address the core had the lockdown let through on this network.
            guard let at = proxyAddress(for: id) else { return .fails(after: .zero, "no address for the proxy on \(name)") }
            guard (proxyNames[name] ?? []).contains(at) else { return .silent }  // no proxy at that address here
        }
        guard gateways[target].up else { return .fails(after: rtt, "connection refused") }
        return .opens(roundTrips: scenario.streamProxy == nil ? 2 : 3)
    }

    /// The stream on `id`, opened on first use as the runner opens it: a new connection (a new
    /// socket, where nothing sent to an earlier one arrives).
    /// The proxy's address the runner dials for a stream on `id`'s network (a proxy named by host).
    private func proxyAddress(for id: Path.ID) -> IPAddress? {
        kernel.paths.first { $0.id == id.over(.udp) }.flatMap { proxyAt[NetworkKey($0)] }
    }

    private mutating func openStream(on id: Path.ID) {
        guard sockets[id] == nil else { return }
        if scenario.proxyNamed, proxyAddress(for: id) == nil {
            violation("a stream on \(interface(of: id) ?? "?") before the proxy's name gave an address there")
        }
        socketsMade += 1
        let socket = socketsMade
        sockets[id] = socket
        switch streamOutcome(id) {
        case .opens(let trips):
            let ready = now + roundTrip(id) * trips
            streamReady[id] = ready
            if let name = interface(of: id), let after = streamResets[name] {
                queue.push(ready + after, .streamBroke(id, socket: socket, why: "connection reset by peer"))
            }
        case .fails(let after, let why):
            queue.push(now + after, .streamBroke(id, socket: socket, why: why))
        case .silent:
            break
        }
    }

    /// The gateway's process went away (down, or restarting): its host resets every stream to
    /// it, which the agent hears of half a round trip later.
    private mutating func breakStreams() {
        for (id, socket) in sockets where id.transport == .stream && streamReady[id] != nil {
            queue.push(now + roundTrip(id) / 2, .streamBroke(id, socket: socket, why: "connection reset by peer"))
        }
    }

    private func roundTrip(_ id: Path.ID) -> Duration {
        interface(of: id).flatMap { rtt[$0] } ?? scenario.rtt
    }

    /// Whether one packet through `id` in this direction is lost: to the link's loss, to a path
    /// MTU smaller than the packet (`size` bytes on the wire, either way), or, for an answer, to
    /// a NAT that forgot the mapping before it arrived (`arriving`).
    private mutating func lost(_ id: Path.ID, up: Bool, size: Int = 64, arriving: Instant? = nil) -> Bool {
        // TCP delivers what it carries (a loss only delays it) and cuts packets of any size.
        guard let name = interface(of: id), id.transport == .udp else { return false }
        if !fits(size, on: id) { return true }
        if up {
            if let timeout = natTimeout[name], let sent = lastSent[name], now - sent > timeout { natMapping[name, default: 0] += 1 }
            lastSent[name] = now
        } else if let at = arriving, let timeout = natTimeout[name], let sent = lastSent[name], at - sent > timeout {
            return true
        }
        if draw((up ? lossUp : lossDown)[name]) { return true }
        return draw((id.source.family == .v4 ? lossV4 : lossV6)[name])
    }

    /// True with probability `share` (none drawn without one, so a scenario's other draws stay put).
    private mutating func draw(_ share: Double?) -> Bool {
        guard let share, share > 0 else { return false }
        return Double(chance.next() >> 11) / Double(1 << 53) < share
    }

    /// When the answer to a packet sent now through `id` arrives: the round trip plus the link's jitter.
    private mutating func arrival(_ id: Path.ID) -> Instant {
        let spread = interface(of: id).flatMap { jitter[$0] } ?? .zero
        // Over a stream still opening, the packet goes once it is open.
        let opening = streamReady[id].map { $0 > now ? $0 - now : .zero } ?? .zero
        return now + opening + roundTrip(id) + chance.upTo(spread)
    }

    private var carrying: Bool {
        switch reconnector.state {
        case .connected, .probing, .switching: true
        default: false
        }
    }

    /// True when the path through `id` carries a packet of `size` bytes on the wire.
    private func fits(_ size: Int, on id: Path.ID) -> Bool {
        id.transport == .stream || (interface(of: id).flatMap { pathMTU[$0] }.map { size <= $0 } ?? true)
    }

    /// What the tunnel adds to an inner packet on the wire over `id`.
    static func overhead(_ id: Path.ID) -> Int { Path.tunnelOverhead(from: id.source) }

    /// The application's packet on the wire: at most the tunnel's MTU inside (the kernel makes
    /// the application's packets fit the device), plus the tunnel's overhead.
    private func wireSize(of inner: Int, on id: Path.ID) -> Int {
        min(inner, tunnelMTU) + Self.overhead(id)
    }

    /// The application sends a packet of `inner` bytes, which its peer answers as big; as the
    /// data plane does, the first after a quiet spell is reported to the agent.
    private mutating func sendTraffic(size inner: Int) {
        guard !sleeping, carrying, let socket else { return }
        lastAppSent = now
        if LivenessNotices.reportsSent(at: now, lastArrival: lastArrival, awaiting: awaitingReply, lastReport: lastSentReport) {
            awaitingReply = true
            lastSentReport = now
            feed(.dataSent)
        }
        let size = wireSize(of: inner, on: socket)
        answer(from: socket, clientHasSession ? .dataReceived : nil, size: size, downSize: size)
    }

    /// An authenticated packet reached the agent's session: the data plane notes it, and reports
    /// it as `LivenessNotices` say (a probe's echo or a handshake's answer is reported as such:
    /// `reporting: false`).
    private mutating func arrived(reporting: Bool = true) {
        lastArrival = now
        if lastHeard != nil { lastHeard = now }
        hints.reset()
        guard reporting, LivenessNotices.reportsArrival(at: now, awaited: awaitingReply, lastReport: lastReported) else { return }
        awaitingReply = false
        lastReported = now
        feed(.dataReceived)
    }

    /// A keepalive from the session's socket (after a rebind, a handshake's confirmation, or
    /// `persistent` after the application's silence): the server and the NATs on the way hear
    /// it; nothing answers.
    private mutating func sendKeepalive(persistent: Bool) {
        guard !sleeping, clientHasSession, let socket else { return }
        if persistent { keepalives += 1 }
        guard passes(socket), !lost(socket, up: true) else { return }
        serverHeard(from: socket)
    }

    /// The gateway (the one talked to, unless named) heard an authenticated packet from `id` on
    /// the session it holds: the session lives on, and it records where from.
    private mutating func serverHeard(from id: Path.ID, gateway: Int? = nil) {
        let index = gateway ?? target
        guard gateways[index].hasSession else { return }
        gateways[index].heardAt = now
        if let endpoint = endpoint(of: id) { gateways[index].endpoint = endpoint }
    }

    /// Where a packet sent from `id` comes from, as a server sees it: the agent's socket on the
    /// path and the NAT's mapping of its link.
    private func endpoint(of id: Path.ID) -> ClientEndpoint? {
        guard let socket = sockets[id], let name = interface(of: id) else { return nil }
        return ClientEndpoint(path: id, socket: socket, mapping: natMapping[name, default: 0])
    }

    /// A packet the server starts, sent to where it last heard the agent from: lost when the
    /// session is gone, the NAT forgot or remapped, or the agent's socket there is closed.
    private mutating func serverSends(size inner: Int) {
        let gateway = gateways[target]
        guard gateway.up else { return }
        fromServer.sent += 1
        guard gateway.hasSession, now - gateway.heardAt < scenario.config.sessionLifetime, let endpoint = gateway.endpoint,
              let name = interface(of: endpoint.path), !dropped.contains(name), portals[name] == nil else { return }
        switch endpoint.path.transport {
        case .udp: guard natMapping[name, default: 0] == endpoint.mapping, filter(name).passesUDP else { return }
        case .stream: guard streamReady[endpoint.path] != nil else { return }
        }
        let at = now + roundTrip(endpoint.path) / 2
        guard !lost(endpoint.path, up: false, size: wireSize(of: inner, on: endpoint.path), arriving: at) else { return }
        fromServer.inFlight += 1
        queue.push(at, .fromServer(endpoint))
    }

    /// The server's answer to an authenticated packet from `id` (`size` bytes on the wire):
    /// `reply` if it knows the session (`downSize` bytes back), else its rate-limited
    /// "session unknown" hint.
    private mutating func answer(from id: Path.ID, _ reply: AgentEvent?, size: Int = 64, downSize: Int = 64) {
        guard passes(id), let reply, !lost(id, up: true, size: size) else { return }
        if serverHasSession && now - serverHeardAt >= scenario.config.sessionLifetime { serverHasSession = false }
        if serverHasSession {
            serverHeard(from: id)
            let at = arrival(id)
            if !lost(id, up: false, size: downSize, arriving: at) {
                // An echo names its probe and reports the round trip it really took, jitter included.
                if case .probeEcho(let probe, _, let size) = reply {
                    queue.push(at, .echo(probe, rtt: at - now, size: size, via: id))
                } else {
                    queue.push(at, .deliver(reply, generation: 0, via: id))
                }
            }
        } else if lastHint.map({ now - $0 >= .milliseconds(100) }) ?? true {
            lastHint = now
            let at = arrival(id)
            if !lost(id, up: false, arriving: at) { queue.push(at, .deliver(.sessionUnknown, generation: clientKeys, via: id)) }
        }
    }

    private mutating func deliver(_ input: AgentEvent) {
        switch input {
        case .handshakeCompleted:
            clientHasSession = true
            clientKeys += 1
            lastHeard = now
            arrived(reporting: false)
            // Its confirmation tells the server where the agent is.
            sendKeepalive(persistent: false)
        case .sessionUnknown:
            // The client keeps its keys (the hint is unauthenticated) and sends on. As its data
            // plane does, it reports one hint per session until the server is heard again.
            guard hints.hint() else { return }
            // A true hint: the server has said it lost the session.
            if !serverHasSession { lastHeard = nil }
        case .dataReceived:
            // An answer to the application's data: the data plane reports it if it reported
            // the data sent.
            return arrived()
        default: break
        }
        feed(input)
    }

    private mutating func updateOutage() {
        // A tunnel the rules keep down is no outage.
        let keptDown = if case .disconnected = reconnector.state { true } else { false }
        let couldWork = !sleeping && !keptDown && gateways.contains(where: \.up) && acceptsAuth
            && kernel.paths.contains { couldCarry($0) }
        // Full-size packets count: a path that drops them (an MTU black hole) carries no tunnel.
        let works = carrying && clientHasSession && serverHasSession && missing[.routing] == nil
            && socket.map { passes($0) && fits(wireSize(of: scenario.trafficSize, on: $0), on: $0) } == true
            && socket.flatMap { streamReady[$0] }.map { $0 <= now } ?? true
        if couldWork && !works {
            if outageStart == nil { outageStart = now }
        } else {
            endOutage()
        }
    }

    private mutating func endOutage() {
        guard let start = outageStart else { return }
        outageStart = nil
        report.maxOutage = max(report.maxOutage, now - start)
        if now > start { report.outages.append(start..<now) }
    }

    /// Whether the tunnel could work through `path`'s uplink: UDP passes, or the agent may use
    /// the stream and it would open there.
    private func couldCarry(_ path: Path) -> Bool {
        guard !dropped.contains(path.interface), portals[path.interface] == nil else { return false }
        if filter(path.interface).passesUDP { return true }
        guard reconnector.config.stream != nil else { return false }
        if case .opens = streamOutcome(path.id.over(.stream)) { return true }
        return false
    }

    // MARK: The driver

    /// The time on the agent's clock: the world's, stepped back as the scenario says.
    package var coreNow: Instant { now + skew }

    package mutating func willHandle(_ event: AgentEvent) {
        report.inputs += 1
        if case .liftRefused = event { liftRefusalOnItsWay = false }
        if keepsTrace { report.trace.append((now, event)) }
        feeding = (event, reconnector.state, false, core.attempts, reconnector.tokensTaken)
    }

    /// After each event: the core's timers armed in the world's queue, the attempt counted, and
    /// the invariants checked.
    package mutating func handled(_ event: AgentEvent, effects: [Effect]) {
        let before = feeding.before
        // The core's timers, one route: what it keeps is what the world's queue wakes it for.
        let timers = core.timers
        for (kind, at) in timers.sorted(by: { ($0.value, $0.key.rawValue) < ($1.value, $1.key.rawValue) }) where armed[kind] != at {
            if at < now + skew { violation("timer \(kind) armed in the past") }
            armed[kind] = at
            // The core's deadline is on its own clock; the world's queue on the world's.
            queue.push(at - skew, .timer(kind, at: at))
        }
        for kind in armed.keys where timers[kind] == nil { armed[kind] = nil }
        let reported = feeding.reported
        let attempted = core.attempts > feeding.attempts
        if attempted {
            report.attempts += core.attempts - feeding.attempts
            // An attempt that took no token (a forced move, an operator's request, a socket bound
            // again) is outside the budget.
            let budgeted = reconnector.tokensTaken > feeding.tokens
            let power: PowerSource = acSinceLastAttempt || reconnector.power == .ac ? .ac : .battery
            attemptLog.append((now, power, budgeted))
            if budgeted { acSinceLastAttempt = false }
        }
        if !reconnector.isHandshaking { handshakeInFlight = nil }
        // What the core says the session is on is what the data plane has.
        if case .connected(let path) = reconnector.state, socket != path.id {
            violation("connected on \(path.name)/\(path.source) while the session's socket is "
                + "\(socket.map { "\($0)" } ?? "on no path"), on \(event.name)")
        }
        // The session's path is bound to an address the machine has: one that went unnoticed
        // would send probes and data from nowhere.
        if let path = reconnector.state.path, !kernel.model.usableAddresses(on: path.linkIndex).contains(path.source) {
            violation("the session is on \(path.interface)/\(path.source), an address the machine no longer has, on \(event.name)")
        }
        switch reconnector.state {
        case .paused, .disconnected:
            if attempted || effects.contains(where: { if case .probe = $0 { true } else { false } }) {
                violation("an attempt while \(reconnector.state.name), on \(event.name)")
            }
        default: break
        }
        // The lockdown is lifted only while a rule keeps the tunnel down on the very network it
        // trusts, and never anywhere else.
        if case .disconnected(_, let lifted) = reconnector.state, let lifted {
            if !lockdownLifted, !liftRefusalOnItsWay { violation("the core says the lockdown is lifted, the world's is whole") }
            if kernel.paths.first?.id != lifted { violation("the lockdown is lifted for a network the best path is not on") }
        } else if lockdownLifted {
            violation("the lockdown is lifted in \(reconnector.state.name), on \(event.name)")
        }
        if before.name != reconnector.state.name && !reported {
            violation("\(before.name) -> \(reconnector.state.name) on \(event.name) without a logged transition")
        }
        switch reconnector.state {
        case .offline, .sleeping, .failed, .paused:
            if !reconnector.timers.isEmpty {
                violation("timers armed while \(reconnector.state.name): \(reconnector.timers.keys.map(\.rawValue).sorted())")
            }
        default: break
        }
        if windowOpen != (reconnector.portalWindowUntil != nil), !core.isOpeningWindow {
            violation("the portal window is \(windowOpen ? "open" : "closed") but the machine thinks otherwise, on \(event.name)")
        }
        if windowOpen && reconnector.state.name != "portal" {
            violation("a portal window open in \(reconnector.state.name)")
        }
    }

    private mutating func serverHandshake(on path: Path) {
        handshakeGeneration += 1
        handshakeInFlight = path.id
        // The client pads its initiation to 392 bytes on the wire (docs/PROTOCOL.md).
        guard passes(path.id), !lost(path.id, up: true, size: 392) else { return }
        let at = arrival(path.id)
        let rtt = at - now
        if acceptsAuth {
            serverHasSession = true
            serverHeardAt = now
        }
        guard !lost(path.id, up: false, arriving: at) else { return }
        let reply: AgentEvent = acceptsAuth ? .handshakeCompleted(rtt: rtt, sizedProbes: scenario.serverEchoesSizes,
                                                                       carriesIPv6: scenario.tunnelCarriesIPv6, dns: serverDNS)
            : .handshakeRejected
        queue.push(at, .deliver(reply, generation: handshakeGeneration, via: path.id))
    }

    /// What the gateway gives at each handshake: `server-dns`, or nothing.
    private var serverDNS: Result<DNSSettings, DNSSettingsError> {
        guard let resolvers = scenario.serverDNS else { return .success(.none) }
        return Result { () throws(DNSSettingsError) in try DNSSettings(resolvers: resolvers, searchDomains: []) }
    }

    private mutating func requireKnown(_ path: Path, action: String) {
        if kernel.paths.isEmpty {
            violation("\(action) on \(path.interface) while offline")
        } else if !isCurrent(path.id) {
            violation("\(action) on \(path.name)/\(path.source), which is not a current path")
        }
    }

    private mutating func violation(_ message: String) {
        report.violations.append("\(now)s: \(message)")
    }

    // MARK: Checks

    /// No window of the timeline may hold more attempts than the token bucket allows.
    private mutating func checkBudget() {
        let log = attemptLog.filter(\.budgeted)
        for j in log.indices {
            var sawAC = false
            var i = j
            while i > 0 && j - i < 400 {
                i -= 1
                if log[i + 1].power == .ac || log[i].power == .ac { sawAC = true }
                let budget = reconnector.config.budget(on: sawAC ? .ac : .battery)
                let span = (log[j].at - log[i].at).nanoseconds
                let allowed = budget.burst + Int(span / budget.refill.nanoseconds)
                if j - i + 1 > allowed {
                    violation("\(j - i + 1) attempts between \(log[i].at)s and \(log[j].at)s exceed the budget of \(allowed)")
                    return
                }
            }
        }
    }

    /// How long the machine was connected through `interface`, from its transitions.
    private func timeConnected(on interface: String) -> Duration {
        var total = Duration.zero
        for (i, t) in report.transitions.enumerated() {
            guard case .connected(let path) = t.to, path.name == interface else { continue }
            let end = i + 1 < report.transitions.count ? report.transitions[i + 1].at : now
            total += end - t.at
        }
        return total
    }

    /// Whether a transition is what `state` or `state:reasonPrefix` names.
    private static func matches(_ t: Transition, _ pattern: String) -> Bool {
        let parts = pattern.split(separator: ":", maxSplits: 1)
        return t.to.name == parts[0] && (parts.count == 1 || t.reason.description.hasPrefix(parts[1]))
    }

    private mutating func checkExpectations() {
        let e = scenario.expect
        var failures: [String] = []
        func expect(_ ok: Bool, _ message: @autoclosure () -> String) { if !ok { failures.append(message()) } }
        if let state = e.state { expect(reconnector.state.name == state, "final state: expected \(state), got \(reconnector.state.name)") }
        if let path = e.path {
            let actual = reconnector.state.path?.name ?? "none"
            expect(actual == path, "final path: expected \(path), got \(actual)")
        }
        if let lifted = e.lockdownLifted {
            expect(lifted == lockdownLifted, "lockdown: expected it \(lifted ? "lifted" : "whole") at the end, it was \(lockdownLifted ? "lifted" : "whole")")
        }
        if let opened = e.machineOpened {
            if let actual = report.stopped?.opensMachine {
                expect(opened == actual, "the stop was to \(opened ? "open" : "keep") the lockdown; it \(actual ? "opened the machine" : "kept it")")
            } else {
                failures.append("the stop was to \(opened ? "open" : "keep") the lockdown; no stop was decided")
            }
        }
        switch (e.givesUp, report.gaveUp) {
        case (.never?, let gaveUp?): failures.append("the agent gave up at \(gaveUp.at)s: \(gaveUp.why)")
        case (.within?, nil): failures.append("the agent was to give up; it kept trying")
        case (.within(let from, let to)?, let gaveUp?):
            expect(gaveUp.at >= from && gaveUp.at <= to, "gave up at \(gaveUp.at)s, expected within \(from)s...\(to)s")
        case (.never?, nil), (nil, _): break
        }
        if let server = e.server {
            let actual = scenario.gateways[reconnector.server]
            expect(actual == server, "final server: expected \(server), got \(actual)")
        }
        if let address = e.serverAddress {
            expect(core.serverAddress == address, "final server address: expected \(address), got \(core.serverAddress)")
        }
        // Counts: what was counted, its bounds, and how many there were.
        let counts: [(String, Int?, Int?, Int)] = [
            ("attempts", e.minAttempts, e.maxAttempts, report.attempts),
            ("handshakes", e.minHandshakes, e.maxHandshakes, report.handshakes),
            ("connectivity checks", e.minChecks, e.maxChecks, report.checks),
            ("probes", e.minProbes, e.maxProbes, report.probes),
            ("resent handshakes", e.minResends, e.maxResends, report.resends),
            ("size probes", e.minSizeProbes, e.maxSizeProbes, report.sizeProbes),
            ("persistent keepalives", e.minKeepalives, e.maxKeepalives, report.keepalives),
            ("restores", e.minRestores, e.maxRestores, report.restores),
            ("exclusions granted", e.excluded, e.excluded, report.excluded),
            ("exclusions refused", e.exclusionsRefused, e.exclusionsRefused, report.exclusionsRefused),
            ("portal windows not needed", e.portalWindowsNotNeeded, e.portalWindowsNotNeeded, report.portalWindowsNotNeeded),
            ("portal windows failed", e.portalWindowsFailed, e.portalWindowsFailed, report.portalWindowsFailed),
            ("restarts in place", e.restartsInPlace, e.restartsInPlace, report.restartsInPlace),
            ("proxy addresses allowed", e.proxiesAllowed, e.proxiesAllowed, report.proxiesAllowed),
            ("proxy addresses refused", e.proxiesRefused, e.proxiesRefused, report.proxiesRefused),
            ("unusable server names", e.serverNamesUnusable, e.serverNamesUnusable, report.serverNamesUnusable),
            ("resolver decisions", e.resolverDecisions, e.resolverDecisions, report.resolvers.count),
            ("held fights", e.minHolds, e.maxHolds, report.holds),
        ]
        for (what, min, max, n) in counts {
            if let max { expect(n <= max, "\(what): expected at most \(max), got \(n)") }
            if let min { expect(n >= min, "\(what): expected at least \(min), got \(n)") }
        }
        for (at, use, inClear) in e.resolversAt {
            let decision = report.resolvers.last { $0.at <= at }?.decision
            let given = (decision?.use?.resolvers ?? [], decision?.inClear ?? [])
            expect(given.0 == use && given.1 == inClear,
                   "resolvers at \(at)s: expected \(use) (in clear \(inClear)), got \(given.0) (in clear \(given.1))")
        }
        if let max = e.maxOutage {
            expect(report.maxOutage <= max, "outage: expected at most \(max.short), got \(report.maxOutage.short)")
        }
        if let max = e.maxMissing {
            expect(report.maxMissing <= max, "missing: expected at most \(max.short), got \(report.maxMissing.short)")
        }
        var remaining = e.sequence[...]
        for t in report.transitions {
            guard let want = remaining.first else { break }
            if Self.matches(t, want) { remaining.removeFirst() }
        }
        if let missing = remaining.first {
            failures.append("sequence: never saw '\(missing)'; transitions were "
                + report.transitions.map { "\($0.to.name):\($0.reason)" }.joined(separator: ", "))
        }
        for never in e.never {
            if let t = report.transitions.first(where: { Self.matches($0, never) }) {
                failures.append("entered \(t.to.name) at \(t.at)s (\(t.reason)), which '\(never)' forbids")
            }
        }
        if let max = e.maxCPU {
            expect(report.cpuTime <= max, "replay CPU time: expected at most \(max.short), got \(report.cpuTime.short)")
        }
        for w in e.windows {
            let n = attemptLog.filter { $0.at >= w.from && $0.at <= w.to }.count
            if let max = w.maxAttempts { expect(n <= max, "attempts in \(w.from)s...\(w.to)s: expected at most \(max), got \(n)") }
            if let min = w.minAttempts { expect(n >= min, "attempts in \(w.from)s...\(w.to)s: expected at least \(min), got \(n)") }
            func count(_ times: [Instant]) -> Int { times.filter { $0 >= w.from && $0 <= w.to }.count }
            if let max = w.maxHandshakes {
                let n = count(handshakeTimes)
                expect(n <= max, "handshakes in \(w.from)s...\(w.to)s: expected at most \(max), got \(n)")
            }
            if let max = w.maxProbes {
                let n = count(probeTimes)
                expect(n <= max, "probes in \(w.from)s...\(w.to)s: expected at most \(max), got \(n)")
            }
            if let max = w.maxChecks {
                let n = count(checkTimes)
                expect(n <= max, "connectivity checks in \(w.from)s...\(w.to)s: expected at most \(max), got \(n)")
            }
            if let max = w.maxTransitions {
                let n = count(report.transitions.map(\.at))
                expect(n <= max, "transitions in \(w.from)s...\(w.to)s: expected at most \(max), got \(n)")
            }
        }
        if let mtu = e.tunnelMTU { expect(report.tunnelMTU == mtu, "tunnel MTU at the end: expected \(mtu), got \(report.tunnelMTU)") }
        if let max = e.maxLostFromServer {
            expect(report.lostFromServer <= max, "packets the server started that never arrived: expected at most \(max), got \(report.lostFromServer) of \(report.fromServer)")
        }
        if let min = e.minFromServer {
            let arrived = report.fromServer - report.lostFromServer
            expect(arrived >= min, "packets the server started that arrived: expected at least \(min), got \(arrived) of \(report.fromServer)")
        }
        for entry in e.timeOn {
            let spent = timeConnected(on: entry.path)
            if let min = entry.min { expect(spent >= min, "time connected on \(entry.path): expected at least \(min.short), got \(spent.short)") }
            if let max = entry.max { expect(spent <= max, "time connected on \(entry.path): expected at most \(max.short), got \(spent.short)") }
        }
        for (i, check) in e.stateAt.enumerated() {
            expect(stateAtResults[i] == check.state, "state at \(check.at)s: expected \(check.state), got \(stateAtResults[i])")
        }
        for (i, check) in e.pathAt.enumerated() {
            let actual = pathAtResults[i] ?? "none"
            expect(actual == check.path, "path at \(check.at)s: expected \(check.path), got \(actual)")
        }
        report.failures = failures
    }
}

/// Where the server last heard the agent from: the path, the agent's socket on it, and the NAT's
/// mapping of the link.
struct ClientEndpoint: Equatable {
    var path: Path.ID
    var socket: Int
    var mapping: Int
}

/// A min-heap of pending events, ordered by time and then by insertion.
struct EventQueue {
    enum What {
        case timeline(Int)
        /// A timer of the core's, armed for `at` on the agent's clock.
        case timer(TimerKind, at: Instant)
        case deliver(AgentEvent, generation: Int, via: Path.ID)
        /// A probe's echo (`size`: the tunnel packet a padded probe stood for, nil for a small
        /// one): the core knows which path its id went on.
        case echo(UInt64, rtt: Duration, size: Int?, via: Path.ID)
        /// What an effect produced after a while in the world (a connectivity check's result, a
        /// look-up's answer, a probe's), or a kernel notice of a network's facts, fed as it
        /// arrives. What the runner has at once is fed with the effects that asked (`perform`).
        case answer(AgentEvent)
        /// The application's next packet, of the stream's generation.
        case traffic(Int)
        /// The server's next packet, of its stream's generation.
        case serverTraffic(Int)
        /// A packet the server started arrives at that endpoint.
        case fromServer(ClientEndpoint)
        /// Time to look whether a persistent keepalive is due.
        case keepalive
        /// The agent's stream on the path, the connection `socket`, failed to open or broke.
        case streamBroke(Path.ID, socket: Int, why: String)
        /// Someone fighting the agent takes `Holding` away again.
        case retake(Holding)
        case checkpoint(Int)
        case stateCheck(Int)
        /// The agent restarts itself in place (`Effect.restart`).
        case restartAgent
    }
    struct Entry {
        var at: Instant
        var seq: Int
        var what: What
        func before(_ other: Entry) -> Bool { at != other.at ? at < other.at : seq < other.seq }
    }
    private var heap: [Entry] = []
    private var seq = 0

    mutating func push(_ at: Instant, _ what: What) {
        seq += 1
        heap.append(Entry(at: at, seq: seq, what: what))
        var i = heap.count - 1
        while i > 0 {
            let parent = (i - 1) / 2
            guard heap[i].before(heap[parent]) else { break }
            heap.swapAt(i, parent)
            i = parent
        }
    }

    mutating func pop() -> Entry? {
        guard !heap.isEmpty else { return nil }
        heap.swapAt(0, heap.count - 1)
        let top = heap.removeLast()
        var i = 0
        while true {
            let l = 2 * i + 1, r = l + 1
            var m = i
            if l < heap.count && heap[l].before(heap[m]) { m = l }
            if r < heap.count && heap[r].before(heap[m]) { m = r }
            guard m != i else { break }
            heap.swapAt(i, m)
            i = m
        }
        return top
    }
}

/// The world as the core's runner: what the daemon's sockets, firewall and checks would do with
/// each effect, with the checks every replay makes on each.
extension Replay: CoreRunning {
    /// What the world does with `effect`; what it answers at once (the lockdown's word, the
    /// device made, a socket refused, a fact read) is fed after the event's other effects, as
    /// the daemon feeds it. What takes time in the world comes through its queue.
    package mutating func perform(_ effect: Effect) -> [AgentEvent] {
        switch effect {
        case .bind(let path, _, _): return bind(path)
        case .handshake(let path, _): return handshake(on: path)
        case .resendHandshake(let path): resendHandshake(on: path)
        case .probe(let id, let path, nil): return probe(id, via: path)
        case .probe(let id, let path, let size?): return probe(id, via: path, size: size)
        case .setTunnelMTU(let mtu): setTunnelMTU(mtu)
        case .reportFailure: break
        case .transition(let transition): transitioned(transition)
        case .useServer(let index, let address): useServer(index, at: address)
        case .prepareHandover(let index, let address, let path): prepareHandover(to: index, at: address, on: path)
        case .lookUpServer(let index):
            // The resolver answers after a round trip; with no uplink, or asleep, it cannot.
            // A network that drops every datagram drops DNS too.
            let uplink = kernel.model.paths(to: names[index].first ?? sendingTo).first
            let answer = uplink.map { filter($0.interface) == .udp } ?? true || sleeping ? nil : names[index]
            queue.push(now + scenario.rtt, .answer(.serverLookedUp(server: index, addresses: answer)))
        case .lookUpProxy(let path):
            // The network's resolver answers after a round trip, as for the server's name.
            // A name the network does not know is answered so (none); nothing answers on a
            // network that drops every datagram, or while asleep.
            let answer = sleeping || filter(path.interface) == .udp ? nil : proxyNames[path.interface] ?? []
            queue.push(now + roundTrip(path.id), .answer(.proxyLookedUp(on: path, addresses: answer)))
        case .proxyAt(let addresses, let opening):
            guard let key = opening, let address = addresses[key] else {
                proxyAt = addresses  // a closing holds
                break
            }
            let refused = scenario.lockdownRefuses.contains(.proxy)
            if !refused { proxyAt = addresses }
            if refused { report.proxiesRefused += 1 } else { report.proxiesAllowed += 1 }
            return [.proxyAllowed(on: key, address: address, !refused)]
        case .allowServer(let index, let address, _):
            return [.serverAllowed(server: index, address: address, true)]
        case .useAddress(let address, _): useAddress(address)
        case .localNetworks, .guestNetworks: break
        case .completeHandover: completeHandover()
        case .cancelHandover: cancelHandover()
        case .disconnect: disconnect()
        case .attachTunnel:
            // The device is made once by each process of the agent; a second would be a second device.
            if deviceAttached { violation("a second tunnel device asked for") }
            deviceAttached = true
            report.tunnelsAttached += 1
            return [.tunnelAttached]
        case .resolvers(let decision): report.resolvers.append((now, decision))
        case .checkConnectivity(let path): checkConnectivity(via: path)
        case .openPortalWindow(let path, _, _):
            let refused = scenario.lockdownRefuses.contains(.portalWindow)
            if !refused { openPortalWindow(via: path) }
            return [.portalWindowOpened(!refused)]
        case .closePortalWindow: closePortalWindow()
        case .liftLockdown(let interface):
            guard !scenario.lockdownRefuses.contains(.lift) else {
                liftRefusalOnItsWay = true
                return [.liftRefused("Error: Could not process rule: Device or resource busy")]
            }
            liftLockdown(interface: interface)
        case .restoreLockdown: restoreLockdown()
        case .ready: break
        case .giveUp(let why): report.gaveUp = (now, why)
        case .stop(let opens): report.stopped = (now, opens)
        case .restart:
            // The agent starts again in place (it execs itself), on the configuration as it is now.
            report.restartsInPlace += 1
            queue.push(now, .restartAgent)
        case .findOut(let request): return findOut(request)
        case .followNotices(let wanted): notices = wanted
        case .reply(.excluded): report.excluded += 1
        case .reply(.exclusionOff), .reply(.exclusionFailed): report.exclusionsRefused += 1
        case .reply(.portalReachable): report.portalWindowsNotNeeded += 1
        case .reply(.portalWindowFailed): report.portalWindowsFailed += 1
        case .notice(.serverNameUnusable): report.serverNamesUnusable += 1
        case .notice(.flapping): report.flapNotices += 1
        case .notice(.takenAway), .notice(.stillFlapping), .notice(.stoppedFlapping): break
        case .onDemandDecided, .reply: break
        case .openExclusion:
            let refused = scenario.lockdownRefuses.contains(.exclusion)
            if !refused { report.exclusionsOpened += 1 }
            return [.exclusionOpened(!refused)]
        case .restore(let holding, _):
            report.restores += 1
            if missing[holding] == nil { violation("\(holding.rawValue) put back while it was whole") }
            putBack(holding)
            if let taker = takers[holding], now < taker.until { queue.push(now + .milliseconds(100), .retake(holding)) }
            return [.intact(holding)]
        case .upkeepHeld: report.holds += 1
        }
        return []
    }

    /// Someone takes `holding` away; the agent hears of it at once, as the kernel's notice or
    /// inotify tells the daemon.
    private mutating func take(_ holding: Holding, by: String?) {
        if missing[holding] == nil { missing[holding] = now }
        feed(.damaged(holding, Upkeep.Damage(what: "\(holding.rawValue) removed", by: by)))
    }

    private mutating func putBack(_ holding: Holding) {
        guard let since = missing.removeValue(forKey: holding) else { return }
        report.maxMissing = max(report.maxMissing, now - since)
    }

    /// What the network behind a link tells the agent's rules: its Wi-Fi network's name, its
    /// gateway's hardware address (every gateway has one; a scenario may name it), the search
    /// domains its DHCP server gave (written to resolv.conf by the best path's link), and a
    /// probe's answer after a round trip, if the network passes it and serves the URL.
    private mutating func findOut(_ request: FactRequest) -> [AgentEvent] {
        func name(_ index: Int32) -> String? { kernel.model.links[index]?.name }
        switch request {
        case .wifi(let index):
            return [.networkFact(.wifi(linkIndex: index, wifi(on: name(index))))]
        case .gateway(let address, let index, _):
            return [.networkFact(.gateway(linkIndex: index, address, mac: gatewayMAC(on: index)))]
        case .searchDomains:
            return [.networkFact(.searchDomains(searchDomains, beforeBoot: false))]
        case .probe(let probe, let path, let generation):
            requireKnown(path, action: "on-demand probe")
            let name = interface(of: path.id)
            let passes = name.map { reaches(path.id) && !dropped.contains($0) } ?? false
            let network = passes && !sleeping ? name.flatMap { networks[$0] } : nil
            var result = ProbeResult.unexpected
            if let network, network.probes.contains(probe.url) {
                // Over TLS the network's server shows its key, which the daemon reports as it is.
                if probe.pin == nil {
                    result = .expected(proof: nil)
                } else if let key = network.tlsKey, key == probe.pin {
                    // The server says where it saw the connection come from: the laptop's own
                    // address and port, or the relay's.
                    let local = SocketEndpoint(path.source, port: 40_000)
                    let seen = network.relaysProbes ? SocketEndpoint(.v4(0xcb00_7101), port: 61_000) : local
                    result = .expected(proof: KeyProof(pin: key, path: path.id, local: local, seen: seen))
                }
            }
            let at = passes ? now + roundTrip(path.id) : now + .seconds(5)
            queue.push(at, .answer(.networkFact(.probeAnswered(probe, generation: generation, result))))
            return []
        }
    }

    private func wifi(on name: String?) -> Fact<String> {
        name.flatMap { networks[$0]?.ssid }.map { .known($0) } ?? .absent
    }

    /// The gateway's hardware address as the neighbour table learns it: what the scenario
    /// names, nil for a gateway that never answers (`none`), else one of the link's own.
    private func gatewayMAC(on index: Int32) -> String? {
        let named = kernel.model.links[index].flatMap { networks[$0.name]?.gatewayMAC }
        if named == "" { return nil }
        return named ?? "02:00:00:00:00:" + String(String(0x100 | Int(index & 0xff), radix: 16).dropFirst())
    }

    /// resolv.conf's search list: what the best path's network gave.
    private var searchDomains: [String] {
        kernel.paths.first.flatMap { networks[$0.interface]?.domains } ?? []
    }

    /// The kernel's notices of a network's facts that a link's new description changed, for
    /// the ones the agent follows.
    private mutating func noticeFacts(on name: String, before: NetworkFacts?) {
        guard let index = kernel.model.link(named: name)?.index, let after = networks[name] else { return }
        if notices.wifi, after.ssid != before?.ssid {
            queue.push(now, .answer(.networkFact(.wifi(linkIndex: index, wifi(on: name)))))
        }
        if notices.gateway, after.gatewayMAC != before?.gatewayMAC,
           let gateway = kernel.paths.first(where: { $0.linkIndex == index })?.gateway {
            queue.push(now, .answer(.networkFact(.gateway(linkIndex: index, gateway, mac: gatewayMAC(on: index)))))
        }
        if notices.searchDomains, after.domains != before?.domains, kernel.paths.first?.linkIndex == index {
            queue.push(now, .answer(.networkFact(.searchDomains(searchDomains, beforeBoot: false))))
        }
    }

    private mutating func bind(_ path: Path) -> [AgentEvent] {
        requireKnown(path, action: "bind")
        let refused = openSocket(on: path.id)
        let bound = refused == nil
        if bound { socket = path.id }
        // The sockets of paths gone go, as the daemon's effects close them: the session's own
        // too when the bind failed, and it then sends on none.
        let current = kernel.paths.map(\.id)
        sockets = sockets.filter { current.contains($0.key.over(.udp)) || $0.key == path.id }
        streamReady = streamReady.filter { sockets[$0.key] != nil }
        if let held = socket, sockets[held] == nil { socket = nil }
        // The session moved: a keepalive tells the server at once.
        if bound { sendKeepalive(persistent: false) }
        return refused.map { [$0] } ?? []
    }

    /// The socket on `id`, made on first use (a new port); when the kernel refuses to bind it
    /// (`refuse-bind`), what the agent is told of it.
    private mutating func openSocket(on id: Path.ID) -> AgentEvent? {
        if id.transport == .stream {
            openStream(on: id)
            return nil
        }
        guard sockets[id] == nil else { return nil }
        if let name = interface(of: id), let refusal = bindRefusals[name] {
            var refuses = false
            if let times = refusal.times {
                refuses = true
                bindRefusals[name] = times > 1 ? (times - 1, nil) : nil
            } else if let until = refusal.until, now < until {
                refuses = true
            } else {
                bindRefusals[name] = nil
            }
            if refuses { return .bindFailed(id, why: "\(id.source) is not an address of this host (any more)") }
        }
        socketsMade += 1
        sockets[id] = socketsMade
        return nil
    }

    private mutating func handshake(on path: Path) -> [AgentEvent] {
        requireKnown(path, action: "handshake")
        if let refused = openSocket(on: path.id) { return [refused] }
        if let inFlight = handshakeInFlight, inFlight == path.id {
            violation("a second handshake on \(path.interface) while one is in flight")
        }
        report.handshakes += 1
        handshakeTimes.append(now)
        // Keys that the server answered within their lifetime still work: a handshake then only
        // costs an outage and a token (an operator's request aside).
        if feeding.event != .request(.reconnect), let heard = lastHeard, now - heard < scenario.config.sessionLifetime {
            violation("a handshake on \(path.interface) (in \(feeding.before.name), on \(feeding.event.name)) while the session lives "
                + "(the server answered \((now - heard).short) ago)")
        }
        serverHandshake(on: path)
        return []
    }

    private mutating func resendHandshake(on path: Path) {
        requireKnown(path, action: "resent handshake")
        if handshakeInFlight != path.id { violation("a handshake resent on \(path.interface), where none is in flight") }
        report.resends += 1
        // The fresh initiation replaces the first in the client: only its answer counts.
        serverHandshake(on: path)
    }

    private mutating func probe(_ id: UInt64, via path: Path) -> [AgentEvent] {
        requireKnown(path, action: "probe")
        if let refused = openSocket(on: path.id) { return [refused] }
        report.probes += 1
        probeTimes.append(now)
        answer(from: path.id, .probeEcho(id: id, rtt: .zero, size: nil))
        return []
    }

    /// A padded probe is as big on the wire as a tunnel packet of `size`; a server that echoes
    /// sizes answers as big, an older one drops it (it reads the padding as malformed).
    private mutating func probe(_ id: UInt64, via path: Path, size: Int) -> [AgentEvent] {
        requireKnown(path, action: "size probe")
        if let refused = openSocket(on: path.id) { return [refused] }
        report.sizeProbes += 1
        if size < scenario.mtuFloor || size > scenario.config.maxMTU {
            violation("a size probe of \(size) bytes, outside \(scenario.mtuFloor)...\(scenario.config.maxMTU)")
        }
        guard scenario.serverEchoesSizes else { return [] }
        let wire = size + Self.overhead(path.id)
        answer(from: path.id, .probeEcho(id: id, rtt: .zero, size: size), size: wire, downSize: wire)
        return []
    }

    private mutating func setTunnelMTU(_ mtu: Int) {
        if mtu < scenario.mtuFloor || mtu > scenario.config.maxMTU {
            violation("tunnel MTU set to \(mtu), outside \(scenario.mtuFloor)...\(scenario.config.maxMTU)")
        }
        if mtu == tunnelMTU { violation("tunnel MTU set to \(mtu), which it already is") }
        tunnelMTU = mtu
    }

    private mutating func useServer(_ index: Int, at address: IPAddress?) {
        if index == target { violation("useServer(\(scenario.gateways[index])), the gateway in use") }
        target = index
        forgetSession()
        if let address { _ = kernel.retarget(to: address) }
    }

    /// The session sends to `address` from now on: a handshake in flight went to the old one
    /// (its answer never comes).
    private mutating func useAddress(_ address: IPAddress) {
        if address == sendingTo { violation("told to use \(address), the address in use") }
        _ = kernel.retarget(to: address)
        handshakeInFlight = nil
        handshakeGeneration += 1
    }

    /// The agent holds no session any more: none prepared, none in use, no handshake awaited.
    private mutating func forgetSession() {
        standby = nil
        clientHasSession = false
        clientKeys += 1
        lastHeard = nil
        hints.reset()
        handshakeInFlight = nil
        handshakeGeneration += 1
    }

    private mutating func prepareHandover(to index: Int, at address: IPAddress?, on path: Path) {
        requireKnown(path, action: "handover")
        if index == target { violation("a handover to \(scenario.gateways[index]), the gateway in use") }
        // The session's stream reaches only the gateway it was opened to: the daemon would send
        // the next gateway's handshake to the one in use.
        if path.transport == .stream { violation("a handover prepared over the stream, which reaches only \(scenario.gateways[target])") }
        standby = index
        standbyAddress = address
        report.handshakes += 1
        handshakeTimes.append(now)
        guard passes(path.id, gateway: index), !lost(path.id, up: true, size: 392) else { return }
        let at = arrival(path.id)
        guard acceptsAuth else {
            queue.push(at, .deliver(.handoverRejected, generation: 0, via: path.id))
            return
        }
        gateways[index].hasSession = true
        serverHeard(from: path.id, gateway: index)
        if !lost(path.id, up: false, arriving: at) {
            queue.push(at, .deliver(.handoverReady(rtt: at - now, sizedProbes: scenario.serverEchoesSizes, carriesIPv6: scenario.tunnelCarriesIPv6,
                                                   dns: serverDNS), generation: 0, via: path.id))
        }
    }

    private mutating func completeHandover() {
        guard let next = standby else { return violation("a handover completed without one prepared") }
        // The agent tells the old gateway goodbye: it forgets the session.
        gateways[target].hasSession = false
        target = next
        standby = nil
        if let address = standbyAddress { _ = kernel.retarget(to: address) }
        standbyAddress = nil
        clientHasSession = true
        clientKeys += 1
        lastHeard = now
        hints.reset()
    }

    private mutating func cancelHandover() {
        if let standby { gateways[standby].hasSession = false }
        standby = nil
    }

    private mutating func disconnect() {
        // The goodbye reaches the server when the session's path passes it; otherwise the
        // server's copy only expires.
        if let socket, passes(socket) { serverHasSession = false }
        if let standby { gateways[standby].hasSession = false }
        forgetSession()
    }

    /// The check's plain HTTP request: a portal redirects it to its login page, a network that
    /// reaches the internet gives the expected answer after a round trip, and a link that drops
    /// everything (or is gone) gives nothing until the check's own timeout.
    private mutating func checkConnectivity(via path: Path) {
        requireKnown(path, action: "connectivity check")
        report.checks += 1
        checkTimes.append(now)
        let name = interface(of: path.id)
        let result: Connectivity
        let at: Instant
        if let name, let url = portals[name], reaches(path.id), !sleeping {
            (result, at) = (.portal(url: url), now + roundTrip(path.id))
        } else if let name, reaches(path.id), !dropped.contains(name), filter(name).passesCheck, !sleeping {
            (result, at) = (.online, now + roundTrip(path.id))
        } else {
            (result, at) = (.unknown("no answer in 5s"), now + .seconds(5))
        }
        queue.push(at, .answer(.connectivity(result, on: path.id)))
    }

    private mutating func openPortalWindow(via path: Path) {
        requireKnown(path, action: "portal window")
        if windowOpen { violation("a portal window opened while one is open") }
        windowOpen = true
    }

    private mutating func closePortalWindow() {
        if !windowOpen { violation("a portal window closed while none is open") }
        windowOpen = false
    }

    private mutating func liftLockdown(interface: String) {
        if kernel.model.link(named: interface) == nil { violation("the lockdown lifted for \(interface), which does not exist") }
        if lockdownLifted { violation("the lockdown lifted twice") }
        lockdownLifted = true
    }

    private mutating func restoreLockdown() {
        if !lockdownLifted { violation("the lockdown restored while whole") }
        lockdownLifted = false
    }

    private mutating func transitioned(_ transition: Transition) {
        feeding.reported = true
        if transition.from != feeding.before && report.transitions.last?.to != transition.from {
            violation("transition from \(transition.from.name) but the machine was \(feeding.before.name)")
        }
        report.transitions.append(transition)
        onTransition(transition)
    }
}
