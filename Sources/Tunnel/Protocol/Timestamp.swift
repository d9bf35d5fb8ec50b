import Glibc

/// A TAI64N label: 8 bytes of seconds (2^62 + 10 + Unix seconds) and 4 of nanoseconds, both
/// big-endian, so comparing the 12 bytes in order compares the times. The handshake carries one
/// so the server can refuse an initiation that is not newer than the last one it accepted.
public struct TAI64N: Comparable, Hashable, Sendable, CustomStringConvertible {
    /// Encoded length.
    public static let length = 12
    /// TAI64 seconds label.
    public var seconds: UInt64
    /// Nanoseconds within the second, below 10^9.
    public var nanoseconds: UInt32

    private static let base: UInt64 = 0x4000_0000_0000_000A

    /// The label for a wall-clock time given in nanoseconds since the Unix epoch.
    public init(unixNanoseconds: UInt64) {
        seconds = Self.base &+ unixNanoseconds / 1_000_000_000
        nanoseconds = UInt32(unixNanoseconds % 1_000_000_000)
    }

    init(seconds: UInt64, nanoseconds: UInt32) {
        self.seconds = seconds
        self.nanoseconds = nanoseconds
    }

    /// The wall clock now (CLOCK_REALTIME). For the driver; the protocol core takes times as input.
    public static func now() -> TAI64N {
        var spec = timespec()
        clock_gettime(CLOCK_REALTIME, &spec)
        return TAI64N(unixNanoseconds: UInt64(max(spec.tv_sec, 0)) * 1_000_000_000 + UInt64(spec.tv_nsec))
    }

    /// The next label after this one, one nanosecond later.
    var successor: TAI64N {
        nanoseconds + 1 < 1_000_000_000
            ? TAI64N(seconds: seconds, nanoseconds: nanoseconds + 1)
            : TAI64N(seconds: seconds &+ 1, nanoseconds: 0)
    }

    /// The 12 wire bytes.
    var bytes: [UInt8] {
        (0..<8).map { UInt8(truncatingIfNeeded: seconds >> (56 - 8 * $0)) }
            + (0..<4).map { UInt8(truncatingIfNeeded: nanoseconds >> (24 - 8 * $0)) }
    }

    /// Reads 12 wire bytes; nil when the nanoseconds are out of range.
    init?(bytes: ArraySlice<UInt8>) {
        guard bytes.count == Self.length else { return nil }
        let start = bytes.startIndex
        let seconds = bytes[start..<start + 8].reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
        let nanoseconds = bytes[(start + 8)...].reduce(UInt32(0)) { $0 << 8 | UInt32($1) }
        guard nanoseconds < 1_000_000_000 else { return nil }
        self.init(seconds: seconds, nanoseconds: nanoseconds)
    }

    public static func < (a: TAI64N, b: TAI64N) -> Bool { (a.seconds, a.nanoseconds) < (b.seconds, b.nanoseconds) }

    /// The label in its conventional text form: `@` and 24 hex digits.
    public var description: String {
        let hex = String(seconds, radix: 16) + String(String(UInt64(nanoseconds) | 1 << 32, radix: 16).dropFirst())
        return "@" + String(repeating: "0", count: max(0, 24 - hex.count)) + hex
    }
}
