import Basics
public import Tunnel
public import ControlWire

/// A gateway's status as the control socket gives it (docs/CONTROL.md), typed: `json` writes it.
public struct ServerStatus: Sendable {
    /// Peers with a session now.
    public var sessions: Int
    public var draining: Bool
    public var workers: Int
    public var offload: String
    public var traffic: TrafficCounters
    public var drops: DropCounters
    public var admissions: Admissions
    /// The users served now.
    public var users: Int
    /// Nil unless the gateway serves streams (`tcp:`).
    public var streams: Streams?
    /// Nil unless the users come from the directory (`users-from`).
    public var directory: Directory?
    /// The versions and cipher allowed.
    public var protocols: ProtocolPolicy
    /// The sessions now, by what they speak.
    public var sessionsByProtocol: [SessionProtocol: Int]

    public init(
        sessions: Int, draining: Bool, workers: Int, offload: String, traffic: TrafficCounters, drops: DropCounters,
        admissions: Admissions, users: Int, streams: Streams?, directory: Directory?, protocols: ProtocolPolicy,
        sessionsByProtocol: [SessionProtocol: Int]
    ) {
        self.sessions = sessions
        self.draining = draining
        self.workers = workers
        self.offload = offload
        self.traffic = traffic
        self.drops = drops
        self.admissions = admissions
        self.users = users
        self.streams = streams
        self.directory = directory
        self.protocols = protocols
        self.sessionsByProtocol = sessionsByProtocol
    }

    public var json: JSON {
        let spoken = sessionsByProtocol.sorted { ($0.key.version, $0.key.cipher.rawValue) < ($1.key.version, $1.key.cipher.rawValue) }
        return .object([
            ("role", .string("server")), ("sessions", .count(sessions)), ("draining", .bool(draining)), ("workers", .count(workers)),
            ("offload", .string(offload)),
            ("traffic", .traffic(traffic, extra: [("initiations_overflowed", .count(traffic.initiationsOverflowed))])),
            ("drops", .drops(drops, traffic)),
            ("admissions", .object([("general", .count(admissions.general)), ("peer", .count(admissions.peer))])),
            ("users", .count(users)), ("streams", streams?.json ?? .null), ("directory", directory?.json ?? .null),
            ("protocols", .object([
                ("allowed", .array(protocols.versions.sorted().map(JSON.count))),
                ("cipher", .string(protocols.cipher?.description ?? "negotiated")),
                ("sessions", .array(spoken.map {
                    .object([("version", .count($0.key.version)), ("cipher", .string($0.key.cipher.description)), ("count", .count($0.value))])
                })),
            ])),
        ])
    }

    /// The stream listener: its port, streams open now, accepted since start, refused past the
    /// limits, and the sessions whose packets come over a stream now.
    public struct Streams: Sendable {
        public var port: Int
        public var open: Int
        public var accepted: Int
        public var refused: Int
        public var sessions: Int

        public init(port: Int, open: Int, accepted: Int, refused: Int, sessions: Int) {
            self.port = port
            self.open = open
            self.accepted = accepted
            self.refused = refused
            self.sessions = sessions
        }

        var json: JSON {
            .object([("port", .count(port)), ("open", .count(open)), ("accepted", .count(accepted)), ("refused", .count(refused)),
                     ("sessions", .count(sessions))])
        }
    }

    /// The following of the user directory; times as how long ago, written in whole milliseconds.
    public struct Directory: Sendable {
        /// Connected and listening (`following`), or not (`unreachable`).
        public var reachable: Bool
        /// Where the users served were read: `database` or `snapshot`.
        public var origin: String
        /// How long it has been reachable or not.
        public var duration: Duration
        public var users: Int
        public var refused: Int
        public var changes: Int
        public var reconnects: Int
        public var lastChange: Duration?
        public var error: String?
        public var snapshot: String
        public var snapshotWritten: Duration?
        public var snapshotError: String?
        /// What the session records are under.
        public var gateway: String

        public init(
            reachable: Bool, origin: String, duration: Duration, users: Int, refused: Int, changes: Int, reconnects: Int,
            lastChange: Duration?, error: String?, snapshot: String, snapshotWritten: Duration?, snapshotError: String?, gateway: String
        ) {
            self.reachable = reachable
            self.origin = origin
            self.duration = duration
            self.users = users
            self.refused = refused
            self.changes = changes
            self.reconnects = reconnects
            self.lastChange = lastChange
            self.error = error
            self.snapshot = snapshot
            self.snapshotWritten = snapshotWritten
            self.snapshotError = snapshotError
            self.gateway = gateway
        }

        var json: JSON {
            let ms = { (ago: Duration?) -> JSON in ago.map { .int($0.nanoseconds / 1_000_000) } ?? .null }
            return .object([
                ("state", .string(reachable ? "following" : "unreachable")), ("origin", .string(origin)), ("for_ms", ms(duration)),
                ("users", .count(users)), ("refused", .count(refused)), ("changes", .count(changes)), ("reconnects", .count(reconnects)),
                ("last_change_ms_ago", ms(lastChange)), ("error", .optional(error)), ("snapshot", .string(snapshot)),
                ("snapshot_written_ms_ago", ms(snapshotWritten)), ("snapshot_error", .optional(snapshotError)), ("gateway", .string(gateway)),
            ])
        }
    }
}
