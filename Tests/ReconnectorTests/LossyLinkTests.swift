import Basics
import Testing
@testable import Reconnector

/// The rules for links that lose packets rather than carrier, one fact at a time.

@Test func aResentInitiationIsNotANewAttempt() {
    var r = Reconnector()
    let first = r.handle(.paths([eth0]), now: at(0))
    #expect(first.handshakes == ["eth0"] && r.timers[.resend] == at(1000))
    let tokens = r.tokens
    let resent = r.handle(.timerFired(.resend), now: at(1000))
    #expect(resent == [.resendHandshake(on: eth0)] && r.timers[.resend] == at(3000), "\(resent)")
    #expect(r.tokens == tokens && r.state == .connecting(eth0, resends: 1) && r.attempt == 1)
    // The next would come after the handshake timeout: none is armed.
    let again = r.handle(.timerFired(.resend), now: at(3000))
    #expect(again == [.resendHandshake(on: eth0)] && r.timers[.resend] == nil && r.resentHandshakes == 2)
    // The answer to the second ends the attempt as any answer does.
    _ = r.handle(.handshakeSucceeded(rtt: .milliseconds(20)), now: at(3020))
    #expect(r.state == .connected(eth0) && r.timers[.resend] == nil)
}

@Test func aPathThatLosesSomeProbesIsGivenMoreBeforeItIsDead() {
    var r = connected([eth0])
    var t: Int64 = 1000
    // Ten rounds of probing; in every other one the first probe is lost, the second answered.
    for round in 0..<10 {
        t += 12_000
        _ = r.handle(.dataSent, now: at(t))
        guard let due = r.timers[.liveness] else { Issue.record("no liveness timer in round \(round)"); return }
        t = due.nanoseconds / 1_000_000
        _ = r.handle(.timerFired(.liveness), now: at(t))
        if round % 2 == 1, let probe = r.timers[.probe] {
            t = probe.nanoseconds / 1_000_000
            _ = r.handle(.timerFired(.probe), now: at(t))
        }
        t += 20
        _ = r.handle(.probeReply(on: eth0.id, rtt: .milliseconds(20)), now: at(t))
        #expect(r.state == .connected(eth0), "round \(round): \(r.state)")
    }
    // Now it goes silent: three unanswered probes are not enough on a path that lost a share.
    t += 12_000
    _ = r.handle(.dataSent, now: at(t))
    _ = r.handle(.timerFired(.liveness), now: r.timers[.liveness]!)
    var probes = 1
    while case .probing = r.state, let due = r.timers[.probe], probes < 20 {
        let out = r.handle(.timerFired(.probe), now: due)
        probes += out.probes.count
    }
    #expect(probes > 3 && probes <= Config().maxProbeAttempts, "probes before giving up: \(probes)")
    #expect(r.state.name == "backing-off")
}

@Test func aCleanPathIsDeadAfterThreeProbes() {
    var r = connected([eth0])
    _ = r.handle(.dataSent, now: at(100))
    _ = r.handle(.timerFired(.liveness), now: r.timers[.liveness]!)
    var probes = 1
    while case .probing = r.state, let due = r.timers[.probe], probes < 20 {
        probes += r.handle(.timerFired(.probe), now: due).probes.count
    }
    #expect(probes == 3 && r.state.name == "backing-off")
}

@Test func noBackoffStepIsOlderThanTheCurrentNetwork() {
    var r = connected([eth0])
    // The server goes silent: handshakes on eth0 time out one after another.
    _ = r.handle(.reconnectRequested, now: at(100))
    var now: Int64 = 100
    for _ in 0..<6 {
        if let due = r.timers[.handshake] { now = due.nanoseconds / 1_000_000; _ = r.handle(.timerFired(.handshake), now: due) }
        if let due = r.timers[.retry] { now = due.nanoseconds / 1_000_000; _ = r.handle(.timerFired(.retry), now: due) }
    }
    // Another network: wifi0 instead of eth0. Its first failure waits a first step, not the sixth.
    now += 1000
    _ = r.handle(.paths([wifi0]), now: at(now))
    #expect(r.state == .connecting(wifi0))
    now += 5000
    _ = r.handle(.timerFired(.handshake), now: at(now))
    guard case .backingOff = r.state, let retry = r.timers[.retry] else { Issue.record("expected a backoff, got \(r.state)"); return }
    #expect(retry - at(now) <= Config().ac.backoffBase, "waits \(retry - at(now))")
}

@Test func aRestartKeepsAVerdictWhoseHoldDownRanOut() {
    var r = connected([eth0, wifi0])
    // eth0 goes silent: failover to wifi0, eth0 held down for 15 s.
    _ = r.handle(.dataSent, now: at(100))
    _ = r.handle(.timerFired(.liveness), now: r.timers[.liveness]!)
    _ = r.handle(.probeReply(on: wifi0.id, rtt: .milliseconds(20)), now: at(620))
    _ = r.handle(.timerFired(.probe), now: r.timers[.probe]!)
    #expect(r.state == .connected(wifi0, candidate: eth0.id))
    let memory = r.memory
    #expect(memory.dead[eth0.id]?.strikes == 1)
    // The new process starts after the hold-down ran out: it still prefers wifi0, which has no verdict.
    var restarted = Reconnector(now: at(20_000), memory: memory)
    let out = restarted.handle(.paths([eth0, wifi0]), now: at(20_000))
    #expect(out.handshakes == ["wifi0"], "\(out)")
    #expect(Reconnector.Memory(text: memory.text) == memory)
}

@Test func theRoundTripIsRefreshedBeforeItGoesStaleWhileTrafficIsAnswered() {
    var r = connected([eth0])
    #expect(r.handle(.dataReceived, now: at(5000)).probes.isEmpty, "the estimate is 5 s old")
    #expect(r.handle(.dataSent, now: at(5100)).probes.isEmpty)
    // A busy conversation reports only its arrivals (one a second): one of them asks for the
    // refresh once three quarters of the 10 s have passed.
    #expect(r.handle(.dataReceived, now: at(7600)).probes == ["eth0"], "the estimate is 7.6 s old")
    #expect(r.handle(.dataReceived, now: at(8600)).probes.isEmpty, "one refresh at a time")
    #expect(r.handle(.dataSent, now: at(8700)).probes.isEmpty)
    // Data sent after a quiet spell asks too.
    var quiet = connected([eth0])
    _ = quiet.handle(.dataReceived, now: at(4000))
    #expect(quiet.handle(.dataSent, now: at(8000)).probes == ["eth0"])
    // Idle: an application that sends a packet a minute costs no probes, on its send or on its answer.
    var idle = connected([eth0])
    #expect(idle.handle(.dataSent, now: at(60_000)).probes.isEmpty)
    #expect(idle.handle(.dataReceived, now: at(60_050)).probes.isEmpty)
}
