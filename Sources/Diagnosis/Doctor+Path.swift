/// The connectivity check made from the uplink the gateway is reached through, outside the
/// tunnel.
public enum PortalFact: Equatable, Sendable {
    /// Not made, and why (turned off, no route, held back by a running agent's lockdown).
    case notChecked(String)
    /// The check of `url`, sent from `via`, and what its answer meant.
    case checked(url: String, via: String, PortalAnswer)
}

/// What the connectivity check's answer means (as the agent's own check judges it).
public enum PortalAnswer: Equatable, Sendable {
    case online
    /// A redirect or another answer: a captive portal, with its login page.
    case portal(login: String)
    /// No usable answer, and why.
    case unknown(String)
}

/// What the path to the gateway can carry as far as the machine knows it.
public struct PathMTUFacts: Equatable, Sendable {
    /// The tunnel's configured MTU (`tunnel: {mtu: ...}`).
    public var configured: Int
    /// The uplink the gateway is reached through, and its MTU (the first hop's).
    public var uplink: String
    public var uplinkMTU: Int
    /// What the tunnel adds to an inner packet on that path.
    public var overhead: Int
    public init(configured: Int, uplink: String, uplinkMTU: Int, overhead: Int) {
        self.configured = configured
        self.uplink = uplink
        self.uplinkMTU = uplinkMTU
        self.overhead = overhead
    }
}

extension Doctor {
    // MARK: Captive portal

    static func portal(_ fact: PortalFact?, agent: AgentFact) -> Finding? {
        let fix = "log in through the portal window: agent portal (or agent portal --run BROWSER); the lockdown stays closed to everything else"
        if case .running(let status) = agent, let login = status.portal {
            return Finding(.portal, .problem, "This network holds traffic back behind a captive portal",
                           evidence: ["the agent's connectivity check was sent to \(login)"], fix: fix)
        }
        switch fact {
        case nil:
            return nil
        case .notChecked(let why):
            return Finding(.portal, .ok, "Not checked for a captive portal", evidence: [why])
        case .checked(let url, let via, .online):
            return Finding(.portal, .ok, "No captive portal: the connectivity check reaches the internet",
                           evidence: ["\(url) from \(via): the expected answer"])
        case .checked(let url, let via, .portal(let login)):
            let notRunning = if case .running = agent { false } else { true }
            return Finding(.portal, .problem, "This network holds traffic back behind a captive portal",
                           evidence: ["\(url) from \(via) was sent to \(login)"],
                           fix: notRunning ? "log in at \(login) in a browser, or start the agent and log in through its portal window (agent portal)" : fix)
        case .checked(let url, let via, .unknown(let why)):
            return Finding(.portal, .warning, "The connectivity check proved nothing", evidence: ["\(url) from \(via): \(why)"],
                           fix: "the route and UDP findings say whether the gateway is reachable; a network that answers no plain HTTP may still carry the tunnel")
        }
    }

    // MARK: Path MTU

    /// The tunnel's configured MTU against what the first hop carries and, while the agent is
    /// connected over UDP, what its padded probes proved of the whole path.
    static func pathMTU(_ facts: PathMTUFacts?, agent: AgentFact) -> Finding? {
        guard let facts else { return nil }
        let full = facts.configured + facts.overhead
        var evidence = ["\(facts.uplink)'s MTU is \(facts.uplinkMTU); a full tunnel packet (\(facts.configured) inside) is \(full) on it"]
        var carried = facts.uplinkMTU - facts.overhead
        var floor: Int?
        if case .running(let status) = agent, let mtu = status.mtu, status.path?.hasSuffix("over udp") == true {
            evidence.append("the agent's padded probes: tunnel MTU \(mtu.tunnel) (configured \(mtu.configured), minimum \(mtu.floor))"
                + (mtu.searching ? ", still searching" : ""))
            carried = min(carried, mtu.tunnel)
            floor = mtu.floor
        }
        guard carried < facts.configured else {
            return Finding(.mtu, .ok, "The path to the gateway carries the tunnel's MTU (\(facts.configured))", evidence: evidence)
        }
        // The smallest floor the agent uses (1200) when no agent said its own.
        if carried < (floor ?? 1200) {
            return Finding(.mtu, .problem, "The path to the gateway carries no more than the tunnel's smallest packets (\(carried))",
                           evidence: evidence,
                           fix: "a path this small loses big packets: use another network, or ask the network's operator about its MTU (a PPPoE line carries 1492, most networks 1500)")
        }
        return Finding(.mtu, .warning, "The path to the gateway carries tunnel packets of at most \(carried) bytes, less than the configured \(facts.configured)",
                       evidence: evidence,
                       fix: "the agent runs the tunnel at the size the path carries; to start there, set 'tunnel: {mtu: \(carried)}' (a PPPoE line, an LTE bearer or a tunnel inside the network makes a path smaller)")
    }
}
