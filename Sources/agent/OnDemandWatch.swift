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
/// The Wi-Fi network, the gateway's address and resolv.conf can change with no link, address
/// or route changing (a join of another network on the same lease, another router behind the
/// same gateway address, a DHCP client writing the file after the routes): the kernel's
/// notices of each are followed while a rule needs them. A fact is kept for its network until a
/// notice changes it; a network that turns out to be another one is looked at afresh.
///
/// Owned by the deciding thread.
final class OnDemandWatch {
    private(set) var rules: OnDemandRules
    private let netlink: NetlinkSocket?
    private let log: Logger
    /// The network the facts below are about: a path and its gateway.
    private var network: Network?
    /// Changes whenever the network does, even on the same path: a probe's answer counts only
    /// for the network it was made on.
    private(set) var generation: UInt64 = 0
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
    /// Kernel notices of the neighbour table, Wi-Fi associations and resolv.conf, while a rule
    /// needs them.
    private var neighbourEvents: NeighbourEvents?
    private var wirelessEvents: WirelessEvents?
    private var resolvConf: ResolvConfWatch?
    /// This network's gateway address and Wi-Fi network, kept while the notices are followed.
    private var gatewayAddress: HardwareAddress?
    private var wifi: Fact<String>?
    /// The search list resolv.conf gave, and the network it was read on.
    private var domainsSeen: (list: [String], network: Network)?
    /// On another network, the list is awaited until the file's differs from the last
    /// network's (its DHCP client wrote it), for a while; after that, with no change, the
    /// network gave none that can be told from the last one's.
    private var domainsAwaited: (stale: [String], until: Instant?)?

    struct Network: Equatable {
        var path: Path.ID
        var gateway: IPAddress?
    }

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
        follow()
    }

    // MARK: Notices

    /// Follows the notices the rules need, and only those.
    private func follow() {
        let needs = rules.rules.map(\.match)
        neighbourEvents = subscribe(needs.contains { !$0.gatewayMACs.isEmpty }, neighbourEvents, "the neighbour table",
                                    "a gateway's address") { () throws(NetlinkError) in try NeighbourEvents() }
        wirelessEvents = subscribe(needs.contains { !$0.ssids.isEmpty }, wirelessEvents, "Wi-Fi associations",
                                   "the Wi-Fi network") { () throws(NetlinkError) in try WirelessEvents() }
        resolvConf = subscribe(needs.contains { !$0.dnsDomains.isEmpty }, resolvConf, "resolv.conf",
                               "search domains") { () throws(SystemError) in try ResolvConfWatch() }
        if resolvConf == nil { domainsSeen = nil }
    }

    /// `current` while `needed`, else nil; opened when needed and missing (a failure is logged).
    private func subscribe<Watch, Failure: Error>(_ needed: Bool, _ current: Watch?, _ what: String, _ fact: String,
                                                  _ open: () throws(Failure) -> Watch) -> Watch? {
        guard needed else { return nil }
        if let current { return current }
        do {
            return try open()
        } catch {
            log.warning("cannot follow \(what); \(fact) is read at each network change", metadata: ["error": "\(error)"])
            return nil
        }
    }

    /// The sockets whose notices `noticesArrived` reads.
    var fileDescriptors: [Int32] {
        [neighbourEvents?.fileDescriptor, wirelessEvents?.fileDescriptor, resolvConf?.fileDescriptor].compactMap { $0 }
    }

    /// Reads the notices on the `ready` sockets; true when a fact about the current network may
    /// have changed, so the rules should look again. A gateway with another hardware address, or
    /// a Wi-Fi link on another network, is another network: what was learned of the last one,
    /// its probes' answers included, no longer counts.
    func noticesArrived(ready: [Int32]) -> Bool {
        var again = false
        if let events = neighbourEvents, ready.contains(events.fileDescriptor) {
            for notice in events.take() {
                switch notice {
                case .entry(let entry):
                    guard let network, entry.linkIndex == network.path.linkIndex, entry.address == network.gateway,
                          let address = entry.usableHardwareAddress else { continue }
                    again = learn(gateway: address) || again
                case .lost:
                    // Whatever was missed, the table holds the outcome.
                    guard let network, let gateway = network.gateway,
                          let entry = try? netlink?.neighbour(of: gateway, linkIndex: network.path.linkIndex),
                          let address = entry.usableHardwareAddress else { continue }
                    again = learn(gateway: address) || again
                }
            }
        }
        if let events = wirelessEvents, ready.contains(events.fileDescriptor) {
            for notice in events.take() {
                guard let network else { break }
                switch notice {
                case .association(let index) where index != network.path.linkIndex: continue
                case .association, .appeared, .lost: again = learn(wifi: readSSID(network.path.linkIndex)) || again
                }
            }
        }
        if let resolvConf, ready.contains(resolvConf.fileDescriptor), resolvConf.changed() {
            again = true
        }
        return again && network != nil
    }

    /// The gateway's address as the kernel has it now; true when that is news.
    private func learn(gateway address: HardwareAddress) -> Bool {
        guard address != gatewayAddress else { return false }
        if gatewayAddress != nil { networkMoved() }
        gatewayAddress = address
        resolvingUntil = nil
        nextLook = nil
        return true
    }

    /// The link's Wi-Fi network as nl80211 has it now; true when that is news.
    private func learn(wifi now: Fact<String>) -> Bool {
        guard now != wifi else { return false }
        if wifi != nil { networkMoved() }
        wifi = now
        return true
    }

    /// The link is on another network than the one its facts were about (same path, same gateway
    /// address): what was learned of that one no longer holds, and probes still out are for it.
    private func networkMoved() {
        generation &+= 1
        answered = [:]
        running = []
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
        domainsAwaited = nil
        decision = nil
    }

    /// When the rules should look again by themselves: a gateway entry or search domains awaited.
    var nextDeadline: Instant? {
        [resolvingUntil == nil ? nil : nextLook, domainsAwaited?.until].compactMap { $0 }.min()
    }

    // MARK: Deciding

    /// A probe started under `generation` answered (`true`: as its rule expects).
    func probeAnswered(_ probe: OnDemandRule.Probe, generation: UInt64, _ expected: Bool) {
        guard generation == self.generation else { return }
        running.remove(probe)
        answered[probe] = expected
    }

    /// What the rules say for `best`'s network now; `startProbe` runs a probe they wait for
    /// (its answer to come back with the generation it is given). Returns the decision when it
    /// changed since the last one.
    func decide(for best: Path, model: NetworkModel, tunnelSearch: [String],
                startProbe: (OnDemandRule.Probe, Path, UInt64) -> Void) -> OnDemandDecision? {
        let here = Network(path: best.id, gateway: best.gateway)
        if network != here {
            let decided = decision
            forgetNetwork()
            decision = decided
            network = here
            if let seen = domainsSeen {
                if seen.network != here { domainsAwaited = (seen.list, .now() + Self.domainsWait) }
            } else if resolvConf != nil, ResolvConfWatch.writtenBeforeBoot() {
                // The file a DHCP client left at the last shutdown names the last boot's network.
                domainsAwaited = (systemSearch(tunnelSearch), .now() + Self.domainsWait)
            }
        }
        let facts = facts(for: best, on: here, model: model, tunnelSearch: tunnelSearch)
        let new = rules.evaluate(facts)
        if case .waiting(_, let wanted, _) = new {
            for case .probe(let probe) in wanted where !running.contains(probe) {
                running.insert(probe)
                startProbe(probe, best, generation)
            }
        }
        guard new != decision else { return nil }
        decision = new
        return new
    }

    private func facts(for path: Path, on network: Network, model: NetworkModel, tunnelSearch: [String]) -> NetworkFacts {
        let needs = rules.rules.map(\.match)
        var facts = NetworkFacts(path: path, probes: answered)
        facts.addresses = model.usableAddresses(on: path.linkIndex)
        if facts.addresses.isEmpty { facts.addresses = [path.source] }
        if needs.contains(where: { !$0.ssids.isEmpty }) { facts.ssid = ssid(of: path) }
        if needs.contains(where: { !$0.gatewayMACs.isEmpty }) { facts.gatewayMAC = gatewayMAC(of: path) }
        if needs.contains(where: { !$0.dnsDomains.isEmpty }) { facts.dnsDomains = searchDomains(on: network, tunnelSearch: tunnelSearch) }
        return facts
    }

    /// The search domains the network gave: resolv.conf's (as the system wrote it, without the
    /// tunnel's), once they can be told from the last network's.
    private func searchDomains(on network: Network, tunnelSearch: [String]) -> Fact<[String]> {
        let list = systemSearch(tunnelSearch)
        if let awaited = domainsAwaited {
            if list == awaited.stale {
                if let until = awaited.until, Instant.now() < until { return .pending }
                domainsAwaited?.until = nil  // waited long enough: none that tells this network from the last
                return .absent
            }
            domainsAwaited = nil
        }
        if resolvConf != nil { domainsSeen = (list, network) }
        return list.isEmpty ? .absent : .known(list)
    }

    private func systemSearch(_ tunnelSearch: [String]) -> [String] {
        ResolvConf(ResolvConfFile.systemText(at: "/etc/resolv.conf") ?? "").search.filter { !tunnelSearch.contains($0) }
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
