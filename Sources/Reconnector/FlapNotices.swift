import Basics

/// What the operator reads of a flapping interface, instead of a line per flap: one when the
/// core's flap damping counts it as flapping (`Reconnector.flapping`: the same rule that holds
/// its returns back), one per `window` while it goes on, one when it has been quiet for a whole
/// `window`. Pure: the interfaces that carry a path and the time in, notices out; its due time
/// is one of the core's timers (`TimerKind.flapSummary`).
struct FlapNotices: Sendable {
    var window: Duration

    private struct Flapping: Sendable {
        var since: Instant
        var lastLoss: Instant
        var total: Int
        var sinceReport: Int
    }

    private var present: Set<String> = []
    private var flapping: [String: Flapping] = [:]
    private(set) var nextDue: Instant?

    init(window: Duration) { self.window = window }

    /// The interfaces that carry a path now; `isFlapping` says, for one that just lost its
    /// path, whether the damping counts it as flapping, with its losses and since when.
    mutating func paths(_ interfaces: Set<String>, now: Instant,
                        isFlapping: (String) -> (losses: Int, since: Instant)?) -> [Notice] {
        let lost = present.subtracting(interfaces)
        present = interfaces
        var out: [Notice] = []
        for name in lost.sorted() {
            if var state = flapping[name] {
                state.total += 1
                state.sinceReport += 1
                state.lastLoss = now
                flapping[name] = state
                continue
            }
            guard let (losses, since) = isFlapping(name) else { continue }
            flapping[name] = Flapping(since: since, lastLoss: now, total: losses, sinceReport: 0)
            out.append(.flapping(interface: name, losses: losses, over: now - since, nextSummary: window))
            if nextDue == nil { nextDue = now + window }
        }
        return out
    }

    /// The summaries due at `now`.
    mutating func tick(now: Instant) -> [Notice] {
        guard let due = nextDue, due <= now else { return [] }
        var out: [Notice] = []
        for name in flapping.keys.sorted() {
            guard let state = flapping[name] else { continue }
            if now - state.lastLoss >= window {
                out.append(.stoppedFlapping(interface: name, losses: state.total, over: state.lastLoss - state.since,
                                            up: present.contains(name)))
                flapping[name] = nil
            } else {
                out.append(.stillFlapping(interface: name, losses: state.sinceReport, within: window, total: state.total,
                                          over: now - state.since))
                flapping[name]?.sinceReport = 0
            }
        }
        nextDue = flapping.isEmpty ? nil : now + window
        return out
    }
}
