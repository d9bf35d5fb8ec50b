import PathMonitor

/// One log line per cause per interval, however often the cause happens: a flood of refused
/// handshakes must not become a flood of log lines. The line after a quiet spell says how many
/// were left out.
struct LogThrottle<Cause: Hashable> {
    let interval: Duration
    private var lastLogged: [Cause: Instant] = [:]
    private var leftOut: [Cause: Int] = [:]

    init(interval: Duration) { self.interval = interval }

    /// The line to log for one more `cause` now, or nil when one was logged within the interval.
    mutating func line(for cause: Cause, now: Instant, _ text: () -> String) -> String? {
        if let last = lastLogged[cause], now - last < interval {
            leftOut[cause, default: 0] += 1
            return nil
        }
        lastLogged[cause] = now
        let skipped = leftOut.removeValue(forKey: cause) ?? 0
        return skipped == 0 ? text() : text() + " (and \(skipped) more like it in the last \(interval.short))"
    }
}
