import Topology
import Basics
import PathMonitor
import Testing
@testable import Reconnector

let eth0 = Path(linkIndex: 3, interface: "eth0", kind: .ethernet, source: IPAddress("10.20.0.57")!,
                        gateway: IPAddress("10.20.0.1"), metric: 100, prefixLength: 0, mtu: 1500)
let wifi0 = Path(linkIndex: 2, interface: "wifi0", kind: .wifi, source: IPAddress("192.168.1.23")!,
                         gateway: IPAddress("192.168.1.1"), metric: 600, prefixLength: 0, mtu: 1500)

func at(_ ms: Int64) -> Instant { Instant(nanoseconds: ms * 1_000_000) }

extension [Effect] {
    var transitions: [Transition] { compactMap { if case .transition(let t) = $0 { t } else { nil } } }
    var reasons: [String] { transitions.map(\.reason.description) }
    var binds: Int { filter { if case .bind(_, true, _) = $0 { true } else { false } }.count }
    var rebinds: [String] { compactMap { if case .bind(let p, false, _) = $0 { p.interface } else { nil } } }
    var handshakes: [String] { compactMap { if case .handshake(let p, _) = $0 { p.interface } else { nil } } }
    var probes: [String] { compactMap { if case .probe(_, let p, nil) = $0 { p.interface } else { nil } } }
}

/// A machine connected on `paths.first` at 20 ms.
func connected(_ paths: [Path], config: Config = Config()) -> Reconnector {
    var r = Reconnector(config: config)
    _ = r.handle(.paths(paths), now: at(0))
    _ = r.handle(.handshakeSucceeded(rtt: .milliseconds(20)), now: at(20))
    return r
}

@Test func offlineMachineDoesNothing() {
    var r = Reconnector()
    let result1 = r.handle(.paths([]), now: at(0))
    #expect(result1.isEmpty)
    let result2 = r.handle(.dataSent, now: at(10))
    #expect(result2.isEmpty)
    let result3 = r.handle(.timerFired(.retry), now: at(20))
    #expect(result3.isEmpty)
    #expect(r.state == .offline && r.nextDeadline == nil)
}

@Test func firstPathBindsAndHandshakes() {
    var r = Reconnector()
    let out = r.handle(.paths([eth0, wifi0]), now: at(0))
    #expect(out.binds == 1 && out.handshakes == ["eth0"])
    #expect(r.timers[.handshake] == at(5000))
    #expect(r.state == .connecting(eth0))
    #expect(out.reasons == ["pathAppeared(eth0)"])
    _ = r.handle(.handshakeSucceeded(rtt: .milliseconds(20)), now: at(20))
    #expect(r.state == .connected(eth0))
    #expect(r.timers[.handshake] == nil)
    #expect(r.nextDeadline == nil, "a connected, idle tunnel keeps no timer")
}

@Test func pathLossWithAlternativeRebindsAtOnceWithoutHandshake() {
    var r = connected([eth0, wifi0])
    let out = r.handle(.paths([wifi0]), now: at(1000))
    #expect(out.rebinds == ["wifi0"] && out.handshakes.isEmpty && out.probes == ["wifi0"])
    #expect(out.reasons == ["pathLost(eth0)"])
    _ = r.handle(.probeReply(on: wifi0.id, rtt: .milliseconds(30)), now: at(1030))
    #expect(r.state == .connected(wifi0))
}

@Test func addressChangeIsReportedAsSuch() {
    var r = connected([wifi0])
    var renumbered = wifi0
    renumbered.source = IPAddress("192.168.1.80")!
    let out = r.handle(.paths([renumbered]), now: at(1000))
    #expect(out.reasons == ["addressChanged(wifi0 192.168.1.23 -> 192.168.1.80)"])
    #expect(out.rebinds == ["wifi0"])
}

@Test func lastPathLostGoesOfflineAndCancelsEverything() {
    var r = connected([eth0])
    _ = r.handle(.dataSent, now: at(100))
    #expect(r.nextDeadline != nil)
    _ = r.handle(.paths([]), now: at(200))
    #expect(r.state == .offline && r.nextDeadline == nil && r.timers[.liveness] == nil)
    let result4 = r.handle(.dataSent, now: at(300))
    #expect(result4.isEmpty)
}

@Test func betterPathWaitsForDebounceThenProbesBeforeSwitching() {
    var r = connected([wifi0])
    let offer = r.handle(.paths([eth0, wifi0]), now: at(1000))
    #expect(offer.isEmpty && r.timers[.debounce] == at(1002))
    let start = r.handle(.timerFired(.debounce), now: at(1002))
    #expect(start.probes == ["eth0"] && start.rebinds.isEmpty)
    #expect(start.reasons == ["betterPath(eth0 metric 100 < wifi0 600)"])
    #expect(r.state == .switching(from: wifi0, to: eth0, sent: 1))
    let moved = r.handle(.probeReply(on: eth0.id, rtt: .milliseconds(5)), now: at(1055))
    #expect(moved.rebinds == ["eth0"] && moved.handshakes.isEmpty)
    #expect(r.state == .connected(eth0))
}

@Test func flapsInsideTheDebounceWindowAreCoalesced() {
    var r = connected([wifi0])
    _ = r.handle(.paths([eth0, wifi0]), now: at(1000))
    _ = r.handle(.paths([wifi0]), now: at(1020))
    #expect(r.timers[.debounce] == nil)
    _ = r.handle(.paths([eth0, wifi0]), now: at(1200))
    // The loss at 1.02 s counts against eth0: it must stay up for the flap hold-down (1 s).
    #expect(r.timers[.debounce] == at(2200))
    _ = r.handle(.paths([wifi0]), now: at(1300))
    _ = r.handle(.paths([eth0, wifi0]), now: at(1400))
    // A second loss doubles it.
    #expect(r.timers[.debounce] == at(3400))
    #expect(r.state == .connected(wifi0, candidate: eth0.id))
}

@Test func flappingInterfaceEarnsALongerHoldDown() {
    var r = connected([eth0, wifi0])
    for i in 0..<4 {
        _ = r.handle(.paths([wifi0]), now: at(1000 + Int64(i) * 500))
        _ = r.handle(.probeReply(on: wifi0.id, rtt: .milliseconds(20)), now: at(1020 + Int64(i) * 500))
        _ = r.handle(.paths([eth0, wifi0]), now: at(1250 + Int64(i) * 500))
    }
    // The first loss moved the session; later ones only reset the better-path timer.
    let due = r.timers[.debounce]!
    #expect(due - at(2750) > .seconds(1), "four losses in a minute hold eth0 down for more than the 300 ms debounce")
    #expect(due - at(2750) <= Config().maxHoldDown)
}

@Test func unreachableCandidateIsAbandonedAndTheSessionStays() {
    var r = connected([wifi0])
    _ = r.handle(.paths([eth0, wifi0]), now: at(1000))
    _ = r.handle(.timerFired(.debounce), now: at(1300))
    var t: Int64 = 1300
    var last: [Effect] = []
    for _ in 0..<3 {
        t += 250
        last = r.handle(.timerFired(.probe), now: at(t))
    }
    #expect(r.state == .connected(wifi0, candidate: eth0.id))
    #expect(last.reasons == ["candidateUnreachable(eth0 3 probes)"])
    #expect(last.rebinds.isEmpty)
    // It is retried only after the dead-path hold-down.
    #expect(r.timers[.debounce]! >= at(t) + Config().deadPathHoldDown)
}

@Test func silentBlackholeFailsOverToTheAlternative() {
    var r = connected([eth0, wifi0])
    let result6 = r.handle(.dataSent, now: at(100))
    #expect(result6.isEmpty && r.timers[.liveness] == at(600))
    let result7 = r.handle(.dataSent, now: at(200))
    #expect(result7.isEmpty, "one liveness timer, however much is sent")
    let suspect = r.handle(.timerFired(.liveness), now: at(600))
    #expect(suspect.probes == ["eth0", "wifi0"] && suspect.reasons == ["livenessTimeout(500ms)"])
    let answered = r.handle(.probeReply(on: wifi0.id, rtt: .milliseconds(30)), now: at(630))
    #expect(answered.isEmpty, "eth0 has not missed its probe yet")
    let moved = r.handle(.timerFired(.probe), now: at(850))
    #expect(moved.reasons == ["failover(eth0 silent, wifi0 rtt 30ms)"])
    #expect(moved.rebinds == ["wifi0"] && moved.handshakes.isEmpty)
    #expect(r.state == .connected(wifi0, candidate: eth0.id))
}

@Test func aSilentPathWhoseAlternativeIsSilentTooIsProbedWithGrowingWaits() {
    var r = connected([eth0, wifi0])
    _ = r.handle(.dataSent, now: at(100))
    _ = r.handle(.timerFired(.liveness), now: at(600))
    let second = r.handle(.timerFired(.probe), now: at(850))
    #expect(second.probes == ["eth0", "wifi0"] && r.timers[.probe] == at(1350))
    _ = r.handle(.timerFired(.probe), now: at(1350))
    #expect(r.timers[.probe] == at(2350))
}

@Test func dataReceivedCancelsLiveness() {
    var r = connected([eth0])
    _ = r.handle(.dataSent, now: at(100))
    let result8 = r.handle(.dataReceived, now: at(120))
    #expect(result8.isEmpty && r.timers[.liveness] == nil)
    #expect(r.nextDeadline == nil)
}

@Test func aSessionUnknownHintIsCheckedWithAProbeThenHandshakesAtOnce() {
    var r = connected([eth0])
    let out = r.handle(.handshakeFailed(.sessionUnknown), now: at(5000))
    #expect(out.handshakes.isEmpty && out.probes == ["eth0"] && out.rebinds.isEmpty, "\(out)")
    #expect(out.reasons == ["sessionUnknownHint"])
    // Twice the smoothed RTT (20 ms) of silence confirms it.
    #expect(r.timers[.probe] == at(5040))
    #expect(r.handle(.handshakeFailed(.sessionUnknown), now: at(5001)).isEmpty, "a second hint joins the check")
    let confirmed = r.handle(.timerFired(.probe), now: at(5040))
    #expect(confirmed.handshakes == ["eth0"] && confirmed.reasons == ["sessionUnknown"])
    let result9 = r.handle(.handshakeFailed(.sessionUnknown), now: at(5041))
    #expect(result9.handshakes.isEmpty && result9.probes.isEmpty,
            "a hint while the handshake is in flight starts nothing")
}

/// A forged hint costs one probe, no handshake and no token; hints within a second of a forgery
/// send nothing, and a real one among them is still confirmed by the next liveness probe.
@Test func aForgedHintCostsOneProbeAndNoToken() {
    var r = connected([eth0])
    let tokens = r.tokens
    _ = r.handle(.handshakeFailed(.sessionUnknown), now: at(5000))
    let answered = r.handle(.probeReply(on: eth0.id, rtt: .milliseconds(20)), now: at(5020))
    #expect(r.state == .connected(eth0) && answered.handshakes.isEmpty)
    #expect(r.tokens == tokens && r.disprovedHints == 1)
    // Within the second: nothing sent, no transition.
    #expect(r.handle(.handshakeFailed(.sessionUnknown), now: at(5500)).isEmpty)
    // Data comes back: the held hint was false too.
    _ = r.handle(.dataReceived, now: at(5510))
    #expect(r.disprovedHints == 2)
    // Another within the second, and this time the server is silent: the liveness probe's
    // silence confirms it after twice the RTT, not after three backed-off probes.
    #expect(r.handle(.handshakeFailed(.sessionUnknown), now: at(5600)).isEmpty)
    _ = r.handle(.dataSent, now: at(5600))
    guard let liveness = r.timers[.liveness] else { Issue.record("no liveness timer"); return }
    let probe = r.handle(.timerFired(.liveness), now: liveness)
    #expect(probe.probes.first == "eth0" && r.timers[.probe] == liveness + .milliseconds(40))
    let confirmed = r.handle(.timerFired(.probe), now: liveness + .milliseconds(40))
    #expect(confirmed.handshakes == ["eth0"] && confirmed.reasons == ["sessionUnknown"])
}

@Test func rejectionFailsWithoutRetries() {
    var r = Reconnector()
    _ = r.handle(.paths([eth0]), now: at(0))
    let out = r.handle(.handshakeFailed(.rejected("unknown key")), now: at(20))
    #expect(out.contains(.reportFailure(.rejected("unknown key"))))
    #expect(r.state == .failed(.rejected("unknown key")) && r.nextDeadline == nil)
    let result10 = r.handle(.paths([eth0, wifi0]), now: at(1000))
    #expect(result10.isEmpty)
    let result11 = r.handle(.wake(sleptFor: .seconds(60)), now: at(61_000))
    #expect(result11.handshakes.isEmpty)
    let retry = r.handle(.reconnectRequested, now: at(70_000))
    #expect(retry.handshakes == ["eth0"] && retry.reasons == ["operatorRequest"])
}

@Test func handshakeTimeoutsBackOffWithinTheBudget() {
    var r = Reconnector(seed: 7)
    _ = r.handle(.paths([eth0]), now: at(0))
    var now = at(0)
    var attempts = 1
    for _ in 0..<40 {
        guard let due = r.nextDeadline else { break }
        now = due
        let kind = r.timers.first { $0.value == due }!.key
        let out = r.handle(.timerFired(kind), now: now)
        attempts += out.handshakes.count
    }
    #expect(r.state.name == "backing-off" || r.state.name == "connecting")
    // Ten tokens at once, then one per six seconds.
    let allowed = 10 + Int((now - at(0)).nanoseconds / Duration.seconds(6).nanoseconds)
    #expect(attempts <= allowed)
    #expect(attempts >= 5)
}

@Test func budgetExhaustionIsExplained() {
    var config = Config()
    config.ac = .init(burst: 2, refill: .seconds(30), backoffBase: .milliseconds(100), backoffCap: .seconds(1))
    // The session is gone by the time the paths change, so each move needs a handshake and a token.
    config.sessionLifetime = .milliseconds(500)
    var r = connected([eth0, wifi0], config: config)  // one token spent
    _ = r.handle(.paths([wifi0]), now: at(1000))  // second token
    let out = r.handle(.paths([eth0, wifi0]), now: at(1100))
    #expect(out.isEmpty, "the better path waits for its debounce: \(out)")
    let stuck = r.handle(.paths([eth0]), now: at(1200))
    #expect(r.state.name == "backing-off")
    #expect(stuck.reasons.first?.hasPrefix("budgetExhausted(next in ") == true)
}

@Test func shortSleepOnTheSameNetworkOnlyProbes() {
    var r = connected([eth0])
    let sleep = r.handle(.sleep, now: at(1000))
    #expect(sleep.transitions.count == 1 && r.state == .sleeping && r.nextDeadline == nil)
    let wake = r.handle(.wake(sleptFor: .seconds(42)), now: at(43_000))
    #expect(wake.handshakes.isEmpty && wake.rebinds.isEmpty && wake.probes == ["eth0"])
    #expect(wake.reasons == ["wokeAfter(42s)"])
}

@Test func longSleepNeedsAHandshake() {
    var r = connected([eth0])
    _ = r.handle(.sleep, now: at(1000))
    let wake = r.handle(.wake(sleptFor: .seconds(42 * 60)), now: at(1000 + 42 * 60_000))
    #expect(wake.handshakes == ["eth0"])
    #expect(wake.reasons == ["wokeAfter(42m)"])
}

@Test func wakeOnAnotherNetworkRebinds() {
    var r = connected([eth0, wifi0])
    _ = r.handle(.sleep, now: at(1000))
    let result12 = r.handle(.paths([wifi0]), now: at(2000))
    #expect(result12.isEmpty, "paths are noted while asleep, not acted on")
    let wake = r.handle(.wake(sleptFor: .seconds(30)), now: at(31_000))
    #expect(wake.rebinds == ["wifi0"] && wake.handshakes.isEmpty)
}

@Test func powerSourceChangesTheBudget() {
    var r = connected([eth0])
    _ = r.handle(.powerChanged(.battery), now: at(100))
    #expect(r.tokens <= Config().battery.burst)
    #expect(r.power == .battery)
}

@Test func reasonsReadAsTheOperatorExpects() {
    #expect(Reason.betterPath(eth0, over: wifi0).description == "betterPath(eth0 metric 100 < wifi0 600)")
    #expect(Reason.probeTimeout(3, of: 3).description == "probeTimeout(3 of 3)")
    #expect(Reason.wokeAfter(.seconds(42 * 60)).description == "wokeAfter(42m)")
    #expect(Reason.budgetExhausted(nextIn: .seconds(32)).description == "budgetExhausted(next in 32s)")
    #expect(Duration.milliseconds(1500).short == "1.5s")
    #expect(Duration.seconds(5400).short == "1h30m")
    #expect(Duration.milliseconds(250).short == "250ms")
    #expect(Instant(nanoseconds: 12_300_000_000).description == "12.300")
}

@Test func transitionsFormatAsLogfmtAndJSON() {
    var r = Reconnector()
    let t = r.handle(.paths([eth0]), now: at(0)).transitions[0]
    #expect(t.logfmt == "t=0.000 from=offline to=connecting trigger=paths reason=pathAppeared(eth0) path=eth0/10.20.0.57 attempt=1 coalesced=0")
    #expect(t.json.hasPrefix("{\"t\":0.000,\"from\":\"offline\",\"to\":\"connecting\""))
}

@Test func pluggingInShortensABatteryBackoff() {
    var config = Config()
    config.battery.backoffBase = .seconds(300)  // the first battery step is already the cap
    var r = Reconnector(config: config, power: .battery, seed: 3)
    _ = r.handle(.paths([eth0]), now: at(0))
    _ = r.handle(.timerFired(.handshake), now: at(5000))
    #expect(r.state.name == "backing-off")
    let drawn = r.timers[.retry]!
    let plugged = r.handle(.powerChanged(.ac), now: at(6000))
    let redrawn = r.timers[.retry]!
    #expect(redrawn <= at(6000) + config.ac.backoffBase, "one failure on mains waits at most one base step")
    #expect(redrawn <= drawn)
    #expect(plugged.isEmpty, "a new wait is the only change")
}

@Test func serverMovedProvesALiveSessionWithAProbe() {
    var r = connected([eth0, wifi0])
    let out = r.handle(.serverMoved, now: at(1000))
    #expect(out.probes == ["eth0"] && out.handshakes.isEmpty && out.rebinds.isEmpty)
    #expect(out.reasons == ["serverAddressChanged"] && r.state == .probing(eth0, sent: 1))
    _ = r.handle(.probeReply(on: eth0.id, rtt: .milliseconds(20)), now: at(1020))
    #expect(r.state == .connected(eth0))
}

@Test func serverMovedEndsABackoffAndForgetsDeadPaths() {
    var r = Reconnector()
    _ = r.handle(.paths([eth0, wifi0]), now: at(0))
    _ = r.handle(.timerFired(.handshake), now: at(5000))  // eth0 failed: dead for a while
    _ = r.handle(.timerFired(.handshake), now: at(10_000))  // wifi0 too: backing off
    guard case .backingOff = r.state, let retry = r.timers[.retry] else { Issue.record("expected a backoff, got \(r.state)"); return }
    #expect(retry > at(10_010))
    let moved = r.handle(.serverMoved, now: at(10_010))
    #expect(moved.handshakes == ["eth0"], "a new address is a new chance, on the best path: its failure was towards the old address")
    #expect(moved.reasons == ["serverAddressChanged"] && r.timers[.retry] == nil)
}

@Test func serverMovedDuringAHandshakeStartsItAgain() {
    var r = Reconnector()
    _ = r.handle(.paths([eth0]), now: at(0))
    let out = r.handle(.serverMoved, now: at(100))
    #expect(out.handshakes == ["eth0"] && out.reasons == ["serverAddressChanged"])
    #expect(r.timers[.handshake] == at(5100), "a full timeout for the new initiation")
}

@Test func serverMovedWhileOfflineOrAsleepWaits() {
    var offline = Reconnector()
    #expect(offline.handle(.serverMoved, now: at(0)).isEmpty)
    var asleep = connected([eth0])
    _ = asleep.handle(.sleep, now: at(100))
    #expect(asleep.handle(.serverMoved, now: at(200)).isEmpty && asleep.state == .sleeping)
}

/// Off a path that is gone, with the session alive, the move is forced: no token, no handshake,
/// however empty the budget.
@Test func aForcedMoveWithALiveSessionSpendsNoToken() {
    var config = Config()
    config.ac = .init(burst: 1, refill: .seconds(30), backoffBase: .milliseconds(100), backoffCap: .seconds(1))
    var r = connected([eth0, wifi0], config: config)  // the only token spent
    #expect(r.tokens == 0)
    let out = r.handle(.paths([wifi0]), now: at(1000))
    #expect(out.rebinds == ["wifi0"] && out.probes == ["wifi0"] && out.handshakes.isEmpty, "\(out)")
    #expect(r.state == .probing(wifi0, sent: 1))
}

@Test func operatorDownEndsTheSessionAndHoldsWhateverHappens() {
    var r = connected([eth0, wifi0])
    _ = r.handle(.dataSent, now: at(1000))  // a liveness timer is armed
    let down = r.handle(.pause, now: at(1100))
    #expect(down.contains(.disconnect) && down.reasons == ["operatorDown"])
    #expect(r.state == .paused && r.nextDeadline == nil, "down keeps no timer")
    var later: [Effect] = []
    later += r.handle(.paths([wifi0]), now: at(2000))
    later += r.handle(.paths([wifi0, eth0]), now: at(3000))
    later += r.handle(.reconnectRequested, now: at(4000))
    later += r.handle(.sleep, now: at(5000))
    later += r.handle(.wake(sleptFor: .seconds(60)), now: at(65_000))
    later += r.handle(.dataSent, now: at(66_000))
    later += r.handle(.handshakeFailed(.sessionUnknown), now: at(67_000))
    later += r.handle(.serverMoved, now: at(68_000))
    later += r.handle(.handshakeSucceeded(rtt: .milliseconds(20)), now: at(69_000))  // one that was in flight
    #expect(later.isEmpty, "nothing brings a paused tunnel up but the operator: \(later)")
    #expect(r.state == .paused)
    let again = r.handle(.pause, now: at(70_000))
    #expect(again.isEmpty)
}

@Test func operatorUpHandshakesAtOnceOnTheBestPathWithoutWaitingForTheBackoff() {
    var r = Reconnector(config: Config(), seed: 3)
    _ = r.handle(.paths([wifi0]), now: at(0))
    // Time out until the machine backs off.
    var now = at(0)
    for _ in 0..<40 {
        guard let due = r.nextDeadline else { break }
        now = due
        _ = r.handle(.timerFired(r.timers.first { $0.value == due }!.key), now: now)
        if case .backingOff = r.state { break }
    }
    #expect(r.state.name == "backing-off" && r.nextDeadline != nil)
    _ = r.handle(.pause, now: now + .seconds(1))
    _ = r.handle(.paths([eth0, wifi0]), now: now + .seconds(2))
    let up = r.handle(.resume, now: now + .seconds(3))
    #expect(up.handshakes == ["eth0"] && up.reasons.first == "operatorUp")
    #expect(r.state == .connecting(eth0))
    _ = r.handle(.handshakeSucceeded(rtt: .milliseconds(5)), now: now + .seconds(3) + .milliseconds(5))
    #expect(r.state == .connected(eth0))
}

@Test func operatorUpWithoutAPathWaitsOfflineAndUpWhenNotDownDoesNothing() {
    var r = connected([eth0])
    let idle = r.handle(.resume, now: at(500))
    #expect(idle.isEmpty && r.state == .connected(eth0))
    _ = r.handle(.pause, now: at(1000))
    _ = r.handle(.paths([]), now: at(2000))
    let up = r.handle(.resume, now: at(3000))
    #expect(r.state == .offline && up.reasons == ["operatorUp"] && up.handshakes.isEmpty)
    let back = r.handle(.paths([wifi0]), now: at(4000))
    #expect(back.handshakes == ["wifi0"])
}
