public import Topology
public import Basics
public import Reconnector

/// A timeline of a laptop's network life: where it starts, what happens when, and what the
/// agent must have done by the end. Written by hand or recorded from the kernel.
public struct Scenario: Sendable {
    /// File the scenario came from, for messages.
    public var file: String
    public var name: String
    public var about: String
    /// The server endpoint whose paths are watched.
    public var server: IPAddress
    /// Every address of the server, `server` first (more than one: a dual-stack server).
    public var serverAddresses: [IPAddress]
    /// Link kinds that sysfs knew when the timeline was recorded (raw messages cannot tell
    /// Wi-Fi from Ethernet).
    public var linkKinds: [String: LinkKind] = [:]
    /// The agent's own tunnel interface, never a path.
    public var tunnelInterface: String?
    public var config: Config
    public var power: PowerSource
    /// Seed for backoff jitter.
    public var seed: UInt64
    /// The application sends a packet this often while the tunnel carries traffic.
    public var traffic: Duration?
    /// The size of those packets inside the tunnel (the application's IP packets), at most the
    /// tunnel's MTU; on the wire each is bigger by the tunnel's overhead (`Replay.overhead`).
    public var trafficSize = 100
    /// Packets the server starts (pushed mail, a call's far side, an incoming SSH session): they
    /// go to where the server last heard the agent from, so a NAT that forgot the mapping or a
    /// socket the agent left loses them. nil: the server only answers.
    public var serverTraffic: TrafficPhase?
    /// The agent's `persistent-keepalive`: its data plane sends a keepalive after this long
    /// without an application packet, so NATs keep the mapping and the server the endpoint.
    public var persistentKeepalive: Duration?
    /// The agent's `--wait-for-server`: before the tunnel first comes up, attempts on a usable
    /// path may go unanswered this long before it gives up (nil: for ever). 30 s, as the agent's.
    public var waitForServer: Duration? = .seconds(30)
    /// The server echoes padded probes at their size (a server of revision 3 or later): the
    /// agent discovers each path's MTU.
    public var serverEchoesSizes = true
    /// The tunnel has an IPv6 address, so its MTU stays at 1,280 or above; without, the floor of
    /// path MTU discovery is 1,200 (`Config.mtuFloor`).
    public var tunnelCarriesIPv6 = true
    /// The smallest tunnel MTU the agent may set or probe.
    public var mtuFloor: Int { config.mtuFloor(ipv6: tunnelCarriesIPv6) }
    /// Round-trip time to the server on links that do not set their own.
    public var rtt: Duration
    /// Initial network, applied before the clock starts.
    public var network: [TimedEvent]
    public var timeline: [TimedEvent]
    /// The replay stops here.
    public var until: Instant
    /// Several gateways behind the same address, by name, in the agent's order: the
    /// first is tried first. One unnamed gateway when the scenario names none.
    public var gateways: [String] = ["server"]
    /// The gateways whose names give addresses of their own (`{name, server}`), by name; the
    /// others are at `serverAddresses`.
    public var gatewayAddresses: [String: [IPAddress]] = [:]
    /// The client's on-demand rules (none: always connect).
    public var onDemand = OnDemandRules()
    /// `exclusion: allow`: applications may be kept outside the tunnel.
    public var exclusionAllowed = false
    /// A full tunnel's lockdown holds a captive portal back, so `agent portal` opens a window
    /// through it (`portal-windows: false`: no such lockdown, and the request is told the portal
    /// is reachable as it is).
    public var portalWindows = true
    /// What the world's lockdown refuses to open for (nftables refuses the change, or the
    /// cgroup cannot be made): a portal window, the excluded applications' cgroup.
    public var lockdownRefuses: Set<LockdownOpening> = []
    /// The tunnel's split routes (`split-routes`): none of the server's addresses inside them is
    /// ever used. None: a full tunnel.
    public var splitRoutes: [Prefix] = []
    /// The resolvers the gateway gives at each handshake (`server-dns`); with it the agent
    /// manages the tunnel's resolvers (`ResolverChoice`), without it it leaves DNS alone.
    public var serverDNS: [IPAddress]?
    /// The agent runs under a service manager that waits for it to be ready (`service`).
    public var service: Service?
    /// The agent writes a metrics file (`metrics-file: true`).
    public var metricsFile = false

    /// The service manager the agent runs under (`Type=notify`).
    public struct Service: Sendable {
        /// Its watchdog's interval (`WatchdogSec`), when it keeps one: pinged at half of it.
        public var watchdog: Duration?
    }

    /// What the agent tells those who watch it, as the daemon's `Heartbeats` would be set up.
    public var heartbeats: Heartbeats {
        Heartbeats(watchdog: service?.watchdog.map { $0 / 2 }, extendsStart: service != nil, metricsFile: metricsFile ? "roam.prom" : nil)
    }

    /// An opening the agent asks of its lockdown.
    public enum LockdownOpening: String, Hashable, Sendable, CaseIterable {
        case portalWindow = "portal-window"
        case exclusion
        /// The proxy named by host, at the address its name gave on a network.
        case proxy
        /// A trusted network an on-demand rule lifts the lockdown for.
        case lift
    }
    /// The TCP port of the gateway's stream transport in the client's configuration (443 by
    /// default), and the HTTP proxy it goes through, if it names one: what a network that lets
    /// only some TCP out decides on. Whether the core uses the stream is `config.stream`.
    public var streamPort = 443
    public var streamProxy: String?
    /// What the proxy's name gives on each interface's network (`proxy-dns`), when
    /// `stream-proxy` is a name: no entry, or none, is a name that network does not know.
    public var proxyDNS: [String: [IPAddress]] = [:]
    /// The proxy is named by host: the core looks its name up on each network.
    public var proxyNamed: Bool { streamProxy.map { Endpoint($0)?.address == nil } ?? false }
    public var expect: Expectations

    /// Where the scenario library lives in the source tree.
    public static let libraryPath: String = {
        var parts = "\(#filePath)".split(separator: "/", omittingEmptySubsequences: false)
        parts.removeLast(3)  // Sources/Replay/Scenario.swift
        return parts.joined(separator: "/") + "/Scenarios"
    }()
}

/// A stream of packets: one every `every`, each `size` bytes inside the tunnel (nil: the
/// scenario's `trafficSize`).
public struct TrafficPhase: Sendable, Equatable {
    public var every: Duration
    public var size: Int?
    public init(every: Duration, size: Int? = nil) {
        self.every = every
        self.size = size
    }
}

/// One event at one instant, with the line it came from.
public struct TimedEvent: Sendable {
    public var at: Instant
    public var line: Int
    public var event: ScenarioEvent
    public init(at: Instant, line: Int, event: ScenarioEvent) {
        self.at = at
        self.line = line
        self.event = event
    }
}

/// Something that happens to the laptop, its networks or the server.
public enum ScenarioEvent: Sendable {
    /// A link appears or changes; unset fields keep their value.
    case link(LinkSpec)
    /// A link is deleted (USB adapter unplugged).
    case linkRemoved(String)
    case addressAdded(dev: String, Prefix, AddressFlags)
    case addressRemoved(dev: String, Prefix)
    case routeAdded(RouteSpec)
    case routeRemoved(RouteSpec)
    /// A change already in the model's terms.
    case change(NetworkChange)
    /// One buffer of raw rtnetlink messages, as `agent record` received it from the kernel;
    /// decoded by the same decoder the live monitor runs.
    case netlink([UInt8])
    /// The suspend hook announces a suspend.
    case sleep
    /// The machine resumed (after an announced sleep).
    case wake
    /// The machine was suspended for this long and nobody said so.
    case clockJump(Duration)
    /// The agent's clock steps back by this much (the world's time goes on).
    case clockBack(Duration)
    case power(PowerSource)
    case server(ServerChange)
    /// Something happens to one gateway of `Scenario.gateways` (by index).
    case gateway(Int, GatewayChange)
    /// The interface stays up but silently drops everything (captive portal, dead AP uplink).
    case drop(String)
    /// The interface passes traffic again.
    case restore(String)
    /// The kernel refuses to bind a socket to the interface's addresses (`EADDRNOTAVAIL`, as
    /// while it promotes a secondary address): the next `times` binds, or for `for` from now.
    case refuseBind(dev: String, times: Int?, for: Duration?)
    /// The network behind the interface turns into a closed captive portal with this login
    /// page: UDP is dropped, a plain HTTP request is redirected there.
    case portal(dev: String, url: String)
    /// Someone logged in: the portal on the interface opens.
    case login(String)
    /// The proxy's name gives `addresses` on the interface's network from now on (none: a name
    /// that network does not know).
    case proxyDNS(dev: String, addresses: [IPAddress])
    /// An operator runs `agent portal` (true), or its process ends (false).
    case portalWindow(Bool)
    /// The server starts accepting or rejecting our credentials.
    case auth(accepts: Bool)
    /// An operator runs `agent reconnect`.
    case reconnect
    /// The application's traffic changes: a new rhythm and size, or idle (nil).
    case traffic(TrafficPhase?)
    /// The traffic the server starts changes: a new rhythm and size, or none (nil).
    case serverTraffic(TrafficPhase?)
    /// An operator runs `agent down` (`paused: true`) or `agent up` on the running agent.
    case operatorPause(Bool)
    /// An attacker who sees the session's packets (same Wi-Fi) sends a "session unknown" hint
    /// from the server's address and port; the server still has the session.
    case forgedHint
    /// The agent is stopped (`stop: signal`: SIGTERM; `stop: operator`: `agent stop`): from
    /// here on it decides nothing, whatever follows.
    case stop(AgentEvent.Stop)
    /// The configuration is read again (SIGHUP) and describes the same tunnel: these tunables
    /// and on-demand rules from now on.
    case reload(Config, OnDemandRules, tunnelChanges: [String])
    /// The agent's process ends and another starts: it keeps only what the real agent keeps in
    /// its runtime directory (`Reconnector.Memory`); sockets, timers and session keys are gone.
    case restart
    /// Someone (`by`, when the kernel would name them) takes away what the agent put on the
    /// machine: its routing, its resolvers, its lockdown table. With `fighting`, they take it
    /// away again 100 ms after each time it is put back, for that long (a network manager that
    /// removes every rule it did not make).
    case taken(Holding, by: String?, fighting: Duration?)
    /// Someone runs `agent exclude`.
    case exclude
}

/// What happens to the server.
public enum ServerChange: String, Sendable {
    /// Stops answering; its sessions are gone.
    case down
    /// Answers again, with no sessions.
    case up
    /// Down and up at once: every session is gone.
    case restart
    /// Its name resolves to another address of the same server: sessions stay, and the agent
    /// learns of it from its resolver.
    case moved
}

/// What happens to one of several gateways.
public enum GatewayChange: String, Sendable {
    /// Stops answering; its sessions are gone.
    case down
    /// Answers again, with no sessions.
    case up
    /// Announces to its sessions that it is being taken down (it keeps serving meanwhile).
    case drain
}

/// A link as a scenario describes it, by name.
public struct LinkSpec: Sendable {
    public var name: String
    public var index: Int32?
    public var kind: LinkKind?
    public var up: Bool?
    public var carrier: Bool?
    public var mtu: Int?
    /// Round-trip time to the server through this link.
    public var rtt: Duration?
    /// Share of packets lost from the laptop to the server (0...1) through this link.
    public var lossUp: Double?
    /// Share of packets lost from the server to the laptop (0...1) through this link.
    public var lossDown: Double?
    /// Share of packets of one address family lost each way, on top of `lossUp`/`lossDown` (a
    /// hotel Wi-Fi whose IPv6 is broken, a carrier whose IPv4 NAT is overloaded).
    public var lossV4: Double?
    public var lossV6: Double?
    /// Each packet through this link takes up to this much longer (drawn evenly; packets may overtake).
    public var jitter: Duration?
    /// The largest packet the path through this link carries to the server; larger ones vanish.
    public var pathMTU: Int?
    /// A NAT on this link forgets a mapping this long after the laptop last sent through it; an
    /// answer that arrives after that is lost.
    public var natTimeout: Duration?
    /// What on-demand rules can learn of the network behind this link.
    public var ssid: String?
    public var gatewayMAC: String?
    public var dnsDomains: [String]?
    /// Probe URLs that answer as their rules expect on this network.
    public var probeAnswers: [String]?
    /// The key the `https://` servers this network reaches show (the office's server's own, or
    /// an impostor's): a pinned probe answers only when it is the pinned one.
    public var tlsKey: KeyPin?
    /// The network relays the probes' connections to their servers elsewhere (what it reaches
    /// is the real server, but the server sees the relay's address, not the laptop's).
    public var relaysProbes: Bool?
    /// What the network lets out (nil: unchanged; new links let everything out).
    public var blocks: LinkFilter?
    /// A middlebox on this network resets TCP connections this long after they opened (0: none).
    public var streamResetAfter: Duration?
}

/// What a network lets out towards the gateway.
public enum LinkFilter: String, Sendable {
    /// Everything.
    case none
    /// No UDP at all: the tunnel's datagrams and DNS are dropped (the stream gets through).
    case udp
    /// No UDP but DNS to the network's resolver.
    case udpButDNS = "udp-but-dns"
    /// Only TCP to port 443 (and the network's resolver): the stream gets through on port 443 only.
    case allButTCP443 = "all-but-tcp-443"
    /// Only the network's HTTP proxy: the stream gets through only when the client's
    /// configuration names a proxy; a direct connection is refused.
    case allButProxy = "all-but-proxy"

    /// Whether the tunnel's UDP datagrams pass.
    var passesUDP: Bool { self == .none }
    /// Whether a plain HTTP request (the connectivity check) gets out, names resolved.
    var passesCheck: Bool { self == .none || self == .udpButDNS }
}

/// A route as a scenario describes it, naming links.
public struct RouteSpec: Sendable {
    public var to: Prefix
    public var hops: [(gateway: IPAddress?, dev: String)]
    public var metric: UInt32?
    public var source: IPAddress?
    public var table: UInt32
    public var type: RouteType
}

/// What must hold at the end of a replay.
public struct Expectations: Sendable {
    public var state: String?
    /// The gateway the agent ends with, by name.
    public var server: String?
    /// The address the session sends to at the end.
    public var serverAddress: IPAddress?
    /// Interface of the final path, or `none`.
    public var path: String?
    public var maxAttempts: Int?
    public var minAttempts: Int?
    public var maxHandshakes: Int?
    public var minHandshakes: Int?
    public var maxProbes: Int?
    public var minProbes: Int?
    /// Handshakes sent again within their attempt.
    public var maxResends: Int?
    public var minResends: Int?
    /// The tunnel device's MTU at the end.
    public var tunnelMTU: Int?
    /// Packets the server started that never reached the agent's session.
    public var maxLostFromServer: Int?
    /// Packets the server started that reached it.
    public var minFromServer: Int?
    /// Persistent keepalives the data plane sent.
    public var maxKeepalives: Int?
    public var minKeepalives: Int?
    /// Probes padded to a size (path MTU discovery), over the whole timeline.
    public var maxSizeProbes: Int?
    public var minSizeProbes: Int?
    /// How long the session was connected through an interface, at least or at most.
    public var timeOn: [(path: String, min: Duration?, max: Duration?)] = []
    /// Connectivity checks (plain HTTP requests outside the tunnel).
    public var maxChecks: Int?
    public var minChecks: Int?
    /// Longest time the tunnel did not work while some uplink could have carried it.
    public var maxOutage: Duration?
    /// Transitions that must appear in this order: `state` or `state:reasonPrefix`.
    public var sequence: [String] = []
    /// Transitions that must never happen: `state` or `state:reasonPrefix`.
    public var never: [String] = []
    /// CPU time the replay itself may take (its thread's, so parallel tests do not count).
    public var maxCPU: Duration?
    /// Attempt counts inside windows of the timeline.
    public var windows: [Window] = []
    /// Which interface the session uses at given instants.
    public var pathAt: [(at: Instant, path: String)] = []
    /// The state the machine is in at given instants.
    public var stateAt: [(at: Instant, state: String)] = []
    /// Whether an on-demand rule has the lockdown lifted at the end.
    public var lockdownLifted: Bool?
    /// Whether the agent's stop opened the machine (no stop: it did not).
    public var machineOpened: Bool?
    /// What others took away that the agent put back, at least or at most, and its holds (a
    /// fight held off).
    public var maxRestores: Int?
    public var minRestores: Int?
    public var maxHolds: Int?
    public var minHolds: Int?
    /// How many `agent exclude` requests were granted, and refused.
    public var excluded: Int?
    public var exclusionsRefused: Int?
    /// How many portal window requests were told no window is needed.
    public var portalWindowsNotNeeded: Int?
    /// How many portal window requests failed (the lockdown refused to open for the window).
    public var portalWindowsFailed: Int?
    /// How many times the agent restarted itself in place (a reload that changed the tunnel).
    public var restartsInPlace: Int?
    /// How many addresses of a proxy named by host the lockdown let through, and refused.
    public var proxiesAllowed: Int?
    public var proxiesRefused: Int?
    /// How many times the server's name gave nothing the session can use (the operator is told).
    public var serverNamesUnusable: Int?
    /// Servers whose every address at start lay inside `split-routes`, told to the operator (the
    /// first ends the agent instead), exactly.
    public var serversCarried: Int?
    /// Watchdog pings, requests for more time to start, and writes of the metrics file, exactly.
    public var watchdogPings: Int?
    public var startExtensions: Int?
    public var metricsWrites: Int?
    /// The tunnel's resolvers in force at given times (`resolvers-at`): those given to the
    /// system (none: an empty list), and those left out for being asked in clear.
    public var resolversAt: [(at: Instant, use: [IPAddress], inClear: [IPAddress])] = []
    /// How many times the tunnel's resolvers were decided (given to the system or found none), exactly.
    public var resolverDecisions: Int?
    /// Longest time something the agent keeps on the machine was missing.
    public var maxMissing: Duration?
    /// Whether the agent gives up (and exits): never, or within a stretch (`gives-up: true`:
    /// at any time).
    public var givesUp: GivingUp?
    public enum GivingUp: Sendable {
        case never
        case within(from: Instant, to: Instant)
    }

    public struct Window: Sendable {
        public var from: Instant
        public var to: Instant
        public var maxAttempts: Int?
        public var minAttempts: Int?
        public var maxHandshakes: Int?
        public var maxProbes: Int?
        public var maxChecks: Int?
        public var maxTransitions: Int?
    }
}
