import Basics
import Device

/// The gateway's table of version 3 first parts (the clients' ephemeral KEM keys), kept until
/// their second parts arrive: by source address and sender index, for `lifetime` at most, at
/// most `perSource` from one address and `capacity` in all (1,184 bytes each: 1.2 MB for the
/// default 1,024). A part is kept only after its mac1 (and, under load, its cookie) checked
/// out, so spoofed sources cannot fill it; what a full table cannot take is refused and
/// counted, never made room for by pushing out a part already kept.
struct InitiationParts {
    struct Key: Hashable {
        var source: SocketAddress
        var index: UInt32
    }

    static let lifetime: Duration = .seconds(2)
    let capacity: Int
    let perSource: Int
    private var parts: [Key: (kemKey: [UInt8], at: Instant)] = [:]
    private var bySource: [IPAddress: Int] = [:]
    private var nextSweep: Instant?

    init(capacity: Int = 1024, perSource: Int = 4) {
        self.capacity = capacity
        self.perSource = perSource
    }

    var count: Int { parts.count }

    /// Why a first part was not kept.
    enum Refusal: Error, Equatable {
        /// The table is full of parts younger than `lifetime`.
        case full
        /// Its address has `perSource` parts waiting already.
        case tooManyFromSource
    }

    /// Keeps `kemKey` for the second part from `source` with sender `index` (a part that comes
    /// again replaces the one kept).
    mutating func keep(_ kemKey: [UInt8], from source: SocketAddress, index: UInt32, now: Instant) throws(Refusal) {
        sweep(now: now)
        let key = Key(source: source, index: index)
        if parts[key] != nil {
            parts[key] = (kemKey, now)
            return
        }
        guard bySource[source.ip, default: 0] < perSource else { throw .tooManyFromSource }
        guard parts.count < capacity else { throw .full }
        parts[key] = (kemKey, now)
        bySource[source.ip, default: 0] += 1
    }

    /// The first part for the second part from `source` with sender `index`, taken out of the
    /// table; nil when there is none younger than `lifetime`.
    mutating func take(from source: SocketAddress, index: UInt32, now: Instant) -> [UInt8]? {
        let key = Key(source: source, index: index)
        guard let part = parts.removeValue(forKey: key) else { return nil }
        forget(source.ip)
        return now - part.at < Self.lifetime ? part.kemKey : nil
    }

    /// Drops what is older than `lifetime`, at most once per `lifetime` (a sweep walks the table).
    private mutating func sweep(now: Instant) {
        if let due = nextSweep, now < due, parts.count < capacity { return }
        nextSweep = now + Self.lifetime
        for (key, part) in parts where now - part.at >= Self.lifetime {
            parts[key] = nil
            forget(key.source.ip)
        }
    }

    private mutating func forget(_ source: IPAddress) {
        let left = bySource[source, default: 1] - 1
        bySource[source] = left > 0 ? left : nil
    }
}
