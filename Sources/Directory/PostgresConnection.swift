import CLibpq
import Glibc

/// Why the user directory could not be read, in one line.
public struct DirectoryError: Error, Equatable, Sendable, CustomStringConvertible {
    public enum Kind: Equatable, Sendable {
        /// The database could not be reached, stopped answering, or gave up for now (a timeout,
        /// a shutdown, no resources): worth trying again.
        case unreachable
        /// The database answers, but refuses (a missing table, no grant): trying again changes
        /// nothing until an operator acts.
        case refused
        /// The database speaks a schema version this agent does not read: a gateway refuses to
        /// start on it rather than serve a snapshot of another schema's users.
        case schema
    }
    public var kind: Kind
    public var message: String
    /// The SQLSTATE the server gave, when it gave one.
    public var code: String
    public init(_ message: String, kind: Kind = .refused, code: String = "") {
        self.message = message
        self.kind = kind
        self.code = code
    }
    public var description: String { message }
}

/// One connection to PostgreSQL through libpq, loaded on first use (see `CLibpq`); the one owner
/// of the C connection, closed in deinit. Blocking: used on a thread of its own, never on the data
/// plane's.
final class PostgresConnection {
    /// The functions, found once.
    nonisolated(unsafe) private static var api = CLibpq_API()
    private static let loaded: Bool = CLibpq_load(&api) != 0

    private let connection: OpaquePointer

    /// Connects with libpq's connection string or URL (`postgresql://roam@db.example/roam?sslmode=verify-full`);
    /// `passwordFile`, when given, is libpq's passfile, so the password is never in a string the
    /// agent holds, logs or passes on.
    init(_ target: String, passwordFile: String?) throws(DirectoryError) {
        guard Self.loaded else {
            throw DirectoryError("cannot load libpq.so.5: install Debian's libpq5 to read the users from PostgreSQL")
        }
        var conninfo = Self.withDefaults(target)
        if let passwordFile {
            // libpq takes keyword=value pairs after a URL's query, or after a keyword string.
            let escaped = passwordFile.replacing("\\", with: "\\\\").replacing("'", with: "\\'")
            conninfo = conninfo.contains("://") ? conninfo + (conninfo.contains("?") ? "&" : "?") + "passfile=" + Self.percentEncoded(passwordFile)
                : conninfo + " passfile='\(escaped)'"
        }
        guard let made = Self.api.PQconnectdb(conninfo) else { throw DirectoryError("cannot connect to PostgreSQL: out of memory") }
        // Finished here when it failed: the object is not made, so its deinit never runs.
        guard Self.api.PQstatus(made) == CONNECTION_OK else {
            let why = Self.text(Self.api.PQerrorMessage(made))
            Self.api.PQfinish(made)
            throw DirectoryError("cannot connect to PostgreSQL: \(why)", kind: .unreachable)
        }
        _ = Self.api.PQsetNoticeProcessor(made, CLibpq_ignoreNotice, nil)
        connection = made
    }

    deinit { Self.api.PQfinish(connection) }

    /// What libpq is told unless the URL says otherwise: give up connecting after 5 s, give up a
    /// statement after 30 s (a lock held for ever; the gateway connects again with backoff),
    /// notice a database that vanished without closing (a partition, a power cut) within about
    /// 25 s of silence on a listening connection and 30 s of unanswered writes, speak UTF-8, and,
    /// over TCP, TLS with the server's certificate and name verified (`sslmode=verify-full`):
    /// whoever answers for the database decides who may log in. Only for URLs; a keyword
    /// string says it all.
    static func withDefaults(_ target: String) -> String {
        guard target.contains("://") else { return target }
        let given = Set(parameters(target).keys)
        var defaults = [("connect_timeout", "5"), ("keepalives_idle", "10"), ("keepalives_interval", "5"), ("keepalives_count", "3"),
                        ("tcp_user_timeout", "30000"), ("client_encoding", "UTF8"), ("application_name", "roam-gateway"),
                        ("options", "-c%20statement_timeout%3D30000")]
        if !overUnixSocket(target) { defaults.append(("sslmode", "verify-full")) }
        let added = defaults.filter { !given.contains($0.0) }.map { "\($0.0)=\($0.1)" }
        guard !added.isEmpty else { return target }
        return target + (target.contains("?") ? (target.hasSuffix("?") || target.hasSuffix("&") ? "" : "&") : "?") + added.joined(separator: "&")
    }

    /// Runs `sql` and returns its rows, each column's text or nil for NULL; `parameters` are $1,
    /// $2... as text (never spliced into the statement).
    func rows(_ sql: String, _ parameters: [String] = []) throws(DirectoryError) -> [[String?]] {
        var rows: [[String?]] = []
        try each(sql, parameters) { rows.append($0) }
        return rows
    }

    /// Runs `sql` and hands each row to `body` in turn (a row at a time: 100,000 users are never
    /// all held as Swift strings at once).
    func each(_ sql: String, _ parameters: [String] = [], _ body: ([String?]) -> Void) throws(DirectoryError) {
        let result: OpaquePointer?
        if parameters.isEmpty {
            result = Self.api.PQexec(connection, sql)
        } else {
            let copies = parameters.map { strdup($0) }
            defer { for copy in copies { free(copy) } }
            result = copies.map { UnsafePointer($0) }.withUnsafeBufferPointer {
                Self.api.PQexecParams(connection, sql, Int32(parameters.count), nil, $0.baseAddress, nil, nil, 0)
            }
        }
        guard let result else {
            throw DirectoryError("PostgreSQL: \(Self.text(Self.api.PQerrorMessage(connection)))", kind: .unreachable)
        }
        defer { Self.api.PQclear(result) }
        let status = Self.api.PQresultStatus(result)
        guard status == PGRES_TUPLES_OK || status == PGRES_COMMAND_OK else {
            let code = Self.api.PQresultErrorField(result, Int32(UInt8(ascii: "C"))).map { String(cString: $0) } ?? ""
            throw DirectoryError("PostgreSQL: \(Self.text(Self.api.PQresultErrorMessage(result)))",
                                 kind: Self.api.PQstatus(connection) == CONNECTION_OK && !Self.isTransient(code) ? .refused : .unreachable,
                                 code: code)
        }
        let count = Self.api.PQntuples(result), fields = Self.api.PQnfields(result)
        for row in 0..<count {
            body((0..<fields).map { column in
                Self.api.PQgetisnull(result, row, column) != 0 ? nil : Self.text(Self.api.PQgetvalue(result, row, column), oneLine: false)
            })
        }
    }

    /// The socket, to poll for notifications.
    var fileDescriptor: Int32 { Self.api.PQsocket(connection) }

    /// Reads what the server sent and returns the payloads of the notifications it held (on any
    /// channel listened to), in order; throws when the connection is gone.
    func notifications() throws(DirectoryError) -> [String] {
        // A server that shut down says so before it closes: the read succeeds, the connection is bad.
        guard Self.api.PQconsumeInput(connection) == 1, Self.api.PQstatus(connection) == CONNECTION_OK else {
            throw DirectoryError("PostgreSQL: \(Self.text(Self.api.PQerrorMessage(connection)))", kind: .unreachable)
        }
        var payloads: [String] = []
        // Bounded: libpq holds what one read brought.
        for _ in 0..<100_000 {
            guard let notice = Self.api.PQnotifies(connection) else { break }
            payloads.append(notice.pointee.extra.map { String(cString: $0) } ?? "")
            Self.api.PQfreemem(notice)
        }
        return payloads
    }

    /// Whether the server's error (SQLSTATE) is one that passes: a connection exception (08), a
    /// rolled back transaction (40: serialization, deadlock), no resources (53), an operator's
    /// intervention (57: a statement timeout, a shutdown), a lock not available (55P03), a
    /// read-only standby (25006).
    static func isTransient(_ code: String) -> Bool {
        ["08", "40", "53", "57"].contains(String(code.prefix(2))) || code == "55P03" || code == "25006"
    }

    /// The query's parameters of a URL (as written, not decoded).
    static func parameters(_ url: String) -> [String: String] {
        guard let mark = url.firstIndex(of: "?") else { return [:] }
        var out: [String: String] = [:]
        for pair in url[url.index(after: mark)...].split(separator: "&") {
            let parts = pair.split(separator: "=", maxSplits: 1)
            if let key = parts.first { out[String(key)] = parts.count > 1 ? String(parts[1]) : "" }
        }
        return out
    }

    /// Whether the URL reaches the database through a Unix socket: no host, or a host that is a directory.
    static func overUnixSocket(_ url: String) -> Bool {
        if let host = parameters(url)["host"] { return host.hasPrefix("/") || host.hasPrefix("%2F") || host.hasPrefix("%2f") }
        guard let scheme = url.firstRange(of: "://") else { return false }
        let authority = url[scheme.upperBound...].prefix { $0 != "/" && $0 != "?" }
        let hostPart = authority.split(separator: "@", omittingEmptySubsequences: false).last ?? ""
        return hostPart.isEmpty || hostPart.hasPrefix("%2F") || hostPart.hasPrefix("%2f")
    }

    /// libpq's words, on one line.
    private static func text(_ pointer: UnsafeMutablePointer<CChar>?, oneLine: Bool = true) -> String {
        guard let pointer else { return "" }
        guard oneLine else { return String(cString: pointer) }
        return String(cString: pointer).split(whereSeparator: \.isNewline).map { $0.trimmingPrefix(while: \.isWhitespace) }
            .filter { !$0.isEmpty }.joined(separator: " / ")
    }

    /// A value for a URL's query: everything but unreserved characters percent-encoded.
    static func percentEncoded(_ text: String) -> String {
        var out = ""
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "0")...UInt8(ascii: "9"),
                 UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"), UInt8(ascii: "~"), UInt8(ascii: "/"):
                out.unicodeScalars.append(Unicode.Scalar(byte))
            default:
                let hex = Array("0123456789ABCDEF".utf8)
                out += "%" + String(decoding: [hex[Int(byte >> 4)], hex[Int(byte & 0xf)]], as: UTF8.self)
            }
        }
        return out
    }
}
