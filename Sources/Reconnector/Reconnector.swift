public import Topology
public import Basics

/// The pure decision core: facts and the time go in, commands come out.
///
/// It owns no clock, socket or timer. `AgentCore` tells it what happened (`Input`) with the
/// current time, and its runner carries out the returned effects in order (the runner contract's
/// `Effect`, one vocabulary from the machine to the runner); a replay does the same on a virtual
/// clock, so a recorded day of roaming replays in milliseconds.
public struct Reconnector: Sendable {
    public private(set) var state: State = .offline
    public private(set) var config: Config
    public private(set) var power: PowerSource
    /// Latest ranked usable paths to the server.
    public private(set) var paths: [Path] = []
    /// Reconnect attempts made since the session last worked.
    public private(set) var attempt = 0
    /// Reconnect tokens left now.
    public var tokens: Int { budget.tokens }
    /// Reconnect tokens taken since this state machine was made (a refill takes none back).
    public var tokensTaken: Int { budget.taken }
    /// The reconnect budget and the backoff after failed attempts.
    private var budget: ReconnectBudget
    /// The servers, by name, in the order they are tried: the first that is not held down.
    public let servers: [String]
    /// The server the session is with, or heading for (an index into `servers`).
    public private(set) var server = 0
    /// The server a session is being prepared with while the current one carries the traffic.
    public private(set) var handover: Int?
    /// Servers avoided until the instant: they went silent on every path (with repeat count).
    private var heldServers = HoldDowns<Int>()
    /// Servers that announced they are being taken down, until when: tried last, and never
    /// the target of a handover.
    private var drained: [Int: Instant] = [:]
    /// How long a server that announced it is being taken down comes last for new sessions.
    public static let drainHoldDown: Duration = .seconds(300)

    /// Where the driver's UDP socket is bound, if it has one.
    private var socket: Path.ID?
    /// The driver could not bind `socket` (`Input.bindFailed`): the session is on no path the
    /// core knows until a bind works, so nothing it hears proves the path.
    private var unbound = false
    /// Binds refused in a row on `path` in the attempt under way, and whether that attempt was
    /// a handshake (the retry proves the path the same way).
    private var refusals: (path: Path, count: Int, handshake: Bool)?
    /// Binds refused in a row that are tried again (after `bindRetryAfter`, doubled each time)
    /// before the path counts as a failed attempt. A refused bind sent nothing: it costs no
    /// token, as a handshake's resend costs none, and this bound keeps it from costing more.
    public static let bindRetries = 3
    public static let bindRetryAfter: Duration = .milliseconds(250)
    /// When the current session's keys were made and when the server was last heard.
    private var session: (established: Instant, lastHeard: Instant)?
    /// Paths that failed their probes, avoided until the instant, with repeat count.
    private var dead = HoldDowns<Path.ID>()
    /// Recent losses per interface name, for flap damping.
    private var flaps = FlapRecord()
    /// The better path the debounce timer waits for.
    private var candidate: Path.ID?
    private var deadlines = TimerTable()
    private var enteredAt: Instant
    private var coalesced = 0
    /// The session path's round-trip time (RFC 6298) and its lowest.
    private var rtt = RTTEstimator()
    /// Probes sent on the session's path and answers that came back, halved as they grow: the
    /// path's recent loss, which decides how many probes in a row it may miss before it is dead.
    private var probeRecord: (sent: Int, answered: Int) = (0, 0)
    /// Resends of the handshake in flight so far.
    private var resends = 0
    /// Initiations sent again within an attempt since start.
    public private(set) var resentHandshakes = 0
    /// Since when the session has worked without an attempt failing (probing that ends in an
    /// answer does not interrupt it); `stableAfter` of it resets the backoff.
    private var workingSince: Instant?
    /// Another path probed while the session's path is suspect, and its echo's RTT once it answered.
    private var rescue: (path: Path, rtt: Duration?)?
    /// The current probing began because data went unanswered.
    private var suspectedByLiveness = false
    /// Probes that proved the path while the application heard nothing back, since it last did:
    /// each doubles the liveness wait, so a one-way flow does not probe without end.
    private var quietProofs = 0
    private var rng: SeededRandom
    private var stateBeforeSleep: State = .offline
    /// The machine is asleep (between a sleep and its wake), whatever the state: the operator's
    /// `agent up` while it sleeps waits for the wake instead of starting an attempt no network
    /// can answer.
    public private(set) var asleep = false
    private var trigger = ""
    /// The latest instant an input came with: a clock seen going back is stepped, not trusted.
    private var lastNow: Instant?
    /// A "session unknown" hint waits for its check: the next authenticated answer disproves
    /// it, the probe timer's expiry confirms it.
    private var checkingHint = false
    /// Hints after one that proved false are ignored until then: a forger gets one probe a
    /// second out of the agent, however fast it sends.
    private var hintsIgnoredUntil: Instant?
    /// Hints that an authenticated answer proved false since start (forged, or overtaken).
    public private(set) var disprovedHints = 0
    /// How long hints are ignored after one proved false.
    public static let hintHoldDown: Duration = .seconds(1)
    /// The path a connectivity check is out on: one at a time.
    private var checking: Path.ID?
    /// Rechecks since the portal was found: each waits twice as long as the one before.
    private var rechecks = 0
    /// Connectivity checks asked for since start.
    public private(set) var connectivityChecks = 0
    /// Until when the portal window is open, while it is.
    public private(set) var portalWindowUntil: Instant?
    /// The recheck that was due when the window was asked for: where the rechecks go on if the
    /// lockdown does not let the window through.
    private var recheckBeforeWindow: Instant?
    /// What the on-demand rules last decided, for the network of the path it names.
    public private(set) var onDemand: OnDemandVerdict?
    /// Held in `disconnected` only while the rules looked at a new network: whatever they then
    /// say but `disconnect` brings the first attempt.
    private var heldForRules = false
    /// The rules wait for facts about the network of path `path` (the rule, and what it waits
    /// for): the session does not move there before they know whether it is trusted.
    private var rulesWait: (rule: String, wanted: [String], path: Path.ID)?
    /// The tunnel device's MTU as the core last set it (the configured one until a path is
    /// found smaller).
    public private(set) var tunnelMTU: Int
    /// The server echoes padded probes at their size (it said so in its handshake response).
    private var sizedProbes = false
    /// The smallest tunnel MTU the path MTU search considers (`Config.mtuFloor`), by whether the
    /// tunnel carries IPv6, as the last handshake said.
    public private(set) var floorMTU: Int
    /// The path MTU search on the session's path: when its round began, and when to look for a
    /// bigger MTU once it is over.
    private var mtu: (path: Path.ID, search: PathMTUSearch, roundStart: Instant?, raiseAt: Instant?)?
    /// Paths found too small for the tunnel: their re-check is a probe of the smallest tunnel
    /// packet, not a small probe that would prove nothing.
    private var tooSmall: Set<Path.ID> = []
    /// When the MTU in use was last looked at after a silence (see `mtuVerifyEvery`).
    private var mtuVerifiedAt: Instant?
    /// The least time between two looks at the MTU in use that silences bring.
    public static let mtuVerifyEvery: Duration = .seconds(30)
    /// Path MTU probes sent since start.
    public private(set) var sizeProbes = 0
    /// What is known of UDP on each network (see `TransportBook`), kept across restarts.
    public private(set) var transports = TransportBook()
    /// The UDP path whose attempt went unanswered for the race delay, in the attempt under way:
    /// the stream's answer then marks its network as blocking UDP.
    private var raced: Path.ID?
    /// The stream path that answered since it was last opened: its failure is a break (a reset
    /// mid-session, which a new stream mends), not a failure to open one.
    private var streamProven: Path.ID?
    /// The UDP re-test while the session is on the stream: the uplink's UDP path, when the next
    /// re-test is due, and how many went unanswered on it.
    private var retest: (udp: Path.ID, due: Instant, failed: Int)?
    /// The networks a stream can open on, when that depends on the network (the HTTP proxy is
    /// named by host, and only some networks' look-ups gave its address): nil, every network.
    /// A stream elsewhere counts as failed lately (`isDead`), so no attempt goes there.
    public private(set) var streamNetworks: Set<NetworkKey>?
    /// The probes out, by id, and the path each went on (see `echo(of:rtt:size:)`).
    private var probes = ProbesInFlight()
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
        case .tunnelMTUFailed(let actual):
            tunnelMTU = actual
            coalesced += 1  // no state changes: the next search's result is compared with the device as it is
        case .liftRefused(let why):
            // The rule's word on the tunnel stands; the machine stays closed, and says so.
            guard case .disconnected(let rule, _?) = state else { coalesced += 1; break }
            enter(.disconnected(rule: rule, lifted: nil), .liftRefused(why), now, &out)
        }
        return out
    }

    // MARK: Inputs

    private mutating func pathsChanged(_ new: [Path], _ now: Instant, _ out: inout [Effect]) {
        // A link's loss counts for flap damping; a change of its address does not.
        for old in paths where !new.contains(where: { $0.linkIndex == old.linkIndex }) { noteLoss(of: old, now) }
        paths = new
        dead.keep { id in new.contains { $0.id == id.over(.udp) } }
        if let other = rescue { rescue = new.first { $0.id == other.path.id }.map { ($0, other.rtt) } }
        switch state {
        case .sleeping, .failed, .paused:
            coalesced += 1
        case .disconnected(_, let lifted):
            // A lifted lockdown belongs to the network it was lifted for: leaving it puts it back
            // at once, before the rules have looked at the next one.
            let best = preferred(now)
            if let lifted, best?.id != lifted { restoreLift(.lockdownRestored("left the network"), now, &out) }
            // The rules said connect for the network these paths now show.
            if let best, let verdict = onDemand, verdict.action == .connect || (heldForRules && verdict.action == .ignore),
               verdict.path == best.id {
                budget.forgetFailures()
                return attempt(on: best, .onDemand(verdict), now, &out, handshake: true)
            }
            coalesced += 1
        case .offline:
            guard let best = preferred(now) else { return }
            // Back from no path at all with the session alive (a Wi-Fi roam's carrier gap, a
            // cable replugged): the network took the path away, nobody chose to move, so proving
            // the session again with a probe spends no token. A flapping link's returns do.
            if isSessionFresh(now), !isFlapping(best.interface, now) {
                return startAttempt(on: best, .pathAppeared(best.interface), now, &out, handshake: false)
            }
            attempt(on: best, .pathAppeared(best.interface), now, &out)
        case .portal(let path, let url):
            // Behind the portal nothing is tried until the network changes: another path, or
            // another address on this one (a new lease is a new chance too).
            guard let best = preferred(now) else { return enter(.offline, .pathLost(path.interface), now, &out) }
            guard best.id != path.id || best.gateway == path.gateway else {
                // The same address behind another gateway: another network that gave the same lease.
                return attempt(on: best, .pathAppeared(best.interface), now, &out)
            }
            guard best.id != path.id else {
                state = .portal(best, url: url)
                coalesced += 1
                return
            }
            let stays = new.contains { $0.id == path.id }
            attempt(on: best, stays ? .betterPath(best, over: path) : reasonForLeaving(path, to: best), now, &out)
        case .backingOff(let path):
            guard let best = preferred(now) else { return enter(.offline, .pathLost(path.interface), now, &out) }
            if best.id != path.id {
                // A different path is a new chance, not a retry of what failed: no backoff wait,
                // and no handshake while the session lives.
                attempt(on: best, reasonForLeaving(path, to: best), now, &out)
            } else {
                state = .backingOff(best)
                coalesced += 1
            }
        case .connecting(let current), .connected(let current), .probing(let current, _),
             .switching(let current, _, _):
            guard let best = preferred(now) else { return enter(.offline, .pathLost(current.interface), now, &out) }
            guard let same = Self.refreshed(current, in: new) ?? Self.stillValid(current, in: new) else {
                if let wait = rulesWait, wait.path == best.id {
                    // Left for a network the rules are still looking at: nothing is tried there
                    // until they know whether it is trusted.
                    session = nil
                    enter(.disconnected(rule: wait.rule, lifted: nil), .onDemandWaits(wait.rule, for: wait.wanted), now, &out)
                    if socket != nil { goodbye(&out) }
                    return
                }
                // The session's path is gone and another exists: act at once. With the session
                // alive the move is a rebind and a probe, and staying is no option, so it spends
                // no token: the budget bounds handshakes and moves by choice (returns to a better
                // path, which flap damping also holds back), not the way off a path that is gone.
                if !isHandshaking && isSessionFresh(now) {
                    return startAttempt(on: best, reasonForLeaving(current, to: best), now, &out, handshake: false)
                }
                return attempt(on: best, reasonForLeaving(current, to: best), now, &out,
                               handshake: isHandshaking)
            }
            switch state {
            case .connecting: state = .connecting(same); coalesced += 1
            case .probing(_, let sent): state = .probing(same, sent: sent); coalesced += 1
            case .switching(_, let to, let sent):
                if let target = Self.refreshed(to, in: new) {
                    state = .switching(from: same, to: target, sent: sent)
                    coalesced += 1
                } else {
                    enter(.connected(same), .candidateLost(to.interface), now, &out)
                    considerBetterPath(now, &out)
                }
            default:
                state = .connected(same)
                considerBetterPath(now, &out)
            }
        }
    }

    private mutating func sleep(_ now: Instant, _ out: inout [Effect]) {
        asleep = true
        switch state {
        case .disconnected(_, _?):
            // The machine may wake on another network: the lift does not outlive the sleep.
            return restoreLift(.goingToSleep, now, &out)
        case .sleeping, .paused, .disconnected: return  // there is nothing to quiesce, and no session to keep
        default: break
        }
        stateBeforeSleep = state
        enter(.sleeping, .goingToSleep, now, &out)
    }

    private mutating func wake(after slept: Duration, _ now: Instant, _ out: inout [Effect]) {
        asleep = false
        switch state {
        case .paused, .disconnected: coalesced += 1; return  // the operator or the rules bring it up, not a wake
        default: break
        }
        let before: State
        if case .sleeping = state { before = stateBeforeSleep } else { before = state }
        if case .failed(let why) = before { return enter(.failed(why), .wokeAfter(slept), now, &out) }
        // After a long sleep the networks may all be different, whatever their addresses: old
        // verdicts about paths no longer hold. After a short one, a path whose link and address
        // stayed is most likely the same network, and a dead uplink is still dead.
        // Nothing was learnt while asleep, so a kept verdict's hold-down does not run out in it.
        if slept >= config.shortSleep {
            dead.removeAll()
        } else {
            dead.shift(by: slept)
        }
        candidate = nil
        guard let best = preferred(now) else { return enter(.offline, .wokeAfter(slept), now, &out) }
        // Awake on a network the rules keep the tunnel off, or are still looking at.
        if let verdict = onDemand, verdict.action == .disconnect, verdict.path == best.id {
            return disconnect(verdict, now, &out, from: .wokeAfter(slept))
        }
        if let wait = rulesWait {
            session = nil
            enter(.disconnected(rule: wait.rule, lifted: nil), .onDemandWaits(wait.rule, for: wait.wanted), now, &out)
            if socket != nil { goodbye(&out) }
            return
        }
        if isSessionFresh(now), let socket, !unbound, best.id == socket.over(.udp) {
            // Short sleep on the same network: one probe tells whether anything changed (over
            // the transport the session was on).
            let path = best.over(socket.transport)
            probe(path, now, &out)
            return enter(.probing(path, sent: 1), .wokeAfter(slept), now, &out)
        }
        attempt(on: best, .wokeAfter(slept), now, &out)
    }

    private mutating func probeReply(on id: Path.ID, rtt: Duration, _ now: Instant, _ out: inout [Effect]) {
        noteHeard(now)
        if id == socket { probeRecord.answered = min(probeRecord.answered + 1, probeRecord.sent) }
        switch state {
        case .probing(let path, _) where path.id == id:
            sampleRTT(rtt, now)
            dead.clear(id)
            if suspectedByLiveness {
                quietProofs = min(quietProofs + 1, 5)
                // Data went unanswered, yet a small probe passes: the path may have begun to drop
                // big packets (a route change behind it). Its MTU is looked for again.
                prepareLookAtMTU(on: id, now)
            }
            enter(.connected(path), .probeAnswered(rtt: rtt), now, &out)
            considerBetterPath(now, &out)
        case .connected(let path) where path.id == id:
            sampleRTT(rtt, now)  // an estimate's refresh, or a probe's late echo
        case .probing(let path, let sent) where rescue?.path.id == id:
            rescue?.rtt = rtt
            // Once the session's own path has missed a probe, the path that answers takes over,
            // within the budget as on the probe timer's expiry.
            if sent > 1, takeToken(now) { failover(from: path, now, &out) }
        case .switching(let from, let to, _) where to.id == id:
            dead.clear(id)
            sampleRTT(rtt, now, newPath: true)
            // Back from the stream to UDP on the same uplink: a roam like any, no handshake.
            let reason: Reason = Self.isUDPRetest(from: from, to: to) ? .udpAnswered(to.interface, rtt: rtt)
                : .switched(to.name, rtt: rtt)
            moveSocket(to: to, reason, &out)
            enter(.connected(to), reason, now, &out)
        case .backingOff(let path) where path.id == id, .connecting(let path) where path.id == id,
             .portal(let path, _) where path.id == id:
            // An echo on the session's keys that came later than the probes waited (an RTT that
            // rose): the path works and the server still has the session. No handshake needed.
            guard session != nil, !unbound else { return }
            sampleRTT(rtt, now)
            dead.clear(id)
            enter(.connected(path), .probeAnswered(rtt: rtt), now, &out)
            considerBetterPath(now, &out)
        default:
            break
        }
    }

    private mutating func handshakeSucceeded(rtt: Duration, _ now: Instant, _ out: inout [Effect]) {
        // A handshake that was in flight when the operator took the tunnel down: its keys went
        // with the session.
        switch state {
        case .paused, .disconnected: return
        default: break
        }
        // The driver holds the fresh keys whatever the state: the session lives from now.
        session = (now, now)
        // In backing-off the answer came after the timeout gave up on it; it works all the same,
        // unless the driver could not bind the path since: the keys wait for the next bind.
        let path: Path
        switch state {
        case .connecting(let p), .portal(let p, _): path = p
        case .backingOff(let p) where !unbound: path = onSocket(p)
        default: return
        }
        // The handshake's time includes the server's work on it, so it bounds the path's RTT from
        // above: a sample when no estimate is known or when the estimate is slower than that
        // (a queue that has drained since the last probe).
        if self.rtt.smoothed.map({ rtt < $0 }) ?? true { sampleRTT(rtt, now) }
        dead.clear(path.id)
        enter(.connected(path), .handshakeSucceeded(rtt: rtt), now, &out)
        considerBetterPath(now, &out)
    }

    private mutating func handshakeFailed(_ failure: HandshakeFailure, _ now: Instant, _ out: inout [Effect]) {
        switch failure {
        case .timeout:
            if case .connecting(let path) = state { failed(on: path, .handshakeTimeout(path.interface), now, &out) }
        case .rejected(let why):
            switch state {
            case .sleeping, .failed, .offline, .paused, .disconnected: return
            default:
                enter(.failed(.rejected(why)), .rejected(why), now, &out)
                out.append(.reportFailure(.rejected(why)))
            }
        case .sessionUnknown:
            sessionUnknownHint(now, &out)
        }
    }

    /// The server says it lost our keys (it restarted). The hint is unauthenticated: anyone who
    /// sees the session's packets can send one. So it is checked first, with a probe on the
    /// session's keys: a server that still has the session answers it (and any data proves the
    /// same), and the forgery cost one probe. No answer within the path's patience confirms it,
    /// and a handshake follows at once.
    private mutating func sessionUnknownHint(_ now: Instant, _ out: inout [Effect]) {
        guard session != nil else { coalesced += 1; return }
        if let quiet = hintsIgnoredUntil, now < quiet {
            // Soon after a forgery: no probe now, but not forgotten either. The next answer
            // disproves it; if none comes, the liveness probe's silence confirms it.
            checkingHint = true
            coalesced += 1
            return
        }
        if checkingHint, case .probing = state { coalesced += 1; return }  // its check is out
        switch state {
        case .connected(let path), .probing(let path, _), .switching(let path, _, _):
            checkingHint = true
            sendProbe(via: path, &out)
            arm(.probe, at: now + hintPatience(now))
            enter(.probing(path, sent: 1), .sessionUnknownHint, now, &out)
        case .backingOff:
            // The retry's probe checks it: its silence then brings a handshake at once.
            checkingHint = true
        case .connecting, .offline, .sleeping, .failed, .paused, .portal, .disconnected:
            coalesced += 1  // fresh keys are on their way, or nothing is sent meanwhile
        }
    }

    /// How long a hint's check waits for an authenticated answer: twice the smoothed RTT while
    /// the estimate is current. An echo later than that costs the handshake a hint used to cost
    /// every time. An estimate with no recent sample may be from a faster hour of the path (its
    /// RTT rose since), so the check then waits twice the path's patience, at least the probe
    /// timeout.
    private func hintPatience(_ now: Instant) -> Duration {
        guard let smoothed = rtt.smoothed else { return config.probeTimeout }
        if !rtt.isStale(now, staleAfter: config.rttStaleAfter) { return max(.milliseconds(20), smoothed * 2) }
        return max(config.probeTimeout, (smoothed * 2 + rtt.variance * 4) * 2)
    }

    private mutating func dataSent(_ now: Instant, _ out: inout [Effect]) {
        guard case .connected(let path) = state else { return }
        if let session, now - session.lastHeard >= config.sessionLifetime {
            return attempt(on: path, .sessionExpired(idle: now - session.lastHeard), now, &out, handshake: true)
        }
        if deadlines[.liveness] == nil { arm(.liveness, at: now + livenessWait(now)) }
        refreshRTT(on: path, heardBefore: session?.lastHeard, now, &out)
    }

    /// While the tunnel carries traffic the estimate is kept current: a probe when three
    /// quarters of `rttStaleAfter` have passed since the last sample (at most one per that,
    /// none while idle), so that it never goes stale; the waits for answers and a hint's check
    /// rest on it. Data sent after a quiet spell asks for it, and so does a busy conversation,
    /// which reports only its arrivals (`LivenessNotices`). Traffic flows when the server was
    /// heard within `rttStaleAfter` before (`heardBefore`): an application that sends a packet a
    /// minute costs no probes.
    private mutating func refreshRTT(on path: Path, heardBefore: Instant?, _ now: Instant, _ out: inout [Effect]) {
        let answering = heardBefore.map { now - $0 < config.rttStaleAfter } ?? false
        if answering, rtt.refresh(now, staleAfter: config.rttStaleAfter) { sendProbe(via: path, &out) }
    }

    /// Replaces a finished search on `id` with one look at the MTU in use (one padded probe,
    /// whose failure alone starts a whole search), unless one was made within `mtuVerifyEvery`:
    /// on a lossy path the silences that ask for it come often. The look goes out once the
    /// session is connected again.
    private mutating func prepareLookAtMTU(on id: Path.ID, _ now: Instant) {
        guard let search = mtu, search.path == id, search.search.isDone, !tooSmall.contains(id),
              mtuVerifiedAt.map({ now - $0 >= Self.mtuVerifyEvery }) ?? true else { return }
        mtuVerifiedAt = now
        mtu = (id, .verify(floor: floorMTU, ceiling: config.maxMTU, current: tunnelMTU, tooBig: search.search.tooBig),
               nil, nil)
    }

    private mutating func dataReceived(_ now: Instant, _ out: inout [Effect]) {
        let heardBefore = session?.lastHeard
        noteHeard(now)
        quietProofs = 0
        switch state {
        case .connected(let path):
            if deadlines[.liveness] != nil { cancel(.liveness) }
            refreshRTT(on: path, heardBefore: heardBefore, now, &out)
        case .probing(let path, _):
            // With a rescue probe out, the server follows the session to the rescue path and its
            // data may arrive there: no proof for the silent path. The probe timer decides.
            guard rescue == nil else { return }
            enter(.connected(path), .trafficResumed, now, &out)
            considerBetterPath(now, &out)
        case .backingOff(let path), .connecting(let path), .portal(let path, _):
            // Data on the session's keys: the path works after all (its answers were only late)
            // and the server has the session. No handshake is needed. Not when the driver could
            // not bind the path: the data came over a socket the session is leaving.
            guard session != nil, !unbound else { return }
            enter(.connected(onSocket(path)), .trafficResumed, now, &out)
            considerBetterPath(now, &out)
        default:
            break
        }
    }

    private mutating func timerFired(_ kind: TimerKind, _ now: Instant, _ out: inout [Effect]) {
        // A timer the state machine no longer wants (cancelled, or fired late) is ignored.
        guard let due = deadlines[kind], due <= now else { return }
        deadlines[kind] = nil
        switch (kind, state) {
        case (.liveness, .connected(let path)):
            let waited = livenessWait(now)
            probe(path, now, &out)
            // A hint came since the server was last heard: its check is this probe.
            if checkingHint { arm(.probe, at: now + hintPatience(now)) }
            // Make-before-break for a path that may have died: the best other path is asked at
            // the same time, and takes over if the session's own stays silent.
            let other = paths.first { $0.id != path.id.over(.udp) && !isDead($0.id, now) }
            if let other { sendProbe(via: other, &out) }
            enter(.probing(path, sent: 1), .livenessTimeout(waited), now, &out)
            rescue = other.map { ($0, nil) }
            suspectedByLiveness = true
        case (.probe, .probing(let path, let sent)) where checkingHint && sent < probesBeforeDead(after: sent, atLeast: 1):
            // On a path that loses packets one silent probe proves nothing: the check sends as
            // many as the path's loss calls for (one on a clean path), as a dead-path verdict does.
            sendProbe(via: path, &out)
            arm(.probe, at: now + hintPatience(now))
            state = .probing(path, sent: sent + 1)
        case (.probe, .probing(let path, _)) where checkingHint:
            // Nothing authenticated came back: the server did lose the session.
            checkingHint = false
            session = nil
            attempt(on: path, .sessionUnknown, now, &out, handshake: true)
        case (.probe, .probing(let path, let sent)):
            if rescue?.rtt != nil, takeToken(now) { return failover(from: path, now, &out) }
            if sent < probesBeforeDead(after: sent) {
                probe(path, now, &out, attempt: sent + 1)
                if let other = rescue, other.rtt == nil { sendProbe(via: other.path, &out) }
                state = .probing(path, sent: sent + 1)
            } else {
                failed(on: path, .probeTimeout(sent, of: config.probeAttempts), now, &out)
            }
        case (.probe, .switching(let from, let to, let sent)):
            if sent < config.probeAttempts {
                probe(to, now, &out)
                state = .switching(from: from, to: to, sent: sent + 1)
            } else if Self.isUDPRetest(from: from, to: to) {
                // Still blocked: no verdict against the UDP path (it is not dead, only blocked
                // here), and the next re-test waits twice as long.
                if var next = retest {
                    next.failed += 1
                    next.due = now + config.udpRetest(after: next.failed, on: power)
                    retest = next
                }
                enter(.connected(from), .udpStillSilent(to.interface, probes: sent), now, &out)
                considerBetterPath(now, &out)
            } else {
                markDead(to.id, now)
                enter(.connected(from), .candidateUnreachable(to.name, probes: sent), now, &out)
                considerBetterPath(now, &out)
            }
        case (.handshake, .connecting(let path)):
            failed(on: path, .handshakeTimeout(path.interface), now, &out)
        case (.resend, .connecting(let path)):
            // No transition: the attempt goes on, with a fresh initiation in case one was lost.
            resends += 1
            resentHandshakes += 1
            out.append(.resendHandshake(on: path))
            armResend(now, &out)
        case (.debounce, .connected(let current)):
            guard let id = candidate, let uplink = paths.first(where: { $0.id == id }),
                  Self.isPreferred(uplink, over: current), !isDead(id, now), id != rulesWait?.path
            else { return considerBetterPath(now, &out) }
            guard takeToken(now) else { return arm(.debounce, at: nextToken()) }
            candidate = nil
            // Over the stream if its network is known to block UDP.
            let target = knownToBlockUDP(uplink, now) ? uplink.over(.stream) : uplink
            let reason: Reason = target.linkIndex == current.linkIndex
                ? .addressChanged(current.interface, from: current.source, to: target.source)
                : .betterPath(target, over: current)
            // A session the server has forgotten by now (idle past its lifetime) cannot be probed
            // onto the better path: the probe would draw a hint, its check and a handshake on the
            // path being left. One handshake on the better path does it all.
            guard isSessionFresh(now) else {
                session = nil
                return startAttempt(on: target, reason, now, &out, handshake: true)
            }
            probe(target, now, &out)
            enter(.switching(from: current, to: target, sent: 1), reason, now, &out)
        case (.handover, _):
            handoverFailed(now, &out)
        case (.rebind, .backingOff):
            guard unbound, let refused = refusals, let path = Self.refreshed(refused.path, in: paths) else {
                guard let best = preferred(now) else { return enter(.offline, .retry, now, &out) }
                return attempt(on: best, .retry, now, &out)
            }
            // The same attempt, bound again: no token, no new attempt (see `bindRetries`).
            prove(path, .retry, now, &out, handshake: refused.handshake)
        case (.retry, .backingOff):
            guard let best = preferred(now) else { return enter(.offline, .retry, now, &out) }
            // A probe while the session lives (the server keeps it), a handshake once it is gone.
            attempt(on: best, .retry, now, &out)
        case (.recheck, .portal(let path, _)):
            checkConnectivity(via: path, &out)
            rechecks += 1
            arm(.recheck, at: now + recheckWait)
        case (.pathMTU, .connected(let path)):
            pathMTUTimer(on: path, now, &out)
        case (.race, .connecting(let path)) where path.transport == .udp,
             (.race, .probing(let path, _)) where path.transport == .udp:
            raceToStream(from: path, now, &out)
        case (.udpRetest, .connected(let path)) where path.transport == .stream:
            retestUDP(from: path, now, &out)
        case (.portalWindow, .portal(let path, let url)):
            portalWindowUntil = nil
            out.append(.closePortalWindow)
            enter(.portal(path, url: url), .portalWindowClosed(why: "timed out"), now, &out)
            arm(.recheck, at: now + recheckWait)
        default:
            break
        }
    }

    private mutating func powerChanged(_ source: PowerSource, _ now: Instant, _ out: inout [Effect]) {
        budget.change(from: inForce, to: config.budget(on: source), now)
        power = source
        // A wait drawn under battery's long backoff has lost its reason once on mains: draw
        // it again under the budget now in force, if that is sooner.
        guard case .backingOff = state, let due = deadlines[.retry] else { return }
        let wait = backoffWait(now)
        if now + wait < due { arm(.retry, at: now + wait) }
    }

    private mutating func reconnectRequested(_ now: Instant, _ out: inout [Effect]) {
        switch state {
        case .sleeping, .paused, .disconnected: return  // down stays down until `agent up`, or the rules change
        case .connecting: coalesced += 1; return  // the fresh handshake asked for is already in flight
        default: break
        }
        budget.forgetFailures()
        guard let best = preferred(now) else { return enter(.offline, .operatorRequest, now, &out) }
        // An operator's explicit request is not a storm: it bypasses the budget.
        session = nil
        startAttempt(on: best, .operatorRequest, now, &out, handshake: true)
    }

    /// The operator takes the tunnel down without stopping the agent, as a paused always-on VPN
    /// is: the session ends with a goodbye, every timer stops, and nothing is tried until they
    /// bring it up again. The tunnel device and the lockdown stay, so nothing leaves in clear.
    private mutating func pause(_ now: Instant, _ out: inout [Effect]) {
        if case .paused = state { coalesced += 1; return }
        session = nil
        if case .disconnected(_, _?) = state { out.append(.restoreLockdown) }
        enter(.paused, .operatorDown, now, &out)
        goodbye(&out)
    }

    /// The operator brings the tunnel up again: fresh keys on the best path at once. Like any
    /// operator's request it bypasses the budget, and it forgets earlier failures.
    private mutating func resume(_ now: Instant, _ out: inout [Effect]) {
        guard case .paused = state else { coalesced += 1; return }
        budget.resetBackoff()
        if asleep {
            // Up again while the machine sleeps: the attempt waits for the wake.
            stateBeforeSleep = .offline
            return enter(.sleeping, .operatorUp, now, &out)
        }
        guard let best = preferred(now) else { return enter(.offline, .operatorUp, now, &out) }
        if let verdict = onDemand, verdict.action == .disconnect, verdict.path == best.id {
            // Up again on a network the rules keep the tunnel off: as they said.
            return disconnect(verdict, now, &out, from: .operatorUp)
        }
        startAttempt(on: best, .operatorUp, now, &out, handshake: true)
    }

    /// The server answers at another address now. A live session is proved with a probe (the
    /// same server keeps it; another one behind the name answers "session unknown", which brings
    /// a handshake); a handshake in flight to the old address starts afresh; a backoff drawn for
    /// the old address ends: the new one is a new chance, within the budget, as a new path is.
    private mutating func serverMoved(_ now: Instant, _ out: inout [Effect]) {
        // Paths that failed their probes failed them towards the old address, and the path to
        // the new one may carry other sizes.
        dead.removeAll()
        tooSmall.removeAll()
        mtu = nil
        switch state {
        case .offline, .sleeping, .failed, .paused, .portal, .disconnected:
            // The next attempt goes to the new address anyway (behind a portal, after it opens).
            coalesced += 1
        case .backingOff:
            guard let best = preferred(now), takeToken(now) else { coalesced += 1; return }
            startAttempt(on: best, .serverAddressChanged, now, &out, handshake: false)
        case .connected(let path), .probing(let path, _), .switching(let path, _, _):
            probe(path, now, &out)
            enter(.probing(path, sent: 1), .serverAddressChanged, now, &out)
        case .connecting(let path):
            // The initiation went to the old address: its answer will not come.
            attempt(on: preferred(now) ?? path, .serverAddressChanged, now, &out, handshake: true)
        }
    }

    // MARK: On-demand rules

    /// What the rules decided for the best path's network. `connect` brings a tunnel they kept
    /// down up at once; `disconnect` ends the session with a goodbye and tries nothing while
    /// they hold (lifting the lockdown for that network only if the rule says so); `ignore`
    /// keeps what is. While they wait for a fact, a lifted lockdown is put back.
    private mutating func onDemand(_ decision: OnDemandDecision, _ now: Instant, _ out: inout [Effect]) {
        if case .waiting(let rule, let wanted, _) = decision {
            // What was decided is about a network the rules are looking at again.
            onDemand = nil
            rulesWait = (rule, wanted.map(\.description), decision.path)
            switch state {
            case .disconnected(_, _?):
                restoreLift(.lockdownRestored("the rules look at the network"), now, &out)
            case .offline:
                // Nothing tried yet: nothing is, until the rules know whether this network is trusted
                // (a session that works meanwhile keeps working).
                enter(.disconnected(rule: rule, lifted: nil), .onDemandWaits(rule, for: wanted.map(\.description)), now, &out)
            default:
                coalesced += 1
            }
            return
        }
        guard case .decided(let verdict) = decision else { return }
        let waited = rulesWait != nil
        rulesWait = nil
        onDemand = verdict
        // A better path held back while the rules looked at its network is one again.
        if waited, case .connected = state { considerBetterPath(now, &out) }
        switch state {
        case .paused, .failed, .sleeping:
            // The operator's word (or a rejection) stands; a wake brings the rules' word anew.
            coalesced += 1
            return
        default: break
        }
        // Held only for the rules to look: anything but disconnect means the tunnel is wanted.
        let action = heldForRules && verdict.action == .ignore ? .connect : verdict.action
        switch action {
        case .connect:
            guard case .disconnected(_, let lifted) = state else { coalesced += 1; return }
            guard let best = preferred(now), best.id == verdict.path else {
                // The paths that show this network come next, and the attempt with them; the
                // lockdown is whole meanwhile.
                guard lifted != nil else { coalesced += 1; return }
                return restoreLift(.lockdownRestored("left the network"), now, &out)
            }
            if lifted != nil { out.append(.restoreLockdown) }
            budget.forgetFailures()
            attempt(on: best, .onDemand(verdict), now, &out, handshake: true)
        case .disconnect:
            disconnect(verdict, now, &out, from: .onDemand(verdict))
        case .ignore:
            // Keep what is, but a lifted lockdown was the lifting rule's, not this one's.
            guard case .disconnected(_, _?) = state else { coalesced += 1; return }
            restoreLift(.onDemand(verdict), now, &out)
        }
    }

    /// The lockdown a rule lifted is whole again; the tunnel stays down as that rule said.
    private mutating func restoreLift(_ reason: Reason, _ now: Instant, _ out: inout [Effect]) {
        guard case .disconnected(let rule, _?) = state else { return }
        out.append(.restoreLockdown)
        enter(.disconnected(rule: rule, lifted: nil), reason, now, &out)
    }

    /// Ends the session (with a goodbye, if there is one) as `verdict` says and keeps the
    /// tunnel down; the lockdown steps aside only if the rule lifts it.
    private mutating func disconnect(_ verdict: OnDemandVerdict, _ now: Instant, _ out: inout [Effect], from reason: Reason) {
        let lift = verdict.liftsLockdown ? verdict.path : nil
        if case .disconnected(let rule, let lifted) = state {
            // Kept down already: a transition still names the rule that decides now, and ends a
            // hold that was only for the rules to look.
            guard lifted != lift || rule != verdict.rule || heldForRules else { coalesced += 1; return }
            if lifted != nil { out.append(.restoreLockdown) }
            if lift != nil { out.append(.liftLockdown(interface: verdict.interface)) }
            return enter(.disconnected(rule: verdict.rule, lifted: lift), reason, now, &out)
        }
        session = nil
        enter(.disconnected(rule: verdict.rule, lifted: lift), reason, now, &out)
        if socket != nil { goodbye(&out) }  // a session, or one on its way: a goodbye
        if lift != nil { out.append(.liftLockdown(interface: verdict.interface)) }
    }

    // MARK: Captive portals

    /// Every attempt on `path` went unanswered: one plain HTTP request over it tells a captive
    /// portal (which holds everything back until a user logs in) from an outage. Only on a path
    /// through a default route (a network that claims to reach the internet), one at a time.
    private mutating func checkForPortal(on path: Path, _ out: inout [Effect]) {
        guard config.portalCheck, path.prefixLength == 0 else { return }
        checkConnectivity(via: path, &out)
    }

    private mutating func checkConnectivity(via path: Path, _ out: inout [Effect]) {
        guard checking == nil else { return }
        checking = path.id
        connectivityChecks += 1
        out.append(.checkConnectivity(via: path))
    }

    private mutating func connectivity(_ result: Connectivity, on id: Path.ID, _ now: Instant, _ out: inout [Effect]) {
        if checking == id { checking = nil }
        switch (result, state) {
        case (.portal(let url), .backingOff(let path)) where path.id == id:
            // No attempts until the network changes, an operator acts, or a recheck sees it open:
            // a portal does not open by itself, so handshakes into it only spend the budget.
            rechecks = 0
            // Whatever went unanswered there was the portal's doing, not the network's policy.
            transports.forget(NetworkKey(path))
            enter(.portal(path, url: url), .captivePortal(path.interface, url: url), now, &out)
            arm(.recheck, at: now + recheckWait)
        case (.portal(let url), .portal(let path, let known)) where path.id == id && url != known:
            enter(.portal(path, url: url), .captivePortal(path.interface, url: url), now, &out)
        case (.online, .portal(let path, _)) where path.id == id:
            // Logged in: the session comes up at once (a probe if its keys are still fresh).
            startAttempt(on: path, .portalOpened(path.interface), now, &out, handshake: false)
        default:
            // The network reaches the internet and the server is silent (an outage), nothing is
            // known, or the answer is about a path the session left.
            coalesced += 1
        }
    }

    /// Rechecks back off: twice as long each time up to the cap (both doubled on battery); a
    /// portal window, while a user logs in, checks often.
    private var recheckWait: Duration {
        if portalWindowUntil != nil { return config.portalWindowRecheck }
        let factor = power == .battery ? 2 : 1
        return min(config.portalRecheckCap * factor, config.portalRecheck * factor * (1 << min(rechecks, 20)))
    }

    private mutating func openPortalWindow(_ now: Instant, _ out: inout [Effect]) {
        guard case .portal(let path, let url) = state, portalWindowUntil == nil else { coalesced += 1; return }
        let until = now + config.portalWindow
        portalWindowUntil = until
        recheckBeforeWindow = deadlines[.recheck]
        out.append(.openPortalWindow(via: path, portal: url, until: until))
        enter(.portal(path, url: url), .portalWindowOpened(config.portalWindow), now, &out)
        arm(.portalWindow, at: until)
        arm(.recheck, at: now + config.portalWindowRecheck)
    }

    /// The window's process ended: the user may just have logged in, so the network is checked
    /// at once, and the rechecks start over.
    private mutating func closePortalWindow(_ now: Instant, _ out: inout [Effect]) {
        guard case .portal(let path, let url) = state, portalWindowUntil != nil else { coalesced += 1; return }
        portalWindowUntil = nil
        out.append(.closePortalWindow)
        enter(.portal(path, url: url), .portalWindowClosed(why: "its process ended"), now, &out)
        checkConnectivity(via: path, &out)
        rechecks = 0
        arm(.recheck, at: now + recheckWait)
    }

    /// The lockdown did not let the window through: no window stands, nothing is closed, and
    /// the backed-off rechecks go on as before it was asked for (no check at once: nobody
    /// could have logged in through a window that never opened).
    private mutating func portalWindowRefused(_ now: Instant, _ out: inout [Effect]) {
        guard case .portal(let path, let url) = state, portalWindowUntil != nil else { coalesced += 1; return }
        portalWindowUntil = nil
        cancel(.portalWindow)
        enter(.portal(path, url: url), .portalWindowClosed(why: "the lockdown did not let it through"), now, &out)
        arm(.recheck, at: max(now, recheckBeforeWindow ?? now + recheckWait))
        recheckBeforeWindow = nil
    }

    // MARK: Servers

    /// The current server is being taken down: a session is made with the next server first,
    /// and the traffic moves once it is up (make-before-break). It costs no token: the server
    /// asked, and only once per drain. With no other server, the session stays until it ends.
    /// On the stream the handshake with the next server needs a stream of its own, and the
    /// session's reaches only the server it was opened to: the session ends there with a
    /// goodbye (the draining server stops as soon as none is left) and moves break-before-make,
    /// at once, over a new stream on the same uplink (also without a token).
    private mutating func serverDraining(_ now: Instant, _ out: inout [Effect]) {
        drained[server] = now + Self.drainHoldDown
        guard handover == nil, session != nil, Self.allows(state, .handover), let path = state.path,
              let next = nextServer(now, drainedToo: false) else {
            coalesced += 1
            return
        }
        if path.transport == .stream {
            goodbye(&out)
            return startAttempt(on: path, .serverDraining(servers[server]), now, &out, handshake: true)
        }
        prepareHandover(to: next, on: path, now, &out)
        enter(state, .serverDraining(servers[server]), now, &out)
    }

    private mutating func prepareHandover(to next: Int, on path: Path, _ now: Instant, _ out: inout [Effect]) {
        handover = next
        out.append(.prepareHandover(server: next, at: nil, on: path))
        arm(.handover, at: now + config.handshakeTimeout)
    }

    private mutating func handoverReady(rtt: Duration, sizedProbes sized: Bool, _ now: Instant, _ out: inout [Effect]) {
        guard let next = handover, let path = state.path else { return }
        handover = nil
        cancel(.handover)
        let old = server
        server = next
        session = (now, now)
        sizedProbes = sized
        // Verdicts on paths, and their MTUs, were about the old server.
        dead.removeAll()
        tooSmall.removeAll()
        mtu = nil
        sampleRTT(rtt, now, newPath: true)
        // Echoes still on their way come from the old server: they prove nothing now.
        probes.removeAll()
        out.append(.completeHandover)
        enter(.connected(path), .handedOver(from: servers[old], to: servers[next], rtt: rtt), now, &out)
        considerBetterPath(now, &out)
    }

    /// The server the session was to move to stayed silent or refused: the next one is asked,
    /// or the traffic stays where it is.
    private mutating func handoverFailed(_ now: Instant, _ out: inout [Effect]) {
        guard let failed = handover else { return }
        markServer(failed, now)
        if deadlines[.handover] != nil { cancel(.handover) }
        if let next = nextServer(now, drainedToo: false), next != failed, let path = state.path {
            return prepareHandover(to: next, on: path, now, &out)
        }
        dropHandover(&out)
        enter(state, .handoverFailed(servers[failed]), now, &out)
    }

    /// Break-before-make: the current server is silent, so its session is worth nothing; the
    /// next server gets a handshake at once (within the budget).
    private mutating func switchServer(to next: Int, _ now: Instant, _ out: inout [Effect]) {
        let old = server
        markServer(old, now)
        let reason = Reason.serverUnreachable(servers[old])
        useServer(next, &out)
        guard let path = preferred(now) else { return enter(.offline, reason, now, &out) }
        attempt(on: path, reason, now, &out, handshake: true)
    }

    private mutating func useServer(_ index: Int, _ out: inout [Effect]) {
        dropHandover(&out)
        server = index
        session = nil
        checkingHint = false
        dead.removeAll()
        tooSmall.removeAll()
        mtu = nil
        rtt.forget()
        probes.removeAll()  // echoes still on their way come from the old server
        out.append(.useServer(index, at: nil))
    }

    /// The first server in the list that is neither held down nor drained, else the first not
    /// held down; the current one if every server is held down.
    private func preferredServer(_ now: Instant) -> Int {
        servers.indices.first { !isServerHeld($0, now) && !isDrained($0, now) }
            ?? servers.indices.first { !isServerHeld($0, now) } ?? server
    }

    /// Another server to try: the first in the list that is not held down, preferring those not
    /// drained (`drainedToo` false: only those).
    private func nextServer(_ now: Instant, drainedToo: Bool = true) -> Int? {
        let others = servers.indices.filter { $0 != server && !isServerHeld($0, now) }
        return others.first { !isDrained($0, now) } ?? (drainedToo ? others.first : nil)
    }

    private func isServerHeld(_ index: Int, _ now: Instant) -> Bool {
        heldServers.isHeld(index, now)
    }

    private func isDrained(_ index: Int, _ now: Instant) -> Bool {
        drained[index].map { now < $0 } ?? false
    }

    /// A server that failed is avoided as a dead path is, doubling per repeat up to `maxHoldDown`.
    private mutating func markServer(_ index: Int, _ now: Instant) {
        heldServers.strike(index, now, base: config.deadPathHoldDown, cap: config.maxHoldDown)
    }

    /// Forgets the session being prepared with another server, if there is one.
    private mutating func dropHandover(_ out: inout [Effect]) {
        guard handover != nil else { return }
        handover = nil
        out.append(.cancelHandover)
    }

    // MARK: Decisions

    /// The session's path when its address is still valid on its link although the link now
    /// prefers another (an IPv6 prefix being deprecated, a temporary address rotating): the
    /// session stays on it while the preference settles, then moves make-before-break.
    private static func stillValid(_ current: Path, in new: [Path]) -> Path? {
        guard var same = new.first(where: { $0.linkIndex == current.linkIndex }),
              same.otherSources.contains(current.source) else { return nil }
        same.otherSources = same.otherSources.filter { $0 != current.source } + [same.source]
        same.source = current.source
        same.transport = current.transport
        return same
    }

    /// True when the session should move from `current` to `path`: the kernel would prefer its
    /// route, or it is the address its link prefers now.
    private static func isPreferred(_ path: Path, over current: Path) -> Bool {
        path.ranks(above: current) || (path.linkIndex == current.linkIndex && path.source != current.source)
    }

    /// The session's path went silent and `rescue` answered: the session moves there at once.
    private mutating func failover(from path: Path, _ now: Instant, _ out: inout [Effect]) {
        guard let (target, rtt) = rescue, let rtt else { return }
        markDead(path.id, now)
        dead.clear(target.id)
        sampleRTT(rtt, now, newPath: true)
        let reason = Reason.failover(from: path.interface, to: target.interface, rtt: rtt)
        moveSocket(to: target, reason, &out)
        enter(.connected(target), reason, now, &out)
        considerBetterPath(now, &out)
    }

    /// The best path with no verdict against it; else the best whose hold-down ran out (it has
    /// not answered since it failed: it is re-checked with a probe once the session works
    /// elsewhere, see `considerBetterPath`); the best of all if every one is held down.
    private func preferred(_ now: Instant) -> Path? {
        paths.first { dead[$0.id] == nil } ?? paths.first { !isDead($0.id, now) } ?? paths.first
    }

    private func reasonForLeaving(_ old: Path, to new: Path) -> Reason {
        old.linkIndex == new.linkIndex && old.source != new.source
            ? .addressChanged(old.interface, from: old.source, to: new.source)
            : .pathLost(old.interface)
    }

    /// Spends a token on a reconnect to `path`, or backs off until one comes back.
    private mutating func attempt(on path: Path, _ reason: Reason, _ now: Instant, _ out: inout [Effect],
                                  handshake: Bool = false) {
        if budget.isBackingOff, dead[path.id.over(.udp)] == nil, dead[path.id.over(.stream)] == nil {
            // The backoff was earned on paths that failed; this one has not failed since (a new
            // network, or one back after a long sleep): no step of it applies here. Its uplink
            // failed over either transport counts: a retry names the uplink, and its transport
            // is chosen afresh.
            budget.resetBackoff()
        }
        if let due = budget.notBefore, now < due {
            arm(.retry, at: due)
            return enter(.backingOff(path.over(.udp)), .backoff(nextIn: due - now), now, &out)
        }
        budget.forgetWait()
        guard takeToken(now) else {
            let next = nextToken()
            arm(.retry, at: next)
            return enter(.backingOff(path.over(.udp)), .budgetExhausted(nextIn: next - now), now, &out)
        }
        startAttempt(on: path, reason, now, &out, handshake: handshake)
    }

    /// Moves the socket if needed, then proves the path: a probe if the session is still
    /// alive (the server follows us on the first authenticated packet), else a handshake.
    private mutating func startAttempt(on given: Path, _ because: Reason, _ now: Instant, _ out: inout [Effect],
                                       handshake: Bool) {
        attempt += 1
        raced = nil
        // An uplink's UDP path: the transport is chosen here (see `transport(for:)`); a stream
        // path given is the stream on purpose (a failed UDP attempt's fallback, a stream mended).
        var (path, reason, race) = (given, because, false)
        if given.transport == .udp { (path, reason, race) = transport(for: given, because, now) }
        if refusals?.path.id != path.id { refusals = nil }
        prove(path, reason, now, &out, handshake: handshake)
        if race {
            arm(.race, at: now + raceDelay(now))
        } else if deadlines[.race] != nil {
            cancel(.race)  // an earlier attempt's
        }
    }

    /// Moves the socket to `path` if needed (binds it again after a refusal), then proves the
    /// path: a probe if the session is still alive, else a handshake.
    private mutating func prove(_ path: Path, _ reason: Reason, _ now: Instant, _ out: inout [Effect], handshake: Bool) {
        moveSocket(to: path, reason, &out)
        if handshake || !isSessionFresh(now) {
            checkingHint = false  // fresh keys settle it
            // New keys are a new start: with the first server in the list that is not held down.
            let first = preferredServer(now)
            if first != server { useServer(first, &out) }
            out.append(.handshake(on: path, reason: reason))
            arm(.handshake, at: now + config.handshakeTimeout)
            enter(.connecting(path), reason, now, &out)
            resends = 0
            // A stream delivers what it carries or breaks: nothing to send again within it.
            if path.transport == .udp { armResend(now, &out) }
        } else {
            probe(path, now, &out)
            enter(.probing(path, sent: 1), reason, now, &out)
        }
    }

    // MARK: Transports

    /// Which transport an attempt on `uplink` (its UDP path) starts on, with the reason to log
    /// and whether UDP races the stream:
    /// - the stream off (`Config.stream` nil): UDP, as ever;
    /// - a network known to block UDP (`TransportBook`): the stream at once, even when it
    ///   failed there lately (a reset, a gateway restarting): UDP goes nowhere there, so the
    ///   stream is the only way, and the backoff paces it;
    /// - the stream failed lately elsewhere: UDP alone;
    /// - any other (nothing known, or UDP answered there): UDP first, and the stream over the
    ///   same uplink if UDP has not answered within the race delay (happy eyeballs).
    private func transport(for uplink: Path, _ reason: Reason, _ now: Instant) -> (Path, Reason, race: Bool) {
        guard config.stream != nil else { return (uplink, reason, false) }
        if transports[NetworkKey(uplink)] == .blocked, streamNetworks?.contains(NetworkKey(uplink)) ?? true {
            return (uplink.over(.stream), .knownToBlockUDP(uplink.interface, because: reason), false)
        }
        guard !isDead(uplink.id.over(.stream), now) else { return (uplink, reason, false) }
        return (uplink, reason, true)
    }

    /// The stream is on, and UDP went unanswered on `uplink`'s network while the stream answered.
    private func knownToBlockUDP(_ uplink: Path, _ now: Instant) -> Bool {
        config.stream != nil && transports[NetworkKey(uplink)] == .blocked && !isDead(uplink.id.over(.stream), now)
    }

    /// How long UDP may go unanswered before the attempt goes to the stream: the policy's
    /// delay, or the path's patience when it is longer (a slow path's answer takes longer), at
    /// most `handshakeResend`, so a blocked network costs under a second before the stream opens.
    private func raceDelay(_ now: Instant) -> Duration {
        let least = config.stream?.raceDelay ?? .zero
        return max(least, min(patience(now), config.handshakeResend))
    }

    /// UDP went unanswered for the race delay: the attempt moves to the stream on the same
    /// uplink, a handshake if one was in flight, a probe if the session lives. It is the same
    /// attempt over another transport, yet a move of the socket all the same: it spends a token
    /// (without one, the attempt stays on UDP and its own timeout decides).
    private mutating func raceToStream(from path: Path, _ now: Instant, _ out: inout [Effect]) {
        let stream = path.over(.stream)
        guard !isDead(stream.id, now), takeToken(now) else { return }
        let reason = Reason.udpSilent(path.interface, after: now - enteredAt)
        raced = path.id
        moveSocket(to: stream, reason, &out)
        if case .connecting = state {
            // The UDP initiation's late answer no longer counts; the stream's handshake is
            // covered by what is left of the attempt's timeout.
            if deadlines[.resend] != nil { cancel(.resend) }
            out.append(.handshake(on: stream, reason: reason))
            enter(.connecting(stream), reason, now, &out)
        } else {
            probe(stream, now, &out)
            enter(.probing(stream, sent: 1), reason, now, &out)
        }
    }

    /// The re-test is due: a make-before-break probe of UDP over the stream's uplink, within
    /// the budget as any move by choice.
    private mutating func retestUDP(from stream: Path, _ now: Instant, _ out: inout [Effect]) {
        guard let udp = paths.first(where: { $0.id == stream.id.over(.udp) }) else { return }
        guard takeToken(now) else {
            let next = nextToken()
            retest?.due = next
            return arm(.udpRetest, at: next)
        }
        probe(udp, now, &out)
        enter(.switching(from: stream, to: udp, sent: 1), .udpRetest(udp.interface), now, &out)
    }

    /// The stream on path `id` could not be opened or broke. A stream that answered since it
    /// was opened broke (a middlebox's reset, a proxy that dropped it): the next attempt opens a
    /// new one at once, within the budget. One that never answered failed to open: a failed
    /// attempt on that path, as a handshake timeout would be, only sooner.
    private mutating func streamFailed(on id: Path.ID, why: String, _ now: Instant, _ out: inout [Effect]) {
        guard config.stream != nil, id.transport == .stream else { coalesced += 1; return }
        let broke = streamProven == id
        if broke { streamProven = nil }
        switch state {
        case .connecting(let path) where path.id == id:
            failed(on: path, .streamFailed(path.name, why: why), now, &out)
        case .connected(let path) where path.id == id, .probing(let path, _) where path.id == id,
             .switching(let path, _, _) where path.id == id:
            let reason = Reason.streamFailed(path.name, why: why)
            if broke { return attempt(on: path, reason, now, &out) }
            failed(on: path, reason, now, &out)
        case .switching(let from, let to, _) where to.id == id:
            markDead(id, now)
            enter(.connected(from), .streamFailed(to.name, why: why), now, &out)
            considerBetterPath(now, &out)
        default:
            coalesced += 1  // a stream the session has left
        }
    }

    /// A stream can open on `networks` now (a proxy's name gave an address there). An attempt
    /// that could not use the stream on a network it now can gets it at once: a backoff on that
    /// uplink ends with an attempt (within the budget), and an attempt over its UDP races the
    /// stream from now on, as if it had from the start.
    private mutating func streamNetworksChanged(_ networks: Set<NetworkKey>, _ now: Instant, _ out: inout [Effect]) {
        let before = streamNetworks
        streamNetworks = networks
        guard config.stream != nil, let uplink = state.path?.over(.udp),
              let udp = paths.first(where: { $0.id == uplink.id }), networks.contains(NetworkKey(udp)),
              !(before?.contains(NetworkKey(udp)) ?? true) else { return coalesced += 1 }
        switch state {
        case .backingOff:
            guard takeToken(now) else { return coalesced += 1 }
            budget.forgetWait()
            startAttempt(on: udp, .proxyFound(udp.interface), now, &out, handshake: false)
        case .connecting(let path) where path.transport == .udp && raced == nil && deadlines[.race] == nil:
            arm(.race, at: max(now, enteredAt + raceDelay(now)))
        default:
            coalesced += 1
        }
    }

    /// The driver could not bind the socket on path `id`. On the session's path it is not a
    /// verdict on the network (nothing was sent) but on the machine's addresses, which settle
    /// within moments (a secondary address being promoted, an IPv6 address still tentative): the
    /// session is taken off the path at once (never reported on a socket the driver lacks) and
    /// bound again after a short wait, doubled each time, `bindRetries` times, as the same
    /// attempt; then the path is a failed attempt, and the session moves to the next path or
    /// backs off. A candidate or rescue path that cannot be bound is not probed: the session
    /// stays where it is.
    private mutating func bindFailed(on id: Path.ID, why: String, _ now: Instant, _ out: inout [Effect]) {
        // Probes sent on that path went nowhere the session is: a late echo of one proves nothing.
        probes.forget(on: id)
        guard id == socket, !unbound else {
            switch state {
            case .switching(let from, let to, _) where to.id == id:
                markDead(id, now)
                enter(.connected(from), .bindFailed("\(to.name) \(to.source)", why: why, retryIn: nil), now, &out)
                considerBetterPath(now, &out)
            case .probing where rescue?.path.id == id:
                rescue = nil
                coalesced += 1
            default:
                coalesced += 1  // a path the session is not on, or one already refused
            }
            return
        }
        unbound = true
        let path: Path
        let handshake: Bool
        switch state {
        case .connecting(let p) where p.id == id: (path, handshake) = (p, true)
        case .probing(let p, _) where p.id == id, .connected(let p) where p.id == id: (path, handshake) = (p, false)
        default:
            coalesced += 1
            return
        }
        var refused = refusals.flatMap { $0.path.id == id ? $0 : nil } ?? (path: path, count: 0, handshake: handshake)
        refused.count += 1
        refusals = refused
        let name = "\(path.name) \(path.source)"
        guard refused.count <= Self.bindRetries else {
            refusals = nil
            return failed(on: path, .bindFailed(name, why: why, retryIn: nil), now, &out, blameServer: false)
        }
        let wait = Self.bindRetryAfter * (1 << (refused.count - 1))
        arm(.rebind, at: now + wait)
        enter(.backingOff(path.over(.udp)), .bindFailed(name, why: why, retryIn: wait), now, &out)
    }

    /// The other transport over `path`'s uplink to fall back on, when the stream is on: the
    /// stream for a UDP path, unless it failed lately; UDP for a stream path, unless UDP went
    /// unanswered in this very attempt or the network is known to block it (a failed stream
    /// there backs off: trying again at once would only fail again).
    private func otherTransport(of path: Path, _ now: Instant) -> Path? {
        guard config.stream != nil else { return nil }
        let twin = path.over(path.transport == .udp ? .stream : .udp)
        guard !isDead(twin.id, now), twin.id != raced else { return nil }
        if twin.transport == .udp, transports[NetworkKey(path)] == .blocked { return nil }
        if twin.transport == .udp, !paths.contains(where: { $0.id == twin.id }) { return nil }
        return twin
    }

    /// Connected on `path`: what it shows of UDP on its network is remembered, and on the
    /// stream the next UDP re-test is scheduled (kept across the probing a silence brings, so a
    /// lossy stream does not put it off for ever).
    private mutating func connectedOn(_ path: Path, _ now: Instant, _ out: inout [Effect]) {
        guard config.stream != nil else { return }
        let key = NetworkKey(path)
        switch path.transport {
        case .udp:
            transports.learn(.answers, for: key)
            retest = nil
        case .stream:
            if raced == path.id.over(.udp) { transports.learn(.blocked, for: key) }
            streamProven = path.id
            let udp = path.id.over(.udp)
            if retest?.udp != udp { retest = (udp, now + config.udpRetest(after: 0, on: power), 0) }
            if let due = retest?.due { arm(.udpRetest, at: max(due, now)) }
        }
        raced = nil
    }

    /// True when moving from `from` to `to` is the UDP re-test: from the stream to UDP over
    /// the same uplink and source.
    private static func isUDPRetest(from: Path, to: Path) -> Bool {
        from.transport == .stream && to.id == from.id.over(.udp)
    }

    /// `path` as `new` shows it now (its route's metric and gateway), over the same transport.
    private static func refreshed(_ path: Path, in new: [Path]) -> Path? {
        new.first { $0.id == path.id.over(.udp) }.map { $0.over(path.transport) }
    }

    /// An attempt on `path` failed: move to another path at once if one is left, else back off.
    /// `blameServer` false: the failure was the machine's own (a bind it refused), which says
    /// nothing of the server.
    private mutating func failed(on path: Path, _ reason: Reason, _ now: Instant, _ out: inout [Effect],
                                 blameServer: Bool = true) {
        // Every path went silent towards this server (the rescue path's probes too), or it had
        // only this one: the server is the suspect. Another server is tried at once, on the
        // best path, which is not blamed for it. Once attempts back off, a retry goes to the
        // first server not held down and its failure backs off again: the servers are not
        // cycled through between retries.
        // Other uplinks, that is: the other transport over this one is no other path to the server.
        let uplink = path.over(.udp)
        let otherPaths = paths.contains { $0.id != uplink.id && !isDead($0.id, now) }
        let rescueSilent = rescue.map { $0.rtt == nil } ?? false
        if blameServer, rescueSilent || !otherPaths, budget.failures == 0, let next = nextServer(now) {
            return switchServer(to: next, now, &out)
        }
        markDead(path.id, now)
        if let other = paths.first(where: { $0.id != uplink.id && !isDead($0.id, now) }) {
            return attempt(on: other, reason, now, &out, handshake: isHandshaking)
        }
        // No other uplink: the other transport over this one, unless it went unanswered in this
        // very attempt (UDP silent for the race delay, then the stream failed too: the whole
        // network is silent, which may be a portal).
        if let twin = otherTransport(of: path, now) {
            return attempt(on: twin, reason, now, &out, handshake: isHandshaking)
        }
        budget.noteFailure()
        arm(.retry, at: now + backoffWait(now))
        // Backing off is about the uplink: the retry chooses its transport afresh.
        enter(.backingOff(uplink), reason, now, &out)
        checkForPortal(on: uplink, &out)
    }

    /// The backoff's wait after a failed attempt (`ReconnectBudget.backoffWait`).
    private mutating func backoffWait(_ now: Instant) -> Duration { budget.backoffWait(now, inForce, &rng) }

    /// Starts or keeps the debounce for a path that ranks above the current one.
    private mutating func considerBetterPath(_ now: Instant, _ out: inout [Effect]) {
        guard case .connected(let current) = state,
              let better = paths.first(where: { $0.id != current.id && $0.id != rulesWait?.path && Self.isPreferred($0, over: current) })
        else {
            candidate = nil
            if deadlines[.debounce] != nil { cancel(.debounce) }
            return
        }
        if candidate == better.id, deadlines[.debounce] != nil {
            coalesced += 1
            return
        }
        candidate = better.id
        let quietUntil = now + holdDown(for: better, now)
        let due = dead[better.id].map { max($0.until, quietUntil) } ?? quietUntil
        arm(.debounce, at: due)
    }

    /// The debounce for a new path; for an interface lost recently the flap hold-down, doubled
    /// for every further recent loss: a flapping uplink must stay up longer before the session
    /// trusts it again.
    /// It never exceeds `flapStableAfter`: by then the interface counts as stable again.
    private func holdDown(for path: Path, _ now: Instant) -> Duration {
        guard let loss = flaps.recent(path.interface, now, window: config.flapWindow) else { return config.debounce }
        let damped = min(config.flapStableAfter, config.flapHoldDown * (1 << min(loss.count - 1, 20)))
        return max(config.debounce, damped)
    }

    // MARK: Path MTU

    /// The echo of a probe padded to `size`.
    private mutating func sizeProbeReply(on id: Path.ID, size: Int, rtt: Duration, _ now: Instant, _ out: inout [Effect]) {
        if case .switching(_, let to, _) = state, to.id == id, tooSmall.contains(id) {
            // A path found too small carries the smallest tunnel packet again: a candidate like any.
            guard size >= floorMTU else { return noteHeard(now) }
            tooSmall.remove(id)
            return probeReply(on: id, rtt: rtt, now, &out)
        }
        noteHeard(now)
        if size >= floorMTU { tooSmall.remove(id) }
        guard var current = mtu, current.path == id, case .connected(let path) = state, path.id == id else { return }
        current.search.answered(size)
        let roundOver = !current.search.inFlight.isEmpty
            && current.search.inFlight.allSatisfy { $0 <= (current.search.confirmed ?? 0) }
        mtu = current
        // Mid-search the MTU changes only at a round's end (each change disturbs TCP's flows).
        if current.search.isDone { applyPathMTU(on: path, now, &out) }
        // Every size of the round came back: the next round need not wait out the probe wait.
        if roundOver, deadlines[.pathMTU] != nil, !current.search.isDone {
            pathMTUTimer(on: path, now, &out, force: true)
        } else if current.search.isDone, current.roundStart != nil {
            finishPathMTU(on: path, now, &out)
        }
    }

    /// The session is connected on `path`: the path's MTU search starts (a new path), goes on
    /// (it was paused while the session was not connected), or waits for its next look upward.
    private mutating func continuePathMTU(on path: Path, _ now: Instant, _ out: inout [Effect]) {
        // A stream carries tunnel packets of any size (TCP cuts them): nothing to search for.
        guard config.pathMTUDiscovery, sizedProbes, floorMTU < config.maxMTU, path.transport == .udp else { return }
        if mtu?.path != path.id {
            mtu = (path.id, PathMTUSearch(floor: floorMTU, ceiling: config.maxMTU), nil, nil)
        }
        guard let current = mtu else { return }
        if current.search.isDone {
            // The look for a bigger MTU, when it is due; at once if it fell due meanwhile.
            if let raise = current.raiseAt { arm(.pathMTU, at: max(raise, now)) }
        } else {
            startPathMTURound(on: path, now, &out)
        }
    }

    /// The round's wait is over (or every echo of it came back, `force`), or it is time to look
    /// for a bigger MTU.
    private mutating func pathMTUTimer(on path: Path, _ now: Instant, _ out: inout [Effect], force: Bool = false) {
        guard var current = mtu, current.path == path.id else { return continuePathMTU(on: path, now, &out) }
        if current.search.isDone {
            // Time to see whether the path grew: the ceiling is asked again, and what is known
            // stands if it still fails.
            let known = current.search.tooBig ?? tunnelMTU + PathMTUSearch.granularity
            mtu = (path.id, .raise(floor: floorMTU, ceiling: config.maxMTU, current: tunnelMTU, tooBig: known), nil, nil)
            return startPathMTURound(on: path, now, &out)
        }
        let heard = current.roundStart.flatMap { start in session.map { $0.lastHeard >= start } } ?? false
        // A size is too big after as many unanswered rounds as the path's loss calls for before
        // it is dead, and at least three (as RFC 8899's MAX_PROBES): one lost probe is no verdict.
        current.search.endRound(heard: force || heard, misses: probesBeforeDead(after: 0, atLeast: 3))
        current.roundStart = nil
        mtu = current
        if current.search.isTooSmall { return pathTooSmall(path, now, &out) }
        applyPathMTU(on: path, now, &out)
        if current.search.isDone { return finishPathMTU(on: path, now, &out) }
        if current.search.silentRounds >= 3 {
            // Nothing heard for three rounds: the path's liveness rules deal with that; the
            // search looks again later.
            mtu?.raiseAt = now + config.mtuRaiseAfter
            mtu?.search = .raise(floor: floorMTU, ceiling: config.maxMTU, current: tunnelMTU, tooBig: current.search.tooBig)
            return arm(.pathMTU, at: now + config.mtuRaiseAfter)
        }
        startPathMTURound(on: path, now, &out)
    }

    /// Sends a round of size probes on the session's path, and a small probe with them when the
    /// server has not been heard lately: its echo tells a lost size from a silent path.
    private mutating func startPathMTURound(on path: Path, _ now: Instant, _ out: inout [Effect]) {
        guard var current = mtu else { return }
        let sizes = current.search.startRound()
        guard !sizes.isEmpty else { return finishPathMTU(on: path, now, &out) }
        let wait = max(config.probeTimeout, patience(now))
        for size in sizes { sendSizeProbe(size, via: path, &out) }
        if let session, now - session.lastHeard >= wait { sendProbe(via: path, &out) }
        current.roundStart = now
        mtu = current
        arm(.pathMTU, at: now + wait)
    }

    /// The search is over: the next look for a bigger MTU, if the path is smaller than the tunnel's.
    private mutating func finishPathMTU(on path: Path, _ now: Instant, _ out: inout [Effect]) {
        mtu?.roundStart = nil
        if tunnelMTU < config.maxMTU {
            let raise = now + config.mtuRaiseAfter
            mtu?.raiseAt = raise
            arm(.pathMTU, at: raise)
        } else {
            mtu?.raiseAt = nil
            if deadlines[.pathMTU] != nil { cancel(.pathMTU) }
        }
    }

    /// Sets the tunnel's MTU to what the search found, when it found something: lower as soon
    /// as a size failed (full packets are lost meanwhile), higher once the search is over.
    private mutating func applyPathMTU(on path: Path, _ now: Instant, _ out: inout [Effect]) {
        guard let search = mtu?.search, let found = search.found, found != tunnelMTU, found < tunnelMTU || search.isDone
        else { return }
        tunnelMTU = found
        out.append(.setTunnelMTU(found))
    }

    /// The path carries small probes but not the smallest tunnel packet: it is broken for the
    /// tunnel. Another path takes the session if there is one; else the tunnel stays at its
    /// smallest MTU here and looks again later.
    private mutating func pathTooSmall(_ path: Path, _ now: Instant, _ out: inout [Effect]) {
        if tunnelMTU != floorMTU {
            tunnelMTU = floorMTU
            out.append(.setTunnelMTU(floorMTU))
        }
        let reason = Reason.pathTooSmall(path.interface, mtu: floorMTU)
        tooSmall.insert(path.id)
        if let other = paths.first(where: { $0.id != path.id && !isDead($0.id, now) }) {
            mtu = nil
            markDead(path.id, now)
            return attempt(on: other, reason, now, &out)
        }
        // The finished search stays: a return to connected (a silence a small probe ended) waits
        // for the look upward, which asks the smallest size again.
        mtu?.raiseAt = now + config.mtuRaiseAfter
        arm(.pathMTU, at: now + config.mtuRaiseAfter)
        out.append(.reportFailure(reason))
    }

    // MARK: Bookkeeping

    /// The driver's clock went back (CLOCK_BOOTTIME never does, but a clock that can must not
    /// freeze the budget or stretch every hold-down by the step): everything remembered moves
    /// with it, and armed timers keep the waits they had.
    private mutating func clockStepped(by step: Duration, _ out: inout [Effect]) {
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

    private mutating func enter(_ new: State, _ reason: Reason, _ now: Instant, _ out: inout [Effect]) {
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
        if !Self.allows(new, .debounce) { candidate = nil }
        if !Self.allows(new, .handover) { dropHandover(&out) }
        if portalWindowUntil != nil, !Self.allows(new, .portalWindow) {
            // Leaving the portal (it opened, the network changed, a suspend): the lockdown is whole.
            portalWindowUntil = nil
            out.append(.closePortalWindow)
        }
        if case .probing = new {} else {
            rescue = nil
            suspectedByLiveness = false
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
        switch (new, reason) {
        case (_, .onDemandWaits): heldForRules = true
        case (.disconnected, .onDemand): heldForRules = false  // the rules decided: held by them now
        case (.disconnected, _): break
        default: heldForRules = false
        }
        out.append(.transition(transition))
        if case .connected(let path) = new {
            connectedOn(path, now, &out)
            continuePathMTU(on: path, now, &out)
        }
    }

    /// Which timers may stay armed in a state; entering a state cancels the rest, so
    /// offline, sleeping and failed never keep a timer.
    private static func allows(_ state: State, _ kind: TimerKind) -> Bool {
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
    private mutating func arm(_ kind: TimerKind, at due: Instant) {
        deadlines[kind] = due
    }

    private mutating func cancel(_ kind: TimerKind) {
        deadlines[kind] = nil
    }

    /// Sends a probe and waits for its echo: the path's patience (at least `probeTimeout`),
    /// doubled for each probe in a row before it, as TCP backs off its retransmissions.
    /// The doubling stops at the wait of the last probe a clean path gets: a lossy path's
    /// further probes are about loss, not about a queue that needs more time.
    private mutating func probe(_ path: Path, _ now: Instant, _ out: inout [Effect], attempt: Int = 1) {
        if tooSmall.contains(path.id), path.id != socket {
            // A small echo proved nothing on this path before: only the smallest tunnel packet does.
            sendSizeProbe(floorMTU, via: path, &out)
        } else {
            sendProbe(via: path, &out)
        }
        let doublings = min(attempt - 1, max(config.probeAttempts - 1, 0), 4)
        var wait = max(config.probeTimeout, patience(now)) * (1 << doublings)
        // A stream being opened takes two round trips (TCP, TLS) before the probe goes out.
        if path.transport == .stream, streamProven != path.id { wait = wait * 3 }
        arm(.probe, at: now + wait)
    }

    /// Every small probe goes out through here: those on the session's path count for its loss.
    private mutating func sendProbe(via path: Path, _ out: inout [Effect]) {
        out.append(.probe(id: probes.remember(path.id, size: nil), via: path, size: nil))
        guard path.id == socket else { return }
        probeRecord.sent += 1
        if probeRecord.sent >= 32 { probeRecord = (probeRecord.sent / 2, probeRecord.answered / 2) }
    }

    /// A probe padded to stand for a tunnel packet of `size` bytes: only an echo as big proves
    /// that the path carries one.
    private mutating func sendSizeProbe(_ size: Int, via path: Path, _ out: inout [Effect]) {
        sizeProbes += 1
        out.append(.probe(id: probes.remember(path.id, size: size), via: path, size: size))
    }

    /// Ends the session with a goodbye: echoes still on their way prove nothing of the next one.
    private mutating func goodbye(_ out: inout [Effect]) {
        probes.removeAll()
        out.append(.disconnect)
    }

    /// Unanswered probes in a row that make the session's path dead, after `sent` of them in
    /// this round: `probeAttempts` on a path that lost none of its probes before; on one that
    /// lost a share `p` of them (with two answered ones assumed, so that a short history does
    /// not look lossier than it is), the fewest `n` with `p^n` under 1 %, so loss alone makes a
    /// wrong verdict rare (at most `maxProbeAttempts`).
    private func probesBeforeDead(after sent: Int, atLeast fewest: Int? = nil) -> Int {
        let before = max(probeRecord.sent - sent, 0)
        let answered = min(probeRecord.answered, before)
        let fewest = fewest ?? max(config.probeAttempts, 1)
        guard answered > 0, before > answered else { return fewest }
        let loss = Double(before - answered) / Double(before + 2)
        var n = 1
        var chance = loss
        while chance >= 0.01 && n < config.maxProbeAttempts {
            chance *= loss
            n += 1
        }
        return max(fewest, n)
    }

    /// Resends the handshake in flight after the path's patience (at least `handshakeResend`),
    /// doubled per resend, while that is before the attempt's own timeout.
    private mutating func armResend(_ now: Instant, _ out: inout [Effect]) {
        guard let timeout = deadlines[.handshake] else { return }
        let due = now + max(config.handshakeResend, patience(now)) * (1 << min(resends, 10))
        if due < timeout { arm(.resend, at: due) }
    }

    /// How long an answer may take on the session's path before its absence means something
    /// (`RTTEstimator.patience`).
    private func patience(_ now: Instant) -> Duration { rtt.patience(now, staleAfter: config.rttStaleAfter) }

    /// Data unanswered this long makes the path suspect.
    private func livenessWait(_ now: Instant) -> Duration {
        max(config.livenessTimeout, patience(now) * 2) * (1 << quietProofs)
    }

    /// The interface's losses when the flap damping counts it as flapping now (`isFlapping`):
    /// how many, since when. What the operator is told of a flap is decided by the same rule.
    public func flapping(_ interface: String, _ now: Instant) -> (losses: Int, since: Instant)? {
        flaps.flapping(interface, now, window: config.flapWindow, stableAfter: config.flapStableAfter)
    }

    /// The link flaps (`FlapRecord.isFlapping`, under `flapWindow` and `flapStableAfter`).
    private func isFlapping(_ interface: String, _ now: Instant) -> Bool {
        flaps.isFlapping(interface, now, window: config.flapWindow, stableAfter: config.flapStableAfter)
    }

    private mutating func moveSocket(to path: Path, _ reason: Reason, _ out: inout [Effect]) {
        guard socket != path.id || unbound else { return }
        if socket != path.id { probeRecord = (0, 0) }  // another path's losses are its own
        out.append(.bind(path, first: socket == nil, reason: reason))
        socket = path.id
        unbound = false
    }

    /// `path` (a backoff's uplink) over the transport the driver's socket on that uplink has:
    /// what an answer arriving while backing off came over.
    private func onSocket(_ path: Path) -> Path {
        guard let socket, socket.over(.udp) == path.id.over(.udp) else { return path }
        return path.over(socket.transport)
    }

    private func isSessionFresh(_ now: Instant) -> Bool {
        guard let session else { return false }
        return now - session.lastHeard < config.sessionLifetime
    }

    /// An authenticated answer on the session's keys: the server has the session, whatever a
    /// hint said.
    private mutating func noteHeard(_ now: Instant) {
        if session != nil { session?.lastHeard = now }
        if checkingHint {
            checkingHint = false
            disprovedHints += 1
            hintsIgnoredUntil = now + Self.hintHoldDown
        }
    }

    /// One RTT sample of the session's path (`RTTEstimator.sample`).
    private mutating func sampleRTT(_ sample: Duration, _ now: Instant, newPath: Bool = false) {
        rtt.sample(sample, now, staleAfter: config.rttStaleAfter, newPath: newPath)
    }

    /// Counts a path's disappearance against its interface, whether or not the session used it.
    private mutating func noteLoss(of path: Path, _ now: Instant) {
        flaps.noteLoss(of: path.interface, now, window: config.flapWindow)
    }

    private func isDead(_ id: Path.ID, _ now: Instant) -> Bool {
        if id.transport == .stream, let networks = streamNetworks,
           !paths.contains(where: { $0.id == id.over(.udp) && networks.contains(NetworkKey($0)) }) {
            return true  // no stream opens on that network
        }
        return dead.isHeld(id, now)
    }

    private mutating func markDead(_ id: Path.ID, _ now: Instant) {
        dead.strike(id, now, base: config.deadPathHoldDown, cap: config.maxHoldDown)
    }

    /// The budget in force: the configuration's for the power source now.
    private var inForce: Config.Budget { config.budget(on: power) }

    private mutating func takeToken(_ now: Instant) -> Bool { budget.take(now, inForce) }

    private func nextToken() -> Instant { budget.nextToken(inForce) }
}

/// One optional deadline per timer kind, without hashing on the hot path.
private struct TimerTable: Sendable {
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
