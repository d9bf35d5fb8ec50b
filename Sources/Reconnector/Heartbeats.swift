import Basics

/// What the agent tells those who watch it, each on a clock of its own: the service manager's
/// watchdog, pinged at half the unit's interval, so an agent whose deciding loop hangs is
/// restarted; a start still trying, which asks the service manager for more time until the agent
/// is ready, so a unit's start time-out does not cut off a start behind a dead server while the
/// loop runs (one whose loop hangs times out within `startExtension`); and the metrics file,
/// written on each transition and again every `metricsRefresh` while connected, when its counters
/// move without one (idle and not connected, nothing wakes for it).
///
/// Pure: each is one of the core's timers (`TimerKind.watchdog`, `.extendStart`, `.metrics`), and
/// what is sent or written is an effect the runner carries out.
public struct Heartbeats: Equatable, Sendable {
    /// How often the watchdog is pinged (half the unit's `WatchdogSec`); nil: the unit asks for none.
    public let watchdog: Duration?
    /// The service manager waits for the agent to say it is ready (`Type=notify`).
    public let extendsStart: Bool
    /// The metrics file, when one is written.
    public private(set) var metricsFile: String?

    public static let metricsRefresh: Duration = .seconds(60)
    public static let extendEvery: Duration = .seconds(10)
    public static let startExtension: Duration = .seconds(30)

    private var pingAt: Instant?
    private var extendAt: Instant?
    private var metricsAt: Instant?
    private var started = false

    public init(watchdog: Duration? = nil, extendsStart: Bool = false, metricsFile: String? = nil) {
        self.watchdog = watchdog
        self.extendsStart = extendsStart
        self.metricsFile = metricsFile
    }

    /// The timers kept, by kind.
    var timers: [TimerKind: Instant] {
        var all: [TimerKind: Instant] = [:]
        all[.watchdog] = pingAt
        all[.extendStart] = extendAt
        all[.metrics] = metricsAt
        return all
    }

    var nextDeadline: Instant? { [pingAt, extendAt, metricsAt].compactMap { $0 }.min() }

    /// After each event the core handled, with what it decided in `out`: at the first, the
    /// watchdog's clock starts and a start not yet ready asks for time; once ready, it asks no
    /// more; a transition writes the metrics, again after `metricsRefresh` while `connected`.
    mutating func settle(_ out: inout [Effect], ready: Bool, connected: Bool, now: Instant) {
        if !started {
            started = true
            pingAt = watchdog.map { now + $0 }
            if extendsStart, !ready { extendStart(now, &out) }
        }
        if ready { extendAt = nil }
        if out.contains(where: { if case .transition = $0 { true } else { false } }) { writeMetrics(connected: connected, now, &out) }
    }

    /// One of its timers is due.
    mutating func timerFired(_ kind: TimerKind, connected: Bool, now: Instant, _ out: inout [Effect]) {
        switch kind {
        case .watchdog:
            guard let due = pingAt, due <= now, let watchdog else { return }
            pingAt = now + watchdog
            out.append(.pingWatchdog)
        case .extendStart:
            guard let due = extendAt, due <= now else { return }
            extendStart(now, &out)
        case .metrics:
            guard let due = metricsAt, due <= now else { return }
            writeMetrics(connected: connected, now, &out)
        default: break
        }
    }

    /// A reload names `file` for the metrics (nil: none): another file is written at once.
    mutating func metricsFile(_ file: String?, connected: Bool, now: Instant, _ out: inout [Effect]) {
        guard file != metricsFile else { return }
        metricsFile = file
        if file == nil { metricsAt = nil } else { writeMetrics(connected: connected, now, &out) }
    }

    private mutating func extendStart(_ now: Instant, _ out: inout [Effect]) {
        extendAt = now + Self.extendEvery
        out.append(.extendStart(by: Self.startExtension))
    }

    private mutating func writeMetrics(connected: Bool, _ now: Instant, _ out: inout [Effect]) {
        guard metricsFile != nil else { return }
        out.append(.writeMetrics)
        metricsAt = connected ? now + Self.metricsRefresh : nil
    }
}
