public import Basics

/// The lockdown firewall as the client daemon drives it: loaded before anything else at start,
/// following the server's address and (with allow-lan) the local subnets, and taken away only
/// by an operator's stop. A restart in place, a give-up or a crash leaves it loaded: the next
/// agent adopts it.
public final class Firewall {
    private let lockdown: Lockdown?
    /// Loads a policy into the table (`lockdown.apply`).
    private let apply: (LockdownPolicy) throws(LockdownError) -> Void
    /// What the table should hold.
    private var wanted: LockdownPolicy
    /// What it held after the last load that succeeded.
    private var loaded: LockdownPolicy
    /// The last policy nftables refused, until a load succeeds: nftables loads a policy whole
    /// or not at all, but a refusal reported after the kernel took it would leave this one in
    /// place, so what the table holds is uncertain until the next load succeeds. Whoever made
    /// the change hears of the refusal, and has what is wanted loaded again (`reload`): the
    /// agent's core, as damage to the lockdown, which it has put back until it holds (a closing
    /// stays wanted; after a refused opening, what was there before is loaded again).
    private var refused: LockdownPolicy?
    /// Refusals since the table last held what it should, and the last one's error.
    public private(set) var refusals = 0
    /// Refusals since the firewall was made: it only grows, so a refusal between two loads
    /// that succeed is never missed by whoever compares it before and after.
    public private(set) var refusalsEver = 0
    public private(set) var lastRefusal: LockdownError?

    /// Loads `policy` (a client's, with no server yet: its name may still need looking up):
    /// from here on nothing but DHCP and neighbour discovery leaves outside the tunnel.
    /// `guarded`: a running agent's, with the guard no other process may delete (`Lockdown`).
    public init(_ policy: LockdownPolicy, guarded: Bool = false) throws(LockdownError) {
        let lockdown = try Lockdown(guard: guarded ? LockdownPolicy.guardTable : nil)
        wanted = policy
        try lockdown.apply(wanted)
        loaded = wanted
        self.lockdown = lockdown
        apply = lockdown.apply
    }

    /// A firewall over `apply` that holds `policy` now: for tests of what is loaded when.
    public init(holding policy: LockdownPolicy, apply: @escaping (LockdownPolicy) throws(LockdownError) -> Void) {
        lockdown = nil
        self.apply = apply
        wanted = policy
        loaded = policy
    }

    /// Makes `edit` to the policy and loads it. When nftables refuses, a change whose refusal the
    /// caller answers (an opening the decision core asked for and hears the answer of: a server's
    /// address, the proxy's, a portal window, the exclusion, a trusted network) is forgotten, and the table keeps what
    /// it had; any other (a closing, or an opening nobody is told of: the local and guest networks,
    /// the check's ports) stays wanted and is tried again, so a refusal can delay it but never undo it.
    private func change(kept: Bool = false, _ edit: (inout LockdownPolicy) -> Void) throws(LockdownError) {
        let before = wanted
        edit(&wanted)
        do {
            try sync()
        } catch {
            if !kept { wanted = before }
            throw error
        }
    }

    /// Loads what is wanted, unless the table is known to hold it.
    private func sync() throws(LockdownError) {
        guard wanted != loaded || refused != nil else { return }
        do {
            try apply(wanted)
        } catch {
            refused = wanted
            refusals += 1
            refusalsEver += 1
            lastRefusal = error
            throw error
        }
        loaded = wanted
        refused = nil
        refusals = 0
        lastRefusal = nil
    }

    /// Tries again to load what was refused, if anything was (a last try as the agent stops);
    /// nil when the table now holds what it should.
    public func retry() -> LockdownError? {
        do {
            try sync()
            return nil
        } catch {
            return error
        }
    }

    /// The connectivity check's ports and the on-demand probes' (empty: none): the agent's marked
    /// sockets may open TCP to them.
    public func allowCheck(ports: [UInt16]) throws(LockdownError) {
        try change(kept: true) { $0.checkPorts = ports }
    }

    /// An on-demand rule trusts the network on `interface`: the machine may talk to it directly
    /// until `restore()`; every other interface stays locked. The table stays loaded, so an agent
    /// that restarts loads it whole again.
    public func lift(for interface: String) throws(LockdownError) {
        try change { $0.trustedInterface = interface }
    }

    /// The trusted interface is locked again (tried again until it holds).
    public func restore() throws(LockdownError) {
        try change(kept: true) { $0.trustedInterface = nil }
    }

    /// Whose sockets get the session's exceptions.
    public var owner: LockdownPolicy.Owner? { wanted.owner }

    /// The interface the table may let through now, when an on-demand rule lifted the lockdown
    /// (a refused restore leaves it so until a load holds; after a refusal, what was refused
    /// may be in place too).
    public var trustedInterface: String? { loaded.trustedInterface ?? refused?.trustedInterface }

    /// Opens (or, with nil, closes: tried again until it holds) the portal window in the table.
    public func portalWindow(_ window: LockdownPolicy.PortalWindow?) throws(LockdownError) {
        try change(kept: window == nil) { $0.portalWindow = window }
    }

    /// The excluded applications' cgroup is let through (or, with nil, no longer).
    public func exclusion(_ exclusion: LockdownPolicy.Exclusion?) throws(LockdownError) {
        guard case .full = wanted.scope, wanted.exclusion != exclusion else { return }
        // Opening it is answered (`exclusionOpened`); closing it, or a change of what it lets
        // through (the network's resolvers), nobody is told of: kept, and tried again.
        try change(kept: exclusion == nil || wanted.exclusion != nil) { $0.exclusion = exclusion }
    }

    /// The network's resolvers the excluded applications' look-ups go to.
    public var excludedResolvers: [IPAddress] { wanted.exclusion?.resolvers ?? [] }

    /// The session's UDP may go to `servers` now (the current one and those it may move to).
    public func serve(_ servers: [LockdownPolicy.Server]) throws(LockdownError) {
        var unique: [LockdownPolicy.Server] = []
        for server in servers where !unique.contains(server) { unique.append(server) }
        try change { $0.servers = unique }
    }

    /// The HTTP proxy (named by host) is at `addresses` on the networks the machine is on now:
    /// the session's streams may open TCP to them at its port, and to no other address of it.
    /// A `closing` (addresses only taken out) stays wanted when refused, and is tried again.
    public func proxyAt(_ addresses: [IPAddress], closing: Bool = false) throws(LockdownError) {
        guard var proxy = wanted.proxy, proxy.addresses != addresses else { return }
        proxy.addresses = addresses
        try change(kept: closing) { $0.proxy = proxy }
    }

    /// The tunnel device has these inner addresses now: nothing for them comes in on an uplink.
    /// A refusal is tried again, as a closing is.
    public func tunnelAddresses(_ addresses: [IPAddress]) throws(LockdownError) {
        try change(kept: true) { $0.innerAddresses = addresses }
    }

    /// The tunnel's resolvers now: with allow-lan, they stay out of the LAN the firewall opens.
    public func tunnelResolvers(_ addresses: [IPAddress]) throws(LockdownError) {
        guard wanted.allowLAN, wanted.tunnelOnly != addresses else { return }
        try change(kept: true) { $0.tunnelOnly = addresses }
    }

    /// The bridges the machine's containers and VMs sit behind are these now: their traffic,
    /// and nobody else's, is forwarded through the tunnel.
    public func guestNetworks(_ interfaces: [String]) throws(LockdownError) {
        let names = interfaces.filter(LockdownPolicy.canQuote)
        guard wanted.guests != names else { return }
        try change(kept: true) { $0.guests = names }
    }

    /// The uplinks' subnets changed: with allow-lan, the LAN the firewall lets through follows.
    public func localNetworksChanged(_ networks: [Prefix]) throws(LockdownError) {
        guard wanted.allowLAN else { return }
        try change(kept: true) { $0.localNetworks = networks }
    }

    /// Someone else changed or deleted the table, or nftables refused a change: what is wanted
    /// is loaded again, whole.
    public func reload() throws(LockdownError) {
        lockdown?.forget()
        refused = refused ?? wanted
        try sync()
    }

    /// Why the kernel keeps no guard of the table, when it keeps none (see `Lockdown`).
    public var guardUnavailable: LockdownError? { lockdown?.guardUnavailable }

    /// Transactions on the table this agent committed (see `TableWatch.foreignChange`).
    public var commits: Int { lockdown?.commits ?? 0 }

    /// Packets stopped, by cause, for `agent status`.
    public func counters() -> [BlockCause: UInt64] { (try? lockdown?.counters()) ?? [:] }

    /// The operator stopped the agent: the machine is open again.
    public func remove() throws(LockdownError) { try lockdown?.remove() }

    /// With `lockdown: off`, a table an earlier agent left is taken away at start.
    public static func removeLeftover() throws(LockdownError) { try Lockdown().remove() }
}
