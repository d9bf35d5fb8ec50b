import ControlWire
@testable import DesktopModel
import Testing

@Suite struct AgentStatusTests {
    @Test func readsTheFieldsTheDetailsShow() throws {
        let status = try Statuses.status(Statuses.connected)
        #expect(status.state == .connected)
        #expect(status.server == AgentStatus.Server(name: "fra1", address: "198.51.100.7:51820", handoverTo: nil))
        #expect(status.path == AgentStatus.PathInfo(interface: "eth0", kind: "ethernet", source: "10.31.2.2", transport: "udp"))
        #expect(status.roundTripMs == 1.051)
        #expect(status.session == AgentStatus.SessionInfo(protocolVersion: 3, cipher: "aes-256-gcm"))
        #expect(status.since == "2026-11-23T18:05:17Z")
        #expect(status.lastReason == "switched(eth0 rtt 1ms)")
        #expect(status.lockdown == AgentStatus.Lockdown(enabled: true, blocked: 13))
        #expect(status.excluded == [AgentStatus.ExcludedProcess(pid: 4242, name: "steam")])
        #expect(status.portal == nil && status.onDemand == nil)
    }

    @Test func readsThePortalTheOnDemandRuleAndTheRetry() throws {
        let portal = try Statuses.status(Statuses.portal)
        #expect(portal.portal == AgentStatus.Portal(url: "https://login.hotel.example/", windowMs: 291000))
        #expect(portal.roundTripMs == nil && portal.session == nil)
        let disconnected = try Statuses.status(Statuses.disconnected)
        #expect(disconnected.onDemand == AgentStatus.OnDemand(rule: "home", lockdownLifted: true))
        #expect(disconnected.lockdown.openOn == "wifi0")
        #expect(disconnected.path == nil)
        #expect(try Statuses.status(Statuses.backingOff).nextRetryMs == 4000)
    }

    @Test func refusesAGatewaysStatusAndOneWithoutAState() throws {
        #expect(throws: StatusError.notAClient(role: "server")) { try Statuses.status(Statuses.server) }
        #expect(throws: StatusError.noState) { try AgentStatus(status: try JSON.parse(#"{"role":"client"}"#)) }
        #expect(throws: StatusError.notAStatus) { try AgentStatus(answer: try JSON.parse(#"{"version":1,"ok":true}"#)) }
    }

    @Test func keepsAStateItDoesNotKnow() throws {
        let status = try AgentStatus(status: try JSON.parse(#"{"role":"client","state":"hibernating"}"#))
        #expect(status.state == .other("hibernating"))
        #expect(DetailsView.words(for: status.state) == "hibernating")
    }

    @Test func readsAWatchsLines() throws {
        #expect(try Statuses.report(Statuses.connected) == .status(try Statuses.status(Statuses.connected)))
        let moved = try #require(try AgentReport(line: try Statuses.transition(to: Statuses.probing)))
        #expect(moved == .status(try Statuses.status(Statuses.probing)))
        #expect(try Statuses.report(#"{"version":1,"event":"stopped","why":"credentials rejected"}"#) == .stopped(why: "credentials rejected"))
        #expect(try AgentReport(line: try JSON.parse(#"{"version":1,"event":"something-new"}"#)) == nil)
        #expect(AgentReport.stopped(why: "credentials rejected").gaveUp)
        #expect(!AgentReport.stopped(why: "stopped").gaveUp && !AgentReport.stopped(why: "restarting").gaveUp)
    }
}

@Suite struct ScreenTests {
    func details(_ line: String, profiles: [String] = ["work"]) throws -> DetailsView {
        guard case .details(let details) = Screen(report: try Statuses.report(line), profiles: profiles) else {
            Issue.record("not the Details screen")
            return DetailsView(report: .unreachable(why: ""), profiles: [])
        }
        return details
    }

    func value(_ kind: DetailRow.Kind, in view: DetailsView) -> String? {
        view.rows.first { $0.kind == kind }?.value
    }

    @Test func welcomesWhenNoProfileAndNoAgent() {
        guard case .welcome(let welcome) = Screen(report: .unreachable(why: "no control socket at /run/roam/agent.sock"), profiles: []) else {
            Issue.record("expected the Welcome screen")
            return
        }
        #expect(welcome.detail == "no control socket at /run/roam/agent.sock")
        #expect(welcome.body.contains("import the profile") && welcome.body.contains("roam@NAME"))
    }

    @Test func aProfileWithoutAnAgentShowsNotRunning() {
        guard case .details(let details) = Screen(report: .unreachable(why: "not running"), profiles: ["work"]) else {
            Issue.record("expected the Details screen")
            return
        }
        #expect(details.state == "Not running")
        #expect(!details.switchEnabled && !details.switchOn)
        #expect(details.rows.isEmpty)
    }

    @Test func connectedShowsEveryDetail() throws {
        let view = try details(Statuses.connected)
        #expect(view.state == "Connected")
        #expect(view.stateDetail == "Through fra1.")
        #expect(view.switchOn && view.switchEnabled)
        #expect(view.banner == nil)
        #expect(view.rows.map(\.kind) == [.server, .path, .roundTrip, .session, .since, .lockdown, .excluded])
        #expect(value(.server, in: view) == "fra1 (198.51.100.7:51820)")
        #expect(value(.path, in: view) == "eth0, Ethernet, from 10.31.2.2")
        #expect(value(.roundTrip, in: view) == "1.05 ms")
        #expect(value(.session, in: view) == "Version 3, aes-256-gcm")
        #expect(value(.since, in: view) == "2026-11-23 18:05:17 UTC")
        #expect(value(.lockdown, in: view) == "On, 13 stopped so far")
        #expect(value(.excluded, in: view) == "steam (4242)")
        // The agent's list, not the directory's; the one it runs marked, the other to switch to.
        #expect(view.choices == [ProfileChoice(name: "home", inUse: false), ProfileChoice(name: "work", inUse: true)])
        #expect(view.choices.map(\.button) == ["Use", nil] && view.choices[0].buttonDescription == "Use home")
        #expect(view.choices.map(\.subtitle) == ["Installed", "In use"])
    }

    /// An agent that does not name its profiles: the app's own listing stands in.
    @Test func anOlderAgentsProfilesAreTheDirectorys() throws {
        let view = try details(Statuses.connectedOlder, profiles: ["work"])
        #expect(view.choices == [ProfileChoice(name: "work", inUse: false)])
        #expect(try Statuses.status(Statuses.connectedOlder).ssid == nil)
    }

    @Test func wifiAndALongerRoundTrip() throws {
        let view = try details(Statuses.connectedOnWifi)
        #expect(value(.path, in: view) == "wifi0, Wi-Fi “Hotel \"Lobby\"”, from 10.31.1.2")
        #expect(value(.roundTrip, in: view) == "23 ms")
    }

    @Test func pausedIsTheSwitchOffWithTheLockdownSaid() throws {
        let view = try details(Statuses.paused)
        #expect(view.state == "Off")
        #expect(!view.switchOn && view.switchEnabled)
        #expect(view.stateDetail == "The lockdown still blocks traffic outside the tunnel.")
        #expect(value(.path, in: view) == "None")
        #expect(value(.roundTrip, in: view) == "Not measured yet")
        #expect(value(.session, in: view) == nil)
    }

    @Test func aPortalShowsTheBanner() throws {
        let view = try details(Statuses.portal)
        #expect(view.state == "This network needs a login")
        #expect(view.switchOn)
        #expect(view.banner == PortalBanner(url: "https://login.hotel.example/", interface: "wifi0"))
        #expect(view.banner?.text == "The network on wifi0 needs a login before the tunnel can connect.")
        let named = try details(Statuses.client(state: "portal", path: Statuses.wifi, rtt: "null", session: "null", ssid: "Hotel Lobby"))
        #expect(named.banner?.text == "The Wi-Fi network “Hotel Lobby” needs a login before the tunnel can connect.")
        #expect(view.stateDetail == "Login page: https://login.hotel.example/")
    }

    @Test func theOnDemandRuleAndWhy() throws {
        let view = try details(Statuses.disconnected)
        #expect(view.state == "Off on this network")
        #expect(view.stateDetail == "The on-demand rule \"home\" keeps the tunnel down here.")
        #expect(value(.onDemand, in: view) == "\"home\": tunnel down on this network, lockdown lifted")
        #expect(value(.lockdown, in: view) == "On, lifted on wifi0, 1 stopped so far")
        #expect(value(.excluded, in: view) == "None")
    }

    @Test func failuresAndRetriesSayWhyAndWhen() throws {
        #expect(try details(Statuses.failed).stateDetail == "Roam stopped trying: rejected(unknown key)")
        #expect(try details(Statuses.backingOff).stateDetail == "Next attempt in 4 s.")
    }

    @Test(arguments: [(0.0, "a moment"), (4_400, "4 s"), (59_499, "59 s"), (60_000, "1 min"), (3_599_000, "59 min"),
                      (3_600_000, "1 h"), (7_500_000, "2 h 5 min"), (90_000_000, "1 d 1 h"), (-5, "a moment"), (.infinity, "a moment")])
    func spans(ms: Double, words: String) {
        #expect(DetailsView.span(ms: ms) == words)
    }

    @Test func theSwitchAsksUpAndDown() {
        #expect(command(switchingOn: true) == .up)
        #expect(command(switchingOn: false) == .down)
    }
}

@Suite struct TrayTests {
    /// The icons named are the ones the package installs (its test checks each is there).
    @Test func everyIconNamedIsOneThePackageInstalls() {
        let states = ["offline", "connecting", "connected", "probing", "switching", "sleeping", "backing-off", "failed",
                      "paused", "portal", "disconnected", "new-state"].map(TunnelState.init(name:))
        for state in states { #expect(TrayView.icons.contains(TrayView.icon(for: state)), "\(state)") }
        #expect(TrayView.icons.contains(TrayView(report: .unreachable(why: "")).icon))
        let alerts: [Alert] = [.portalLogin(interface: nil), .tunnelFailed(why: nil), .agentGaveUp(why: "x"), .blockedWithoutTunnel(paused: true)]
        for alert in alerts { #expect(TrayView.icons.contains(alert.icon), "\(alert)") }
    }

    @Test func iconAndMenuFollowTheState() throws {
        let connected = TrayView(report: try Statuses.report(Statuses.connected))
        #expect(connected.icon == "roam-connected-symbolic")
        #expect(connected.tooltip == "Roam: Connected to fra1")
        #expect(connected.items.map(\.label) == ["Disconnect", "Profiles", "home", "work (in use)", "Open Roam", "Quit"])
        // The Profiles section: its title and the profile in use do nothing; another switches to itself.
        #expect(connected.items.map(\.enabled) == [true, false, true, false, true, true])
        #expect(connected.items[2] == MenuItem("home", .useProfile, profile: "home"))

        let paused = TrayView(report: try Statuses.report(Statuses.paused))
        #expect(paused.icon == "roam-off-symbolic")
        #expect(paused.items.map(\.action) == [.connect, .heading, .useProfile, .useProfile, .open, .quit])
        #expect(TrayView(report: try Statuses.report(Statuses.connectedOlder)).items.map(\.label) == ["Disconnect", "Open Roam", "Quit"])

        let portal = TrayView(report: try Statuses.report(Statuses.portal))
        #expect(portal.icon == "roam-attention-symbolic")
        #expect(portal.items.first == MenuItem("Log in to the network", .logIn))

        #expect(TrayView(report: try Statuses.report(Statuses.backingOff)).icon == "roam-connecting-symbolic")
        let gone = TrayView(report: .unreachable(why: "not running"))
        #expect(gone.items.first == MenuItem("Connect", .connect, enabled: false))
    }
}
