import Basics
import Testing
import Tunnel
@testable import Directory

/// The gateway's copy of the directory, its snapshot, and the backoff between attempts: no database.
struct DirectoryCopyTests {
    static func row(_ name: String, key: String? = UserDirectoryRowTests.key, _ addresses: String, hash: String? = nil) -> [String?] {
        [name, key, hash, addresses, nil, nil]
    }

    /// Changes applied to the copy give what a fresh read of the same rows gives, whatever the
    /// order they came in: the same users, the same refusals, and the name that sorts first keeps
    /// a contested address (so every gateway decides alike, whatever it saw before).
    @Test func anUpdatedCopyIsWhatAFreshReadWouldBe() throws {
        let keys = try (0..<6).map { _ in try PrivateKey.generate().publicKey.base64 }
        var rows = (0..<5).map { Self.row("user\($0)", key: keys[$0], "10.77.0.\(10 + $0)") }
        var copy = DirectoryCopy(rows: rows.reversed())
        #expect(copy.load().users.map(\.label) == (0..<5).map { "user\($0)" })

        // user1 disabled, user2's address changed to user3's, a new user5 with a bad key, user0 renamed to zed.
        let changed = [Self.row("user2", key: keys[2], "10.77.0.13"), Self.row("user5", key: "not a key", "10.77.0.15"),
                       Self.row("zed", key: keys[0], "10.77.0.10")]
        copy.update(["user1", "user2", "user5", "user0", "zed"], rows: changed)
        rows = [rows[3], rows[4]] + changed
        let fresh = DirectoryCopy(rows: rows).load()
        let updated = copy.load()
        #expect(updated.users == fresh.users)
        #expect(updated.users.map(\.label) == ["user2", "user4", "zed"])
        #expect(updated.refused.map(\.name) == fresh.refused.map(\.name))
        #expect(updated.refused.map(\.name) == ["user3", "user5"], "user2 now has user3's address: user2 sorts first and keeps it")
        #expect(copy.count == 5)
        // What the snapshot keeps of the copy makes the same users again; of the refused rows only
        // those refused for a clash (good in themselves) are kept, a wrong row is left out.
        let again = DirectoryCopy(rows: copy.rows).load()
        #expect(again.users == updated.users && again.refused.map(\.name) == ["user3"])
        let full = DirectoryCopy(rows: [["alice", keys[5], try PasswordHash.create(password: "x", cost: .minimum).encoded,
                                        "10.77.0.2,fd77::2", "10.77.0.1,fd77::1", "corp.example,lab.example"]])
        #expect(DirectoryCopy(rows: full.rows).load().users == full.load().users)
        #expect(full.load().users.first?.dns?.searchDomains == ["corp.example", "lab.example"])
    }

    /// Names are told apart byte for byte, as the server does: a name that is canonically equal but
    /// spelled differently is another row (and the server keeps them apart).
    @Test func namesAreComparedByteForByte() throws {
        let keys = try (0..<2).map { _ in try PrivateKey.generate().publicKey.base64 }
        let copy = DirectoryCopy(rows: [Self.row("K", key: keys[0], "10.77.0.2"), Self.row("\u{212A}", key: keys[1], "10.77.0.3")])
        #expect(copy.load().users.count == 2)
    }

    /// The snapshot keeps every row exactly (NULLs, tabs, backslashes, newlines in values) and
    /// refuses anything that is not a whole snapshot of this format.
    @Test func theSnapshotKeepsRowsExactlyAndRefusesWhatItDidNotWrite() throws {
        let rows: [[String?]] = [
            ["alice", UserDirectoryRowTests.key, nil, "10.77.0.2,fd77::2", "10.77.0.1", "corp.example"],
            ["odd\tname\\with\nlines\r", nil, "$argon2id$x", "10.77.0.3", nil, ""],
            ["\\N", nil, nil, "", nil, nil],
        ]
        let text = UserSnapshot.text(rows)
        #expect(try UserSnapshot.rows(Array(text.utf8)) == rows)
        #expect(text.split(separator: "\n").count == 4, "one line per row after the header")
        let wrong: [String] = [
            "", "not a snapshot\n", text.replacing("schema \(UserDirectory.schemaVersion)", with: "schema 99"),
            String(text.dropLast()),  // cut short
            text + "a\tb\n",  // too few columns
            text + "a\\q\t\\N\t\\N\t\\N\t\\N\t\\N\n",  // an escape it never writes
        ]
        for bad in wrong {
            #expect(throws: DirectoryError.self, "\(bad.debugDescription)") { try UserSnapshot.rows(Array(bad.utf8)) }
        }
        #expect(throws: DirectoryError.self) { try UserSnapshot.rows([0xff, 0xfe]) }
    }

    /// Waits double from the first to the cap, each drawn between half and all of its step, and
    /// start again from the first once connected.
    @Test func theBackoffDoublesToItsCapWithJitterAndResets() {
        var backoff = Backoff(first: .seconds(1), cap: .seconds(8))
        #expect([0.0, 0.0, 0.0, 0.0, 0.0].map { backoff.wait(random: $0) } == [.milliseconds(500), .seconds(1), .seconds(2), .seconds(4), .seconds(4)])
        #expect(backoff.wait(random: 0.999_999) <= .seconds(8))
        backoff.reset()
        #expect(backoff.wait(random: 1) == .seconds(1))
    }
}

/// What a row, a URL or the database's answer may not do to a gateway.
struct DirectoryGuardTests {
    static let tunnel = [Prefix("10.77.0.1/24")!, Prefix("fd77::1/64", defaultFamily: .v6)!]

    /// A row's addresses lie inside the gateway's tunnel and are nobody else's: not the gateway's
    /// own, not a prefix's network or broadcast, not the database's or a metadata service's.
    @Test func aRowsAddressesLieInsideTheTunnel() {
        let good = DirectoryCopyTests.row("good", "10.77.0.2,fd77::2")
        #expect(DirectoryCopy(rows: [good], tunnel: Self.tunnel).load().users.count == 1)
        let bad: [(String, String)] = [
            ("169.254.169.254", "outside the gateway's tunnel"), ("192.0.2.10", "outside"), ("10.77.0.1", "the gateway's own"),
            ("10.77.0.0", "network or broadcast"), ("10.77.0.255", "network or broadcast"), ("10.77.0.3,fd77::1", "the gateway's own"),
            ("10.77.0.3,2001:db8::3", "outside"),
        ]
        for (addresses, why) in bad {
            let load = DirectoryCopy(rows: [DirectoryCopyTests.row("bad", addresses)], tunnel: Self.tunnel).load()
            #expect(load.users.isEmpty && load.refused.first?.why.contains(why) == true, "\(addresses): \(load.refused)")
        }
        // Without a tunnel (a copy read for a report), addresses are not judged.
        #expect(DirectoryCopy(rows: [DirectoryCopyTests.row("any", "192.0.2.10")]).load().users.count == 1)
        let v6only = DirectoryCopy(rows: [DirectoryCopyTests.row("six", "10.77.0.9")], tunnel: [Self.tunnel[1]]).load()
        #expect(v6only.users.isEmpty, "an IPv4 address for a tunnel with no IPv4 prefix")
    }

    /// An announcement of a row as it was changes nothing (anyone connected may NOTIFY).
    @Test func anAnnouncementOfAnUnchangedRowChangesNothing() throws {
        let key = try PrivateKey.generate().publicKey.base64
        var copy = DirectoryCopy(rows: [DirectoryCopyTests.row("alice", key: key, "10.77.0.2")], tunnel: Self.tunnel)
        let same = copy.update(["alice"], rows: [DirectoryCopyTests.row("alice", key: key, "10.77.0.2")])
        let nobody = copy.update(["nobody"], rows: [])
        let moved = copy.update(["alice"], rows: [DirectoryCopyTests.row("alice", key: key, "10.77.0.3")])
        let gone = copy.update(["alice"], rows: [])
        #expect(!same && !nobody && moved && gone)
        #expect(copy.count == 0)
    }

    /// A stored hash may not ask for more work per check than the gateway's password budget
    /// affords (twice `agent passwd`'s): every check of it (a decoy's too) would hold the
    /// password thread at a stranger's call. A row that does is refused by name, saying why.
    @Test func aHashThatCostsTooMuchIsRefused() throws {
        let fine = try PasswordHash.create(password: "x", cost: .minimum).encoded
        #expect(PasswordHash(encoded: fine) != nil)
        let parts = fine.split(separator: "$", omittingEmptySubsequences: false)
        func with(_ cost: String) -> String { ([parts[0], parts[1], parts[2], Substring(cost)] + parts[4...]).joined(separator: "$") }
        // agent passwd's own cost, and twice its work either way, pass.
        for cost in ["m=65536,t=2,p=1", "m=131072,t=2,p=1", "m=65536,t=4,p=1"] {
            #expect(PasswordHash(encoded: with(cost)) != nil, "\(cost)")
        }
        // libsodium's "sensitive" level (7.3 s a check here), a little past twice, absurd ones.
        for cost in ["m=1048576,t=4,p=1", "m=131072,t=3,p=1", "m=4194304,t=1,p=1", "m=65536,t=100000,p=1", "m=65536,t=2,p=4",
                     "m=65536,t=0,p=1", "m=9223372036854775807,t=9223372036854775807,p=1"] {
            #expect(PasswordHash(encoded: with(cost)) == nil, "\(cost)")
        }
        let sensitive = DirectoryCopy(rows: [DirectoryCopyTests.row("costly", "10.77.0.2", hash: with("m=1048576,t=4,p=1"))],
                                      tunnel: Self.tunnel).load()
        #expect(sensitive.users.isEmpty)
        #expect(sensitive.refused.first?.why.contains("too costly to check: 1048576 KiB × 4 passes") == true, "\(sensitive.refused)")
    }

    /// The connection's defaults: TLS verified over TCP unless the URL says otherwise (and then a
    /// warning), none over a Unix socket; the server's passing errors tried again, the others not.
    @Test func theConnectionIsVerifiedOverTCPAndPassingErrorsAreToldApart() {
        let tcp = PostgresConnection.withDefaults("postgresql://gateway@db.example/roam")
        #expect(tcp.contains("sslmode=verify-full") && tcp.contains("statement_timeout") && tcp.contains("tcp_user_timeout=30000"))
        #expect(tcp.contains("client_encoding=UTF8") && tcp.hasPrefix("postgresql://gateway@db.example/roam?connect_timeout=5"))
        #expect(!PostgresConnection.withDefaults("postgresql://gateway@/roam?host=/run/postgresql").contains("sslmode"))
        #expect(!PostgresConnection.withDefaults("postgresql:///roam").contains("sslmode"))
        #expect(PostgresConnection.withDefaults("postgresql://db/roam?sslmode=require&connect_timeout=9")
            .components(separatedBy: "sslmode").count == 2, "the URL's own sslmode is kept, not doubled")
        #expect(PostgresConnection.withDefaults("host=/run/postgresql dbname=roam") == "host=/run/postgresql dbname=roam")
        #expect(UserDirectory.transportProblem("postgresql://db/roam?sslmode=require") != nil)
        #expect(UserDirectory.transportProblem("postgresql://db/roam?sslmode=verify-full") == nil)
        #expect(UserDirectory.transportProblem("postgresql://db/roam") == nil, "the default verifies")
        #expect(UserDirectory.transportProblem("postgresql://@/roam?sslmode=disable") == nil, "a Unix socket")
        for code in ["57014", "57P01", "53200", "08006", "40001", "55P03", "25006"] { #expect(PostgresConnection.isTransient(code), "\(code)") }
        for code in ["42P01", "42501", "22P02", ""] { #expect(!PostgresConnection.isTransient(code), "\(code)") }
    }
}
