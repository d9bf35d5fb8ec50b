import Foundation

/// desktop_session.py, run by Debian's Python against the built roam-desktop and agent: the
/// tests' one way to start the app under Xvfb and drive it through AT-SPI.
enum DesktopSession {
    static let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    static let app = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().appendingPathComponent("roam-desktop")
    /// The agent: the import's check, and the real agent's `status`.
    static let agent = app.deletingLastPathComponent().appendingPathComponent("agent")
    /// Debian's Python, which has python3-gi and the Atspi typelib (not a Python of the user's).
    static let python = "/usr/bin/python3"
    static let screenshots = repository.appendingPathComponent(".build/desktop-screenshots")

    /// How a session ended: the script's exit status (0 passed, 1 failed, 77 skipped) and all it said.
    struct Outcome {
        var status: Int32
        var said: String
    }

    /// Why the session cannot run here, or nil when it can (the script itself skips, with its
    /// reason, for the tools it needs besides Python and Xvfb).
    static var missing: String? {
        if !FileManager.default.isExecutableFile(atPath: python) { return "\(python) is missing (scripts/setup installs python3-gi)" }
        let path = ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"
        if !path.split(separator: ":").contains(where: { FileManager.default.isExecutableFile(atPath: "\($0)/Xvfb") }) {
            return "Xvfb is not installed (scripts/setup installs it)"
        }
        return nil
    }

    /// Runs the script with `arguments` besides the app, the agent and the screenshots' folder,
    /// ending it (SIGTERM: it ends what it started) when it takes longer than `seconds`.
    static func run(_ arguments: [String] = [], seconds: Double) throws -> Outcome {
        guard FileManager.default.isExecutableFile(atPath: app.path) else { throw NotBuilt(path: app.path) }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: python)
        process.arguments = [repository.appendingPathComponent("Tests/DesktopAppTests/desktop_session.py").path,
                             "--app", app.path, "--agent", agent.path, "--screenshots", screenshots.path] + arguments
        let output = Pipe()
        process.standardOutput = output
        process.standardError = output
        // Read as it comes, so a talkative session never blocks on a full pipe.
        let collected = Collected()
        let handle = output.fileHandleForReading
        let reader = Thread { collected.data = handle.readDataToEndOfFile(); collected.done.signal() }
        try process.run()
        reader.start()
        let deadline = Date().addingTimeInterval(seconds)
        while process.isRunning, Date() < deadline { Thread.sleep(forTimeInterval: 0.1) }
        var late = ""
        if process.isRunning {
            kill(process.processIdentifier, SIGTERM)
            let grace = Date().addingTimeInterval(20)
            while process.isRunning, Date() < grace { Thread.sleep(forTimeInterval: 0.1) }
            if process.isRunning { kill(process.processIdentifier, SIGKILL) }
            late = "\nthe desktop session did not finish within \(Int(seconds)) s"
        }
        process.waitUntilExit()
        // Whatever the script left running holds the pipe open: its output is taken as it is then.
        _ = collected.done.wait(timeout: .now() + 5)
        return Outcome(status: late.isEmpty ? process.terminationStatus : 1,
                       said: String(decoding: collected.data, as: UTF8.self) + late)
    }

    struct NotBuilt: Error, CustomStringConvertible {
        var path: String
        var description: String { "roam-desktop was not built at \(path)" }
    }

    private final class Collected: @unchecked Sendable {
        var data = Data()
        let done = DispatchSemaphore(value: 0)
    }
}
