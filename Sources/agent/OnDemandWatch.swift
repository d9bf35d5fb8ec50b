import PathMonitor
import Reconnector
import SystemDNS

/// Gathers what the on-demand rules match on for the network of the best path: the interface
/// and its addresses (from the routing model), the Wi-Fi network's name (nl80211), the default
/// gateway's hardware address (the neighbour table), the search domains the network gave
/// (resolv.conf as it was before the tunnel's), and the rules' probes (plain HTTP over the
/// uplink, on their own threads). Only the facts some rule needs are looked up.
///
/// Owned by the deciding thread.
final class OnDemandWatch {
    private(set) var rules: OnDemandRules
    private let netlink: NetlinkSocket?
    /// The network the facts below are about: a path and its gateway.
    private var network: (path: Path.ID, gateway: IPAddress?)?
    /// Probes that answered on it, and those still out.
    private var answered: [OnDemandRule.Probe: Bool] = [:]
    private var running: Set<OnDemandRule.Probe> = []
    /// The gateway's entry is being resolved until then; after it, a missing one is absent.
    private var resolvingUntil: Instant?
    /// The wait for the gateway's entry ran out on this network.
    private var resolveGaveUp = false
    /// When to look for the gateway's entry again, while it is awaited.
    private var nextLook: Instant?
    /// The last decision, fed to the core only when it changes.
    private(set) var decision: OnDemandDecision?

    /// How long the neighbour table may take to learn the gateway's address.
    static let resolveWait: Duration = .seconds(2)
    /// How often a missing gateway entry is looked for meanwhile.
    static let resolveStep: Duration = .milliseconds(100)

    init(rules: OnDemandRules) {
        self.rules = rules
        netlink = try? NetlinkSocket()
    }

    /// New rules (a reload): everything is decided afresh.
    func use(_ rules: OnDemandRules) {
        guard rules != self.rules else { return }
        self.rules = rules
        forgetNetwork()
    }

    /// No network now (or the machine slept): what was known and decided is forgotten, so the
    /// next network is looked at, and decided for, afresh.
    func forgetNetwork() {
        network = nil
        answered = [:]
        resolvingUntil = nil
        resolveGaveUp = false
        nextLook = nil
        decision = nil
    }

    /// When the gateway's entry should be looked for again, while it is awaited.
    var nextDeadline: Instant? { resolvingUntil == nil ? nil : nextLook }

    /// A probe over `path` answered (`true`: as its rule expects).
    func probeAnswered(_ probe: OnDemandRule.Probe, on path: Path.ID, _ expected: Bool) {
        running.remove(probe)
        guard network?.path == path else { return }
        answered[probe] = expected
    }

    /// What the rules say for `best`'s network now; `startProbe` runs a probe they wait for.
    /// Returns the decision when it changed since the last one.
    func decide(for best: Path, model: NetworkModel, tunnelSearch: [String],
                startProbe: (OnDemandRule.Probe, Path) -> Void) -> OnDemandDecision? {
        if network?.path != best.id || network?.gateway != best.gateway {
            let decided = decision
            forgetNetwork()
            decision = decided
            network = (best.id, best.gateway)
        }
        let facts = facts(for: best, model: model, tunnelSearch: tunnelSearch)
        let new = rules.evaluate(facts)
        if case .waiting(_, let wanted, _) = new {
            for case .probe(let probe) in wanted where !running.contains(probe) {
                running.insert(probe)
                startProbe(probe, best)
            }
        }
        guard new != decision else { return nil }
        decision = new
        return new
    }

    private func facts(for path: Path, model: NetworkModel, tunnelSearch: [String]) -> NetworkFacts {
        let needs = rules.rules.map(\.match)
        var facts = NetworkFacts(path: path, probes: answered)
        facts.addresses = model.usableAddresses(on: path.linkIndex)
        if facts.addresses.isEmpty { facts.addresses = [path.source] }
        if needs.contains(where: { !$0.ssids.isEmpty }) { facts.ssid = ssid(of: path) }
        if needs.contains(where: { !$0.gatewayMACs.isEmpty }) { facts.gatewayMAC = gatewayMAC(of: path) }
        if needs.contains(where: { !$0.dnsDomains.isEmpty }) {
            let conf = ResolvConf(ResolvConfFile.systemText(at: "/etc/resolv.conf") ?? "")
            let domains = conf.search.filter { !tunnelSearch.contains($0) }
            facts.dnsDomains = domains.isEmpty ? .absent : .known(domains)
        }
        return facts
    }

    private func ssid(of path: Path) -> Fact<String> {
        switch Wireless.ssid(ofInterface: path.linkIndex) {
        case .ssid(let ssid): .known(ssid.description)
        case .notAssociated, .notWireless, .failed: .absent
        }
    }

    /// The gateway's entry in the neighbour table; while it is missing, the kernel is asked to
    /// resolve it (an ARP or neighbour solicitation, no IP packet) and the rules wait a while.
    private func gatewayMAC(of path: Path) -> Fact<String> {
        guard let gateway = path.gateway, let netlink else { return .absent }
        if let entry = try? netlink.neighbour(of: gateway, linkIndex: path.linkIndex), let mac = entry.usableHardwareAddress {
            resolvingUntil = nil
            nextLook = nil
            return .known(mac.description)
        }
        if resolveGaveUp { return .absent }
        let now = Instant.now()
        guard let until = resolvingUntil else {
            try? netlink.resolve(gateway, linkIndex: path.linkIndex)
            resolvingUntil = now + Self.resolveWait
            nextLook = now + Self.resolveStep
            return .pending
        }
        if now < until {
            nextLook = min(until, now + Self.resolveStep)
            return .pending
        }
        resolvingUntil = nil
        nextLook = nil
        resolveGaveUp = true
        return .absent
    }
}

extension OnDemandRule.Probe.Expect {
    /// The same expectation, as the connectivity check reads answers.
    var portalExpectation: PortalCheck.Expectation {
        switch self {
        case .status(let code): .status(code)
        case .body(let text): .body(text)
        }
    }
}
