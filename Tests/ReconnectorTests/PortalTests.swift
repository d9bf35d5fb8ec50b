import Topology
import Basics
import PathMonitor
import Testing
@testable import Reconnector

extension [Effect] {
    var checks: [String] { compactMap { if case .checkConnectivity(let p) = $0 { p.interface } else { nil } } }
    var windowOpened: Bool { contains { if case .openPortalWindow = $0 { true } else { false } } }
    var windowClosed: Bool { contains(.closePortalWindow) }
}

/// A machine whose only path's first handshake went unanswered: backing off, its check out.
func unanswered(_ path: Path = wifi0, config: Config = Config()) -> (Reconnector, [Effect]) {
    var r = Reconnector(config: config)
    _ = r.handle(.paths([path]), now: at(0))
    let out = r.handle(.timerFired(.handshake), now: at(5000))
    return (r, out)
}

/// A machine behind a portal on wifi0 since 5.03 s.
func behindPortal(config: Config = Config()) -> Reconnector {
    var (r, _) = unanswered(config: config)
    _ = r.handle(.connectivity(.portal(url: "http://login.example/"), on: wifi0.id), now: at(5030))
    return r
}

@Test func unansweredHandshakesOnADefaultRouteBringOneCheck() {
    let (r, out) = unanswered()
    #expect(out.checks == ["wifi0"])
    #expect(r.state == .backingOff(wifi0) && r.connectivityChecks == 1)
}

@Test(arguments: [
    // (prefix length of the route to the server, check enabled, checks expected)
    (0, true, 1), (24, true, 0), (0, false, 0),
])
func whenAPortalIsLookedFor(prefixLength: Int, enabled: Bool, expected: Int) {
    var path = wifi0
    path.prefixLength = prefixLength
    var config = Config()
    config.portalCheck = enabled
    let (_, out) = unanswered(path, config: config)
    #expect(out.checks.count == expected)
}

@Test func oneCheckAtATimeWhateverFails() {
    var (r, _) = unanswered()
    // The retry fails too before the first check answered: no second check.
    let retry = r.handle(.timerFired(.retry), now: r.timers[.retry]!)
    #expect(retry.handshakes == ["wifi0"])
    let failed = r.handle(.timerFired(.handshake), now: r.timers[.handshake]!)
    #expect(failed.checks.isEmpty && r.connectivityChecks == 1)
}

@Test func aPortalStopsEveryAttemptAndRechecksBackOff() {
    var r = behindPortal()
    #expect(r.state == .portal(wifi0, url: "http://login.example/"))
    #expect(r.timers[.retry] == nil && r.timers[.handshake] == nil)
    let tokens = r.tokens
    var waits: [Duration] = []
    var last = at(5030)
    for _ in 0..<8 {
        guard let due = r.timers[.recheck] else { Issue.record("no recheck armed"); return }
        waits.append(due - last)
        last = due
        let out = r.handle(.timerFired(.recheck), now: due)
        #expect(out.checks == ["wifi0"] && out.handshakes.isEmpty && out.binds == 0)
        _ = r.handle(.connectivity(.portal(url: "http://login.example/"), on: wifi0.id), now: due + .milliseconds(30))
    }
    #expect(waits == [30, 60, 120, 240, 480, 600, 600, 600].map { .seconds($0) })
    #expect(r.tokens >= tokens, "rechecks spend no reconnect token")
    #expect(r.state.name == "portal")
}

@Test func onBatteryRechecksComeHalfAsOften() {
    var (r, _) = unanswered()
    _ = r.handle(.powerChanged(.battery), now: at(5010))
    _ = r.handle(.connectivity(.portal(url: "http://p/"), on: wifi0.id), now: at(5030))
    #expect(r.timers[.recheck] == at(5030) + .seconds(60))
}

@Test func theCheckPassingBringsTheTunnelUpAtOnce() {
    var r = behindPortal()
    let due = r.timers[.recheck]!
    _ = r.handle(.timerFired(.recheck), now: due)
    let out = r.handle(.connectivity(.online, on: wifi0.id), now: due + .milliseconds(30))
    #expect(out.handshakes == ["wifi0"])
    #expect(out.reasons == ["portalOpened(wifi0)"])
    #expect(r.timers[.recheck] == nil)
}

@Test(arguments: [Connectivity.online, .unknown("no answer in 5s")])
func noPortalKeepsThePlainBackoff(result: Connectivity) {
    var (r, _) = unanswered()
    let retry = r.timers[.retry]
    let out = r.handle(.connectivity(result, on: wifi0.id), now: at(5030))
    #expect(out.transitions.isEmpty && r.state == .backingOff(wifi0) && r.timers[.retry] == retry)
}

@Test func aCheckAboutAPathLeftBehindIsIgnored() {
    var (r, _) = unanswered()
    _ = r.handle(.paths([eth0, wifi0]), now: at(5010))
    let out = r.handle(.connectivity(.portal(url: "http://p/"), on: wifi0.id), now: at(5030))
    #expect(out.transitions.isEmpty && r.state == .connecting(eth0))
}

@Test func aPortalWindowOpensOnlyBehindAPortalAndChecksOften() {
    var (r, _) = unanswered()
    let refused = r.handle(.openPortalWindow, now: at(5010))
    #expect(!refused.windowOpened && r.portalWindowUntil == nil)
    r = behindPortal()
    let out = r.handle(.openPortalWindow, now: at(6000))
    #expect(out.windowOpened && out.reasons == ["portalWindowOpened(for 5m)"])
    #expect(r.portalWindowUntil == at(6000) + .seconds(300))
    #expect(r.timers[.recheck] == at(6500))
    let again = r.handle(.openPortalWindow, now: at(6100))
    #expect(!again.windowOpened, "one window at a time")
}

@Test func aPortalWindowClosesWhenItsTimeIsUp() {
    var r = behindPortal()
    _ = r.handle(.openPortalWindow, now: at(6000))
    var now = at(6000)
    while let due = r.timers[.recheck], due < at(6000) + .seconds(300) {
        now = due
        _ = r.handle(.timerFired(.recheck), now: now)
        _ = r.handle(.connectivity(.portal(url: "http://login.example/"), on: wifi0.id), now: now + .milliseconds(5))
    }
    let out = r.handle(.timerFired(.portalWindow), now: at(6000) + .seconds(300))
    #expect(out.windowClosed && out.reasons == ["portalWindowClosed(timed out)"])
    #expect(r.portalWindowUntil == nil && r.state.name == "portal")
    #expect(r.timers[.recheck]! - (at(6000) + .seconds(300)) >= .seconds(30), "back to the slow schedule")
}

@Test func aPortalWindowClosesWhenTheNetworkChangesOrThePortalOpens() {
    var r = behindPortal()
    _ = r.handle(.openPortalWindow, now: at(6000))
    let moved = r.handle(.paths([eth0, wifi0]), now: at(7000))
    #expect(moved.windowClosed && moved.handshakes == ["eth0"] && r.portalWindowUntil == nil)
    #expect(moved.reasons == ["betterPath(eth0 metric 100 < wifi0 600)"])

    r = behindPortal()
    _ = r.handle(.openPortalWindow, now: at(6000))
    _ = r.handle(.timerFired(.recheck), now: at(6500))
    let opened = r.handle(.connectivity(.online, on: wifi0.id), now: at(6510))
    #expect(opened.windowClosed && opened.handshakes == ["wifi0"])

    r = behindPortal()
    _ = r.handle(.openPortalWindow, now: at(6000))
    let slept = r.handle(.sleep, now: at(7000))
    #expect(slept.windowClosed && r.portalWindowUntil == nil)
}

@Test func theWindowsProcessEndingChecksAtOnce() {
    var r = behindPortal()
    _ = r.handle(.openPortalWindow, now: at(6000))
    let out = r.handle(.closePortalWindow, now: at(9000))
    #expect(out.windowClosed && out.checks == ["wifi0"])
    #expect(out.reasons == ["portalWindowClosed(its process ended)"])
}

@Test func anOperatorOrAnotherAddressEndsThePortalWait() {
    var r = behindPortal()
    let asked = r.handle(.reconnectRequested, now: at(8000))
    #expect(asked.handshakes == ["wifi0"])

    r = behindPortal()
    var renewed = wifi0
    renewed.source = IPAddress("192.168.1.77")!
    let out = r.handle(.paths([renewed]), now: at(8000))
    #expect(out.handshakes == ["wifi0"] && r.state == .connecting(renewed))

    r = behindPortal()
    let same = r.handle(.paths([wifi0]), now: at(8000))
    #expect(same.transitions.isEmpty && r.state.name == "portal", "the same network: still behind the portal")
}

@Test func aLateAnswerOnTheSessionsKeysEndsThePortalWait() {
    // A portal that appeared mid-session (its login expired) and let a late echo through.
    var r = connected([wifi0])
    _ = r.handle(.dataSent, now: at(1000))
    var now = at(1000)
    while let due = r.nextDeadline, r.state.name != "backing-off", due < at(60_000) {
        now = due
        _ = r.handle(.timerFired(r.timers.first { $0.value == due }!.key), now: now)
    }
    _ = r.handle(.connectivity(.portal(url: "http://p/"), on: wifi0.id), now: now + .milliseconds(10))
    #expect(r.state.name == "portal")
    _ = r.handle(.dataReceived, now: now + .milliseconds(20))
    #expect(r.state == .connected(wifi0))
}
