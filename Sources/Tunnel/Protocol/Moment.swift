/// A point on the caller's monotonic clock, in nanoseconds from an arbitrary origin.
///
/// The protocol core never reads a clock: every call that depends on time takes one of these,
/// so tests drive it with plain values. It carries the same count as the Reconnector's `Instant`,
/// so the driver converts with `Moment(nanoseconds: instant.nanoseconds)`.
public struct Moment: Comparable, Hashable, Sendable, CustomStringConvertible {
    public var nanoseconds: Int64
    public init(nanoseconds: Int64) { self.nanoseconds = nanoseconds }

    public static let zero = Moment(nanoseconds: 0)

    public static func + (a: Moment, d: Duration) -> Moment {
        Moment(nanoseconds: a.nanoseconds &+ d.wholeNanoseconds)
    }

    public static func - (a: Moment, b: Moment) -> Duration { .nanoseconds(a.nanoseconds &- b.nanoseconds) }
    public static func < (a: Moment, b: Moment) -> Bool { a.nanoseconds < b.nanoseconds }

    public var description: String { "\(Double(nanoseconds) / 1e9)s" }
}

extension Duration {
    /// The duration in whole nanoseconds, saturating far beyond any lifetime the protocol uses.
    var wholeNanoseconds: Int64 {
        let (seconds, attoseconds) = components
        let (whole, overflow) = seconds.multipliedReportingOverflow(by: 1_000_000_000)
        if overflow { return seconds < 0 ? .min : .max }
        return whole &+ attoseconds / 1_000_000_000
    }

    /// Seconds as a floating-point number, for token-bucket arithmetic.
    var inSeconds: Double { Double(wholeNanoseconds) / 1e9 }
}
