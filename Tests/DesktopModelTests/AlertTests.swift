@testable import DesktopModel
import Testing

/// Which notification a change between two reports raises, through the one slot the app keeps.
@Suite struct AlertTests {
    /// Feeds the reports in order through the slot, as the app does; returns every change that
    /// was not `keep`, and what the slot shows at the end.
    func run(_ lines: [String]) throws -> (changes: [AlertChange], showing: Alert?) {
        try run(lines.map(Statuses.report))
    }

    func run(_ reports: [AgentReport]) throws -> (changes: [AlertChange], showing: Alert?) {
        var showing: Alert?
        var previous: AgentReport?
        var changes: [AlertChange] = []
        for report in reports {
            let change = AlertChange.between(showing: showing, report: report, previous: previous)
            switch change {
            case .keep: break
            case .show(let alert): showing = alert
            case .withdraw: showing = nil
            }
            if change != .keep { changes.append(change) }
            previous = report
        }
        return (changes, showing)
    }

    @Test func routineRoamsRaiseNothing() throws {
        let result = try run([Statuses.connected, Statuses.probing, Statuses.connectedOnWifi, Statuses.probing, Statuses.connected])
        #expect(result.changes.isEmpty)
    }

    @Test func aPortalRaisesOneLoginWithItsActionAndItGoesOnceConnected() throws {
        let result = try run([Statuses.connected, Statuses.portal, Statuses.portal, Statuses.portal, Statuses.connected])
        #expect(result.changes == [.show(.portalLogin(interface: "wifi0")), .withdraw])
        let alert = Alert.portalLogin(interface: "wifi0")
        #expect(alert.actions.map(\.key) == ["log-in"])
        #expect(alert.actions.map(\.label) == ["Log in"])
        #expect(alert.title == "This network needs a login")
    }

    @Test func aFailureReplacesTheLoginInTheSameSlot() throws {
        let result = try run([Statuses.portal, Statuses.failed])
        #expect(result.changes == [.show(.portalLogin(interface: "wifi0")), .show(.tunnelFailed(why: "rejected(unknown key)"))])
        #expect(result.showing == .tunnelFailed(why: "rejected(unknown key)"))
    }

    @Test func anAgentThatGaveUpStaysSaidWhileItIsGone() throws {
        let gaveUp = AgentReport.stopped(why: "no server answered within 5m")
        let result = try run([try Statuses.report(Statuses.backingOff), gaveUp, .unreachable(why: "no control socket")])
        #expect(result.changes == [.show(.agentGaveUp(why: "no server answered within 5m"))])
        #expect(try run([.stopped(why: "stopped"), .unreachable(why: "gone")]).changes.isEmpty)
    }

    @Test func theLockdownBlockingWithoutATunnelIsSaidOnceWhenItBlocks() throws {
        // Paused with the lockdown: nothing while nothing is blocked; one alert once something
        // is; no second one as the counter goes on growing; gone when the tunnel is back.
        let result = try run([Statuses.connected, Statuses.pausedBlocking(12), Statuses.pausedBlocking(12),
                              Statuses.pausedBlocking(30), Statuses.pausedBlocking(31), Statuses.pausedBlocking(31),
                              Statuses.connected])
        #expect(result.changes == [.show(.blockedWithoutTunnel(paused: true)), .withdraw])
        #expect(Alert.blockedWithoutTunnel(paused: true).actions.map(\.key) == ["connect"])
    }

    @Test func blockingWhileOfflineTurnsIntoPausedInTheSameSlot() throws {
        let result = try run([Statuses.offlineBlocking(1), Statuses.offlineBlocking(5), Statuses.pausedBlocking(5)])
        #expect(result.changes == [.show(.blockedWithoutTunnel(paused: false)), .show(.blockedWithoutTunnel(paused: true))])
    }

    @Test func aRuleThatLiftedTheLockdownBlocksNothing() throws {
        #expect(try run([Statuses.disconnected, Statuses.disconnected]).changes.isEmpty)
    }

    @Test func aFlappingPortalIsNotAPile() throws {
        let flaps = Array(repeating: [Statuses.portal, Statuses.probing], count: 5).flatMap { $0 }
        let shows = try run(flaps).changes.filter { if case .show = $0 { true } else { false } }
        // Each return of the portal is news, but it replaces the one notification: never two
        // at once, and no alert for the roams between.
        #expect(shows.allSatisfy { $0 == .show(.portalLogin(interface: "wifi0")) })
        #expect(try run(flaps).changes.count == 10)
    }
}
