import Topology
import Basics
import PathMonitor
import Testing
@testable import Reconnector

/// The rules for slow, lossy, renumbering uplinks and restarts, one fact at a time.

@Test func aBackoffRetryWithALiveSessionProbesInsteadOfHandshaking() {
    var r = connected([eth0])
    _ = r.handle(.dataSent, now: at(100))
    _ = r.handle(.timerFired(.liveness), now: at(600))
    var t: Int64 = 600
    for wait: Int64 in [250, 500, 1000] {
        t += wait
        _ = r.handle(.timerFired(.probe), now: at(t))
    }
    guard case .backingOff = r.state, let retry = r.timers[.retry] else { Issue.record("expected a backoff, got \(r.state)"); return }
    let out = r.handle(.timerFired(.retry), now: retry)
    #expect(out.handshakes.isEmpty && out.probes == ["eth0"], "the server heard us seconds ago: \(out)")
}

@Test func aLateEchoInBackingOffReconnectsWithoutAHandshake() {
    var r = connected([eth0])
    _ = r.handle(.dataSent, now: at(100))
    _ = r.handle(.timerFired(.liveness), now: at(600))
    for t: Int64 in [850, 1350, 2350] { _ = r.handle(.timerFired(.probe), now: at(t)) }
    #expect(r.state.name == "backing-off")
    let late = r.handle(.probeReply(on: eth0.id, rtt: .milliseconds(2000)), now: at(2600))
    #expect(r.state == .connected(eth0) && late.handshakes.isEmpty && late.reasons == ["probeAnswered(rtt 2s)"])
}

@Test func theLivenessWaitFollowsTheRoundTrip() {
    var r = Reconnector()
    _ = r.handle(.paths([eth0]), now: at(0))
    _ = r.handle(.handshakeSucceeded(rtt: .milliseconds(1400)), now: at(1400))
    let out = r.handle(.dataSent, now: at(1500))
    // Patience 2 x 1.4 s + 4 x 0.7 s = 5.6 s; the liveness wait is twice that.
    #expect(out.isEmpty && r.timers[.liveness] == at(1500 + 11_200))
}

@Test func aProofWithoutDataDoublesTheNextLivenessWait() {
    var r = connected([eth0])
    _ = r.handle(.dataSent, now: at(100))
    _ = r.handle(.timerFired(.liveness), now: at(600))
    _ = r.handle(.probeReply(on: eth0.id, rtt: .milliseconds(20)), now: at(620))
    _ = r.handle(.dataSent, now: at(700))
    #expect(r.timers[.liveness] == at(1700), "a one-way flow is not probed at the floor's rate")
    _ = r.handle(.dataReceived, now: at(750))
    _ = r.handle(.dataSent, now: at(800))
    #expect(r.timers[.liveness] == at(1300), "data heard back restores the floor")
}

private let v6Stable = IPAddress("2001:db8:1::57")!
private let v6Temporary = IPAddress("2001:db8:1::a1b2")!
private let v6New = IPAddress("2001:db8:2::57")!
private func eth6(_ source: IPAddress, others: [IPAddress]) -> Path {
    Path(linkIndex: 3, interface: "eth0", kind: .ethernet, source: source, gateway: IPAddress("fe80::1"), metric: 100,
         prefixLength: 0, mtu: 1500, otherSources: others)
}

@Test func aStillValidAddressKeepsTheSessionWhileThePreferenceSettles() {
    var r = connected([eth6(v6Stable, others: [v6Temporary])])
    // The stable address is deprecated: the link prefers the temporary one for a millisecond.
    let bounce = r.handle(.paths([eth6(v6Temporary, others: [v6Stable])]), now: at(1000))
    #expect(bounce.rebinds.isEmpty && bounce.probes.isEmpty && r.timers[.debounce] == at(1002), "\(bounce)")
    // Both deprecated: the stable one is preferred again, and nothing happened.
    let back = r.handle(.paths([eth6(v6Stable, others: [v6Temporary])]), now: at(1001))
    #expect(back.isEmpty && r.timers[.debounce] == nil && r.state.path?.source == v6Stable)
    // The new prefix is usable: one move, make-before-break, after the debounce.
    _ = r.handle(.paths([eth6(v6New, others: [v6Stable, v6Temporary])]), now: at(2000))
    let move = r.handle(.timerFired(.debounce), now: at(2002))
    #expect(move.reasons == ["addressChanged(eth0 2001:db8:1::57 -> 2001:db8:2::57)"] && move.probes == ["eth0"])
    _ = r.handle(.probeReply(on: eth6(v6New, others: []).id, rtt: .milliseconds(15)), now: at(2025))
    #expect(r.state.path?.source == v6New)
}

@Test func aShortSleepKeepsDeadPathVerdictsAndALongOneForgetsThem() {
    for (slept, backOn) in [(Duration.seconds(30), "wifi0"), (Duration.seconds(600), "eth0")] {
        var r = connected([eth0, wifi0])
        _ = r.handle(.dataSent, now: at(100))
        _ = r.handle(.timerFired(.liveness), now: at(600))
        _ = r.handle(.probeReply(on: wifi0.id, rtt: .milliseconds(30)), now: at(630))
        _ = r.handle(.timerFired(.probe), now: at(850))
        #expect(r.state == .connected(wifi0, candidate: eth0.id))
        _ = r.handle(.sleep, now: at(1000))
        let woke = at(1000) + slept
        _ = r.handle(.wake(sleptFor: slept), now: woke)
        #expect(r.state.path?.interface == backOn, "after \(slept)")
    }
}

@Test func memoryOutlivesTheProcessAndRefusesDamage() {
    var r = connected([eth0, wifi0])
    _ = r.handle(.paths([wifi0]), now: at(1000))
    let memory = r.memory
    let text = memory.text
    #expect(Reconnector.Memory(text: text) == memory)
    #expect(Reconnector.Memory(text: text + "tokens many\n") == nil)
    #expect(Reconnector.Memory(text: "dead 3 10.20.0.57 5 0\ntokens 1\nrefilled-at 0\n") == nil, "zero strikes is no verdict")
    let restored = Reconnector(now: at(1001), memory: memory)
    #expect(restored.tokens == r.tokens)
    // A memory from another clock (a reboot) is ignored: a full budget.
    var later = memory
    later.refilledAt = at(5000)
    let rebooted = Reconnector(now: at(1), memory: later)
    #expect(rebooted.tokens == Config().ac.burst)
}

@Test func aClockThatStepsBackMovesWhatIsRememberedWithIt() {
    var config = Config()
    config.ac = .init(burst: 1, refill: .seconds(6), backoffBase: .seconds(1), backoffCap: .seconds(1))
    var r = connected([eth0], config: config)  // the only token spent at 0
    _ = r.handle(.dataSent, now: at(100))
    // The clock steps back about 50 s: the liveness timer keeps the 500 ms it had from the last input.
    // (More data sent: the timer armed before stays, moved with the clock.)
    let stepped = r.handle(.dataSent, now: at(-49_800))
    #expect(r.timers[.liveness] == at(-49_300), "\(stepped)")
    // The token comes back 6 s after it was spent, on the new clock, not 50 s later.
    _ = r.handle(.paths([]), now: at(-49_700))
    _ = r.handle(.paths([eth0]), now: at(-43_700))
    #expect(r.state.name == "probing", "a token to spend: \(r.state)")
}
