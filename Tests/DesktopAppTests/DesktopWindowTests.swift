import Foundation
import Testing

/// roam-desktop's window in a throwaway X server (Xvfb) and session bus, driven through AT-SPI
/// by desktop_session.py against a fake agent on a temporary control socket: the Welcome
/// screen and its import through GTK's file chooser (the real agent's check, a fake pkexec that
/// writes down its arguments and input), the Details screen reading what the fake reports, the switch sending `down`, the
/// portal banner and its notification (through dunst), the tray item and its menu (through a fake
/// StatusNotifierWatcher). Screenshots of each screen are kept in
/// .build/desktop-screenshots/.
@Suite(.serialized) struct DesktopWindowTests {
    static let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    static let app = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().appendingPathComponent("roam-desktop")
    /// The agent, for the import's check.
    static let agent = app.deletingLastPathComponent().appendingPathComponent("agent")
    /// Debian's Python, which has python3-gi and the Atspi typelib (not a Python of the user's).
    static let python = "/usr/bin/python3"

    @Test func theWindowShowsWhatTheAgentReportsAndTheSwitchSendsDown() throws {
        guard FileManager.default.isExecutableFile(atPath: Self.python) else {
            print("skipped: \(Self.python) is missing (scripts/setup installs python3-gi)")
            return
        }
        guard FileManager.default.isExecutableFile(atPath: Self.app.path) else {
            Issue.record("roam-desktop was not built at \(Self.app.path)")
            return
        }
        let screenshots = Self.repository.appendingPathComponent(".build/desktop-screenshots")
        let process = Process()
        process.executableURL = URL(fileURLWithPath: Self.python)
        process.arguments = [Self.repository.appendingPathComponent("Tests/DesktopAppTests/desktop_session.py").path,
                             "--app", Self.app.path, "--agent", Self.agent.path, "--screenshots", screenshots.path]
        let output = Pipe()
        process.standardOutput = output
        process.standardError = output
        try process.run()
        // Bounded: the script takes seconds; a hang must not hold the suite.
        let deadline = Date().addingTimeInterval(120)
        while process.isRunning, Date() < deadline { Thread.sleep(forTimeInterval: 0.1) }
        if process.isRunning {
            kill(process.processIdentifier, SIGTERM)
            process.waitUntilExit()
            Issue.record("the desktop session did not finish within 120 s")
        }
        let said = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        print(said)
        switch process.terminationStatus {
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
            Issue.record("the desktop session failed (status \(process.terminationStatus)):\n\(said)")
        }
    }
}
