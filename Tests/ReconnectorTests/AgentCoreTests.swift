import PathMonitor
import Testing
@testable import Reconnector

extension [Effect] {
    var probeIDs: [(UInt64, String, Int?)] {
        compactMap { if case .probe(let id, let p, let size) = $0 { (id, p.interface, size) } else { nil } }
    }
    var gaveUp: GiveUp? { lazy.compactMap { if case .giveUp(let why) = $0 { why } else { nil } }.first }
    var readies: Int { filter { $0 == .ready }.count }
}

/// A core connected on `paths.first` at 20 ms.
private func connectedCore(_ paths: [Path], wait: Duration? = .seconds(30)) -> AgentCore {
    var core = AgentCore(Reconnector(), startupWait: wait)
    _ = core.handle(.paths(paths), now: at(0))
    _ = core.handle(.handshakeCompleted(rtt: .milliseconds(20), sizedProbes: false, carriesIPv6: true), now: at(20))
    return core
}

@Test func anEchoCountsOnlyForAProbeInFlightOnItsOwnPath() {
    var core = connectedCore([eth0, wifi0])
    // Silence: the liveness timer probes the session's path and the best other one.
    _ = core.handle(.dataSent, now: at(1_000))
    let due = core.timers[.liveness]!
    let out = core.handle(.timerFired(.liveness), now: due)
    let probes = out.probeIDs
    #expect(probes.map(\.1) == ["eth0", "wifi0"])
    #expect(Set(probes.map(\.0)).count == 2)
    // An id never sent proves nothing.
    #expect(core.handle(.probeEcho(id: 999, rtt: .milliseconds(5), size: nil), now: due + .milliseconds(5)).isEmpty)
    #expect(core.machine.state.name == "probing")
    // wifi0's echo: the session's own path stays suspect, wifi0 is known to work.
    let wifiEcho = probes.first { $0.1 == "wifi0" }!.0
    _ = core.handle(.probeEcho(id: wifiEcho, rtt: .milliseconds(25), size: nil), now: due + .milliseconds(25))
    #expect(core.machine.state.name == "probing")
    // The same echo twice counts once; eth0's own echo ends the suspicion.
    #expect(core.handle(.probeEcho(id: wifiEcho, rtt: .milliseconds(25), size: nil), now: due + .milliseconds(26)).isEmpty)
    let ethEcho = probes.first { $0.1 == "eth0" }!.0
    _ = core.handle(.probeEcho(id: ethEcho, rtt: .milliseconds(8), size: nil), now: due + .milliseconds(30))
    #expect(core.machine.state == .connected(eth0))
}

@Test func aSizeProbeEchoedShortProvesNothing() {
    var core = AgentCore(Reconnector(), startupWait: nil)
    _ = core.handle(.paths([eth0]), now: at(0))
    let out = core.handle(.handshakeCompleted(rtt: .milliseconds(20), sizedProbes: true, carriesIPv6: true), now: at(20))
    guard let (id, _, size) = out.probeIDs.first(where: { $0.2 != nil }), let size else {
        Issue.record("no size probe after a handshake with a server that echoes sizes: \(out)")
        return
    }
    let mtuBefore = core.machine.tunnelMTU
    // Echoed 100 bytes short: no proof the path carries the size.
    _ = core.handle(.probeEcho(id: id, rtt: .milliseconds(20), size: size - 100), now: at(45))
    // The id is spent either way: the right size later is no longer an answer.
    #expect(core.handle(.probeEcho(id: id, rtt: .milliseconds(20), size: size), now: at(46)).isEmpty)
    #expect(core.machine.tunnelMTU <= mtuBefore)
}

@Test func theAgentGivesUpOnlyAfterTheWaitOnAUsablePath() {
    var core = AgentCore(Reconnector(), startupWait: .seconds(30))
    #expect(core.handle(.paths([]), now: at(0)).readies == 1)  // no network: nothing to wait for
    #expect(core.timers[.startup] == nil)
    // A path: attempts start the wait.
    _ = core.handle(.paths([eth0]), now: at(5_000))
    #expect(core.timers[.startup] == at(35_000))
    // Too early: nothing.
    #expect(core.handle(.timerFired(.startup), now: at(34_000)).gaveUp == nil)
    // The network goes and comes back: the time without a path did not count.
    _ = core.handle(.paths([]), now: at(20_000))
    #expect(core.timers[.startup] == nil)
    _ = core.handle(.paths([eth0]), now: at(40_000))
    let due = core.timers[.startup]!
    #expect(due == at(70_000))
    // A suspend does not count either.
    _ = core.handle(.sleep, now: at(50_000))
    _ = core.handle(.wake(sleptFor: .seconds(10)), now: at(60_000))
    let later = core.timers[.startup]!
    #expect(later >= at(90_000))
    let out = core.handle(.timerFired(.startup), now: later)
    #expect(out == [.giveUp(.noAnswer(after: .seconds(30), interface: core.machine.state.path?.interface))])
    // Gave up: nothing more is decided, and nothing wakes the runner.
    #expect(core.stopped && core.timers.isEmpty && core.nextDeadline == nil)
    #expect(core.handle(.paths([eth0, wifi0]), now: at(100_000)).isEmpty)
}

@Test func onceTheTunnelCameUpTheAgentNeverGivesUp() {
    var core = connectedCore([eth0])
    #expect(core.tunnelUp && core.timers[.startup] == nil)
    // The server goes silent for an hour: retries, no give-up.
    _ = core.handle(.dataSent, now: at(1_000))
    var now = at(1_000)
    for _ in 0..<200 {
        guard let (kind, due) = core.timers.min(by: { $0.value < $1.value }), due < at(3_600_000) else { break }
        now = due
        #expect(core.handle(.timerFired(kind), now: now).gaveUp == nil)
    }
    #expect(now > at(60_000))
    // A refusal now is the server's word on a later handshake: the machine fails, the agent stays.
    #expect(core.handle(.handshakeRejected, now: now).gaveUp == nil)
}

@Test func aRefusalBeforeTheTunnelCameUpEndsTheAgent() {
    var core = AgentCore(Reconnector(), startupWait: nil)
    _ = core.handle(.paths([eth0]), now: at(0))
    #expect(core.handle(.handshakeRejected, now: at(20)) == [.giveUp(.rejected)])
    #expect(core.stopped)
}

@Test func readyIsToldOnceAndNotBehindADeadServer() {
    var core = AgentCore(Reconnector(), startupWait: .seconds(30))
    #expect(core.handle(.paths([eth0]), now: at(0)).readies == 0)
    #expect(core.handle(.handshakeCompleted(rtt: .milliseconds(20), sizedProbes: false, carriesIPv6: true), now: at(20)).readies == 1)
    #expect(core.handle(.paths([]), now: at(1_000)).readies == 0)
}

@Test func afterTheStopNothingIsDecided() {
    var core = connectedCore([eth0, wifi0])
    #expect(core.handle(.request(.stop), now: at(100)).isEmpty)
    #expect(core.handle(.wake(sleptFor: .seconds(5)), now: at(200)).isEmpty)
    #expect(core.handle(.paths([wifi0]), now: at(300)).isEmpty)
    #expect(core.machine.state == .connected(eth0))
}
