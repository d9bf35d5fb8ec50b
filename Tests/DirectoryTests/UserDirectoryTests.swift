import Foundation
import Glibc
import Basics
import NamespaceLab
import Testing
import Tunnel
import Device
@testable import Directory

/// Rows as a gateway reads them: nothing a row says is trusted, and a wrong row costs only itself.
struct UserDirectoryRowTests {
    static let key = "OXf+8dvN2jw8o7p3xqDfKp9oNGGIjHh3E0Jx4XHhD0s="

    @Test func goodRowsLoadAndWrongOrClashingOnesAreRefusedByName() throws {
        let hash = try PasswordHash.create(password: "correct horse", cost: .minimum).encoded
        let rows: [[String?]] = [
            ["alice", Self.key, nil, "10.77.0.2,fd77::2", "10.77.0.1", "corp.example"],
            ["bob", nil, hash, "10.77.0.3", "", ""],
            ["carol", "not a key", nil, "10.77.0.4", "", ""],
            ["dave", nil, "$argon2id$nope", "10.77.0.5", "", ""],
            ["erin", nil, hash, "10.77.0.0/24", "", ""],
            ["frank", nil, hash, "10.77.0.6,10.77.0.7", "", ""],
            ["grace", nil, hash, "10.77.0.2", "", ""],
            ["heidi", Self.key, nil, "10.77.0.8", "", ""],
            ["ivan", nil, nil, "10.77.0.9", "", ""],
            ["judy", nil, hash, "", "", ""],
            ["bob", nil, hash, "10.77.0.10", "", ""],
            [nil, nil, hash, "10.77.0.11", "", ""],
            ["mallory", nil, hash, "10.77.0.12", "10.77.0.1,not-an-address", ""],
        ]
        let load = UserDirectory.load(rows)
        #expect(load.users.map(\.label) == ["alice", "bob"])
        #expect(load.users.first?.dns?.resolvers == [IPAddress("10.77.0.1")!])
        #expect(load.users.first?.addresses == [IPAddress("10.77.0.2")!, IPAddress("fd77::2")!])
        let refused = Dictionary(load.refused.map { ($0.name, $0.why) }, uniquingKeysWith: { $1 })
        #expect(refused["carol"]?.contains("not a public key") == true)
        #expect(refused["dave"]?.contains("not an Argon2id hash") == true)
        #expect(refused["erin"]?.contains("10.77.0.0/24") == true)
        #expect(refused["frank"]?.contains("one IPv4 address, one IPv6 address") == true)
        #expect(refused["grace"]?.contains("10.77.0.2 is another user's") == true)
        #expect(refused["heidi"]?.contains("public key is another user's") == true)
        #expect(refused["ivan"]?.contains("neither") == true)
        #expect(refused["judy"] != nil)
        #expect(refused["bob"]?.contains("another row's") == true)
        #expect(refused[""]?.contains("without a name") == true)
        #expect(refused["mallory"]?.contains("not an address") == true)
        #expect(load.refused.count == 11)
        // What loads is a database the gateway takes as it is.
        #expect(throws: Never.self) { try UserDatabase(load.users) }
    }
}

/// Against a real PostgreSQL started for the test.
@Suite(.enabled(if: NamespaceLab.isRoot && LabPostgres.available,
                Comment(rawValue: NamespaceLab.isRoot ? LabPostgres.skipReason : NamespaceLab.skipReason)), .serialized)
struct UserDirectoryDatabaseTests {
    static let sql = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("contrib/sql")
    static let migration = sql.appendingPathComponent("001-users.sql").path
    static let notify = sql.appendingPathComponent("002-notify.sql").path
    static let sessions = sql.appendingPathComponent("003-sessions.sql").path

    @Test func theSchemaIsCheckedAndEnabledUsersAreRead() throws {
        let database = try LabPostgres()
        defer { database.stop() }
        /// Why the directory cannot be read now; nil when it was read.
        func refusal() -> String? {
            do {
                _ = try UserDirectory.read(database.conninfo(), passwordFile: nil)
                return nil
            } catch {
                return error.message
            }
        }
        // No schema yet: the gateway says which migration to run.
        let none = refusal()
        #expect(none?.contains("run 001-users.sql") == true, "\(none ?? "read")")
        try database.psql(file: Self.migration)
        // Version 1, then 2: the next migration is named.
        let one = refusal()
        #expect(one?.contains("version 1") == true && one?.contains("run 002-notify.sql") == true, "\(one ?? "read")")
        try database.psql(file: Self.notify)
        let two = refusal()
        #expect(two?.contains("version 2") == true && two?.contains("run 003-sessions.sql") == true, "\(two ?? "read")")
        try database.psql(file: Self.sessions)
        let hash = try PasswordHash.create(password: "correct horse", cost: .minimum).encoded
        try database.psql("""
            INSERT INTO roam_users (name, public_key, addresses, resolvers, search_domains)
                VALUES ('alice', '\(UserDirectoryRowTests.key)', '{10.77.0.2,fd77::2}', '{10.77.0.1}', '{corp.example}');
            INSERT INTO roam_users (name, password_hash, addresses) VALUES ('bob', '\(hash)', '{10.77.0.3}');
            INSERT INTO roam_users (name, password_hash, addresses, enabled) VALUES ('carl', '\(hash)', '{10.77.0.4}', false);
            INSERT INTO roam_users (name, password_hash, addresses) VALUES ('dora', '\(hash)', '{10.77.0.0/24}');
            """)
        // The database refuses an address an enabled user has; a disabled user's may be given again,
        // but that user may not be enabled while another has it.
        #expect(throws: (any Error).self) {
            try database.psql("INSERT INTO roam_users (name, password_hash, addresses) VALUES ('eve', '\(hash)', '{10.77.0.3}')")
        }
        try database.psql("INSERT INTO roam_users (name, password_hash, addresses) VALUES ('finn', '\(hash)', '{10.77.0.4}')")
        #expect(throws: (any Error).self) { try database.psql("UPDATE roam_users SET enabled = true WHERE name = 'carl'") }
        try database.psql("UPDATE roam_users SET name = 'finnegan' WHERE name = 'finn'; UPDATE roam_users SET addresses = '{10.77.0.4}' WHERE name = 'finnegan'")
        try database.psql("DELETE FROM roam_users WHERE name = 'finnegan'")
        let load = try UserDirectory.read(database.conninfo(), passwordFile: nil)
        #expect(load.users.map(\.label) == ["alice", "bob"], "the disabled user is not read")
        #expect(load.users.first?.dns?.searchDomains == ["corp.example"])
        #expect(load.refused.map(\.name) == ["dora"])

        // A later schema version: refused, with what to do.
        try database.psql("UPDATE roam_schema SET version = 4")
        let four = refusal()
        #expect(four?.contains("version 4") == true && four?.contains("upgrade the agent") == true, "\(four ?? "read")")
    }

    /// A role with a password: the password comes from a file only (libpq's passfile), and a
    /// wrong one or an unreachable server is an error that says so.
    @Test func thePasswordComesFromAFileAndAnAbsentServerIsAnError() throws {
        let database = try LabPostgres(hba: "local roam gateway scram-sha-256\n")
        defer { database.stop() }
        try database.psql(file: Self.migration)
        try database.psql(file: Self.notify)
        try database.psql(file: Self.sessions)
        try database.psql("CREATE ROLE gateway LOGIN PASSWORD 'sesame'; GRANT SELECT ON roam_schema, roam_users TO gateway;")
        let passfile = database.directory + "/gateway.pass"
        _ = FileManager.default.createFile(atPath: passfile, contents: Data("*:*:roam:gateway:sesame\n".utf8), attributes: [.posixPermissions: 0o600])
        let load = try UserDirectory.read(database.conninfo(user: "gateway"), passwordFile: passfile)
        #expect(load.users.isEmpty && load.refused.isEmpty)
        #expect(throws: DirectoryError.self) { try UserDirectory.read(database.conninfo(user: "gateway"), passwordFile: nil) }
        try "*:*:roam:gateway:wrong\n".write(toFile: passfile, atomically: false, encoding: .utf8)
        #expect(throws: DirectoryError.self) { try UserDirectory.read(database.conninfo(user: "gateway"), passwordFile: passfile) }
        try database.pause()
        do {
            _ = try UserDirectory.read(database.conninfo(), passwordFile: nil)
            Issue.record("read from a stopped server")
        } catch {
            #expect(error.message.hasPrefix("cannot connect to PostgreSQL"), "\(error)")
        }
    }

    /// A change committed in SQL reaches a listening gateway at once, by the user's name: an
    /// insert, a disabled user, a deleted one, a rename (both names); nothing before the commit.
    @Test func changesAreAnnouncedAsTheyAreCommitted() throws {
        let database = try LabPostgres()
        defer { database.stop() }
        try database.psql(file: Self.migration)
        try database.psql(file: Self.notify)
        try database.psql(file: Self.sessions)
        let subscription = try UserDirectory.Subscription(database.conninfo(), passwordFile: nil)
        /// The names announced within `seconds`, and how long the first took.
        func announced(within seconds: Double = 1) throws -> (names: [String], after: Duration?) {
            let start = ContinuousClock.now
            var names: [String] = []
            var first: Duration?
            while ContinuousClock.now - start < .seconds(seconds) {
                var poller = pollfd(fd: subscription.fileDescriptor, events: Int16(POLLIN), revents: 0)
                guard poll(&poller, 1, 50) > 0 else { if first != nil { break } else { continue } }
                let more = try subscription.changed()
                if first == nil && !more.isEmpty { first = ContinuousClock.now - start }
                names += more
            }
            return (names, first)
        }
        try database.psql("INSERT INTO roam_users (name, public_key, addresses) VALUES ('alice', '\(UserDirectoryRowTests.key)', '{10.77.0.2}')")
        #expect(try announced().names == ["alice"])
        try database.psql("UPDATE roam_users SET enabled = false WHERE name = 'alice'")
        let disabled = try announced()
        #expect(disabled.names == ["alice"])
        print("user directory: a disabled user announced \(disabled.after.map { "\($0)" } ?? "never") after the UPDATE returned")
        try database.psql("UPDATE roam_users SET name = 'alicia' WHERE name = 'alice'")
        #expect(Set(try announced().names) == ["alicia", "alice"])
        try database.psql("BEGIN; DELETE FROM roam_users WHERE name = 'alicia'; SELECT pg_sleep(0.3); COMMIT;")
        #expect(try announced().names == ["alicia"])
        #expect(try announced(within: 0.3).names.isEmpty, "nothing more")
        // The server gone: the subscription says so when its socket is next readable (the
        // server's farewell, then the end of the connection).
        try database.pause()
        var failed: DirectoryError?
        for _ in 0..<20 where failed == nil {
            var poller = pollfd(fd: subscription.fileDescriptor, events: Int16(POLLIN), revents: 0)
            guard poll(&poller, 1, 100) > 0 else { continue }
            do { _ = try subscription.changed() } catch { failed = error }
        }
        #expect(failed != nil, "a subscription to a stopped server went on as if it were there")
    }
}

/// The session records a gateway keeps in the database: replaced whole at each renewal, one
/// query shows the fleet, and a role without the grant is refused (not taken for a lost database).
@Suite(.enabled(if: NamespaceLab.isRoot && LabPostgres.available,
                Comment(rawValue: NamespaceLab.isRoot ? LabPostgres.skipReason : NamespaceLab.skipReason)), .serialized)
struct SessionRecordTests {
    @Test func aGatewaysRecordsAreReplacedWholeAndShowTheFleet() throws {
        let database = try LabPostgres(hba: "local roam reader trust\n")
        defer { database.stop() }
        for file in [UserDirectoryDatabaseTests.migration, UserDirectoryDatabaseTests.notify, UserDirectoryDatabaseTests.sessions] {
            try database.psql(file: file)
        }
        let subscription = try UserDirectory.Subscription(database.conninfo(), passwordFile: nil)
        let now = Instant.now()
        let alice = SessionRecord(user: "alice", addresses: [IPAddress("10.77.0.2")!, IPAddress("fd77::2")!],
                                  endpoint: SocketAddress(IPAddress("192.0.2.7")!, port: 40000), since: now - .seconds(90),
                                  received: 1_000, sent: 2_000)
        let odd = SessionRecord(user: "o'dd \"name\"\\,{}", addresses: [IPAddress("10.77.0.3")!],
                                endpoint: SocketAddress(IPAddress("2001:db8::1")!, port: 5), since: now, received: 0, sent: UInt64.max)
        try subscription.record([alice, odd], gateway: "fra1", now: now, wallClock: 1_800_000_000)
        try subscription.record([alice], gateway: "ams1", now: now, wallClock: 1_800_000_000)
        let fleet = try database.psql("""
            SELECT gateway || '|' || user_name || '|' || array_to_string(addresses, ',') || '|' || endpoint || '|' ||
                   extract(epoch FROM since)::bigint || '|' || bytes_in || '|' || bytes_out FROM roam_fleet ORDER BY 1
            """)
        #expect(fleet.split(separator: "\n").map(String.init) == [
            "ams1|alice|10.77.0.2,fd77::2|192.0.2.7:40000|1799999910|1000|2000",
            "fra1|alice|10.77.0.2,fd77::2|192.0.2.7:40000|1799999910|1000|2000",
            "fra1|o'dd \"name\"\\,{}|10.77.0.3|[2001:db8::1]:5|1800000000|0|\(Int64.max)",
        ])
        // Renewed without alice: her row on fra1 goes, ams1's stays.
        try subscription.record([odd], gateway: "fra1", now: now, wallClock: 1_800_000_010)
        let renewed = try database.psql("SELECT gateway || ' ' || user_name FROM roam_sessions ORDER BY 1").trimmingCharacters(in: .newlines)
        #expect(renewed == "ams1 alice\nfra1 o'dd \"name\"\\,{}", "\(renewed)")
        try UserDirectory.forgetSessions(database.conninfo(), passwordFile: nil, gateway: "fra1")
        let left = try database.psql("SELECT count(*) FROM roam_sessions WHERE gateway = 'fra1'").trimmingCharacters(in: .newlines)
        #expect(left == "0", "\(left)")

        // An announcement that came while a query ran is read by libpq with the query's answer: the
        // socket no longer shows it, yet it is there to take (the gateway takes them before every wait).
        try database.psql("INSERT INTO roam_users (name, public_key, addresses) VALUES ('zoe', '\(UserDirectoryRowTests.key)', '{10.77.0.9}')")
        usleep(100_000)
        try subscription.record([alice], gateway: "fra1", now: now, wallClock: 1_800_000_000)
        var poller = pollfd(fd: subscription.fileDescriptor, events: Int16(POLLIN), revents: 0)
        #expect(poll(&poller, 1, 200) == 0, "the announcement was read with the query's answer")
        #expect(try subscription.changed() == ["zoe"])

        // A role that may read the users but not write the records: refused, the connection still good.
        try database.psql("CREATE ROLE reader LOGIN; GRANT SELECT ON roam_schema, roam_users TO reader;")
        let reader = try UserDirectory.Subscription(database.conninfo(user: "reader"), passwordFile: nil)
        do {
            try reader.record([alice], gateway: "fra1", now: now, wallClock: 1_800_000_000)
            Issue.record("a role without the grant wrote records")
        } catch {
            #expect(error.kind == .refused && error.message.contains("permission denied"), "\(error)")
        }
        #expect(throws: Never.self) { _ = try reader.all() }
    }
}
