import Foundation
import Testing

/// roam-desktop's window in a throwaway X server (Xvfb) and session bus, driven through AT-SPI
/// by desktop_session.py against a fake agent on a temporary control socket: the Welcome
/// screen and its import through GTK's file chooser (the real agent's check, a fake pkexec that
/// writes down its arguments and input), the Details screen reading what the fake reports, the switch sending `down`, the
/// portal banner and its notification (through dunst), the tray item and its menu (through Debian's
/// status-notifier-watcher). Screenshots of each screen are kept in
/// .build/desktop-screenshots/.
@Suite(.serialized) struct DesktopWindowTests {
    @Test func theWindowShowsWhatTheAgentReportsAndTheSwitchSendsDown() throws {
        if let missing = DesktopSession.missing {
            print("skipped: " + missing)
            return
        }
        let outcome = try DesktopSession.run(seconds: 120)
        let said = outcome.said
        print(said)
        let screenshots = DesktopSession.screenshots
        switch outcome.status {
        case 0:
            for screen in ["welcome", "import-refused", "details", "details-off", "portal"] {
                #expect(FileManager.default.fileExists(atPath: screenshots.appendingPathComponent("\(screen).png").path))
            }
            // With a notification server (scripts/setup installs dunst) the portal's notification
            // is checked too: one, replaced, its "Log in" running `agent portal`.
            if FileManager.default.isExecutableFile(atPath: "/usr/bin/dunst") {
                #expect(said.contains("notification: one for the portal"))
            }
            // The tray item, with a watcher that appears after the app: registered, its menu's
            // labels, Disconnect sending `down`, then a new icon.
            #expect(said.contains("tray: org.kde.StatusNotifierItem-"))
            // The import: the broken profile refused at its line, the good one through pkexec
            // with only the name as its argument.
            #expect(said.contains("import: ") && said.contains("broken.yaml:3:"))
        case 77:
            print("skipped: " + said.trimmingCharacters(in: .whitespacesAndNewlines))
        default:
            Issue.record("the desktop session failed (status \(outcome.status)):\n\(said)")
        }
    }
}
