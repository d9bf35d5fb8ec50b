import Foundation
import Glibc
import NamespaceLab
import Testing

/// What `agent record` writes, `agent replay` reads, whatever the server's address family.
@Suite(.enabled(if: NamespaceLab.isRoot, Comment(rawValue: NamespaceLab.skipReason)), .serialized)
struct RecordReplayTests {
    @Test(arguments: ["198.51.100.7:51820", "[2001:db8::7]:51820", "2001:db8::7"])
    func aRecordingReplays(_ server: String) throws {
        let lab = try RoamingLab(vpn: .roam, routing: .split)
        let file = lab.directory + "/recorded.yaml"
        let (recorded, output) = try lab.runAgent(["record", "--server", server, "--seconds", "0.3", "--out", file])
        #expect(recorded == 0, "\(output)")
        let (replayed, text) = try lab.runAgent(["replay", file])
        #expect(replayed == 0, "\(text)\n\((try? String(contentsOfFile: file, encoding: .utf8))?.prefix(400) ?? "")")
    }
}
