import Basics

/// Things avoided for a while because they failed (paths that went silent, servers that did),
/// with how often they failed: each failure again holds its key down twice as long as the one
/// before, up to a cap. A hold-down that ran out keeps its strikes until it is cleared, so what
/// failed before and fails again is avoided longer. Kept by `Reconnector`; the durations are its
/// configuration's, given with each strike (a reload may change them).
struct HoldDowns<Key: Hashable & Sendable>: Sendable {
    /// One key's hold-down: avoided until `until`, after `strikes` failures.
    struct Hold: Equatable, Sendable {
        var until: Instant
        var strikes: Int
    }

    private(set) var entries: [Key: Hold] = [:]

    init() {}

    /// Hold-downs as a previous process left them.
    init(_ entries: [Key: Hold]) { self.entries = entries }

    /// The hold-down on `key`, whether or not it ran out.
    subscript(key: Key) -> Hold? { entries[key] }

    /// `key` is avoided now.
    func isHeld(_ key: Key, _ now: Instant) -> Bool {
        entries[key].map { now < $0.until } ?? false
    }

    /// `key` failed (again): avoided for `base`, doubled for each earlier strike, up to `cap`.
    mutating func strike(_ key: Key, _ now: Instant, base: Duration, cap: Duration) {
        let strikes = (entries[key]?.strikes ?? 0) + 1
        let hold = min(cap, base * (1 << min(strikes - 1, 20)))
        entries[key] = Hold(until: now + hold, strikes: strikes)
    }

    /// `key` worked: its failures are forgotten.
    mutating func clear(_ key: Key) { entries[key] = nil }

    mutating func removeAll() { entries.removeAll() }

    /// Forgets the keys `isKept` refuses.
    mutating func keep(where isKept: (Key) -> Bool) {
        if !entries.isEmpty { entries = entries.filter { key, _ in isKept(key) } }
    }

    /// Every hold-down ends `step` later (a clock that stepped, a sleep in which nothing was learnt).
    mutating func shift(by step: Duration) {
        entries = entries.mapValues { Hold(until: $0.until + step, strikes: $0.strikes) }
    }
}
