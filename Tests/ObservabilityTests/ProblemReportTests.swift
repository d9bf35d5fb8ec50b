@testable import Observability
import Foundation
import Testing

@Test func aConfigurationLosesItsSecretValuesAndCommentsAndKeepsTheRest() {
    let text = """
        server: vpn.example:51820   # the password was hunter22
        # password: oldpassword1
        private-key-file: /etc/roam/client.key
        password-file: /etc/roam/password
        private-key: aW5saW5lLWtleS1ieXRlcy0xMjM0NTY3ODkwMTI=
        users:
          - {name: carol, password-hash: $argon2id$v=19$m=65536,t=3,p=1$c2FsdA$aGFzaA, addresses: [10.77.0.3]}
          - {name: erin, password-hash: "quoted, with a comma", public-key: QUJD}
          - name: dave
            password-hash: '$argon2id$v=19$m=65536,t=3,p=1$YmxvY2s$aGFzaA'
        users-from: {url: "postgresql://gw:sekrit99@db/roam", password-file: /etc/roam/passfile}
        api-token: tok-123456
        """
    let out = ProblemReport.redactConfiguration(text)
    for secret in ["hunter22", "oldpassword1", "aW5saW5l", "c2FsdA", "aGFzaA", "t=3", "quoted, with a comma", "YmxvY2s", "sekrit99", "tok-123456"] {
        #expect(!out.contains(secret), "\(secret) left in:\n\(out)")
    }
    let lines = out.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
    #expect(lines[0] == "server: vpn.example:51820")
    #expect(lines[1] == "")
    #expect(lines[2] == "private-key-file: /etc/roam/client.key" && lines[3] == "password-file: /etc/roam/password")
    #expect(lines[4] == "private-key: <removed>")
    #expect(lines[6] == "  - {name: carol, password-hash: <removed>, addresses: [10.77.0.3]}")
    #expect(lines[7] == "  - {name: erin, password-hash: <removed>, public-key: QUJD}")
    #expect(lines[9] == "    password-hash: <removed>")
    #expect(lines[10] == "users-from: {url: \"postgresql://gw:<removed>@db/roam\", password-file: /etc/roam/passfile}")
}

@Test func aURLKeepsItsUserAndHostAndLosesItsPassword() {
    #expect(ProblemReport.redactURLPasswords("see http://u:p4ss@h:80/x and postgres://a@b/c")
        == "see http://u:<removed>@h:80/x and postgres://a@b/c")
    #expect(ProblemReport.redactURLPasswords("no url here: a:b@c") == "no url here: a:b@c")
}

@Test func whatSecretFilesHoldIsScrubbedWhereverItAppearsButShortWordsAreLeft() {
    let values = ProblemReport.secretValues(inFile: "db:5432:roam:gw:passfile-pw-1\n")
    #expect(values.contains("passfile-pw-1") && values.contains("db:5432:roam:gw:passfile-pw-1"))
    let text = "line with passfile-pw-1 and db and roam"
    #expect(ProblemReport.scrub(text, secrets: values) == "line with <removed> and db and roam")
}

@Test func aTarArchiveHasUstarHeadersWithAValidChecksumAndPaddedFiles() {
    var archive = TarArchive(modified: 1_700_000_000)
    archive.add("report/a.txt", Array("hello\n".utf8))
    let bytes = archive.finished
    #expect(bytes.count == 512 + 512 + 1024)
    #expect(Array(bytes[0..<12]) == Array("report/a.txt".utf8))
    #expect(Array(bytes[257..<262]) == Array("ustar".utf8))
    // Size in octal; the checksum is the sum of the header with its field as blanks.
    #expect(String(decoding: bytes[124..<135], as: UTF8.self) == "00000000006")
    var header = Array(bytes[0..<512])
    for i in 148..<156 { header[i] = UInt8(ascii: " ") }
    let stored = Int(String(decoding: bytes[148..<154], as: UTF8.self), radix: 8)
    #expect(stored == header.reduce(0) { $0 + Int($1) })
    #expect(Array(bytes[512..<518]) == Array("hello\n".utf8) && bytes[518..<1024].allSatisfy { $0 == 0 })
}

/// Every way a valid (or nearly valid) file may hold a password hash, and what the readers
/// accept besides: none of the secret survives.
@Test(arguments: [
    "password-hash:\t$argon2id$v=19$m=65536,t=3,p=1$U0VDUkVUU0FMVA$U0VDUkVUSEFTSA",
    "password-hash : $argon2id$v=19$m=65536,t=3,p=1$U0VDUkVUU0FMVA$U0VDUkVUSEFTSA",
    "\"password-hash\": \"$argon2id$v=19$m=65536,t=3,p=1$U0VDUkVUU0FMVA$U0VDUkVUSEFTSA\"",
    "password-hash:\n  $argon2id$v=19$m=65536,t=3,p=1$U0VDUkVUU0FMVA$U0VDUkVUSEFTSA",
    "password-hash: >-\n  $argon2id$v=19$m=65536,t=3,p=1$U0VDUkVUU0FMVA$U0VDUkVUSEFTSA\nlisten-port: 51820",
    "name: \"a \\\n  U0VDUkVUSEFTSA\"",
    "- {name: carol, password-hash:\n    $argon2id$v=19$m=65536,t=3,p=1$U0VDUkVUU0FMVA$U0VDUkVUSEFTSA}",
    "password-hash:$argon2id$v=19$m=65536,t=3,p=1$U0VDUkVUU0FMVA$U0VDUkVUSEFTSA",
    "Password-Hash: U0VDUkVUSEFTSA",
    "description: Alice's laptop  # old password U0VDUkVUSEFTSA",
    "password-hash: 'it''s U0VDUkVUSEFTSA'  # U0VDUkVUSEFTSA",
    "url: \"postgresql://gw@db/roam?sslmode=require&password=U0VDUkVUSEFTSA\"",
    "url: postgresql://gw:U0VDUk/VUSE?FTSA@db/roam",
    "users:\r\n  - {name: a, password-hash: U0VDUkVUSEFTSA}\r\n",
])
func noFormOfASecretSurvives(_ text: String) {
    let out = ProblemReport.redactConfiguration(text)
    for piece in ["U0VDUkVUSEFTSA", "U0VDUkVUU0FMVA", "VUSE"] where text.contains(piece) {
        #expect(!out.contains(piece), "\(piece) left in:\n\(out)")
    }
}

/// The allowlist is what the configuration readers accept, less the one secret value: a key
/// added to a reader and not here is left out of reports (safe, but worth knowing), one here
/// that no reader accepts is stale.
@Test func theKnownKeysAreTheKeysTheReadersAccept() throws {
    let sources = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Sources")
    var accepted = Set<String>()
    for directory in ["Settings", "ConfigReader"] {
        let folder = sources.appendingPathComponent(directory)
        for name in try FileManager.default.contentsOfDirectory(atPath: folder.path) where name.hasSuffix(".swift") {
            let text = try String(contentsOf: folder.appendingPathComponent(name), encoding: .utf8)
            // The lists the readers check keys against: `allowed: [...]` and `...Keys = [...]`.
            for opener in ["allowed: [", "Keys = ["] {
                var rest = Substring(text)
                while let start = rest.range(of: opener) {
                    let end = rest[start.upperBound...].firstIndex(of: "]") ?? rest.endIndex
                    let parts = rest[start.upperBound..<end].split(separator: "\"", omittingEmptySubsequences: false)
                    for (i, part) in parts.enumerated() where i % 2 == 1 && part.allSatisfy({ $0.isLowercase || $0.isNumber || $0 == "-" }) {
                        accepted.insert(String(part))
                    }
                    rest = rest[end...]
                }
            }
        }
    }
    accepted.remove("password-hash")
    #expect(accepted.count > 80)
    #expect(ProblemReport.knownKeys == accepted, "readers only: \(accepted.subtracting(ProblemReport.knownKeys).sorted()); list only: \(ProblemReport.knownKeys.subtracting(accepted).sorted())")
}
