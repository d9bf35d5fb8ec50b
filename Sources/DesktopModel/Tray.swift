/// What the tray shows: an icon by state, a tooltip, and a flat menu.
public struct TrayView: Equatable, Sendable {
    /// A symbolic icon of the state, one of those the package installs in the hicolor theme
    /// (contrib/desktop/icons).
    public var icon: String
    public var tooltip: String
    public var items: [MenuItem]

    public init(report: AgentReport) {
        guard case .status(let status) = report else {
            icon = "roam-off-symbolic"
            tooltip = "Roam: not running"
            items = [MenuItem("Connect", .connect, enabled: false), MenuItem("Open Roam", .open), MenuItem("Quit", .quit)]
            return
        }
        icon = Self.icon(for: status.state)
        tooltip = "Roam: " + DetailsView.words(for: status.state)
            + (status.state.carriesTraffic ? status.server.map { " to \($0.name)" } ?? "" : "")
        var items: [MenuItem] = []
        if status.state == .portal { items.append(MenuItem("Log in to the network", .logIn)) }
        items.append(status.state == .paused ? MenuItem("Connect", .connect) : MenuItem("Disconnect", .disconnect))
        // The Profiles section: a title, then each profile; the one in use is marked and does nothing.
        if let profiles = status.profiles, !profiles.isEmpty {
            items.append(MenuItem("Profiles", .heading, enabled: false))
            items += profiles.map { name in
                name == status.profile ? MenuItem("\(name) (in use)", .useProfile, enabled: false, profile: name)
                    : MenuItem(name, .useProfile, profile: name)
            }
        }
        items += [MenuItem("Open Roam", .open), MenuItem("Quit", .quit)]
        self.items = items
    }

    /// Every icon the tray and the notifications may name; the package installs each.
    public static let icons = ["roam-connected-symbolic", "roam-connecting-symbolic", "roam-attention-symbolic", "roam-off-symbolic"]

    static func icon(for state: TunnelState) -> String {
        switch state {
        case .connected, .probing, .switching: "roam-connected-symbolic"
        case .connecting, .backingOff: "roam-connecting-symbolic"
        case .portal, .failed: "roam-attention-symbolic"
        case .offline, .sleeping, .paused, .disconnected, .other: "roam-off-symbolic"
        }
    }
}

/// One entry of the tray's menu.
public struct MenuItem: Equatable, Sendable {
    public var label: String
    public var action: MenuAction
    public var enabled: Bool
    /// The profile `useProfile` switches to.
    public var profile: String?

    public init(_ label: String, _ action: MenuAction, enabled: Bool = true, profile: String? = nil) {
        self.label = label
        self.action = action
        self.enabled = enabled
        self.profile = profile
    }
}

/// What choosing a menu entry does.
public enum MenuAction: String, Sendable {
    /// Ask the agent for `up`.
    case connect
    /// Ask the agent for `down`.
    case disconnect
    /// Open the portal's login page in the portal window.
    case logIn = "log-in"
    /// Ask the agent to run the entry's profile (`use-profile`).
    case useProfile = "use-profile"
    /// A section's title: nothing.
    case heading
    /// Show the window.
    case open
    /// End the app (the agent goes on).
    case quit
}
