import Basics
import Device

/// The gateway's table of version 3 first parts (the clients' ephemeral KEM keys), kept until
/// their second parts arrive: by source address and sender index, for `lifetime` at most,
/// within bounds: `perSource` from one host (an IPv4 address, an IPv6 /64), `perNetwork` from
/// one network (an IPv4 /24, an IPv6 /48), `capacity` in all (1,184 bytes each: 1.2 MB for the
/// default 1,024), and `peerCapacity` more held back for addresses where a peer proved itself,
/// so rekeys go on whatever fills the rest. mac1 is no proof of anything (anyone who knows the
/// server's key computes it, and a part can be replayed from any source): a part whose sender
/// did not prove its address (a cookie) may take only half of each bound (`needsProof`), so
/// spoofed parts can never fill what proven senders need. What a full table cannot take is
/// refused and counted, never made room for by pushing out a part already kept.
struct InitiationParts {
    struct Key: Hashable {
        var source: SocketAddress
        var index: UInt32
    }

    private struct Part {
        var kemKey: [UInt8]
        var at: Instant
        var peer: Bool
    }

    static let lifetime: Duration = .seconds(2)
    let capacity: Int
    let peerCapacity: Int
    let perSource: Int
    let perNetwork: Int
    private var parts: [Key: Part] = [:]
    private var bySource: [IPAddress: Int] = [:]
    private var byNetwork: [IPAddress: Int] = [:]
    private var peers = 0
    private var nextSweep: Instant?

    init(capacity: Int = 1024, peerCapacity: Int = 256, perSource: Int = 4, perNetwork: Int = 32) {
        self.capacity = capacity
        self.peerCapacity = peerCapacity
        self.perSource = perSource
        self.perNetwork = perNetwork
    }

    var count: Int { parts.count }

    /// Why a first part was not kept.
    enum Refusal: Error, Equatable {
        /// The table (or the peers' share of it) is full of parts younger than `lifetime`.
        case full
        /// Its host has `perSource` parts waiting already.
        case tooManyFromSource
        /// Its network has `perNetwork` parts waiting already.
        case tooManyFromNetwork

        var reason: DropReason {
            switch self {
            case .full: .serverLimited
            case .tooManyFromSource: .rateLimited
            case .tooManyFromNetwork: .networkLimited
            }
        }
    }

    /// Whether a part from `source` must come with proof of its address to be kept now: its
    /// host's, its network's or everyone's share is half taken.
    mutating func needsProof(_ source: IPAddress, now: Instant) -> Bool {
        sweep(now: now)
        return bySource[SourceRateLimiter.key(source, .host), default: 0] >= perSource / 2
            || byNetwork[SourceRateLimiter.key(source, .network), default: 0] >= perNetwork / 2
            || parts.count - peers >= capacity / 2
    }

    /// Keeps `kemKey` for the second part from `source` with sender `index` (a part that comes
    /// again replaces the one kept). `proven`: the sender proved its address (a cookie), and
    /// the part may take the whole of each bound, not half. `peer`: a peer proved itself at
    /// `source` too, and the part may take the peers' share when everyone's is full.
    mutating func keep(_ kemKey: [UInt8], from source: SocketAddress, index: UInt32, proven: Bool = false, peer: Bool = false,
                       now: Instant) throws(Refusal) {
        sweep(now: now)
        let key = Key(source: source, index: index)
        if let kept = parts[key] {
            parts[key] = Part(kemKey: kemKey, at: now, peer: kept.peer)
            return
        }
        let host = SourceRateLimiter.key(source.ip, .host), network = SourceRateLimiter.key(source.ip, .network)
        guard bySource[host, default: 0] < (proven ? perSource : perSource / 2) else { throw .tooManyFromSource }
        guard byNetwork[network, default: 0] < (proven ? perNetwork : perNetwork / 2) else { throw .tooManyFromNetwork }
        let inPeersShare: Bool
        if parts.count - peers < (proven ? capacity : capacity / 2) {
            inPeersShare = false
        } else if peer, proven, peers < peerCapacity {
            inPeersShare = true
        } else {
            throw .full
        }
        parts[key] = Part(kemKey: kemKey, at: now, peer: inPeersShare)
        bySource[host, default: 0] += 1
        byNetwork[network, default: 0] += 1
        if inPeersShare { peers += 1 }
    }

    /// The first part for the second part from `source` with sender `index`, taken out of the
    /// table; nil when there is none younger than `lifetime`.
    mutating func take(from source: SocketAddress, index: UInt32, now: Instant) -> [UInt8]? {
        let key = Key(source: source, index: index)
        guard let part = parts.removeValue(forKey: key) else { return nil }
        forget(key, part)
        return now - part.at < Self.lifetime ? part.kemKey : nil
    }

    /// Drops what is older than `lifetime`, at most every tenth of a second (a sweep walks the
    /// table, which a flood keeps full).
    mutating func sweep(now: Instant) {
        if let due = nextSweep, now < due { return }
        nextSweep = now + .milliseconds(100)
        for (key, part) in parts where now - part.at >= Self.lifetime {
            parts[key] = nil
            forget(key, part)
        }
    }

    private mutating func forget(_ key: Key, _ part: Part) {
        func decrement(_ table: inout [IPAddress: Int], _ address: IPAddress) {
            let left = table[address, default: 1] - 1
            table[address] = left > 0 ? left : nil
        }
        decrement(&bySource, SourceRateLimiter.key(key.source.ip, .host))
        decrement(&byNetwork, SourceRateLimiter.key(key.source.ip, .network))
        if part.peer { peers -= 1 }
    }
}
