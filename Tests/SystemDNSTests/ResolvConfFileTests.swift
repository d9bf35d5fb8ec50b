import Foundation
import Glibc
import Basics
import Testing
@testable import SystemDNS
import Tunnel

/// resolv.conf written for the tunnel and put back, in a scratch directory.
@Suite struct ResolvConfFileTests {
    let directory: String
    var path: String { directory + "/resolv.conf" }
    let tunnel = try! DNSSettings(resolvers: [IPAddress("10.77.0.1")!, IPAddress("fd77::1")!], searchDomains: ["corp.example"])
    static let dhcp = "# from DHCP\nnameserver 192.168.1.1\nsearch home\n"

    init() throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("roam-resolv-\(getpid())-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
    }

    func cleanUp() { try? FileManager.default.removeItem(atPath: directory) }

    func read(_ file: String? = nil) -> String? { try? String(contentsOfFile: file ?? path, encoding: .utf8) }

    @Test func theTunnelsResolversReplaceTheFileAndTheOldOneComesBack() throws {
        defer { cleanUp() }
        try Self.dhcp.write(toFile: path, atomically: false, encoding: .utf8)
        let file = ResolvConfFile(path: path)
        #expect(try file.apply(tunnel, tunnel: "roam0"))
        let written = try #require(read())
        #expect(written.contains("\nnameserver 10.77.0.1\nnameserver fd77::1\nsearch corp.example\n"))
        #expect(!written.split(separator: "\n").contains("nameserver 192.168.1.1"), "the old servers are only kept as comments")
        #expect(ResolvConfFile.systemText(at: path) == Self.dhcp, "the system's own configuration is still known")
        var info = stat()
        #expect(stat(path, &info) == 0 && info.st_mode & 0o777 == 0o644)
        #expect(try !file.apply(tunnel, tunnel: "roam0"), "the same settings write nothing")
        #expect(try file.restore())
        #expect(read() == Self.dhcp)
        #expect(try !file.restore(), "a file that is not ours is left alone")
    }

    /// After a crash the next agent finds its predecessor's file: it keeps the original, not its own.
    /// Windows line ends must not leave a line of the old file live inside the agent's.
    @Test func crlfLinesOfTheOldFileStayComments() throws {
        defer { cleanUp() }
        let old = "# x\r\nnameserver 192.168.1.1\nsearch lan\r\noptions rotate\n"
        try old.write(toFile: path, atomically: false, encoding: .utf8)
        let file = ResolvConfFile(path: path)
        #expect(try file.apply(tunnel, tunnel: "roam0"))
        let live = try #require(read()).unicodeScalars.split(separator: "\n").map { String($0) }.filter { !$0.hasPrefix("#") }
        #expect(live == ["nameserver 10.77.0.1", "nameserver fd77::1", "search corp.example"], "\(live)")
        #expect(try file.restore())
        #expect(read() == old)
    }

    @Test func aNewAgentAdoptsTheFileOfOneThatDied() throws {
        defer { cleanUp() }
        try Self.dhcp.write(toFile: path, atomically: false, encoding: .utf8)
        try ResolvConfFile(path: path).apply(tunnel, tunnel: "roam0")
        let other = try DNSSettings(resolvers: [IPAddress("10.77.0.9")!], searchDomains: [])
        #expect(try ResolvConfFile(path: path).apply(other, tunnel: "roam0"))
        #expect(read()?.contains("nameserver 10.77.0.9\n") == true)
        #expect(try ResolvConfFile(path: path).restore())
        #expect(read() == Self.dhcp)
    }

    /// A DHCP client rewrites the file while the tunnel is up: its file becomes the one to put back.
    @Test func aFileWrittenMeanwhileBecomesTheOriginal() throws {
        defer { cleanUp() }
        try Self.dhcp.write(toFile: path, atomically: false, encoding: .utf8)
        let file = ResolvConfFile(path: path)
        try file.apply(tunnel, tunnel: "roam0")
        let renewed = "nameserver 172.16.0.1\n"
        try renewed.write(toFile: path, atomically: true, encoding: .utf8)
        #expect(try file.apply(tunnel, tunnel: "roam0"))
        #expect(ResolvConfFile.systemText(at: path) == renewed)
        try file.restore()
        #expect(read() == renewed)
    }

    @Test func aSymbolicLinkComesBackAsALink() throws {
        defer { cleanUp() }
        try Self.dhcp.write(toFile: directory + "/stub-resolv.conf", atomically: false, encoding: .utf8)
        #expect(symlink("stub-resolv.conf", path) == 0)
        let file = ResolvConfFile(path: path)
        try file.apply(tunnel, tunnel: "roam0")
        #expect(read()?.contains("nameserver 10.77.0.1") == true)
        #expect(read(directory + "/stub-resolv.conf") == Self.dhcp, "the link's target is never written")
        #expect(ResolvConfFile.systemText(at: path) == Self.dhcp)
        try file.restore()
        let target = try FileManager.default.destinationOfSymbolicLink(atPath: path)
        #expect(target == "stub-resolv.conf")
    }

    @Test func noFileBeforeMeansNoFileAfter() throws {
        defer { cleanUp() }
        let file = ResolvConfFile(path: path)
        try file.apply(tunnel, tunnel: "roam0")
        #expect(read() != nil)
        try file.restore()
        #expect(access(path, F_OK) != 0)
    }

    /// Lines that start with a combining mark would join the saved-line marker's space into one
    /// character; canonically equivalent text (`e` and a combining acute, or `é`) is not the same file.
    @Test(arguments: ["", "nameserver 1.1.1.1", "a\n\nb\n\n", "#roam-saved: looks like ours\n",
                      "\u{301}nameserver 10.0.0.1\n", "search cafe\u{301}.example\n", "a\n\u{308}\n\u{20DD}b",
                      "#\u{301} comment\r\nnameserver 10.0.0.2\r\n"])
    func anyOriginalComesBackByteForByte(_ original: String) throws {
        defer { cleanUp() }
        try original.write(toFile: path, atomically: false, encoding: .utf8)
        let file = ResolvConfFile(path: path)
        try file.apply(tunnel, tunnel: "roam0")
        try file.restore()
        // A last line without a newline gets one: resolv.conf(5) is read line by line.
        let expected = original.isEmpty || original.utf8.last == UInt8(ascii: "\n") ? original : original + "\n"
        #expect(Array((read() ?? "-").utf8) == Array(expected.utf8))
    }

    /// Whatever text was saved, what the agent's file says it saved is that text, byte for byte:
    /// seeded random files of lines that begin or end with combining marks, carriage returns,
    /// markers of the agent's own and text of several scripts.
    @Test func savedTextComesBackByteForByteWhateverItHolds() {
        var random = SeededRandom(seed: 30)
        let pieces = ["\u{301}", "\u{308}", "\u{20DD}", "\u{200D}", "\r", "\r\n", " ", "#", "e", "é", "nameserver 1.1.1.1",
                      "#roam-saved: ", "#roam-saved-link: ", "#roam-saved-nothing", "# roam", "\u{1F1FA}\u{1F1F8}", "ß", "\t", "\n", "\n"]
        for _ in 0..<2_000 {
            var text = ""
            for _ in 0..<Int.random(in: 0...12, using: &random) { text += pieces.randomElement(using: &random)! }
            let written = ResolvConfFile.render(tunnel, tunnel: "roam0", keeping: .text(text))
            let expected = text.isEmpty || text.utf8.last == UInt8(ascii: "\n") ? text : text + "\n"
            guard case .text(let saved)? = ResolvConfFile.original(in: written) else {
                Issue.record("not read back as saved text: \(Array(text.unicodeScalars))")
                return
            }
            #expect(Array(saved.utf8) == Array(expected.utf8), "\(Array(text.unicodeScalars))")
        }
    }

    /// The agent writes /etc as root: a link planted where it used to put its temporary file
    /// (the target plus the process ID) must not lead it to write elsewhere.
    @Test func aLinkPlantedAtATemporaryNameIsNotFollowed() throws {
        defer { cleanUp() }
        let victim = directory + "/victim"
        try "precious\n".write(toFile: victim, atomically: false, encoding: .utf8)
        try Self.dhcp.write(toFile: path, atomically: false, encoding: .utf8)
        symlink(victim, path + ".roam-new-\(getpid())")
        let file = ResolvConfFile(path: path)
        #expect(try file.apply(tunnel, tunnel: "roam0"))
        #expect(try file.restore())
        #expect(read(victim) == "precious\n")
        #expect(read() == Self.dhcp)
    }

    @Test func aFileThatCannotBeWrittenIsAnError() throws {
        defer { cleanUp() }
        let file = ResolvConfFile(path: directory + "/missing/resolv.conf")
        #expect(throws: SystemError.self) { try file.apply(tunnel, tunnel: "roam0") }
    }
}
