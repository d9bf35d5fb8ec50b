public import ControlWire

/// A client agent's status as the desktop reads it from the control socket (docs/CONTROL.md,
/// "The client's status"): only the fields the app shows, each optional as the agent may leave
/// it `null`. Fields this reader does not know are ignored, as version 1 allows.
public struct AgentStatus: Equatable, Sendable {
    /// The session's state as the agent names it (`connected`, `portal`, ...).
    public var state: TunnelState
    public var server: Server?
    public var path: PathInfo?
    /// The name of the Wi-Fi network the path is on.
    public var ssid: String?
    /// The profile the agent runs (its file's name without `.yaml`).
    public var profile: String?
    /// The profiles the agent sees installed; nil from an agent that does not say (the app then
    /// lists the directory itself).
    public var profiles: [String]?
    public var roundTripMs: Double?
    public var session: SessionInfo?
    /// When the last transition happened (RFC 3339, UTC), and how long ago.
    public var since: String?
    public var forMs: Double?
    /// The last transition's reason, as the log has it (`pathLost(eth0)`).
    public var lastReason: String?
    /// In `backing-off`: when the next attempt is due.
    public var nextRetryMs: Double?
    public var onDemand: OnDemand?
    public var lockdown: Lockdown
    public var excluded: [ExcludedProcess]
    public var portal: Portal?

    public struct Server: Equatable, Sendable {
        public var name: String
        public var address: String?
        /// The server the session is being moved to, while it is.
        public var handoverTo: String?
    }

    public struct PathInfo: Equatable, Sendable {
        public var interface: String
        /// `wifi`, `ethernet`, `wwan`, `other`.
        public var kind: String?
        public var source: String?
        /// `udp`, or `stream` (TLS on TCP).
        public var transport: String?
    }

    public struct SessionInfo: Equatable, Sendable {
        public var protocolVersion: Int64
        public var cipher: String
    }

    public struct OnDemand: Equatable, Sendable {
        /// The rule that keeps the tunnel down on this network.
        public var rule: String
        public var lockdownLifted: Bool
    }

    public struct Lockdown: Equatable, Sendable {
        public var enabled: Bool
        /// Everything the lockdown stopped since start, all causes added up.
        public var blocked: Int64
        /// The interface the lockdown is lifted on, when an on-demand rule lifted it.
        public var openOn: String?

        public init(enabled: Bool, blocked: Int64 = 0, openOn: String? = nil) {
            self.enabled = enabled
            self.blocked = blocked
            self.openOn = openOn
        }
    }

    public struct ExcludedProcess: Equatable, Sendable {
        public var pid: Int64
        public var name: String
    }

    public struct Portal: Equatable, Sendable {
        /// The login page the connectivity check was sent to.
        public var url: String
        /// How long the portal window stays open, while one is.
        public var windowMs: Double?
    }

    /// Reads the `status` object of a `status` answer or a watch event; a status that is not a
    /// client's, or has no state, is refused with what it is instead.
    public init(answer: JSON) throws(StatusError) {
        guard let status = answer["status"] else { throw .notAStatus }
        try self.init(status: status)
    }

    /// Reads a client's status object.
    public init(status json: JSON) throws(StatusError) {
        if let role = json["role"]?.string, role != "client" { throw .notAClient(role: role) }
        guard let state = json["state"]?.string else { throw .noState }
        self.state = TunnelState(name: state)
        if let server = json["server"], let name = server["name"]?.string {
            self.server = Server(name: name, address: server["address"]?.string, handoverTo: server["handover_to"]?.string)
        }
        if let path = json["path"], let interface = path["interface"]?.string {
            self.path = PathInfo(interface: interface, kind: path["kind"]?.string, source: path["source"]?.string,
                                 transport: path["transport"]?.string)
        }
        ssid = json["ssid"]?.string
        profile = json["profile"]?["name"]?.string
        profiles = json["profiles"]?.array.map { $0.compactMap(\.string) }
        roundTripMs = json["rtt_ms"]?.double
        if let session = json["session"], let version = session["protocol"]?.int, let cipher = session["cipher"]?.string {
            self.session = SessionInfo(protocolVersion: version, cipher: cipher)
        }
        since = json["since"]?.string
        forMs = json["for_ms"]?.double
        lastReason = json["last_transition"]?["reason"]?.string
        nextRetryMs = json["last_transition"]?["next_retry_ms"]?.double
        if let onDemand = json["on_demand"], let rule = onDemand["rule"]?.string {
            self.onDemand = OnDemand(rule: rule, lockdownLifted: onDemand["lockdown_lifted"]?.bool ?? false)
        }
        let lockdown = json["lockdown"]
        let blocked = (lockdown?["blocked"]?.fields ?? []).reduce(Int64(0)) { $0 &+ max(0, $1.1.int ?? 0) }
        self.lockdown = Lockdown(enabled: lockdown?["enabled"]?.bool ?? false, blocked: blocked, openOn: lockdown?["open_on"]?.string)
        excluded = (json["excluded"]?.array ?? []).compactMap { entry in
            guard let pid = entry["pid"]?.int, let name = entry["name"]?.string else { return nil }
            return ExcludedProcess(pid: pid, name: name)
        }
        if let portal = json["portal"], let url = portal["url"]?.string {
            self.portal = Portal(url: url, windowMs: portal["window_ms"]?.double)
        }
    }
}

/// A status the desktop cannot show, said so a person can act on it.
public enum StatusError: Error, Equatable, Sendable, CustomStringConvertible {
    /// The answer carries no `status` object.
    case notAStatus
    /// The socket is a gateway's (`agent serve`), not a client's.
    case notAClient(role: String)
    /// The status names no state.
    case noState

    public var description: String {
        switch self {
        case .notAStatus: "the agent's answer carries no status"
        case .notAClient(let role): "the control socket is a \(role)'s, not a client's: point the app at the client's socket"
        case .noState: "the agent's status names no state"
        }
    }
}

/// The session's state, as `state` in the status names it; a name this app does not know yet is
/// kept as it came.
public enum TunnelState: Equatable, Sendable {
    case offline, connecting, connected, probing, switching, sleeping, backingOff, failed, paused, portal, disconnected
    case other(String)

    public init(name: String) {
        switch name {
        case "offline": self = .offline
        case "connecting": self = .connecting
        case "connected": self = .connected
        case "probing": self = .probing
        case "switching": self = .switching
        case "sleeping": self = .sleeping
        case "backing-off": self = .backingOff
        case "failed": self = .failed
        case "paused": self = .paused
        case "portal": self = .portal
        case "disconnected": self = .disconnected
        default: self = .other(name)
        }
    }

    /// Whether traffic goes through the tunnel now (a suspect path is still the session's).
    public var carriesTraffic: Bool {
        switch self {
        case .connected, .probing, .switching: true
        default: false
        }
    }
}
