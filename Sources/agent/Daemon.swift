import ArgumentParser
import Glibc
import PathMonitor
import Reconnector
import Tunnel

/// Operator log lines on standard error: logfmt by default, JSON on request.
struct OperatorLog: Sendable {
    var json: Bool

    func callAsFunction(_ level: String, _ message: String, _ fields: KeyValuePairs<String, String> = [:]) {
        self(level, message, fields.map { ($0.key, $0.value) })
    }

    func callAsFunction(_ level: String, _ message: String, _ fields: [(String, String)]) {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        let now = Duration.seconds(ts.tv_sec) + .nanoseconds(ts.tv_nsec)
        let all = [("ts", now.seconds(decimals: 3)), ("level", level), ("msg", message)]
            + fields
        let line = (json ? LogLine.json(all, numbers: ["ts"]) : LogLine.logfmt(all)) + "\n"
        writeStandardError(line)
    }
}

/// What the daemons share: a configuration file and the log format.
struct DaemonOptions: ParsableArguments {
    @Option(help: "The configuration file.")
    var config: String

    @Option(help: "Log format: logfmt or json.")
    var logFormat: String = "logfmt"

    func validate() throws {
        guard ["logfmt", "json"].contains(logFormat) else { throw ValidationError("'--log-format' is logfmt or json") }
    }

    var log: OperatorLog { OperatorLog(json: logFormat == "json") }
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
