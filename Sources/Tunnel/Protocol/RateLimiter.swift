import Basics

/// Rates that bound the work and traffic a flood can cause. See docs/PROTOCOL.md, "DoS defences".
public struct ServerLimits: Equatable, Sendable {
    /// Handshakes one source may start per second, sustained, and in a burst. A source is an
    /// IPv4 address or an IPv6 /64 (what one host or one NAT can cheaply spread over).
    public var handshakesPerSource: Rate
    /// Handshakes one network may start (an IPv4 /24, an IPv6 /48): a host with a routed IPv6
    /// prefix has 256 /64s in a /56 that really receive, and must not get a budget for each.
    public var handshakesPerNetwork: Rate
    /// Handshakes the whole server does for senders without a session here (each costs four
    /// X25519 operations). A flood from many networks can use it up; peers with a session do
    /// not need it (`peerHandshakes`).
    public var handshakes: Rate
    /// What one network may take of the last quarter of `handshakes` (the reserve): once a
    /// flood from many networks has spent the rest, each network gets this much of what is left,
    /// so a network that sends a first login now and then still gets in, and one that floods gets
    /// its share and no more.
    public var reservePerNetwork: Rate
    /// The lane reserved for peers with a session here: a handshake from the address a peer's
    /// authenticated packets come from (or its last accepted handshake came from), proven by a
    /// cookie, is not held to the budgets above but to these, which nobody else can spend.
    public var peerHandshakes: Rate
    /// Handshakes one peer may make in its reserved lane: a rekey every two minutes and its retries.
    public var handshakesPerPeer: Rate
    /// Argon2id checks the whole server starts (each costs about 80 ms of a core and 64 MiB at the
    /// interactive cost). Only a first login, or a changed password, needs one: rekeys present a
    /// password the server already verified and cost one HMAC.
    public var passwordChecks: Rate
    /// Argon2id checks one source may cause: well under the server's total, so one host guessing
    /// passwords cannot use up everybody's logins.
    public var passwordChecksPerSource: Rate
    /// Argon2id checks spent on one account by checks that could succeed (the user exists and the
    /// static key is one it may use): guesses at one account cannot use up everybody's logins,
    /// and spreading them over many hosts does not guess faster. Checks that cannot succeed (an
    /// unknown name or key, a key the user does not pin) spend as much of a budget of the
    /// claimed name's own, never an account's: to a prober both look alike.
    public var passwordChecksPerAccount: Rate
    /// Argon2id checks one network may cause (an IPv4 /24, an IPv6 /48): a host with a routed
    /// IPv6 prefix has thousands of /64s that really receive, and must not get a budget for each.
    public var passwordChecksPerNetwork: Rate
    /// Session-unknown hints sent to one source.
    public var hintsPerSource: Rate
    /// Session-unknown hints sent in all.
    public var hints: Rate
    /// Sources tracked at once per table; past it, idle ones are forgotten, and new ones wait.
    public var trackedSources: Int

    public init(
        handshakesPerSource: Rate = Rate(perSecond: 5, burst: 10),
        handshakesPerNetwork: Rate = Rate(perSecond: 20, burst: 50),
        handshakes: Rate = Rate(perSecond: 1000, burst: 500),
        reservePerNetwork: Rate = Rate(perSecond: 1, burst: 3),
        peerHandshakes: Rate = Rate(perSecond: 500, burst: 500),
        handshakesPerPeer: Rate = Rate(perSecond: 2, burst: 10),
        passwordChecks: Rate = Rate(perSecond: 5, burst: 10),
        passwordChecksPerSource: Rate = Rate(perSecond: 0.5, burst: 2),
        passwordChecksPerAccount: Rate = Rate(perSecond: 2, burst: 4),
        passwordChecksPerNetwork: Rate = Rate(perSecond: 0.5, burst: 2),
        hintsPerSource: Rate = Rate(perSecond: 1, burst: 3),
        hints: Rate = Rate(perSecond: 1000, burst: 1000),
        trackedSources: Int = 65_536
    ) {
        self.handshakesPerSource = handshakesPerSource
        self.handshakesPerNetwork = handshakesPerNetwork
        self.handshakes = handshakes
        self.reservePerNetwork = reservePerNetwork
        self.peerHandshakes = peerHandshakes
        self.handshakesPerPeer = handshakesPerPeer
        self.passwordChecks = passwordChecks
        self.passwordChecksPerSource = passwordChecksPerSource
        self.passwordChecksPerAccount = passwordChecksPerAccount
        self.passwordChecksPerNetwork = passwordChecksPerNetwork
        self.hintsPerSource = hintsPerSource
        self.hints = hints
        self.trackedSources = trackedSources
    }

    /// A token bucket's refill rate and size.
    public struct Rate: Equatable, Sendable {
        public var perSecond: Double
        public var burst: Double
        public init(perSecond: Double, burst: Double) {
            self.perSecond = perSecond
            self.burst = burst
        }
    }
}

/// A token bucket: starts full, refills at `rate.perSecond` up to `rate.burst`, one token per event.
struct TokenBucket {
    let rate: ServerLimits.Rate
    private var tokens: Double
    private var updated: Instant?

    init(_ rate: ServerLimits.Rate) {
        self.rate = rate
        tokens = rate.burst
    }

    /// Takes a token if there is one.
    mutating func take(now: Instant) -> Bool {
        refill(now: now)
        guard tokens >= 1 else { return false }
        tokens -= 1
        return true
    }

    /// True when `take` would succeed now.
    func canTake(now: Instant) -> Bool { available(now: now) >= 1 }

    /// True when the bucket would be full now: forgetting it changes nothing.
    func isFull(now: Instant) -> Bool { available(now: now) >= rate.burst }

    /// Tokens in the bucket now.
    func available(now: Instant) -> Double {
        var copy = self
        copy.refill(now: now)
        return copy.tokens
    }

    private mutating func refill(now: Instant) {
        if let updated, now > updated {
            tokens = min(rate.burst, tokens + (now - updated).inSeconds * rate.perSecond)
        }
        if updated.map({ now > $0 }) ?? true { updated = now }
    }
}

/// A token bucket per key, in a table of bounded size so spoofed sources or made-up usernames
/// cannot grow it without end. Idle (full) buckets are forgotten at most once a second.
struct KeyedRateLimiter<Key: Hashable & Sendable>: Sendable {
    private let rate: ServerLimits.Rate
    private let capacity: Int
    private var buckets: [Key: TokenBucket] = [:]
    private var lastPrune: Instant?

    init(_ rate: ServerLimits.Rate, capacity: Int) {
        self.rate = rate
        self.capacity = capacity
    }

    mutating func allow(_ key: Key, now: Instant) -> Bool {
        guard wouldAllow(key, now: now) else { return false }
        take(key, now: now)
        return true
    }

    /// Spends a token that `wouldAllow` found.
    mutating func take(_ key: Key, now: Instant) { _ = buckets[key, default: TokenBucket(rate)].take(now: now) }

    /// True when `allow` would take a token now; takes none. Checking every budget before
    /// taking from any means a refusal by one does not use up the others.
    mutating func wouldAllow(_ key: Key, now: Instant) -> Bool {
        if buckets[key] == nil, buckets.count >= capacity {
            prune(now: now)
            guard buckets.count < capacity else { return false }
        }
        return available(key, now: now) >= 1
    }

    /// Tokens in `key`'s bucket now.
    func available(_ key: Key, now: Instant) -> Double { buckets[key].map { $0.available(now: now) } ?? rate.burst }

    /// True when `key`'s bucket is less than half full: spent by a flood, so what is left is kept
    /// for senders that prove their address.
    func isLow(_ key: Key, now: Instant) -> Bool { available(key, now: now) < rate.burst / 2 }

    /// Forgets full buckets, at most once a second (a prune walks the whole table).
    mutating func prune(now: Instant) {
        if let lastPrune, now - lastPrune < .seconds(1) { return }
        lastPrune = now
        buckets = buckets.filter { !$0.value.isFull(now: now) }
    }
}

/// A token bucket per source: a host (an IPv4 address, an IPv6 /64, since one host can use a
/// whole /64) or a network (an IPv4 /24, an IPv6 /48).
struct SourceRateLimiter: Sendable {
    enum Scope: Sendable { case host, network }
    private let scope: Scope
    private var table: KeyedRateLimiter<IPAddress>

    init(_ rate: ServerLimits.Rate, capacity: Int, per scope: Scope = .host) {
        table = KeyedRateLimiter(rate, capacity: capacity)
        self.scope = scope
    }

    mutating func allow(_ address: IPAddress, now: Instant) -> Bool { table.allow(key(address), now: now) }

    mutating func wouldAllow(_ address: IPAddress, now: Instant) -> Bool { table.wouldAllow(key(address), now: now) }

    /// Spends a token that `wouldAllow` found.
    mutating func take(_ address: IPAddress, now: Instant) { table.take(key(address), now: now) }

    /// See `KeyedRateLimiter.isLow`.
    func isLow(_ address: IPAddress, now: Instant) -> Bool { table.isLow(key(address), now: now) }

    mutating func prune(now: Instant) { table.prune(now: now) }

    private func key(_ address: IPAddress) -> IPAddress { Self.key(address, scope) }

    /// What `address` counts as within `scope`: an IPv4 address or an IPv6 /64 for a host, an
    /// IPv4 /24 or an IPv6 /48 for a network.
    static func key(_ address: IPAddress, _ scope: Scope) -> IPAddress {
        switch (address, scope) {
        case (.v4, .host): address
        case (.v4(let a), .network): .v4(a & 0xFFFF_FF00)
        case (.v6(let high, _), .host): .v6(high, 0)
        case (.v6(let high, _), .network): .v6(high & 0xFFFF_FFFF_FFFF_0000, 0)
        }
    }
}

/// The last `capacity` keys inserted, oldest forgotten first.
struct RecentSet<Key: Hashable & Sendable>: Sendable {
    private let capacity: Int
    private var members: Set<Key> = []
    private var order: [Key] = []
    private var next = 0

    init(capacity: Int) { self.capacity = capacity }

    func contains(_ key: Key) -> Bool { members.contains(key) }

    mutating func insert(_ key: Key) {
        guard !members.contains(key) else { return }
        if order.count < capacity {
            order.append(key)
        } else {
            members.remove(order[next])
            order[next] = key
            next = (next + 1) % capacity
        }
        members.insert(key)
    }
}
