/// Which counters of a session have arrived, as RFC 6479 keeps them (and WireGuard after it):
/// a ring of 2048 bits in 64-bit words, of which the newest 1984 counters (`size`) are always
/// tracked; anything further behind is "too old". Moving forward clears whole words, never
/// shifts bits, so an accept costs a few word operations however far the counter jumps.
///
/// Nothing is recorded until a packet has authenticated: `check` runs before decryption (to
/// skip the AEAD for obvious replays), `accept` after it.
struct ReplayWindow {
    static let bits = 2048
    private static let wordBits = 64
    private static let words = bits / wordBits
    /// How far behind the newest counter a packet may arrive and still be accepted.
    static let size = UInt64(bits - wordBits)

    /// One more than the greatest counter accepted so far (0 before the first).
    private(set) var next: UInt64 = 0
    private var ring = InlineArray<32, UInt64>(repeating: 0)

    /// False for a counter already seen, or too old to tell.
    func check(_ counter: UInt64) -> Bool {
        if counter >= next { return counter < .max }
        if next - counter > Self.size { return false }
        return ring[word(counter)] & bit(counter) == 0
    }

    /// Records `counter`; false (and nothing recorded) when `check` would fail.
    mutating func accept(_ counter: UInt64) -> Bool {
        guard check(counter) else { return false }
        if counter >= next {
            if next > 0 {
                // Clear the words the head moves past: they now stand for newer counters.
                let head = (next - 1) / UInt64(Self.wordBits)
                let advance = min(counter / UInt64(Self.wordBits) - head, UInt64(Self.words))
                var step: UInt64 = 1
                while step <= advance {
                    ring[Int(truncatingIfNeeded: (head + step) % UInt64(Self.words))] = 0
                    step += 1
                }
            }
            next = counter + 1
        }
        ring[word(counter)] |= bit(counter)
        return true
    }

    @inline(__always) private func word(_ counter: UInt64) -> Int {
        Int(truncatingIfNeeded: counter / UInt64(Self.wordBits)) & (Self.words - 1)
    }

    @inline(__always) private func bit(_ counter: UInt64) -> UInt64 { 1 << (counter % UInt64(Self.wordBits)) }
}
