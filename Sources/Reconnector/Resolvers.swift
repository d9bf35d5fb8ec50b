public import Basics

/// Which resolvers the system is given for the tunnel, decided: the configuration's own
/// (`dns`) before the server's, never one that would be asked in clear (outside what the
/// tunnel carries, or on an uplink's own subnet, which the machine reaches on the link even
/// in a full tunnel). Judged again after each handshake (the server's list may change), when
/// the uplinks' subnets change (a resolver may come onto one, or leave it), and when a lifted
/// lockdown comes back; while it is lifted the system's own resolvers are in use.
public struct ResolverChoice: Equatable, Sendable {
    /// The configuration's own resolvers, which win over the server's.
    public let override: DNSSettings?
    /// What the tunnel's routes carry (both families' whole space in a full tunnel).
    public let carried: [Prefix]
    /// The lockdown is on: without resolvers the tunnel reaches, names do not resolve.
    public let lockdown: Bool
    /// What the server gave at the last handshake; nil before one.
    private var pushed: Result<DNSSettings, DNSSettingsError>?
    /// The uplinks' own subnets.
    private var local: [Prefix] = []
    /// A rule lifted the lockdown: the tunnel's resolvers are not in use.
    private var lifted = false
    /// The tunnel device is up.
    private var device = false
    /// The last decision given out; nil when the next must be (none yet, or the system's own took over).
    private var given: ResolverDecision?

    public init(override: DNSSettings?, carried: [Prefix], lockdown: Bool) {
        self.override = override
        self.carried = carried
        self.lockdown = lockdown
    }

    /// A handshake completed with what the server gave.
    mutating func handshake(gave dns: Result<DNSSettings, DNSSettingsError>) { pushed = dns }

    /// The tunnel device is up: resolvers can be given for it.
    mutating func attached() { device = true }

    /// The uplinks' subnets are `prefixes` now.
    mutating func localNetworks(_ prefixes: [Prefix]) { local = prefixes }

    /// A rule lifted the lockdown (the runner gave the system its own resolvers back).
    mutating func lift() {
        lifted = true
        given = nil
    }

    /// The lockdown is back: the tunnel's resolvers with it.
    mutating func restore() { lifted = false }

    /// The decision now, when it differs from the last one given; nil also before there is
    /// one to make (no handshake yet, no device, the lockdown lifted).
    mutating func decision() -> ResolverDecision? {
        guard !lifted, device, let pushed else { return nil }
        let decision: ResolverDecision
        switch (override, pushed) {
        case (let own?, _):
            decision = judge(own)
        case (nil, .success(let server)):
            decision = judge(server)
        case (nil, .failure(let error)):
            decision = ResolverDecision(use: nil, why: "the server's resolvers are refused: \(error)", inClear: [], offLAN: [])
        }
        guard decision != given else { return nil }
        given = decision
        return decision
    }

    private func judge(_ wanted: DNSSettings) -> ResolverDecision {
        let inClear = wanted.resolvers.filter { resolver in
            !carried.contains { $0.contains(resolver) } || local.contains { $0.contains(resolver) }
        }
        let kept = wanted.resolvers.filter { !inClear.contains($0) }
        guard !kept.isEmpty else {
            let why = wanted.resolvers.isEmpty
                ? "neither the server nor 'dns' gives resolvers for the tunnel"
                : "every resolver for the tunnel would be asked in clear"
            return ResolverDecision(use: nil, why: why + (lockdown ? "; with the lockdown on, names resolve only through resolvers the tunnel reaches" : ""),
                                    inClear: inClear, offLAN: wanted.resolvers)
        }
        let use = (try? DNSSettings(resolvers: kept, searchDomains: wanted.searchDomains)) ?? .none
        return ResolverDecision(use: use, why: nil, inClear: inClear, offLAN: wanted.resolvers)
    }
}

/// What the system is given for the tunnel's names (`Effect.resolvers`).
public struct ResolverDecision: Equatable, Sendable {
    /// The resolvers and search domains to give the system; nil: none (`why` says why).
    public var use: DNSSettings?
    /// Why the tunnel has no resolvers, when it has none.
    public var why: String?
    /// Resolvers left out because they would be asked in clear.
    public var inClear: [IPAddress]
    /// Every resolver the tunnel's list names: the lockdown keeps them off the uplinks' networks,
    /// so that a query to one never goes to the local network instead.
    public var offLAN: [IPAddress]
}
