import ArgumentParser
import Dispatch
import Foundation
import Glibc
import Reconnector

/// Operator log lines on standard error: logfmt by default, JSON on request.
struct OperatorLog: Sendable {
    var json: Bool

    func callAsFunction(_ level: String, _ message: String, _ fields: KeyValuePairs<String, String> = [:]) {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        let all = [("ts", String(format: "%ld.%03ld", ts.tv_sec, ts.tv_nsec / 1_000_000)), ("level", level), ("msg", message)]
            + fields.map { ($0.key, $0.value) }
        let line = (json ? LogLine.json(all, numbers: ["ts"]) : LogLine.logfmt(all)) + "\n"
        FileHandle.standardError.write(Data(line.utf8))
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

/// Waits for SIGINT or SIGTERM on a thread of its own and runs `stop` once. The signals are
/// blocked in every thread first, so none of the data-plane threads is interrupted by them.
func onTerminationSignal(_ stop: @escaping @Sendable (Int32) -> Void) {
    var set = sigset_t()
    sigemptyset(&set)
    sigaddset(&set, SIGINT)
    sigaddset(&set, SIGTERM)
    pthread_sigmask(SIG_BLOCK, &set, nil)
    let waitFor = set
    Thread.detachNewThread {
        var set = waitFor
        var signal: Int32 = 0
        sigwait(&set, &signal)
        stop(signal)
    }
}
