import Topology
import Basics
import PathMonitor
import Testing
@testable import Reconnector

/// A socket the runner could not bind: the session is taken off that path at once, bound again
/// a few times after short waits without a token, then the path is a failed attempt; nothing
/// heard meanwhile proves a path the data plane has no socket on.

/// eth0 after DHCP renumbered it (the new address the kernel may refuse a bind to for a moment).
private let renumbered = Path(linkIndex: eth0.linkIndex, interface: "eth0", kind: .ethernet, source: IPAddress("10.20.0.58")!,
                              gateway: eth0.gateway, metric: eth0.metric, prefixLength: 0, mtu: 1500)

private let refusal = "10.20.0.58 is not an address of this host (any more)"

/// A machine connected on eth0 (with `others` beside it) whose address just changed: it rebinds
/// to the new one and probes it.
private func movedToTheNewAddress(others: [Path] = []) -> Reconnector {
    // No token comes back within the test, so every one spent shows.
    var config = Config()
    config.ac.refill = .seconds(3600)
    var r = connected([eth0] + others, config: config)
    let out = r.handle(.paths([renumbered] + others), now: at(10_000))
    #expect(out.rebinds == ["eth0"] && out.probes == ["eth0"])
    #expect(r.state == .probing(renumbered, sent: 1))
    return r
}

@Test func aRefusedBindTakesTheSessionOffThePathAndBindsAgainWithoutAToken() {
    var r = movedToTheNewAddress()
    let tokens = r.tokens
    let refused = r.handle(.bindFailed(on: renumbered.id, why: refusal), now: at(10_000))
    #expect(refused.reasons == ["bindFailed(eth0 10.20.0.58: \(refusal); again in 250ms)"])
    #expect(r.state == .backingOff(renumbered), "never reported on a path the data plane has no socket on")
    #expect(r.timers == [.rebind: at(10_250)])
    // Data through the socket the session is leaving, or a late echo, proves nothing.
    #expect(r.handle(.dataReceived, now: at(10_100)).isEmpty)
    #expect(r.handle(.probeReply(on: renumbered.id, rtt: .milliseconds(10)), now: at(10_110)).isEmpty)
    #expect(r.state == .backingOff(renumbered))
    // Bound again in the same attempt: the bind, a probe (the keys live), no token spent.
    let again = r.handle(.timerFired(.rebind), now: at(10_250))
    #expect(again.rebinds == ["eth0"] && again.probes == ["eth0"] && again.handshakes.isEmpty)
    #expect(again.reasons == ["retry"])
    #expect(r.state == .probing(renumbered, sent: 1))
    #expect(r.tokens == tokens && r.attempt == 1)
    _ = r.handle(.probeReply(on: renumbered.id, rtt: .milliseconds(10)), now: at(10_260))
    #expect(r.state == .connected(renumbered))
}

@Test func bindsRefusedThreeTimesGiveThePathUpForTheNextOne() {
    var r = movedToTheNewAddress(others: [wifi0])
    let tokens = r.tokens
    var waits: [Duration] = []
    var now = at(10_000)
    var out = r.handle(.bindFailed(on: renumbered.id, why: refusal), now: now)
    while case .backingOff = r.state, let due = r.timers[.rebind] {
        waits.append(due - now)
        now = due
        #expect(r.handle(.timerFired(.rebind), now: now).rebinds == ["eth0"])
        #expect(r.tokens == tokens, "a bind tried again spends no token")
        out = r.handle(.bindFailed(on: renumbered.id, why: refusal), now: now)
    }
    #expect(waits == [.milliseconds(250), .milliseconds(500), .seconds(1)], "bounded, doubling waits")
    #expect(out.reasons == ["bindFailed(eth0 10.20.0.58: \(refusal); path given up)"])
    #expect(out.rebinds == ["wifi0"] && out.probes == ["wifi0"], "the session moves with its keys: no handshake")
    #expect(r.state == .probing(wifi0, sent: 1))
    #expect(r.tokens == tokens - 1, "the move to wifi0 is an attempt like any")
    _ = r.handle(.probeReply(on: wifi0.id, rtt: .milliseconds(30)), now: now + .milliseconds(30))
    #expect(r.state == .connected(wifi0, candidate: renumbered.id))
}

@Test func aRefusedBindOnTheOnlyPathBacksOffWithoutBlamingTheServer() {
    var r = Reconnector(servers: ["gateway0", "gateway1"])
    _ = r.handle(.paths([eth0]), now: at(0))
    _ = r.handle(.handshakeSucceeded(rtt: .milliseconds(20)), now: at(20))
    _ = r.handle(.paths([renumbered]), now: at(10_000))
    var now = at(10_000)
    var all = r.handle(.bindFailed(on: renumbered.id, why: refusal), now: now)
    while let due = r.timers[.rebind] {
        now = due
        all += r.handle(.timerFired(.rebind), now: now)
        all += r.handle(.bindFailed(on: renumbered.id, why: refusal), now: now)
    }
    #expect(!all.contains { if case .useServer = $0 { true } else { false } }, "a refused bind says nothing of the server")
    #expect(r.state == .backingOff(renumbered) && r.timers[.retry] != nil)
    // The next attempt binds again, and gets its own retries.
    let retryAt = r.timers[.retry]!
    let retry = r.handle(.timerFired(.retry), now: retryAt)
    #expect(retry.rebinds == ["eth0"])
    _ = r.handle(.bindFailed(on: renumbered.id, why: refusal), now: retryAt)
    #expect(r.timers[.rebind] == retryAt + .milliseconds(250))
}

@Test func aHandshakeWhoseBindWasRefusedIsRetriedAsAHandshake() {
    var r = Reconnector()
    let first = r.handle(.paths([eth0]), now: at(0))
    #expect(first.binds == 1 && first.handshakes == ["eth0"])
    _ = r.handle(.bindFailed(on: eth0.id, why: "no such address"), now: at(0))
    #expect(r.state == .backingOff(eth0) && r.timers[.handshake] == nil)
    // An answer to a handshake sent before is no session on a socket the data plane has.
    _ = r.handle(.handshakeSucceeded(rtt: .milliseconds(20)), now: at(20))
    #expect(r.state == .backingOff(eth0))
    let again = r.handle(.timerFired(.rebind), now: at(250))
    #expect(again.rebinds == ["eth0"] && again.handshakes == ["eth0"])
    #expect(r.state == .connecting(eth0))
}

@Test func aBetterPathThatCannotBeBoundLeavesTheSessionWhereItIs() {
    var r = connected([wifi0])
    _ = r.handle(.paths([eth0, wifi0]), now: at(1_000))
    let switching = r.handle(.timerFired(.debounce), now: r.timers[.debounce]!)
    #expect(switching.probes == ["eth0"] && switching.rebinds.isEmpty)
    let refused = r.handle(.bindFailed(on: eth0.id, why: "no such address"), now: at(5_000))
    #expect(refused.reasons == ["bindFailed(eth0 10.20.0.57: no such address; path given up)"])
    #expect(r.state == .connected(wifi0, candidate: eth0.id))
    #expect(r.handle(.probeReply(on: eth0.id, rtt: .milliseconds(5)), now: at(5_005)).transitions.isEmpty)
}

@Test func aProbeEchoOnAPathWhoseBindFailedProvesNothing() {
    var model = NetworkModel()
    for change in [eth0, wifi0].flatMap(uplink) { model.apply(change) }
    var core = AgentCore(Reconnector(), model: model, servers: [ServerBook.Entry(named: true, addresses: [server])])
    _ = core.handle(.start, now: at(0))
    _ = core.handle(.handshakeCompleted(rtt: .milliseconds(20), sizedProbes: false, carriesIPv6: true), now: at(20))
    _ = core.handle(.tunnelAttached, now: at(20))
    _ = core.handle(.dataSent, now: at(1_000))
    guard let due = core.timers[.liveness] else {
        Issue.record("no liveness timer after data sent: \(core.timers)")
        return
    }
    let probes = core.handle(.timerFired(.liveness), now: due).probeIDs
    #expect(probes.map(\.1) == ["eth0", "wifi0"])
    // The rescue probe's socket could not be had; its echo (a second try that went out) is no rescue.
    _ = core.handle(.bindFailed(wifi0.id, why: "no such address"), now: due)
    #expect(core.handle(.probeEcho(id: probes[1].0, rtt: .milliseconds(25), size: nil), now: due + .milliseconds(25)).isEmpty)
    // The session's own path refused too: its probe's echo does not make it connected.
    _ = core.handle(.bindFailed(eth0.id, why: "no such address"), now: due + .milliseconds(26))
    #expect(core.reconnector.state == .backingOff(eth0))
    _ = core.handle(.probeEcho(id: probes[0].0, rtt: .milliseconds(8), size: nil), now: due + .milliseconds(30))
    #expect(core.reconnector.state == .backingOff(eth0))
}

/// A server whose name gave no address the session may use is passed over while another has
/// one (the session would handshake at none of its addresses), and turned to only when it is
/// the one left.
@Test func aServerWithoutAUsableAddressIsTheLastTurnedTo() {
    func drainedTo(_ addressless: Set<Int>) -> Int? {
        var r = Reconnector(servers: ["primary", "inner", "backup"])
        _ = r.handle(.serversWithoutAddress(addressless), now: at(0))
        _ = r.handle(.paths([eth0]), now: at(0))
        _ = r.handle(.handshakeSucceeded(rtt: .milliseconds(20)), now: at(20))
        let out = r.handle(.serverDraining, now: at(1_000))
        return out.compactMap { if case .prepareHandover(let server, _, _) = $0 { server } else { nil } }.first
    }
    #expect(drainedTo([]) == 1)
    #expect(drainedTo([1]) == 2, "backup, not inner")
    #expect(drainedTo([1, 2]) == 1, "none has one: the list's order")
}
