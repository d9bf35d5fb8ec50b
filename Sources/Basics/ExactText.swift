/// Text from files, the kernel and the network compared as it came, byte for byte (UTF-8).
///
/// Swift compares `String`s by character and canonical equivalence: `"é"` equals `"e\u{301}"`,
/// and `hasPrefix("x: ")` fails on a line whose text goes on with a combining mark, because the
/// space and the mark make one character. A Wi-Fi network's name, a search domain or a line of a
/// saved file is what its bytes are; these say so.
extension StringProtocol {
    /// The same bytes.
    @inlinable
    public func isExactly(_ other: some StringProtocol) -> Bool { utf8.elementsEqual(other.utf8) }

    /// Whether the bytes start with `prefix`'s.
    @inlinable
    public func startsExactly(with prefix: some StringProtocol) -> Bool { utf8.starts(with: prefix.utf8) }

    /// Whether the bytes end with `suffix`'s.
    @inlinable
    public func endsExactly(with suffix: some StringProtocol) -> Bool {
        utf8.count >= suffix.utf8.count && utf8.reversed().starts(with: suffix.utf8.reversed())
    }

    /// The text after `prefix`, which it must start with (`startsExactly(with:)`), cut after its
    /// bytes rather than after as many characters.
    public func droppingExactly(_ prefix: some StringProtocol) -> Substring {
        let rest = utf8.dropFirst(prefix.utf8.count)
        return Substring(String(decoding: rest, as: UTF8.self))
    }

    /// With only `A` to `Z` made lower case: DNS names compare case-insensitively in ASCII alone
    /// (RFC 4343), and Unicode's lowercasing would make the Kelvin sign a `k`.
    public var asciiLowercased: String {
        String(decoding: utf8.map { (0x41...0x5a).contains($0) ? $0 | 0x20 : $0 }, as: UTF8.self)
    }
}
