import Logging
import Basics

/// Turns a flapping interface into a few summary lines for the operator instead of a line per
/// flap: one when an interface starts flapping (its third loss within `window`), one per
/// `window` while it goes on, one when it has been quiet for a whole `window`. Pure: paths and
/// time in, lines out; the daemon wakes for `nextDue` only while something flaps.
struct FlapSummary {
    var window: Duration = .seconds(10)
    /// Losses within `window` that make an interface count as flapping.
    var threshold = 3

    struct Line: Equatable {
        var level: Logger.Level
        var message: String
        var fields: [(String, String)]
        static func == (a: Line, b: Line) -> Bool {
            a.level == b.level && a.message == b.message && a.fields.map(\.0) == b.fields.map(\.0)
                && a.fields.map(\.1) == b.fields.map(\.1)
        }
    }

    private struct Flapping {
        var since: Instant
        var lastLoss: Instant
        var total: Int
        var sinceReport: Int
    }

    private var present: Set<String> = []
    private var recentLosses: [String: [Instant]] = [:]
    private var flapping: [String: Flapping] = [:]
    private(set) var nextDue: Instant?

    /// The interfaces that carry a path now.
    mutating func paths(_ interfaces: Set<String>, now: Instant) -> [Line] {
        let lost = present.subtracting(interfaces)
        present = interfaces
        var lines: [Line] = []
        for name in lost.sorted() {
            if var state = flapping[name] {
                state.total += 1
                state.sinceReport += 1
                state.lastLoss = now
                flapping[name] = state
                continue
            }
            let recent = (recentLosses[name] ?? []).filter { now - $0 < window } + [now]
            recentLosses[name] = recent
            guard recent.count >= threshold else { continue }
            recentLosses[name] = nil
            flapping[name] = Flapping(since: recent[0], lastLoss: now, total: recent.count, sinceReport: 0)
            lines.append(Line(level: .warning, message: "interface flapping",
                              fields: [("interface", name), ("losses", "\(recent.count)"), ("in", (now - recent[0]).short),
                                       ("next_summary", "\(window.short)")]))
            if nextDue == nil { nextDue = now + window }
        }
        return lines
    }

    /// The summaries due at `now`.
    mutating func tick(now: Instant) -> [Line] {
        guard let due = nextDue, due <= now else { return [] }
        var lines: [Line] = []
        for name in flapping.keys.sorted() {
            guard let state = flapping[name] else { continue }
            if now - state.lastLoss >= window {
                lines.append(Line(level: .info, message: "interface stopped flapping",
                                  fields: [("interface", name), ("losses", "\(state.total)"),
                                           ("for", (state.lastLoss - state.since).short),
                                           ("up", present.contains(name) ? "yes" : "no")]))
                flapping[name] = nil
            } else {
                lines.append(Line(level: .warning, message: "interface still flapping",
                                  fields: [("interface", name), ("losses", "\(state.sinceReport)"), ("in", window.short),
                                           ("total", "\(state.total)"), ("for", (now - state.since).short)]))
                flapping[name]?.sinceReport = 0
            }
        }
        nextDue = flapping.isEmpty ? nil : now + window
        return lines
    }
}
