/// Why a datagram was dropped. Every drop is counted under exactly one reason.
public enum DropReason: Int, CaseIterable, Sendable, Error, CustomStringConvertible {
    /// Too short or too long for its type, an unknown type, reserved bits set, or an
    /// authenticated payload that does not parse.
    case malformed
    /// The version byte is not one this build speaks.
    case unsupportedVersion
    /// A handshake in a version this server's operator does not allow (`allow-versions:`).
    case versionNotAllowed
    /// A version 3 initiation's second part whose first part the server does not hold: lost,
    /// older than two seconds, refused by a full table, or sent from another address.
    case missingPart
    /// A version 3 client offers no cipher this server may use (its operator pinned another).
    case noCommonCipher
    /// The initiation's mac1 is wrong: not meant for this server, or random bytes.
    case badMAC
    /// An initiation without proof that its sender receives at its address (a valid mac2), while
    /// the server, the source's budget or its network's is under load, or before a password
    /// check: answered with a cookie reply.
    case cookieRequired
    /// Over a per-source budget (handshakes, Argon2id checks), or, at a client, over its
    /// own limit on answering cookie replies.
    case rateLimited
    /// Over a per-network budget (an IPv4 /24, an IPv6 /48) for handshakes or Argon2id checks.
    case networkLimited
    /// Over a server-wide budget: handshakes of senders without a session, or Argon2id checks.
    case serverLimited
    /// Over the lane reserved for peers with a session: that peer's own budget, or the lane's.
    case peerLimited
    /// Over the Argon2id budget of one account (or of one claimed name that is nobody's).
    case accountLimited
    /// The Noise handshake did not authenticate: wrong pinned server key, tampering, or a
    /// response that does not match the initiation in flight.
    case handshakeFailed
    /// No user has that username or static key.
    case unknownUser
    /// The user exists but pins a different static key.
    case wrongKey
    /// The user needs a password and the initiation carried none, or a wrong one.
    case badPassword
    /// The initiation's timestamp is not newer than the last one accepted for that user.
    case replayedHandshake
    /// A data packet for a receiver index this side does not hold (the server may send a hint).
    case unknownSession
    /// The data packet's tag did not verify: tampered, or sealed with other keys.
    case decryptFailed
    /// The data packet's counter was seen before or is too far behind the newest.
    case replayed
    /// The session is past its message or age limit and accepts nothing more.
    case sessionExpired
    /// An inner packet whose source the peer may not use: at the server, not the client's inner
    /// address; at a split-mode client, outside the prefixes the tunnel routes.
    case wrongInnerSource
    /// An unauthenticated message (a "session unknown" hint) from an address that is not the
    /// server's: anyone can send one, so only the server's own address and port count.
    case foreignSource
    /// A well-formed message this side never expects: a response with no handshake in flight,
    /// an initiation at a client, a hint for a session we do not use, a probe at a client.
    case unexpected

    /// The reason as operator logs and `agent status` show it.
    public var description: String {
        switch self {
        case .malformed: "malformed"
        case .unsupportedVersion: "unsupported-version"
        case .versionNotAllowed: "version-not-allowed"
        case .missingPart: "missing-part"
        case .noCommonCipher: "no-common-cipher"
        case .badMAC: "bad-mac"
        case .cookieRequired: "cookie-required"
        case .rateLimited: "rate-limited"
        case .networkLimited: "network-limited"
        case .serverLimited: "server-limited"
        case .peerLimited: "peer-limited"
        case .accountLimited: "account-limited"
        case .handshakeFailed: "handshake-failed"
        case .unknownUser: "unknown-user"
        case .wrongKey: "wrong-key"
        case .badPassword: "bad-password"
        case .replayedHandshake: "replayed-handshake"
        case .unknownSession: "unknown-session"
        case .decryptFailed: "decrypt-failed"
        case .replayed: "replayed"
        case .sessionExpired: "session-expired"
        case .wrongInnerSource: "wrong-inner-source"
        case .foreignSource: "foreign-source"
        case .unexpected: "unexpected"
        }
    }
}

/// Dropped datagrams, counted by reason.
public struct DropCounters: Equatable, Sendable, CustomStringConvertible {
    private var counts = [UInt64](repeating: 0, count: DropReason.allCases.count)

    public init() {}

    /// Drops counted for `reason`.
    public subscript(reason: DropReason) -> UInt64 { counts[reason.rawValue] }

    /// All drops.
    public var total: UInt64 { counts.reduce(0, &+) }

    mutating func count(_ reason: DropReason) { counts[reason.rawValue] &+= 1 }

    /// Adds another set of counts (a session's that ended) to these.
    public mutating func add(_ other: DropCounters) {
        for i in counts.indices { counts[i] &+= other.counts[i] }
    }

    /// Non-zero counters as `reason=n` pairs, in declaration order.
    public var description: String {
        DropReason.allCases.filter { self[$0] > 0 }.map { "\($0)=\(self[$0])" }.joined(separator: " ")
    }
}
