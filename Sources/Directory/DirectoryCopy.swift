public import Basics
import Glibc
import Tunnel

/// A gateway's copy of the directory: every enabled row as read, each parsed once, and the
/// users they make. A change re-reads only the rows it names; the rows are then checked against
/// each other again (in the order of their names' bytes, whatever the database's collation),
/// so the row that keeps a contested name, key or address is the same on every gateway.
public struct DirectoryCopy: Sendable {
    /// A row that makes a user is kept as the user alone (the snapshot writes it back as the row
    /// it came from); a refused one as its name and why (the snapshot leaves it out).
    enum Entry: Sendable, Equatable {
        case user(User)
        case refused(name: String, why: DirectoryError)

        init(_ row: [String?], tunnel: [Prefix]) {
            self = switch UserDirectory.user(row, tunnel: tunnel) {
            case .success(let user): .user(user)
            case .failure(let why): .refused(name: row.first.flatMap { $0 } ?? "", why: why)
            }
        }

        var row: [String?]? {
            switch self {
            case .refused: return nil
            case .user(let user):
                let list = { (items: [String]) -> String? in items.isEmpty ? nil : items.joined(separator: ",") }
                return [user.name, user.publicKey?.base64, user.passwordHash?.encoded, list(user.addresses.map(\.description)),
                        list(user.dns?.resolvers.map(\.description) ?? []), list(user.dns?.searchDomains ?? [])]
            }
        }
    }
    /// By the name's UTF-8 bytes: names are compared byte for byte, as the server's are.
    private var entries: [Name: Entry] = [:]
    /// The names in the order of their bytes, kept as changes come (sorting 100,000 names at
    /// each change took a third of a second).
    private var order: [Name] = []
    /// Rows with a name an earlier row had (the database's key forbids it; a snapshot or a test
    /// could hold them): refused, the first kept.
    private var duplicates: [String] = []

    /// The gateway's tunnel prefixes: a user's addresses must lie inside them (empty: unchecked).
    public let tunnel: [Prefix]

    /// The copy of these rows (the query's columns), for a gateway whose tunnel has `tunnel`.
    public init(rows: some Sequence<[String?]>, tunnel: [Prefix] = []) {
        self.tunnel = tunnel
        for row in rows { add(row) }
        finish()
    }

    /// An empty copy, for `add` a row at a time and `finish`.
    init(tunnel: [Prefix]) { self.tunnel = tunnel }

    /// Another row read (a row whose name an earlier one had is refused).
    mutating func add(_ row: [String?]) {
        let name = row.first.flatMap { $0 } ?? ""
        if entries[Name(name)] != nil { duplicates.append(name) } else { put(row) }
    }

    /// Every row added: puts the names in order.
    mutating func finish() { order = entries.keys.sorted() }

    /// How many rows it holds, good or not.
    public var count: Int { entries.count }

    /// The rows of `names` are now `rows` (the enabled ones among them): a name without a row
    /// was disabled or deleted.
    /// Returns whether anything changed (an announcement of a row as it was changes nothing).
    @discardableResult
    public mutating func update(_ names: [String], rows: [[String?]]) -> Bool {
        var before: [Name: Entry] = [:]
        for name in names.map(Name.init) {
            guard let old = entries.removeValue(forKey: name) else { continue }
            before[name] = old
            let at = Self.position(of: name, in: order)
            if at < order.count, order[at] == name { order.remove(at: at) }
        }
        var changed = false
        for row in rows {
            let name = put(row)
            let at = Self.position(of: name, in: order)
            if at == order.count || order[at] != name { order.insert(name, at: at) }
            changed = changed || before.removeValue(forKey: name) != entries[name]
        }
        return changed || !before.isEmpty
    }

    /// Where `name` is in `order`, or would go.
    private static func position(of name: Name, in order: [Name]) -> Int {
        var low = 0, high = order.count
        while low < high {
            let middle = (low + high) / 2
            if order[middle] < name { low = middle + 1 } else { high = middle }
        }
        return low
    }

    @discardableResult
    private mutating func put(_ row: [String?]) -> Name {
        let name = Name(row.first.flatMap { $0 } ?? "")
        entries[name] = Entry(row, tunnel: tunnel)
        return name
    }

    /// The rows, by name, as the snapshot keeps them: made one at a time as they are read.
    public var rows: some Sequence<[String?]> { order.lazy.compactMap { entries[$0]?.row } }

    /// The users served: every good row that claims no name, key or address an earlier one has;
    /// and the rows refused, with why.
    public func load() -> UserDirectory.Load {
        var result = UserDirectory.Load(users: [], refused: duplicates.map { ($0, "the name is another row's too") })
        result.users.reserveCapacity(entries.count)
        var keys: Set<PublicKey> = [], addresses: Set<IPAddress> = []
        keys.reserveCapacity(entries.count)
        addresses.reserveCapacity(entries.count)
        for name in order {
            switch entries[name] {
            case nil: continue
            case .refused(let name, let why)?: result.refused.append((name, why.message))
            case .user(let user)?:
                let name = user.name ?? ""
                if let key = user.publicKey, keys.contains(key) {
                    result.refused.append((name, "its public key is another user's"))
                } else if let taken = user.addresses.first(where: addresses.contains) {
                    result.refused.append((name, "its address \(taken) is another user's"))
                } else {
                    if let key = user.publicKey { keys.insert(key) }
                    addresses.formUnion(user.addresses)
                    result.users.append(user)
                }
            }
        }
        return result
    }
}

/// A name's UTF-8 bytes, hashed in one go and ordered as memcmp orders them.
struct Name: Hashable, Comparable, Sendable {
    let bytes: [UInt8]
    init(_ text: String) { bytes = Array(text.utf8) }
    func hash(into hasher: inout Hasher) { bytes.withUnsafeBytes { hasher.combine(bytes: $0) } }
    static func < (a: Name, b: Name) -> Bool {
        a.bytes.withUnsafeBytes { x in
            b.bytes.withUnsafeBytes { y in
                let common = min(x.count, y.count)
                let order = common == 0 ? 0 : memcmp(x.baseAddress!, y.baseAddress!, common)
                return order != 0 ? order < 0 : x.count < y.count
            }
        }
    }
}

/// The snapshot a gateway keeps of the directory's rows, so that it starts without the database:
/// a first line naming the format and the schema, then a row per line, its columns separated by
/// tabs, each written as PostgreSQL's COPY writes text (`\N` for NULL; backslash, tab, newline
/// and carriage return escaped). Written 0600 through a rename; read only from a file owned by
/// root (or the agent's user) that nobody else may read (see `TrustedFile`).
public enum UserSnapshot {
    static let header = "roam users snapshot 1 schema \(UserDirectory.schemaVersion)"

    /// The snapshot's text.
    public static func text(_ rows: some Sequence<[String?]>) -> String {
        var out = header + "\n"
        out.reserveCapacity(rows.underestimatedCount * 200)
        for row in rows {
            out += row.map { $0.map(escaped) ?? "\\N" }.joined(separator: "\t")
            out += "\n"
        }
        return out
    }

    /// Writes the rows to `path` (0600, whole or not at all).
    public static func write(_ rows: some Sequence<[String?]>, to path: String) throws(FileWriteError) {
        try SystemFiles.write(text(rows), to: path, mode: 0o600)
    }

    /// The rows of a snapshot's text; throws on anything but a snapshot of this format and schema.
    public static func rows(_ bytes: [UInt8]) throws(DirectoryError) -> [[String?]] {
        var rows: [[String?]] = []
        try read(bytes) { rows.append($0) }
        return rows
    }

    /// The copy a snapshot holds, read a row at a time, for a gateway whose tunnel has `tunnel`.
    public static func copy(_ bytes: [UInt8], tunnel: [Prefix]) throws(DirectoryError) -> DirectoryCopy {
        var copy = DirectoryCopy(tunnel: tunnel)
        try read(bytes) { copy.add($0) }
        copy.finish()
        return copy
    }

    /// Hands each row of the snapshot to `body`; throws on anything but a whole snapshot of this
    /// format and schema (after which the rows handed over are to be dropped).
    static func read(_ bytes: [UInt8], _ body: ([String?]) -> Void) throws(DirectoryError) {
        guard let text = String(validating: bytes, as: UTF8.self) else { throw DirectoryError("the users snapshot is not UTF-8 text") }
        var lines = text.split(separator: "\n", omittingEmptySubsequences: false)
        guard lines.first.map(String.init) == header else {
            throw DirectoryError("the users snapshot does not begin with \"\(header)\": not a snapshot this agent wrote")
        }
        guard lines.last == "" else { throw DirectoryError("the users snapshot ends mid-line: it is not whole") }
        lines.removeFirst()
        lines.removeLast()
        for (n, line) in lines.enumerated() {
            let fields = line.split(separator: "\t", omittingEmptySubsequences: false)
            guard fields.count == 6 else { throw DirectoryError("the users snapshot's line \(n + 2) has \(fields.count) columns, not 6") }
            var row: [String?] = []
            for field in fields {
                if field == "\\N" {
                    row.append(nil)
                } else {
                    guard let value = unescaped(field) else {
                        throw DirectoryError("the users snapshot's line \(n + 2) has a backslash that escapes nothing it writes")
                    }
                    row.append(value)
                }
            }
            body(row)
        }
    }

    static func escaped(_ text: String) -> String {
        guard text.utf8.contains(where: { $0 == 0x5C || $0 == 0x09 || $0 == 0x0A || $0 == 0x0D }) else { return text }
        var out = ""
        out.reserveCapacity(text.utf8.count)
        for character in text.unicodeScalars {
            switch character {
            case "\\": out += "\\\\"
            case "\t": out += "\\t"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            default: out.unicodeScalars.append(character)
            }
        }
        return out
    }

    static func unescaped(_ field: Substring) -> String? {
        guard field.contains("\\") else { return String(field) }
        var out = ""
        var escaping = false
        for character in field.unicodeScalars {
            if escaping {
                switch character {
                case "\\": out += "\\"
                case "t": out += "\t"
                case "n": out += "\n"
                case "r": out += "\r"
                default: return nil
                }
                escaping = false
            } else if character == "\\" {
                escaping = true
            } else {
                out.unicodeScalars.append(character)
            }
        }
        return escaping ? nil : out
    }
}

/// How long to wait before connecting again: doubling from `first` to `cap`, each wait drawn
/// between half and all of it, so gateways that lost the database together do not come back in
/// step.
public struct Backoff: Sendable {
    public let first: Duration
    public let cap: Duration
    private var next: Duration

    public init(first: Duration = .seconds(1), cap: Duration = .seconds(30)) {
        self.first = first
        self.cap = cap
        next = first
    }

    /// The wait before the next attempt; `random` picks a fraction in 0..<1.
    public mutating func wait(random: Double = Double.random(in: 0..<1)) -> Duration {
        let full = next
        next = min(next * 2, cap)
        return full * (0.5 + 0.5 * random)
    }

    /// Connected: the next loss starts again from `first`.
    public mutating func reset() { next = first }
}
