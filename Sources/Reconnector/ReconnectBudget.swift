import Basics

/// How many reconnects the session may spend, and the backoff after failed ones: a token
/// bucket (one token per attempt, one back every `refill` up to `burst`) and the failures in a
/// row that set the backoff's step. Kept by `Reconnector`; the budget in force
/// (`Config.budget(on:)`, which depends on the power source and a reload) is given with each
/// question, and the random draws come from the state machine's generator.
struct ReconnectBudget: Equatable, Sendable {
    /// Tokens left, as of `refilledAt`.
    private(set) var tokens: Int
    /// The last instant a token was counted back (or the bucket was last full).
    private(set) var refilledAt: Instant
    /// Tokens taken since this budget was made (a refill takes none back).
    private(set) var taken = 0
    /// Attempts that failed in a row: each doubles the backoff's step.
    private(set) var failures = 0
    /// No budgeted attempt before this: a backoff the previous process of the agent drew.
    private(set) var notBefore: Instant?

    /// A full bucket of `burst` tokens at `now`.
    init(burst: Int, now: Instant) {
        tokens = burst
        refilledAt = now
    }

    /// Takes up what a previous process left (its tokens, refill instant, failures and the
    /// backoff it drew), counting back the tokens earned since and forgetting a wait that ran out.
    mutating func restore(_ memory: Reconnector.Memory, _ budget: Config.Budget, _ now: Instant) {
        tokens = max(0, min(memory.tokens, budget.burst))
        refilledAt = memory.refilledAt
        refill(now, budget)
        failures = max(0, memory.failures)
        notBefore = memory.notBefore.flatMap { $0 > now ? $0 : nil }
    }

    /// Counts back the tokens earned since `refilledAt`, up to `burst`.
    mutating func refill(_ now: Instant, _ budget: Config.Budget) {
        let step = max(budget.refill.nanoseconds, 1)
        let earned = (now.nanoseconds - refilledAt.nanoseconds) / step
        guard earned > 0 else { return }
        if tokens + Int(clamping: earned) >= budget.burst {
            tokens = budget.burst
            refilledAt = now
        } else {
            tokens += Int(earned)
            refilledAt = Instant(nanoseconds: refilledAt.nanoseconds + earned * step)
        }
    }

    /// Spends a token if one is left. Taken from a full bucket, the refill starts counting now.
    mutating func take(_ now: Instant, _ budget: Config.Budget) -> Bool {
        refill(now, budget)
        guard tokens > 0 else { return false }
        if tokens == budget.burst { refilledAt = now }
        tokens -= 1
        taken += 1
        return true
    }

    /// When the next token comes back.
    func nextToken(_ budget: Config.Budget) -> Instant { refilledAt + budget.refill }

    /// Another budget is in force (the power source changed): what was earned under the old
    /// one is counted, and no more tokens are kept than the new one holds.
    mutating func change(from old: Config.Budget, to new: Config.Budget, _ now: Instant) {
        refill(now, old)
        tokens = min(tokens, new.burst)
    }

    /// Full jitter over the backoff step for the failures so far, but never before a token is back.
    mutating func backoffWait(_ now: Instant, _ budget: Config.Budget, _ rng: inout SeededRandom) -> Duration {
        let step = min(budget.backoffCap, budget.backoffBase * (1 << min(max(failures, 1) - 1, 30)))
        refill(now, budget)
        return max(rng.upTo(step), tokens > 0 ? .zero : nextToken(budget) - now)
    }

    /// An attempt failed: the next backoff step doubles.
    mutating func noteFailure() { failures += 1 }

    /// The failures so far are history: the next backoff starts from its first step.
    mutating func forgetFailures() { failures = 0 }

    /// The wait a previous process drew no longer holds.
    mutating func forgetWait() { notBefore = nil }

    /// No step of the backoff applies any more: both the failures and a drawn wait are forgotten.
    mutating func resetBackoff() {
        failures = 0
        notBefore = nil
    }

    /// Whether a backoff is in force: failures counted or a wait drawn.
    var isBackingOff: Bool { failures > 0 || notBefore != nil }

    /// The clock stepped: what is remembered moves with it.
    mutating func shift(by step: Duration) {
        refilledAt = refilledAt + step
        notBefore = notBefore.map { $0 + step }
    }
}
