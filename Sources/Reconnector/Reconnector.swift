public import Topology
public import Basics

/// The pure decision core: facts and the time go in, commands come out.
///
/// It owns no clock, socket or timer. `AgentCore` tells it what happened (`Input`) with the
/// current time, and its runner carries out the returned effects in order (the runner contract's
/// `Effect`, one vocabulary from the machine to the runner); a replay does the same on a virtual
/// clock, so a recorded day of roaming replays in milliseconds.
public struct Reconnector: Sendable {
    public internal(set) var state: State = .offline
    public internal(set) var config: Config
    public internal(set) var power: PowerSource
    /// Latest ranked usable paths to the server.
    public internal(set) var paths: [Path] = []
    /// Reconnect attempts made since the session last worked.
    public internal(set) var attempt = 0
    /// Reconnect tokens left now.
    public var tokens: Int { budget.tokens }
    /// Reconnect tokens taken since this state machine was made (a refill takes none back).
    public var tokensTaken: Int { budget.taken }
    /// The reconnect budget and the backoff after failed attempts.
    var budget: ReconnectBudget
    /// The servers, by name, in the order they are tried: the first that is not held down.
    public let servers: [String]
    /// The server the session is with, or heading for (an index into `servers`).
    public internal(set) var server = 0
    /// The server a session is being prepared with while the current one carries the traffic.
    public internal(set) var handover: Int? {
        get { state.handover }
        set {
            switch state {
            case .connected(let path, let candidate, _):
                state = .connected(path, candidate: candidate, handover: newValue)
            case .probing(let path, let sent, let rescue, let byLiveness, _):
                state = .probing(path, sent: sent, rescue: rescue, byLiveness: byLiveness, handover: newValue)
            case .switching(let from, let to, let sent, _):
                state = .switching(from: from, to: to, sent: sent, handover: newValue)
            default: break
            }
        }
    }
    /// Servers avoided until the instant: they went silent on every path (with repeat count).
    var heldServers = HoldDowns<Int>()
    /// Servers that announced they are being taken down, until when: tried last, and never
    /// the target of a handover.
    var drained: [Int: Instant] = [:]
    /// How long a server that announced it is being taken down comes last for new sessions.
    public static let drainHoldDown: Duration = .seconds(300)

    /// Where the driver's UDP socket is bound, if it has one.
    var socket: Path.ID?
    /// The driver could not bind `socket` (`Input.bindFailed`): the session is on no path the
    /// core knows until a bind works, so nothing it hears proves the path.
    var unbound = false
    /// Binds refused in a row on `path` in the attempt under way, and whether that attempt was
    /// a handshake (the retry proves the path the same way).
    var refusals: (path: Path, count: Int, handshake: Bool)?
    /// Binds refused in a row that are tried again (after `bindRetryAfter`, doubled each time)
    /// before the path counts as a failed attempt. A refused bind sent nothing: it costs no
    /// token, as a handshake's resend costs none, and this bound keeps it from costing more.
    public static let bindRetries = 3
    public static let bindRetryAfter: Duration = .milliseconds(250)
    /// When the current session's keys were made and when the server was last heard.
    var session: (established: Instant, lastHeard: Instant)?
    /// Paths that failed their probes, avoided until the instant, with repeat count.
    var dead = HoldDowns<Path.ID>()
    /// Recent losses per interface name, for flap damping.
    var flaps = FlapRecord()
    var deadlines = TimerTable()
    var enteredAt: Instant
    var coalesced = 0
    /// The session path's round-trip time (RFC 6298) and its lowest.
    var rtt = RTTEstimator()
    /// Probes sent on the session's path and answers that came back, halved as they grow: the
    /// path's recent loss, which decides how many probes in a row it may miss before it is dead.
    var probeRecord: (sent: Int, answered: Int) = (0, 0)
    /// Initiations sent again within an attempt since start.
    public internal(set) var resentHandshakes = 0
    /// Since when the session has worked without an attempt failing (probing that ends in an
    /// answer does not interrupt it); `stableAfter` of it resets the backoff.
    var workingSince: Instant?
    /// Probes that proved the path while the application heard nothing back, since it last did:
    /// each doubles the liveness wait, so a one-way flow does not probe without end.
    var quietProofs = 0
    var rng: SeededRandom
    var stateBeforeSleep: State = .offline
    /// The machine is asleep (between a sleep and its wake), whatever the state: the operator's
    /// `agent up` while it sleeps waits for the wake instead of starting an attempt no network
    /// can answer.
    public internal(set) var asleep = false
    var trigger = ""
    /// The latest instant an input came with: a clock seen going back is stepped, not trusted.
    var lastNow: Instant?
    /// A "session unknown" hint waits for its check: the next authenticated answer disproves
    /// it, the probe timer's expiry confirms it.
    var checkingHint = false
    /// Hints after one that proved false are ignored until then: a forger gets one probe a
    /// second out of the agent, however fast it sends.
    var hintsIgnoredUntil: Instant?
    /// Hints that an authenticated answer proved false since start (forged, or overtaken).
    public internal(set) var disprovedHints = 0
    /// How long hints are ignored after one proved false.
    public static let hintHoldDown: Duration = .seconds(1)
    /// The path a connectivity check is out on: one at a time. Not the state's: the answer
    /// comes back whatever state the machine moved to meanwhile, and no other check goes out
    /// before it does.
    var checking: Path.ID?
    /// Connectivity checks asked for since start.
    public internal(set) var connectivityChecks = 0
    /// Until when the portal window is open, while it is.
    public var portalWindowUntil: Instant? { portalWindow?.until }
    /// What the on-demand rules last decided, for the network of the path it names.
    public internal(set) var onDemand: OnDemandVerdict?
    /// The rules wait for facts about the network of path `path` (the rule, and what it waits
    /// for): the session does not move there before they know whether it is trusted. The rules'
    /// wait, not the state's: a session that works meanwhile keeps working, in whatever state.
    var rulesWait: (rule: String, wanted: [String], path: Path.ID)?
    /// The tunnel device's MTU as the core last set it (the configured one until a path is
    /// found smaller).
    public internal(set) var tunnelMTU: Int
    /// The server echoes padded probes at their size (it said so in its handshake response).
    var sizedProbes = false
    /// The smallest tunnel MTU the path MTU search considers (`Config.mtuFloor`), by whether the
    /// tunnel carries IPv6, as the last handshake said.
    public internal(set) var floorMTU: Int
    /// The path MTU search on the session's path: when its round began, and when to look for a
    /// bigger MTU once it is over.
    var mtu: (path: Path.ID, search: PathMTUSearch, roundStart: Instant?, raiseAt: Instant?)?
    /// Paths found too small for the tunnel: their re-check is a probe of the smallest tunnel
    /// packet, not a small probe that would prove nothing.
    var tooSmall: Set<Path.ID> = []
    /// When the MTU in use was last looked at after a silence (see `mtuVerifyEvery`).
    var mtuVerifiedAt: Instant?
    /// The least time between two looks at the MTU in use that silences bring.
    public static let mtuVerifyEvery: Duration = .seconds(30)
    /// Path MTU probes sent since start.
    public internal(set) var sizeProbes = 0
    /// What is known of UDP on each network (see `TransportBook`), kept across restarts.
    public internal(set) var transports = TransportBook()
    /// The UDP path whose attempt went unanswered for the race delay, in the attempt under way:
    /// the stream's answer then marks its network as blocking UDP. The attempt's, not a state's:
    /// it goes through connecting, probing and backing off, and a late answer in any of them counts.
    var raced: Path.ID?
    /// The stream path that answered since it was last opened: its failure is a break (a reset
    /// mid-session, which a new stream mends), not a failure to open one.
    var streamProven: Path.ID?
    /// The UDP re-test while the session is on the stream: the uplink's UDP path, when the next
    /// re-test is due, and how many went unanswered on it.
    var retest: (udp: Path.ID, due: Instant, failed: Int)?
    /// The networks a stream can open on, when that depends on the network (the HTTP proxy is
    /// named by host, and only some networks' look-ups gave its address): nil, every network.
    /// A stream elsewhere counts as failed lately (`isDead`), so no attempt goes there.
    public internal(set) var streamNetworks: Set<NetworkKey>?
    /// The servers whose names gave no address the session may use yet: turned to only when no
    /// other is left, for the session would handshake at no address of theirs.
    public internal(set) var addressless: Set<Int> = []
    /// The probes out, by id, and the path each went on (see `echo(of:rtt:size:)`).
    var probes = ProbesInFlight()
    /// A path MTU search is under way on the session's path.
    public var isSearchingPathMTU: Bool { mtu.map { !$0.search.isDone } ?? false }

    /// `servers` names the servers in the order they are tried (one, unnamed, by default).
    public init(config: Config = Config(), power: PowerSource = .ac, seed: UInt64 = 0, now: Instant = .zero,
                servers: [String] = ["server"]) {
        self.servers = servers.isEmpty ? ["server"] : servers
        self.config = config
        self.power = power
        self.rng = SeededRandom(seed: seed)
        self.budget = ReconnectBudget(burst: config.budget(on: power).burst, now: now)
        self.enteredAt = now
        self.tunnelMTU = config.maxMTU
        self.floorMTU = config.mtuFloor(ipv6: true)
    }

    /// Starts where a previous process of the agent left off (`memory`, kept in its runtime
    /// directory): the budget it spent, the backoff it drew and its verdicts on dead paths, so
    /// that restarting the agent (a service manager's restart loop) buys no extra attempts.
    /// A memory from another clock (a reboot) is ignored.
    public init(config: Config = Config(), power: PowerSource = .ac, seed: UInt64 = 0, now: Instant, memory: Memory,
                servers: [String] = ["server"]) {
        self.init(config: config, power: power, seed: seed, now: now, servers: servers)
        // What networks block is not about the clock: it holds after a reboot too.
        transports = memory.transports
        guard memory.refilledAt <= now else { return }
        budget.restore(memory, inForce, now)
        // Verdicts whose hold-down ran out are kept with their strikes: such a path is re-checked
        // by a probe before it is trusted, and fails into a doubled hold-down if still dead.
        dead = HoldDowns(memory.dead.mapValues { .init(until: $0.until, strikes: $0.strikes) })
    }

    /// What a restart of the agent must not forget.
    public var memory: Memory {
        var retry: Instant?
        if case .backingOff = state { retry = deadlines[.retry] }
        return Memory(tokens: budget.tokens, refilledAt: budget.refilledAt, failures: budget.failures,
                      notBefore: retry ?? budget.notBefore,
                      dead: dead.entries.mapValues { Memory.Verdict(until: $0.until, strikes: $0.strikes) },
                      transports: transports)
    }

    /// Which transport carries the session, and what each known network blocks.
    public var transportStatus: TransportStatus {
        TransportStatus(transport: state.path?.transport, interface: state.path?.interface,
                        networks: transports.networks.sorted { $0.key < $1.key }.map { .init(key: $0.key, udp: $0.value) })
    }

    /// The smoothed round-trip time to the server, from probe echoes and handshakes.
    public var roundTripTime: Duration? { rtt.smoothed }

    /// The earliest armed timer, so a driver or a replay knows when to wake next.
    public var nextDeadline: Instant? { deadlines.earliest }

    /// Armed timers and their deadlines.
    public var timers: [TimerKind: Instant] {
        Dictionary(uniqueKeysWithValues: TimerKind.allCases.compactMap { k in deadlines[k].map { (k, $0) } })
    }

    /// True while a handshake is in flight.
    public var isHandshaking: Bool { if case .connecting = state { true } else { false } }

    /// New tunables from a reload: they apply from the next decision on (a wait already armed
    /// runs out as it was drawn).
    public mutating func reconfigure(_ config: Config) {
        self.config = config
    }

    /// What the echo of probe `id` tells, to be fed as the input it returns: nil when it proves
    /// nothing, for a probe no longer out (stale, from before the server moved, or made up) or a
    /// size probe echoed short (`size`: how big the echo was; nil for a small one).
    public mutating func echo(of id: UInt64, rtt: Duration, size: Int?) -> Input? {
        guard let probe = probes.answered(id) else { return nil }
        guard let wanted = probe.size else { return .probeReply(on: probe.path, rtt: rtt) }
        // A size probe's echo counts only if it is as big as the probe: a server that echoed it
        // short proved nothing.
        guard let size, size >= wanted else { return nil }
        return .sizeProbeReply(on: probe.path, size: wanted, rtt: rtt)
    }

    /// The session's packets go to another address of its server: an echo from the old one
    /// proves nothing about the new one.
    public mutating func forgetProbes() {
        probes.removeAll()
    }

    /// Feeds one fact in; returns what to do, in order. The effects that turn to a server
    /// (`useServer`, `prepareHandover`) name it by its place in the list, with no address: where
    /// it is reached now is for `AgentCore` to say, which keeps the servers' addresses.
    public mutating func handle(_ input: Input, now: Instant) -> [Effect] {
        var out: [Effect] = []
        trigger = input.name
        if let last = lastNow, now < last { clockStepped(by: now - last, &out) }
        lastNow = now
        switch input {
        case .paths(let new): pathsChanged(new, now, &out)
        case .sleep: sleep(now, &out)
        case .wake(let slept): wake(after: slept, now, &out)
        case .probeReply(let id, let rtt): probeReply(on: id, rtt: rtt, now, &out)
        case .sizeProbeReply(let id, let size, let rtt): sizeProbeReply(on: id, size: size, rtt: rtt, now, &out)
        case .handshakeSucceeded(let rtt, let sized, let ipv6):
            sizedProbes = sized
            floorMTU = config.mtuFloor(ipv6: ipv6)
            handshakeSucceeded(rtt: rtt, now, &out)
        case .handshakeFailed(let failure): handshakeFailed(failure, now, &out)
        case .dataSent: dataSent(now, &out)
        case .dataReceived: dataReceived(now, &out)
        case .timerFired(let kind): timerFired(kind, now, &out)
        case .powerChanged(let source): powerChanged(source, now, &out)
        case .reconnectRequested: reconnectRequested(now, &out)
        case .serverMoved: serverMoved(now, &out)
        case .serverDraining: serverDraining(now, &out)
        case .handoverReady(let rtt, let sized, let ipv6):
            floorMTU = config.mtuFloor(ipv6: ipv6)
            handoverReady(rtt: rtt, sizedProbes: sized, now, &out)
        case .handoverRejected: handoverFailed(now, &out)
        case .pause: pause(now, &out)
        case .resume: resume(now, &out)
        case .connectivity(let result, let id): connectivity(result, on: id, now, &out)
        case .openPortalWindow: openPortalWindow(now, &out)
        case .closePortalWindow: closePortalWindow(now, &out)
        case .portalWindowRefused: portalWindowRefused(now, &out)
        case .onDemand(let decision): onDemand(decision, now, &out)
        case .streamFailed(let id, let why): streamFailed(on: id, why: why, now, &out)
        case .bindFailed(let id, let why): bindFailed(on: id, why: why, now, &out)
        case .streamNetworks(let networks): streamNetworksChanged(networks, now, &out)
        case .serversWithoutAddress(let servers):
            addressless = servers
            coalesced += 1  // nothing changes now: the next choice of a server reads it
        case .tunnelMTUFailed(let actual):
            tunnelMTU = actual
            coalesced += 1  // no state changes: the next search's result is compared with the device as it is
        case .liftRefused(let why):
            // The rule's word on the tunnel stands; the machine stays closed, and says so.
            guard case .disconnected(let rule, _?, _) = state else { coalesced += 1; break }
            enter(.disconnected(rule: rule, lifted: nil), .liftRefused(why), now, &out)
        }
        return out
    }

    /// Moves within the state the machine is in, without a transition (a path seen anew, one
    /// more probe): what the state carries stays.
    mutating func stay(_ same: State) {
        state = same.carrying(from: state, because: nil)
    }

    /// The better path the debounce timer waits for, while connected.
    var candidate: Path.ID? {
        get { if case .connected(_, let candidate, _) = state { candidate } else { nil } }
        set {
            guard case .connected(let path, let candidate, let handover) = state, candidate != newValue else { return }
            state = .connected(path, candidate: newValue, handover: handover)
        }
    }

    /// Resends of the handshake in flight so far, while connecting.
    var resends: Int {
        get { if case .connecting(_, let resends) = state { resends } else { 0 } }
        set { if case .connecting(let path, _) = state { state = .connecting(path, resends: newValue) } }
    }

    /// Another path probed while the session's path is suspect, while probing.
    var rescue: Rescue? {
        get { if case .probing(_, _, let rescue, _, _) = state { rescue } else { nil } }
        set {
            guard case .probing(let path, let sent, let rescue, let byLiveness, let handover) = state, rescue != newValue
            else { return }
            state = .probing(path, sent: sent, rescue: newValue, byLiveness: byLiveness, handover: handover)
        }
    }

    /// The current probing began because data went unanswered.
    var suspectedByLiveness: Bool {
        if case .probing(_, _, _, let byLiveness, _) = state { byLiveness } else { false }
    }

    /// Rechecks since the portal was found, while behind it: each waits twice as long as the one
    /// before.
    var rechecks: Int {
        get { if case .portal(_, _, let rechecks, _) = state { rechecks } else { 0 } }
        set {
            guard case .portal(let path, let url, _, let window) = state else { return }
            state = .portal(path, url: url, rechecks: newValue, window: window)
        }
    }

    /// The portal window, while one is open behind the portal.
    var portalWindow: PortalWindow? {
        get { if case .portal(_, _, _, let window) = state { window } else { nil } }
        set {
            guard case .portal(let path, let url, let rechecks, _) = state else { return }
            state = .portal(path, url: url, rechecks: rechecks, window: newValue)
        }
    }

    /// Held in `disconnected` only while the rules look at a new network.
    var heldForRules: Bool {
        if case .disconnected(_, _, let forRules) = state { forRules } else { false }
    }

    /// The driver's clock went back (CLOCK_BOOTTIME never does, but a clock that can must not
    /// freeze the budget or stretch every hold-down by the step): everything remembered moves
    /// with it, and armed timers keep the waits they had.
    mutating func clockStepped(by step: Duration, _ out: inout [Effect]) {
        budget.shift(by: step)
        enteredAt = enteredAt + step
        if let known = session { session = (known.established + step, known.lastHeard + step) }
        dead.shift(by: step)
        heldServers.shift(by: step)
        drained = drained.mapValues { $0 + step }
        flaps.shift(by: step)
        rtt.shift(by: step)
        workingSince = workingSince.map { $0 + step }
        mtuVerifiedAt = mtuVerifiedAt.map { $0 + step }
        if var next = retest {
            next.due = next.due + step
            retest = next
        }
        if var search = mtu {
            search.roundStart = search.roundStart.map { $0 + step }
            search.raiseAt = search.raiseAt.map { $0 + step }
            mtu = search
        }
        for kind in TimerKind.allCases {
            if let due = deadlines[kind] { arm(kind, at: due + step) }
        }
    }

    mutating func enter(_ next: State, _ reason: Reason, _ now: Instant, _ out: inout [Effect]) {
        let new = next.carrying(from: state, because: reason)
        switch new {
        case .connected:
            attempt = 0
            refusals = nil
            if workingSince == nil { workingSince = now }
            // Working this long, with probes that ended in answers along the way (a lossy path
            // is probed often), the earlier failures are history.
            if let since = workingSince, now - since >= config.stableAfter { budget.forgetFailures() }
        case .probing, .switching: break
        default: workingSince = nil
        }
        for kind in TimerKind.allCases where deadlines[kind] != nil && !Self.allows(new, kind) {
            cancel(kind)
        }
        if !Self.allows(new, .handover) { dropHandover(&out) }
        if portalWindowUntil != nil, !Self.allows(new, .portalWindow) {
            // Leaving the portal (it opened, the network changed, a suspend): the lockdown is whole.
            out.append(.closePortalWindow)
        }
        switch new {
        case .offline, .sleeping, .failed, .paused, .disconnected: checkingHint = false  // what follows starts afresh
        default: break
        }
        let transition = Transition(at: now, from: state, to: new, trigger: trigger, reason: reason,
                                    attempt: attempt, nextRetry: deadlines[.retry] ?? deadlines[.rebind], coalesced: coalesced,
                                    server: servers.count > 1 ? servers[server] : nil)
        state = new
        enteredAt = now
        coalesced = 0
        out.append(.transition(transition))
        if case .connected(let path, _, _) = new {
            connectedOn(path, now, &out)
            continuePathMTU(on: path, now, &out)
        }
    }

    /// Which timers may stay armed in a state; entering a state cancels the rest, so
    /// offline, sleeping and failed never keep a timer.
    static func allows(_ state: State, _ kind: TimerKind) -> Bool {
        switch (state, kind) {
        case (.connecting, .handshake), (.connecting, .resend), (.connected, .liveness), (.connected, .debounce),
             (.probing, .probe), (.switching, .probe), (.backingOff, .retry), (.backingOff, .rebind),
             (.connected, .handover), (.probing, .handover), (.switching, .handover),
             (.portal, .recheck), (.portal, .portalWindow), (.connected, .pathMTU),
             (.connecting, .race), (.probing, .race), (.connected, .udpRetest): true
        default: false
        }
    }

    /// Timers are state (`timers`), read by whoever runs the machine: nothing goes out for them.
    mutating func arm(_ kind: TimerKind, at due: Instant) {
        deadlines[kind] = due
    }

    mutating func cancel(_ kind: TimerKind) {
        deadlines[kind] = nil
    }
}

/// One optional deadline per timer kind, without hashing on the hot path.
struct TimerTable: Sendable {
    private var slots = [Instant?](repeating: nil, count: TimerKind.allCases.count)

    subscript(kind: TimerKind) -> Instant? {
        get { slots[kind.slot] }
        set { slots[kind.slot] = newValue }
    }

    var earliest: Instant? { slots.lazy.compactMap { $0 }.min() }
}

extension TimerKind {
    fileprivate var slot: Int {
        switch self {
        case .debounce: 0
        case .handshake: 1
        case .probe: 2
        case .liveness: 3
        case .retry: 4
        case .handover: 5
        case .recheck: 6
        case .portalWindow: 7
        case .resend: 8
        case .pathMTU: 9
        case .startup: 10
        case .lookUp: 11
        case .onDemand: 12
        case .upkeep: 13
        case .race: 14
        case .udpRetest: 15
        case .flapSummary: 16
        case .rebind: 17
        case .watchdog: 18
        case .extendStart: 19
        case .metrics: 20
        }
    }
}
