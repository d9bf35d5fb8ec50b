import Foundation
import Glibc
import NamespaceLab
import Testing
@testable import agent

@Test func notificationsReachTheNotifySocket() throws {
    let path = FileManager.default.temporaryDirectory.appendingPathComponent("roam-notify-\(getpid())").path
    unlink(path)
    let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue), 0)
    defer {
        close(fd)
        unlink(path)
    }
    var sa = sockaddr_un()
    sa.sun_family = sa_family_t(AF_UNIX)
    withUnsafeMutableBytes(of: &sa.sun_path) { raw in for (i, b) in path.utf8.enumerated() { raw[i] = b } }
    let bound = withUnsafePointer(to: &sa) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) } }
    try #require(bound == 0)
    var timeout = timeval(tv_sec: 2, tv_usec: 0)
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))

    let notifier = SystemdNotifier(socketPath: path)
    #expect(notifier.isActive)
    notifier.notify("READY=1")
    var buffer = [UInt8](repeating: 0, count: 256)
    let n = recv(fd, &buffer, buffer.count, 0)
    #expect(n > 0 && String(decoding: buffer[0..<n], as: UTF8.self) == "READY=1")
    #expect(!SystemdNotifier(socketPath: nil).isActive, "outside systemd nothing is sent")
}

@Test func watchdogPingsAtHalfTheUnitsInterval() {
    #expect(SystemdNotifier.watchdogInterval(usec: "30000000", pid: nil) == .seconds(15))
    #expect(SystemdNotifier.watchdogInterval(usec: "30000000", pid: "\(getpid())") == .seconds(15))
    #expect(SystemdNotifier.watchdogInterval(usec: "30000000", pid: "1") == nil, "meant for another process")
    #expect(SystemdNotifier.watchdogInterval(usec: nil, pid: nil) == nil, "no WatchdogSec: no wake-ups for it")
    #expect(SystemdNotifier.watchdogInterval(usec: "soon", pid: nil) == nil)
}

/// A failure at start-up, written by the built agent to a standard error that is the journal's
/// stream, carries the error priority, so `journalctl -p err` shows it; elsewhere it has none.
@Test func aStartUpFailureCarriesTheErrorPriorityInTheJournal() throws {
    let path = FileManager.default.temporaryDirectory.appendingPathComponent("roam-journal-\(getpid())").path
    _ = FileManager.default.createFile(atPath: path, contents: nil)
    defer { unlink(path) }
    var info = stat()
    try #require(stat(path, &info) == 0)
    for journal in [true, false] {
        let process = Process()
        process.executableURL = RoamingLab.builtAgent
        process.arguments = ["up", "--config", "/nonexistent/roam.yaml"]
        process.environment = journal ? ["JOURNAL_STREAM": "\(info.st_dev):\(info.st_ino)"] : [:]
        let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: path))
        try handle.truncate(atOffset: 0)
        process.standardError = handle
        try process.run()
        process.waitUntilExit()
        try handle.close()
        let text = try String(contentsOfFile: path, encoding: .utf8)
        #expect(process.terminationStatus == 2)
        #expect(text.hasPrefix(journal ? "<3>agent: /nonexistent/roam.yaml" : "agent: /nonexistent/roam.yaml"), "\(text)")
    }
}

@Test func anUnknownLogLevelIsRefused() throws {
    let quiet = try NamespaceLab.capture(RoamingLab.builtAgent, ["up", "--config", "x.yaml", "--log-level", "loud"])
    #expect(quiet.status == 64 && quiet.output.contains("'--log-level' is error, warning, notice, info or debug"), "\(quiet.output)")
}

/// The service's stop path removes the lockdown only after an operator's stop; after a crash
/// or a give-up, systemd starts the agent again and the machine stays closed.
@Test func theStopPathKeepsTheLockdownAfterACrash() throws {
    // In a namespace of its own, so no firewall of this machine is touched.
    let lab = NamespaceLab.isRoot ? try NamespaceLab() : nil
    for (result, removes) in [("signal", false), ("exit-code", false), ("core-dump", false), ("watchdog", false),
                              ("success", true), ("timeout", true)] {
        let agent = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().appendingPathComponent("agent")
        let process = Process()
        process.executableURL = lab == nil ? agent : NamespaceLab.ipTool
        process.arguments = (lab.map { ["netns", "exec", $0.name, agent.path] } ?? []) + ["lockdown", "off", "--after-stop"]
        process.environment = ["SERVICE_RESULT": result]
        let output = Pipe()
        process.standardError = output
        process.standardOutput = output
        try process.run()
        process.waitUntilExit()
        let text = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        #expect(text.contains("lockdown kept") == !removes, "\(result): \(text)")
    }
}
