import Glibc
/// A point on the agent's clock (CLOCK_BOOTTIME in the daemon, so suspended time counts;
/// virtual in a replay). The origin is arbitrary; only differences mean anything.
public struct Instant: Comparable, Hashable, Sendable, CustomStringConvertible {
    public var nanoseconds: Int64
    public init(nanoseconds: Int64) { self.nanoseconds = nanoseconds }

    public static let zero = Instant(nanoseconds: 0)

    public static func + (a: Instant, d: Duration) -> Instant { Instant(nanoseconds: a.nanoseconds &+ d.nanoseconds) }
    public static func - (a: Instant, d: Duration) -> Instant { Instant(nanoseconds: a.nanoseconds &- d.nanoseconds) }
    public static func - (a: Instant, b: Instant) -> Duration { .nanoseconds(a.nanoseconds &- b.nanoseconds) }
    public static func < (a: Instant, b: Instant) -> Bool { a.nanoseconds < b.nanoseconds }

    /// Seconds since the origin with millisecond precision, as log lines show it.
    public var description: String {
        let ms = nanoseconds / 1_000_000
        let sign = ms < 0 ? "-" : ""
        let abs = ms.magnitude
        return "\(sign)\(abs / 1000)." + String(String(abs % 1000 + 1000).dropFirst())
    }
}

extension Duration {
    /// `lhs` times `rhs`, exactly as the standard library's generic `*` computes it (in 128-bit
    /// attoseconds, trapping where it traps), without its generic dispatch: the core scales its
    /// timeouts on every event, and the generic operator took 9 % of its time (measured).
    @inlinable
    public static func * (lhs: Duration, rhs: Int) -> Duration { Duration(attoseconds: lhs.attoseconds * Int128(rhs)) }

    /// `lhs` divided by `rhs`, truncated to the attosecond, as the standard library's generic `/`.
    @inlinable
    public static func / (lhs: Duration, rhs: Int) -> Duration { Duration(attoseconds: lhs.attoseconds / Int128(rhs)) }

    /// The duration in whole nanoseconds, saturating far beyond any timer the agent arms.
    public var nanoseconds: Int64 {
        let (seconds, attoseconds) = components
        let (whole, overflow) = seconds.multipliedReportingOverflow(by: 1_000_000_000)
        if overflow { return seconds < 0 ? .min : .max }
        return whole &+ attoseconds / 1_000_000_000
    }

    /// Seconds with `decimals` digits after the point, rounded: `1.500`, `-0.020`.
    public func seconds(decimals: Int) -> String {
        let digits = min(max(decimals, 0), 9)
        var scale: Int64 = 1
        for _ in 0..<(9 - digits) { scale *= 10 }
        let ns = nanoseconds
        let units = (ns.magnitude + UInt64(scale / 2)) / UInt64(scale)
        var one: UInt64 = 1
        for _ in 0..<digits { one *= 10 }
        let fraction = digits == 0 ? "" : "." + String(String(units % one + one).dropFirst())
        return (ns < 0 && units > 0 ? "-" : "") + "\(units / one)" + fraction
    }

    /// Compact text for operators: `250ms`, `1.5s`, `42m`, `1h30m`.
    public var short: String {
        let ns = nanoseconds
        let sign = ns < 0 ? "-" : ""
        let n = ns.magnitude
        let ms = n / 1_000_000
        if n < 1_000_000 { return "\(sign)\(n / 1000)µs" }
        if ms < 1000 { return "\(sign)\(ms)ms" }
        if ms < 60_000 {
            let tenths = (ms % 1000) / 100
            return "\(sign)\(ms / 1000)" + (tenths == 0 ? "" : ".\(tenths)") + "s"
        }
        let s = ms / 1000
        if s < 3600 { return "\(sign)\(s / 60)m" + (s % 60 == 0 ? "" : "\(s % 60)s") }
        return "\(sign)\(s / 3600)h" + (s % 3600 / 60 == 0 ? "" : "\(s % 3600 / 60)m")
    }
}

/// SplitMix64: a tiny seeded generator, so backoff jitter is random in the field and
/// identical in every replay of the same seed (and a fuzz test's failure can be replayed).
public struct SeededRandom: RandomNumberGenerator, Sendable {
    private var state: UInt64
    public init(seed: UInt64) { state = seed }

    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    /// A duration drawn evenly from `0...limit`.
    public mutating func upTo(_ limit: Duration) -> Duration {
        let n = limit.nanoseconds
        guard n > 0 else { return .zero }
        return .nanoseconds(Int64(next() % UInt64(n + 1)))
    }
}

extension Instant {
    /// CLOCK_BOOTTIME now: it keeps counting through a suspend, so key ages and session
    /// lifetimes include the time the laptop slept.
    public static func now() -> Instant {
        var ts = timespec()
        clock_gettime(CLOCK_BOOTTIME, &ts)
        return Instant(nanoseconds: Int64(ts.tv_sec) * 1_000_000_000 + Int64(ts.tv_nsec))
    }
}

/// Wall-clock seconds since 1970 as UTC text, in a `strftime` format (`%Y-%m-%dT%H:%M:%SZ`).
public func utcText(_ seconds: Int64, _ format: String) -> String {
    var t = time_t(seconds)
    var parts = tm()
    gmtime_r(&t, &parts)
    var buffer = [CChar](repeating: 0, count: 64)
    let length = strftime(&buffer, buffer.count, format, &parts)
    return String(decoding: buffer[0..<length].map { UInt8(bitPattern: $0) }, as: UTF8.self)
}
