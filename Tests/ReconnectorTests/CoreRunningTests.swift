import Topology
import Basics
import Testing
import Reconnector

/// A runner that carries nothing out: it records each event fed and each effect performed, in
/// order, and answers with canned events.
private struct RecordingRunner: CoreRunning {
    enum Step: Equatable {
        case fed(AgentEvent)
        case performed(Effect)
    }

    var core: AgentCore
    var coreNow: Instant
    var running = true
    /// What the n-th effect performed (from 0) produces at once.
    var answers: [Int: [AgentEvent]] = [:]
    /// What every other effect produces at once.
    var otherwise: [AgentEvent] = []
    var steps: [Step] = []
    var performed = 0
    /// How much each event handled added to the core's attempts, in order.
    var attemptsAdded: [Int] = []
    var dropped: [AgentEvent]?
    private var attemptsBefore = 0

    init(_ core: AgentCore, now: Instant) {
        self.core = core
        coreNow = now
    }

    mutating func perform(_ effect: Effect) -> [AgentEvent] {
        defer { performed += 1 }
        steps.append(.performed(effect))
        return answers[performed] ?? otherwise
    }

    mutating func willHandle(_ event: AgentEvent) {
        steps.append(.fed(event))
        attemptsBefore = core.attempts
    }

    mutating func handled(_ event: AgentEvent, effects: [Effect]) {
        attemptsAdded.append(core.attempts - attemptsBefore)
    }

    mutating func ranAway(dropping dropped: [AgentEvent]) { self.dropped = dropped }

    var fed: [AgentEvent] { steps.compactMap { if case .fed(let event) = $0 { event } else { nil } } }
}

/// The same, as a class, as the daemon's runner is: fed through a reference.
private final class SharedRunner: CoreRunning {
    var core: AgentCore
    let coreNow = at(0)
    var performed: [Effect] = []

    init(_ core: AgentCore) { self.core = core }

    func perform(_ effect: Effect) -> [AgentEvent] {
        performed.append(effect)
        return []
    }
}

/// What `events` give, handled one after the other by a copy of `core` at `now`, as the steps a
/// runner records.
private func reference(_ core: AgentCore, _ events: [AgentEvent], now: Instant) -> [RecordingRunner.Step] {
    var core = core
    return events.flatMap { event in [.fed(event)] + core.handle(event, now: now).map { .performed($0) } }
}

@Test func anEventsEffectsAreAllPerformedBeforeWhatTheyProducedIsFedInOrder() {
    let core = agentCore(on: [eth0, wifi0], wait: .seconds(30))
    var runner = RecordingRunner(core, now: at(0))
    // The start's first effect (its local networks) answers with two events, its last (the
    // transition) with one; the exclusion's reply, the sixth effect, with one more.
    runner.answers = [0: [.powerChanged(.battery), .request(.exclude(by: 1000))], 4: [.sleep], 5: [.dataSent]]
    runner.feed(.start)

    let order: [AgentEvent] = [.start, .powerChanged(.battery), .request(.exclude(by: 1000)), .sleep, .dataSent]
    #expect(runner.fed == order)
    #expect(runner.steps == reference(core, order, now: at(0)))
    // The start gives five effects; the exclusion, refused, one: the reply whose answer comes last.
    #expect(runner.steps.prefix(6).dropFirst().allSatisfy { if case .performed = $0 { true } else { false } })
    #expect(runner.steps[runner.steps.firstIndex(of: .fed(.request(.exclude(by: 1000))))! + 1] == .performed(.reply(.exclusionOff)))
    // Five for the start, none for the power, one each for the exclusion and the sleep; data
    // sent while asleep calls for nothing.
    #expect(runner.performed == 7)
    #expect(runner.dropped == nil)
}

@Test func aRunawayExchangeStopsAfterTheBoundAndTheRunnerHearsWhatWasDropped() {
    let refused = AgentEvent.request(.exclude(by: 1000))
    var runner = RecordingRunner(agentCore(on: [eth0]), now: at(0))
    // Each refusal's reply asks again: an exchange without end.
    runner.otherwise = [refused]
    runner.feed(refused)
    #expect(AgentCore.roundsPerFeed == 1000)
    #expect(runner.fed.count == 1000)
    #expect(runner.performed == 1000)
    #expect(runner.dropped == [refused])

    // One that ends within the bound drops nothing.
    var short = RecordingRunner(agentCore(on: [eth0]), now: at(0))
    short.answers = [0: [refused], 1: [refused]]
    short.feed(refused)
    #expect(short.fed == [refused, refused, refused])
    #expect(short.dropped == nil)
}

@Test func aRunnerThatStoppedFeedsNothing() {
    var runner = RecordingRunner(agentCore(on: [eth0]), now: at(0))
    runner.running = false
    runner.feed(.start)
    #expect(runner.steps.isEmpty)
    #expect(runner.core.attempts == 0)
}

@Test func dueTimersFireEarliestFirstAndOnlyThoseDue() {
    var core = agentCore(on: [eth0, wifi0], wait: .seconds(30))
    _ = core.handle(.start, now: at(0))
    #expect(core.timers == [.resend: at(1_000), .handshake: at(5_000), .startup: at(30_000)])

    var early = RecordingRunner(core, now: at(4_000))
    early.fireDueTimers(at: at(4_000))
    #expect(early.fed == [.timerFired(.resend)])

    var late = RecordingRunner(core, now: at(40_000))
    late.fireDueTimers(at: at(40_000))
    #expect(late.fed == [.timerFired(.resend), .timerFired(.handshake), .timerFired(.startup)])
    #expect(late.steps == reference(core, late.fed, now: at(40_000)))
}

@Test func aDueTimerThatAnEarlierOneClearedDoesNotFire() {
    var core = agentCore(on: [eth0, wifi0], wait: .seconds(30))
    _ = core.handle(.start, now: at(0))
    var runner = RecordingRunner(core, now: at(40_000))
    // The resent initiation is answered at once: the session comes up, and neither the
    // handshake's timeout nor the start-up's stands any more.
    let completed = AgentEvent.handshakeCompleted(rtt: .milliseconds(20), sizedProbes: false, carriesIPv6: true)
    runner.answers = [0: [completed], 1: [.tunnelAttached]]
    runner.fireDueTimers(at: at(40_000))
    #expect(runner.fed == [.timerFired(.resend), completed, .tunnelAttached])
    #expect(runner.steps.first(where: { if case .performed = $0 { true } else { false } }) == .performed(.resendHandshake(on: eth0)))
    #expect(runner.steps[runner.steps.firstIndex(of: .fed(completed))! + 1] == .performed(.attachTunnel))
    #expect(runner.core.timers[.handshake] == nil && runner.core.timers[.startup] == nil)
}

@Test func theCoreCountsOneAttemptPerEventThatBindsOrHandshakes() {
    var runner = RecordingRunner(agentCore(on: [eth0, wifi0]), now: at(0))
    // The start binds and handshakes (one attempt); a change of power and a sleep do neither;
    // the wake handshakes again.
    for event: AgentEvent in [.start, .powerChanged(.battery), .sleep, .wake(sleptFor: .seconds(1))] {
        runner.feed(event)
        runner.coreNow = runner.coreNow + .milliseconds(1)
    }
    #expect(runner.attemptsAdded == [1, 0, 0, 1])
    #expect(runner.core.attempts == 2)
    #expect(runner.steps.filter { if case .performed(let effect) = $0 { effect.isAttempt } else { false } }.count == 3)
    // The start's attempt took the machine's first token.
    #expect(runner.core.reconnector.tokensTaken >= 1)

    let shared = SharedRunner(agentCore(on: [eth0]))
    shared.feed(.start)
    #expect(shared.core.attempts == 1)
    #expect(shared.performed.filter(\.isAttempt).count == 2)
}
