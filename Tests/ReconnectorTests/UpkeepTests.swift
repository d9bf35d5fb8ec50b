import Basics
import Testing
@testable import Reconnector

/// The core's upkeep of what the agent keeps on the machine, event by event.
struct UpkeepTests {
    let damage = Upkeep.Damage(what: "rule v4 32765: not fwmark 0xca6c lookup 51820", by: "NetworkManager (pid 812)")

    func restores(_ effects: [Effect]) -> Int { effects.filter { if case .restore = $0 { true } else { false } }.count }
    func holds(_ effects: [Effect]) -> [Instant] {
        effects.compactMap { if case .upkeepHeld(_, _, _, let until) = $0 { until } else { nil } }
    }

    @Test func putBackAtOnceThenHeldOffInAFightThatDoublesAndEndsAfterAQuietMinute() {
        var core = agentCore(on: [])
        var now = Instant.zero
        var out: [Effect] = []
        // Five restores in a minute, each at once.
        for _ in 0..<5 {
            out = core.handle(.damaged(.routing, damage), now: now)
            #expect(restores(out) == 1, "\(out)")
            _ = core.handle(.intact(.routing), now: now)
            now = now + .seconds(1)
        }
        // The sixth is held off for 10 s, and the hold is the core's timer.
        out = core.handle(.damaged(.routing, damage), now: now)
        #expect(restores(out) == 0 && holds(out) == [now + .seconds(10)], "\(out)")
        #expect(core.timers[.upkeep] == now + .seconds(10))
        // More damage during the hold changes nothing; the timer puts it back once.
        #expect(core.handle(.damaged(.routing, damage), now: now + .seconds(2)).isEmpty)
        out = core.handle(.timerFired(.upkeep), now: now + .seconds(10))
        #expect(restores(out) == 1)
        now = now + .seconds(10)
        // Taken again at once: held off again, twice as long.
        out = core.handle(.damaged(.routing, damage), now: now + .milliseconds(100))
        #expect(holds(out) == [now + .milliseconds(100) + .seconds(20)], "\(out)")
        #expect(core.upkeep.records[.routing]?.lastBy == "NetworkManager (pid 812)")
        // Put back when the hold ends, then a quiet minute: the next removal is put back at once.
        _ = core.handle(.timerFired(.upkeep), now: now + .seconds(21))
        _ = core.handle(.intact(.routing), now: now + .seconds(21))
        out = core.handle(.damaged(.routing, damage), now: now + .seconds(90))
        #expect(restores(out) == 1 && holds(out).isEmpty, "\(out)")
        #expect(core.upkeep.records[.routing]?.restores == 8)
    }

    @Test func aLookThatFindsWhatIsKnownIsNotNewsButTheLookAfterARestoreIsItsAnswer() {
        var core = agentCore(on: [])
        func taken(_ effects: [Effect]) -> Int { effects.filter { if case .notice(.takenAway) = $0 { true } else { false } }.count }
        // Whole, looked at again and again: nothing to decide.
        #expect(core.handle(.intact(.resolvers), now: .zero).isEmpty)
        let other = Upkeep.Damage(what: "nameserver 10.77.0.1 missing", by: nil)
        var out = core.handle(.damaged(.resolvers, other), now: .zero)
        #expect(taken(out) == 1 && restores(out) == 1, "\(out)")
        // What the look after the restore finds is its answer, decided again (and not news): the
        // first restore that did not hold goes again at once (a removal told in parts), a second
        // in a row in a moment, not at once.
        out = core.handle(.damaged(.resolvers, other), now: .zero + .milliseconds(1))
        #expect(taken(out) == 0 && restores(out) == 1, "\(out)")
        out = core.handle(.damaged(.resolvers, other), now: .zero + .seconds(1))
        #expect(taken(out) == 0 && restores(out) == 0, "\(out)")
        #expect(core.timers[.upkeep] == Instant.zero + .seconds(1) + Upkeep.retryAfterRefusal)
        out = core.handle(.timerFired(.upkeep), now: .zero + .seconds(2))
        #expect(restores(out) == 1, "\(out)")
        #expect(core.upkeep.records[.resolvers]?.restoring == true)
        // Put back at last; then a notice's look finds it whole: nothing more.
        #expect(core.handle(.intact(.resolvers), now: .zero + .seconds(2)).isEmpty)
        #expect(core.upkeep.records[.resolvers]?.damage == nil)
        #expect(core.handle(.intact(.resolvers), now: .zero + .seconds(3)).isEmpty)
        // Taken again: news once more, and put back.
        let first = core.handle(.damaged(.resolvers, other), now: .zero + .seconds(4))
        #expect(taken(first) == 1 && restores(first) == 1)
        #expect(core.upkeep.records[.resolvers]?.restoring == true)
    }

    @Test func theSameDamageSeenTwiceWhileHeldOffIsDecidedOnce() {
        var core = agentCore(on: [])
        let gone = Upkeep.Damage(what: "route 0.0.0.0/0 table 51820 missing", by: nil)
        // Held off after five restores: further looks finding the same are not news.
        for i in 0..<5 {
            _ = core.handle(.damaged(.routing, gone), now: .zero + .seconds(i))
            _ = core.handle(.intact(.routing), now: .zero + .seconds(i))
        }
        let held = core.handle(.damaged(.routing, gone), now: .zero + .seconds(5))
        #expect(holds(held).count == 1)
        #expect(core.handle(.damaged(.routing, gone), now: .zero + .seconds(6)).isEmpty)
        // Something else missing besides is news.
        let more = core.handle(.damaged(.routing, Upkeep.Damage(what: "rule missing; route missing")), now: .zero + .seconds(7))
        #expect(more.contains { if case .notice(.takenAway) = $0 { true } else { false } }, "\(more)")
    }

    @Test func theLockdownIsNeverHeldOffAndHoldsAreEachHoldingsOwn() {
        var core = agentCore(on: [])
        // Taken: put back at once; the first refusal, at once again. Each further restore the
        // machine refuses: again a second later, for as long as it takes, never a hold and never
        // a restore loop without a pause.
        let taken = core.handle(.damaged(.lockdown, Upkeep.Damage(what: "table deleted")), now: .zero)
        #expect(restores(taken) == 1 && holds(taken).isEmpty, "\(taken)")
        let first = core.handle(.damaged(.lockdown, Upkeep.Damage(what: "table deleted")), now: .zero + .milliseconds(1))
        #expect(restores(first) == 1 && holds(first).isEmpty, "\(first)")
        for i in 1...50 {
            let at = Instant.zero + .seconds(i)
            let refused = core.handle(.damaged(.lockdown, Upkeep.Damage(what: "table deleted")), now: at - .milliseconds(990))
            #expect(restores(refused) == 0 && holds(refused).isEmpty, "refusal \(i): \(refused)")
            let again = core.handle(.timerFired(.upkeep), now: at + .milliseconds(10))
            #expect(restores(again) == 1 && holds(again).isEmpty, "restore \(i): \(again)")
        }
        _ = core.handle(.intact(.lockdown), now: .zero + .seconds(52))
        #expect(core.timers[.upkeep] == nil)
        // A fight over the routing does not hold the resolvers back.
        // (Each restore of the routing taken again at once: retried a second later, then held off.)
        for i in 0..<6 {
            _ = core.handle(.damaged(.routing, damage), now: Instant.zero + .seconds(60 + 2 * i))
            _ = core.handle(.timerFired(.upkeep), now: Instant.zero + .seconds(61 + 2 * i))
        }
        #expect(core.upkeep.records[.routing]?.fighting == true)
        #expect(restores(core.handle(.damaged(.resolvers, Upkeep.Damage(what: "/etc/resolv.conf rewritten")), now: .zero + .seconds(75))) == 1)
    }

    /// Refusals of the agent's own changes keep coming while a restore waits its second: the
    /// retry keeps its time (a refusal a second would otherwise put it off for ever).
    @Test func aRetryIsNotPutOffByLaterRefusals() {
        var core = agentCore(on: [])
        let refused = Upkeep.Damage(what: "nftables refused a change: busy", refused: true)
        #expect(restores(core.handle(.damaged(.lockdown, refused), now: .zero)) == 1)
        #expect(restores(core.handle(.damaged(.lockdown, refused), now: .zero)) == 1, "the first that did not hold: at once")
        #expect(restores(core.handle(.damaged(.lockdown, refused), now: .zero)) == 0)
        let due = Instant.zero + Upkeep.retryAfterRefusal
        #expect(core.timers[.upkeep] == due)
        for ms in stride(from: 100, to: 1_000, by: 100) {
            #expect(core.handle(.damaged(.lockdown, refused), now: .zero + .milliseconds(ms)).isEmpty)
            #expect(core.timers[.upkeep] == due, "at \(ms) ms")
        }
        #expect(restores(core.handle(.timerFired(.upkeep), now: due)) == 1)
    }

    @Test func aStoppedAgentPutsNothingBack() {
        var core = agentCore(on: [])
        _ = core.handle(.request(.stop(.bySignal)), now: .zero)
        #expect(core.handle(.damaged(.lockdown, Upkeep.Damage(what: "table deleted")), now: .zero).isEmpty)
    }
}
