public import Topology
public import Basics

/// Something the runner learnt about a network for the on-demand rules: the answer to a
/// `FactRequest`, or a kernel notice that changed it.
public enum NetworkFact: Equatable, Sendable {
    /// The Wi-Fi network link `linkIndex` is associated with (nl80211); absent when it is on
    /// none or is no Wi-Fi link.
    case wifi(linkIndex: Int32, Fact<String>)
    /// The neighbour table's hardware address for `gateway` on link `linkIndex`, lowercase; nil
    /// while the table holds no usable one.
    case gateway(linkIndex: Int32, IPAddress, mac: String?)
    /// resolv.conf's search list as the system wrote it, the tunnel's own domains left out;
    /// `beforeBoot`: the file was last written before this boot.
    case searchDomains([String], beforeBoot: Bool)
    /// A probe made for the network of `generation` answered, or failed to.
    case probeAnswered(OnDemandRule.Probe, generation: UInt64, ProbeResult)
}

/// What the rules ask the runner to find out; the answer comes back as a `NetworkFact`.
public enum FactRequest: Equatable, Sendable {
    /// The Wi-Fi network of link `linkIndex`.
    case wifi(linkIndex: Int32)
    /// The gateway's hardware address; `resolve`: ask the kernel to resolve it (an ARP request
    /// or a neighbour solicitation, no IP packet) when the table holds none.
    case gateway(IPAddress, linkIndex: Int32, resolve: Bool)
    /// resolv.conf's search list.
    case searchDomains
    /// A rule's probe over `path`, outside the tunnel; its answer names `generation`.
    case probe(OnDemandRule.Probe, via: Path, generation: UInt64)
}

/// Which kernel notices the rules need followed: each fact changes with no link, address or
/// route changing (a join of another Wi-Fi network on the same lease, another router behind the
/// same gateway address, a DHCP client writing resolv.conf after its routes).
public struct FactNotices: Equatable, Sendable {
    public var wifi = false
    public var gateway = false
    public var searchDomains = false

    public init(wifi: Bool = false, gateway: Bool = false, searchDomains: Bool = false) {
        self.wifi = wifi
        self.gateway = gateway
        self.searchDomains = searchDomains
    }
}

/// The on-demand rules at work: which network the best path is on, what is known of it, what
/// is still being found out, and what the rules last decided. Pure: facts come in as
/// `NetworkFact`s, requests for them go out as `FactRequest`s, and the clock is the caller's.
///
/// A fact is kept for its network until a notice changes it; a network that turns out to be
/// another one (a gateway with another hardware address, a Wi-Fi link on another network) is
/// looked at afresh, and what was learnt of the last one, probes' answers included, no longer
/// counts.
public struct OnDemandJudge: Sendable {
    public private(set) var rules: OnDemandRules
    /// The network the facts below are about: a path and its gateway.
    public struct Network: Equatable, Sendable {
        public var path: Path.ID
        public var gateway: IPAddress?
    }
    public private(set) var network: Network?
    /// Changes whenever the network does, even on the same path: a probe's answer counts only
    /// for the network it was made on.
    public private(set) var generation: UInt64 = 0
    /// Probes that answered on it, and those still out.
    private var answered: [OnDemandRule.Probe: ProbeResult] = [:]
    private var running: Set<OnDemandRule.Probe> = []
    /// The best path as last judged, which pinned probes are made again over.
    private var path: Path?
    /// When the pinned probes that answered on this network are made again: a proof holds
    /// only while the server goes on showing its key there.
    private var recheckAt: Instant?
    /// The Wi-Fi network; nil until asked for on this network.
    private var wifi: Fact<String>?
    /// The gateway's hardware address: known, absent (none after the wait), or being resolved;
    /// nil until asked for on this network.
    private var gatewayMAC: Fact<String>?
    /// The first read of the gateway's entry is out.
    private var gatewayAsked = false
    /// While the gateway's address is resolved: until when, and when to look again.
    private var resolving: (until: Instant, next: Instant)?
    /// resolv.conf's search list as last read; nil until read on this network.
    private var search: [String]?
    private var searchAsked = false
    /// Whether resolv.conf was ever read (its first read may be the last boot's leftover).
    private var searchEverRead = false
    /// The search list last judged with, and its network.
    private var searchSeen: (list: [String], network: Network)?
    /// On another network, the list is awaited until it differs from the last network's (its
    /// DHCP client wrote it), for a while; after that, with no change, the network gave none
    /// that can be told from the last one's.
    private var searchAwaited: (stale: [String], until: Instant?)?
    /// The last decision, given to the machine only when it changes.
    public private(set) var decision: OnDemandDecision?
    /// Since when reads the runner answers at once (`awaitsAnswers`) have been out.
    private var askedAt: Instant?

    /// How long the neighbour table may take to learn the gateway's address.
    public static let resolveWait: Duration = .seconds(2)
    /// How often a missing gateway entry is looked for meanwhile.
    public static let resolveStep: Duration = .milliseconds(100)
    /// How long a new network's search domains are awaited.
    public static let domainsWait: Duration = .seconds(2)
    /// How long reads the runner answers at once may stay unanswered before what they asked
    /// counts as absent (a runner that lost one must not hold the session for ever).
    public static let answerWait: Duration = .seconds(1)
    /// How often a pinned probe is made again on the network it answered on (its last answer
    /// stands meanwhile): a proof holds only while the server goes on showing its key there.
    public static let proofRecheck: Duration = .seconds(60)

    /// Reads of the machine's own state are out (the Wi-Fi network, the neighbour table,
    /// resolv.conf), answered as soon as the runner has carried out this event's effects:
    /// until they are in, the rules say nothing, and the network they are about is not tried.
    public var awaitsAnswers: Bool {
        wifi == .pending || gatewayAsked || (searchAsked && search == nil)
    }

    public init(rules: OnDemandRules = OnDemandRules()) { self.rules = rules }

    /// Whether there are rules at all (none: always on, nothing to find out).
    public var isActive: Bool { !rules.rules.isEmpty }

    /// The notices the rules need followed, and only those.
    public var notices: FactNotices {
        let needs = rules.rules.map(\.match)
        return FactNotices(wifi: needs.contains { !$0.ssids.isEmpty }, gateway: needs.contains { !$0.gatewayMACs.isEmpty },
                           searchDomains: needs.contains { !$0.dnsDomains.isEmpty })
    }

    /// When the rules should look again by themselves: a gateway entry or search domains awaited.
    public var nextDeadline: Instant? {
        [resolving?.next, searchAwaited?.until, awaitsAnswers ? askedAt.map { $0 + Self.answerWait } : nil, recheckAt]
            .compactMap { $0 }.min()
    }

    /// New rules (a reload): everything is decided afresh.
    public mutating func use(_ rules: OnDemandRules) {
        self.rules = rules
        forgetNetwork()
    }

    /// No network now, or the machine slept: what was known and decided is forgotten, so the
    /// next network is looked at, and decided for, afresh.
    public mutating func forgetNetwork() {
        network = nil
        path = nil
        networkMoved()
        searchAwaited = nil
        search = nil
        searchAsked = false
        decision = nil
    }

    /// The link is on another network than the one its facts were about: what was learnt of
    /// that one no longer holds, and probes still out are for it.
    private mutating func networkMoved() {
        generation &+= 1
        answered = [:]
        running = []
        recheckAt = nil
        gatewayMAC = nil
        gatewayAsked = false
        wifi = nil
        resolving = nil
    }

    // MARK: Facts in

    /// Takes in a fact; true when the rules should look again.
    public mutating func learn(_ fact: NetworkFact, now: Instant) -> Bool {
        switch fact {
        case .wifi(let link, let value):
            guard let network, link == network.path.linkIndex, value != wifi else { return false }
            if let old = wifi, old != .pending { networkMoved() }
            wifi = value
            return true
        case .gateway(let link, let address, let mac):
            guard let network, link == network.path.linkIndex, address == network.gateway else { return false }
            let first = gatewayAsked
            gatewayAsked = false
            // None yet: the kernel resolves it meanwhile, and the rules wait. Once known, the
            // kernel forgetting an idle entry says nothing about the network.
            guard let mac else { return first }
            guard gatewayMAC != .known(mac) else { return first }
            if case .known = gatewayMAC { networkMoved() }
            gatewayMAC = .known(mac)
            resolving = nil
            return true
        case .searchDomains(let list, let beforeBoot):
            if !searchEverRead {
                searchEverRead = true
                // The file a DHCP client left at the last shutdown names the last boot's network.
                if beforeBoot, searchSeen == nil { searchAwaited = (list, now + Self.domainsWait) }
            }
            guard list != search else { return false }
            search = list
            return network != nil
        case .probeAnswered(let probe, let generation, let result):
            guard generation == self.generation else { return false }
            running.remove(probe)
            answered[probe] = result
            if probe.pin != nil, recheckAt == nil { recheckAt = now + Self.proofRecheck }
            return true
        }
    }

    /// A deadline of `nextDeadline` passed: the gateway's entry is looked for again, or given up
    /// on; the search domains are awaited no longer; the pinned probes are made again.
    public mutating func timerFired(now: Instant, _ asks: inout [FactRequest]) {
        if let until = searchAwaited?.until, until <= now { searchAwaited?.until = nil }
        if let due = recheckAt, due <= now {
            recheckAt = nil
            if let path {
                for probe in answered.keys.sorted(by: { $0.url < $1.url }) where probe.pin != nil && !running.contains(probe) {
                    running.insert(probe)
                    asks.append(.probe(probe, via: path, generation: generation))
                }
            }
        }
        if awaitsAnswers, let askedAt, askedAt + Self.answerWait <= now {
            // Unanswered: nothing known of them.
            if wifi == .pending { wifi = .absent }
            gatewayAsked = false
            if searchAsked, search == nil { search = [] }
        }
        guard let wait = resolving, wait.next <= now else { return }
        guard let network, let gateway = network.gateway else { return resolving = nil }
        if now >= wait.until {
            resolving = nil
            gatewayMAC = .absent
        } else {
            resolving = (wait.until, min(wait.until, now + Self.resolveStep))
            asks.append(.gateway(gateway, linkIndex: network.path.linkIndex, resolve: false))
        }
    }

    // MARK: Deciding

    /// What the rules say for `best`'s network now (nil: no path), asking in `asks` for what
    /// they wait for; returns the decision when it changed since the last one.
    public mutating func judge(_ best: Path?, in model: NetworkModel, now: Instant,
                               _ asks: inout [FactRequest]) -> OnDemandDecision? {
        guard isActive else { return nil }
        guard let best else {
            forgetNetwork()
            return nil
        }
        let here = Network(path: best.id, gateway: best.gateway)
        if network != here {
            let decided = decision
            let seen = searchSeen
            forgetNetwork()
            decision = decided
            network = here
            if let seen, seen.network != here { searchAwaited = (seen.list, now + Self.domainsWait) }
        }
        path = best
        var facts = NetworkFacts(path: best, probes: answered)
        facts.addresses = model.usableAddresses(on: best.linkIndex)
        if facts.addresses.isEmpty { facts.addresses = [best.source] }
        let wants = notices
        if wants.wifi { facts.ssid = wifiFact(best, &asks) }
        if wants.gateway { facts.gatewayMAC = gatewayFact(best, now, &asks) }
        if wants.searchDomains { facts.dnsDomains = searchFact(here, now, &asks) }
        if awaitsAnswers {
            if asks.isEmpty == false { askedAt = now }
            return nil
        }
        let new = rules.evaluate(facts)
        if case .waiting(_, let wanted, _) = new {
            for case .probe(let probe) in wanted where !running.contains(probe) {
                running.insert(probe)
                asks.append(.probe(probe, via: best, generation: generation))
            }
        }
        guard new != decision else { return nil }
        decision = new
        return new
    }

    private mutating func wifiFact(_ path: Path, _ asks: inout [FactRequest]) -> Fact<String> {
        if let wifi { return wifi }
        wifi = .pending
        asks.append(.wifi(linkIndex: path.linkIndex))
        return .pending
    }

    /// The gateway's entry in the neighbour table; while it is missing, the kernel is asked to
    /// resolve it and the rules wait a while. Once known, it is kept for the network.
    private mutating func gatewayFact(_ path: Path, _ now: Instant, _ asks: inout [FactRequest]) -> Fact<String> {
        guard let gateway = path.gateway else { return .absent }
        if let gatewayMAC { return gatewayMAC }
        gatewayMAC = .pending
        gatewayAsked = true
        resolving = (now + Self.resolveWait, now + Self.resolveStep)
        asks.append(.gateway(gateway, linkIndex: path.linkIndex, resolve: true))
        return .pending
    }

    /// The search domains the network gave, once they can be told from the last network's.
    private mutating func searchFact(_ network: Network, _ now: Instant, _ asks: inout [FactRequest]) -> Fact<[String]> {
        guard let list = search else {
            if !searchAsked {
                searchAsked = true
                asks.append(.searchDomains)
            }
            return .pending
        }
        if let awaited = searchAwaited {
            if list == awaited.stale {
                if let until = awaited.until, now < until { return .pending }
                searchAwaited?.until = nil  // waited long enough: none that tells this network from the last
                return .absent
            }
            searchAwaited = nil
        }
        searchSeen = (list, network)
        return list.isEmpty ? .absent : .known(list)
    }
}
