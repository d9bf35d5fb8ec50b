/// A desktop notification the app raises: only for what needs the user, never for a routine roam.
public enum Alert: Equatable, Sendable {
    /// The network holds everything back until someone logs in to its captive portal.
    case portalLogin(interface: String?)
    /// The tunnel cannot connect without help (credentials refused): why.
    case tunnelFailed(why: String?)
    /// The agent stopped on its own: why.
    case agentGaveUp(why: String)
    /// The lockdown is stopping traffic while no tunnel carries it.
    case blockedWithoutTunnel(paused: Bool)

    public var title: String {
        switch self {
        case .portalLogin: "This network needs a login"
        case .tunnelFailed: "Roam cannot connect"
        case .agentGaveUp: "Roam stopped"
        case .blockedWithoutTunnel: "Traffic is blocked"
        }
    }

    public var body: String {
        switch self {
        case .portalLogin(let interface):
            "Log in to the network" + (interface.map { " on \($0)" } ?? "") + "; the tunnel connects right after."
        case .tunnelFailed(let why): "It stopped trying" + (why.map { ": \($0)" } ?? ".")
        case .agentGaveUp(let why): "The agent gave up: \(why)"
        case .blockedWithoutTunnel(let paused):
            paused ? "The tunnel is off and the lockdown keeps traffic in. Turn the tunnel on to reach the network."
                : "No tunnel is up, and the lockdown keeps traffic in until one is."
        }
    }

    /// A symbolic icon the package installs (as the tray's).
    public var icon: String {
        if case .agentGaveUp = self { "roam-off-symbolic" } else { "roam-attention-symbolic" }
    }

    /// The notification's buttons: an action key (a `MenuAction`'s) and its label.
    public var actions: [(key: String, label: String)] {
        switch self {
        case .portalLogin: [(MenuAction.logIn.rawValue, "Log in")]
        case .blockedWithoutTunnel(paused: true): [(MenuAction.connect.rawValue, "Connect")]
        default: []
        }
    }

    /// Whether another alert is the same news (a portal on another interface is the same login).
    func isSameNews(as other: Alert) -> Bool {
        switch (self, other) {
        case (.portalLogin, .portalLogin), (.tunnelFailed, .tunnelFailed), (.agentGaveUp, .agentGaveUp),
             (.blockedWithoutTunnel, .blockedWithoutTunnel): true
        default: false
        }
    }

    /// The alert a report calls for, given the one before: nil when nothing needs the user.
    /// Traffic blocked raises one only once the lockdown's counters grew while no tunnel was up,
    /// and stays while that lasts.
    public static func called(for report: AgentReport, after previous: AgentReport?, showing: Alert?) -> Alert? {
        if report.gaveUp, case .stopped(let why) = report { return .agentGaveUp(why: why) }
        // An agent that gave up is gone next: what was said of it still holds.
        if case .unreachable = report, case .agentGaveUp? = showing { return showing }
        guard case .status(let status) = report else { return nil }
        switch status.state {
        case .portal: return .portalLogin(interface: status.path?.interface)
        case .failed: return .tunnelFailed(why: status.lastReason)
        default: break
        }
        guard status.lockdown.enabled, status.lockdown.openOn == nil, !status.state.carriesTraffic else { return nil }
        let alert = Alert.blockedWithoutTunnel(paused: status.state == .paused)
        if let showing, showing.isSameNews(as: alert) { return alert }
        guard case .status(let before) = previous, status.lockdown.blocked > before.lockdown.blocked else { return nil }
        return alert
    }
}

/// What to do with the one notification slot: the app keeps at most one notification, replaced
/// as the news changes, so a flapping network never leaves a pile.
public enum AlertChange: Equatable, Sendable {
    /// Nothing new: leave the slot as it is.
    case keep
    /// Show this alert in the slot (replacing what is there).
    case show(Alert)
    /// Take the notification in the slot away: what it said is over.
    case withdraw

    /// The change from what the slot shows to what `report` calls for.
    public static func between(showing: Alert?, report: AgentReport, previous: AgentReport?) -> AlertChange {
        let wanted = Alert.called(for: report, after: previous, showing: showing)
        switch (showing, wanted) {
        case (nil, nil): return .keep
        case (_?, nil): return .withdraw
        case (let shown?, let wanted?) where shown == wanted: return .keep
        case (_, let wanted?): return .show(wanted)
        }
    }
}
