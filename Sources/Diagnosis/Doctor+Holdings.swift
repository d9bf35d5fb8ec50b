/// What the running agent said of the tunnel's MTU (`mtu` in its status).
public struct AgentMTU: Equatable, Sendable {
    /// The tunnel device's MTU now: what the session's path was found to carry.
    public var tunnel: Int
    public var configured: Int
    /// The smallest the tunnel goes (1280 with IPv6 inside, else 1200).
    public var floor: Int
    /// A search of the path is under way.
    public var searching: Bool
    public init(tunnel: Int, configured: Int, floor: Int, searching: Bool) {
        self.tunnel = tunnel
        self.configured = configured
        self.floor = floor
        self.searching = searching
    }
}

/// The tunnel's resolvers as the running agent applied them (`dns` in its status).
public struct AgentDNS: Equatable, Sendable {
    /// `resolv.conf` or `systemd-resolved`.
    public var manager: String
    /// Empty until applied.
    public var resolvers: [String]
    /// Why the tunnel has no resolvers of its own, when it has none.
    public var problem: String?
    public init(manager: String, resolvers: [String], problem: String? = nil) {
        self.manager = manager
        self.resolvers = resolvers
        self.problem = problem
    }
}

/// What others took away of one thing the agent holds, and the agent put back (`upkeep` in its
/// status).
public struct AgentUpkeep: Equatable, Sendable {
    /// `routing`, `resolvers` or `lockdown`.
    public var holding: String
    /// Restores since the agent started.
    public var restores: Int
    /// What is missing now.
    public var missing: String?
    public var lastRemovedBy: String?
    /// The agent holds off putting it back: a fight.
    public var heldOff: Bool
    public init(holding: String, restores: Int, missing: String? = nil, lastRemovedBy: String? = nil, heldOff: Bool = false) {
        self.holding = holding
        self.restores = restores
        self.missing = missing
        self.lastRemovedBy = lastRemovedBy
        self.heldOff = heldOff
    }
}

/// The system's resolver configuration as applications read it.
public struct SystemResolvers: Equatable, Sendable {
    public var file: String
    /// The `nameserver` lines, in order, or why the file could not be read.
    public var nameservers: Result<[String], DoctorError>
    public init(file: String, nameservers: Result<[String], DoctorError>) {
        self.file = file
        self.nameservers = nameservers
    }
}

extension Doctor {
    // MARK: Resolvers

    /// While the agent manages DNS, the system's resolvers are the tunnel's: any other is asked
    /// outside it (or, under the lockdown, not at all).
    static func resolvers(_ system: SystemResolvers?, agent: AgentFact) -> Finding? {
        guard case .running(let status) = agent, let dns = status.dns else { return nil }
        if let problem = dns.problem {
            return Finding(.resolvers, .warning, "The tunnel has no resolvers of its own", evidence: [problem],
                           fix: "give the server's configuration 'dns: {servers: [...]}', or the client's 'dns:'")
        }
        guard !dns.resolvers.isEmpty else { return nil }
        let applied = "the agent applied \(dns.resolvers.joined(separator: ", ")) through \(dns.manager)"
        guard dns.manager == "resolv.conf", let system else {
            return Finding(.resolvers, .ok, "systemd-resolved holds the tunnel's resolvers", evidence: [applied])
        }
        switch system.nameservers {
        case .failure(let why):
            return Finding(.resolvers, .warning, "Not checked whether the system's resolvers are the tunnel's", evidence: [applied, why.description])
        case .success(let names):
            let seen = "\(system.file) names " + (names.isEmpty ? "no resolver" : names.joined(separator: ", "))
            guard names == dns.resolvers else {
                return Finding(.resolvers, .problem, "The system's resolvers are not the tunnel's", evidence: [applied, seen],
                               fix: "someone rewrote \(system.file) (a DHCP client's hook, a network manager): the agent writes it again at the "
                                   + "next change of the network; if it keeps being rewritten, tell that program to leave the file alone, "
                                   + "or use systemd-resolved")
            }
            return Finding(.resolvers, .ok, "The system's resolvers are the tunnel's", evidence: [applied, seen])
        }
    }

    // MARK: Fights

    /// What others took away of the agent's routing, resolvers and lockdown: put back at once,
    /// held off once it turns into a fight.
    static func upkeep(_ agent: AgentFact) -> Finding? {
        guard case .running(let status) = agent, !status.upkeep.isEmpty else { return nil }
        let touched = status.upkeep.filter { $0.restores > 0 || $0.missing != nil }
        let evidence = touched.map { record in
            "\(record.holding): put back \(record.restores) times since the agent started"
                + (record.lastRemovedBy.map { ", last removed by \($0)" } ?? "")
                + (record.missing.map { "; missing now: \($0)" } ?? "")
                + (record.heldOff ? "; the agent holds off putting it back" : "")
        }
        let fought = touched.filter(\.heldOff)
        guard let first = fought.first else {
            return Finding(.upkeep, .ok, touched.isEmpty ? "Nobody takes away the agent's routing, resolvers or lockdown"
                                                         : "What others took away was put back", evidence: evidence)
        }
        let fix = switch first.holding {
        case "routing": "a network manager removes rules and routes it did not make: install contrib/NetworkManager-roam.conf "
            + "(NetworkManager) or contrib/networkd-roam.conf (systemd-networkd), or stop what runs 'ip rule del' or 'ip route flush'"
        case "resolvers": "a DHCP client's hook or a network manager rewrites resolv.conf: tell it to leave the file alone, or use systemd-resolved"
        default: "another program deletes nftables tables (a firewall service, 'nft flush ruleset'): keep it from touching table inet roam"
        }
        return Finding(.upkeep, .warning, "Another program keeps taking away the agent's \(fought.map(\.holding).joined(separator: " and "))",
                       evidence: evidence, fix: fix)
    }
}
