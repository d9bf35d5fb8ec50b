import Topology
import Logging
import Basics
import PathMonitor
import Reconnector
import SystemDNS
import Netlink

/// Finds out what the on-demand rules ask about a network (`FactRequest`), and follows the
/// kernel notices that change it: the Wi-Fi network's name (nl80211), the default gateway's
/// hardware address (the neighbour table), the search domains the network gave (resolv.conf as
/// it was before the tunnel's). The rules decide in the core; this only reads. Probes are the
/// daemon's, which makes them as it makes connectivity checks.
///
/// Owned by the deciding thread.
final class FactFinder {
    private let netlink: NetlinkSocket?
    private let log: Logger
    /// Kernel notices of the neighbour table, Wi-Fi associations and resolv.conf, while the
    /// rules need them.
    private var neighbourEvents: NeighbourEvents?
    private var wirelessEvents: WirelessEvents?
    private var resolvConf: ResolvConfWatch?
    /// The Wi-Fi network a link was on when last read, for the status: it asks on every event a
    /// watcher hears, the kernel is asked again only after the links or the associations changed.
    private var wifiName: (linkIndex: Int32, name: Fact<String>)?

    init(log: Logger) {
        self.log = log
        netlink = try? NetlinkSocket()
    }

    /// Follows the notices the rules need, and only those.
    func follow(_ notices: FactNotices) {
        neighbourEvents = subscribe(notices.gateway, neighbourEvents, "the neighbour table",
                                    "a gateway's address") { () throws(NetlinkError) in try NeighbourEvents() }
        wirelessEvents = subscribe(notices.wifi, wirelessEvents, "Wi-Fi associations",
                                   "the Wi-Fi network") { () throws(NetlinkError) in try WirelessEvents() }
        resolvConf = subscribe(notices.searchDomains, resolvConf, "resolv.conf",
                               "search domains") { () throws(SystemError) in try ResolvConfWatch() }
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

    /// Reads what `request` asks now (a probe is not read here: nil).
    func read(_ request: FactRequest, tunnelSearch: [String]) -> NetworkFact? {
        switch request {
        case .wifi(let index):
            return .wifi(linkIndex: index, ssid(of: index))
        case .gateway(let gateway, let index, let resolve):
            let mac = try? netlink?.neighbour(of: gateway, linkIndex: index)?.usableHardwareAddress
            if mac == nil, resolve { try? netlink?.resolve(gateway, linkIndex: index) }
            return .gateway(linkIndex: index, gateway, mac: mac?.description)
        case .searchDomains:
            // The file a DHCP client left at the last shutdown names the last boot's network.
            return .searchDomains(systemSearch(tunnelSearch), beforeBoot: resolvConf != nil && ResolvConfWatch.writtenBeforeBoot())
        case .probe:
            return nil
        }
    }

    /// Reads the notices on the `ready` sockets: what changed about `network` (the one the rules
    /// look at).
    func noticesArrived(ready: [Int32], about network: OnDemandJudge.Network?, tunnelSearch: [String]) -> [NetworkFact] {
        var found: [NetworkFact] = []
        if let events = neighbourEvents, ready.contains(events.fileDescriptor) {
            for notice in events.take() {
                guard let network, let gateway = network.gateway else { continue }
                let link = network.path.linkIndex
                switch notice {
                case .entry(let entry):
                    guard entry.linkIndex == link, entry.address == gateway, let mac = entry.usableHardwareAddress else { continue }
                    found.append(.gateway(linkIndex: link, gateway, mac: mac.description))
                case .lost:
                    // Whatever was missed, the table holds the outcome.
                    guard let fact = read(.gateway(gateway, linkIndex: link, resolve: false), tunnelSearch: tunnelSearch),
                          case .gateway(_, _, _?) = fact else { continue }
                    found.append(fact)
                }
            }
        }
        if let events = wirelessEvents, ready.contains(events.fileDescriptor) {
            wifiName = nil
            for notice in events.take() {
                guard let network else { break }
                let link = network.path.linkIndex
                switch notice {
                case .association(let index) where index != link: continue
                case .association, .appeared, .lost: found.append(.wifi(linkIndex: link, ssid(of: link)))
                }
            }
        }
        if let resolvConf, ready.contains(resolvConf.fileDescriptor), resolvConf.changed() {
            found.append(.searchDomains(systemSearch(tunnelSearch), beforeBoot: false))
        }
        return found
    }

    private func systemSearch(_ tunnelSearch: [String]) -> [String] {
        ResolvConf(ResolvConfFile.systemText(at: "/etc/resolv.conf") ?? "").search.filter { !tunnelSearch.contains($0) }
    }

    private func ssid(of linkIndex: Int32) -> Fact<String> {
        let name: Fact<String> = switch Wireless.ssid(ofInterface: linkIndex) {
        case .ssid(let ssid): .known(ssid.description)
        case .notAssociated, .notWireless, .failed: .absent
        }
        wifiName = (linkIndex, name)
        return name
    }

    /// The name of the Wi-Fi network link `index` is on, for the status; nil when it is on none.
    /// Read from the kernel once per change (`linksChanged`, an association's notice).
    func wifiName(of index: Int32) -> String? {
        let name = if let known = wifiName, known.linkIndex == index { known.name } else { ssid(of: index) }
        if case .known(let ssid) = name { return ssid }
        return nil
    }

    /// The kernel told of a change to the links (a Wi-Fi link that joins another network loses
    /// its carrier first): the Wi-Fi network's name is read again when next asked.
    func linksChanged() { wifiName = nil }
}
