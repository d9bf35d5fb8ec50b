import Basics

/// A JSON value, for the control socket's messages: written compactly on one line, and read
/// back with limits (size, depth) so that whatever a local process sends cannot make the
/// reader work without end.
public enum JSON: Equatable, Sendable {
    case null
    case bool(Bool)
    case int(Int64)
    case double(Double)
    case string(String)
    case array([JSON])
    /// Keys in the order they were given, as they are written.
    case object([(String, JSON)])

    public static func == (a: JSON, b: JSON) -> Bool {
        switch (a, b) {
        case (.null, .null): true
        case (.bool(let x), .bool(let y)): x == y
        case (.int(let x), .int(let y)): x == y
        case (.double(let x), .double(let y)): x == y
        case (.string(let x), .string(let y)): x == y
        case (.array(let x), .array(let y)): x == y
        case (.object(let x), .object(let y)): x.count == y.count && zip(x, y).allSatisfy { $0.0 == $1.0 && $0.1 == $1.1 }
        default: false
        }
    }

    // MARK: Reading fields

    public subscript(key: String) -> JSON? {
        guard case .object(let fields) = self else { return nil }
        return fields.first { $0.0 == key }?.1
    }

    public var string: String? { if case .string(let s) = self { s } else { nil } }
    public var int: Int64? {
        switch self {
        case .int(let n): n
        case .double(let d) where d == d.rounded() && abs(d) < 9.0e15: Int64(d)
        default: nil
        }
    }
    public var double: Double? {
        switch self {
        case .int(let n): Double(n)
        case .double(let d): d
        default: nil
        }
    }
    public var bool: Bool? { if case .bool(let b) = self { b } else { nil } }
    public var array: [JSON]? { if case .array(let a) = self { a } else { nil } }
    public var fields: [(String, JSON)]? { if case .object(let f) = self { f } else { nil } }

    // MARK: Writing

    /// Compact JSON text on one line.
    public var text: String {
        var out = ""
        write(into: &out)
        return out
    }

    private func write(into out: inout String) {
        switch self {
        case .null: out += "null"
        case .bool(let b): out += b ? "true" : "false"
        case .int(let n): out += String(n)
        case .double(let d):
            // JSON has no NaN or infinity; a whole number keeps one decimal so it reads as a double.
            if !d.isFinite { out += "null" } else if d == d.rounded(), abs(d) < 1e15 { out += String(Int64(d)) + ".0" } else { out += "\(d)" }
        case .string(let s): out += LogLine.quotedJSON(s)
        case .array(let items):
            out += "["
            for (i, item) in items.enumerated() {
                if i > 0 { out += "," }
                item.write(into: &out)
            }
            out += "]"
        case .object(let fields):
            out += "{"
            for (i, (key, value)) in fields.enumerated() {
                if i > 0 { out += "," }
                out += LogLine.quotedJSON(key)
                out += ":"
                value.write(into: &out)
            }
            out += "}"
        }
    }

    // MARK: Parsing

    public struct ParseError: Error, CustomStringConvertible {
        let offset: Int
        let message: String
        public var description: String { "\(message) at byte \(offset)" }
    }

    /// The deepest nesting a message may have.
    public static let maxDepth = 32

    /// Parses one JSON value that fills `text` (whitespace around it aside).
    public static func parse(_ text: String) throws(ParseError) -> JSON {
        var parser = Parser(bytes: Array(text.utf8))
        parser.skipSpace()
        let value = try parser.value(depth: 0)
        parser.skipSpace()
        guard parser.at == parser.bytes.count else { throw ParseError(offset: parser.at, message: "text after the value") }
        return value
    }

    private struct Parser {
        let bytes: [UInt8]
        var at = 0

        mutating func skipSpace() {
            while at < bytes.count, [0x20, 0x09, 0x0A, 0x0D].contains(bytes[at]) { at += 1 }
        }

        func fail(_ message: String) -> ParseError { ParseError(offset: at, message: message) }

        mutating func value(depth: Int) throws(ParseError) -> JSON {
            guard depth < JSON.maxDepth else { throw fail("nested deeper than \(JSON.maxDepth)") }
            guard at < bytes.count else { throw fail("unexpected end") }
            switch bytes[at] {
            case UInt8(ascii: "{"): return try object(depth: depth)
            case UInt8(ascii: "["): return try array(depth: depth)
            case UInt8(ascii: "\""): return .string(try string())
            case UInt8(ascii: "t"): try literal("true"); return .bool(true)
            case UInt8(ascii: "f"): try literal("false"); return .bool(false)
            case UInt8(ascii: "n"): try literal("null"); return .null
            case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return try number()
            default: throw fail("unexpected character")
            }
        }

        mutating func literal(_ word: String) throws(ParseError) {
            let expected = Array(word.utf8)
            guard at + expected.count <= bytes.count, Array(bytes[at..<(at + expected.count)]) == expected else {
                throw fail("unexpected word")
            }
            at += expected.count
        }

        mutating func object(depth: Int) throws(ParseError) -> JSON {
            at += 1
            var fields: [(String, JSON)] = []
            skipSpace()
            if at < bytes.count, bytes[at] == UInt8(ascii: "}") { at += 1; return .object([]) }
            while true {
                skipSpace()
                guard at < bytes.count, bytes[at] == UInt8(ascii: "\"") else { throw fail("expected a key") }
                let key = try string()
                skipSpace()
                guard at < bytes.count, bytes[at] == UInt8(ascii: ":") else { throw fail("expected ':'") }
                at += 1
                skipSpace()
                fields.append((key, try value(depth: depth + 1)))
                skipSpace()
                guard at < bytes.count else { throw fail("unexpected end") }
                if bytes[at] == UInt8(ascii: ",") { at += 1; continue }
                guard bytes[at] == UInt8(ascii: "}") else { throw fail("expected ',' or '}'") }
                at += 1
                return .object(fields)
            }
        }

        mutating func array(depth: Int) throws(ParseError) -> JSON {
            at += 1
            var items: [JSON] = []
            skipSpace()
            if at < bytes.count, bytes[at] == UInt8(ascii: "]") { at += 1; return .array([]) }
            while true {
                skipSpace()
                items.append(try value(depth: depth + 1))
                skipSpace()
                guard at < bytes.count else { throw fail("unexpected end") }
                if bytes[at] == UInt8(ascii: ",") { at += 1; continue }
                guard bytes[at] == UInt8(ascii: "]") else { throw fail("expected ',' or ']'") }
                at += 1
                return .array(items)
            }
        }

        mutating func string() throws(ParseError) -> String {
            at += 1
            var out: [UInt8] = []
            while at < bytes.count {
                let byte = bytes[at]
                at += 1
                switch byte {
                case UInt8(ascii: "\""): return String(decoding: out, as: UTF8.self)
                case UInt8(ascii: "\\"):
                    guard at < bytes.count else { throw fail("unexpected end") }
                    let escape = bytes[at]
                    at += 1
                    switch escape {
                    case UInt8(ascii: "\""): out.append(0x22)
                    case UInt8(ascii: "\\"): out.append(0x5C)
                    case UInt8(ascii: "/"): out.append(0x2F)
                    case UInt8(ascii: "b"): out.append(0x08)
                    case UInt8(ascii: "f"): out.append(0x0C)
                    case UInt8(ascii: "n"): out.append(0x0A)
                    case UInt8(ascii: "r"): out.append(0x0D)
                    case UInt8(ascii: "t"): out.append(0x09)
                    case UInt8(ascii: "u"):
                        var scalar = try hex4()
                        if (0xD800..<0xDC00).contains(scalar) {
                            // A surrogate pair: the low half must follow.
                            guard at + 1 < bytes.count, bytes[at] == UInt8(ascii: "\\"), bytes[at + 1] == UInt8(ascii: "u") else {
                                throw fail("a lone surrogate")
                            }
                            at += 2
                            let low = try hex4()
                            guard (0xDC00..<0xE000).contains(low) else { throw fail("a lone surrogate") }
                            scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                        }
                        guard let unicode = Unicode.Scalar(scalar) else { throw fail("a lone surrogate") }
                        out += Array(String(Character(unicode)).utf8)
                    default: throw fail("unknown escape")
                    }
                default:
                    guard byte >= 0x20 else { throw fail("a control character in a string") }
                    out.append(byte)
                }
            }
            throw fail("unterminated string")
        }

        mutating func hex4() throws(ParseError) -> UInt32 {
            guard at + 4 <= bytes.count else { throw fail("unexpected end") }
            var value: UInt32 = 0
            for byte in bytes[at..<(at + 4)] {
                guard let digit = hexDigit(byte) else { throw fail("bad \\u escape") }
                value = value << 4 | digit
            }
            at += 4
            return value
        }

        func hexDigit(_ byte: UInt8) -> UInt32? {
            switch byte {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): UInt32(byte - UInt8(ascii: "0"))
            case UInt8(ascii: "a")...UInt8(ascii: "f"): UInt32(byte - UInt8(ascii: "a") + 10)
            case UInt8(ascii: "A")...UInt8(ascii: "F"): UInt32(byte - UInt8(ascii: "A") + 10)
            default: nil
            }
        }

        mutating func number() throws(ParseError) -> JSON {
            let start = at
            if bytes[at] == UInt8(ascii: "-") { at += 1 }
            var fraction = false
            while at < bytes.count {
                let byte = bytes[at]
                if (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte) {
                    at += 1
                } else if [UInt8(ascii: "."), UInt8(ascii: "e"), UInt8(ascii: "E"), UInt8(ascii: "+"), UInt8(ascii: "-")].contains(byte) {
                    fraction = true
                    at += 1
                } else {
                    break
                }
            }
            let text = String(decoding: bytes[start..<at], as: UTF8.self)
            if !fraction, let n = Int64(text) { return .int(n) }
            guard let d = Double(text), d.isFinite else { throw ParseError(offset: start, message: "bad number") }
            return .double(d)
        }
    }
}
