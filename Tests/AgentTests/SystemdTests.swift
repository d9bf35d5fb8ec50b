import Foundation
import Glibc
import NamespaceLab
import Testing
@testable import agent
import Basics
import SystemDNS

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

/// `systemctl stop` is the operator's stop; a restart (`systemctl restart`, `try-restart`, a
/// package's upgrade), a shutdown, or anything systemd does not say, is not.
@Test(arguments: [
    ("stop", "running", true), ("stop", "degraded", true),
    ("restart", "running", false), ("try-restart", "running", false), ("stop", "stopping", false),
    (nil, "running", false), ("stop", nil, false),
] as [(String?, String?, Bool)])
func onlySystemctlStopOpensTheMachine(_ job: String?, _ state: String?, _ opens: Bool) {
    let (decided, why) = UnitStop.opensMachine(job: job, systemState: state)
    #expect(decided == opens, "\(why)")
}

/// systemd's answers as the bus carries them: a unit's `Job` property, a variant holding a
/// struct of the job's number and path, and `JobType`, a variant holding a string.
@Test func systemdsJobIsReadFromItsVariants() throws {
    var job = DBusWriter()
    job.signature("(uo)")
    job.structure()
    job.uint32(42)
    job.string("/org/freedesktop/systemd1/job/42")
    let read = try DBusVariant(job.bytes)
    #expect(read.numberAndPath?.0 == 42 && read.numberAndPath?.1 == "/org/freedesktop/systemd1/job/42")
    #expect(read.string == nil, "a struct is not a string")

    var type = DBusWriter()
    type.signature("s")
    type.string("restart")
    #expect(try DBusVariant(type.bytes).string == "restart")
    #expect(try DBusVariant(type.bytes).numberAndPath == nil)
    // Cut short: an error, not a crash or a made-up value.
    #expect(throws: DBusError.self) { try DBusVariant(Array(type.bytes.prefix(1))) }
    #expect(try DBusVariant(Array(type.bytes.prefix(6))).string == nil)
}

/// A start that is still trying asks systemd for more time when the core says (`Heartbeats`: until
/// ready), so a unit's start time-out does not cut it off; the watchdog's pings are said as they come.
@Test func aStartStillTryingAsksForMoreTime() throws {
    let socket = try NotifySocket()
    var reporter = ServiceReporter(systemd: SystemdNotifier(socketPath: socket.path))
    reporter.extendStart(by: .seconds(30))
    #expect(socket.next() == "EXTEND_TIMEOUT_USEC=30000000")
    #expect(reporter.stopSkipsExecStop, "a stop before READY=1 comes as SIGTERM alone: the agent asks systemd itself")
    reporter.ready()
    #expect(!reporter.stopSkipsExecStop, "once running, systemd's stop runs ExecStop")
    #expect(!ServiceReporter(systemd: SystemdNotifier(socketPath: nil)).stopSkipsExecStop, "outside systemd a signal is a signal")
    #expect(socket.next() == "READY=1")
    reporter.pingWatchdog()
    #expect(socket.next() == "WATCHDOG=1")
}

/// A datagram socket standing for systemd's notify socket.
private final class NotifySocket {
    let path = FileManager.default.temporaryDirectory.appendingPathComponent("roam-notify-\(getpid())-\(UUID().uuidString.prefix(6))").path
    private let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue), 0)

    init() throws {
        var sa = sockaddr_un()
        sa.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &sa.sun_path) { raw in for (i, b) in path.utf8.enumerated() { raw[i] = b } }
        let bound = withUnsafePointer(to: &sa) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) } }
        try #require(bound == 0)
        var timeout = timeval(tv_sec: 0, tv_usec: 300_000)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
    }

    deinit {
        close(fd)
        unlink(path)
    }

    /// The next message, or nil when none came within 300 ms.
    func next() -> String? {
        var buffer = [UInt8](repeating: 0, count: 256)
        let n = recv(fd, &buffer, buffer.count, 0)
        return n > 0 ? String(decoding: buffer[0..<n], as: UTF8.self) : nil
    }
}
