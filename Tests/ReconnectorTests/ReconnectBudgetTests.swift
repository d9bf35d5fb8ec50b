import Basics
import Testing
@testable import Reconnector

/// The reconnect budget on its own: tokens taken and counted back, and the backoff's waits.
@Suite struct ReconnectBudgetTests {
    /// Three tokens, one back every 10 s; backoff steps of 1 s doubling up to 8 s.
    static let rule = Config.Budget(burst: 3, refill: .seconds(10), backoffBase: .seconds(1), backoffCap: .seconds(8))

    @Test func tokensRunOutAndComeBackOneARefill() {
        var budget = ReconnectBudget(burst: 3, now: at(0))
        let first = (0..<3).map { _ in budget.take(at(0), Self.rule) }
        let early = budget.take(at(9_999), Self.rule)
        #expect(first == [true, true, true] && !early, "none back before the refill")
        #expect(budget.tokens == 0 && budget.taken == 3)
        #expect(budget.nextToken(Self.rule) == at(10_000))
        // 25 s later two tokens are back, counted from 0 s: the next comes at 30 s.
        let later = budget.take(at(25_000), Self.rule)
        #expect(later && budget.tokens == 1 && budget.taken == 4 && budget.refilledAt == at(20_000))
        #expect(budget.nextToken(Self.rule) == at(30_000))
    }

    @Test func aFullBucketStartsItsRefillAtTheFirstTake() {
        var budget = ReconnectBudget(burst: 3, now: at(0))
        let taken = budget.take(at(100_000), Self.rule)
        #expect(taken && budget.tokens == 2 && budget.refilledAt == at(100_000))
        #expect(budget.nextToken(Self.rule) == at(110_000), "not 10 s after the bucket was made")
    }

    @Test func aRefillStopsAtTheBurst() {
        var budget = ReconnectBudget(burst: 3, now: at(0))
        _ = budget.take(at(0), Self.rule)
        budget.refill(at(60_000), Self.rule)
        #expect(budget.tokens == 3 && budget.refilledAt == at(60_000))
    }

    @Test func theBackoffStepDoublesPerFailureUpToTheCap() {
        var budget = ReconnectBudget(burst: 3, now: at(0))
        var rng = SeededRandom(seed: 7)
        var twin = SeededRandom(seed: 7)
        for step: Int64 in [1, 2, 4, 8, 8] {
            budget.noteFailure()
            let wait = budget.backoffWait(at(0), Self.rule, &rng)
            let expected = twin.upTo(.seconds(step))
            #expect(wait == expected, "full jitter over \(step) s")
        }
        #expect(budget.failures == 5)
        budget.forgetFailures()
        let wait = budget.backoffWait(at(0), Self.rule, &rng)
        let expected = twin.upTo(.seconds(1))
        #expect(wait == expected, "no failure waits as the first")
    }

    @Test func theBackoffNeverEndsBeforeATokenIsBack() {
        let one = Config.Budget(burst: 1, refill: .seconds(10), backoffBase: .seconds(1), backoffCap: .seconds(8))
        var budget = ReconnectBudget(burst: 1, now: at(0))
        var rng = SeededRandom(seed: 1)
        let taken = budget.take(at(2_000), one)
        budget.noteFailure()
        let wait = budget.backoffWait(at(4_000), one, &rng)
        #expect(taken && wait == .seconds(8), "the token is back at 12 s")
    }

    @Test func anotherBudgetKeepsNoMoreTokensThanItHolds() {
        let battery = Config.Budget(burst: 2, refill: .seconds(60), backoffBase: .seconds(5), backoffCap: .seconds(300))
        var budget = ReconnectBudget(burst: 3, now: at(0))
        _ = budget.take(at(0), Self.rule)
        _ = budget.take(at(0), Self.rule)
        _ = budget.take(at(0), Self.rule)
        // 35 s under the old budget earned three tokens; the new one keeps two.
        budget.change(from: Self.rule, to: battery, at(35_000))
        #expect(budget.tokens == 2 && budget.refilledAt == at(35_000))
    }

    @Test func aRestoredBudgetCountsWhatWasEarnedSince() {
        let memory = Reconnector.Memory(tokens: 1, refilledAt: at(0), failures: 2, notBefore: at(20_000), dead: [:])
        var budget = ReconnectBudget(burst: 3, now: at(15_000))
        budget.restore(memory, Self.rule, at(15_000))
        #expect(budget.tokens == 2 && budget.refilledAt == at(10_000) && budget.taken == 0)
        #expect(budget.failures == 2 && budget.notBefore == at(20_000) && budget.isBackingOff)
        var late = ReconnectBudget(burst: 3, now: at(25_000))
        late.restore(memory, Self.rule, at(25_000))
        #expect(late.notBefore == nil, "a wait that ran out is forgotten")
        #expect(late.tokens == 3 && late.refilledAt == at(25_000))
    }

    @Test func theBackoffResetForgetsFailuresAndTheDrawnWait() {
        let memory = Reconnector.Memory(tokens: 3, refilledAt: at(0), failures: 4, notBefore: at(50_000), dead: [:])
        var budget = ReconnectBudget(burst: 3, now: at(0))
        budget.restore(memory, Self.rule, at(0))
        budget.forgetWait()
        #expect(budget.notBefore == nil && budget.failures == 4 && budget.isBackingOff)
        budget.restore(memory, Self.rule, at(0))
        budget.resetBackoff()
        #expect(budget.notBefore == nil && budget.failures == 0 && !budget.isBackingOff)
    }

    @Test func aClockStepMovesTheRefillAndTheWait() {
        let memory = Reconnector.Memory(tokens: 0, refilledAt: at(10_000), failures: 1, notBefore: at(40_000), dead: [:])
        var budget = ReconnectBudget(burst: 3, now: at(10_000))
        budget.restore(memory, Self.rule, at(10_000))
        budget.shift(by: .seconds(-5))
        #expect(budget.refilledAt == at(5_000) && budget.notBefore == at(35_000) && budget.tokens == 0)
    }
}
