public import Basics
public import ConfigReader
public import Connectivity
import Glibc
public import Lockdown
public import Basics
public import Reconnector
public import Tunnel
public import Device

/// The tunnel device as a configuration file describes it.
public struct TunnelSettings: Equatable, Sendable {
    public var name = "roam0"
    /// 1420 leaves room for the tunnel's 60 to 80 bytes over an IPv4 or IPv6 1500-byte uplink.
    public var mtu = 1420
    /// Inner addresses of this end (the server's; a client gets its own from the server).
    public var addresses: [Prefix] = []
    /// TCP segmentation offload: the kernel hands over super-packets of up to 64 KB, which the
    /// agent cuts (fewer reads, less work in the kernel's TCP). Off: one packet per read.
    public var offload = true

    public init() {}
}

/// One server a client may use: where it is and the key it must prove.
public struct ServerEntry: Equatable, Sendable {
    /// What logs and status call it: its `name`, else its host.
    public var name: String
    public var endpoint: Endpoint
    public var key: PublicKey
}

/// `agent up --config FILE`.
public struct ClientSettings: Sendable {
    /// The servers in the order they are tried (by priority, then as listed); never empty.
    public var servers: [ServerEntry]
    /// The first server.
    public var server: Endpoint { servers[0].endpoint }
    var serverKey: PublicKey { servers[0].key }
    public var privateKeyFile: String
    public var username: String?
    public var passwordFile: String?
    /// What each top-level key of the file says, without its lines: a reload compares these
    /// (`tunnelChanges(to:)`), so no key is missed by a comparison written out field by field.
    public internal(set) var written: [String: String] = [:]
    public var tunnel = TunnelSettings()
    public var mode = RoutingMode.full(FullTunnel())
    public var reconnect = Config()
    /// A keepalive after this long without outgoing packets, for a NAT that forgets idle
    /// mappings; nil (the default) sends none, so an idle tunnel wakes nothing.
    public var persistentKeepalive: Duration?
    /// The lockdown firewall (on by default): nothing leaves outside the tunnel, also before
    /// the first handshake, between restarts and after a crash. See `LockdownPolicy`.
    public var lockdown = true
    /// Full mode with lockdown: let the local subnets through (printers, casting), not their DNS.
    public var allowLAN = false
    /// Ranges besides the private ones that count as local with `allowLAN` (`allow-lan` as a
    /// list), each inside a private, shared or link-local range.
    public var lanRanges: [Prefix] = []
    /// `exclusion: allow`: root and the roam group may keep applications outside the tunnel
    /// (`agent exclude`), a deliberate hole in the lockdown for them alone. Off by default.
    public var exclusionAllowed = false
    /// `operators: group` (the default): members of the `roam` group may turn the tunnel on and
    /// off and reconnect it over the control socket; `operators: root` keeps that root's.
    public var groupOperates = true
    /// How the tunnel's resolvers reach the system, and which ones.
    public var dns = ClientDNSSettings()
    /// Where the metrics are written in node_exporter's textfile format; nil: nowhere.
    public var metricsFile: String?
    /// The connectivity check that finds captive portals (its timing is in `reconnect`).
    public var portal = PortalCheck.standard

    /// Rules for the networks the laptop meets: where the tunnel connects, where it stays down.
    public var onDemand = OnDemandRules()

    /// The protocol version the client speaks: 3 (the post-quantum handshake) unless set to 2,
    /// for a gateway not yet upgraded.
    public var protocolVersion: UInt8 = 3
    /// Speak version 2 to a server that never answers version 3's handshake. Off by default:
    /// whoever can drop packets on the path could then choose the older protocol.
    public var protocolFallback = false
    /// The one cipher version 3 sessions may use; nil: the server chooses (AES-256-GCM when
    /// both ends have AES in hardware, else ChaCha20-Poly1305).
    public var cipher: CipherSuite?

    /// The stream transport (`tcp:`): how to reach the gateways over TLS on TCP when a network
    /// drops UDP; nil: UDP only.
    public var stream: ClientStreamSettings?

    /// The ports the agent's own plain HTTP goes to outside the tunnel: the connectivity check's
    /// (with the check on) and the on-demand probes'.
    public var checkPorts: [UInt16] {
        let probes = onDemand.rules.compactMap { $0.match.probe.flatMap { CheckURL($0.url)?.port } }
        return Array(Set((reconnect.portalCheck ? [portal.url.port] : []) + probes)).sorted()
    }
}

/// The client's `tcp` section: the gateways' TLS port, the name to show, and a proxy.
public struct ClientStreamSettings: Equatable, Sendable {
    /// The gateways' TLS port (every server of the list listens on it).
    public var port: UInt16 = 443
    /// The name sent as SNI: the server's host when it is a name, unless set.
    public var serverName: String?
    /// The HTTP proxy the stream goes through, for networks that let out nothing else.
    public var proxy: ProxySettings?

    public init() {}
}

/// An HTTP proxy as the configuration names it: an address or a host name with a port, and a
/// user with a password file.
public struct ProxySettings: Equatable, Sendable {
    /// Where the proxy listens: a literal address, or a name looked up on each network the
    /// machine is on (a proxy's name is usually the local network's own).
    public var endpoint: Endpoint
    /// Its port (the endpoint's, always given).
    public var port: UInt16 { endpoint.port ?? 0 }
    /// Its address, when the configuration gives one; nil for a name.
    public var address: SocketAddress? { endpoint.address.map { SocketAddress($0, port: port) } }
    public var user: String?
    /// A file only root (or the agent's user) can read, holding the password.
    public var passwordFile: String?
}

/// The client's `dns` section.
public struct ClientDNSSettings: Equatable, Sendable {
    /// Resolvers and search domains to use instead of those the server pushes.
    public var override: DNSSettings?
    public var manager = DNSManagerChoice.auto
}

/// Who is told about the tunnel's resolvers.
public enum DNSManagerChoice: String, CaseIterable, Sendable {
    /// systemd-resolved when it runs, else /etc/resolv.conf.
    case auto
    /// systemd-resolved, over D-Bus; the agent stops if it does not answer.
    case resolved = "systemd-resolved"
    /// /etc/resolv.conf, written whole; the previous file is kept inside it and put back on stop.
    case resolvConf = "resolv.conf"
    /// Nobody: the system's DNS is left as it is (with lockdown on, only resolvers inside the tunnel answer).
    case off
}

/// `agent serve --config FILE`.
public struct ServerSettings: Sendable {
    public var listenPort: UInt16
    public var privateKeyFile: String
    public var tunnel: TunnelSettings
    /// The users, from the file; empty when they come from `usersFrom`.
    public var users: UserDatabase
    /// Where the users come from instead: the fleet's directory in PostgreSQL.
    public var usersFrom: UserSource?
    /// Resolvers and search domains for users who have none of their own.
    public var dns = DNSSettings.none
    /// On SIGTERM, how long sessions get to move to another server before the server stops;
    /// zero stops at once.
    public var drainPeriod: Duration = .zero
    /// Data-plane workers, each with a queue of the TUN device and a socket per family: one
    /// per core by default, at most `maxWorkers`.
    public var workers = ServerSettings.defaultWorkers
    /// Where `/metrics` is served over HTTP for Prometheus; nil: nowhere.
    public var metricsListen: SocketAddress?
    /// The protocol versions clients may speak, and a cipher the operator pins for version 3.
    public var protocols = ProtocolPolicy()
    /// The stream transport (`tcp:`): TLS on TCP beside UDP, for clients on networks that drop
    /// UDP; nil: UDP only.
    public var stream: ServerStreamSettings?

    static let maxWorkers = 64
    static var defaultWorkers: Int { min(max(1, Int(sysconf(Int32(_SC_NPROCESSORS_ONLN)))), 16) }
}

/// The gateway's `tcp` section.
public struct ServerStreamSettings: Equatable, Sendable {
    /// The TCP port the gateway takes TLS on.
    public var port: UInt16 = 443
    /// The host's addresses it takes TLS on (another server may hold the port on the others);
    /// nil: every address of both families.
    public var addresses: [IPAddress]?
    /// The name on the certificate the gateway makes at start (nothing checks it: clients pin
    /// the gateway's key); the host's name unless set.
    public var name: String
    /// PEM files of a certificate chain and its key to show instead (a public CA's makes the
    /// gateway look like any web server to a network that inspects TLS).
    public var certificate: (chain: String, key: String)?

    public static func == (a: Self, b: Self) -> Bool {
        a.port == b.port && a.addresses == b.addresses && a.name == b.name && a.certificate?.chain == b.certificate?.chain && a.certificate?.key == b.certificate?.key
    }
}

/// `users-from`: the fleet's user directory in PostgreSQL, shared by every gateway.
public struct UserSource: Sendable, Equatable {
    /// libpq's URL, `postgresql://roam@db.example/roam?sslmode=verify-full`: never with a password.
    public var url: String
    /// libpq's passfile (`host:port:database:user:password`), 0600: where the password is.
    public var passwordFile: String?
    /// The last users read, kept so that a restart without the database still serves them.
    public var snapshot: String
    /// What this gateway's session records are under: its host name unless set.
    public var gateway: String

    public static let defaultSnapshot = "/var/lib/roam/users.snapshot"

    public init(url: String, passwordFile: String? = nil, snapshot: String = UserSource.defaultSnapshot, gateway: String) {
        self.url = url
        self.passwordFile = passwordFile
        self.snapshot = snapshot
        self.gateway = gateway
    }

    /// Why `url` cannot be used, or nil: a PostgreSQL URL without a password in it.
    public static func problem(with url: String) -> String? {
        let lower = url.lowercased()
        guard let scheme = ["postgresql://", "postgres://"].first(where: lower.hasPrefix) else {
            return "'users-from' is a PostgreSQL URL, e.g. postgresql://roam@db.example/roam?sslmode=verify-full"
        }
        let rest = url.dropFirst(scheme.count)
        let authority = rest.prefix { $0 != "/" && $0 != "?" }
        if let at = authority.lastIndex(of: "@"), authority[..<at].contains(":") {
            return "'users-from' holds a password: put it in 'password-file' (libpq's passfile, 0600), never in the URL"
        }
        if let query = rest.firstIndex(of: "?"),
           rest[query...].dropFirst().split(separator: "&").contains(where: { $0.lowercased().hasPrefix("password=") }) {
            return "'users-from' holds a password: put it in 'password-file' (libpq's passfile, 0600), never in the URL"
        }
        guard !url.contains(where: { $0.isWhitespace || $0.isNewline }) else { return "'users-from' holds a space: write the URL without one" }
        return nil
    }
}

/// A key or password file's text, without the line end; see `TrustedFile.Kind.secret`.
public func readSecretFile(_ path: String) throws(ConfigError) -> String {
    var bytes = try TrustedFile.read(path, as: .secret)
    defer { Sodium.wipe(&bytes) }
    return String(decoding: bytes, as: UTF8.self).trimmed
}

/// Reads a private key from a file that only its owner may read.
public func loadPrivateKey(_ path: String) throws(ConfigError) -> PrivateKey {
    let text = try readSecretFile(path)
    guard let key = PrivateKey(base64: text) else {
        throw ConfigError(file: path, line: 1, message: "not a private key (44 characters of base64, from `agent keygen`)")
    }
    return key
}

extension ClientSettings {
    /// The lockdown this client loads at start: no server yet (its name may still need looking
    /// up), the local subnets not yet known.
    public var lockdownPolicy: LockdownPolicy {
        let scope: LockdownPolicy.Scope = switch mode {
        case .full(let policy): .full(mark: policy.mark)
        case .split(let prefixes): .split(prefixes)
        }
        var policy = LockdownPolicy(scope: scope, tunnelInterface: tunnel.name, allowLAN: allowLAN, localNetworks: [])
        policy.lanRanges = lanRanges
        if case .full(let full) = mode { policy.neverLocal = full.neverLocal }
        policy.checkPorts = checkPorts
        policy.streamPort = stream?.port
        // A proxy named by host: no address until a network's look-up gives one (`AgentCore`).
        policy.proxy = stream?.proxy.map { LockdownPolicy.Proxy(addresses: $0.endpoint.address.map { [$0] } ?? [], port: $0.port) }
        return policy
    }
}

extension LockdownPolicy.Server {
    /// The lockdown's entry for a server's socket address.
    public init(_ address: SocketAddress) { self.init(address.ip, port: address.port) }
}
