import Basics
public import ConfigReader
import Connectivity
import Reconnector
import Tunnel
import Device
import Lockdown

/// The client's and the server's configuration files, read into settings.
extension YAMLReader {
    /// Every top-level key of the client's configuration, in the order a reload names them.
    public static let clientKeys = [
        "server", "server-key", "servers", "private-key-file", "username", "password-file", "tunnel", "mode", "routes",
        "reconnect", "persistent-keepalive", "lockdown", "allow-lan", "never-local", "dns", "metrics-file",
        "portal", "on-demand", "protocol", "protocol-fallback", "cipher", "exclusion", "tcp", "operators",
    ]

    public func client(_ root: Node) throws(ConfigError) -> ClientSettings {
        let f = try fields(root, "the client configuration", allowed: Self.clientKeys)
        let sharedKey = try opt(f.optional("server-key")) { node throws(ConfigError) in try publicKey(node) }
        let servers: [ServerEntry]
        switch (f.optional("server"), f.optional("servers")) {
        case (let node?, nil):
            guard let server = Endpoint(try string(node)), server.port != nil else {
                throw fail(node, "'server' needs host:port, e.g. vpn.example.com:51820")
            }
            guard let sharedKey else { throw fail(root, "'server' needs 'server-key', the server's public key") }
            servers = [ServerEntry(name: server.host, endpoint: server, key: sharedKey)]
        case (nil, let node?):
            servers = try serverList(node, sharedKey: sharedKey)
        case (let node?, _?):
            throw fail(node, "'server' and 'servers' cannot both be set: list every server under 'servers'")
        case (nil, nil):
            throw fail(root, "the client configuration needs 'server' (host:port) or 'servers' (a list)")
        }
        var settings = ClientSettings(
            servers: servers,
            privateKeyFile: try string(try f.required("private-key-file")),
            username: try opt(f.optional("username")) { node throws(ConfigError) in try string(node) },
            passwordFile: try opt(f.optional("password-file")) { node throws(ConfigError) in try string(node) },
            written: Dictionary(uniqueKeysWithValues: f.entries.map { ($0.key, $0.value.content) }))
        if settings.username != nil && settings.passwordFile == nil {
            throw fail(root, "'username' needs 'password-file' (a file only root can read, holding the password)")
        }
        if let node = f.optional("tunnel") { settings.tunnel = try tunnel(node, needsAddress: false) }
        let routes = try list(f.optional("routes")).map { node throws(ConfigError) in try prefix(node) }
        let mode = try opt(f.optional("mode")) { node throws(ConfigError) in try string(node) } ?? "full"
        switch mode {
        case "full":
            if let node = f.optional("routes"), !routes.isEmpty {
                throw fail(node, "'routes' are for mode: split; full mode sends everything through the tunnel")
            }
            settings.mode = .full(FullTunnel(neverLocal: try neverLocal(f.optional("never-local"))))
        case "split":
            if let node = f.optional("never-local") {
                throw fail(node, "'never-local' is for mode: full; split mode's routes are never local already")
            }
            guard !routes.isEmpty else { throw fail(root, "mode: split needs 'routes', the prefixes to send through the tunnel") }
            settings.mode = .split(routes)
        case let other:
            throw fail(f.optional("mode"), "'mode' is full or split, got \"\(other)\"")
        }
        if let node = f.optional("reconnect") { try reconnectConfig(node, section: "'reconnect'", into: &settings.reconnect) }
        if let node = f.optional("tcp") {
            settings.stream = try clientStream(node)
            // The core races the stream against UDP and comes back to UDP on its own timings.
            settings.reconnect.stream = settings.reconnect.stream ?? Config.StreamPolicy()
        } else if settings.reconnect.stream != nil {
            throw fail(f.optional("reconnect"), "'reconnect: stream' needs 'tcp', which says how to reach the servers over TLS")
        }
        // Path MTU discovery searches between the tunnel's minimum and its configured MTU.
        settings.reconnect.maxMTU = settings.tunnel.mtu
        if let minimum = settings.reconnect.minMTU, minimum > settings.tunnel.mtu,
           let section = f.optional("reconnect"),
           let node = try fields(section, "'reconnect'", allowed: Config.fileKeys).optional("min-mtu") {
            throw fail(node, "'min-mtu' (\(minimum)) is above the tunnel's 'mtu' (\(settings.tunnel.mtu))")
        }
        if let node = f.optional("persistent-keepalive") {
            let interval = try duration(node)
            guard interval == .zero || (Duration.seconds(1)...Duration.seconds(3600)).contains(interval) else {
                throw fail(node, "'persistent-keepalive' is 0 (off) or 1s to 1h, e.g. 25s")
            }
            settings.persistentKeepalive = interval == .zero ? nil : interval
        }
        if let node = f.optional("lockdown") { settings.lockdown = try bool(node) }
        if let node = f.optional("allow-lan") {
            if case .sequence = node.value {
                settings.lanRanges = try lanRanges(node)
                settings.allowLAN = true
            } else {
                settings.allowLAN = try bool(node)
            }
            if settings.allowLAN, settings.mode.socketMark == nil {
                throw fail(node, "'allow-lan' is for mode: full; split mode leaves the LAN alone already")
            }
        }
        if let node = f.optional("exclusion") {
            switch try string(node) {
            case "allow": settings.exclusionAllowed = true
            case "off": settings.exclusionAllowed = false
            case let other: throw fail(node, "'exclusion' is allow or off (the default), got \"\(other)\"")
            }
            if settings.exclusionAllowed, settings.mode.socketMark == nil || !settings.lockdown {
                throw fail(node, "'exclusion' is for mode: full with the lockdown on; elsewhere an application reaches the network "
                    + "outside the tunnel already")
            }
        }
        if let node = f.optional("operators") {
            switch try string(node) {
            case "group": settings.groupOperates = true
            case "root": settings.groupOperates = false
            case let other: throw fail(node, "'operators' is group (the default: the roam group may connect, disconnect and reconnect) "
                + "or root, got \"\(other)\"")
            }
        }
        if let node = f.optional("dns") { settings.dns = try clientDNS(node) }
        if let node = f.optional("metrics-file") {
            let path = try string(node)
            guard path.hasPrefix("/"), path.hasSuffix(".prom"), !path.hasSuffix("/.prom") else {
                throw fail(node, "'metrics-file' is an absolute path ending in .prom (node_exporter's textfile collector reads "
                    + "no other), e.g. /var/lib/prometheus/node-exporter/roam.prom")
            }
            settings.metricsFile = path
        }
        if let node = f.optional("protocol") {
            let version = try int(node, 2...3)
            settings.protocolVersion = UInt8(version)
        }
        if let node = f.optional("protocol-fallback") {
            settings.protocolFallback = try bool(node)
            if settings.protocolFallback, settings.protocolVersion == 2 {
                throw fail(node, "'protocol-fallback' is for protocol 3 (the default): protocol 2 has nothing to fall back to")
            }
        }
        if let node = f.optional("cipher") {
            settings.cipher = try cipher(node)
            if settings.protocolVersion == 2 { throw fail(node, "'cipher' is for protocol 3: protocol 2 always uses chacha20-poly1305") }
        }
        if let node = f.optional("portal") { try portal(node, into: &settings) }
        if let node = f.optional("on-demand") {
            settings.onDemand = try onDemandRules(node)
            for rule in settings.onDemand.rules {
                if let probe = rule.match.probe, CheckURL(probe.url) == nil {
                    throw ConfigError(file: file, line: rule.line, message: "\(rule.name): the probe's url \"\(probe.url)\" is not a usable URL")
                }
                if rule.liftsLockdown, !settings.lockdown {
                    throw ConfigError(file: file, line: rule.line, message: "\(rule.name): 'lockdown: lift' with 'lockdown: false': there is no lockdown to lift")
                }
            }
        }
        return settings
    }

    /// `portal`: the connectivity check (`check`, `url`, `expect`) and its timing (`recheck`,
    /// `recheck-cap`, `window`).
    private func portal(_ node: Node, into settings: inout ClientSettings) throws(ConfigError) {
        let f = try fields(node, "'portal'", allowed: ["check", "url", "expect", "recheck", "recheck-cap", "window"])
        if let n = f.optional("check") { settings.reconnect.portalCheck = try bool(n) }
        if let n = f.optional("url") {
            let text = try string(n)
            guard let url = CheckURL(text), !url.isHTTPS else {
                throw fail(n, "'url' is a plain http:// URL (a portal can only intercept plain HTTP), e.g. "
                    + PortalCheck.standard.url.text + "; got \"\(text)\"")
            }
            settings.portal.url = url
            // Another URL answers otherwise than NetworkManager's.
            if f.optional("expect") == nil {
                throw fail(n, "'url' needs 'expect': the status code (e.g. 204) or the start of the body it answers with")
            }
        }
        if let n = f.optional("expect") { settings.portal.expect = try httpExpectation(n) }
        if let n = f.optional("recheck") { settings.reconnect.portalRecheck = try positiveDuration(n) }
        if let n = f.optional("recheck-cap") { settings.reconnect.portalRecheckCap = try positiveDuration(n) }
        if settings.reconnect.portalRecheckCap < settings.reconnect.portalRecheck {
            throw fail(f.optional("recheck-cap") ?? node, "'recheck-cap' is shorter than 'recheck'")
        }
        if let n = f.optional("window") {
            let window = try positiveDuration(n)
            guard window <= .seconds(3600) else { throw fail(n, "'window' is at most 1h, e.g. 5m") }
            settings.reconnect.portalWindow = window
        }
    }

    /// `never-local`: subnets no network may claim as local (the intranet's ranges), exact
    /// subnets, no default route.
    private func neverLocal(_ node: Node?) throws(ConfigError) -> [Prefix] {
        guard let node else { return [] }
        return try list(node).map { item throws(ConfigError) in
            let text = try string(item)
            guard text.contains("/"), let range = Prefix(text), range.length > 0 else {
                throw fail(item, "'never-local' lists \"\(text)\", which is not a subnet: write address/length, e.g. 10.0.0.0/8")
            }
            guard range.network == range else {
                throw fail(item, "'never-local' lists \(text), whose address has bits set past /\(range.length): did you mean \(range.network)?")
            }
            return range
        }
    }

    /// `allow-lan` as a list: the ranges that count as local besides the private ones, each
    /// inside a private, shared (RFC 6598) or link-local range, so a typo cannot open the internet.
    private func lanRanges(_ node: Node) throws(ConfigError) -> [Prefix] {
        let items = try list(node)
        guard !items.isEmpty else {
            throw fail(node, "'allow-lan' lists no range: write 'allow-lan: true' for the private ranges alone, "
                + "or list the ranges to add, e.g. [100.64.0.0/10]")
        }
        let listable = LockdownPolicy.listableRanges.map(\.description).joined(separator: ", ")
        return try items.map { item throws(ConfigError) in
            let text = try string(item)
            guard text.contains("/"), let range = Prefix(text) else {
                throw fail(item, "'allow-lan' lists \"\(text)\", which is not a range: write address/length, e.g. 100.64.0.0/10")
            }
            guard range.network == range else {
                throw fail(item, "'allow-lan' lists \(text), whose address has bits set past /\(range.length): did you mean \(range.network)?")
            }
            guard LockdownPolicy.mayCountAsLocal(range) else {
                throw fail(item, "'allow-lan' lists \(text), which is not a private, shared or link-local range; "
                    + "only ranges inside \(listable) can count as local")
            }
            return range
        }
    }

    /// `servers`: each `{address: host:port, key, name, priority}`; `key` defaults to the shared
    /// `server-key`, `name` to the host, `priority` to 100 (lower is tried first; equal ones in
    /// the order listed).
    private func serverList(_ node: Node, sharedKey: PublicKey?) throws(ConfigError) -> [ServerEntry] {
        var entries: [(entry: ServerEntry, priority: Int, node: Node)] = []
        for item in try list(node) {
            let f = try fields(item, "a server", allowed: ["address", "key", "name", "priority"])
            let addressNode = try f.required("address")
            guard let endpoint = Endpoint(try string(addressNode)), endpoint.port != nil else {
                throw fail(addressNode, "a server's 'address' needs host:port, e.g. vpn.example.com:51820")
            }
            let key = try opt(f.optional("key")) { node throws(ConfigError) in try publicKey(node) } ?? sharedKey
            guard let key else { throw fail(item, "server \(endpoint) needs 'key' (or a shared 'server-key')") }
            let name = try opt(f.optional("name")) { node throws(ConfigError) in try string(node) } ?? endpoint.host
            guard !name.isEmpty, !name.contains(where: { $0.isWhitespace || $0 == "=" || $0 == "\"" }) else {
                throw fail(f.optional("name"), "a server's 'name' is one word, e.g. fra1")
            }
            let priority = try opt(f.optional("priority")) { node throws(ConfigError) in try int(node, 0...65535) } ?? 100
            let same = { (other: Endpoint) in other.host.lowercased() == endpoint.host.lowercased() && other.port == endpoint.port }
            if let earlier = entries.first(where: { same($0.entry.endpoint) }) {
                throw fail(addressNode, "'servers' lists \(endpoint) twice (first on line \(earlier.node.line))")
            }
            if let earlier = entries.first(where: { $0.entry.name == name }) {
                throw fail(item, "'servers' names two servers \(name) (first on line \(earlier.node.line)); give each its own 'name'")
            }
            entries.append((ServerEntry(name: name, endpoint: endpoint, key: key), priority, item))
        }
        guard !entries.isEmpty else { throw fail(node, "'servers' lists no server") }
        return entries.enumerated().sorted { ($0.element.priority, $0.offset) < ($1.element.priority, $1.offset) }
            .map(\.element.entry)
    }

    public func server(_ root: Node) throws(ConfigError) -> ServerSettings {
        let f = try fields(root, "the server configuration", allowed: [
            "listen-port", "private-key-file", "tunnel", "users", "users-from", "dns", "drain-period", "workers", "metrics-listen",
            "allow-versions", "cipher", "tcp",
        ])
        var database = UserDatabase.empty
        var source: UserSource?
        switch (f.optional("users"), f.optional("users-from")) {
        case (let usersNode?, nil):
            let users = try list(usersNode).map { node throws(ConfigError) in try user(node) }
            do {
                database = try UserDatabase(users)
            } catch {
                throw fail(usersNode, "\(error)")
            }
        case (nil, let node?): source = try userSource(node)
        case (_?, let node?): throw fail(node, "'users' and 'users-from' both give the users: keep one")
        case (nil, nil): throw fail(root, "missing 'users' (the list) or 'users-from' (the fleet's PostgreSQL directory)")
        }
        var settings = ServerSettings(
            listenPort: UInt16(try int(try f.required("listen-port"), 1...65535)),
            privateKeyFile: try string(try f.required("private-key-file")),
            tunnel: try tunnel(try f.required("tunnel"), needsAddress: true),
            users: database,
            usersFrom: source,
            dns: try opt(f.optional("dns")) { node throws(ConfigError) in try dns(node, "'dns'") } ?? .none)
        if let node = f.optional("drain-period") {
            let period = try duration(node)
            guard period <= .seconds(3600) else { throw fail(node, "'drain-period' is 0 (off) to 1h, e.g. 30s") }
            settings.drainPeriod = period
        }
        if let node = f.optional("workers") { settings.workers = try int(node, 1...ServerSettings.maxWorkers) }
        if let node = f.optional("metrics-listen") {
            // Never every address by accident: the counts are for the operator's network only.
            guard let endpoint = Endpoint(try string(node)), let address = SocketAddress(endpoint), !address.ip.isUnspecified else {
                throw fail(node, "'metrics-listen' is an address of this host and a port, e.g. 127.0.0.1:9586 or [::1]:9586")
            }
            settings.metricsListen = address
        }
        if let node = f.optional("allow-versions") {
            var versions: Set<UInt8> = []
            for item in try list(node) { versions.insert(UInt8(try int(item, 2...3))) }
            guard !versions.isEmpty else { throw fail(node, "'allow-versions' lists the protocol versions clients may speak: 2, 3 or both") }
            settings.protocols.versions = versions
        }
        if let node = f.optional("cipher") {
            settings.protocols.cipher = try cipher(node)
            if !settings.protocols.versions.contains(3) {
                throw fail(node, "'cipher' is for protocol 3, which 'allow-versions' closes; protocol 2 always uses chacha20-poly1305")
            }
        }
        if let node = f.optional("tcp") { settings.stream = try serverStream(node) }
        if let stream = settings.stream, let metrics = settings.metricsListen, metrics.port == stream.port {
            throw fail(f.optional("tcp"), "'tcp' and 'metrics-listen' both want TCP port \(stream.port)")
        }
        return settings
    }

    /// The gateway's `tcp`: a port alone, or `{port, addresses, name, certificate, certificate-key}`.
    private func serverStream(_ node: Node) throws(ConfigError) -> ServerStreamSettings {
        // A certificate's name (its CN) holds at most 64 bytes: a longer host name gives its first label.
        let host = hostName(fully: true)
        var stream = ServerStreamSettings(name: host.utf8.count <= 64 ? host : hostName())
        guard case .mapping = node.value else {
            stream.port = UInt16(try int(node, 1...65535))
            return stream
        }
        let f = try fields(node, "'tcp'", allowed: ["port", "addresses", "name", "certificate", "certificate-key"])
        if let n = f.optional("port") { stream.port = UInt16(try int(n, 1...65535)) }
        if let n = f.optional("addresses") {
            var addresses: [IPAddress] = []
            for item in try oneOrMore(n) {
                let address = try ip(item)
                guard !addresses.contains(address) else { throw fail(item, "'tcp' 'addresses' names \(address) twice") }
                addresses.append(address)
            }
            guard !addresses.isEmpty else { throw fail(n, "'tcp' 'addresses' is empty: leave it out to take TLS on every address") }
            stream.addresses = addresses
        }
        if let n = f.optional("name") {
            stream.name = try hostLikeName(n, "'tcp' 'name'")
            guard stream.name.utf8.count <= 64 else { throw fail(n, "the gateway's 'tcp' 'name' is on its certificate: 64 bytes at most") }
        }
        switch (f.optional("certificate"), f.optional("certificate-key")) {
        case (let chain?, let key?):
            stream.certificate = (try absolutePath(chain, "'certificate'"), try absolutePath(key, "'certificate-key'"))
        case (nil, nil): break
        case (_?, nil): throw fail(node, "'certificate' needs 'certificate-key', the file of its private key")
        case (nil, _?): throw fail(node, "'certificate-key' needs 'certificate', the file of its chain")
        }
        return stream
    }

    /// The client's `tcp`: a port alone, or `{port, name, proxy}`; `proxy` is an address and
    /// port, or `{address, user, password-file}`.
    private func clientStream(_ node: Node) throws(ConfigError) -> ClientStreamSettings {
        var stream = ClientStreamSettings()
        guard case .mapping = node.value else {
            stream.port = UInt16(try int(node, 1...65535))
            return stream
        }
        let f = try fields(node, "'tcp'", allowed: ["port", "name", "proxy"])
        if let n = f.optional("port") { stream.port = UInt16(try int(n, 1...65535)) }
        if let n = f.optional("name") { stream.serverName = try hostLikeName(n, "'tcp' 'name'") }
        if let n = f.optional("proxy") {
            let p: Fields? = if case .mapping = n.value { try fields(n, "'proxy'", allowed: ["address", "user", "password-file"]) } else { nil }
            let addressNode = try p?.required("address") ?? n
            let example = "a proxy is a host name or an IP address, and a port, e.g. proxy.corp.example:3128, 192.0.2.8:3128 or [2001:db8::8]:3128"
            guard let endpoint = Endpoint(try string(addressNode)), endpoint.port != nil,
                  endpoint.address.map({ !$0.isUnspecified }) ?? Self.isHostName(endpoint.host) else {
                throw fail(addressNode, example)
            }
            var proxy = ProxySettings(endpoint: endpoint)
            if let u = p?.optional("user") {
                let user = try string(u)
                guard !user.isEmpty, !user.contains(":"), !user.contains(where: { $0.isWhitespace || $0.isNewline }) else {
                    throw fail(u, "a proxy's 'user' is one word without ':'")
                }
                proxy.user = user
                guard let file = p?.optional("password-file") else { throw fail(n, "a proxy's 'user' needs 'password-file'") }
                proxy.passwordFile = try absolutePath(file, "'password-file'")
            } else if let file = p?.optional("password-file") {
                throw fail(file, "a proxy's 'password-file' needs 'user'")
            }
            stream.proxy = proxy
        }
        return stream
    }

    /// A DNS name as SNI and certificates carry it: letters, digits, '-' and '.'.
    private func hostLikeName(_ node: Node, _ what: String) throws(ConfigError) -> String {
        let name = try string(node)
        guard Self.isHostName(name) else { throw fail(node, "\(what) is a host name, e.g. vpn.example.net") }
        return name
    }

    /// Whether `name` is a DNS host name (not an address): letters, digits and '-' in labels,
    /// the last not a number (decimal, or hexadecimal after `0x`), which the C library's resolver
    /// would read as an address (`127.1`, `0x7f000001`).
    static func isHostName(_ name: String) -> Bool {
        let labels = name.split(separator: ".", omittingEmptySubsequences: false)
        let last = labels.last.map { $0.lowercased() } ?? ""
        let numeric = last.allSatisfy(\.isNumber) || (last.hasPrefix("0x") && last.dropFirst(2).allSatisfy(\.isHexDigit))
        return (1...253).contains(name.utf8.count) && IPAddress(name) == nil && !numeric
            && labels.allSatisfy {
                (1...63).contains($0.utf8.count) && $0.utf8.allSatisfy { c in
                    (c >= 0x30 && c <= 0x39) || (c >= 0x41 && c <= 0x5A) || (c >= 0x61 && c <= 0x7A) || c == 0x2D
                }
            }
    }

    /// `users-from`: a URL alone, or `{url, password-file, snapshot, gateway}`.
    private func userSource(_ node: Node) throws(ConfigError) -> UserSource {
        let f: Fields? = if case .mapping = node.value {
            try fields(node, "'users-from'", allowed: ["url", "password-file", "snapshot", "gateway"])
        } else { nil }
        let urlNode = try f?.required("url") ?? node
        let url = try string(urlNode)
        if let problem = UserSource.problem(with: url) { throw fail(urlNode, problem) }
        var source = UserSource(url: url, gateway: hostName())
        if let n = f?.optional("password-file") { source.passwordFile = try absolutePath(n, "'password-file'") }
        if let n = f?.optional("snapshot") { source.snapshot = try absolutePath(n, "'snapshot'") }
        if let n = f?.optional("gateway") {
            let name = try string(n)
            guard (1...63).contains(name.utf8.count), !name.contains(where: { $0.isWhitespace || $0 == "\"" || $0 == "=" }) else {
                throw fail(n, "'gateway' is one word of 1 to 63 bytes, e.g. fra1")
            }
            source.gateway = name
        }
        return source
    }

    private func absolutePath(_ node: Node, _ what: String) throws(ConfigError) -> String {
        let path = try string(node)
        guard path.hasPrefix("/") else { throw fail(node, "\(what) is an absolute path, e.g. /var/lib/roam/users.snapshot") }
        return path
    }

    /// The host's name, as `gateway` defaults to: its first label (session records name
    /// gateways in at most 63 bytes); `fully`, all of it (a certificate's name).
    private func hostName(fully: Bool = false) -> String {
        let full = SystemFiles.hostName() ?? ""
        let bytes = Array(fully ? full.utf8.prefix(253) : full.utf8.prefix { $0 != UInt8(ascii: ".") }.prefix(63))
        let name = String(decoding: bytes, as: UTF8.self)
        return name.isEmpty ? "gateway" : name
    }

    /// A cipher by the name status and logs give it.
    private func cipher(_ node: Node) throws(ConfigError) -> CipherSuite {
        let name = try string(node)
        guard let suite = CipherSuite.allCases.first(where: { $0.description == name }) else {
            throw fail(node, "'cipher' is one of \(CipherSuite.allCases.map(\.description).joined(separator: ", ")), got \"\(name)\"")
        }
        return suite
    }

    /// `dns: {servers: [...], search: [...]}`: resolvers, then search domains.
    private func dns(_ node: Node, _ what: String, extra: [String] = []) throws(ConfigError) -> DNSSettings {
        let f = try fields(node, what, allowed: ["servers", "search"] + extra)
        let servers = try list(f.optional("servers")).map { node throws(ConfigError) in try ip(node) }
        let search = try list(f.optional("search")).map { node throws(ConfigError) in try string(node) }
        do {
            return try DNSSettings(resolvers: servers, searchDomains: search)
        } catch {
            throw fail(node, "\(what): \(error)")
        }
    }

    /// The client's `dns`: an override of what the server pushes, and who is told.
    private func clientDNS(_ node: Node) throws(ConfigError) -> ClientDNSSettings {
        let f = try fields(node, "'dns'", allowed: ["servers", "search", "manager"])
        var settings = ClientDNSSettings()
        if f.optional("servers") != nil || f.optional("search") != nil {
            settings.override = try dns(node, "'dns'", extra: ["manager"])
        }
        if let n = f.optional("manager") {
            let name = try string(n)
            guard let manager = DNSManagerChoice(rawValue: name) else {
                throw fail(n, "'manager' is one of \(DNSManagerChoice.allCases.map(\.rawValue).joined(separator: ", ")), got \"\(name)\"")
            }
            settings.manager = manager
        }
        return settings
    }

    private func tunnel(_ node: Node, needsAddress: Bool) throws(ConfigError) -> TunnelSettings {
        let f = try fields(node, "'tunnel'", allowed: ["name", "mtu", "addresses", "offload"])
        var t = TunnelSettings()
        if let n = f.optional("name") {
            let name = try string(n)
            guard (1...15).contains(name.utf8.count), !name.contains("/"), !name.contains(where: \.isWhitespace) else {
                throw fail(n, "an interface name has 1 to 15 characters, no '/' or spaces")
            }
            t.name = name
        }
        if let n = f.optional("mtu") { t.mtu = try int(n, 576...9000) }
        if let n = f.optional("offload") { t.offload = try bool(n) }
        t.addresses = try list(f.optional("addresses")).map { node throws(ConfigError) in try prefix(node) }
        if needsAddress && t.addresses.isEmpty { throw fail(node, "'tunnel' needs 'addresses', e.g. [10.77.0.1/16]") }
        return t
    }

    /// A user: a name (also the login for password authentication), a public key, a password
    /// hash, or a key and a hash for both factors; and the inner addresses that are always theirs.
    private func user(_ node: Node) throws(ConfigError) -> User {
        let f = try fields(node, "a user", allowed: ["name", "public-key", "password-hash", "addresses", "dns"])
        let name = try string(try f.required("name"))
        var hash: PasswordHash?
        if let n = f.optional("password-hash") {
            let text = try string(n)
            guard let parsed = PasswordHash(encoded: text) else {
                throw fail(n, "user \(name): 'password-hash' is \(PasswordHash.refusal(of: text) ?? "refused")")
            }
            hash = parsed
        }
        let user = User(name: name, publicKey: try opt(f.optional("public-key")) { node throws(ConfigError) in try publicKey(node) },
                        addresses: try list(try f.required("addresses")).map { node throws(ConfigError) in try ip(node) },
                        passwordHash: hash,
                        dns: try opt(f.optional("dns")) { node throws(ConfigError) in try dns(node, "user \(name): 'dns'") })
        if user.publicKey == nil && user.passwordHash == nil {
            throw fail(node, "user \(name) needs 'public-key' or 'password-hash' (or both)")
        }
        return user
    }

    private func publicKey(_ node: Node) throws(ConfigError) -> PublicKey {
        guard let key = PublicKey(base64: try string(node)) else {
            throw fail(node, "expected a public key (44 characters of base64, from `agent pubkey`)")
        }
        return key
    }
}
