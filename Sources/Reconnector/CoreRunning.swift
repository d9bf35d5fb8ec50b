package import Basics

/// A runner of the core: what carries `AgentCore`'s effects out, on the machine (the daemon) or
/// on a simulated world (the replay). Both drive the core the same way, through `feed(_:)` and
/// `fireDueTimers(at:)`; each supplies only how an effect is carried out and what it does
/// around each event.
package protocol CoreRunning {
    /// The core this runner drives.
    var core: AgentCore { get set }
    /// The time on the core's clock now.
    var coreNow: Instant { get }
    /// Whether events are still fed: a runner that is stopping feeds nothing more.
    var running: Bool { get }
    /// Carries one effect out; returns what it produced at once (the lockdown's answer, the
    /// device made, a bind refused, a fact read), which is fed after the event's other effects.
    mutating func perform(_ effect: Effect) -> [AgentEvent]
    /// Before the core handles `event`.
    mutating func willHandle(_ event: AgentEvent)
    /// After the core handled `event` and every one of its `effects` was carried out.
    mutating func handled(_ event: AgentEvent, effects: [Effect])
    /// The effects kept producing events past `AgentCore.roundsPerFeed`: `dropped` are not fed.
    mutating func ranAway(dropping dropped: [AgentEvent])
}

extension CoreRunning {
    package var running: Bool { true }
    package mutating func willHandle(_ event: AgentEvent) {}
    package mutating func handled(_ event: AgentEvent, effects: [Effect]) {}
    package mutating func ranAway(dropping dropped: [AgentEvent]) {}
}

extension CoreRunning {
    /// Feeds `event` to the core at `coreNow` and carries its effects out in order; what they
    /// produced at once is fed after them, in order, then what that produced, for at most
    /// `AgentCore.roundsPerFeed` events.
    package mutating func feed(_ event: AgentEvent) { Self.drive(&self, event) }

    /// Feeds `.timerFired(kind)` for every timer of the core due by `now` (on the core's clock),
    /// the earliest first; one that an earlier one's effects moved or cleared does not fire.
    package mutating func fireDueTimers(at now: Instant) { Self.fireTimers(&self, due: now) }

    fileprivate static func drive(_ runner: inout Self, _ event: AgentEvent) {
        var next = [event]
        var first = 0
        for round in 0... {
            guard runner.running, first < next.count else { return }
            guard round < AgentCore.roundsPerFeed else { return runner.ranAway(dropping: Array(next[first...])) }
            let event = next[first]
            first += 1
            runner.willHandle(event)
            let effects = runner.core.handle(event, now: runner.coreNow)
            for effect in effects { next += runner.perform(effect) }
            runner.handled(event, effects: effects)
        }
    }

    fileprivate static func fireTimers(_ runner: inout Self, due now: Instant) {
        let due = runner.core.timers.filter { $0.value <= now }
            .sorted { ($0.value, $0.key.rawValue) < ($1.value, $1.key.rawValue) }
        for (kind, at) in due where runner.core.timers[kind] == at {
            drive(&runner, .timerFired(kind))
        }
    }
}

extension CoreRunning where Self: AnyObject {
    /// `feed(_:)` for a runner that is a class, called on a reference.
    package func feed(_ event: AgentEvent) {
        var runner = self
        Self.drive(&runner, event)
    }

    package func fireDueTimers(at now: Instant) {
        var runner = self
        Self.fireTimers(&runner, due: now)
    }
}

extension AgentCore {
    /// At most this many events are handled for one event fed (it, what its effects produced,
    /// and theirs): a runaway exchange must not hold the runner. None has more than a few rounds.
    package static let roundsPerFeed = 1000
}
