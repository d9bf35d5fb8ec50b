import Glibc
public import Logging
import Basics
import Reconnector
import Synchronization

/// The agent's swift-log handler: one line per event on standard error, logfmt for people and
/// grep or JSON for machines. Under systemd, whose journal reads standard error, each line
/// starts with its syslog priority (`<4>`), so `journalctl -p warning` shows warnings and errors.
///
/// Events that carry a `cause` in their metadata are per-packet faults (a receive that failed,
/// a datagram nobody could open): the first of each cause is written, later ones within
/// `LogLimiter.interval` are counted, and the next line of that cause says how many were not.
public struct OperatorLogHandler: LogHandler {
    public enum Format: String, Sendable, CaseIterable { case logfmt, json }

    public var metadata: Logger.Metadata = [:]
    public var metadataProvider: Logger.MetadataProvider?
    public var logLevel: Logger.Level
    let format: Format
    let journal: Bool
    let limiter: LogLimiter
    let clock: @Sendable () -> (wall: Duration, monotonic: Duration)
    let write: @Sendable (String) -> Void

    /// A handler writing to standard error (or to `write`); `journal` when standard error is the journal's stream.
    public init(format: Format, level: Logger.Level, journal: Bool = OperatorLogHandler.standardErrorIsJournal(),
                limiter: LogLimiter = LogLimiter(),
                clock: @escaping @Sendable () -> (wall: Duration, monotonic: Duration) = OperatorLogHandler.now,
                write: (@Sendable (String) -> Void)? = nil) {
        self.format = format
        self.logLevel = level
        self.journal = journal
        self.limiter = limiter
        self.clock = clock
        self.write = write ?? { writeStandardError($0) }
    }

    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    public func log(event: LogEvent) {
        var fields = metadata
        if let provided = metadataProvider?.get() { fields.merge(provided) { $1 } }
        if let extra = event.metadata { fields.merge(extra) { $1 } }
        if let error = event.error { fields["error"] = "\(error)" }
        let now = clock()
        if case .string(let cause) = fields["cause"] {
            switch limiter.admit(cause: event.source + "/" + cause, now: now.monotonic) {
            case .suppress: return
            case .write(let notWritten): if notWritten > 0 { fields["suppressed"] = .stringConvertible(notWritten) }
            }
        }
        write(line(level: event.level, message: "\(event.message)", fields: fields, at: now.wall))
    }

    /// One line: the journal's priority, then `ts`, `level`, `msg` and the fields in `LogFields.order`.
    func line(level: Logger.Level, message: String, fields: Logger.Metadata, at wall: Duration) -> String {
        let head: [(String, Logger.MetadataValue)] = [
            ("ts", .string(wall.seconds(decimals: 3))), ("level", .string(level.name)), ("msg", .string(message)),
        ]
        let all = head + LogFields.ordered(fields)
        return (journal ? "<\(level.syslogPriority)>" : "") + (format == .json ? LogFields.json(all) : LogFields.logfmt(all)) + "\n"
    }

    /// Whether standard error is the journal's stream: $JOURNAL_STREAM names it by device and
    /// inode, and a child that inherited the variable but writes elsewhere must not prefix.
    public static func standardErrorIsJournal() -> Bool {
        standardErrorIsJournal(getenv("JOURNAL_STREAM").map { String(cString: $0) })
    }

    static func standardErrorIsJournal(_ variable: String?) -> Bool {
        guard let parts = variable?.split(separator: ":"), parts.count == 2,
              let device = UInt64(parts[0]), let inode = UInt64(parts[1]) else { return false }
        var info = stat()
        guard fstat(2, &info) == 0 else { return false }
        return UInt64(info.st_dev) == device && UInt64(info.st_ino) == inode
    }

    /// The wall clock for `ts`, and the monotonic clock for rate limits.
    @Sendable public static func now() -> (wall: Duration, monotonic: Duration) {
        var wall = timespec()
        var monotonic = timespec()
        clock_gettime(CLOCK_REALTIME, &wall)
        clock_gettime(CLOCK_MONOTONIC, &monotonic)
        return (.seconds(wall.tv_sec) + .nanoseconds(wall.tv_nsec), .seconds(monotonic.tv_sec) + .nanoseconds(monotonic.tv_nsec))
    }
}

extension Logger.Level {
    /// The syslog priority the journal files a line under.
    public var syslogPriority: Int {
        switch self {
        case .trace, .debug: 7
        case .info: 6
        case .notice: 5
        case .warning: 4
        case .error: 3
        case .critical: 2
        }
    }

    /// The level's name in a log line and in `--log-level`.
    public var name: String { rawValue }

    /// The levels `--log-level` takes, most severe first.
    public static let operatorLevels: [Logger.Level] = [.error, .warning, .notice, .info, .debug]
}

/// Keeps repeated per-packet faults to one line per cause per interval.
public final class LogLimiter: Sendable {
    public enum Verdict: Equatable, Sendable {
        /// Write the line, saying how many of its cause were not written before it.
        case write(notWritten: Int)
        case suppress
    }

    public let interval: Duration
    /// How many causes are remembered; causes are a fixed set in code, so this is never reached
    /// unless a cause is built from input, and then the oldest are forgotten.
    static let capacity = 256
    private let state = Mutex<[String: (written: Duration, notWritten: Int)]>([:])

    public init(interval: Duration = .seconds(10)) { self.interval = interval }

    public func admit(cause: String, now: Duration) -> Verdict {
        state.withLock { causes in
            if let last = causes[cause], now - last.written < interval {
                causes[cause]!.notWritten += 1
                return .suppress
            }
            let notWritten = causes[cause]?.notWritten ?? 0
            if causes[cause] == nil, causes.count >= Self.capacity {
                causes = causes.filter { now - $0.value.written < interval }
                if causes.count >= Self.capacity { causes.removeAll() }
            }
            causes[cause] = (now, 0)
            return .write(notWritten: notWritten)
        }
    }
}

/// The fields of a line in one order for every line, whatever order the caller's dictionary
/// has: a transition's fields first, as `Transition.fields` lists them, then the rest by name.
enum LogFields {
    static let order = ["from", "to", "trigger", "reason", "path", "candidate", "server", "attempt", "next_retry", "coalesced"]

    static func ordered(_ metadata: Logger.Metadata) -> [(String, Logger.MetadataValue)] {
        let rank = { (key: String) in order.firstIndex(of: key) ?? order.count }
        return metadata.sorted { (rank($0.key), $0.key) < (rank($1.key), $1.key) }.map { ($0.key, $0.value) }
    }

    static func logfmt(_ fields: [(String, Logger.MetadataValue)]) -> String {
        LogLine.logfmt(fields.map { ($0.0, "\($0.1)") })
    }

    /// The time and the integers and decimals given as numbers are JSON numbers; everything
    /// else is a string.
    static func json(_ fields: [(String, Logger.MetadataValue)]) -> String {
        var numbers: Set<String> = ["ts"]
        for (key, value) in fields {
            if case .stringConvertible(let number) = value, number is any BinaryInteger || number is Double {
                numbers.insert(key)
            }
        }
        return LogLine.json(fields.map { ($0.0, "\($0.1)") }, numbers: numbers)
    }
}
