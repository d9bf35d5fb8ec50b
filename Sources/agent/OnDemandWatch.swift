import Logging
import PathMonitor
import Reconnector
import SystemDNS

/// Gathers what the on-demand rules match on for the network of the best path: the interface
/// and its addresses (from the routing model), the Wi-Fi network's name (nl80211), the default
/// gateway's hardware address (the neighbour table), the search domains the network gave
/// (resolv.conf as it was before the tunnel's), and the rules' probes (plain HTTP over the
/// uplink, on their own threads). Only the facts some rule needs are looked up.
///
/// The Wi-Fi network and the gateway's address can change with no link, address or route
/// changing (a join of another network on the same lease, another router behind the same
/// gateway address): the kernel's notices of both are followed while a rule needs them, and
/// each fact is kept for its network until a notice says it changed.
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
    /// Kernel notices of the neighbour table and of Wi-Fi associations, while a rule needs them.
    private var neighbourEvents: NeighbourEvents?
    private var wirelessEvents: WirelessEvents?
    /// This network's gateway address and Wi-Fi network, kept while the notices are followed.
    private var gatewayAddress: HardwareAddress?
    private var wifi: Fact<String>?
    /// Changes of resolv.conf, while a rule matches on search domains.
    private var resolvConf: ResolvConfWatch?
    /// A network after the first is given its search domains until then, or until resolv.conf
    /// changes: a DHCP client writes the file after the address and routes, and until it does
    /// the file holds the last network's.
    private var domainsAwaitedUntil: Instant?
    private var seenANetwork = false
    private let log: Logger

    /// How long the neighbour table may take to learn the gateway's address.
    static let resolveWait: Duration = .seconds(2)
    /// How often a missing gateway entry is looked for meanwhile.
    static let resolveStep: Duration = .milliseconds(100)
    /// How long a new network's search domains are awaited.
    static let domainsWait: Duration = .seconds(2)

    init(rules: OnDemandRules, log: Logger) {
        self.rules = rules
        self.log = log
        netlink = try? NetlinkSocket()
        follow()
    }

    /// New rules (a reload): everything is decided afresh.
    func use(_ rules: OnDemandRules) {
        guard rules != self.rules else { return }
        self.rules = rules
        forgetNetwork()
        seenANetwork = false
        follow()
    }

    /// Follows the notices the rules need, and only those.
    private func follow() {
        let needs = rules.rules.map(\.match)
        if !needs.contains(where: { !$0.gatewayMACs.isEmpty }) {
            neighbourEvents = nil
        } else if neighbourEvents == nil {
            do {
                neighbourEvents = try NeighbourEvents()
            } catch {
                log.warning("cannot follow the neighbour table; a gateway's address is read at each network change", metadata: ["error": "\(error)"])
            }
        }
        if !needs.contains(where: { !$0.dnsDomains.isEmpty }) {
            resolvConf = nil
        } else if resolvConf == nil {
            do {
                resolvConf = try ResolvConfWatch()
            } catch {
                log.warning("cannot follow resolv.conf; search domains are read at each network change", metadata: ["error": "\(error)"])
            }
        }
        if !needs.contains(where: { !$0.ssids.isEmpty }) {
            wirelessEvents = nil
        } else if wirelessEvents == nil {
            do {
                wirelessEvents = try WirelessEvents()
            } catch {
                log.warning("cannot follow Wi-Fi associations; the Wi-Fi network is read at each network change", metadata: ["error": "\(error)"])
            }
        }
    }

    /// The sockets whose notices `noticesArrived` reads.
    var fileDescriptors: [Int32] {
        [neighbourEvents?.fileDescriptor, wirelessEvents?.fileDescriptor, resolvConf?.fileDescriptor].compactMap { $0 }
    }

    /// Reads the notices on the `ready` sockets; true when a fact about the current network may
    /// have changed, so the rules should look again. A gateway with another hardware address, or
    /// a Wi-Fi link on another network, is another network: its probes' answers are forgotten.
    func noticesArrived(ready: [Int32]) -> Bool {
        var again = false
        if let events = neighbourEvents, ready.contains(events.fileDescriptor) {
            for notice in events.take() {
                switch notice {
                case .lost:
                    // The table is read again at the next decision.
                    gatewayAddress = nil
                    again = true
                case .entry(let entry):
                    guard let network, entry.linkIndex == network.path.linkIndex, entry.address == network.gateway,
                          let address = entry.usableHardwareAddress, address != gatewayAddress else { continue }
                    if gatewayAddress != nil { networkMoved() }
                    gatewayAddress = address
                    resolvingUntil = nil
                    nextLook = nil
                    again = true
                }
            }
        }
        if let events = wirelessEvents, ready.contains(events.fileDescriptor) {
            for notice in events.take() {
                switch notice {
                case .association(let index):
                    guard let network, index == network.path.linkIndex else { continue }
                    let now = readSSID(network.path.linkIndex)
                    if let wifi, wifi != now { networkMoved() }
                    if wifi != now { again = true }
                    wifi = now
                case .appeared, .lost:
                    wifi = nil
                    again = true
                }
            }
        }
        if let resolvConf, ready.contains(resolvConf.fileDescriptor), resolvConf.changed() {
            domainsAwaitedUntil = nil
            again = true
        }
        return again && network != nil
    }

    /// The link is on another network than the one its facts were about (same path, same gateway
    /// address): what was learned of that one no longer holds.
    private func networkMoved() {
        answered = [:]
        gatewayAddress = nil
        wifi = nil
        resolveGaveUp = false
    }

    /// No network now (or the machine slept): what was known and decided is forgotten, so the
    /// next network is looked at, and decided for, afresh.
    func forgetNetwork() {
        network = nil
        networkMoved()
        resolvingUntil = nil
        nextLook = nil
        domainsAwaitedUntil = nil
        decision = nil
    }

    /// When the gateway's entry should be looked for again, while it is awaited.
    var nextDeadline: Instant? { [resolvingUntil == nil ? nil : nextLook, domainsAwaitedUntil].compactMap { $0 }.min() }

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
            if seenANetwork && resolvConf != nil { domainsAwaitedUntil = .now() + Self.domainsWait }
            seenANetwork = true
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
        if let until = domainsAwaitedUntil, Instant.now() >= until { domainsAwaitedUntil = nil }
        if domainsAwaitedUntil != nil {
            facts.dnsDomains = .pending
        } else if needs.contains(where: { !$0.dnsDomains.isEmpty }) {
            let conf = ResolvConf(ResolvConfFile.systemText(at: "/etc/resolv.conf") ?? "")
            let domains = conf.search.filter { !tunnelSearch.contains($0) }
            facts.dnsDomains = domains.isEmpty ? .absent : .known(domains)
        }
        return facts
    }

    /// The Wi-Fi network, kept for the network while associations are followed.
    private func ssid(of path: Path) -> Fact<String> {
        if let wifi { return wifi }
        let now = readSSID(path.linkIndex)
        if wirelessEvents != nil { wifi = now }
        return now
    }

    private func readSSID(_ linkIndex: Int32) -> Fact<String> {
        switch Wireless.ssid(ofInterface: linkIndex) {
        case .ssid(let ssid): .known(ssid.description)
        case .notAssociated, .notWireless, .failed: .absent
        }
    }

    /// The gateway's entry in the neighbour table; while it is missing, the kernel is asked to
    /// resolve it (an ARP or neighbour solicitation, no IP packet) and the rules wait a while.
    /// Once known, it is kept for the network while the neighbour table is followed: the kernel
    /// forgetting an idle entry says nothing about the network.
    private func gatewayMAC(of path: Path) -> Fact<String> {
        if let gatewayAddress { return .known(gatewayAddress.description) }
        guard let gateway = path.gateway, let netlink else { return .absent }
        if let entry = try? netlink.neighbour(of: gateway, linkIndex: path.linkIndex), let mac = entry.usableHardwareAddress {
            resolvingUntil = nil
            nextLook = nil
            if neighbourEvents != nil { gatewayAddress = mac }
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
