public import Topology
public import Basics

/// Why a handshake did not produce a session.
public enum HandshakeFailure: Equatable, Sendable {
    /// No response within the handshake timeout.
    case timeout
    /// The server refused our credentials or key; retrying cannot help.
    case rejected(String)
    /// The server says it holds no session for us (it restarted): the keys are dead.
    case sessionUnknown
}

/// A fact the state machine learns. Nothing here is a command.
public enum Input: Equatable, Sendable {
    /// The ranked usable paths to the server changed significantly (best first; empty = none).
    case paths([Path])
    /// The machine is about to suspend.
    case sleep
    /// The machine resumed after `sleptFor`; also sent for a suspend nobody announced.
    case wake(sleptFor: Duration)
    /// A probe echo came back over the path `on` (see `Reconnector.echo(of:rtt:size:)`).
    case probeReply(on: Path.ID, rtt: Duration)
    /// The echo of a probe padded to `size` (see `Effect.probe`) came back over the path `on`.
    case sizeProbeReply(on: Path.ID, size: Int, rtt: Duration)
    /// The handshake completed; the session has fresh keys. `sizedProbes`: the server said it
    /// echoes padded probes at their size, so the path's MTU can be discovered. `carriesIPv6`:
    /// the tunnel has an IPv6 address, so its MTU stays at 1,280 or above (`Config.mtuFloor`).
    case handshakeSucceeded(rtt: Duration, sizedProbes: Bool = false, carriesIPv6: Bool = true)
    /// The handshake or the session failed.
    case handshakeFailed(HandshakeFailure)
    /// The tunnel sent a data packet to the server.
    case dataSent
    /// An authenticated packet arrived from the server.
    case dataReceived
    /// A timer the machine keeps (`Reconnector.timers`) is due.
    case timerFired(TimerKind)
    /// The machine switched between mains and battery.
    case powerChanged(PowerSource)
    /// An operator asked for a fresh connection (`agent reconnect`).
    case reconnectRequested
    /// The server's name resolves to another address now: the session's peer has moved.
    case serverMoved
    /// The current server said, authenticated, that it is being taken down: its sessions should
    /// move to another server now, while it still carries them.
    case serverDraining
    /// The handshake with the server the session moves to (see `Effect.prepareHandover`)
    /// completed; the current session still carries the traffic.
    case handoverReady(rtt: Duration, sizedProbes: Bool = false, carriesIPv6: Bool = true)
    /// The server the session was to move to refused it.
    case handoverRejected
    /// An operator took the tunnel down without stopping the agent (`agent down`).
    case pause
    /// An operator brought it back up (`agent up` on the running agent).
    case resume
    /// What a connectivity check over the path `on` found (see `Effect.checkConnectivity`).
    case connectivity(Connectivity, on: Path.ID)
    /// An operator asked for a portal window (`agent portal`): for a while, one process tree
    /// may reach the network directly to log in.
    case openPortalWindow
    /// The process the window was opened for ended, or its operator closed the window.
    case closePortalWindow
    /// The lockdown did not let the window just asked for through: none stands.
    case portalWindowRefused
    /// What the on-demand rules decided for the network of the best path (or that they wait
    /// for a fact about it).
    case onDemand(OnDemandDecision)
    /// The stream on path `on` (a `.stream` path) could not be opened or broke: connection
    /// refused, the proxy refused or asked for credentials, TLS failed, a reset mid-session.
    /// The runner opens a new one the next time the core sends over that path.
    case streamFailed(on: Path.ID, why: String)
    /// The driver could not open or bind the socket on path `on` (its address is not the
    /// machine's, or not yet, or no longer: `EADDRNOTAVAIL` while the kernel promotes a secondary
    /// address or an IPv6 address is tentative), and why: nothing was sent on that path, and the
    /// session is not there.
    case bindFailed(on: Path.ID, why: String)
    /// The lockdown could not be lifted as a rule asked (nftables refused), and why: it stays
    /// whole, and the tunnel stays down as the rule said.
    case liftRefused(why: String)
    /// The tunnel device kept MTU `actual` where `Effect.setTunnelMTU` asked for another (the
    /// kernel refused): the machine knows the device as it is, and a search that finds another
    /// size asks again.
    case tunnelMTUFailed(actual: Int)
    /// The networks a stream can open on now, when that depends on the network: the HTTP
    /// proxy is named by host, and these are the networks whose look-up of its name gave an
    /// address the lockdown lets the streams reach (see `ProxyBook`).
    case streamNetworks(Set<NetworkKey>)
    /// The servers of the list (by index) whose names gave no address the session may use yet:
    /// a failover passes them while another has one (see `AgentCore`'s `ServerBook`).
    case serversWithoutAddress(Set<Int>)

    /// Short name of the input, as the `trigger` of a log line.
    public var name: String {
        switch self {
        case .paths: "paths"
        case .sleep: "sleep"
        case .wake: "wake"
        case .probeReply: "probe-reply"
        case .sizeProbeReply: "size-probe-reply"
        case .handshakeSucceeded: "handshake-ok"
        case .handshakeFailed: "handshake-failed"
        case .dataSent: "data-sent"
        case .dataReceived: "data-received"
        case .timerFired(let kind): "timer:\(kind.rawValue)"
        case .powerChanged: "power"
        case .reconnectRequested: "operator"
        case .serverMoved: "server-moved"
        case .serverDraining: "server-draining"
        case .handoverReady: "handover-ready"
        case .handoverRejected: "handover-rejected"
        case .pause: "operator-down"
        case .resume: "operator-up"
        case .connectivity: "connectivity-check"
        case .openPortalWindow: "portal-window"
        case .closePortalWindow: "portal-window-closed"
        case .portalWindowRefused: "portal-window-refused"
        case .onDemand: "on-demand"
        case .streamFailed: "stream-failed"
        case .bindFailed: "bind-failed"
        case .streamNetworks: "stream-networks"
        case .serversWithoutAddress: "servers-without-address"
        case .liftRefused: "lift-refused"
        case .tunnelMTUFailed: "tunnel-mtu-failed"
        }
    }
}

/// The timers the state machine asks the driver to keep; at most one of each kind.
public enum TimerKind: String, CaseIterable, Sendable {
    /// A better path has been quiet long enough to try.
    case debounce
    /// The handshake in flight took too long.
    case handshake
    /// The handshake's initiation (or its answer) may be lost: send it again within the attempt.
    case resend
    /// The last probe went unanswered.
    case probe
    /// Data went out and nothing came back.
    case liveness
    /// Backoff is over; try again.
    case retry
    /// The handshake with the server a session moves to took too long.
    case handover
    /// Behind a captive portal: time for the next connectivity check.
    case recheck
    /// A portal window's time is up.
    case portalWindow = "portal-window"
    /// A round of path MTU probes is over, or it is time to see whether the path grew.
    case pathMTU = "path-mtu"
    /// Before the tunnel first came up, attempts went unanswered too long: the agent gives up
    /// (kept by `AgentCore`, never by the state machine).
    case startup
    /// While the agent backs off, time to ask the server's name again (kept by `AgentCore`).
    case lookUp = "look-up"
    /// The on-demand rules wait for a gateway's entry or a network's search domains: time to
    /// look again, or to stop waiting (kept by `AgentCore`).
    case onDemand = "on-demand"
    /// A fight over something others keep taking away is held off: time to put it back once
    /// (kept by `AgentCore`'s `Upkeep`).
    case upkeep
    /// UDP has gone unanswered for the race delay: the attempt moves to the stream.
    case race
    /// On the stream: time to see whether UDP over the same uplink answers again.
    case udpRetest = "udp-retest"
    /// An interface flaps: time for the operator's summary of it (kept by `AgentCore`'s `FlapNotices`).
    case flapSummary = "flap-summary"
    /// The session's socket could not be bound on its path a moment ago: time to bind it again.
    case rebind
    /// Time to tell the service manager's watchdog the agent is alive (kept by `AgentCore`'s `Heartbeats`).
    case watchdog
    /// A start still trying: time to ask the service manager for more time (kept by `Heartbeats`).
    case extendStart = "extend-start"
    /// Connected a minute since the metrics file was written: time to write it again (kept by `Heartbeats`).
    case metrics
}

/// What a plain HTTP request to the connectivity check's URL, sent over one uplink outside the
/// tunnel, found.
public enum Connectivity: Equatable, Sendable {
    /// The expected answer: the network reaches the internet (so a silent server is an outage).
    case online
    /// A redirect or an unexpected answer: a captive portal, with the page it sends users to.
    case portal(url: String)
    /// No usable answer (no route, no name, refused, timed out, not HTTP): nothing is known.
    case unknown(String)
}

/// The state of the session as the state machine sees it.
public enum State: Equatable, Sendable {
    /// No usable path: no attempts, no timers, nothing on the radio.
    case offline
    /// A handshake is in flight on the path; its initiation was sent again `resends` times.
    case connecting(Path, resends: Int = 0)
    /// The session works on the path; the debounce timer waits for the better path `candidate`.
    /// `handover`: the server a session is being prepared with meanwhile (here, probing and
    /// switching), which takes the traffic once it is up.
    case connected(Path, candidate: Path.ID? = nil, handover: Int? = nil)
    /// The path is suspect (or newly joined): `sent` probes are out, waiting for an echo.
    /// `rescue`: another path probed at the same time, which takes over if this one stays silent;
    /// `byLiveness`: the probing began because data went unanswered.
    case probing(Path, sent: Int, rescue: Rescue? = nil, byLiveness: Bool = false, handover: Int? = nil)
    /// Make-before-break: still on `from`, probing `to` before moving there.
    case switching(from: Path, to: Path, sent: Int, handover: Int? = nil)
    /// Quiesced for a suspend.
    case sleeping
    /// Waiting for the reconnect budget or a backoff step before trying the path again.
    case backingOff(Path)
    /// Cannot connect without an operator (credentials rejected): no retries.
    case failed(Reason)
    /// Taken down by an operator without stopping the agent: no session and no attempts until
    /// they bring it up again; the tunnel device and the lockdown stay.
    case paused
    /// The network on the path holds everything back until a user logs in to its captive
    /// portal at `url`: no attempts, only rechecks that back off, each twice as long as the one
    /// before (`rechecks` so far), unless a portal `window` is open for a user to log in.
    case portal(Path, url: String, rechecks: Int = 0, window: PortalWindow? = nil)
    /// An on-demand rule keeps the tunnel down on this network: no session and no attempts
    /// until the rules say otherwise. The lockdown stays, unless the rule lifted it for the
    /// network of path `lifted`. `forRules`: held only while the rules look at a new network,
    /// so whatever they then say but `disconnect` brings the first attempt.
    case disconnected(rule: String, lifted: Path.ID?, forRules: Bool = false)

    /// The state's name in logs and status.
    public var name: String {
        switch self {
        case .offline: "offline"
        case .connecting: "connecting"
        case .connected: "connected"
        case .probing: "probing"
        case .switching: "switching"
        case .sleeping: "sleeping"
        case .backingOff: "backing-off"
        case .failed: "failed"
        case .paused: "paused"
        case .portal: "portal"
        case .disconnected: "disconnected"
        }
    }

    /// The state without what it carries but its path (and a probing's or a switch's count, a
    /// portal's page, a rule's lift): what the log shows of it. The machine changes what a state
    /// carries without a transition (a better path to wait for, one more recheck), so the
    /// states one transition leaves and the one before it entered are the same phase.
    public var phase: State {
        switch self {
        case .connecting(let path, _): .connecting(path)
        case .connected(let path, _, _): .connected(path)
        case .probing(let path, let sent, _, _, _): .probing(path, sent: sent)
        case .switching(let from, let to, let sent, _): .switching(from: from, to: to, sent: sent)
        case .portal(let path, let url, _, _): .portal(path, url: url)
        case .disconnected(let rule, let lifted, _): .disconnected(rule: rule, lifted: lifted)
        case .offline, .sleeping, .backingOff, .failed, .paused: self
        }
    }

    /// The server a session is being prepared with while this one carries the traffic.
    public var handover: Int? {
        switch self {
        case .connected(_, _, let handover), .probing(_, _, _, _, let handover), .switching(_, _, _, let handover): handover
        default: nil
        }
    }

    /// The path the session is on or heading for.
    public var path: Path? {
        switch self {
        case .connecting(let p, _), .connected(let p, _, _), .probing(let p, _, _, _, _), .backingOff(let p), .portal(let p, _, _, _): p
        case .switching(let from, _, _, _): from
        case .offline, .sleeping, .failed, .paused, .disconnected: nil
        }
    }
}

extension State {
    /// This state as the machine enters it from `old` (`because`: the transition's reason; nil
    /// for a move within the state). What a state carries lasts while the machine stays in that
    /// kind of state (a probing that starts over keeps its rescue path, a connected session the
    /// better path it waits for) and goes when it leaves; a handover being prepared lasts while
    /// the session is connected, probing or switching. Held in `disconnected` for the rules
    /// begins with their wait and ends with their decision.
    func carrying(from old: State, because reason: Reason?) -> State {
        let handover = old.handover
        switch (self, old) {
        case (.connecting(let path, _), .connecting(_, let resends)):
            return .connecting(path, resends: resends)
        case (.connected(let path, _, _), .connected(_, let candidate, _)):
            return .connected(path, candidate: candidate, handover: handover)
        case (.connected(let path, let candidate, _), _):
            return .connected(path, candidate: candidate, handover: handover)
        case (.probing(let path, let sent, _, _, _), .probing(_, _, let rescue, let byLiveness, _)):
            return .probing(path, sent: sent, rescue: rescue, byLiveness: byLiveness, handover: handover)
        case (.probing(let path, let sent, let rescue, let byLiveness, _), _):
            return .probing(path, sent: sent, rescue: rescue, byLiveness: byLiveness, handover: handover)
        case (.switching(let from, let to, let sent, _), _):
            return .switching(from: from, to: to, sent: sent, handover: handover)
        case (.portal(let path, let url, _, _), .portal(_, _, let rechecks, let window)):
            return .portal(path, url: url, rechecks: rechecks, window: window)
        case (.disconnected(let rule, let lifted, _), _):
            let held: Bool = switch (reason, old) {
            case (.onDemandWaits?, _): true
            case (.onDemand?, _): false
            case (_, .disconnected(_, _, let forRules)): forRules
            default: false
            }
            return .disconnected(rule: rule, lifted: lifted, forRules: held)
        default:
            return self
        }
    }
}

/// A portal window: until when one process tree may reach the network directly to log in, and
/// the recheck that was due when it was asked for (where the rechecks go on if the lockdown does
/// not let it through).
public struct PortalWindow: Equatable, Sendable {
    public var until: Instant
    public var recheckBefore: Instant?
}

/// A path probed while the session's path is suspect, and its echo's RTT once it answered.
public struct Rescue: Equatable, Sendable {
    public var path: Path.ID
    public var rtt: Duration?

    public init(path: Path.ID, rtt: Duration? = nil) {
        self.path = path
        self.rtt = rtt
    }
}

/// Why a transition happened. Every transition has one; it is what the operator reads.
public enum Reason: Equatable, Sendable, CustomStringConvertible {
    /// A path to the server appeared while there was none.
    case pathAppeared(String)
    /// The path through this interface disappeared.
    case pathLost(String)
    /// The interface stayed but its source address changed.
    case addressChanged(String, from: IPAddress, to: IPAddress)
    /// A path ranks above the current one and stayed through the debounce window.
    case betterPath(Path, over: Path)
    /// The probed better path answered; the session moved there.
    case switched(String, rtt: Duration)
    /// The session's path went silent and another answered its probe: the session moved there.
    case failover(from: String, to: String, rtt: Duration)
    /// The better path did not answer its probes; the session stays.
    case candidateUnreachable(String, probes: Int)
    /// The candidate path went away while being probed.
    case candidateLost(String)
    /// The handshake completed.
    case handshakeSucceeded(rtt: Duration)
    /// No handshake response in time.
    case handshakeTimeout(String)
    /// The server refused us.
    case rejected(String)
    /// The server lost our session (restart), confirmed: no authenticated answer followed its
    /// hint. A handshake follows at once.
    case sessionUnknown
    /// A "session unknown" hint came: it is unauthenticated (anyone who sees the session's
    /// packets can send one), so a probe on the session's keys checks it before it costs anything.
    case sessionUnknownHint
    /// Nothing heard from the server for longer than a session lives.
    case sessionExpired(idle: Duration)
    /// Data went out and nothing came back for this long.
    case livenessTimeout(Duration)
    /// This many probes in a row went unanswered.
    case probeTimeout(Int, of: Int)
    /// The path answers small probes but not even the smallest tunnel packet (an MTU black
    /// hole below the tunnel's minimum): it cannot carry the tunnel.
    case pathTooSmall(String, mtu: Int)
    /// A probe echo came back.
    case probeAnswered(rtt: Duration)
    /// Data arrived while probing: the path works.
    case trafficResumed
    /// The machine is about to suspend.
    case goingToSleep
    /// The machine resumed after this long.
    case wokeAfter(Duration)
    /// No reconnect token left; the next comes in this long.
    case budgetExhausted(nextIn: Duration)
    /// The attempt failed; the next waits this long (full jitter).
    case backoff(nextIn: Duration)
    /// A backoff step ended.
    case retry
    /// An operator asked for it.
    case operatorRequest
    /// An operator took the tunnel down (`agent down`).
    case operatorDown
    /// An operator brought the tunnel up again (`agent up`).
    case operatorUp
    /// The server's name resolves to another address now.
    case serverAddressChanged
    /// Every path went silent towards this server (or its only one did): it is the suspect,
    /// and the next server in the list is tried.
    case serverUnreachable(String)
    /// This server announced that it is being taken down.
    case serverDraining(String)
    /// The session moved from one server to another, make-before-break.
    case handedOver(from: String, to: String, rtt: Duration)
    /// The server a session was moving to did not answer or refused; the traffic stays.
    case handoverFailed(String)
    /// A connectivity check over this interface found a captive portal.
    case captivePortal(String, url: String)
    /// A connectivity check passed behind the portal: the user logged in.
    case portalOpened(String)
    /// A portal window opened until this long from now.
    case portalWindowOpened(Duration)
    /// A portal window closed: its time ran out, or its process ended.
    case portalWindowClosed(why: String)
    /// An on-demand rule decided.
    case onDemand(OnDemandVerdict)
    /// The rules wait for facts about a new network before anything is tried there.
    case onDemandWaits(String, for: [String])
    /// The attempt over UDP on this interface went unanswered this long: it goes on over the
    /// stream on the same uplink (happy eyeballs).
    case udpSilent(String, after: Duration)
    /// The network on this interface is known to block UDP (it went unanswered there while
    /// the stream answered): the attempt `because` starts on the stream at once.
    indirect case knownToBlockUDP(String, because: Reason)
    /// The stream on this path could not be opened or broke, and why.
    case streamFailed(String, why: String)
    /// The socket on this path could not be bound, and why; it is bound again after `retryIn`,
    /// or (nil) the path is given up as a failed attempt.
    case bindFailed(String, why: String, retryIn: Duration?)
    /// A rule lifted the lockdown, but it could not be lifted (why): it stays whole.
    case liftRefused(String)
    /// The HTTP proxy's name gave an address on the network on this interface: a stream can
    /// open there now.
    case proxyFound(String)
    /// On the stream: UDP over the same uplink is tried again with a probe.
    case udpRetest(String)
    /// UDP answered the re-test: the session moved back to it, keys and all.
    case udpAnswered(String, rtt: Duration)
    /// UDP did not answer the re-test's probes: the session stays on the stream.
    case udpStillSilent(String, probes: Int)
    /// The network the lockdown was lifted for is no longer the tunnel's (or the rules wait for
    /// a fact about the new one): the lockdown is whole again.
    case lockdownRestored(String)

    public var description: String {
        switch self {
        case .pathAppeared(let i): "pathAppeared(\(i))"
        case .pathLost(let i): "pathLost(\(i))"
        case .addressChanged(let i, let a, let b): "addressChanged(\(i) \(a) -> \(b))"
        case .betterPath(let b, let c):
            b.prefixLength != c.prefixLength
                ? "betterPath(\(b.interface) /\(b.prefixLength) > \(c.interface) /\(c.prefixLength))"
                : "betterPath(\(b.interface) metric \(b.metric) < \(c.interface) \(c.metric))"
        case .switched(let i, let rtt): "switched(\(i) rtt \(rtt.short))"
        case .failover(let a, let b, let rtt): "failover(\(a) silent, \(b) rtt \(rtt.short))"
        case .candidateUnreachable(let i, let n): "candidateUnreachable(\(i) \(n) probes)"
        case .candidateLost(let i): "candidateLost(\(i))"
        case .handshakeSucceeded(let rtt): "handshakeSucceeded(rtt \(rtt.short))"
        case .handshakeTimeout(let i): "handshakeTimeout(\(i))"
        case .rejected(let why): "rejected(\(why))"
        case .sessionUnknown: "sessionUnknown"
        case .sessionUnknownHint: "sessionUnknownHint"
        case .sessionExpired(let idle): "sessionExpired(idle \(idle.short))"
        case .livenessTimeout(let d): "livenessTimeout(\(d.short))"
        case .probeTimeout(let n, let m): "probeTimeout(\(n) of \(m))"
        case .pathTooSmall(let i, let mtu): "pathTooSmall(\(i) carries no \(mtu)-byte packet)"
        case .probeAnswered(let rtt): "probeAnswered(rtt \(rtt.short))"
        case .trafficResumed: "trafficResumed"
        case .goingToSleep: "goingToSleep"
        case .wokeAfter(let d): "wokeAfter(\(d.short))"
        case .budgetExhausted(let d): "budgetExhausted(next in \(d.short))"
        case .backoff(let d): "backoff(next in \(d.short))"
        case .retry: "retry"
        case .operatorRequest: "operatorRequest"
        case .operatorDown: "operatorDown"
        case .operatorUp: "operatorUp"
        case .serverAddressChanged: "serverAddressChanged"
        case .serverUnreachable(let s): "serverUnreachable(\(s))"
        case .serverDraining(let s): "serverDraining(\(s))"
        case .handedOver(let a, let b, let rtt): "handedOver(\(a) -> \(b) rtt \(rtt.short))"
        case .handoverFailed(let s): "handoverFailed(\(s))"
        case .captivePortal(let i, let url): "captivePortal(\(i) \(url))"
        case .portalOpened(let i): "portalOpened(\(i))"
        case .portalWindowOpened(let d): "portalWindowOpened(for \(d.short))"
        case .portalWindowClosed(let why): "portalWindowClosed(\(why))"
        case .onDemand(let v): "onDemand(\(v))"
        case .onDemandWaits(let rule, let wanted): "onDemandWaits(\(rule) for \(wanted.joined(separator: ",")))"
        case .lockdownRestored(let why): "lockdownRestored(\(why))"
        case .udpSilent(let i, let d): "udpSilent(\(i) \(d.short), trying the stream)"
        case .knownToBlockUDP(let i, let because): "knownToBlockUDP(\(i), on the stream at once; \(because))"
        case .streamFailed(let p, let why): "streamFailed(\(p): \(why))"
        case .bindFailed(let p, let why, let retry?): "bindFailed(\(p): \(why); again in \(retry.short))"
        case .bindFailed(let p, let why, nil): "bindFailed(\(p): \(why); path given up)"
        case .proxyFound(let i): "proxyFound(\(i))"
        case .liftRefused(let why): "liftRefused(\(why))"
        case .udpRetest(let i): "udpRetest(\(i))"
        case .udpAnswered(let i, let rtt): "udpAnswered(\(i) rtt \(rtt.short))"
        case .udpStillSilent(let i, let n): "udpStillSilent(\(i) \(n) probes)"
        }
    }

    /// The reason an attempt was made, whatever transport it chose: for a start on the stream
    /// because the network blocks UDP, the event that brought the attempt.
    public var cause: Reason {
        if case .knownToBlockUDP(_, let because) = self { return because.cause }
        return self
    }
}

/// One state change, with everything an operator needs to understand it.
public struct Transition: Equatable, Sendable {
    public var at: Instant
    public var from: State
    public var to: State
    /// The input that caused it.
    public var trigger: String
    public var reason: Reason
    /// Attempts since the session last worked (0 when connected).
    public var attempt: Int
    /// When the next retry is due, if one is scheduled.
    public var nextRetry: Instant?
    /// Inputs absorbed without a transition since the previous one (flaps, duplicates).
    public var coalesced: Int
    /// The server the session is with or heading for, when more than one is configured.
    public var server: String? = nil
}
