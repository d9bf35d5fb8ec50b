import Connectivity
import ConfigReader
import Glibc
import Lockdown
import Basics
import PathMonitor
import Reconnector
import Replay
import Tunnel

/// The tunnel device as a configuration file describes it.
struct TunnelSettings: Equatable {
    var name = "roam0"
    /// 1420 leaves room for the tunnel's 60 to 80 bytes over an IPv4 or IPv6 1500-byte uplink.
    var mtu = 1420
    /// Inner addresses of this end (the server's; a client gets its own from the server).
    var addresses: [Prefix] = []
    /// TCP segmentation offload: the kernel hands over super-packets of up to 64 KB, which the
    /// agent cuts (fewer reads, less work in the kernel's TCP). Off: one packet per read.
    var offload = true
}

/// One server a client may use: where it is and the key it must prove.
struct ServerEntry: Equatable {
    /// What logs and status call it: its `name`, else its host.
    var name: String
    var endpoint: Endpoint
    var key: PublicKey
}

/// `agent up --config FILE`.
struct ClientSettings {
    /// The servers in the order they are tried (by priority, then as listed); never empty.
    var servers: [ServerEntry]
    /// The first server.
    var server: Endpoint { servers[0].endpoint }
    var serverKey: PublicKey { servers[0].key }
    var privateKeyFile: String
    var username: String?
    var passwordFile: String?
    var tunnel = TunnelSettings()
    var mode = RoutingMode.full(FullTunnel())
    var reconnect = Config()
    /// A keepalive after this long without outgoing packets, for a NAT that forgets idle
    /// mappings; nil (the default) sends none, so an idle tunnel wakes nothing.
    var persistentKeepalive: Duration?
    /// The lockdown firewall (on by default): nothing leaves outside the tunnel, also before
    /// the first handshake, between restarts and after a crash. See `LockdownPolicy`.
    var lockdown = true
    /// Full mode with lockdown: let the local subnets through (printers, casting), not their DNS.
    var allowLAN = false
    /// How the tunnel's resolvers reach the system, and which ones.
    var dns = ClientDNSSettings()
    /// Where the metrics are written in node_exporter's textfile format; nil: nowhere.
    var metricsFile: String?
    /// The connectivity check that finds captive portals (its timing is in `reconnect`).
    var portal = PortalCheck.standard

    /// Rules for the networks the laptop meets: where the tunnel connects, where it stays down.
    var onDemand = OnDemandRules()

    /// The ports the agent's own plain HTTP goes to outside the tunnel: the connectivity check's
    /// (with the check on) and the on-demand probes'.
    var checkPorts: [UInt16] {
        let probes = onDemand.rules.compactMap { $0.match.probe.flatMap { CheckURL($0.url)?.port } }
        return Array(Set((reconnect.portalCheck ? [portal.url.port] : []) + probes)).sorted()
    }
}

/// The client's `dns` section.
struct ClientDNSSettings: Equatable {
    /// Resolvers and search domains to use instead of those the server pushes.
    var override: DNSSettings?
    var manager = DNSManagerChoice.auto
}

/// Who is told about the tunnel's resolvers.
enum DNSManagerChoice: String, CaseIterable {
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
struct ServerSettings {
    var listenPort: UInt16
    var privateKeyFile: String
    var tunnel: TunnelSettings
    var users: UserDatabase
    /// Resolvers and search domains for users who have none of their own.
    var dns = DNSSettings.none
    /// On SIGTERM, how long sessions get to move to another server before the server stops;
    /// zero stops at once.
    var drainPeriod: Duration = .zero
    /// Data-plane workers, each with a queue of the TUN device and a socket per family: one
    /// per core by default, at most `maxWorkers`.
    var workers = ServerSettings.defaultWorkers
    /// Where `/metrics` is served over HTTP for Prometheus; nil: nowhere.
    var metricsListen: SocketAddress?

    static let maxWorkers = 64
    static var defaultWorkers: Int { min(max(1, Int(sysconf(Int32(_SC_NPROCESSORS_ONLN)))), 16) }
}

/// A key or password file's text, without the line end; see `TrustedFile.Kind.secret`.
func readSecretFile(_ path: String) throws(ConfigError) -> String {
    var bytes = try TrustedFile.read(path, as: .secret)
    defer { Sodium.wipe(&bytes) }
    return String(decoding: bytes, as: UTF8.self).trimmed
}

extension ClientSettings {
    /// The lockdown this client loads at start: no server yet (its name may still need looking
    /// up), the local subnets not yet known.
    var lockdownPolicy: LockdownPolicy {
        let scope: LockdownPolicy.Scope = switch mode {
        case .full(let policy): .full(mark: policy.mark)
        case .split(let prefixes): .split(prefixes)
        }
        var policy = LockdownPolicy(scope: scope, tunnelInterface: tunnel.name, allowLAN: allowLAN, localNetworks: [])
        policy.checkPorts = checkPorts
        return policy
    }
}

extension LockdownPolicy.Server {
    /// The lockdown's entry for a server's socket address.
    init(_ address: SocketAddress) { self.init(address.ip, port: address.port) }
}
