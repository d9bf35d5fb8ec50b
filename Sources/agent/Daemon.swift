import ArgumentParser
import Glibc
import Logging
import Observability
import Basics
import Reconnector
import Device
import Tunnel

/// The wall-clock time `ago` before now, as RFC 3339 UTC to the second (`2026-11-22T19:04:01Z`).
func wallClock(ago: Duration) -> String {
    var ts = timespec()
    clock_gettime(CLOCK_REALTIME, &ts)
    return utcText(Int64(ts.tv_sec) - ago.components.seconds, "%Y-%m-%dT%H:%M:%SZ")
}

/// What the daemons share: a configuration file and the log format.
struct DaemonOptions: ParsableArguments {
    @Option(help: "The configuration file.")
    var config: String?

    @Option(help: "Log format: logfmt or json.")
    var logFormat: String = "logfmt"

    @Option(help: "The least severe lines logged: error, warning, notice, info or debug.")
    var logLevel: String = "info"

    func validate() throws {
        guard OperatorLogHandler.Format(rawValue: logFormat) != nil else { throw ValidationError("'--log-format' is logfmt or json") }
        guard let level = Logger.Level(rawValue: logLevel), Logger.Level.operatorLevels.contains(level) else {
            throw ValidationError("'--log-level' is error, warning, notice, info or debug")
        }
    }

    /// The operator log: one line per event on standard error, in the format and from the level asked for.
    var log: Logger {
        let handler = OperatorLogHandler(format: OperatorLogHandler.Format(rawValue: logFormat) ?? .logfmt,
                                         level: Logger.Level(rawValue: logLevel) ?? .info)
        return Logger(label: "roam") { _ in handler }
    }

    /// The configuration file, which `command` cannot run without.
    func configFile(for command: String) throws -> String {
        guard let config else { throw ValidationError("'agent \(command)' needs --config FILE") }
        return config
    }
}

/// Blocks `signals` in this thread and in every thread it starts from now on: call it before
/// the process starts any (a thread that does not block them may take one, and SIGTSTP would
/// stop the whole process), and `forwardSignals` once there is somewhere to send them. A
/// signal that comes in between waits for it.
func blockSignals(_ signals: [Int32]) {
    var set = signalSet(signals)
    pthread_sigmask(SIG_BLOCK, &set, nil)
}

private func signalSet(_ signals: [Int32]) -> sigset_t {
    var set = sigset_t()
    sigemptyset(&set)
    for signal in signals { sigaddset(&set, signal) }
    return set
}

/// Delivers `signals` to `handler` on a thread of its own, for as long as the process runs.
/// The signals are blocked in every thread first (see `blockSignals`), so none of the
/// data-plane threads is interrupted, and SIGTSTP no longer stops the process.
func forwardSignals(_ signals: [Int32], to handler: @escaping @Sendable (Int32) -> Void) throws {
    // A peer that hangs up is an error on that one write, never the end of a daemon.
    signal(SIGPIPE, SIG_IGN)
    blockSignals(signals)
    var set = signalSet(signals)
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
