public import Topology
public import Basics

/// A fact the agent learns, from the network, the data plane, the machine, an operator or a
/// timer. Nothing here is a command.
public enum AgentEvent: Equatable, Sendable {
    /// The agent starts: the network is as the first dump showed it (`AgentCore.init`).
    case start
    /// The kernel reported a change of the links, addresses or routes.
    case network(NetworkChange)
    /// What a look-up of server `server`'s name gave (see `Effect.lookUpServer`): the addresses
    /// the session may use, in the resolver's order; nil when the look-up failed.
    case serverLookedUp(server: Int, addresses: [IPAddress]?)
    /// Whether the lockdown now lets the session reach `address` of server `server` (see
    /// `Effect.allowServer`): false when it could not be opened there.
    case serverAllowed(server: Int, address: IPAddress, Bool)
    /// The machine is about to suspend.
    case sleep
    /// The machine resumed after `sleptFor` (also for a suspend nobody announced).
    case wake(sleptFor: Duration)
    /// The machine switched between mains and battery.
    case powerChanged(PowerSource)
    /// The echo of probe `id` (see `Effect.probe`) came back after `rtt`, `size` bytes of
    /// tunnel packet big (nil: a small echo).
    case probeEcho(id: UInt64, rtt: Duration, size: Int?)
    /// The handshake completed: the session has fresh keys (see `Input.handshakeSucceeded`);
    /// `dns`: the resolvers the server gave (or why its list was refused).
    case handshakeCompleted(rtt: Duration, sizedProbes: Bool, carriesIPv6: Bool,
                            dns: Result<DNSSettings, DNSSettingsError> = .success(.none))
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
    /// The session with the server a handover goes to is ready; `dns` as for `handshakeCompleted`.
    case handoverReady(rtt: Duration, sizedProbes: Bool, carriesIPv6: Bool,
                       dns: Result<DNSSettings, DNSSettingsError> = .success(.none))
    /// The server a handover goes to refused it.
    case handoverRejected
    /// What a connectivity check over the path `on` found.
    case connectivity(Connectivity, on: Path.ID)
    /// A timer the core keeps (see `AgentCore.timers`) is due.
    case timerFired(TimerKind)
    /// Something learnt about the best path's network for the on-demand rules (see
    /// `Effect.findOut`), or a notice that changed it.
    case networkFact(NetworkFact)
    /// The configuration was read again (SIGHUP): what it gives now, and what of the tunnel
    /// itself it changes. (Boxed: the tunables are big, and every event would be as big as the largest.)
    indirect case reloaded(Reload)
    /// Whether the lockdown let the portal window's process tree through (see
    /// `Effect.openPortalWindow`).
    case portalWindowOpened(Bool)
    /// The tunnel device is set up (see `Effect.attachTunnel`).
    case tunnelAttached
    /// The lockdown could not be lifted as `Effect.liftLockdown` asked, and why: it stays whole.
    case liftRefused(String)
    /// The tunnel device kept MTU `actual` where `Effect.setTunnelMTU` asked for another, and why.
    case tunnelMTUFailed(actual: Int, why: String)
    /// The session cannot go on with the server it is to talk to (its protocol core could not be
    /// made for `useServer`, `useAddress` or the first `bind`, or the session's thread could not
    /// start), and why.
    case sessionFailed(String)
    /// The tunnel device could not be set up for the session that just came up: why.
    case tunnelFailed(String)
    /// Whether the lockdown let the excluded applications' cgroup through (see
    /// `Effect.openExclusion`).
    case exclusionOpened(Bool)
    /// Something the agent put on the machine is missing (see `Upkeep`).
    case damaged(Holding, Upkeep.Damage)
    /// It is whole again.
    case intact(Holding)
    /// An operator's request.
    case request(Request)
    /// The stream on path `id` (a `.stream` path) could not be opened or broke, and why
    /// (connection refused, the proxy refused or asked for credentials, TLS failed, a reset):
    /// a failed attempt on that path. The runner opens a new stream the next time the core
    /// sends over that path.
    case streamFailed(Path.ID, why: String)
    /// The runner could not open or bind the socket on path `id` (see `Effect.bind`), and why:
    /// nothing went out on that path, and the session is not there.
    case bindFailed(Path.ID, why: String)
    /// What a look-up of the HTTP proxy's name on `path`'s network gave (see
    /// `Effect.lookUpProxy`): its addresses; none when the name has none there (it does not
    /// exist); nil when no name server answered.
    case proxyLookedUp(on: Path, addresses: [IPAddress]?)
    /// Whether the lockdown now lets the streams reach the proxy at `address` on `network`'s
    /// network (see `Effect.proxyAt`).
    case proxyAllowed(on: NetworkKey, address: IPAddress, Bool)

    /// Short name of the event, as the `trigger` of a log line.
    public var name: String {
        switch self {
        case .start: "start"
        case .network: "network"
        case .serverLookedUp: "server-looked-up"
        case .serverAllowed: "server-allowed"
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
        case .networkFact: "network-fact"
        case .reloaded: "reload"
        case .portalWindowOpened: "portal-window-opened"
        case .tunnelAttached: "tunnel-attached"
        case .tunnelFailed: "tunnel-failed"
        case .exclusionOpened: "exclusion-opened"
        case .damaged: "damaged"
        case .intact: "intact"
        case .request(.reconnect): "operator"
        case .request(.pause): "operator-down"
        case .request(.resume): "operator-up"
        case .request(.openPortalWindow): "portal-window"
        case .request(.closePortalWindow): "portal-window-closed"
        case .request(.exclude): "exclude"
        case .request(.stop(.byOperator)): "operator-stop"
        case .request(.stop): "stop"
        case .streamFailed: "stream-failed"
        case .bindFailed: "bind-failed"
        case .proxyLookedUp: "proxy-looked-up"
        case .liftRefused: "lift-refused"
        case .sessionFailed: "session-failed"
        case .tunnelMTUFailed: "tunnel-mtu-failed"
        case .proxyAllowed: "proxy-allowed"
        }
    }

    /// What an operator may ask of a running agent.
    public enum Request: Equatable, Sendable {
        /// Fresh keys now (`agent reconnect`).
        case reconnect
        /// The tunnel down without stopping the agent (`agent down`), and up again.
        case pause, resume
        /// A portal window opens (`agent portal`), or closes (its process ended), asked by the
        /// user `uid`: only the one who opened it, or root, may close it or join it.
        case openPortalWindow(by: UInt32), closePortalWindow(by: UInt32)
        /// A process tree is to be kept outside the tunnel (`agent exclude`), asked by user `uid`
        /// (root or the roam group: the control socket let them ask).
        case exclude(by: UInt32)
        /// The agent stops: nothing is decided after this.
        case stop(Stop)
    }

    /// Who stops the agent, which decides whether the machine opens again.
    public enum Stop: Equatable, Sendable {
        /// The operator said so (`agent stop`, which `systemctl stop` runs): the lockdown and
        /// the tunnel's resolvers go with the agent.
        case byOperator
        /// A signal (SIGTERM, SIGINT): a restart, a package upgrade, a shutdown, a start that
        /// timed out, anyone's kill. None of them says the machine may open, so it stays closed
        /// until the next agent adopts the lockdown.
        case bySignal
        /// The configuration now describes another tunnel: a new agent starts in place.
        case restarting
    }
}

/// What a reading of the configuration again (SIGHUP) found: the reconnect tunables and the
/// on-demand rules it gives now, and what it changes of the tunnel itself, by the configuration's
/// keys (the servers, keys, credentials, device, routing, lockdown, DNS, protocol or stream),
/// none when it describes the same tunnel.
public struct Reload: Equatable, Sendable {
    public var config: Config
    public var rules: OnDemandRules
    public var tunnelChanges: [String]
    /// The metrics file the configuration names now (nil: none).
    public var metricsFile: String?

    public init(config: Config, rules: OnDemandRules, tunnelChanges: [String] = [], metricsFile: String? = nil) {
        self.config = config
        self.rules = rules
        self.tunnelChanges = tunnelChanges
        self.metricsFile = metricsFile
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
    /// The session could not go on with its server (see `AgentEvent.sessionFailed`).
    case sessionFailed(String)
    /// No address server `server`'s name gave at start (`addresses`) is usable
    /// (`ServerBook.usable`): each lies inside the tunnel's own routes, where the tunnel would
    /// carry its own packets, or is no other host's.
    case serverCarried(server: Int, addresses: [IPAddress])
}

/// What the operator should hear about a decision that leaves something as it was.
public enum Notice: Equatable, Sendable {
    /// Server `server`'s name gave `addresses`, none of which the session can use now (each
    /// inside the tunnel's own routes, or none reached): it stays at the address it has.
    case serverNameUnusable(server: Int, addresses: [IPAddress])
    /// No address server `server`'s name gave at start (`addresses`) is usable
    /// (`ServerBook.usable`): the session never turns to it until a later answer gives another.
    case serverCarried(server: Int, addresses: [IPAddress])
    /// Someone else took `holding` away (the decision what to do follows as its own effect).
    case takenAway(Holding, Upkeep.Damage)
    /// The interface flaps (the flap damping holds its returns back): `losses` within `over`;
    /// the next summary comes after `nextSummary`.
    case flapping(interface: String, losses: Int, over: Duration, nextSummary: Duration)
    /// It goes on flapping: `losses` within the last `within`, `total` over `over`.
    case stillFlapping(interface: String, losses: Int, within: Duration, total: Int, over: Duration)
    /// It has been quiet for a whole summary's time: `losses` in all over `over`; `up`: it carries a path.
    case stoppedFlapping(interface: String, losses: Int, over: Duration, up: Bool)
}

/// A command for whoever runs the core: the daemon's sockets, firewall and resolvers, or a
/// replay's world. Each is carried out in order; what one produces comes back as an
/// `AgentEvent`, never by the core reading the runner's state.
public enum Effect: Equatable, Sendable {
    /// Open the session's socket on `path` (`first`), or move the session there with its keys.
    /// A socket that cannot be opened or bound there comes back as `AgentEvent.bindFailed`, and
    /// no socket of a path the machine no longer has carries the session's data meanwhile. A
    /// probe or a handshake on that path before the next `bind` may open one (a second try of the
    /// kernel's): what it brings back proves nothing to the core until a bind there works.
    case bind(Path, first: Bool, reason: Reason)
    /// Send a handshake initiation for fresh keys on `path`.
    case handshake(on: Path, reason: Reason)
    /// Send the handshake in flight on `path` again: a fresh initiation within the attempt.
    case resendHandshake(on: Path)
    /// Send authenticated probe `id` on `path`; padded to stand for a tunnel packet of `size`
    /// bytes when given (the server's echo is as big). Its echo comes back as `probeEcho`. On a
    /// path the session is not on, a socket is opened there first; one that cannot be comes back
    /// as `AgentEvent.bindFailed`.
    case probe(id: UInt64, via: Path, size: Int?)
    /// Set the tunnel device's MTU; a device that keeps another comes back as
    /// `AgentEvent.tunnelMTUFailed`.
    case setTunnelMTU(Int)
    /// The tunnel cannot come up without an operator (the agent keeps running).
    case reportFailure(Reason)
    /// One state change, for the operator's log, status and metrics.
    case transition(Transition)
    /// Talk to server `index` of the list from now on, at `address` (nil: its name gave none
    /// the session can use yet; a look-up is asked for); its session starts with the next handshake.
    case useServer(Int, at: IPAddress?)
    /// Handshake with server `index` at `address` over the session's socket on `path`, keeping
    /// the current session (nil: it has no usable address yet, and the handover will fail).
    case prepareHandover(server: Int, at: IPAddress?, on: Path)
    /// Look up server `index`'s name, off the deciding thread; the answer comes back as
    /// `AgentEvent.serverLookedUp`.
    case lookUpServer(Int)
    /// Let the session reach `address` of server `index` through the lockdown too; whether it
    /// could comes back as `AgentEvent.serverAllowed`. `lockdown`: every server's addresses the
    /// lockdown lets the session reach, this one among them (`ServerBook.allowed`): the runner
    /// opens it to exactly these.
    case allowServer(Int, address: IPAddress, lockdown: [[IPAddress]])
    /// Look up the HTTP proxy's name on `path`'s network (its queries over that uplink), off the
    /// deciding thread; the answer comes back as `AgentEvent.proxyLookedUp`.
    case lookUpProxy(on: Path)
    /// Streams go through the proxy at the address `addresses` gives for their path's network,
    /// and the lockdown lets the agent's streams reach exactly these addresses at the proxy's
    /// port (`ProxyBook.lockdown`). `opening`: the network whose address is new, an opening
    /// whose answer comes back as `AgentEvent.proxyAllowed` (until it says yes, that network's
    /// streams go nowhere); nil when addresses only left (a closing, tried until it holds).
    case proxyAt([NetworkKey: IPAddress], opening: NetworkKey?)
    /// The current server is at `address` now: the session's packets go there (`why`, for the log).
    case useAddress(IPAddress, why: String)
    /// The networks on the uplinks changed (the lockdown's local networks, the resolvers the
    /// machine's own networks hold); `widerClaims`: subnets a network claimed wider than a LAN,
    /// which count as local only around the machine's own address (`NetworkModel.localClaim`).
    case localNetworks([Prefix], widerClaims: [Prefix])
    /// The bridges the machine's containers and VMs sit behind changed (see
    /// `NetworkModel.guestNetworks`): the lockdown lets them talk to the machine and among
    /// themselves, and what they send beyond goes into the tunnel.
    case guestNetworks([GuestNetwork])
    /// The prepared session takes the traffic; the old server is told goodbye.
    case completeHandover
    /// The prepared session is forgotten.
    case cancelHandover
    /// The session ends with a goodbye; the tunnel device and the lockdown stay.
    case disconnect
    /// Set up the tunnel device with the session's inner addresses, and the tunnel's routes:
    /// once, after the first handshake; it stays through every reconnect. Whether it could
    /// comes back as `AgentEvent.tunnelAttached` or `.tunnelFailed`.
    case attachTunnel
    /// Give the system these resolvers for the tunnel, or none (see `ResolverChoice`).
    case resolvers(ResolverDecision)
    /// One connectivity check over `path`, outside the tunnel; its result comes back as
    /// `AgentEvent.connectivity`.
    case checkConnectivity(via: Path)
    /// Let the portal window's process tree through the lockdown on `path` (and to the login
    /// page at `portal`) until `until`; whether it could comes back as
    /// `AgentEvent.portalWindowOpened`.
    case openPortalWindow(via: Path, portal: String, until: Instant)
    /// The lockdown is whole again.
    case closePortalWindow
    /// Make the excluded applications' cgroup and let it through the lockdown, to the network
    /// directly with the network's own resolvers; whether it could comes back as
    /// `AgentEvent.exclusionOpened`. It stays until the agent ends.
    case openExclusion
    /// An on-demand rule trusts the network on `interface`: the lockdown, the tunnel's routes
    /// and its resolvers step aside. A lockdown that cannot be lifted comes back as
    /// `AgentEvent.liftRefused` (and the routes and resolvers stay).
    case liftLockdown(interface: String)
    /// The lockdown, the tunnel's routes and its resolvers are back.
    case restoreLockdown
    /// As a service, the agent is ready: the tunnel is up, or there is nothing to wait for (no
    /// network, or a rule keeps the tunnel down). Given once.
    case ready
    /// The agent cannot go on: it ends, for its service manager to start it again.
    case giveUp(GiveUp)
    /// The agent ends: the session closes and the tunnel's routes go; only when `opensMachine`
    /// do the lockdown and the tunnel's resolvers go too.
    case stop(opensMachine: Bool)
    /// The configuration now describes another tunnel (what changed, by its keys): the agent
    /// ends, the lockdown and the tunnel's resolvers staying, and a new one starts in its place
    /// on the configuration as it is now.
    case restart(because: [String])
    /// Find out something about the best path's network for the on-demand rules; the answer
    /// comes back as `AgentEvent.networkFact`.
    case findOut(FactRequest)
    /// Follow these kernel notices (and no others), feeding what they change as
    /// `AgentEvent.networkFact`.
    case followNotices(FactNotices)
    /// The on-demand rules decided, or wait for facts, for the best path's network (for the log).
    case onDemandDecided(OnDemandDecision)
    /// The answer to the operator's request being handled.
    case reply(OperatorReply)
    /// Tell the operator something the core decided that needs their attention (the log).
    case notice(Notice)
    /// Put `holding` back: someone took `damage` away. Whether it is whole again comes back as
    /// `AgentEvent.intact`; still missing, as `AgentEvent.damaged`.
    case restore(Holding, Upkeep.Damage)
    /// `holding` keeps being taken away: no restore before `until` (the log and status say so).
    case upkeepHeld(Holding, Upkeep.Damage, restores: Int, until: Instant)
    /// Tell the service manager's watchdog the agent is alive (`WATCHDOG=1`; see `Heartbeats`).
    case pingWatchdog
    /// Ask the service manager for `by` more time to start (`EXTEND_TIMEOUT_USEC=`): the agent
    /// is still trying, and not ready.
    case extendStart(by: Duration)
    /// Write the metrics file now.
    case writeMetrics
}

extension Effect {
    /// It binds the session's socket or starts a handshake: the event that gave it is an attempt.
    public var isAttempt: Bool {
        switch self {
        case .bind, .handshake: true
        default: false
        }
    }
}

/// What the agent answers an operator's request (`AgentEvent.request`); the runner words it.
public enum OperatorReply: Equatable, Sendable {
    /// Fresh keys are on their way.
    case reconnecting
    /// Nothing to reconnect: the operator took the tunnel down.
    case down
    /// Nothing to reconnect: on-demand rule `rule` keeps the tunnel down on this network.
    case keptDownByRule(String)
    /// The tunnel is down now (`already`: it was).
    case paused(already: Bool)
    /// The tunnel comes up.
    case connecting
    /// The tunnel was not down (the state it is in).
    case upAlready(String)
    /// The portal window is open on `interface` until `until`, for the login page at `url`: the
    /// asking process goes into it.
    case portalWindowOpen(url: String, interface: String, until: Instant)
    /// The portal window is closed.
    case portalWindowClosed
    /// No portal was found (the state the agent is in): no window opens.
    case noPortal(String)
    /// No window is needed: without a full tunnel's lockdown nothing holds the portal back (its
    /// login page, when one was found).
    case portalReachable(url: String?)
    /// The portal window is another user's.
    case notPermitted
    /// The window could not be opened: its cgroup could not be made, or the lockdown refused it.
    case portalWindowFailed
    /// The asking process (or the one it named) goes outside the tunnel.
    case excluded
    /// Exclusion is off in the configuration.
    case exclusionOff
    /// The excluded applications' cgroup could not be made, or the lockdown refused it.
    case exclusionFailed
}
