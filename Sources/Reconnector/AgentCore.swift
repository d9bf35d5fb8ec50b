public import PathMonitor

/// A fact the agent learns, from the network, the data plane, the machine, an operator or a
/// timer. Nothing here is a command.
public enum AgentEvent: Equatable, Sendable {
    /// The ranked usable paths to the server changed significantly (best first; empty = none).
    case paths([Path])
    /// The machine is about to suspend.
    case sleep
    /// The machine resumed after `sleptFor` (also for a suspend nobody announced).
    case wake(sleptFor: Duration)
    /// The machine switched between mains and battery.
    case powerChanged(PowerSource)
    /// The echo of probe `id` (see `Effect.probe`) came back after `rtt`, `size` bytes of
    /// tunnel packet big (nil: a small echo).
    case probeEcho(id: UInt64, rtt: Duration, size: Int?)
    /// The handshake completed: the session has fresh keys (see `Input.handshakeSucceeded`).
    case handshakeCompleted(rtt: Duration, sizedProbes: Bool, carriesIPv6: Bool)
    /// The server refused this client's key or credentials.
    case handshakeRejected
    /// The server said, unauthenticated, that it holds no session for us.
    case sessionUnknown
    /// The data plane sent data and waits for an answer (see `LivenessNotices`).
    case dataSent
    /// Authenticated data arrived from the server (see `LivenessNotices`).
    case dataReceived
    /// The current server said, authenticated, that it is being taken down.
    case serverDraining
    /// The session with the server a handover goes to is ready.
    case handoverReady(rtt: Duration, sizedProbes: Bool, carriesIPv6: Bool)
    /// The server a handover goes to refused it.
    case handoverRejected
    /// What a connectivity check over the path `on` found.
    case connectivity(Connectivity, on: Path.ID)
    /// A timer the core keeps (see `AgentCore.timers`) is due.
    case timerFired(TimerKind)
    /// What the on-demand rules decided for the best path's network.
    case onDemand(OnDemandDecision)
    /// The server's name resolves to another address now, which the session follows.
    case serverMoved
    /// The tunnel device could not be set up for the session that just came up: why.
    case tunnelFailed(String)
    /// An operator's request.
    case request(Request)

    /// Short name of the event, as the `trigger` of a log line.
    public var name: String {
        switch self {
        case .paths: "paths"
        case .sleep: "sleep"
        case .wake: "wake"
        case .powerChanged: "power"
        case .probeEcho: "probe-reply"
        case .handshakeCompleted: "handshake-ok"
        case .handshakeRejected, .sessionUnknown: "handshake-failed"
        case .dataSent: "data-sent"
        case .dataReceived: "data-received"
        case .serverDraining: "server-draining"
        case .handoverReady: "handover-ready"
        case .handoverRejected: "handover-rejected"
        case .connectivity: "connectivity-check"
        case .timerFired(let kind): "timer:\(kind.rawValue)"
        case .onDemand: "on-demand"
        case .serverMoved: "server-moved"
        case .tunnelFailed: "tunnel-failed"
        case .request(.reconnect): "operator"
        case .request(.pause): "operator-down"
        case .request(.resume): "operator-up"
        case .request(.openPortalWindow): "portal-window"
        case .request(.closePortalWindow): "portal-window-closed"
        case .request(.stop): "stop"
        }
    }

    /// What an operator may ask of a running agent.
    public enum Request: Equatable, Sendable {
        /// Fresh keys now (`agent reconnect`).
        case reconnect
        /// The tunnel down without stopping the agent (`agent down`), and up again.
        case pause, resume
        /// A portal window opens (`agent portal`), or closes.
        case openPortalWindow, closePortalWindow
        /// The agent stops: nothing is decided after this.
        case stop
    }
}

/// Why the agent gives up and exits, for the operator and the exit status.
public enum GiveUp: Equatable, Sendable {
    /// Before the tunnel ever came up, attempts on a usable path went unanswered this long
    /// (over `interface`, when the session has a path).
    case noAnswer(after: Duration, interface: String?)
    /// Before the tunnel ever came up, the server refused this client.
    case rejected
    /// The tunnel device could not be set up.
    case tunnelFailed(String)
}

/// A command for whoever runs the core: the daemon's sockets, firewall and resolvers, or a
/// replay's world. Each is carried out in order; what one produces comes back as an
/// `AgentEvent`, never by the core reading the runner's state.
public enum Effect: Equatable, Sendable {
    /// Open the session's socket on `path` (`first`), or move the session there with its keys.
    case bind(Path, first: Bool, reason: Reason)
    /// Send a handshake initiation for fresh keys on `path`.
    case handshake(on: Path, reason: Reason)
    /// Send the handshake in flight on `path` again: a fresh initiation within the attempt.
    case resendHandshake(on: Path)
    /// Send authenticated probe `id` on `path`; padded to stand for a tunnel packet of `size`
    /// bytes when given (the server's echo is as big). Its echo comes back as `probeEcho`.
    case probe(id: UInt64, via: Path, size: Int?)
    /// Set the tunnel device's MTU.
    case setTunnelMTU(Int)
    /// The tunnel cannot come up without an operator (the agent keeps running).
    case reportFailure(Reason)
    /// One state change, for the operator's log, status and metrics.
    case transition(Transition)
    /// Talk to server `index` of the list from now on; its session starts with the next handshake.
    case useServer(Int)
    /// Handshake with server `index` over the session's socket on `path`, keeping the current session.
    case prepareHandover(server: Int, on: Path)
    /// The prepared session takes the traffic; the old server is told goodbye.
    case completeHandover
    /// The prepared session is forgotten.
    case cancelHandover
    /// The session ends with a goodbye; the tunnel device and the lockdown stay.
    case disconnect
    /// One connectivity check over `path`, outside the tunnel; its result comes back as
    /// `AgentEvent.connectivity`.
    case checkConnectivity(via: Path)
    /// Let the portal window's process tree through the lockdown on `path` (and to the login
    /// page at `portal`) until `until`.
    case openPortalWindow(via: Path, portal: String, until: Instant)
    /// The lockdown is whole again.
    case closePortalWindow
    /// An on-demand rule trusts the network on `interface`: the lockdown, the tunnel's routes
    /// and its resolvers step aside.
    case liftLockdown(interface: String)
    /// The lockdown, the tunnel's routes and its resolvers are back.
    case restoreLockdown
    /// As a service, the agent is ready: the tunnel is up, or there is nothing to wait for (no
    /// network, or a rule keeps the tunnel down). Given once.
    case ready
    /// The agent cannot go on: it ends, for its service manager to start it again.
    case giveUp(GiveUp)
}

/// The agent's decisions, in one pure place: events and the time go in, effects come out.
/// The daemon runs it on the real clock with real sockets, and a replay on a virtual clock with
/// a simulated world; both carry out the same effects, and feed back what they produce.
///
/// Around the session's state machine (`Reconnector`) it keeps what lies between the machine
/// and its runner: which path each probe in flight went on (an echo names only its id), the
/// start-up deadline, and that a stopping agent decides nothing more.
public struct AgentCore: Sendable {
    /// The session's state machine.
    public var machine: Reconnector
    /// Probes in flight: an echo for an id not here (stale, from before the server moved, or
    /// made up) proves nothing.
    private var probes: [UInt64: (path: Path.ID, size: Int?)] = [:]
    private var nextProbe: UInt64 = 1
    /// At most this many probes are remembered; the oldest is forgotten first.
    static let probesKept = 64
    /// The agent is stopping, or gave up: nothing is decided any more.
    public private(set) var stopped = false
    /// The tunnel came up once (a handshake completed): the start-up deadline no longer applies.
    public private(set) var tunnelUp = false
    /// Before the tunnel first comes up, how long attempts on a usable path may go unanswered
    /// before the agent gives up (nil: it waits for ever); time without a path does not count.
    public let startupWait: Duration?
    /// Since when attempts have gone unanswered, before the tunnel first came up.
    private var unansweredSince: Instant?
    /// The service was told it is ready.
    private var announcedReady = false

    public init(_ machine: Reconnector, startupWait: Duration? = nil) {
        self.machine = machine
        self.startupWait = startupWait
    }

    /// Every timer the core keeps, the machine's and its own: the runner feeds
    /// `.timerFired(kind)` once `now` reaches one.
    public var timers: [TimerKind: Instant] {
        guard !stopped else { return [:] }
        var all = machine.timers
        if let giveUpAt { all[.startup] = giveUpAt }
        return all
    }

    /// The earliest of `timers`.
    public var nextDeadline: Instant? {
        guard !stopped else { return nil }
        guard let giveUpAt else { return machine.nextDeadline }
        return machine.nextDeadline.map { min($0, giveUpAt) } ?? giveUpAt
    }

    private var giveUpAt: Instant? {
        guard !tunnelUp, let unansweredSince, let startupWait else { return nil }
        return unansweredSince + startupWait
    }

    /// Decides what `event` at `now` calls for. Once stopped, nothing: whatever comes after the
    /// stop (a SIGCONT a service manager sends, a timer) must not move a session whose goodbye
    /// is on its way.
    public mutating func handle(_ event: AgentEvent, now: Instant) -> [Effect] {
        guard !stopped else { return [] }
        var out: [Effect] = []
        switch event {
        case .paths(let paths): run(.paths(paths), now, &out)
        case .sleep: run(.sleep, now, &out)
        case .wake(let slept):
            unansweredSince = nil  // the time asleep was no time without an answer
            run(.wake(sleptFor: slept), now, &out)
        case .powerChanged(let source): run(.powerChanged(source), now, &out)
        case .probeEcho(let id, let rtt, let size):
            guard let probe = probes.removeValue(forKey: id) else { break }
            if let wanted = probe.size {
                // A size probe's echo counts only if it is as big as the probe: a server that
                // echoed it short proved nothing.
                guard let size, size >= wanted else { break }
                run(.sizeProbeReply(on: probe.path, size: wanted, rtt: rtt), now, &out)
            } else {
                run(.probeReply(on: probe.path, rtt: rtt), now, &out)
            }
        case .handshakeCompleted(let rtt, let sized, let v6):
            tunnelUp = true
            ready(&out)
            run(.handshakeSucceeded(rtt: rtt, sizedProbes: sized, carriesIPv6: v6), now, &out)
        case .handshakeRejected:
            guard tunnelUp else { return giveUp(.rejected) }
            run(.handshakeFailed(.rejected("the server refused this client's key or credentials")), now, &out)
        case .sessionUnknown: run(.handshakeFailed(.sessionUnknown), now, &out)
        case .dataSent: run(.dataSent, now, &out)
        case .dataReceived: run(.dataReceived, now, &out)
        case .serverDraining: run(.serverDraining, now, &out)
        case .handoverReady(let rtt, let sized, let v6):
            run(.handoverReady(rtt: rtt, sizedProbes: sized, carriesIPv6: v6), now, &out)
        case .handoverRejected: run(.handoverRejected, now, &out)
        case .connectivity(let result, let path): run(.connectivity(result, on: path), now, &out)
        case .timerFired(.startup):
            guard let due = giveUpAt, due <= now else { break }
            return giveUp(.noAnswer(after: startupWait ?? .zero, interface: machine.state.path?.interface))
        case .timerFired(let kind): run(.timerFired(kind), now, &out)
        case .onDemand(let decision): run(.onDemand(decision), now, &out)
        case .serverMoved:
            probes.removeAll()  // an echo from the old address proves nothing about the new one
            run(.serverMoved, now, &out)
        case .tunnelFailed(let why): return giveUp(.tunnelFailed(why))
        case .request(.reconnect): run(.reconnectRequested, now, &out)
        case .request(.pause): run(.pause, now, &out)
        case .request(.resume): run(.resume, now, &out)
        case .request(.openPortalWindow): run(.openPortalWindow, now, &out)
        case .request(.closePortalWindow): run(.closePortalWindow, now, &out)
        case .request(.stop): stopped = true
        }
        return out
    }

    /// The server's address moved under the session (its name resolves elsewhere, or the
    /// uplinks changed family): a probe's echo from the old address proves nothing.
    public mutating func forgetProbes() { probes.removeAll() }

    private mutating func giveUp(_ why: GiveUp) -> [Effect] {
        stopped = true
        return [.giveUp(why)]
    }

    private mutating func ready(_ out: inout [Effect]) {
        guard !announcedReady else { return }
        announcedReady = true
        out.append(.ready)
    }

    /// Feeds `input` to the machine and turns its actions into effects, in order.
    private mutating func run(_ input: Input, _ now: Instant, _ out: inout [Effect]) {
        let actions = machine.handle(input, now: now)
        var attempted = false
        for action in actions {
            switch action {
            case .bind(let path, let why):
                attempted = true
                out.append(.bind(path, first: true, reason: why))
            case .rebind(let path, let why):
                attempted = true
                out.append(.bind(path, first: false, reason: why))
            case .handshake(let path, let why):
                attempted = true
                out.append(.handshake(on: path, reason: why))
            case .resendHandshake(let path): out.append(.resendHandshake(on: path))
            case .probe(let path): out.append(.probe(id: remember(path, size: nil), via: path, size: nil))
            case .probeSize(let size, let path): out.append(.probe(id: remember(path, size: size), via: path, size: size))
            case .setTunnelMTU(let mtu, _): out.append(.setTunnelMTU(mtu))
            case .reportFailure(let reason): out.append(.reportFailure(reason))
            case .report(let transition): out.append(.transition(transition))
            case .useServer(let index, _):
                // Echoes still on their way come from the old server: they prove nothing now.
                probes.removeAll()
                out.append(.useServer(index))
            case .prepareHandover(let index, let path): out.append(.prepareHandover(server: index, on: path))
            case .completeHandover:
                probes.removeAll()
                out.append(.completeHandover)
            case .cancelHandover: out.append(.cancelHandover)
            case .disconnect:
                probes.removeAll()
                out.append(.disconnect)
            case .checkConnectivity(let path): out.append(.checkConnectivity(via: path))
            case .openPortalWindow(let path, let url, let until): out.append(.openPortalWindow(via: path, portal: url, until: until))
            case .closePortalWindow: out.append(.closePortalWindow)
            case .liftLockdown(let interface): out.append(.liftLockdown(interface: interface))
            case .restoreLockdown: out.append(.restoreLockdown)
            // Timers are read from `timers`; a quiesce needs nothing of a runner whose probes
            // and handshakes are all the core's.
            case .armTimer, .cancelTimer, .quiesce: break
            }
        }
        if attempted, !tunnelUp, unansweredSince == nil { unansweredSince = now }
        switch machine.state {
        case .offline, .disconnected, .portal:
            // No path, a rule keeps the tunnel down, or the network holds everything back until
            // a user logs in: nothing the server could answer, and nothing a boot should wait for.
            unansweredSince = nil
            ready(&out)
        case .sleeping: unansweredSince = nil
        default: break
        }
    }

    /// A new probe's id, remembered with the path it goes on and its size.
    private mutating func remember(_ path: Path, size: Int?) -> UInt64 {
        let id = nextProbe
        nextProbe += 1
        probes[id] = (path.id, size)
        if probes.count > Self.probesKept, let oldest = probes.keys.min() { probes[oldest] = nil }
        return id
    }
}
