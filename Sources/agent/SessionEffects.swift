import Topology
import Netlink
import Logging
import Lockdown
import Basics
import PathMonitor
import Reconnector
import SystemDNS
import Tunnel
import Device
import Settings
import Streams

/// Carries out what the decision core decides: sockets per path, the session and its thread,
/// handshakes and probes, and, once the first handshake gives the inner addresses, the TUN
/// device, its routes and the tunnel's resolvers. It also keeps the lockdown and the resolvers
/// in step with the network. It decides nothing.
final class SessionEffects {
    let settings: ClientSettings
    let key: PrivateKey
    let credentials: Credentials?
    let log: Logger
    /// Where the data plane's events go (to the deciding thread's mailbox).
    let notify: @Sendable (AgentEvent) -> Void
    /// The lockdown firewall, when the configuration wants it (the default).
    let firewall: Firewall?
    /// Who hears of the tunnel's resolvers; nil with `dns: {manager: off}`.
    let dns: TunnelDNS?
    /// Where the session's datagrams go now.
    private(set) var server: SocketAddress
    /// The configured servers, in the order they are tried, and the one the session is with.
    var servers: [ResolvedServer]
    private(set) var serverIndex = 0
    /// The server whose key the session's client pins.
    var clientServer = 0
    /// The server a session is being prepared with, and its address.
    var handover: (index: Int, address: SocketAddress)?
    private(set) var client: TunnelClient?
    var clientThread: OSThread?
    var tun: TunDevice?
    /// The MTU the decision core last asked for.
    var wantedMTU: Int?
    var routes: TunnelRoutes?
    /// An on-demand rule lifted the lockdown, the routes and the resolvers.
    var lockdownLifted = false
    /// One socket per path the session uses or tries: a UDP socket, or a stream to the server
    /// (`Path.transport`).
    var sockets: [Path.ID: any PacketCarrier] = [:]
    /// Where the streams are told opened or failed (to the deciding thread's mailbox).
    let streamTold: @Sendable (Path.ID, StreamCarrier, StreamCarrier.Event) -> Void
    /// The HTTP proxy streams go through, with its credentials, when configured.
    let proxy: HTTPProxy?
    /// A proxy named by host: its address on each network, as the core had the lockdown let it through.
    var proxyAt: [NetworkKey: IPAddress] = [:]
    /// The TLS contexts of the streams, by the name they send (SNI): libssl loads with the first.
    var streamContexts: [String: TLSContext] = [:]
    /// The paths the open streams are on, to open them again to a server's new address.
    var streamPaths: [Path.ID: Path] = [:]
    /// The path whose stream carried the session and failed: the next stream on it carries the
    /// session at once (to the core it is the same path, so no rebind comes).
    var brokenSessionStream: Path.ID?
    /// Routes that take traffic around a full tunnel, as last logged.
    var divertingRoutes: [DivertingRoute] = []
    /// Other tunnels' routes that meet what this tunnel carries, and others' policy rules that
    /// decide before the tunnel's, as last warned of.
    var otherTunnelRoutes: [DivertingRoute] = []
    var rulesBefore: [RoutingRule] = []
    /// The uplinks' own subnets: a resolver inside one is reached on the link, not through the tunnel.
    var localNetworks: [Prefix] = []
    /// Subnets the uplinks' networks claim wider than a LAN (`NetworkModel.widerClaims`).
    var widerClaims: [Prefix] = []
    /// The containers' and VMs' bridges the lockdown lets through.
    var guestNetworks: [GuestNetwork] = []
    /// Why the tunnel has no resolvers of its own, as last logged.
    var dnsProblem: String?
    /// Where the portal windows' cgroups live, once `agent portal` asked for one.
    var cgroups: CgroupFileSystem?
    /// The open portal window's cgroup, and how many windows there were.
    var portalCgroup: PortalCgroup?
    /// The excluded applications' cgroup, once one was asked for (`agent exclude`).
    var exclusionCgroup: PortalCgroup?
    /// Where each process moved into it came from, where it goes back to.
    var exclusionOrigins: [Int32: String] = [:]
    /// Where each user's last excluded process came from: a child whose parent ended goes there.
    var exclusionUsers: [UInt32: String] = [:]
    var windows = 0
    /// The portal window in the lockdown now: its uplink and the resolvers it may ask.
    var portalWindow: LockdownPolicy.PortalWindow?

    init(settings: ClientSettings, key: PrivateKey, credentials: Credentials?, servers: [ResolvedServer], server: SocketAddress,
         firewall: Firewall?, proxy: HTTPProxy?, log: Logger, notify: @escaping @Sendable (AgentEvent) -> Void,
         streamTold: @escaping @Sendable (Path.ID, StreamCarrier, StreamCarrier.Event) -> Void) {
        self.settings = settings
        self.proxy = proxy
        self.streamTold = streamTold
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

    /// The tunnel's MTU as the session's path allows; the device takes it now, or when it comes
    /// up. What the device kept, and why, when it refused.
    func setTunnelMTU(_ mtu: Int) -> (actual: Int, why: String)? {
        wantedMTU = mtu
        // The server keeps what it sends within it, and answers bigger packets as a router would.
        client?.announcePathMTU(mtu)
        guard let tun, tun.mtu != mtu else { return nil }
        do {
            try tun.setMTU(mtu)
            log.info("tunnel MTU set", metadata: ["tunnel": "\(tun.name)", "mtu": "\(mtu)"])
            return nil
        } catch {
            log.error("cannot set the tunnel's MTU", metadata: ["tunnel": "\(tun.name)", "mtu": "\(mtu)", "error": "\(error)"])
            wantedMTU = tun.mtu
            return (tun.mtu, "\(error)")
        }
    }

    /// The tunnel device's MTU now (the configured one until a path asks for less).
    var tunnelMTU: Int { tun?.mtu ?? wantedMTU ?? settings.tunnel.mtu }


    /// The current server is at `address` now; why the session cannot turn to it, if it cannot.
    func useAddress(_ address: IPAddress, why: String) -> String? {
        let moved = SocketAddress(address, port: server.port)
        log.info("server address changed", metadata: ["server": "\(serverName)", "from": "\(server)", "to": "\(moved)", "why": "\(why)"])
        server = moved
        // A server turned to before it had an address gets the session now.
        defer { restreamToServer() }
        if clientServer == serverIndex {
            client?.setServer(moved)
            return nil
        }
        return turnClient()
    }

    // MARK: Several servers

    /// The current server, by name.
    var serverName: String { servers[serverIndex].entry.name }

    /// The session is with server `index` at `address` from now on; its handshake follows. Why
    /// the session cannot turn to it, if it cannot.
    func useServer(_ index: Int, at address: IPAddress?) -> String? {
        guard servers.indices.contains(index) else { return nil }
        serverIndex = index
        handover = nil
        guard let address = address.flatMap({ socketAddress(index, $0) }) else {
            // Its name is looked up; the session turns to it once it has an address.
            log.warning("a server has no usable address now", metadata: ["server": "\(serverName)"])
            return nil
        }
        server = address
        defer { restreamToServer() }
        return turnClient()
    }

    /// The session's client talks to the current server, at its address, from now on; why it
    /// cannot, if it cannot (its protocol core cannot be made).
    func turnClient() -> String? {
        guard let client else { return nil }  // the first socket starts the session with this server
        do {
            client.useServer(try core(for: serverIndex), at: server)
            clientServer = serverIndex
            log.info("server", metadata: ["server": "\(serverName)", "address": "\(server)"])
            return nil
        } catch {
            log.error("cannot use server \(serverName)", metadata: ["error": "\(error)"])
            return "cannot use server \(serverName): \(error)"
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
        restreamToServer()
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

    /// Server `index`'s address, looked up again if its name gave none so far; the lockdown is
    /// opened to a new one first. Nil (and logged) when there is none.
    /// Server `index`'s `address` with its port.
    func socketAddress(_ index: Int, _ address: IPAddress) -> SocketAddress? {
        servers[index].entry.endpoint.port.map { SocketAddress(address, port: $0) }
    }

    /// A protocol core that pins server `index`'s key; a split tunnel accepts inner packets
    /// only from what it routes.
    func core(for index: Int) throws(CryptoError) -> ClientCore {
        var accepted: [Prefix]?
        if case .split(let prefixes) = settings.mode { accepted = prefixes }
        return try ClientCore(privateKey: key, serverKey: servers[index].entry.key, credentials: credentials,
                              acceptedSources: accepted, version: settings.protocolVersion, cipher: settings.cipher,
                              fallback: settings.protocolFallback)
    }

    func setPersistentKeepalive(_ interval: Duration?) { client?.setPersistentKeepalive(interval) }

    /// Starts the session with the current server on its first socket; why it cannot, if it cannot.
    func start(on socket: any PacketCarrier) -> String? {
        do {
            let core = try core(for: serverIndex)
            let client = try TunnelClient(core: core, socket: socket, server: server, answersHints: false,
                                          persistentKeepalive: settings.persistentKeepalive,
                                          logger: log, notify: notify)
            self.client = client
            clientServer = serverIndex
            clientThread = try OSThread { client.run() }
            return nil
        } catch {
            log.error("cannot start the session", metadata: ["error": "\(error)"])
            return "cannot start the session: \(error)"
        }
    }
}
