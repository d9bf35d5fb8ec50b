import Topology
import CoreMetrics
public import Basics
import PathMonitor
import Prometheus
import Synchronization
public import Reconnector
public import Tunnel

/// The metrics both daemons expose, through swift-metrics into a Prometheus registry of their
/// own (never the process-wide one, so several can live in one process).
///
/// The data plane keeps its own counts (it must not pay for a shared atomic per packet); they
/// are carried into the counters here when the metrics are written or scraped, as the increase
/// since the last time.
public class RoamMetrics {
    let registry = PrometheusCollectorRegistry()
    let factory: PrometheusMetricsFactory
    private var lastTraffic = TrafficCounters()
    private var lastDrops = DropCounters()
    /// The data plane the last counts came from; another one starts from zero.
    var lastSource: ObjectIdentifier?

    /// Outages and handshakes last from milliseconds (a roam) to minutes (a train tunnel).
    static let durationBuckets: [Duration] = [
        .milliseconds(50), .milliseconds(100), .milliseconds(250), .milliseconds(500), .seconds(1), .milliseconds(2500),
        .seconds(5), .seconds(10), .seconds(30), .seconds(60), .seconds(300),
    ]

    init() {
        var factory = PrometheusMetricsFactory(registry: registry)
        factory.defaultDurationHistogramBuckets = Self.durationBuckets
        self.factory = factory
    }

    /// The Prometheus text format (version 0.0.4), as node_exporter's textfile collector and a
    /// scrape of `/metrics` read it.
    public func exposition() -> String { registry.emitToString() }

    /// Counts `amount` more; with zero, the series is there from now on, at its count.
    func count(_ name: String, _ labels: [(String, String)] = [], by amount: Int = 1) {
        CoreMetrics.Counter(label: name, dimensions: labels, factory: factory).increment(by: max(amount, 0))
    }

    func gauge(_ name: String, _ labels: [(String, String)] = [], _ value: Double) {
        Gauge(label: name, dimensions: labels, factory: factory).record(value)
    }

    /// Carries the data plane's counts in: bytes, packets, and drops by cause. Counts from
    /// another `source` than last time (a new session's data plane) start from zero.
    func sync(traffic: TrafficCounters, drops: DropCounters, source: ObjectIdentifier) {
        if source != lastSource {
            lastTraffic = TrafficCounters()
            lastDrops = DropCounters()
            lastSource = source
        }
        func increase<T: BinaryInteger>(_ now: T, _ before: T) -> Int { Int(clamping: now >= before ? now - before : now) }
        count("roam_bytes_total", [("direction", "in")], by: increase(traffic.bytesIn, lastTraffic.bytesIn))
        count("roam_bytes_total", [("direction", "out")], by: increase(traffic.bytesOut, lastTraffic.bytesOut))
        count("roam_packets_total", [("direction", "in")], by: increase(traffic.packetsIn, lastTraffic.packetsIn))
        count("roam_packets_total", [("direction", "out")], by: increase(traffic.packetsOut, lastTraffic.packetsOut))
        let local: [(String, Int, Int)] = [
            ("no-session", traffic.noSession, lastTraffic.noSession),
            ("send-failed", traffic.sendFailures, lastTraffic.sendFailures),
            ("offload", traffic.offloadDrops, lastTraffic.offloadDrops),
            ("handshake-queue-full", traffic.initiationsOverflowed, lastTraffic.initiationsOverflowed),
            // Bigger than the client's path carries; most are answered with ICMP (too_big_answered).
            ("too-big", traffic.tooBig, lastTraffic.tooBig),
        ]
        for (cause, now, before) in local { count("roam_drops_total", [("cause", cause)], by: increase(now, before)) }
        for reason in DropReason.allCases {
            count("roam_drops_total", [("cause", reason.description)], by: increase(drops[reason], lastDrops[reason]))
        }
        lastTraffic = traffic
        lastDrops = drops
    }
}

/// The client's metrics: the decision core's transitions, outages and roams, handshakes,
/// probes, netlink resyncs, and the data plane's bytes and drops.
public final class ClientMetrics: RoamMetrics {
    /// When the tunnel last stopped carrying traffic, while it does not.
    private var outageSince: Instant?
    /// Where the last connected state was: a connected state elsewhere is a roam.
    private var lastConnected: (path: Path, server: String?)?
    private var state: String?

    public override init() {
        super.init()
        // Every series an operator graphs is there from the start, at zero.
        for direction in ["in", "out"] {
            count("roam_bytes_total", [("direction", direction)], by: 0)
        }
        count("roam_netlink_resyncs_total", by: 0)
        count("roam_probes_total", by: 0)
        count("roam_handshake_resends_total", by: 0)
        count("roam_size_probes_total", by: 0)
        for result in ["started", "completed", "rejected"] { count("roam_handshakes_total", [("result", result)], by: 0) }
        for result in ["online", "portal", "unknown"] { count("roam_connectivity_checks_total", [("result", result)], by: 0) }
        gauge("roam_connected", [], 0)
        gauge("roam_portal_window_open", [], 0)
        gauge("roam_lockdown_lifted", [], 0)
    }

    /// Whose sockets the lockdown's exceptions are for (`LockdownPolicy.Owner.kind`): 1 for
    /// the one in force, 0 for the others.
    public func lockdownExceptions(for kind: String) {
        for each in ["own-cgroup", "started-cgroup", "any-mark"] { gauge("roam_lockdown_exceptions_for", [("match", each)], each == kind ? 1 : 0) }
    }

    /// An on-demand rule lifted the lockdown (or it came back).
    public func lockdownLifted(_ lifted: Bool) { gauge("roam_lockdown_lifted", [], lifted ? 1 : 0) }

    /// A connectivity check ended: `online`, `portal` or `unknown`.
    public func checked(_ result: String) { count("roam_connectivity_checks_total", [("result", result)]) }

    /// A portal window opened or closed.
    public func portalWindow(open: Bool) { gauge("roam_portal_window_open", [], open ? 1 : 0) }

    /// A transition of the decision core: counted by the state it led to and its reason; an
    /// outage ends when a connected state follows one that was not, and a connected state on
    /// another interface, source address, transport (UDP or the stream) or server is a roam of
    /// that kind.
    public func record(_ transition: Transition) {
        count("roam_transitions_total", [("to", transition.to.name), ("reason", Self.kind(of: transition.reason))])
        if let state { gauge("roam_state", [("state", state)], 0) }
        state = transition.to.name
        gauge("roam_state", [("state", transition.to.name)], 1)
        if case .connected = transition.to { gauge("roam_connected", [], 1) } else { gauge("roam_connected", [], 0) }
        if case .connected(let path, _, _) = transition.to {
            if let since = outageSince {
                Timer(label: "roam_outage_seconds", factory: factory).recordNanoseconds((transition.at - since).nanoseconds)
                outageSince = nil
            }
            if let last = lastConnected {
                let kind = last.server != transition.server ? "server"
                    : last.path.interface != path.interface ? "interface"
                    : last.path.source != path.source ? "address"
                    : last.path.transport != path.transport ? "transport" : nil
                if let kind { count("roam_roams_total", [("kind", kind)]) }
            }
            lastConnected = (path, transition.server)
        } else if transition.to == .paused {
            outageSince = nil  // taken down on purpose: no outage
        } else if case .portal = transition.to {
            // Behind a portal until someone logs in: the wait is the user's, not an outage.
            outageSince = nil
        } else if case .disconnected = transition.to {
            outageSince = nil  // an on-demand rule keeps it down: no outage
        } else if Self.carriesTraffic(transition.from), !Self.carriesTraffic(transition.to) {
            outageSince = transition.at
        }
    }

    /// Connected, or switching: make-before-break carries traffic on the old path while it
    /// tries the new one.
    static func carriesTraffic(_ state: State) -> Bool {
        switch state {
        case .connected, .switching: true
        default: false
        }
    }

    /// The kernel dropped netlink messages and the routing state was read again.
    public func resynced() { count("roam_netlink_resyncs_total") }

    /// Something the agent keeps on the machine (`routing`, `resolvers`, `lockdown`) was taken
    /// away by someone else and put back; a fight over it was held off.
    public func restored(_ holding: String) { count("roam_restored_total", [("what", holding)]) }
    public func upkeepHeld(_ holding: String) { count("roam_restore_holds_total", [("what", holding)]) }
    /// A probe went out on a path.
    public func probed() { count("roam_probes_total") }
    /// A probe padded to a tunnel packet's size went out (path MTU discovery).
    public func sizeProbed() { count("roam_size_probes_total") }
    /// The tunnel device's MTU now.
    public func tunnelMTU(_ mtu: Int) { gauge("roam_tunnel_mtu", [], Double(mtu)) }
    /// The handshake in flight was sent again within its attempt (no answer yet).
    public func resentHandshake() { count("roam_handshake_resends_total") }
    /// A handshake answered: `completed` or `rejected`.
    public func handshake(_ result: String) { count("roam_handshakes_total", [("result", result)]) }
    /// A stream to the server could not be opened, or broke.
    public func streamFailed() { count("roam_stream_failures_total") }

    /// The session's data plane's counts and the handshakes it started, carried in.
    public func sync(_ client: TunnelClient) {
        if ObjectIdentifier(client) != lastSource { handshakesStarted = 0 }
        sync(traffic: client.traffic, drops: client.drops, source: ObjectIdentifier(client))
        count("roam_handshakes_total", [("result", "started")], by: client.handshakeCount - handshakesStarted)
        handshakesStarted = max(handshakesStarted, client.handshakeCount)
        sessionProtocol(client.sessionProtocol)
    }

    /// What the session in use speaks: 1 for its version and cipher, 0 for the others (all 0
    /// without a session).
    public func sessionProtocol(_ session: SessionProtocol?) {
        for version in [UInt8(2), 3] {
            for cipher in CipherSuite.allCases {
                let now = session == SessionProtocol(version: version, cipher: cipher)
                gauge("roam_session_protocol", [("version", "\(version)"), ("cipher", cipher.description)], now ? 1 : 0)
            }
        }
    }
    private var handshakesStarted = 0

    /// `livenessTimeout(1s)` is `livenessTimeout`: a label's values must be a small set.
    static func kind(of reason: Reason) -> String {
        String(reason.description.prefix { $0 != "(" })
    }
}

/// The server's metrics: sessions, handshakes accepted and rejected, bytes and drops, and the
/// metrics endpoint's own drops; read from their counts at each scrape, from whichever thread
/// scrapes.
public final class ServerMetrics: Sendable {
    private let counts = Mutex(ServerCounts())

    public init() {}

    /// The metrics now, in the Prometheus text format; `directory` for a gateway with `users-from`.
    public func scrape(_ server: TunnelServer, endpoint dropped: MetricsEndpoint.Drops, directory: DirectoryFigures? = nil) -> String {
        counts.withLock { counts in
            counts.sync(server)
            counts.sync(endpoint: dropped)
            if let directory { counts.sync(directory: directory) }
            return counts.exposition()
        }
    }
}

/// A gateway's following of the fleet's user directory, as status and metrics show it.
public struct DirectoryFigures: Sendable {
    /// Connected and listening.
    public var reachable = false
    /// Where the users served were read: "database" or "snapshot".
    public var origin = "database"
    /// Users served, and rows refused.
    public var users = 0
    public var refused = 0
    /// Sets of users applied since start, and connections made again after a loss.
    public var changes = 0
    public var reconnects = 0
    /// Since when it is reachable or not.
    public var since = Instant.now()
    public var lastChange: Instant?
    public var error: String?
    public var snapshotWritten: Instant?
    public var snapshotError: String?
    public init() {}
}

final class ServerCounts: RoamMetrics {
    private var reconnects = 0
    private var changes = 0
    private var accepted = 0
    private var rejected = 0
    private var streamsAccepted = 0
    private var streamsRefused = 0
    private var admitted = Admissions()
    private var endpointDrops = MetricsEndpoint.Drops()

    override init() {
        super.init()
        for cause in ["evicted", "timeout"] { count("roam_metrics_connections_dropped_total", [("cause", cause)], by: 0) }
        for result in ["accepted", "rejected"] {
            count("roam_server_handshakes_total", [("result", result)], by: 0)
        }
        for lane in ["general", "peer"] { count("roam_server_handshake_admissions_total", [("lane", lane)], by: 0) }
    }

    func sync(directory: DirectoryFigures) {
        gauge("roam_directory_up", [], directory.reachable ? 1 : 0)
        gauge("roam_directory_users", [], Double(directory.users))
        gauge("roam_directory_refused_rows", [], Double(directory.refused))
        gauge("roam_directory_state_seconds", [], Double((Instant.now() - directory.since).nanoseconds) / 1e9)
        count("roam_directory_reconnects_total", [], by: directory.reconnects - reconnects)
        count("roam_directory_changes_total", [], by: directory.changes - changes)
        reconnects = directory.reconnects
        changes = directory.changes
    }

    func sync(_ server: TunnelServer) {
        let handshakes = server.handshakeCounts
        gauge("roam_server_sessions", [], Double(server.liveSessions))
        let spoken = server.sessionsByProtocol
        for version in ProtocolPolicy.supportedVersions.sorted() {
            for cipher in CipherSuite.allCases where version >= 3 || cipher == .chacha20Poly1305 {  // version 2 has one cipher
                let count = spoken[SessionProtocol(version: version, cipher: cipher)] ?? 0
                gauge("roam_server_sessions_by_protocol", [("version", "\(version)"), ("cipher", cipher.description)], Double(count))
            }
        }
        if server.servesStreams {
            let streams = server.streamCounts
            let onStreams = server.sessionsOnStreams
            gauge("roam_server_streams_open", [], Double(streams.open))
            count("roam_server_streams_accepted_total", [], by: streams.accepted - streamsAccepted)
            count("roam_server_streams_refused_total", [], by: streams.refused - streamsRefused)
            streamsAccepted = max(streamsAccepted, streams.accepted)
            streamsRefused = max(streamsRefused, streams.refused)
            gauge("roam_server_sessions_by_transport", [("transport", "stream")], Double(onStreams))
            gauge("roam_server_sessions_by_transport", [("transport", "udp")], Double(max(0, server.liveSessions - onStreams)))
        }
        count("roam_server_handshakes_total", [("result", "accepted")], by: handshakes.accepted - accepted)
        count("roam_server_handshakes_total", [("result", "rejected")], by: handshakes.rejected - rejected)
        accepted = max(accepted, handshakes.accepted)
        rejected = max(rejected, handshakes.rejected)
        let admissions = server.admissions
        count("roam_server_handshake_admissions_total", [("lane", "general")], by: admissions.general - admitted.general)
        count("roam_server_handshake_admissions_total", [("lane", "peer")], by: admissions.peer - admitted.peer)
        admitted = admissions
        sync(traffic: server.traffic, drops: server.drops, source: ObjectIdentifier(server))
    }

    /// Carries in the connections the metrics endpoint dropped since the last scrape.
    func sync(endpoint dropped: MetricsEndpoint.Drops) {
        count("roam_metrics_connections_dropped_total", [("cause", "evicted")], by: dropped.evicted - endpointDrops.evicted)
        count("roam_metrics_connections_dropped_total", [("cause", "timeout")], by: dropped.timedOut - endpointDrops.timedOut)
        endpointDrops = dropped
    }
}
