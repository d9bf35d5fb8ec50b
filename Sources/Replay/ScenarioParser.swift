import Topology
public import ConfigReader
import Basics
import Reconnector

/// A scenario file that cannot be replayed, with the line to look at.
public typealias ScenarioError = ConfigError

extension Scenario {
    /// Reads and parses the scenario at `path`.
    public static func load(_ path: String) throws(ScenarioError) -> Scenario {
        let (reader, root) = try YAMLReader.load(path)
        return try reader.scenario(root)
    }

    /// Every scenario file in `directory`, sorted by name.
    public static func files(in directory: String = libraryPath) -> [String] {
        let names = SystemFiles.names(in: directory) ?? []
        return names.filter { $0.hasSuffix(".yaml") || $0.hasSuffix(".yml") }.sorted().map { directory + "/" + $0 }
    }

    /// Parses scenario text; `file` names it in errors.
    public static func parse(_ text: String, file: String) throws(ScenarioError) -> Scenario {
        let reader = YAMLReader(file: file)
        return try reader.scenario(try reader.document(text))
    }
}

/// The scenario grammar, on top of the line-numbered YAML reader.
typealias ScenarioParser = YAMLReader

extension YAMLReader {
    func scenario(_ root: Node) throws(ScenarioError) -> Scenario {
        let top = try fields(root, "the scenario", allowed: [
            "name", "about", "server", "tunnel", "config", "power", "seed", "traffic", "traffic-size", "rtt", "network",
            "timeline", "until", "expect", "link-kinds", "recorded", "gateways", "on-demand", "tunnel-mtu",
            "server-echoes-sizes", "tunnel-ipv6", "server-traffic", "persistent-keepalive", "wait-for-server", "exclusion",
            "stream-port", "stream-proxy", "proxy-dns", "portal-windows", "lockdown-refuses", "split-routes", "server-dns",
            "service", "metrics-file",
        ])
        var gateways: [String] = []
        var gatewayAddresses: [String: [IPAddress]] = [:]
        for item in try list(top.optional("gateways")) {
            // A name, or {name, server}: a gateway whose name gives addresses of its own.
            let own = if case .mapping = item.value { try fields(item, "a gateway", allowed: ["name", "server"]) } else { Fields?.none }
            let name = try string(try own?.required("name") ?? item)
            guard !gateways.contains(name) else { throw fail(item, "'gateways' lists \(name) twice") }
            gateways.append(name)
            if let node = try own?.required("server") { gatewayAddresses[name] = try serverAddresses(node) }
        }
        let serverNode = try top.required("server")
        let servers = try serverAddresses(serverNode)
        guard let server = servers.first else { throw fail(serverNode, "'server' lists no address") }
        let network = try opt(top.optional("network")) { node throws(ScenarioError) in try initialNetwork(node) } ?? []
        var config = Config()
        if let node = top.optional("config") { try reconnectConfig(node, section: "'config'", into: &config) }
        if let node = top.optional("tunnel-mtu") {
            config.maxMTU = try int(node, 576...9000)
            if let minimum = config.minMTU, minimum > config.maxMTU {
                throw fail(node, "'tunnel-mtu' \(config.maxMTU) is below the config's min-mtu \(minimum)")
            }
        }
        let events = try opt(top.optional("timeline")) { node throws(ScenarioError) in
            try self.timeline(node, gateways: gateways, config: config)
        } ?? []
        let last = events.map(\.at).max() ?? .zero
        let until = try opt(top.optional("until")) { node throws(ScenarioError) in try instant(node) }
            ?? last + .seconds(60)
        if let node = top.optional("until"), until < last {
            throw fail(node, "'until' (\(until)s) is before the last event (\(last)s)")
        }
        let traffic = try opt(top.optional("traffic")) { node throws(ScenarioError) in try positiveDuration(node) }
        let serverTraffic = try opt(top.optional("server-traffic")) { node throws(ScenarioError) in
            try trafficPhase(node, "'server-traffic'", idle: false)
        } ?? nil
        try countTicks(of: "'traffic'", from: traffic, line: top.optional("traffic")?.line, events: events, until: until) {
            if case .traffic(let phase) = $0 { .some(phase) } else { nil }
        }
        try countTicks(of: "'server-traffic'", from: serverTraffic?.every, line: top.optional("server-traffic")?.line,
                       events: events, until: until) {
            if case .serverTraffic(let phase) = $0 { .some(phase) } else { nil }
        }
        var kinds: [String: LinkKind] = [:]
        if let node = top.optional("link-kinds") {
            guard case .mapping(let mapping) = node.value else { throw fail(node, "'link-kinds' maps link names to kinds") }
            for (key, value) in mapping {
                let name = try string(key)
                guard kinds[name] == nil else { throw fail(key, "'\(name)' appears twice") }
                kinds[name] = try linkKind(value)
            }
        }
        var scenario = Scenario(
            file: file,
            name: try opt(top.optional("name")) { node throws(ScenarioError) in try string(node) }
                ?? String(file.split(separator: "/").last ?? ""),
            about: try opt(top.optional("about")) { node throws(ScenarioError) in try string(node) } ?? "",
            server: server,
            serverAddresses: servers,
            tunnelInterface: try opt(top.optional("tunnel")) { node throws(ScenarioError) in try string(node) },
            config: config,
            power: try opt(top.optional("power")) { node throws(ScenarioError) in try power(node) } ?? .ac,
            seed: try opt(top.optional("seed")) { node throws(ScenarioError) in UInt64(try int(node, 0...Int.max)) } ?? 1,
            traffic: traffic,
            rtt: try opt(top.optional("rtt")) { node throws(ScenarioError) in try duration(node) } ?? .milliseconds(20),
            network: network,
            timeline: events,
            until: until,
            expect: try opt(top.optional("expect")) { node throws(ScenarioError) in try expectations(node) }
                ?? Expectations())
        scenario.linkKinds = kinds
        if !gateways.isEmpty { scenario.gateways = gateways }
        scenario.gatewayAddresses = gatewayAddresses
        if let node = top.optional("traffic-size") { scenario.trafficSize = try int(node, 28...65535) }
        if let node = top.optional("server-echoes-sizes") { scenario.serverEchoesSizes = try bool(node) }
        if let node = top.optional("tunnel-ipv6") { scenario.tunnelCarriesIPv6 = try bool(node) }
        scenario.serverTraffic = serverTraffic
        if let node = top.optional("persistent-keepalive") {
            let interval = try positiveDuration(node)
            guard interval >= .seconds(1), interval <= .seconds(3600) else {
                throw fail(node, "'persistent-keepalive' is 1s to 1h (as the agent's setting), got \(interval.short)")
            }
            scenario.persistentKeepalive = interval
        }
        if let node = top.optional("on-demand") { scenario.onDemand = try onDemandRules(node) }
        if let node = top.optional("exclusion") {
            switch try string(node) {
            case "allow": scenario.exclusionAllowed = true
            case "off": scenario.exclusionAllowed = false
            case let other: throw fail(node, "'exclusion' is allow or off, got \"\(other)\"")
            }
        }
        if let node = top.optional("portal-windows") { scenario.portalWindows = try bool(node) }
        for node in try list(top.optional("split-routes")) {
            let text = try string(node)
            guard text.contains("/"), let prefix = Prefix(text) else {
                throw fail(node, "'split-routes' lists prefixes, e.g. 198.51.100.0/24, got \"\(text)\"")
            }
            scenario.splitRoutes.append(prefix)
        }
        if let node = top.optional("service") {
            let service = try fields(node, "'service'", allowed: ["watchdog"])
            scenario.service = Scenario.Service(watchdog: try opt(service.optional("watchdog")) { node throws(ScenarioError) in
                try positiveDuration(node)
            })
        }
        if let node = top.optional("metrics-file") { scenario.metricsFile = try bool(node) }
        if let node = top.optional("server-dns") {
            scenario.serverDNS = try list(node).map { (item) throws(ScenarioError) in try ip(item) }
        }
        for node in try list(top.optional("lockdown-refuses")) {
            let text = try string(node)
            guard let opening = Scenario.LockdownOpening(rawValue: text) else {
                throw fail(node, "'lockdown-refuses' lists portal-window, exclusion, proxy and lift, got \"\(text)\"")
            }
            scenario.lockdownRefuses.insert(opening)
        }
        if let node = top.optional("stream-port") { scenario.streamPort = try int(node, 1...65535) }
        if let node = top.optional("stream-proxy") { scenario.streamProxy = try string(node) }
        if let node = top.optional("proxy-dns") {
            guard scenario.proxyNamed else { throw fail(node, "'proxy-dns' needs a 'stream-proxy' named by host") }
            guard case .mapping(let entries) = node.value else {
                throw fail(node, "'proxy-dns' maps interfaces to what the proxy's name gives there, e.g. {wifi0: [10.0.0.8]}")
            }
            for (key, value) in entries {
                scenario.proxyDNS[try string(key)] = try list(value).map { (item) throws(ScenarioError) in try ip(item) }
            }
        }
        if let node = top.optional("wait-for-server") {
            // As the agent's `--wait-for-server`: 0 waits for ever.
            let wait = try duration(node)
            scenario.waitForServer = wait > .zero ? wait : nil
        }
        return scenario
    }

    /// `idle` (with `idle: true`), a duration, or `{every, size}`: one packet every so often, of
    /// that size inside the tunnel.
    func trafficPhase(_ node: Node, _ what: String, idle: Bool) throws(ScenarioError) -> TrafficPhase? {
        if case .scalar(let text) = node.value, text == "idle" {
            guard idle else { throw fail(node, "\(what) at the top is a duration or {every, size}; 'idle' is for the timeline") }
            return nil
        }
        if case .mapping = node.value {
            let f = try fields(node, what, allowed: ["every", "size"])
            let every = try positiveDuration(try f.required("every"))
            let size = try opt(f.optional("size")) { node throws(ScenarioError) in try int(node, 28...65535) }
            return TrafficPhase(every: every, size: size)
        }
        guard case .scalar(let text) = node.value, Self.parseDuration(text).map({ $0 > .zero }) == true else {
            throw fail(node, "\(what) is \(idle ? "idle, " : "")a duration (e.g. 100ms) or {every, size}")
        }
        return TrafficPhase(every: try positiveDuration(node))
    }

    /// Refuses a stream whose phases would send more than `maxTrafficTicks` packets before
    /// `until` (counted before anything runs), naming the line of the phase that crossed it.
    func countTicks(of what: String, from first: Duration?, line firstLine: Int?, events: [TimedEvent], until: Instant,
                    phase: (ScenarioEvent) -> TrafficPhase??) throws(ScenarioError) {
        var (from, every, line, total) = (Instant.zero, first, firstLine ?? 0, Int64(0))
        func check(upTo end: Instant) throws(ScenarioError) {
            if let every { total += max(0, (end - from).nanoseconds) / max(every.nanoseconds, 1) }
            guard total <= Self.maxTrafficTicks else {
                throw ScenarioError(file: file, line: line, message: "\(what) every \((every ?? .zero).short) until \(end) makes more than \(Self.maxTrafficTicks) packets")
            }
        }
        for event in events where event.at <= until {
            guard let change = phase(event.event) else { continue }
            try check(upTo: event.at)
            (from, every, line) = (event.at, change?.every, event.line)
        }
        try check(upTo: until)
    }

    // MARK: Network and timeline

    func initialNetwork(_ node: Node) throws(ScenarioError) -> [TimedEvent] {
        let net = try fields(node, "'network'", allowed: ["links", "addresses", "routes", "netlink"])
        var events: [TimedEvent] = []
        for item in try list(net.optional("netlink")) {
            events.append(TimedEvent(at: .zero, line: line(item), event: .netlink(try hex(item))))
        }
        for item in try list(net.optional("links")) {
            events.append(TimedEvent(at: .zero, line: line(item), event: .link(try linkSpec(item))))
        }
        for item in try list(net.optional("addresses")) {
            let (dev, prefix, flags) = try address(item, withFlags: true)
            events.append(TimedEvent(at: .zero, line: line(item), event: .addressAdded(dev: dev, prefix, flags)))
        }
        for item in try list(net.optional("routes")) {
            events.append(TimedEvent(at: .zero, line: line(item), event: .routeAdded(try route(item, adding: true))))
        }
        return events
    }

    static let eventKeys = [
        "link", "link-del", "addr-add", "addr-del", "route-add", "route-del", "sleep", "wake", "suspend",
        "clock-jump", "power", "server", "drop", "restore", "auth", "reconnect", "operator", "flap", "netlink", "restart", "stop", "reload",
        "forged-hint", "gateway-down", "gateway-up", "drain", "portal", "login", "portal-window", "traffic", "server-traffic",
        "taken", "exclude", "refuse-bind", "proxy-dns",
    ]

    /// The most events a scenario may hold once its flaps and restarts are expanded, and the most
    /// application packets its `traffic` may send: a file cannot make a replay run for hours or
    /// take gigabytes.
    static let maxEvents = 1_000_000
    static let maxTrafficTicks: Int64 = 20_000_000

    /// `config` is the scenario's: a `reload` changes it.
    func timeline(_ node: Node, gateways: [String] = [], config: Config = Config()) throws(ScenarioError) -> [TimedEvent] {
        var events: [TimedEvent] = []
        // The earliest instant the next event may have: time never runs backwards, and a
        // suspend or clock jump moves it forward by its length.
        var floor = Instant.zero
        var sleeping = false
        /// How far the agent's clock is behind the world's, after backward steps.
        var skew = Duration.zero
        for item in try list(node) {
            // A recording keeps both kernel clocks of each message, for whoever investigates it.
            let entry = try fields(item, "a timeline entry", allowed: ["at", "monotonic", "boottime"] + Self.eventKeys)
            let atNode = try entry.required("at")
            let at = try instant(atNode)
            if at < floor {
                throw fail(atNode, "time goes backwards: \(at)s comes after \(floor)s")
            }
            let kinds = entry.keys.filter { $0 != "at" && $0 != "monotonic" && $0 != "boottime" }
            guard kinds.count == 1, let kind = kinds.first, let value = entry.optional(kind) else {
                throw fail(item, "each timeline entry needs exactly one event besides 'at', one of: "
                    + Self.eventKeys.joined(separator: ", ") + (kinds.isEmpty ? "" : "; got " + kinds.joined(separator: ", ")))
            }
            let line = line(item)
            func add(_ event: ScenarioEvent, at time: Instant = at) { events.append(TimedEvent(at: time, line: line, event: event)) }
            /// `event` once (any value), or `{every, for}` from `at`; `holdsTheTimeline` makes
            /// later entries come after the last repetition.
            func addOnceOrRepeated(_ event: ScenarioEvent, _ what: String, holdsTheTimeline: Bool) throws(ScenarioError) {
                guard case .mapping = value.value else { return add(event) }
                let (every, length) = try repetition(value, what, count: events.count)
                var t = at
                while t < at + length {
                    add(event, at: t)
                    if holdsTheTimeline { floor = t }
                    t = t + every
                }
            }
            floor = at
            switch kind {
            case "link": add(.link(try linkSpec(value)))
            case "link-del": add(.linkRemoved(try string(value)))
            case "addr-add":
                let (dev, prefix, flags) = try address(value, withFlags: true)
                add(.addressAdded(dev: dev, prefix, flags))
            case "addr-del":
                let (dev, prefix, _) = try address(value, withFlags: false)
                add(.addressRemoved(dev: dev, prefix))
            case "route-add": add(.routeAdded(try route(value, adding: true)))
            case "route-del": add(.routeRemoved(try route(value, adding: false)))
            case "sleep":
                if sleeping { throw fail(item, "'sleep' while already asleep") }
                sleeping = true
                add(.sleep)
            case "wake":
                if !sleeping { throw fail(item, "'wake' without a 'sleep' before it") }
                sleeping = false
                add(.wake)
            case "suspend":
                if sleeping { throw fail(item, "'suspend' while already asleep") }
                let length = try positiveDuration(value)
                add(.sleep)
                add(.wake, at: at + length)
                floor = at + length
            case "clock-jump":
                // `-5s` steps the agent's clock back; never before its start.
                if case .scalar(let text) = value.value, text.hasPrefix("-"),
                   let length = ScenarioParser.parseDuration(String(text.dropFirst())), length > .zero {
                    guard length <= (at - Instant.zero) + skew else {
                        throw fail(value, "the clock cannot go back \(length.short): only \(((at - Instant.zero) + skew).short) have passed on it")
                    }
                    skew = skew - length
                    add(.clockBack(length))
                } else {
                    let length = try positiveDuration(value)
                    add(.clockJump(length))
                    floor = at + length
                }
            case "power": add(.power(try power(value)))
            case "server":
                let text = try string(value)
                guard let change = ServerChange(rawValue: text) else {
                    throw fail(value, "'server' is down, up, restart or moved, got \"\(text)\"")
                }
                add(.server(change))
            case "gateway-down", "gateway-up", "drain":
                let name = try string(value)
                guard let index = gateways.firstIndex(of: name) else {
                    throw fail(value, "no gateway named '\(name)' in 'gateways'")
                }
                let change: GatewayChange = kind == "drain" ? .drain : kind == "gateway-up" ? .up : .down
                add(.gateway(index, change))
            case "drop": add(.drop(try string(value)))
            case "refuse-bind":
                let refusal = try fields(value, "'refuse-bind'", allowed: ["dev", "times", "for"])
                let times = try opt(refusal.optional("times")) { node throws(ScenarioError) in try int(node, 1...1000) }
                let length = try opt(refusal.optional("for")) { node throws(ScenarioError) in try positiveDuration(node) }
                guard (times == nil) != (length == nil) else {
                    throw fail(value, "'refuse-bind' takes 'times' (the next binds refused) or 'for' (how long), one of them")
                }
                add(.refuseBind(dev: try string(try refusal.required("dev")), times: times, for: length))
            case "restore": add(.restore(try string(value)))
            case "portal":
                let portal = try fields(value, "'portal'", allowed: ["dev", "url"])
                add(.portal(dev: try string(try portal.required("dev")), url: try string(try portal.required("url"))))
            case "login": add(.login(try string(value)))
            case "proxy-dns":
                let answer = try fields(value, "'proxy-dns'", allowed: ["dev", "addresses"])
                add(.proxyDNS(dev: try string(try answer.required("dev")),
                              addresses: try list(try answer.required("addresses")).map { (item) throws(ScenarioError) in try ip(item) }))
            case "portal-window":
                let text = try string(value)
                guard text == "open" || text == "close" else { throw fail(value, "'portal-window' is open or close, got \"\(text)\"") }
                add(.portalWindow(text == "open"))
            case "auth":
                let text = try string(value)
                guard text == "accept" || text == "reject" else {
                    throw fail(value, "'auth' is accept or reject, got \"\(text)\"")
                }
                add(.auth(accepts: text == "accept"))
            case "reconnect": add(.reconnect)
            case "traffic": add(.traffic(try trafficPhase(value, "'traffic'", idle: true)))
            case "server-traffic": add(.serverTraffic(try trafficPhase(value, "'server-traffic'", idle: true)))
            case "operator":
                let text = try string(value)
                guard text == "down" || text == "up" else { throw fail(value, "'operator' is down or up, got \"\(text)\"") }
                add(.operatorPause(text == "down"))
            case "netlink": add(.netlink(try hex(value)))
            case "exclude":
                // Someone runs `agent exclude`: true, or their request's answer counted either way.
                guard try bool(value) else { throw fail(value, "'exclude' is true (someone runs agent exclude)") }
                add(.exclude)
            case "taken":
                let taken = try fields(value, "'taken'", allowed: ["what", "by", "fighting"])
                let whatNode = try taken.required("what")
                let what = try string(whatNode)
                guard let holding = Holding(rawValue: what) else {
                    throw fail(whatNode, "'taken' takes routing, resolvers or lockdown, got \"\(what)\"")
                }
                add(.taken(holding, by: try opt(taken.optional("by")) { node throws(ScenarioError) in try string(node) },
                           fighting: try opt(taken.optional("fighting")) { node throws(ScenarioError) in try positiveDuration(node) }))
            case "stop":
                switch try string(value) {
                case "signal": add(.stop(.bySignal))
                case "operator": add(.stop(.byOperator))
                case let text: throw fail(value, "'stop' is signal (SIGTERM: the lockdown stays) or operator (agent stop: the machine opens), got \"\(text)\"")
                }
            case "reload":
                // The configuration read again (SIGHUP): the scenario's `config` with these tunables
                // on top, the on-demand rules it gives now, and what of the tunnel it changes
                // (`tunnel-changes`, by the configuration's keys; none: the same tunnel).
                let reload = try fields(value, "'reload'", allowed: ["config", "on-demand", "tunnel-changes"])
                var tunables = config
                if let node = reload.optional("config") { try reconnectConfig(node, section: "'config'", into: &tunables) }
                let rules = try opt(reload.optional("on-demand")) { node throws(ScenarioError) in try onDemandRules(node) }
                let changes = try list(reload.optional("tunnel-changes")).map { (item) throws(ScenarioError) in try string(item) }
                add(.reload(tunables, rules ?? OnDemandRules(), tunnelChanges: changes))
            case "restart":
                // The agent's process ends and a new one starts (a crash, a service manager's
                // restart): once, or `{every, for}`.
                try addOnceOrRepeated(.restart, "'restart'", holdsTheTimeline: true)
            case "forged-hint":
                // Someone who sees the session's packets sends "session unknown" from the
                // server's address: once, or `{every, for}`, in the attacker's own rhythm (later
                // entries may fall between its hints).
                try addOnceOrRepeated(.forgedHint, "'forged-hint'", holdsTheTimeline: false)
            case "flap":
                let flap = try fields(value, "'flap'", allowed: ["dev", "every", "for", "gap"])
                let dev = try string(try flap.required("dev"))
                let (every, length) = try repetition(value, "'flap'", count: events.count)
                var t = at
                if let gapNode = flap.optional("gap") {
                    // A gap without carrier every `every` (access-point roams): off, then on `gap` later.
                    let gap = try positiveDuration(gapNode)
                    guard gap < every else { throw fail(gapNode, "a flap's 'gap' must be shorter than its 'every'") }
                    while t < at + length {
                        add(.link(LinkSpec(name: dev, carrier: false)), at: t)
                        add(.link(LinkSpec(name: dev, carrier: true)), at: t + gap)
                        t = t + every
                    }
                    floor = t - every + gap
                } else {
                    // Carrier toggles, ending with carrier back, as a loose cable or a bad AP does.
                    var carrier = false
                    while t < at + length {
                        add(.link(LinkSpec(name: dev, carrier: carrier)), at: t)
                        carrier.toggle()
                        t = t + every
                    }
                    if !carrier { add(.link(LinkSpec(name: dev, carrier: true)), at: t) }
                    floor = t
                }
            default:
                throw fail(item, "unknown event '\(kind)'")
            }
            if events.count > Self.maxEvents {
                throw fail(item, "the timeline holds more than \(Self.maxEvents) events")
            }
        }
        return events
    }

    /// `every` and `for` of an expanding event, refused when it would make more events than a
    /// scenario may hold (counted before anything is generated).
    func repetition(_ node: Node, _ what: String, count: Int) throws(ScenarioError) -> (every: Duration, length: Duration) {
        let f = try fields(node, what, allowed: what == "'flap'" ? ["dev", "every", "for", "gap"] : ["every", "for"])
        let every = try positiveDuration(try f.required("every"))
        let length = try positiveDuration(try f.required("for"))
        let steps = length.nanoseconds / max(every.nanoseconds, 1) + 2
        guard steps <= Int64(Self.maxEvents - count) else {
            throw fail(node, "\(what) every \(every.short) for \(length.short) makes \(steps) events; a scenario may hold at most \(Self.maxEvents)")
        }
        return (every, length)
    }

    func linkSpec(_ node: Node) throws(ScenarioError) -> LinkSpec {
        let f = try fields(node, "a link", allowed: ["name", "index", "kind", "up", "carrier", "mtu", "rtt", "loss", "loss-up",
                                                     "loss-down", "loss-v4", "loss-v6", "jitter", "path-mtu", "nat-timeout", "ssid", "gateway-mac",
                                                     "dns-domain", "probe-answers", "tls-key", "relays-probes", "blocks", "stream-reset-after"])
        var spec = LinkSpec(name: try string(try f.required("name")))
        if let n = f.optional("index") { spec.index = Int32(try int(n, 1...Int(Int32.max))) }
        if let n = f.optional("kind") { spec.kind = try linkKind(n) }
        if let n = f.optional("up") { spec.up = try bool(n) }
        if let n = f.optional("carrier") { spec.carrier = try bool(n) }
        if let n = f.optional("mtu") { spec.mtu = try int(n, 68...65535) }
        if let n = f.optional("rtt") { spec.rtt = try duration(n) }
        if let n = f.optional("loss") {
            let share = try percent(n)
            (spec.lossUp, spec.lossDown) = (share, share)
        }
        if let n = f.optional("loss-up") { spec.lossUp = try percent(n) }
        if let n = f.optional("loss-down") { spec.lossDown = try percent(n) }
        if let n = f.optional("loss-v4") { spec.lossV4 = try percent(n) }
        if let n = f.optional("loss-v6") { spec.lossV6 = try percent(n) }
        if let n = f.optional("jitter") { spec.jitter = try duration(n) }
        if let n = f.optional("path-mtu") { spec.pathMTU = try int(n, 68...65535) }
        if let n = f.optional("nat-timeout") { spec.natTimeout = try positiveDuration(n) }
        if let n = f.optional("ssid") { spec.ssid = try string(n) }
        if let n = f.optional("gateway-mac") {
            // `none`: the gateway never answers the kernel's ARP request or solicitation.
            spec.gatewayMAC = try string(n) == "none" ? "" : try gatewayMAC(n)
        }
        if let n = f.optional("dns-domain") {
            var domains: [String] = []
            for item in try oneOrMore(n) { domains.append(try string(item)) }
            spec.dnsDomains = domains
        }
        if let n = f.optional("probe-answers") {
            var urls: [String] = []
            for item in try list(n) { urls.append(try string(item)) }
            spec.probeAnswers = urls
        }
        if let n = f.optional("blocks") {
            let text = try string(n)
            guard let filter = LinkFilter(rawValue: text) else {
                throw fail(n, "'blocks' is none, udp, udp-but-dns, all-but-tcp-443 or all-but-proxy, got \"\(text)\"")
            }
            spec.blocks = filter
        }
        if let n = f.optional("stream-reset-after") { spec.streamResetAfter = try duration(n) }
        if let n = f.optional("relays-probes") { spec.relaysProbes = try bool(n) }
        if let n = f.optional("tls-key") {
            let text = try string(n)
            guard let key = KeyPin(text) else { throw fail(n, "'tls-key' is a key's pin, sha256// and 44 characters of base64") }
            spec.tlsKey = key
        }
        return spec
    }

    /// `30%` (or `0.3`) as a share of 0...1; anything outside 0...100 % is refused.
    func percent(_ node: Node) throws(ScenarioError) -> Double {
        let text = try string(node)
        let number = text.hasSuffix("%") ? Double(text.dropLast()).map { $0 / 100 } : Double(text)
        guard let share = number, share.isFinite, share >= 0, share <= 1 else {
            throw fail(node, "a loss is a share from 0% to 100% (e.g. 30% or 0.3), got \"\(text)\"")
        }
        return share
    }

    func linkKind(_ node: Node) throws(ScenarioError) -> LinkKind {
        let text = try string(node)
        guard let kind = LinkKind(rawValue: text) else {
            throw fail(node, "unknown link kind \"\(text)\"; use one of "
                + LinkKind.allCases.map(\.rawValue).joined(separator: ", "))
        }
        return kind
    }

    func address(_ node: Node, withFlags: Bool) throws(ScenarioError) -> (String, Prefix, AddressFlags) {
        let f = try fields(node, "an address", allowed: withFlags ? ["dev", "addr", "flags"] : ["dev", "addr"])
        let dev = try string(try f.required("dev"))
        let addrNode = try f.required("addr")
        let text = try string(addrNode)
        guard text.contains("/"), let prefix = Prefix(text) else {
            throw fail(addrNode, "'addr' needs address/length, e.g. 192.168.1.23/24, got \"\(text)\"")
        }
        var flags: AddressFlags = []
        for flag in try list(f.optional("flags")) {
            switch try string(flag) {
            case "temporary": flags.insert(.temporary)
            case "secondary": flags.insert(.secondary)
            case "deprecated": flags.insert(.deprecated)
            case "tentative": flags.insert(.tentative)
            case "dadfailed": flags.insert(.dadFailed)
            case "permanent": flags.insert(.permanent)
            case let other:
                throw fail(flag, "unknown address flag \"\(other)\"; use temporary, secondary, deprecated, tentative, dadfailed or permanent")
            }
        }
        return (dev, prefix, flags)
    }

    func route(_ node: Node, adding: Bool) throws(ScenarioError) -> RouteSpec {
        let f = try fields(node, "a route", allowed: ["to", "via", "dev", "nexthops", "metric", "src", "table", "type"])
        var hops: [(IPAddress?, String)] = []
        if let list = f.optional("nexthops") {
            for hop in try self.list(list) {
                let h = try fields(hop, "a next hop", allowed: ["via", "dev"])
                hops.append((try opt(h.optional("via")) { node throws(ScenarioError) in try ip(node) },
                             try string(try h.required("dev"))))
            }
        }
        if let dev = f.optional("dev") {
            hops.insert((try opt(f.optional("via")) { node throws(ScenarioError) in try ip(node) }, try string(dev)), at: 0)
        }
        if adding && hops.isEmpty { throw fail(node, "a route needs 'dev' (or 'nexthops')") }
        let source = try opt(f.optional("src")) { node throws(ScenarioError) in try ip(node) }
        let family = hops.compactMap(\.0).first?.family ?? source?.family ?? .v4
        let toNode = try f.required("to")
        let toText = try string(toNode)
        guard let to = Prefix(toText, defaultFamily: family) else {
            throw fail(toNode, "'to' needs default, an address or address/length, got \"\(toText)\"")
        }
        var type = RouteType.unicast
        if let n = f.optional("type") {
            let text = try string(n)
            switch text {
            case "unicast": type = .unicast
            case "local", "broadcast": type = .local
            case "blackhole", "unreachable", "prohibit": type = .reject
            default: throw fail(n, "unknown route type \"\(text)\"")
            }
        }
        return RouteSpec(
            to: to, hops: hops,
            metric: try opt(f.optional("metric")) { node throws(ScenarioError) in UInt32(try int(node, 0...Int(UInt32.max))) },
            source: source,
            table: try opt(f.optional("table")) { node throws(ScenarioError) in UInt32(try int(node, 0...Int(UInt32.max))) }
                ?? Route.mainTable,
            type: type)
    }

    /// One address, or a list: every address of a dual-stack server, as its name gives them.
    func serverAddresses(_ node: Node) throws(ScenarioError) -> [IPAddress] {
        var servers: [IPAddress] = []
        for item in try oneOrMore(node) {
            let text = try string(item)
            guard let address = Endpoint(text)?.address else {
                throw fail(item, "'server' needs an IP address (with an optional port), got \"\(text)\"")
            }
            guard !servers.contains(address) else { throw fail(item, "'server' lists \(address) twice") }
            servers.append(address)
        }
        return servers
    }

    // MARK: Configuration and expectations

    func expectations(_ node: Node) throws(ScenarioError) -> Expectations {
        let f = try fields(node, "'expect'", allowed: [
            "state", "path", "max-attempts", "min-attempts", "max-handshakes", "min-handshakes", "max-probes", "min-probes",
            "max-checks", "min-checks", "max-outage", "sequence", "never", "windows", "path-at", "state-at", "max-cpu", "server",
            "lockdown-lifted", "max-resends", "min-resends", "time-on", "tunnel-mtu", "max-size-probes", "min-size-probes",
            "max-lost-from-server", "min-from-server", "max-keepalives", "min-keepalives", "gives-up", "machine-opened",
            "max-restores", "min-restores", "max-holds", "min-holds", "max-missing", "excluded", "exclusions-refused",
            "portal-windows-not-needed", "portal-windows-failed", "server-names-unusable", "server-address", "resolvers-at",
            "resolver-decisions", "proxies-allowed", "proxies-refused", "restarts-in-place", "servers-inside-the-routes",
            "watchdog-pings", "start-extensions", "metrics-writes",
        ])
        var e = Expectations()
        if let n = f.optional("state") { e.state = try stateName(n) }
        if let n = f.optional("path") { e.path = try string(n) }
        if let n = f.optional("server") { e.server = try string(n) }
        if let n = f.optional("server-address") {
            let text = try string(n)
            guard let address = IPAddress(text) else { throw fail(n, "'server-address' is an IP address, got \"\(text)\"") }
            e.serverAddress = address
        }
        if let n = f.optional("lockdown-lifted") { e.lockdownLifted = try bool(n) }
        if let n = f.optional("machine-opened") { e.machineOpened = try bool(n) }
        if let n = f.optional("gives-up") {
            // true, false, or the stretch {from, to} it gives up in.
            if case .scalar = n.value {
                e.givesUp = try bool(n) ? .within(from: .zero, to: Instant(nanoseconds: .max)) : .never
            } else {
                let (from, to) = try stretch(try fields(n, "'gives-up'", allowed: ["from", "to"]), "'gives-up'")
                e.givesUp = .within(from: from, to: to)
            }
        }
        // The expectations that bound a count, by key.
        let countKeys: [(String, WritableKeyPath<Expectations, Int?>)] = [
            ("max-attempts", \.maxAttempts), ("min-attempts", \.minAttempts),
            ("max-handshakes", \.maxHandshakes), ("min-handshakes", \.minHandshakes),
            ("max-probes", \.maxProbes), ("min-probes", \.minProbes),
            ("max-resends", \.maxResends), ("min-resends", \.minResends),
            ("max-size-probes", \.maxSizeProbes), ("min-size-probes", \.minSizeProbes),
            ("max-checks", \.maxChecks), ("min-checks", \.minChecks),
            ("max-lost-from-server", \.maxLostFromServer), ("min-from-server", \.minFromServer),
            ("max-keepalives", \.maxKeepalives), ("min-keepalives", \.minKeepalives),
            ("excluded", \.excluded), ("exclusions-refused", \.exclusionsRefused),
            ("portal-windows-not-needed", \.portalWindowsNotNeeded), ("portal-windows-failed", \.portalWindowsFailed),
            ("server-names-unusable", \.serverNamesUnusable), ("resolver-decisions", \.resolverDecisions),
            ("proxies-allowed", \.proxiesAllowed), ("proxies-refused", \.proxiesRefused),
            ("restarts-in-place", \.restartsInPlace), ("servers-inside-the-routes", \.serversCarried),
            ("watchdog-pings", \.watchdogPings), ("start-extensions", \.startExtensions), ("metrics-writes", \.metricsWrites),
            ("max-restores", \.maxRestores), ("min-restores", \.minRestores), ("max-holds", \.maxHolds), ("min-holds", \.minHolds),
        ]
        for (key, field) in countKeys {
            if let n = f.optional(key) { e[keyPath: field] = try int(n, 0...Int.max) }
        }
        if let n = f.optional("tunnel-mtu") { e.tunnelMTU = try int(n, 576...9000) }
        for item in try list(f.optional("time-on")) {
            let t = try fields(item, "a time-on entry", allowed: ["path", "min", "max"])
            let min = try opt(t.optional("min")) { node throws(ScenarioError) in try duration(node) }
            let maxNode = t.optional("max")
            let max = try opt(maxNode) { node throws(ScenarioError) in try duration(node) }
            if let min, let max, let maxNode, max < min { throw fail(maxNode, "a time-on entry's 'max' is below its 'min'") }
            if min == nil && max == nil { throw fail(item, "a time-on entry needs 'min' or 'max'") }
            e.timeOn.append((try string(try t.required("path")), min, max))
        }
        if let n = f.optional("max-outage") { e.maxOutage = try duration(n) }
        if let n = f.optional("max-missing") { e.maxMissing = try duration(n) }
        for item in try list(f.optional("sequence")) {
            let text = try string(item)
            _ = try stateName(item, text: String(text.prefix { $0 != ":" }))
            e.sequence.append(text)
        }
        for item in try list(f.optional("never")) {
            let text = try string(item)
            _ = try stateName(item, text: String(text.prefix { $0 != ":" }))
            e.never.append(text)
        }
        if let n = f.optional("max-cpu") { e.maxCPU = try positiveDuration(n) }
        for item in try list(f.optional("windows")) {
            let w = try fields(item, "a window", allowed: ["from", "to", "max-attempts", "min-attempts", "max-handshakes",
                                                           "max-probes", "max-checks", "max-transitions"])
            let (from, to) = try stretch(w, "a window")
            e.windows.append(Expectations.Window(
                from: from, to: to,
                maxAttempts: try opt(w.optional("max-attempts")) { node throws(ScenarioError) in try int(node, 0...Int.max) },
                minAttempts: try opt(w.optional("min-attempts")) { node throws(ScenarioError) in try int(node, 0...Int.max) },
                maxHandshakes: try opt(w.optional("max-handshakes")) { node throws(ScenarioError) in try int(node, 0...Int.max) },
                maxProbes: try opt(w.optional("max-probes")) { node throws(ScenarioError) in try int(node, 0...Int.max) },
                maxChecks: try opt(w.optional("max-checks")) { node throws(ScenarioError) in try int(node, 0...Int.max) },
                maxTransitions: try opt(w.optional("max-transitions")) { node throws(ScenarioError) in try int(node, 0...Int.max) }))
        }
        for item in try list(f.optional("resolvers-at")) {
            let r = try fields(item, "a resolvers-at entry", allowed: ["at", "use", "in-clear"])
            let use = try list(try r.required("use")).map { (n) throws(ScenarioError) in try ip(n) }
            let inClear = try list(r.optional("in-clear")).map { (n) throws(ScenarioError) in try ip(n) }
            e.resolversAt.append((try instant(try r.required("at")), use, inClear))
        }
        for item in try list(f.optional("path-at")) {
            let p = try fields(item, "a path-at entry", allowed: ["at", "path"])
            e.pathAt.append((try instant(try p.required("at")), try string(try p.required("path"))))
        }
        for item in try list(f.optional("state-at")) {
            let p = try fields(item, "a state-at entry", allowed: ["at", "state"])
            e.stateAt.append((try instant(try p.required("at")), try stateName(try p.required("state"))))
        }
        return e
    }

    static let stateNames = ["offline", "connecting", "connected", "probing", "switching", "sleeping", "portal",
                             "backing-off", "failed", "paused", "disconnected"]

    /// Reads a state name, or checks `text` (the state part of a `state:reason` entry).
    func stateName(_ node: Node, text: String? = nil) throws(ScenarioError) -> String {
        let name: String
        if let text { name = text } else { name = try string(node) }
        guard Self.stateNames.contains(name) else {
            throw fail(node, "unknown state \"\(name)\"; states are " + Self.stateNames.joined(separator: ", "))
        }
        return name
    }

    func power(_ node: Node) throws(ScenarioError) -> PowerSource {
        let text = try string(node)
        guard let source = PowerSource(rawValue: text) else { throw fail(node, "'power' is ac or battery, got \"\(text)\"") }
        return source
    }

    func instant(_ node: Node) throws(ScenarioError) -> Instant { Instant.zero + (try duration(node)) }

    /// A stretch of the timeline, from the fields `from` and `to` of `w` (`what`, for errors).
    func stretch(_ w: Fields, _ what: String) throws(ScenarioError) -> (from: Instant, to: Instant) {
        let from = try instant(try w.required("from"))
        let toNode = try w.required("to")
        let to = try instant(toNode)
        if to < from { throw fail(toNode, "'to' comes before 'from' in \(what)") }
        return (from, to)
    }
}
