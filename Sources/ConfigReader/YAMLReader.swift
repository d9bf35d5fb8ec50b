public import Basics

/// A configuration or scenario file that cannot be used, with the line to look at.
public struct ConfigError: Error, CustomStringConvertible, Sendable {
    public var file: String
    public var line: Int
    public var message: String
    public init(file: String, line: Int, message: String) {
        self.file = file
        self.line = line
        self.message = message
    }
    /// `file:line: message`, or `file: message` for the file as a whole (line 0).
    public var description: String { line > 0 ? "\(file):\(line): \(message)" : "\(file): \(message)" }
}

/// Reads YAML with line numbers, so every error a person can make points at its line:
/// unknown keys, duplicates, wrong types, values out of range.
public struct YAMLReader: Sendable {
    public let file: String
    public init(file: String) { self.file = file }

    public func fail(_ node: Node?, _ message: String) -> ConfigError {
        ConfigError(file: file, line: node?.line ?? 0, message: message)
    }

    /// Reads and parses the YAML file at `path`: a reader that names the file in errors, and the root.
    public static func load(_ path: String) throws(ConfigError) -> (YAMLReader, Node) {
        guard let bytes = SystemFiles.bytes(path) else {
            throw ConfigError(file: path, line: 0, message: "cannot read the file (does it exist, and may this user read it?)")
        }
        return try parse(bytes, file: path)
    }

    /// Parses `bytes`, read from `file` by the caller (after its own checks of the file).
    public static func parse(_ bytes: [UInt8], file path: String) throws(ConfigError) -> (YAMLReader, Node) {
        guard let text = String(validating: bytes, as: UTF8.self) else {
            throw ConfigError(file: path, line: 0, message: "not UTF-8 text")
        }
        let reader = YAMLReader(file: path)
        return (reader, try reader.document(text))
    }

    /// Parses the text into its root node.
    public func document(_ text: String) throws(ConfigError) -> Node {
        var parser = YAMLParser(text, file: file)
        guard let root = try parser.document() else { throw ConfigError(file: file, line: 1, message: "the file is empty") }
        return root
    }

    public struct Fields {
        public let entries: [(key: String, value: Node)]
        public var keys: [String] { entries.map(\.key) }
        let parser: YAMLReader
        let node: Node
        public func optional(_ key: String) -> Node? { entries.first { $0.key == key }?.value }
        public func required(_ key: String) throws(ConfigError) -> Node {
            guard let value = optional(key) else { throw parser.fail(node, "missing '\(key)'") }
            return value
        }
    }

    public func fields(_ node: Node, _ what: String, allowed: [String]) throws(ConfigError) -> Fields {
        guard case .mapping(let mapping) = node.value else { throw fail(node, "\(what) must be a mapping of keys to values") }
        var entries: [(key: String, value: Node)] = []
        for (key, value) in mapping {
            let name = try string(key)
            guard allowed.contains(name) else {
                throw fail(key, "unknown key '\(name)' in \(what); known keys: " + allowed.joined(separator: ", "))
            }
            guard !entries.contains(where: { $0.key == name }) else { throw fail(key, "'\(name)' appears twice") }
            entries.append((name, value))
        }
        return Fields(entries: entries, parser: self, node: node)
    }

    public func opt<T>(_ node: Node?, _ read: (Node) throws(ConfigError) -> T) throws(ConfigError) -> T? {
        guard let node else { return nil }
        return try read(node)
    }

    public func list(_ node: Node?) throws(ConfigError) -> [Node] {
        guard let node else { return [] }
        guard case .sequence(let items) = node.value else { throw fail(node, "expected a list") }
        return items
    }

    /// One value, or a list of them: the items to read either way.
    public func oneOrMore(_ node: Node) throws(ConfigError) -> [Node] {
        if case .sequence = node.value { try list(node) } else { [node] }
    }

    public func line(_ node: Node) -> Int { node.line }

    public func string(_ node: Node) throws(ConfigError) -> String {
        guard case .scalar(let text) = node.value else { throw fail(node, "expected a single value, not a list or mapping") }
        return text
    }

    public func int(_ node: Node, _ range: ClosedRange<Int>) throws(ConfigError) -> Int {
        let text = try string(node)
        guard let value = Int(text), range.contains(value) else {
            throw fail(node, "expected a whole number in \(range.lowerBound)...\(range.upperBound), got \"\(text)\"")
        }
        return value
    }

    public func bool(_ node: Node) throws(ConfigError) -> Bool {
        switch try string(node) {
        case "true", "yes", "on": return true
        case "false", "no", "off": return false
        case let text: throw fail(node, "expected true or false, got \"\(text)\"")
        }
    }

    public func prefix(_ node: Node) throws(ConfigError) -> Prefix {
        let text = try string(node)
        guard text.contains("/"), let prefix = Prefix(text) else {
            throw fail(node, "expected address/length, e.g. 10.77.0.0/16, got \"\(text)\"")
        }
        return prefix
    }

    public func ip(_ node: Node) throws(ConfigError) -> IPAddress {
        let text = try string(node)
        guard let address = IPAddress(text) else { throw fail(node, "expected an IP address, got \"\(text)\"") }
        return address
    }

    public func duration(_ node: Node) throws(ConfigError) -> Duration {
        let text = try string(node)
        guard let d = Self.parseDuration(text) else {
            throw fail(node, "expected a duration such as 250ms, 1.5s, 10m or 1h30m, got \"\(text)\"")
        }
        return d
    }

    public func positiveDuration(_ node: Node) throws(ConfigError) -> Duration {
        let d = try duration(node)
        guard d > .zero else { throw fail(node, "the duration must be more than zero") }
        return d
    }


    /// Parses `0`, `250ms`, `1.5s`, `10m`, `1h30m`, `2d`: numbers with units, summed.
    public static func parseDuration(_ text: String) -> Duration? {
        if text == "0" { return .zero }
        let units: [(String, Double)] = [("ns", 1), ("us", 1e3), ("µs", 1e3), ("ms", 1e6), ("s", 1e9),
                                         ("m", 60e9), ("h", 3600e9), ("d", 86400e9)]
        var rest = Substring(text)
        var total = 0.0
        guard !rest.isEmpty else { return nil }
        while !rest.isEmpty {
            let number = rest.prefix { $0.isNumber || $0 == "." }
            guard !number.isEmpty, let value = Double(number) else { return nil }
            rest = rest.dropFirst(number.count)
            let unit = rest.prefix { !$0.isNumber && $0 != "." }
            guard let scale = units.first(where: { $0.0 == unit })?.1 else { return nil }
            rest = rest.dropFirst(unit.count)
            total += value * scale
        }
        guard total < 1e18 else { return nil }
        return .nanoseconds(Int64(total.rounded()))
    }

    /// Raw bytes written as hexadecimal text (spaces allowed).
    public func hex(_ node: Node) throws(ConfigError) -> [UInt8] {
        let digits = try string(node).filter { !$0.isWhitespace }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(digits.count / 2)
        var high: UInt8?
        for c in digits.utf8 {
            let v: UInt8
            switch c {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): v = c - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): v = c - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): v = c - UInt8(ascii: "A") + 10
            default: throw fail(node, "netlink bytes must be hexadecimal")
            }
            if let h = high { bytes.append(h << 4 | v); high = nil } else { high = v }
        }
        if high != nil { throw fail(node, "netlink bytes have an odd number of hex digits") }
        return bytes
    }
}
