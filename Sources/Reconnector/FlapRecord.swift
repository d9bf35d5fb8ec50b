import Basics

/// Recent losses of each interface's path, for flap damping: how many in a row, each within
/// `window` of the one before, and when the first and the last were. Kept by `Reconnector`;
/// `window` is its configuration's `flapWindow` and `stableAfter` its `flapStableAfter`, given
/// with each question (a reload may change them).
struct FlapRecord: Sendable {
    /// An interface's losses in a row.
    struct Losses: Equatable, Sendable {
        var count: Int
        var first: Instant
        var last: Instant
    }

    private(set) var losses: [String: Losses] = [:]

    /// The path on `interface` went away: a loss within `window` of the last one adds to the
    /// run, a later one starts a new run.
    mutating func noteLoss(of interface: String, _ now: Instant, window: Duration) {
        if let previous = recent(interface, now, window: window) {
            losses[interface] = Losses(count: previous.count + 1, first: previous.first, last: now)
        } else {
            losses[interface] = Losses(count: 1, first: now, last: now)
        }
    }

    /// The interface's run of losses, while its last is within `window`.
    func recent(_ interface: String, _ now: Instant, window: Duration) -> Losses? {
        losses[interface].flatMap { now - $0.last < window ? $0 : nil }
    }

    /// A link that lost its path three times or more in a row, each within `window` of the one
    /// before, and stayed up less than `stableAfter` between them on average: a loose cable, not
    /// an access point handing the laptop on every so often.
    func isFlapping(_ interface: String, _ now: Instant, window: Duration, stableAfter: Duration) -> Bool {
        guard let loss = recent(interface, now, window: window), loss.count >= 3 else { return false }
        return loss.last - loss.first < stableAfter * (loss.count - 1)
    }

    /// The interface's losses when it counts as flapping now (`isFlapping`): how many, since when.
    func flapping(_ interface: String, _ now: Instant, window: Duration,
                  stableAfter: Duration) -> (losses: Int, since: Instant)? {
        guard isFlapping(interface, now, window: window, stableAfter: stableAfter),
              let loss = losses[interface] else { return nil }
        return (loss.count, loss.first)
    }

    /// The clock stepped: what is remembered moves with it.
    mutating func shift(by step: Duration) {
        losses = losses.mapValues { Losses(count: $0.count, first: $0.first + step, last: $0.last + step) }
    }
}
