public import Tunnel
public import ControlWire

/// The client's status as the control socket gives it (`status`, and every `watch` event), typed:
/// the runner gathers its state into one, `json` writes it (docs/CONTROL.md). A part that is
/// nil is written as `null`, or left out where the document says it appears only at times.
public struct ClientStatus: Sendable {
    /// The core's state (`connected`, `portal`...).
    public var state: String
    public var server: Server
    /// The session's path; nil without one.
    public var path: Path?
    /// The Wi-Fi network the path is on.
    public var ssid: String?
    public var profile: Profile
    /// The profiles installed beside the configuration; nil when the directory cannot be listed.
    public var profiles: [String]?
    public var roundTripTime: Duration?
    public var mtu: MTU
    /// The last transition and how long ago it was; nil before the first.
    public var since: Since?
    /// Only in state `portal`.
    public var portal: Portal?
    /// Only while an on-demand rule keeps the tunnel down.
    public var onDemand: OnDemand?
    public var attempts: Int
    public var budgetLeft: Int
    public var connectivityChecks: Int
    public var power: String
    /// The data plane's counters, once the session has started.
    public var dataPlane: DataPlane?
    public var offload: String?
    /// Only with a stream transport configured.
    public var transports: Transports?
    public var session: SessionProtocol?
    /// The lockdown's figures; nil without a lockdown.
    public var lockdown: Lockdown?
    /// Nil with `dns: {manager: off}`.
    public var dns: DNS?
    public var divertingRoutes: [String]
    public var excluded: [Excluded]
    public var guestNetworks: [String]
    public var localNetworks: [String]
    public var widerClaims: [String]
    public var otherTunnels: [String]
    /// One for each of the agent's holdings, in order.
    public var upkeep: [Upkeep]

    public init(
        state: String, server: Server, path: Path?, ssid: String?, profile: Profile, profiles: [String]?, roundTripTime: Duration?,
        mtu: MTU, since: Since?, portal: Portal? = nil, onDemand: OnDemand? = nil, attempts: Int, budgetLeft: Int,
        connectivityChecks: Int, power: String, dataPlane: DataPlane?, offload: String?, transports: Transports? = nil,
        session: SessionProtocol?, lockdown: Lockdown?, dns: DNS?, divertingRoutes: [String] = [], excluded: [Excluded] = [],
        guestNetworks: [String] = [], localNetworks: [String] = [], widerClaims: [String] = [], otherTunnels: [String] = [],
        upkeep: [Upkeep]
    ) {
        self.state = state
        self.server = server
        self.path = path
        self.ssid = ssid
        self.profile = profile
        self.profiles = profiles
        self.roundTripTime = roundTripTime
        self.mtu = mtu
        self.since = since
        self.portal = portal
        self.onDemand = onDemand
        self.attempts = attempts
        self.budgetLeft = budgetLeft
        self.connectivityChecks = connectivityChecks
        self.power = power
        self.dataPlane = dataPlane
        self.offload = offload
        self.transports = transports
        self.session = session
        self.lockdown = lockdown
        self.dns = dns
        self.divertingRoutes = divertingRoutes
        self.excluded = excluded
        self.guestNetworks = guestNetworks
        self.localNetworks = localNetworks
        self.widerClaims = widerClaims
        self.otherTunnels = otherTunnels
        self.upkeep = upkeep
    }

    public var json: JSON {
        var fields: [(String, JSON)] = [
            ("role", .string("client")), ("state", .string(state)), ("server", server.json), ("path", path?.json ?? .null),
            ("ssid", .optional(ssid)), ("profile", profile.json), ("profiles", profiles.map(JSON.strings) ?? .null),
            ("rtt_ms", roundTripTime?.milliseconds ?? .null), ("mtu", mtu.json),
        ]
        if let since {
            fields += [("since", .string(since.at)), ("for_ms", since.duration.milliseconds), ("last_transition", since.transition.json)]
        }
        if let portal { fields.append(("portal", portal.json)) }
        if let onDemand { fields.append(("on_demand", onDemand.json)) }
        fields += [("attempts", .count(attempts)), ("budget_left", .count(budgetLeft)),
                   ("connectivity_checks", .count(connectivityChecks)), ("power", .string(power))]
        if let dataPlane {
            fields += [("traffic", .traffic(dataPlane.traffic)),
                       ("drops", .drops(dataPlane.drops, dataPlane.traffic, extra: [("no_session", .count(dataPlane.traffic.noSession))]))]
        }
        fields.append(("offload", .optional(offload)))
        if let transports { fields.append(("transports", transports.json)) }
        let session = session.map { JSON.object([("protocol", .count($0.version)), ("cipher", .string($0.cipher.description))]) }
        fields.append(("session", session ?? .null))
        fields.append(("lockdown", .object([("enabled", .bool(lockdown != nil))] + (lockdown?.fields ?? []))))
        if let dns { fields.append(("dns", dns.json)) }
        return .object(fields + [
            ("diverting_routes", .strings(divertingRoutes)), ("excluded", .array(excluded.map(\.json))),
            ("guest_networks", .strings(guestNetworks)), ("local_networks", .strings(localNetworks)),
            ("wider_claims", .strings(widerClaims)), ("other_tunnels", .strings(otherTunnels)),
            ("upkeep", .object(upkeep.map { ($0.holding, $0.json) })),
        ])
    }

    public struct Server: Sendable {
        public var name: String
        public var address: String
        /// The server a session is being moved to, while it is.
        public var handoverTo: String?

        public init(name: String, address: String, handoverTo: String? = nil) {
            self.name = name
            self.address = address
            self.handoverTo = handoverTo
        }

        var json: JSON {
            .object([("name", .string(name)), ("address", .string(address))] + (handoverTo.map { [("handover_to", .string($0))] } ?? []))
        }
    }

    /// A path to the server: the interface, its kind, the source address and what carries it.
    public struct Path: Sendable {
        public var interface: String
        public var kind: String
        public var source: String
        public var transport: String

        public init(interface: String, kind: String, source: String, transport: String) {
            self.interface = interface
            self.kind = kind
            self.source = source
            self.transport = transport
        }

        public var json: JSON {
            .object([("interface", .string(interface)), ("kind", .string(kind)), ("source", .string(source)), ("transport", .string(transport))])
        }
    }

    /// The configuration the agent runs: its name as a profile (nil: not named so) and its file.
    public struct Profile: Sendable {
        public var name: String?
        public var file: String

        public init(name: String?, file: String) {
            self.name = name
            self.file = file
        }

        var json: JSON { .object([("name", .optional(name)), ("file", .string(file))]) }
    }

    public struct MTU: Sendable {
        /// The tunnel device's MTU now.
        public var tunnel: Int
        public var configured: Int
        public var floor: Int
        public var searching: Bool
        /// The padded probes sent since start.
        public var sizeProbes: Int

        public init(tunnel: Int, configured: Int, floor: Int, searching: Bool, sizeProbes: Int) {
            self.tunnel = tunnel
            self.configured = configured
            self.floor = floor
            self.searching = searching
            self.sizeProbes = sizeProbes
        }

        var json: JSON {
            .object([("tunnel", .count(tunnel)), ("configured", .count(configured)), ("floor", .count(floor)),
                     ("searching", .bool(searching)), ("size_probes", .count(sizeProbes))])
        }
    }

    /// The last transition: when (RFC 3339), how long ago, and the transition itself.
    public struct Since: Sendable {
        public var at: String
        public var duration: Duration
        public var transition: Transition

        public init(at: String, duration: Duration, transition: Transition) {
            self.at = at
            self.duration = duration
            self.transition = transition
        }
    }

    /// A transition of the core, as the log has it.
    public struct Transition: Sendable {
        /// When, RFC 3339.
        public var at: String
        public var from: String
        public var to: String
        public var trigger: String
        public var reason: String
        /// The path of the state it led to.
        public var path: Path?
        /// The path tried, while switching.
        public var candidate: Path?
        /// The server, when several are configured.
        public var server: String?
        public var attempt: Int
        /// Until the retry, when one is scheduled.
        public var nextRetry: Duration?
        public var coalesced: Int

        public init(
            at: String, from: String, to: String, trigger: String, reason: String, path: Path?, candidate: Path? = nil,
            server: String? = nil, attempt: Int, nextRetry: Duration? = nil, coalesced: Int
        ) {
            self.at = at
            self.from = from
            self.to = to
            self.trigger = trigger
            self.reason = reason
            self.path = path
            self.candidate = candidate
            self.server = server
            self.attempt = attempt
            self.nextRetry = nextRetry
            self.coalesced = coalesced
        }

        public var json: JSON {
            var fields: [(String, JSON)] = [
                ("at", .string(at)), ("from", .string(from)), ("to", .string(to)), ("trigger", .string(trigger)),
                ("reason", .string(reason)), ("path", path?.json ?? .null),
            ]
            if let candidate { fields.append(("candidate", candidate.json)) }
            if let server { fields.append(("server", .string(server))) }
            fields.append(("attempt", .count(attempt)))
            if let nextRetry { fields.append(("next_retry_ms", nextRetry.milliseconds)) }
            fields.append(("coalesced", .count(coalesced)))
            return .object(fields)
        }
    }

    /// Behind a captive portal: its login page, how long the portal window stays open while one
    /// is, and when the next recheck is due.
    public struct Portal: Sendable {
        public var url: String
        public var window: Duration?
        public var nextCheck: Duration?

        public init(url: String, window: Duration? = nil, nextCheck: Duration? = nil) {
            self.url = url
            self.window = window
            self.nextCheck = nextCheck
        }

        var json: JSON {
            var fields: [(String, JSON)] = [("url", .string(url))]
            if let window { fields.append(("window_ms", window.milliseconds)) }
            if let nextCheck { fields.append(("next_check_ms", nextCheck.milliseconds)) }
            return .object(fields)
        }
    }

    /// The on-demand rule that keeps the tunnel down, and whether it lifted the lockdown.
    public struct OnDemand: Sendable {
        public var rule: String
        public var lockdownLifted: Bool

        public init(rule: String, lockdownLifted: Bool) {
            self.rule = rule
            self.lockdownLifted = lockdownLifted
        }

        var json: JSON { .object([("rule", .string(rule)), ("lockdown_lifted", .bool(lockdownLifted))]) }
    }

    /// The session's traffic and drops (`traffic`, `drops`).
    public struct DataPlane: Sendable {
        public var traffic: TrafficCounters
        public var drops: DropCounters

        public init(traffic: TrafficCounters, drops: DropCounters) {
            self.traffic = traffic
            self.drops = drops
        }
    }
}
