import Logging
import Lockdown
import PathMonitor
import Reconnector
import SystemDNS
import Tunnel

/// Carries out what the decision core decides: sockets per path, the session and its thread,
/// handshakes and probes, and, once the first handshake gives the inner addresses, the TUN
/// device, its routes and the tunnel's resolvers. It also keeps the lockdown and the resolvers
/// in step with the network. It decides nothing.
final class SessionEffects {
    private let settings: ClientSettings
    private let key: PrivateKey
    private let credentials: Credentials?
    private let log: Logger
    /// Where the session's notices go (to the deciding thread's mailbox).
    private let notify: @Sendable (ClientNotice) -> Void
    /// The lockdown firewall, when the configuration wants it (the default).
    let firewall: Firewall?
    /// Who hears of the tunnel's resolvers; nil with `dns: {manager: off}`.
    let dns: TunnelDNS?
    /// Where the session's datagrams go now.
    private(set) var server: SocketAddress
    /// The configured servers, in the order they are tried, and the one the session is with.
    private(set) var servers: [ResolvedServer]
    private(set) var serverIndex = 0
    /// The server whose key the session's client pins.
    private var clientServer = 0
    /// The server a session is being prepared with, and its address.
    private var handover: (index: Int, address: SocketAddress)?
    private(set) var client: TunnelClient?
    private var clientThread: OSThread?
    private var tun: TunDevice?
    /// The MTU the decision core last asked for.
    private var wantedMTU: Int?
    private var routes: TunnelRoutes?
    /// An on-demand rule lifted the lockdown, the routes and the resolvers.
    private(set) var lockdownLifted = false
    /// One socket per path the session uses or tries.
    private var sockets: [Path.ID: UDPSocket] = [:]
    /// Routes that take traffic around a full tunnel, as last logged.
    private(set) var divertingRoutes: [DivertingRoute] = []
    /// What the server last pushed, to judge again when the local subnets change.
    private var pushedDNS: Result<DNSSettings, DNSSettingsError>?
    /// The uplinks' own subnets: a resolver inside one is reached on the link, not through the tunnel.
    private var localNetworks: [Prefix] = []
    /// Why the tunnel has no resolvers of its own, as last logged.
    private(set) var dnsProblem: String?
    /// Where the portal windows' cgroups live, once `agent portal` asked for one.
    private var cgroups: CgroupFileSystem?
    /// The open portal window's cgroup, and how many windows there were.
    private(set) var portalCgroup: PortalCgroup?
    private var windows = 0
    /// The portal window in the lockdown now: its uplink and the resolvers it may ask.
    private(set) var portalWindow: LockdownPolicy.PortalWindow?

    init(settings: ClientSettings, key: PrivateKey, credentials: Credentials?, servers: [ResolvedServer], server: SocketAddress,
         firewall: Firewall?, log: Logger, notify: @escaping @Sendable (ClientNotice) -> Void) {
        self.settings = settings
        self.servers = servers
        self.key = key
        self.credentials = credentials
        self.server = server
        self.firewall = firewall
        self.log = log
        self.notify = notify
        dns = switch settings.dns.manager {
        case .off: nil
        case .auto: TunnelDNS(manager: nil)
        case .resolved: TunnelDNS(manager: .resolved)
        case .resolvConf: TunnelDNS(manager: .resolvConf)
        }
    }

    /// Whether the TUN device is up (it stays through every reconnect).
    var tunnelUp: Bool { tun != nil }
    /// The TUN device's offloads, once it is up.
    var offload: TunDevice.OffloadState? { tun?.offload }

    // MARK: The decision core's actions

    /// Opens the session's socket on `path`, or moves the session there; sockets on paths that
    /// no longer exist (`paths`) are closed.
    func bind(_ path: Path, paths: [Path]) {
        guard let socket = socket(for: path) else { return }
        if let client {
            client.rebind(to: socket)
        } else {
            start(on: socket)
        }
        forgetSocketsNotOn(paths)
    }

    func handshake(on path: Path) {
        if let socket = socket(for: path), client?.socket !== socket { client?.rebind(to: socket) }
        client?.startHandshake()
    }

    /// Sends probe `id` through the socket of `path` (a second socket when the session is
    /// elsewhere), padded to stand for a tunnel packet of `size` bytes if given.
    func probe(_ id: UInt64, via path: Path, size: Int? = nil) {
        guard let socket = socket(for: path) else { return }
        client?.probe(id: id, via: socket, size: size)
    }

    /// The tunnel's MTU as the session's path allows; the device takes it now, or when it comes up.
    func setTunnelMTU(_ mtu: Int) {
        wantedMTU = mtu
        // The server keeps what it sends within it, and answers bigger packets as a router would.
        client?.announcePathMTU(mtu)
        guard let tun, tun.mtu != mtu else { return }
        do {
            try tun.setMTU(mtu)
            log.info("tunnel MTU set", metadata: ["tunnel": "\(tun.name)", "mtu": "\(mtu)"])
        } catch {
            log.error("cannot set the tunnel's MTU", metadata: ["tunnel": "\(tun.name)", "mtu": "\(mtu)", "error": "\(error)"])
        }
    }

    /// The tunnel device's MTU now (the configured one until a path asks for less).
    var tunnelMTU: Int { tun?.mtu ?? wantedMTU ?? settings.tunnel.mtu }
    /// Whether the tunnel has an IPv6 address, which keeps its MTU at 1,280 or above (true
    /// until the device exists: the cautious floor).
    var tunnelCarriesIPv6: Bool { tun.map { $0.addresses.contains { $0.address.family == .v6 } } ?? true }

    /// Lets the session reach `address` of server `index` through the lockdown too; false (and
    /// logged) when the lockdown could not be changed.
    func allow(_ index: Int, _ address: IPAddress) -> Bool {
        guard servers.indices.contains(index) else { return false }
        if !servers[index].addresses.contains(address) { servers[index].addresses.append(address) }
        do {
            try openLockdown()
        } catch {
            log.error("cannot open the lockdown firewall to the server's new address; keeping the old one",
                metadata: ["server": "\(servers[index].entry.name)", "to": "\(address)", "error": "\(error)"])
            servers[index].addresses.removeAll { $0 == address && $0 != server.ip }
            return false
        }
        return true
    }

    /// The current server is at `address` now.
    func useAddress(_ address: IPAddress, why: String) {
        let moved = SocketAddress(address, port: server.port)
        log.info("server address changed", metadata: ["server": "\(serverName)", "from": "\(server)", "to": "\(moved)", "why": "\(why)"])
        server = moved
        // A server turned to before it had an address gets the session now.
        if clientServer == serverIndex { client?.setServer(moved) } else { turnClient() }
    }

    // MARK: Several servers

    /// The current server, by name.
    var serverName: String { servers[serverIndex].entry.name }

    /// The session is with server `index` at `address` from now on; its handshake follows.
    func useServer(_ index: Int, at address: IPAddress?) {
        guard servers.indices.contains(index) else { return }
        serverIndex = index
        handover = nil
        guard let address = address.flatMap({ socketAddress(index, $0) }) else {
            // Its name is looked up; the session turns to it once it has an address.
            return log.warning("a server has no usable address now", metadata: ["server": "\(serverName)"])
        }
        server = address
        turnClient()
    }

    /// The session's client talks to the current server, at its address, from now on.
    private func turnClient() {
        guard let client else { return }  // the first socket starts the session with this server
        do {
            client.useServer(try core(for: serverIndex), at: server)
            clientServer = serverIndex
            log.info("server", metadata: ["server": "\(serverName)", "address": "\(server)"])
        } catch {
            log.error("cannot use server \(serverName)", metadata: ["error": "\(error)"])
        }
    }

    /// Handshakes with server `index` over the session's socket while the current session
    /// carries the traffic.
    func prepareHandover(to index: Int, at address: IPAddress?, on path: Path) {
        guard servers.indices.contains(index), let client, let address = address.flatMap({ socketAddress(index, $0) }) else { return }
        do {
            client.prepareHandover(try core(for: index), at: address)
            handover = (index, address)
        } catch {
            log.error("cannot prepare a session with server \(servers[index].entry.name)", metadata: ["error": "\(error)"])
        }
    }

    func completeHandover() {
        guard let (index, address) = handover else { return }
        handover = nil
        client?.completeHandover()
        serverIndex = index
        clientServer = index
        server = address
    }

    func cancelHandover() {
        handover = nil
        client?.cancelHandover()
    }

    /// Ends the session with a goodbye; the tunnel device, its routes, the lockdown and the
    /// resolvers stay, so the machine's traffic waits for the tunnel instead of leaving in clear.
    func disconnect() {
        handover = nil
        client?.endSession()
    }

    /// Moves `peer` into the open portal window's cgroup.
    func joinPortalWindow(_ peer: PeerProcess) throws(AgentError) {
        guard var cgroup = portalCgroup, let cgroups else { throw AgentError("no portal window is open") }
        try cgroup.add(peer, fs: cgroups)
        portalCgroup = cgroup
    }

    /// Makes the portal window's cgroup (where `agent portal` puts its process) and lets it
    /// through the lockdown on `path`: DNS to the network's own resolvers (those the system named
    /// before the tunnel's, else the uplink's gateway), HTTP and HTTPS, and the login page's port.
    /// Returns whether the window is open; when not (logged), no cgroup is left.
    func openPortalWindow(via path: Path, portal url: String, runtimeDirectory: String) -> Bool {
        guard let firewall else {
            log.error("cannot open the portal window", metadata: ["error": "no lockdown"])
            return false
        }
        let cgroup: PortalCgroup
        do throws(AgentError) {
            let found = if let cgroups { cgroups } else { try CgroupFileSystem.find(runtimeDirectory: runtimeDirectory) }
            cgroups = found
            windows += 1
            cgroup = try PortalCgroup.make(in: found, number: windows)
        } catch {
            log.error("cannot open the portal window", metadata: ["error": "\(error.message)"])
            return false
        }
        portalCgroup = cgroup
        var resolvers = ResolvConf(ResolvConfFile.systemText(at: "/etc/resolv.conf") ?? "",
                                   systemdUplinks: SystemFiles.text("/run/systemd/resolve/resolv.conf"),
                                   avoiding: dns?.applied?.resolvers ?? []).nameservers.filter { !$0.isLoopback }
        if resolvers.isEmpty, let gateway = path.gateway { resolvers = [gateway] }
        var window = LockdownPolicy.PortalWindow(cgroup: cgroup.nftablesPath, level: cgroup.level, interface: path.interface,
                                                 resolvers: resolvers)
        if let (host, port) = Self.hostAndPort(of: url), port != 80 && port != 443 {
            // The network chose this port: only to the login page's own address, or, for a
            // name (its address is the network's resolver's to give), only an unprivileged port.
            if let address = IPAddress(host) {
                window.login = .init(address: address, port: port)
            } else if port >= 1024 {
                window.login = .init(address: nil, port: port)
            } else {
                log.warning("the login page's port is not let through the portal window", metadata: ["port": "\(port)", "url": "\(url)"])
            }
        }
        do {
            try firewall.portalWindow(window)
            portalWindow = window
            log.notice("portal window open", metadata: ["path": "\(path.interface)", "resolvers": "\(resolvers.map(\.description).joined(separator: ","))",
                                                        "cgroup": "\(cgroup.directory)"])
            return true
        } catch {
            log.error("cannot open the portal window", metadata: ["error": "\(error)"])
            closePortalWindow()
            return false
        }
    }

    /// The host and the TCP port a login page's URL names, when it names a port
    /// (`http://10.0.0.1:8080/login`).
    static func hostAndPort(of url: String) -> (String, UInt16)? {
        guard let scheme = url.firstRange(of: "://") else { return nil }
        let authority = url[scheme.upperBound...].prefix { $0 != "/" && $0 != "?" && $0 != "#" }
        guard let endpoint = Endpoint(String(authority)), let port = endpoint.port else { return nil }
        return (endpoint.host, port)
    }

    /// The lockdown is whole again, and the window's processes go back to their own cgroup,
    /// which is removed: a rule for it, should nftables refuse the closing (it is tried again
    /// every second), matches no socket any more.
    func closePortalWindow() {
        if portalWindow != nil {
            portalWindow = nil
            do {
                try firewall?.portalWindow(nil)
                log.notice("portal window closed")
            } catch {
                log.error("cannot take the portal window out of the lockdown; trying again every second", metadata: ["error": "\(error)"])
            }
        }
        if let cgroup = portalCgroup, let cgroups {
            if let error = cgroup.close(fs: cgroups) {
                log.error("the portal window's cgroup stays", metadata: ["error": "\(error)",
                    "lockdown": "\(firewall?.retryDue == nil ? "closed to it" : "closing it is tried again every second")"])
            }
            portalCgroup = nil
        }
    }

    /// Server `index`'s address, looked up again if its name gave none so far; the lockdown is
    /// opened to a new one first. Nil (and logged) when there is none.
    /// Server `index`'s `address` with its port.
    private func socketAddress(_ index: Int, _ address: IPAddress) -> SocketAddress? {
        servers[index].entry.endpoint.port.map { SocketAddress(address, port: $0) }
    }

    /// Lets the session's UDP through the lockdown to every address of every server, and to
    /// the one in use.
    private func openLockdown() throws(LockdownError) {
        try firewall?.serve(([server] + servers.flatMap(\.socketAddresses)).map(LockdownPolicy.Server.init))
    }

    /// A protocol core that pins server `index`'s key; a split tunnel accepts inner packets
    /// only from what it routes.
    private func core(for index: Int) throws(CryptoError) -> ClientCore {
        var accepted: [Prefix]?
        if case .split(let prefixes) = settings.mode { accepted = prefixes }
        return try ClientCore(privateKey: key, serverKey: servers[index].entry.key, credentials: credentials,
                              acceptedSources: accepted)
    }

    func setPersistentKeepalive(_ interval: Duration?) { client?.setPersistentKeepalive(interval) }

    // MARK: The tunnel

    /// The TUN device comes up once, after the first handshake tells our inner address, and
    /// stays through every reconnect; the resolvers follow each handshake. Throws why the
    /// device cannot be configured.
    func handshakeCompleted(dns pushed: Result<DNSSettings, DNSSettingsError>) throws(AgentError) {
        try attachTunnel()
        useResolvers(pushed)
    }

    private func attachTunnel() throws(AgentError) {
        // A late answer after a rule lifted the lockdown brings no routes back.
        guard tun == nil, !lockdownLifted, let client else { return }
        let prefixes = client.addresses.compactMap { Prefix($0, length: $0.family.bitWidth) }
        do {
            let device = try TunDevice(name: settings.tunnel.name, mtu: wantedMTU ?? settings.tunnel.mtu, addresses: prefixes,
                                       offload: settings.tunnel.offload)
            routes = try TunnelRoutes(settings.mode, device: device)
            tun = device
            client.attach(device)
            log.info("tunnel up", metadata: ["tunnel": "\(device.name)", "addresses": "\(prefixes.map(\.description).joined(separator: ","))",
                                      "offload": "\(device.offload.description)"])
        } catch {
            throw AgentError("cannot configure the tunnel device: \(error)")
        }
    }

    /// Gives the system the tunnel's resolvers: the configuration's own (`dns`), else the
    /// server's. A list the server got wrong is refused and the session stays.
    private func useResolvers(_ pushed: Result<DNSSettings, DNSSettingsError>) {
        pushedDNS = pushed
        guard !lockdownLifted, let dns, let tun else { return }
        var wanted: DNSSettings
        if let override = settings.dns.override {
            wanted = override
        } else {
            switch pushed {
            case .success(let settings): wanted = settings
            case .failure(let error): return noResolvers("the server's resolvers are refused: \(error)", level: .warning)
            }
        }
        // A resolver outside the split routes, or on an uplink's own subnet (reached on the link
        // even in full mode), would be asked in clear.
        let inClear = { (resolver: IPAddress) in
            !self.settings.mode.carries(resolver) || self.localNetworks.contains { $0.contains(resolver) }
        }
        let outside = wanted.resolvers.filter(inClear)
        if !outside.isEmpty {
            log.warning("resolvers outside the tunnel are not used: they would be asked in clear",
                metadata: ["resolvers": "\(outside.map(\.description).joined(separator: ","))"])
            wanted = (try? DNSSettings(resolvers: wanted.resolvers.filter { !inClear($0) },
                                       searchDomains: wanted.searchDomains)) ?? .none
        }
        guard wanted != dns.applied else { return }
        guard !wanted.resolvers.isEmpty else {
            return noResolvers("neither the server nor 'dns' gives resolvers for the tunnel" + (firewall == nil ? ""
                : "; with the lockdown on, names resolve only through resolvers the tunnel reaches"), level: .warning)
        }
        do {
            try dns.apply(wanted, interface: (tun.index, tun.name), routeAll: settings.mode.socketMark != nil)
            dnsProblem = nil
            log.info("dns", metadata: ["resolvers": "\(wanted.resolvers.map(\.description).joined(separator: ","))",
                                "search": "\(wanted.searchDomains.joined(separator: ","))", "via": "\(dns.manager.rawValue)"])
        } catch {
            noResolvers("\(error)", level: .error)
        }
    }

    private func noResolvers(_ reason: String, level: Logger.Level) {
        guard reason != dnsProblem else { return }
        dnsProblem = reason
        log.log(level: level, "no tunnel dns", metadata: ["reason": "\(reason)"])
    }

    // MARK: On-demand rules

    /// An on-demand rule trusts the network: the tunnel's routes, its resolvers and the
    /// lockdown step aside (the session has ended already), and the machine talks to the
    /// network directly. Each step that fails is logged; the others still happen.
    func liftLockdown(interface: String) {
        lockdownLifted = true
        do {
            try routes?.remove()
            routes = nil
        } catch {
            log.error("cannot take the tunnel's routes away", metadata: ["error": "\(error)"])
        }
        if let dns, dns.applied != nil {
            do {
                try dns.revert()
            } catch {
                log.error("cannot take the tunnel's resolvers back", metadata: ["error": "\(error)"])
            }
        }
        do {
            try firewall?.lift(for: interface)
        } catch {
            log.error("cannot lift the lockdown; it stays", metadata: ["error": "\(error)"])
        }
        log.notice("lockdown lifted: the network is trusted", metadata: ["interface": "\(interface)",
            "routes": "\(routes == nil ? "removed" : "kept")", "lockdown": "\(firewall?.trustedInterface.map { "open on \($0) only" } ?? "none")"])
    }

    /// The lockdown first (so nothing leaves in clear meanwhile), then the tunnel's routes and
    /// its resolvers. A lockdown that cannot come back is tried again every second.
    func restoreLockdown() {
        lockdownLifted = false
        restoreFirewall()
        if let tun, routes == nil {
            do {
                routes = try TunnelRoutes(settings.mode, device: tun)
            } catch {
                log.error("cannot put the tunnel's routes back", metadata: ["error": "\(error)"])
            }
        }
        if let pushedDNS { useResolvers(pushedDNS) }
        log.notice("lockdown restored")
    }

    private func restoreFirewall() {
        do {
            try firewall?.restore()
        } catch {
            log.error("cannot put the lockdown back; trying again every second", metadata: ["error": "\(error)"])
        }
    }

    /// Loads what nftables refused to close before (a trusted interface, a portal window).
    func retryFirewall() {
        guard let firewall, firewall.retryDue != nil else { return }
        let refusals = firewall.refusals
        if let error = firewall.retry() {
            if firewall.refusals.isMultiple(of: 60) {
                log.error("the lockdown still refuses to close", metadata: ["tries": "\(firewall.refusals)", "error": "\(error)"])
            }
        } else {
            log.notice("the lockdown holds again", metadata: ["refused": "\(refusals)"])
        }
    }

    // MARK: The network

    /// The networks on the uplinks are `prefixes` now: the lockdown lets them through (with
    /// allow-lan), and a resolver on one of them is reached outside the tunnel.
    func localNetworksChanged(_ prefixes: [Prefix]) {
        do {
            try firewall?.localNetworksChanged(prefixes)
        } catch {
            log.error("cannot follow the local subnets in the lockdown", metadata: ["error": "\(error)"])
        }
        if prefixes != localNetworks {
            localNetworks = prefixes
            // A new network may hold a resolver's address, or no longer hold it.
            if let pushedDNS, !lockdownLifted { useResolvers(pushedDNS) }
        }
    }

    /// What the operator needs to know of a change in links, addresses or routes, and what
    /// others may have rewritten meanwhile.
    func networkObserved(_ model: NetworkModel) {
        do {
            if try dns?.reassert() == true { log.info("dns written again: resolv.conf had been replaced", metadata: ["via": "resolv.conf"]) }
        } catch {
            log.error("cannot write the tunnel's resolvers again", metadata: ["error": "\(error)"])
        }
        // Full mode only: split mode routes around the tunnel by design.
        guard settings.mode.socketMark != nil else { return }
        let diverting = model.routesAroundTheTunnel
        for route in diverting where !divertingRoutes.contains(route) {
            log.warning("a route on an uplink takes traffic around the tunnel",
                metadata: ["route": "\(route.description)", "lockdown": "\(firewall == nil ? "off: that traffic leaves in clear" : "on: that traffic is stopped")"])
        }
        divertingRoutes = diverting
    }

    // MARK: The end

    /// Ends the session and takes the routes down. Only an operator's stop opens the machine
    /// again and gives resolv.conf back; a restart in place or a give-up (systemd starts the
    /// agent again) keeps the lockdown and the resolvers, so nothing leaks meanwhile.
    func close(operatorStop: Bool) {
        client?.close()
        try? routes?.remove()
        // Whatever comes next (a stop, a restart in place), the window does not outlive the agent.
        closePortalWindow()
        cgroups?.unmount()
        // A closing still refused gets a last try; the next agent loads the table whole anyway.
        if let firewall, firewall.retryDue != nil, let error = firewall.retry() {
            log.error("the lockdown could not be put back whole before stopping", metadata: ["error": "\(error)"])
        }
        guard operatorStop else { return }
        if let dns, dns.applied != nil {
            do {
                try dns.revert()
                log.info("dns restored", metadata: ["via": "\(dns.manager.rawValue)"])
            } catch {
                log.error("cannot take the tunnel's resolvers back", metadata: ["error": "\(error)"])
            }
        }
        if let firewall {
            do {
                try firewall.remove()
                log.info("lockdown removed")
            } catch {
                log.error("cannot remove the lockdown firewall; remove it with 'agent lockdown off'", metadata: ["error": "\(error)"])
            }
        }
    }

    // MARK: Sockets

    /// The socket bound to `path`'s interface and source, made on first use.
    private func socket(for path: Path) -> UDPSocket? {
        if let socket = sockets[path.id] { return socket }
        do {
            let socket = try UDPSocket(bindingTo: SocketAddress(path.source, port: 0), device: path.interface,
                                       mark: settings.mode.socketMark, joinsReceived: true)
            sockets[path.id] = socket
            return socket
        } catch {
            log.warning("cannot open a socket on \(path.interface)", metadata: ["error": "\(error)"])
            return nil
        }
    }

    private func forgetSocketsNotOn(_ paths: [Path]) {
        for id in sockets.keys where !paths.contains(where: { $0.id == id }) {
            if let socket = sockets.removeValue(forKey: id) { client?.forget(candidate: socket) }
        }
    }

    private func start(on socket: UDPSocket) {
        do {
            let core = try core(for: serverIndex)
            let client = try TunnelClient(core: core, socket: socket, server: server, answersHints: false,
                                          persistentKeepalive: settings.persistentKeepalive,
                                          logger: log, notify: notify)
            self.client = client
            clientServer = serverIndex
            clientThread = try OSThread { client.run() }
        } catch {
            log.error("cannot start the session", metadata: ["error": "\(error)"])
        }
    }
}
