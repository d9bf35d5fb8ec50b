import Topology
import Basics
import Testing
@testable import Reconnector

/// A core on `paths` whose runner is told what to tell its watchers by `heartbeats`.
private func watchedCore(on paths: [Path], _ heartbeats: Heartbeats) -> AgentCore {
    var model = NetworkModel()
    for change in paths.flatMap(uplink) { model.apply(change) }
    return AgentCore(Reconnector(servers: ["gateway0"]), model: model, servers: [ServerBook.Entry(named: true, addresses: [server])],
                     heartbeats: heartbeats)
}

extension [Effect] {
    var metricsWrites: Int { filter { $0 == .writeMetrics }.count }
}

/// The watchdog is pinged at the interval the runner gives (half the unit's) from the first
/// event on, whatever the session does; without one nothing wakes for it.
@Test func theWatchdogIsPingedAtItsIntervalFromTheStart() {
    var core = watchedCore(on: [eth0], Heartbeats(watchdog: .seconds(15)))
    #expect(core.timers[.watchdog] == nil, "not before the agent starts")
    _ = core.handle(.start, now: at(1_000))
    #expect(core.timers[.watchdog] == at(16_000))
    #expect(core.handle(.timerFired(.watchdog), now: at(15_999)).isEmpty, "not before it is due")
    #expect(core.handle(.timerFired(.watchdog), now: at(16_000)) == [.pingWatchdog])
    #expect(core.timers[.watchdog] == at(31_000) && core.nextDeadline! <= at(31_000))
    var quiet = watchedCore(on: [eth0], Heartbeats())
    _ = quiet.handle(.start, now: at(0))
    #expect(quiet.timers[.watchdog] == nil && quiet.timers[.extendStart] == nil && quiet.timers[.metrics] == nil)
    #expect(!quiet.handle(.start, now: at(0)).contains(.writeMetrics))
}

/// A start still trying asks for more time at once and every 10 s until the agent is ready,
/// then no more.
@Test func aStartStillTryingAsksForMoreTimeUntilReady() {
    var core = watchedCore(on: [eth0], Heartbeats(extendsStart: true))
    let started = core.handle(.start, now: at(0))
    #expect(started.contains(.extendStart(by: Heartbeats.startExtension)) && !started.contains(.ready))
    #expect(core.timers[.extendStart] == at(10_000))
    #expect(core.handle(.timerFired(.extendStart), now: at(10_000)) == [.extendStart(by: .seconds(30))])
    _ = core.handle(.handshakeCompleted(rtt: .milliseconds(20), sizedProbes: false, carriesIPv6: false), now: at(12_000))
    let up = core.handle(.tunnelAttached, now: at(12_000))
    #expect(up.contains(.ready) && core.timers[.extendStart] == nil)
    // With no network there is nothing to wait for: ready at once, and no time asked for.
    var offline = watchedCore(on: [], Heartbeats(extendsStart: true))
    let alone = offline.handle(.start, now: at(0))
    #expect(alone.contains(.ready) && !alone.contains { if case .extendStart = $0 { true } else { false } })
    #expect(offline.timers[.extendStart] == nil)
}

/// The metrics file is written after each event that made a transition, and again every minute
/// while connected; not connected, nothing wakes for it.
@Test func theMetricsFileIsWrittenOnEveryTransitionAndEveryMinuteWhileConnected() {
    var core = watchedCore(on: [eth0], Heartbeats(metricsFile: "/var/lib/roam.prom"))
    let started = core.handle(.start, now: at(0))
    #expect(started.last == .writeMetrics && started.metricsWrites == 1, "connecting is a transition")
    #expect(core.timers[.metrics] == nil, "not connected: no refresh")
    _ = core.handle(.handshakeCompleted(rtt: .milliseconds(20), sizedProbes: false, carriesIPv6: false), now: at(20))
    #expect(core.handle(.tunnelAttached, now: at(20)).metricsWrites == 1)
    #expect(core.timers[.metrics] == at(60_020))
    #expect(core.handle(.timerFired(.metrics), now: at(60_020)) == [.writeMetrics])
    #expect(core.timers[.metrics] == at(120_020))
    // The cable goes: a transition, written, and no refresh while there is no session.
    let lost = core.handle(.network(carrier(eth0, false)), now: at(90_000))
    #expect(lost.metricsWrites == 1 && core.timers[.metrics] == nil)
}

/// A reload that names a metrics file has it written at once; one that names none stops the refresh.
@Test func aReloadThatNamesAMetricsFileWritesItAtOnce() {
    var core = watchedCore(on: [eth0], Heartbeats())
    _ = core.handle(.start, now: at(0))
    _ = core.handle(.handshakeCompleted(rtt: .milliseconds(20), sizedProbes: false, carriesIPv6: false), now: at(20))
    _ = core.handle(.tunnelAttached, now: at(20))
    let named = core.handle(.reloaded(Reload(config: Config(), rules: OnDemandRules(), metricsFile: "/var/lib/roam.prom")), now: at(1_000))
    #expect(named.metricsWrites == 1 && core.timers[.metrics] == at(61_000))
    #expect(core.handle(.reloaded(Reload(config: Config(), rules: OnDemandRules(), metricsFile: "/var/lib/roam.prom")), now: at(2_000))
        .metricsWrites == 0, "the same file: nothing new")
    _ = core.handle(.reloaded(Reload(config: Config(), rules: OnDemandRules())), now: at(3_000))
    #expect(core.timers[.metrics] == nil)
}
