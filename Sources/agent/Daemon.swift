import ArgumentParser
import Glibc
import PathMonitor
import Reconnector
import Tunnel

/// Operator log lines on standard error: logfmt by default, JSON on request. Under systemd,
/// whose journal reads standard error ($JOURNAL_STREAM is set), each line starts with its
/// syslog priority (`<4>`), so `journalctl -p warning` shows warnings and errors only.
struct OperatorLog: Sendable {
    var json: Bool
    var journal = OperatorLog.standardErrorIsJournal()
    /// Lines less severe than this (a syslog priority: 3 error ... 7 debug) are not written.
    var threshold = 6

    /// Whether a line of `level` is written at this threshold.
    func writes(_ level: String) -> Bool { Self.priority(level) <= threshold }

    /// The levels `--log-level` takes, most severe first.
    static let levels = ["error", "warning", "info", "debug"]

    /// Whether standard error is the journal's stream: $JOURNAL_STREAM names it by device and
    /// inode, and a child that inherited the variable but writes elsewhere must not prefix.
    static func standardErrorIsJournal(_ variable: String? = environment("JOURNAL_STREAM")) -> Bool {
        guard let parts = variable?.split(separator: ":"), parts.count == 2,
              let device = UInt64(parts[0]), let inode = UInt64(parts[1]) else { return false }
        var info = stat()
        guard fstat(2, &info) == 0 else { return false }
        return UInt64(info.st_dev) == device && UInt64(info.st_ino) == inode
    }

    /// The syslog priority of a level: error 3, warning 4, info 6, debug 7.
    static func priority(_ level: String) -> Int {
        switch level {
        case "error": 3
        case "warning": 4
        case "debug": 7
        default: 6
        }
    }

    func callAsFunction(_ level: String, _ message: String, _ fields: KeyValuePairs<String, String> = [:]) {
        self(level, message, fields.map { ($0.key, $0.value) })
    }

    func callAsFunction(_ level: String, _ message: String, _ fields: [(String, String)]) {
        guard writes(level) else { return }
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        let now = Duration.seconds(ts.tv_sec) + .nanoseconds(ts.tv_nsec)
        let all = [("ts", now.seconds(decimals: 3)), ("level", level), ("msg", message)]
            + fields
        writeStandardError(line(all, level: level))
    }

    /// One line: the priority prefix for the journal, then logfmt or JSON.
    func line(_ fields: [(String, String)], level: String) -> String {
        (journal ? "<\(Self.priority(level))>" : "")
            + (json ? LogLine.json(fields, numbers: ["ts", "attempt", "coalesced"]) : LogLine.logfmt(fields)) + "\n"
    }
}

/// The wall-clock time `ago` before now, as RFC 3339 UTC to the second (`2026-11-22T19:04:01Z`).
func wallClock(ago: Duration) -> String {
    var ts = timespec()
    clock_gettime(CLOCK_REALTIME, &ts)
    var seconds = time_t(ts.tv_sec - Int(ago.components.seconds))
    var parts = tm()
    gmtime_r(&seconds, &parts)
    var buffer = [CChar](repeating: 0, count: 32)
    let length = strftime(&buffer, buffer.count, "%Y-%m-%dT%H:%M:%SZ", &parts)
    return String(decoding: buffer[0..<length].map { UInt8(bitPattern: $0) }, as: UTF8.self)
}

/// What the daemons share: a configuration file and the log format.
struct DaemonOptions: ParsableArguments {
    @Option(help: "The configuration file.")
    var config: String?

    @Option(help: "Log format: logfmt or json.")
    var logFormat: String = "logfmt"

    @Option(help: "The least severe lines logged: error, warning, info or debug.")
    var logLevel: String = "info"

    func validate() throws {
        guard ["logfmt", "json"].contains(logFormat) else { throw ValidationError("'--log-format' is logfmt or json") }
        guard OperatorLog.levels.contains(logLevel) else { throw ValidationError("'--log-level' is error, warning, info or debug") }
    }

    var log: OperatorLog {
        var log = OperatorLog(json: logFormat == "json")
        log.threshold = OperatorLog.priority(logLevel)
        return log
    }

    /// The configuration file, which `command` cannot run without.
    func configFile(for command: String) throws -> String {
        guard let config else { throw ValidationError("'agent \(command)' needs --config FILE") }
        return config
    }
}

/// Delivers `signals` to `handler` on a thread of its own, for as long as the process runs.
/// The signals are blocked in every thread first (call this before starting any), so none of
/// the data-plane threads is interrupted, and SIGTSTP no longer stops the process.
func forwardSignals(_ signals: [Int32], to handler: @escaping @Sendable (Int32) -> Void) throws {
    // A peer that hangs up is an error on that one write, never the end of a daemon.
    signal(SIGPIPE, SIG_IGN)
    var set = sigset_t()
    sigemptyset(&set)
    for signal in signals { sigaddset(&set, signal) }
    pthread_sigmask(SIG_BLOCK, &set, nil)
    let waitFor = set
    do {
        try OSThread.detach {
            var set = waitFor
            while true {
                var signal: Int32 = 0
                guard sigwait(&set, &signal) == 0 else { continue }
                handler(signal)
            }
        }
    } catch {
        pthread_sigmask(SIG_UNBLOCK, &set, nil)
        throw AgentError("cannot start the signal thread: \(error)")
    }
}
