public import Basics
public import Tunnel

/// The gateways' shared user directory in PostgreSQL (`contrib/sql/`): the users every gateway
/// reads at start instead of its file's `users:` list.
///
/// Nothing a row says is trusted: each is read as the file's users are (a key from `agent
/// pubkey`, a hash from `agent passwd`, one IPv4 and at most one IPv6 host address), and a row
/// that is wrong, or that claims a name, key or address an earlier row has, is refused with its
/// name and why; the others load.
public enum UserDirectory {
    /// The schema version this agent reads (`roam_schema.version`).
    public static let schemaVersion = 3
    /// The migrations, in order, as the package installs them: migration N brings a database of
    /// version N-1 to version N.
    public static let migrations = ["001-users.sql", "002-notify.sql", "003-sessions.sql"]
    /// The channel every change to roam_users is announced on (002-notify.sql), with the user's name.
    public static let channel = "roam_users"

    /// What a read gave: the users served, and the rows refused (name, why).
    public struct Load: Sendable {
        public var users: [User]
        public var refused: [(name: String, why: String)]
    }

    /// The columns a row is read from, in this order, as text; each cut short past what a good
    /// row can hold, so one oversized row costs a refusal, never the gateway's memory.
    static let query = """
        SELECT left(name, 256), left(public_key, 64), left(password_hash, 256), array_to_string(addresses[1:3], ','),
               array_to_string(resolvers[1:9], ','), left(array_to_string(search_domains[1:9], ','), 2304)
        FROM roam_users WHERE enabled
        """
    static let namedQuery = query + " AND name = ANY($1::text[])"

    /// A gateway's session records, inserted or renewed (`Subscription.record`).
    static let recordQuery = """
        INSERT INTO roam_sessions AS s (gateway, user_name, addresses, endpoint, since, bytes_in, bytes_out, updated_at)
        SELECT $1, u, string_to_array(a, ',')::inet[], e, to_timestamp(t), i, o, now()
        FROM unnest($2::text[], $3::text[], $4::text[], $5::float8[], $6::int8[], $7::int8[]) AS r(u, a, e, t, i, o)
        ON CONFLICT (gateway, user_name) DO UPDATE SET addresses = EXCLUDED.addresses, endpoint = EXCLUDED.endpoint,
            since = EXCLUDED.since, bytes_in = EXCLUDED.bytes_in, bytes_out = EXCLUDED.bytes_out, updated_at = now()
        """

    /// Reads every enabled user from the database at `target` (libpq's URL or connection string;
    /// the password from `passwordFile`, never from the URL). Throws when the database cannot be
    /// reached or read, or speaks another schema version.
    public static func read(_ target: String, passwordFile: String?, tunnel: [Prefix] = []) throws(DirectoryError) -> Load {
        try Subscription(target, passwordFile: passwordFile).all(tunnel: tunnel).load()
    }

    /// Why the connection `url` describes can be listened in on or answered by someone else, or
    /// nil: over TCP with an sslmode that does not verify the server (disable, allow, prefer,
    /// require); whoever answers for the database decides who may log in.
    public static func transportProblem(_ url: String) -> String? {
        guard !PostgresConnection.overUnixSocket(url), let mode = PostgresConnection.parameters(url)["sslmode"],
              ["disable", "allow", "prefer", "require"].contains(mode.lowercased())
        else { return nil }
        return "sslmode=\(mode) does not verify the database's certificate: whoever answers for it decides who may log in; "
            + "use sslmode=verify-full (the default) with sslrootcert"
    }

    /// Removes the session records of `gateway` (it stops), on a connection of its own.
    public static func forgetSessions(_ target: String, passwordFile: String?, gateway: String) throws(DirectoryError) {
        _ = try PostgresConnection(target, passwordFile: passwordFile).rows("DELETE FROM roam_sessions WHERE gateway = $1", [gateway])
    }

    /// The users of `rows` (the query's columns), each checked, duplicates refused.
    public static func load(_ rows: [[String?]]) -> Load { DirectoryCopy(rows: rows).load() }

    /// Throws unless the database speaks `schemaVersion`, naming what to run.
    static func checkVersion(_ connection: PostgresConnection) throws(DirectoryError) {
        let version: Int?
        do {
            version = try connection.rows("SELECT version FROM roam_schema").first?.first.flatMap { $0.flatMap { Int($0) } }
        } catch where error.code == "42P01" {
            throw DirectoryError("the database has no roam_schema table: run \(migrations[0]) from /usr/share/roam/sql (\(error))",
                                 kind: .schema)
        }
        guard let version, version == schemaVersion else {
            // Migration N brings version N-1 to N; a version below 1 or past ours names none.
            let next = version.map { migrations.indices.contains($0) && $0 < schemaVersion ? migrations[$0] : nil } ?? migrations.first
            throw DirectoryError("the database's schema is version \(version.map(String.init) ?? "unknown"), this agent reads version "
                + "\(schemaVersion)" + (next.flatMap { $0 }.map { ": run \($0) from /usr/share/roam/sql" } ?? ": upgrade the agent"),
                kind: .schema)
        }
    }

    /// Why `address` cannot be a user's inside the gateway's tunnel prefixes, or nil: it must lie
    /// in one of them and be neither the gateway's own address nor an IPv4 prefix's network or
    /// broadcast address. With no prefixes (a copy read without a gateway), anything goes.
    static func problem(with address: IPAddress, in tunnel: [Prefix]) -> String? {
        guard !tunnel.isEmpty else { return nil }
        guard let prefix = tunnel.first(where: { $0.contains(address) }) else {
            return "its address \(address) is outside the gateway's tunnel (\(tunnel.map(\.network.description).joined(separator: ", ")))"
        }
        if tunnel.contains(where: { $0.address == address }) { return "its address \(address) is the gateway's own" }
        if case .v4(let bits) = address, prefix.length < 31 {
            let host = UInt32.max >> UInt32(prefix.length)
            if bits & host == 0 || bits & host == host { return "its address \(address) is its prefix's network or broadcast address" }
        }
        return nil
    }

    /// A PostgreSQL text array holding `items`, for a parameter.
    static func arrayLiteral(_ items: [String]) -> String {
        "{" + items.map { "\"" + $0.replacing("\\", with: "\\\\").replacing("\"", with: "\\\"") + "\"" }.joined(separator: ",") + "}"
    }

    /// One row as a user, or why not.
    static func user(_ row: [String?], tunnel: [Prefix]) -> Result<User, DirectoryError> {
        guard row.count == 6, let name = row[0], (1...255).contains(name.utf8.count) else {
            return .failure(DirectoryError("a row without a name of 1 to 255 bytes"))
        }
        var key: PublicKey?
        if let text = row[1] {
            guard let parsed = PublicKey(base64: text) else {
                return .failure(DirectoryError("public_key is not a public key (44 characters of base64, from agent pubkey)"))
            }
            key = parsed
        }
        var hash: PasswordHash?
        if let text = row[2] {
            guard let parsed = PasswordHash(encoded: text) else {
                return .failure(DirectoryError("password_hash is \(PasswordHash.refusal(of: text) ?? "refused")"))
            }
            hash = parsed
        }
        guard key != nil || hash != nil else { return .failure(DirectoryError("neither public_key nor password_hash")) }
        var inner: [IPAddress] = []
        for text in (row[3] ?? "").split(separator: ",") {
            guard let address = IPAddress(String(text)) else {
                return .failure(DirectoryError("addresses holds \(text), which is not a single host's address"))
            }
            inner.append(address)
        }
        let families = inner.map(\.family)
        guard (1...2).contains(families.count), Set(families).count == families.count else {
            return .failure(DirectoryError("addresses must hold one IPv4 address, one IPv6 address, or one of each"))
        }
        // The gateway routes each address to the user's client: one outside its tunnel (the
        // database's, a resolver's, a metadata service's) would take the gateway's own packets.
        for address in inner {
            if let problem = problem(with: address, in: tunnel) { return .failure(DirectoryError(problem)) }
        }
        var dns: DNSSettings?
        let resolvers = (row[4] ?? "").split(separator: ",").map { IPAddress(String($0)) }
        let domains = (row[5] ?? "").split(separator: ",").map(String.init)
        if !resolvers.isEmpty || !domains.isEmpty {
            guard resolvers.allSatisfy({ $0 != nil }) else { return .failure(DirectoryError("resolvers holds something that is not an address")) }
            do {
                dns = try DNSSettings(resolvers: resolvers.compactMap { $0 }, searchDomains: domains)
            } catch {
                return .failure(DirectoryError("resolvers or search_domains: \(error)"))
            }
        }
        return .success(User(name: name, publicKey: key, addresses: inner, passwordHash: hash, dns: dns))
    }

    /// The directory followed (`LISTEN roam_users`): every row once, then the names of the users
    /// whose rows changed as the changes are committed, to read again. One connection, blocking:
    /// for a thread of its own. Nothing is read but when asked or when the socket is ready.
    public final class Subscription {
        private let connection: PostgresConnection

        /// Connects to the database at `target` (as `read`), checks its schema version and
        /// listens: every change committed from now on is announced.
        public init(_ target: String, passwordFile: String?) throws(DirectoryError) {
            connection = try PostgresConnection(target, passwordFile: passwordFile)
            try UserDirectory.checkVersion(connection)
            _ = try connection.rows("LISTEN \(UserDirectory.channel)")
        }

        /// Every enabled row now (after listening: a change from here on is announced too), for a
        /// gateway whose tunnel has `tunnel` (a user's addresses must lie inside it).
        public func all(tunnel: [Prefix] = []) throws(DirectoryError) -> DirectoryCopy {
            var copy = DirectoryCopy(tunnel: tunnel)
            try connection.each(UserDirectory.query) { copy.add($0) }
            copy.finish()
            return copy
        }

        /// The enabled rows of these users now; a name without one was disabled or deleted.
        public func rows(named names: [String]) throws(DirectoryError) -> [[String?]] {
            try connection.rows(UserDirectory.namedQuery, [UserDirectory.arrayLiteral(names)])
        }

        /// The socket to poll for readiness.
        public var fileDescriptor: Int32 { connection.fileDescriptor }

        /// Replaces this gateway's session records with `records` (`now`: the monotonic instant
        /// they were taken at, `wallClock`: the Unix time then), in one transaction.
        public func record(_ records: [SessionRecord], gateway: String, now: Instant, wallClock: Double) throws(DirectoryError) {
            let since = records.map { wallClock - Double((now - $0.since).nanoseconds) / 1e9 }
            let users = UserDirectory.arrayLiteral(records.map(\.user))
            let parameters = [
                gateway, users, UserDirectory.arrayLiteral(records.map { $0.addresses.map(\.description).joined(separator: ",") }),
                UserDirectory.arrayLiteral(records.map { "\($0.endpoint)" }),
                "{" + since.map { "\($0)" }.joined(separator: ",") + "}",
                "{" + records.map { "\(min($0.received, UInt64(Int64.max)))" }.joined(separator: ",") + "}",
                "{" + records.map { "\(min($0.sent, UInt64(Int64.max)))" }.joined(separator: ",") + "}",
            ]
            _ = try connection.rows("BEGIN")
            do {
                _ = try connection.rows(UserDirectory.recordQuery, parameters)
                _ = try connection.rows("DELETE FROM roam_sessions WHERE gateway = $1 AND NOT (user_name = ANY($2::text[]))", [gateway, users])
                _ = try connection.rows("COMMIT")
            } catch {
                _ = try? connection.rows("ROLLBACK")
                throw error
            }
        }

        /// The names announced since the last call, each once, in order; throws when the
        /// connection is gone (the caller connects again, and reads everything afresh).
        public func changed() throws(DirectoryError) -> [String] {
            var seen: Set<[UInt8]> = []
            return try connection.notifications().filter { seen.insert(Array($0.utf8)).inserted }
        }
    }
}
