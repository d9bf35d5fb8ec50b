public import ControlWire

/// What the app last heard from the agent: its status, that it is gone, or that it said it stops.
public enum AgentReport: Equatable, Sendable {
    /// The agent answered with its status.
    case status(AgentStatus)
    /// Nothing answers at the control socket (`why` says what the client met).
    case unreachable(why: String)
    /// The agent announced it is stopping (a watch's `stopped` event): `stopped` when asked,
    /// `restarting` after a reload, else why it gave up.
    case stopped(why: String)

    /// What a line of the agent's answer or watch says: a `status` answer, a `status` or
    /// `transition` event (each carries the status it led to), or `stopped`; nil for a line that
    /// says nothing the app shows.
    public init?(line: JSON) throws(StatusError) {
        if line["event"]?.string == "stopped" {
            self = .stopped(why: line["why"]?.string ?? "stopped")
            return
        }
        guard line["status"] != nil else { return nil }
        self = .status(try AgentStatus(answer: line))
    }

    /// Whether the agent stopped on its own, not because someone asked or it reloads.
    public var gaveUp: Bool {
        if case .stopped(let why) = self { !["stopped", "restarting"].contains(why) } else { false }
    }
}

/// Which screen the window shows.
public enum Screen: Equatable, Sendable {
    /// No profile on the machine and no agent: how to get started.
    case welcome(WelcomeView)
    /// A profile's tunnel: the switch, the state and the details.
    case details(DetailsView)

    /// The screen for what the agent reported, with the profiles found on the machine (their
    /// names only: the app never reads a profile's contents) and where an import stands.
    public init(report: AgentReport, profiles: [String], importing: ImportStatus? = nil) {
        if case .status = report {
            self = .details(DetailsView(report: report, profiles: profiles))
        } else if profiles.isEmpty {
            self = .welcome(WelcomeView(report: report, importing: importing))
        } else {
            self = .details(DetailsView(report: report, profiles: profiles))
        }
    }
}

/// The Welcome screen's words.
public struct WelcomeView: Equatable, Sendable {
    public var title = "Welcome to Roam"
    public var body: String
    /// What the app met at the socket, for the curious.
    public var detail: String
    public var importButton = "Import a profile…"
    /// Where the import of a profile stands, once one was chosen.
    public var importing: ImportStatus?

    public init(report: AgentReport, importing: ImportStatus? = nil) {
        body = "Roam keeps this computer's traffic in its VPN tunnel wherever it goes. "
            + "To start, import the profile your administrator gave you: Roam checks it, then installs it "
            + "with an administrator's password. Then start it with \"systemctl start roam@NAME\"."
        self.importing = importing
        switch report {
        case .status: detail = ""
        case .unreachable(let why): detail = why
        case .stopped(let why): detail = "The agent stopped: \(why)"
        }
    }
}

/// The Details screen: what each label, the switch and the banner show.
public struct DetailsView: Equatable, Sendable {
    /// The state in a few words (the big label).
    public var state: String
    /// A line under it: what happens next, or why.
    public var stateDetail: String
    /// On unless the user turned the tunnel off (`down`): on-demand and failures keep it on.
    public var switchOn: Bool
    /// Off while no agent answers: the switch has no one to ask.
    public var switchEnabled: Bool
    public var rows: [DetailRow]
    /// Shown while the network holds everything back until someone logs in.
    public var banner: PortalBanner?
    public var profiles: [String]
    /// The Profiles list: each installed profile, the one the agent runs marked, the others to
    /// switch to (empty while no agent answers: there is no one to ask).
    public var choices: [ProfileChoice] = []

    public init(report: AgentReport, profiles: [String]) {
        self.profiles = profiles
        guard case .status(let status) = report else {
            state = "Not running"
            switch report {
            case .unreachable(let why): stateDetail = why
            case .stopped(let why): stateDetail = report.gaveUp ? "The agent gave up: \(why)" : "The agent stopped."
            case .status: stateDetail = ""
            }
            switchOn = false
            switchEnabled = false
            rows = []
            banner = nil
            return
        }
        state = Self.words(for: status.state)
        stateDetail = Self.detail(for: status)
        switchOn = status.state != .paused
        switchEnabled = true
        rows = Self.rows(for: status)
        // The agent sees the profiles where the app may not (a directory only root can list).
        self.profiles = status.profiles ?? profiles
        choices = self.profiles.map { ProfileChoice(name: $0, inUse: $0 == status.profile) }
        if status.state == .portal || status.portal != nil {
            banner = PortalBanner(url: status.portal?.url, interface: status.path?.interface, ssid: status.ssid)
        } else {
            banner = nil
        }
    }

    /// The state's name for people.
    public static func words(for state: TunnelState) -> String {
        switch state {
        case .offline: "No network"
        case .connecting: "Connecting"
        case .connected: "Connected"
        case .probing: "Connected, checking the path"
        case .switching: "Connected, moving to a better network"
        case .sleeping: "Asleep"
        case .backingOff: "Waiting to try again"
        case .failed: "Cannot connect"
        case .paused: "Off"
        case .portal: "This network needs a login"
        case .disconnected: "Off on this network"
        case .other(let name): name
        }
    }

    static func detail(for status: AgentStatus) -> String {
        switch status.state {
        case .backingOff:
            return status.nextRetryMs.map { "Next attempt in \(Self.span(ms: $0))." } ?? "Roam tries again shortly."
        case .failed:
            return "Roam stopped trying" + (status.lastReason.map { ": \($0)" } ?? ".")
        case .paused:
            return status.lockdown.enabled ? "The lockdown still blocks traffic outside the tunnel." : "Traffic goes out directly."
        case .portal:
            return status.portal.map { "Login page: \($0.url)" } ?? "The tunnel connects right after the login."
        case .disconnected:
            return status.onDemand.map { "The on-demand rule \"\($0.rule)\" keeps the tunnel down here." } ?? ""
        case .offline:
            return "The tunnel connects as soon as a network is up."
        default:
            // A watch tells changes, not the passing of time: a duration here would stand still.
            return status.server.map { "Through \($0.name)." } ?? ""
        }
    }

    static func rows(for status: AgentStatus) -> [DetailRow] {
        var rows: [DetailRow] = []
        if let server = status.server {
            var value = server.name + (server.address.map { " (\($0))" } ?? "")
            if let next = server.handoverTo { value += ", moving to \(next)" }
            rows.append(DetailRow(.server, value))
        }
        rows.append(DetailRow(.path, status.path.map { Self.describe($0, ssid: status.ssid) } ?? "None"))
        rows.append(DetailRow(.roundTrip, status.roundTripMs.map(Self.milliseconds) ?? "Not measured yet"))
        if let session = status.session {
            rows.append(DetailRow(.session, "Version \(session.protocolVersion), \(session.cipher)"))
        }
        if let since = status.since { rows.append(DetailRow(.since, Self.time(since))) }
        if let onDemand = status.onDemand {
            rows.append(DetailRow(.onDemand, "\"\(onDemand.rule)\": tunnel down on this network"
                + (onDemand.lockdownLifted ? ", lockdown lifted" : ", lockdown kept")))
        }
        rows.append(DetailRow(.lockdown, Self.describe(status.lockdown)))
        rows.append(DetailRow(.excluded, status.excluded.isEmpty ? "None"
            : status.excluded.map { "\($0.name) (\($0.pid))" }.joined(separator: ", ")))
        return rows
    }

    static func describe(_ path: AgentStatus.PathInfo, ssid: String?) -> String {
        var words = path.interface
        switch path.kind {
        case "wifi": words += ", Wi-Fi" + (ssid.map { " “\($0)”" } ?? "")
        case "ethernet": words += ", Ethernet"
        case "wwan": words += ", mobile broadband"
        default: break
        }
        if let source = path.source { words += ", from \(source)" }
        if path.transport == "stream" { words += ", over TLS" }
        return words
    }

    static func describe(_ lockdown: AgentStatus.Lockdown) -> String {
        guard lockdown.enabled else { return "Off" }
        var words = "On"
        if let open = lockdown.openOn { words += ", lifted on \(open)" }
        if lockdown.blocked > 0 { words += ", \(lockdown.blocked) stopped so far" }
        return words
    }

    /// A round-trip time: `1.05 ms`, `23 ms`.
    static func milliseconds(_ ms: Double) -> String {
        guard ms.isFinite, ms >= 0 else { return "Not measured yet" }
        if ms < 10 {
            let hundredths = Int((ms * 100).rounded())
            let fraction = hundredths % 100
            return "\(hundredths / 100).\(fraction < 10 ? "0" : "")\(fraction) ms"
        }
        return "\(Int(ms.rounded())) ms"
    }

    /// A stretch of time in the largest units that matter: `4 s`, `3 min`, `2 h 5 min`, `3 d 4 h`.
    public static func span(ms: Double) -> String {
        guard ms.isFinite, ms >= 0 else { return "a moment" }
        let seconds = Int64(min(ms / 1000, 1e12).rounded())
        switch seconds {
        case ..<1: return "a moment"
        case ..<60: return "\(seconds) s"
        case ..<3600: return "\(seconds / 60) min"
        case ..<86400: return "\(seconds / 3600) h" + (seconds % 3600 / 60 > 0 ? " \(seconds % 3600 / 60) min" : "")
        default: return "\(seconds / 86400) d" + (seconds % 86400 / 3600 > 0 ? " \(seconds % 86400 / 3600) h" : "")
        }
    }

    /// An RFC 3339 UTC time (`2026-11-23T18:05:17Z`) as `2026-11-23 18:05:17 UTC`; anything else
    /// as it came.
    static func time(_ rfc3339: String) -> String {
        guard rfc3339.count == 20, rfc3339.hasSuffix("Z"), let t = rfc3339.firstIndex(of: "T") else { return rfc3339 }
        return rfc3339[..<t] + " " + rfc3339[rfc3339.index(after: t)..<rfc3339.index(before: rfc3339.endIndex)] + " UTC"
    }
}

/// One line of the Details screen's list.
public struct DetailRow: Equatable, Sendable {
    public enum Kind: String, Sendable, CaseIterable {
        case server, path, roundTrip, session, since, onDemand, lockdown, excluded

        /// The row's title.
        public var title: String {
            switch self {
            case .server: "Server"
            case .path: "Network"
            case .roundTrip: "Round trip"
            case .session: "Protocol"
            case .since: "Since"
            case .onDemand: "On-demand rule"
            case .lockdown: "Lockdown"
            case .excluded: "Outside the tunnel"
            }
        }
    }

    public var kind: Kind
    public var value: String

    public init(_ kind: Kind, _ value: String) {
        self.kind = kind
        self.value = value
    }
}

/// A row of the Profiles list.
public struct ProfileChoice: Equatable, Sendable {
    public var name: String
    /// The agent runs it.
    public var inUse: Bool

    public init(name: String, inUse: Bool) {
        self.name = name
        self.inUse = inUse
    }

    /// Under the name: what it is.
    public var subtitle: String { inUse ? "In use" : "Installed" }
    /// The button that switches to it (none for the one in use), named for screen readers.
    public var button: String? { inUse ? nil : "Use" }
    public var buttonDescription: String { "Use \(name)" }
}

/// The banner of a network that needs a login.
public struct PortalBanner: Equatable, Sendable {
    /// The login page, when the agent knows it.
    public var url: String?
    public var interface: String?
    /// The Wi-Fi network's name, when it is one.
    public var ssid: String?

    public init(url: String?, interface: String?, ssid: String? = nil) {
        self.url = url
        self.interface = interface
        self.ssid = ssid
    }

    public var text: String {
        let network = switch (ssid, interface) {
        case (let ssid?, _): "The Wi-Fi network “\(ssid)”"
        case (nil, let interface?): "The network on \(interface)"
        case (nil, nil): "The network"
        }
        return network + " needs a login before the tunnel can connect."
    }
    public var button: String { "Log in" }
}

/// What the switch asks the agent: `up` to turn the tunnel on, `down` to turn it off.
public func command(switchingOn on: Bool) -> ControlCommand { on ? .up : .down }
