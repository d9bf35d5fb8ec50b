import Basics

/// A Wi-Fi network's name (SSID): 0 to 32 bytes, usually UTF-8 but not necessarily.
public struct SSID: Hashable, Sendable, CustomStringConvertible {
    /// The name as the access point broadcasts it.
    public let bytes: [UInt8]

    /// A name of at most 32 bytes (`IEEE80211_MAX_SSID_LEN`); nil when longer.
    public init?(bytes: some Collection<UInt8>) {
        guard bytes.count <= 32 else { return nil }
        self.bytes = Array(bytes)
    }

    /// A name from configuration: the text's UTF-8 bytes, where `\xNN` stands for the byte NN
    /// (as `description` writes them); nil when that makes more than 32 bytes.
    public init?(_ text: String) {
        let utf8 = Array(text.utf8)
        var bytes: [UInt8] = []
        var i = 0
        while i < utf8.count {
            if let byte = Self.escapedByte(utf8, at: i) {
                bytes.append(byte)
                i += 4
            } else {
                bytes.append(utf8[i])
                i += 1
            }
        }
        self.init(bytes: bytes)
    }

    /// The name as text where it is printable UTF-8, any other byte as `\xNN`. A backslash that
    /// would read as such an escape is written `\x5c`, so the text parses back to the same name.
    public var description: String {
        var text = ""
        var parser = Unicode.UTF8.ForwardParser()
        var input = bytes.makeIterator()
        var index = 0
        while true {
            switch parser.parseScalar(from: &input) {
            case .valid(let encoded):
                let scalar = Unicode.UTF8.decode(encoded)
                if Self.isPrintable(scalar) && Self.escapedByte(bytes, at: index) == nil {
                    text.unicodeScalars.append(scalar)
                } else {
                    for byte in encoded { text += Self.escape(byte) }
                }
                index += encoded.count
            case .error(let length):
                for byte in bytes[index..<index + length] { text += Self.escape(byte) }
                index += length
            case .emptyInput:
                return text
            }
        }
    }

    /// The byte that `\xNN` at `i` stands for; nil when no such escape starts there.
    private static func escapedByte(_ b: [UInt8], at i: Int) -> UInt8? {
        guard i + 3 < b.count, b[i] == UInt8(ascii: "\\"), b[i + 1] == UInt8(ascii: "x"),
              let high = hexValue(b[i + 2]), let low = hexValue(b[i + 3])
        else { return nil }
        return high << 4 | low
    }

    private static func hexValue(_ c: UInt8) -> UInt8? {
        switch c {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): c - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): c - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): c - UInt8(ascii: "A") + 10
        default: nil
        }
    }

    private static func escape(_ byte: UInt8) -> String {
        "\\x" + (byte < 16 ? "0" : "") + String(byte, radix: 16)
    }

    /// Control and format characters (a newline, a right-to-left override) would garble or
    /// disguise a log line; they are written as bytes.
    private static func isPrintable(_ scalar: Unicode.Scalar) -> Bool {
        switch scalar.properties.generalCategory {
        case .control, .format, .lineSeparator, .paragraphSeparator: false
        default: true
        }
    }
}

/// A link-layer address: 6 bytes on Ethernet and Wi-Fi, up to 32 on other links.
public struct HardwareAddress: Hashable, Sendable, CustomStringConvertible {
    /// The address as the link carries it.
    public let bytes: [UInt8]

    /// An address of 1 to 32 bytes (`MAX_ADDR_LEN`); nil for any other length.
    public init?(bytes: some Collection<UInt8>) {
        guard (1...32).contains(bytes.count) else { return nil }
        self.bytes = Array(bytes)
    }

    /// Parses two hex digits per byte, separated by `:` or by `-` (`aa:bb:cc:dd:ee:ff`,
    /// `AA-BB-CC-DD-EE-FF`); nil for anything else.
    public init?(_ text: String) {
        let separator: Character = text.contains("-") ? "-" : ":"
        var bytes: [UInt8] = []
        for part in text.split(separator: separator, omittingEmptySubsequences: false) {
            guard part.utf8.count == 2, part.allSatisfy(\.isHexDigit), let byte = UInt8(part, radix: 16) else { return nil }
            bytes.append(byte)
        }
        self.init(bytes: bytes)
    }

    /// Lowercase, colon-separated: `aa:bb:cc:dd:ee:ff`.
    public var description: String {
        bytes.map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined(separator: ":")
    }
}
