import Basics
import Directory
import Testing
import Tunnel

/// The gateway's copy of the directory, its snapshot, and the backoff between attempts: no database.
struct DirectoryCopyTests {
    static func row(_ name: String, key: String? = UserDirectoryRowTests.key, _ addresses: String) -> [String?] {
        [name, key, nil, addresses, nil, nil]
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
        // What the snapshot keeps of the copy makes the same users again, and the same refusals.
        let again = DirectoryCopy(rows: copy.rows).load()
        #expect(again.users == updated.users && again.refused.map(\.name) == updated.refused.map(\.name))
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
