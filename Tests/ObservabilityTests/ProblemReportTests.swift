@testable import Observability
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
