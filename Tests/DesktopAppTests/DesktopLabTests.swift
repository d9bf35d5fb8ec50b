import Foundation
import NamespaceLab
import Testing

/// roam-desktop against a real client: a lab gateway (`agent serve`) and a real `agent up` in
/// split mode in a namespace of its own, the app under Xvfb on that client's control socket,
/// driven through AT-SPI by desktop_session.py, which checks what the window shows against the
/// agent's own `agent status`: Connected through its server; the switch taking the agent down
/// and up; and a second profile beside its configuration, chosen with its "Use" button, that the
/// agent starts again on and connects with, its lockdown loaded throughout. The connected
/// window's screenshot is kept as .build/desktop-screenshots/lab-connected.png.
@Suite(.enabled(if: NamespaceLab.isRoot, Comment(rawValue: NamespaceLab.skipReason)), .serialized)
struct DesktopLabTests {
    @Test func theWindowFollowsARealAgentThroughItsSwitchAndAProfileChange() throws {
        if let missing = DesktopSession.missing {
            print("skipped: " + missing)
            return
        }
        let lab = try GatewayLab(clients: 1)
        try lab.start()
        // The same gateway and key, one more route into the tunnel: a profile that passes the
        // agent's check and tells itself apart in the status.
        let own = try String(contentsOfFile: lab.directory + "/client0.yaml", encoding: .utf8)
        let other = own.replacingOccurrences(of: "routes: [10.77.0.0/24]", with: "routes: [10.77.0.0/24, 10.78.0.0/24]")
        try #require(other != own, "client0.yaml names its routes as expected:\n\(own)")
        try other.write(toFile: lab.directory + "/second.yaml", atomically: true, encoding: .utf8)

        let outcome = try DesktopSession.run(["--real-agent", lab.directory + "/agent0.sock", "--netns", lab.laptops[0].name,
                                              "--profiles", lab.directory, "--other-profile", "second"], seconds: 180)
        print(outcome.said)
        switch outcome.status {
        case 0:
            #expect(outcome.said.contains("Use second restarted it on second"))
            #expect(FileManager.default.fileExists(atPath: DesktopSession.screenshots.appendingPathComponent("lab-connected.png").path))
        case 77:
            print("skipped: " + outcome.said.trimmingCharacters(in: .whitespacesAndNewlines))
        default:
            Issue.record("the desktop session failed (status \(outcome.status)):\n\(outcome.said)\nclient log:\n\(lab.log("client0.log"))")
        }
    }
}
