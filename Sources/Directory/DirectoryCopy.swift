public import Basics
import Tunnel

/// A gateway's copy of the directory: every enabled row as read, each parsed once, and the
/// users they make. A change re-reads only the rows it names; the rows are then checked against
/// each other again (in the order of their names' bytes, whatever the database's collation),
/// so the row that keeps a contested name, key or address is the same on every gateway.
public struct DirectoryCopy: Sendable {
    struct Entry: Sendable {
        var row: [String?]
        var user: Result<User, DirectoryError>
    }
    /// By the name's UTF-8 bytes: names are compared byte for byte, as the server's are.
    private var entries: [[UInt8]: Entry] = [:]
    /// Rows with a name an earlier row had (the database's key forbids it; a snapshot or a test
    /// could hold them): refused, the first kept.
    private var duplicates: [String] = []

    /// The copy of these rows (the query's columns).
    public init(rows: [[String?]]) {
        for row in rows {
            let name = row.first.flatMap { $0 } ?? ""
            if entries[Array(name.utf8)] != nil { duplicates.append(name) } else { put(row) }
        }
    }

    /// How many rows it holds, good or not.
    public var count: Int { entries.count }

    /// The rows of `names` are now `rows` (the enabled ones among them): a name without a row
    /// was disabled or deleted.
    public mutating func update(_ names: [String], rows: [[String?]]) {
        for name in names { entries[Array(name.utf8)] = nil }
        for row in rows { put(row) }
    }

    private mutating func put(_ row: [String?]) {
        let name = row.first.flatMap { $0 } ?? ""
        entries[Array(name.utf8)] = Entry(row: row, user: UserDirectory.user(row))
    }

    /// The rows, by name, as the snapshot keeps them.
    public var rows: [[String?]] { sortedEntries.map(\.row) }

    private var sortedEntries: [Entry] {
        entries.sorted { $0.key.lexicographicallyPrecedes($1.key) }.map(\.value)
    }

    /// The users served: every good row that claims no name, key or address an earlier one has;
    /// and the rows refused, with why.
    public func load() -> UserDirectory.Load {
        var result = UserDirectory.Load(users: [], refused: duplicates.map { ($0, "the name is another row's too") })
        result.users.reserveCapacity(entries.count)
        var keys: Set<PublicKey> = [], addresses: Set<IPAddress> = []
        for entry in sortedEntries {
            let name = entry.row.first.flatMap { $0 } ?? ""
            switch entry.user {
            case .failure(let why): result.refused.append((name, why.message))
            case .success(let user):
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

/// The snapshot a gateway keeps of the directory's rows, so that it starts without the database:
/// a first line naming the format and the schema, then a row per line, its columns separated by
/// tabs, each written as PostgreSQL's COPY writes text (`\N` for NULL; backslash, tab, newline
/// and carriage return escaped). Written 0600 through a rename; read only from a file owned by
/// root (or the agent's user) that nobody else may read (see `TrustedFile`).
public enum UserSnapshot {
    static let header = "roam users snapshot 1 schema \(UserDirectory.schemaVersion)"

    /// The snapshot's text.
    public static func text(_ rows: [[String?]]) -> String {
        var out = header + "\n"
        for row in rows {
            out += row.map { $0.map(escaped) ?? "\\N" }.joined(separator: "\t")
            out += "\n"
        }
        return out
    }

    /// Writes the rows to `path` (0600, whole or not at all).
    public static func write(_ rows: [[String?]], to path: String) throws(FileWriteError) {
        try SystemFiles.write(text(rows), to: path, mode: 0o600)
    }

    /// The rows of a snapshot's text; throws on anything but a snapshot of this format and schema.
    public static func rows(_ bytes: [UInt8]) throws(DirectoryError) -> [[String?]] {
        guard let text = String(validating: bytes, as: UTF8.self) else { throw DirectoryError("the users snapshot is not UTF-8 text") }
        var lines = text.split(separator: "\n", omittingEmptySubsequences: false)
        guard lines.first.map(String.init) == header else {
            throw DirectoryError("the users snapshot does not begin with \"\(header)\": not a snapshot this agent wrote")
        }
        guard lines.last == "" else { throw DirectoryError("the users snapshot ends mid-line: it is not whole") }
        lines.removeFirst()
        lines.removeLast()
        var rows: [[String?]] = []
        rows.reserveCapacity(lines.count)
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
            rows.append(row)
        }
        return rows
    }

    static func escaped(_ text: String) -> String {
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
