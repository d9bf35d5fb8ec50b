import Lockdown
import PathMonitor
import Tunnel

/// The lockdown firewall as the client daemon drives it: loaded before anything else at start,
/// following the server's address and (with allow-lan) the local subnets, and taken away only
/// by an operator's stop. A restart in place, a give-up or a crash leaves it loaded: the next
/// agent adopts it.
final class Firewall {
    private let lockdown: Lockdown
    private var policy: LockdownPolicy

    /// Loads the lockdown for `settings`, with no server yet (its name may still need looking
    /// up): from here on nothing but DHCP and neighbour discovery leaves outside the tunnel.
    init(_ settings: ClientSettings, localNetworks: [Prefix] = []) throws(LockdownError) {
        lockdown = try Lockdown()
        let scope: LockdownPolicy.Scope = switch settings.mode {
        case .full(let policy): .full(mark: policy.mark)
        case .split(let prefixes): .split(prefixes)
        }
        policy = LockdownPolicy(scope: scope, tunnelInterface: settings.tunnel.name, allowLAN: settings.allowLAN,
                                localNetworks: localNetworks)
        policy.checkPorts = settings.checkPorts
        try lockdown.apply(policy)
    }

    /// The policy becomes `next`: loaded now, or when the lockdown comes back if it is lifted.
    private func load(_ next: LockdownPolicy) throws(LockdownError) {
        guard next != policy else { return }
        try lockdown.apply(next)
        policy = next
    }

    /// The connectivity check's ports and the on-demand probes' (empty: none): the agent's marked
    /// sockets may open TCP to them.
    func allowCheck(ports: [UInt16]) throws(LockdownError) {
        var next = policy
        next.checkPorts = ports
        try load(next)
    }

    /// An on-demand rule trusts the network on `interface`: the machine may talk to it directly
    /// until `restore()`; every other interface stays locked. The table stays loaded, so an agent
    /// that restarts loads it whole again.
    func lift(for interface: String) throws(LockdownError) {
        var next = policy
        next.trustedInterface = interface
        try load(next)
    }

    /// The trusted interface is locked again.
    func restore() throws(LockdownError) {
        var next = policy
        next.trustedInterface = nil
        try load(next)
    }

    /// Whether an interface is trusted now (a restore that failed leaves it so).
    var isLifted: Bool { policy.trustedInterface != nil }

    /// Whether a portal window can be opened: only a full tunnel hides the portal.
    var supportsPortalWindow: Bool { if case .full = policy.scope { true } else { false } }

    /// Opens (or, with nil, closes) the portal window in the table.
    func portalWindow(_ window: LockdownPolicy.PortalWindow?) throws(LockdownError) {
        var next = policy
        next.portalWindow = window
        try load(next)
    }

    /// The session's UDP may go to `servers` now (the current one and those it may move to).
    func serve(_ servers: [SocketAddress]) throws(LockdownError) {
        var unique: [LockdownPolicy.Server] = []
        for server in servers where !unique.contains(where: { $0.address == server.ip && $0.port == server.port }) {
            unique.append(LockdownPolicy.Server(server.ip, port: server.port))
        }
        var next = policy
        next.servers = unique
        try load(next)
    }

    /// The uplinks' subnets changed: with allow-lan, the LAN the firewall lets through follows.
    func localNetworksChanged(_ networks: [Prefix]) throws(LockdownError) {
        guard policy.allowLAN else { return }
        var next = policy
        next.localNetworks = networks
        try load(next)
    }

    /// Packets stopped, by cause, for `agent status`.
    func counters() -> [BlockCause: UInt64] { (try? lockdown.counters()) ?? [:] }

    /// The operator stopped the agent: the machine is open again.
    func remove() throws(LockdownError) { try lockdown.remove() }

    /// With `lockdown: off`, a table an earlier agent left is taken away at start.
    static func removeLeftover() throws(LockdownError) { try Lockdown().remove() }
}
