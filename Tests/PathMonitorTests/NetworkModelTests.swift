import Topology
import Testing
import Basics
@testable import PathMonitor
import Netlink

private let server = IPAddress("198.51.100.7")!
private let server6 = IPAddress("2001:db8::7")!

private func prefix(_ text: String) -> Prefix { Prefix(text)! }

/// A laptop with Wi-Fi (metric 600) and Ethernet (metric 100), both with IPv4 defaults.
private func laptop() -> NetworkModel {
    var m = NetworkModel(tunnelInterface: "roam0")
    m.apply(.linkChanged(Link(index: 2, name: "wifi0", kind: .wifi)))
    m.apply(.linkChanged(Link(index: 3, name: "eth0", kind: .ethernet)))
    m.apply(.addressAdded(Address(linkIndex: 2, prefix: prefix("192.168.1.23/24"))))
    m.apply(.addressAdded(Address(linkIndex: 3, prefix: prefix("10.20.0.57/24"))))
    m.apply(.routeAdded(Route(destination: .any(.v4), nextHops: [NextHop(gateway: IPAddress("192.168.1.1"), linkIndex: 2)], metric: 600)))
    m.apply(.routeAdded(Route(destination: .any(.v4), nextHops: [NextHop(gateway: IPAddress("10.20.0.1"), linkIndex: 3)], metric: 100)))
    return m
}

@Test func lowestMetricRanksFirst() {
    let paths = laptop().paths(to: server)
    #expect(paths.map(\.interface) == ["eth0", "wifi0"])
    #expect(paths[0].source == IPAddress("10.20.0.57"))
    #expect(paths[0].gateway == IPAddress("10.20.0.1"))
    #expect(paths[1].metric == 600)
}

@Test func longestPrefixBeatsMetric() {
    var m = laptop()
    m.apply(.routeAdded(Route(destination: prefix("198.51.100.0/24"), nextHops: [NextHop(gateway: IPAddress("192.168.1.1"), linkIndex: 2)], metric: 900)))
    #expect(m.paths(to: server).map(\.interface) == ["wifi0", "eth0"])
    // A more specific route that does not cover the server changes nothing.
    m.apply(.routeAdded(Route(destination: prefix("198.51.101.0/24"), nextHops: [NextHop(linkIndex: 3)], metric: 0)))
    #expect(m.paths(to: server).first?.prefixLength == 24)
}

/// A prefix holds another when the other lies wholly inside it: same family, no shorter.
@Test func aPrefixHoldsOnlyWhatLiesWhollyInsideIt() {
    #expect(prefix("10.0.0.0/8").contains(prefix("10.20.0.0/24")) && prefix("10.0.0.0/8").contains(prefix("10.0.0.0/8")))
    #expect(!prefix("10.20.0.0/24").contains(prefix("10.0.0.0/8")), "a wider prefix is not inside a narrower one")
    #expect(!prefix("10.0.0.0/8").contains(prefix("11.0.0.0/24")))
    #expect(!prefix("0.0.0.0/0").contains(prefix("fd00::/64")) && prefix("fc00::/7").contains(prefix("fd00:20::/64")))
}

@Test func carrierLossAndAdminDownRemovePaths() {
    var m = laptop()
    m.apply(.linkChanged(Link(index: 3, name: "eth0", kind: .ethernet, hasCarrier: false)))
    #expect(m.paths(to: server).map(\.interface) == ["wifi0"])
    // Carrier back: the routes were kept, so the path returns.
    m.apply(.linkChanged(Link(index: 3, name: "eth0", kind: .ethernet)))
    #expect(m.paths(to: server).map(\.interface) == ["eth0", "wifi0"])
    // Admin down flushes IPv4 routes, as the kernel does without telling; up alone brings none back.
    m.apply(.linkChanged(Link(index: 3, name: "eth0", kind: .ethernet, isUp: false)))
    m.apply(.linkChanged(Link(index: 3, name: "eth0", kind: .ethernet)))
    #expect(m.paths(to: server).map(\.interface) == ["wifi0"])
    #expect(!m.routes.values.contains { $0.nextHops.contains { $0.linkIndex == 3 } })
}

@Test func tunnelLoopbackAndTunnelKindAreNeverPaths() {
    var m = laptop()
    m.apply(.linkChanged(Link(index: 9, name: "roam0", kind: .other)))
    m.apply(.addressAdded(Address(linkIndex: 9, prefix: prefix("100.64.0.2/32"))))
    m.apply(.routeAdded(Route(destination: prefix("0.0.0.0/1"), nextHops: [NextHop(linkIndex: 9)], metric: 0)))
    m.apply(.linkChanged(Link(index: 10, name: "wg0", kind: .tunnel)))
    m.apply(.addressAdded(Address(linkIndex: 10, prefix: prefix("100.65.0.2/32"))))
    m.apply(.routeAdded(Route(destination: prefix("198.51.100.7/32"), nextHops: [NextHop(linkIndex: 10)])))
    m.apply(.linkChanged(Link(index: 1, name: "lo", kind: .loopback)))
    m.apply(.addressAdded(Address(linkIndex: 1, prefix: prefix("127.0.0.1/8"))))
    m.apply(.routeAdded(Route(destination: prefix("198.51.100.0/24"), nextHops: [NextHop(linkIndex: 1)])))
    #expect(m.paths(to: server).map(\.interface) == ["eth0", "wifi0"])
}

@Test func rejectRoutesAndOtherTablesAreIgnored() {
    var m = laptop()
    m.apply(.routeAdded(Route(destination: prefix("198.51.100.7/32"), type: .reject, nextHops: [NextHop(linkIndex: 2)])))
    m.apply(.routeAdded(Route(table: 51820, destination: .any(.v4), nextHops: [NextHop(linkIndex: 2)])))
    #expect(m.paths(to: server).map(\.prefixLength) == [0, 0])
}

@Test func sourceSelectionPrefersRouteSourceThenStableAddresses() {
    var m = laptop()
    m.apply(.addressAdded(Address(linkIndex: 3, prefix: prefix("10.20.0.99/24"), flags: .secondary)))
    #expect(m.paths(to: server).first?.source == IPAddress("10.20.0.57"))
    m.apply(.routeAdded(Route(destination: .any(.v4), nextHops: [NextHop(gateway: IPAddress("10.20.0.1"), linkIndex: 3)],
                              metric: 100, preferredSource: IPAddress("10.20.0.99"))))
    #expect(m.paths(to: server).first?.source == IPAddress("10.20.0.99"))
}

@Test func ipv6SkipsTentativeLinkLocalAndPrefersStableOverTemporary() {
    var m = NetworkModel()
    m.apply(.linkChanged(Link(index: 2, name: "wifi0", kind: .wifi)))
    m.apply(.addressAdded(Address(linkIndex: 2, prefix: prefix("fe80::1c2:3ff:fe44:5566/64"), flags: .permanent)))
    m.apply(.routeAdded(Route(destination: .any(.v6), nextHops: [NextHop(gateway: IPAddress("fe80::1"), linkIndex: 2)], metric: 600)))
    #expect(m.paths(to: server6).isEmpty, "link-local alone cannot reach the server")
    m.apply(.addressAdded(Address(linkIndex: 2, prefix: prefix("2001:db8:1::50/64"), flags: .tentative)))
    #expect(m.paths(to: server6).isEmpty, "a tentative address cannot be used before DAD completes")
    m.apply(.addressAdded(Address(linkIndex: 2, prefix: prefix("2001:db8:1::77/64"), flags: .temporary)))
    #expect(m.paths(to: server6).first?.source == IPAddress("2001:db8:1::77"))
    m.apply(.addressAdded(Address(linkIndex: 2, prefix: prefix("2001:db8:1::50/64"))))
    #expect(m.paths(to: server6).first?.source == IPAddress("2001:db8:1::50"))
    #expect(m.paths(to: server).isEmpty, "no IPv4 route")
}

@Test func multipathGivesOnePathPerLink() {
    var m = laptop()
    m.apply(.routeAdded(Route(destination: prefix("198.51.100.0/24"), nextHops: [
        NextHop(gateway: IPAddress("10.20.0.1"), linkIndex: 3), NextHop(gateway: IPAddress("192.168.1.1"), linkIndex: 2),
    ], metric: 50)))
    let paths = m.paths(to: server)
    #expect(paths.map(\.interface) == ["wifi0", "eth0"] || paths.map(\.interface) == ["eth0", "wifi0"])
    #expect(paths.allSatisfy { $0.prefixLength == 24 })
    // Losing one link keeps the route through the other.
    m.apply(.linkChanged(Link(index: 3, name: "eth0", kind: .ethernet, isUp: false)))
    #expect(m.paths(to: server).map(\.interface) == ["wifi0"])
    #expect(m.paths(to: server).first?.prefixLength == 24)
}

@Test func removingTheLastAddressFlushesTheLinksRoutes() {
    var m = laptop()
    m.apply(.addressRemoved(Address.Key(linkIndex: 3, prefix: prefix("10.20.0.57/24"))))
    #expect(m.paths(to: server).map(\.interface) == ["wifi0"])
    #expect(m.routes.count == 1)
}

@Test func removingALinkRemovesItsAddressesAndRoutes() {
    var m = laptop()
    let result1 = m.apply(.linkRemoved(index: 3))
    #expect(result1)
    let result2 = m.apply(.linkRemoved(index: 3))
    #expect(!result2, "removing twice changes nothing")
    #expect(m.addresses.count == 1 && m.routes.count == 1)
}

@Test func duplicateNotificationsChangeNothing() {
    var m = laptop()
    let result3 = m.apply(.linkChanged(Link(index: 2, name: "wifi0", kind: .wifi)))
    #expect(!result3)
    let result4 = m.apply(.addressAdded(Address(linkIndex: 2, prefix: prefix("192.168.1.23/24"))))
    #expect(!result4)
    let result5 = m.apply(.routeRemoved(Route.Key(table: 254, destination: prefix("203.0.113.0/24"), metric: 0)))
    #expect(!result5)
}

@Test func unrelatedChurnIsNotSignificant() {
    var tracker = PathTracker(model: laptop(), endpoint: server)
    let churn: [NetworkChange] = [
        .linkChanged(Link(index: 20, name: "docker0", kind: .virtual)),
        .addressAdded(Address(linkIndex: 20, prefix: prefix("172.17.0.1/16"))),
        .routeAdded(Route(destination: prefix("172.17.0.0/16"), nextHops: [NextHop(linkIndex: 20)], preferredSource: IPAddress("172.17.0.1"))),
        .linkChanged(Link(index: 21, name: "veth1a2b", kind: .virtual)),
        .linkRemoved(index: 21),
        .addressAdded(Address(linkIndex: 2, prefix: prefix("2001:db8:1::99/64"), flags: .temporary)),
        .addressAdded(Address(linkIndex: 2, prefix: prefix("192.168.1.23/24"))),
        // A metric change that keeps the order is not worth a reconnect.
        .routeAdded(Route(destination: .any(.v4), nextHops: [NextHop(gateway: IPAddress("192.168.1.1"), linkIndex: 2)], metric: 600)),
    ]
    for change in churn { #expect(tracker.apply(change) == nil, "\(change)") }
    // Losing the preferred uplink is significant.
    let after = tracker.apply(.linkChanged(Link(index: 3, name: "eth0", kind: .ethernet, hasCarrier: false)))
    #expect(after?.map(\.interface) == ["wifi0"])
}

/// A dual-stack server is reached over whichever family the uplinks carry: another of its
/// addresses is offered only while no uplink reaches the current one.
@Test func aDualStackServerIsReachedOverTheFamilyTheUplinksCarry() throws {
    let v6 = try #require(IPAddress("2001:db8:ffff::7")), v4 = try #require(IPAddress("198.51.100.7"))
    var m = NetworkModel()
    m.apply(.linkChanged(Link(index: 2, name: "wifi0", kind: .wifi)))
    m.apply(.addressAdded(Address(linkIndex: 2, prefix: prefix("192.168.1.23/24"))))
    m.apply(.routeAdded(Route(destination: .any(.v4), nextHops: [NextHop(gateway: IPAddress("192.168.1.1"), linkIndex: 2)], metric: 600)))
    // An IPv4-only network: the IPv4 address is the one to start with, whatever the order.
    #expect(PathTracker.preferred([v6, v4], in: m) == v4)
    #expect(PathTracker.preferred([v6], in: m) == v6)
    #expect(PathTracker.preferred([], in: m) == nil)
    var tracker = PathTracker(model: m, endpoint: v6)
    #expect(tracker.paths.isEmpty)
    #expect(tracker.reachableAlternative == nil, "the server's other addresses are not known yet")
    tracker.learn(serverAddresses: [v4, v6, v4])
    #expect(tracker.serverAddresses == [v6, v4])
    #expect(tracker.reachableAlternative == v4)
    #expect(tracker.retarget(to: v4)?.map(\.interface) == ["wifi0"])
    #expect(tracker.serverAddresses == [v4, v6])
    // Reachable again: staying is right, whatever else the server has.
    #expect(tracker.reachableAlternative == nil)
    // The Wi-Fi goes: no address of the server is reachable, and none is offered.
    #expect(tracker.apply(.linkChanged(Link(index: 2, name: "wifi0", kind: .wifi, hasCarrier: false))) == [])
    #expect(tracker.reachableAlternative == nil)
}

@Test func addressParsingAndFormatting() {
    #expect(IPAddress("10.0.0.1") == .v4(0x0A00_0001))
    #expect(IPAddress("2001:db8::7")?.description == "2001:db8::7")
    #expect(IPAddress("300.1.1.1") == nil)
    #expect(IPAddress("eth0") == nil)
    #expect(IPAddress(bytes: [192, 168, 1, 1])?.description == "192.168.1.1")
    #expect(IPAddress(bytes: [1, 2, 3]) == nil)
    #expect(Prefix("10.0.0.0/33") == nil)
    #expect(Prefix("10.0.0.0/8")!.contains(IPAddress("10.255.1.1")!))
    #expect(!Prefix("10.0.0.0/8")!.contains(IPAddress("11.0.0.1")!))
    #expect(Prefix("2001:db8::/32")!.contains(IPAddress("2001:db8:ffff::1")!))
    #expect(Prefix("2001:db8::1/128")!.contains(IPAddress("2001:db8::1")!))
    #expect(!Prefix("2001:db8::1/127")!.contains(IPAddress("2001:db8::2")!))
    #expect(Prefix("default")!.contains(IPAddress("8.8.8.8")!))
    #expect(!Prefix("default")!.contains(IPAddress("::1")!))
}

@Test func changesToMatchReachTheOtherModelExactly() {
    let old = laptop()
    var new = laptop()
    new.apply(.linkChanged(Link(index: 3, name: "eth0", kind: .ethernet, hasCarrier: false)))
    new.apply(.addressRemoved(Address.Key(linkIndex: 2, prefix: prefix("192.168.1.23/24"))))
    new.apply(.addressAdded(Address(linkIndex: 2, prefix: prefix("192.168.1.80/24"))))
    new.apply(.routeAdded(Route(destination: .any(.v4), nextHops: [NextHop(gateway: IPAddress("192.168.1.1"), linkIndex: 2)], metric: 600)))
    new.apply(.linkChanged(Link(index: 7, name: "wwan0", kind: .wwan)))
    var reconciled = old
    let diff = old.changes(toMatch: new)
    for change in diff { reconciled.apply(change) }
    #expect(reconciled == new)
    #expect(diff.count <= 6)
    #expect(old.changes(toMatch: old).isEmpty)
}

@Test func staleRouteThroughADownedLinkIsRefused() {
    var m = laptop()
    m.apply(.linkChanged(Link(index: 3, name: "eth0", kind: .ethernet, isUp: false)))
    let route = Route(destination: prefix("10.99.0.0/16"), nextHops: [NextHop(gateway: IPAddress("10.20.0.1"), linkIndex: 3)])
    let result = m.apply(.routeAdded(route))
    #expect(!result)
    #expect(m.routes[route.key] == nil)
}

/// "TunnelVision": a hostile network pushes halves of the address space via its gateway.
@Test func routesAroundAFullTunnelAreFound() {
    var m = laptop()
    #expect(m.routesAroundTheTunnel.isEmpty, "defaults and on-link subnets are not")
    m.apply(.linkChanged(Link(index: 9, name: "roam0", kind: .tunnel)))
    m.apply(.routeAdded(Route(destination: prefix("10.77.0.0/24"), nextHops: [NextHop(gateway: IPAddress("10.77.0.1"), linkIndex: 9)])))
    m.apply(.routeAdded(Route(destination: prefix("172.16.0.0/12"), nextHops: [NextHop(linkIndex: 2)])))
    #expect(m.routesAroundTheTunnel.isEmpty, "the tunnel's own routes and on-link routes are not")
    m.apply(.routeAdded(Route(destination: prefix("0.0.0.0/1"), nextHops: [NextHop(gateway: IPAddress("192.168.1.1"), linkIndex: 2)])))
    m.apply(.routeAdded(Route(destination: prefix("128.0.0.0/1"), nextHops: [NextHop(gateway: IPAddress("192.168.1.1"), linkIndex: 2)])))
    #expect(m.routesAroundTheTunnel.map(\.description) == ["0.0.0.0/1 via 192.168.1.1 dev wifi0", "128.0.0.0/1 via 192.168.1.1 dev wifi0"])
    #expect(m.localNetworks == [prefix("10.20.0.0/24"), prefix("192.168.1.0/24")])
}

/// A rogue network's DHCP mask `128.0.0.0` makes the kernel add `0.0.0.0/1` on the link, with
/// no gateway: it takes half the internet around the tunnel just the same. A LAN's subnet,
/// however wide inside a private range, is not reported; one that overlaps the tunnel's routes is.
@Test func onLinkRoutesWiderThanALANAreFound() {
    var m = laptop()
    m.apply(.linkChanged(Link(index: 9, name: "roam0", kind: .tunnel)))
    m.apply(.routeAdded(Route(destination: prefix("10.77.0.0/24"), nextHops: [NextHop(linkIndex: 9)])))
    for sane in ["10.0.0.0/8", "192.168.0.0/16", "100.64.0.0/16", "2001:db8:1::/64", "fe80::/10"] {
        m.apply(.routeAdded(Route(destination: prefix(sane), nextHops: [NextHop(linkIndex: 2)])))
    }
    #expect(m.routesAroundTheTunnel.isEmpty, "\(m.routesAroundTheTunnel)")
    m.apply(.routeAdded(Route(destination: prefix("0.0.0.0/1"), nextHops: [NextHop(linkIndex: 2)])))
    m.apply(.routeAdded(Route(destination: prefix("2001:db8::/32"), nextHops: [NextHop(linkIndex: 2)])))
    m.apply(.routeAdded(Route(destination: prefix("10.77.0.128/25"), nextHops: [NextHop(linkIndex: 2)])))
    #expect(m.routesAroundTheTunnel.map(\.description) == ["0.0.0.0/1 dev wifi0", "10.77.0.128/25 dev wifi0", "2001:db8::/32 dev wifi0"])
    #expect(NetworkModel.isWiderThanALAN(prefix("128.0.0.0/1")) && NetworkModel.isWiderThanALAN(prefix("172.0.0.0/8")))
    #expect(!NetworkModel.isWiderThanALAN(prefix("172.16.0.0/12")) && !NetworkModel.isWiderThanALAN(prefix("8.8.8.0/24")))
    #expect(NetworkModel.isWiderThanALAN(prefix("fd00::/48")) && !NetworkModel.isWiderThanALAN(prefix("fd00::/64")))

    // A carrier-grade NAT LAN the operator lists for allow-lan is a LAN's, however wide; one
    // that overlaps the tunnel's routes is still reported.
    m.apply(.routeAdded(Route(destination: prefix("100.64.0.0/10"), nextHops: [NextHop(linkIndex: 2)])))
    #expect(m.routesAroundTheTunnel.map(\.description).contains("100.64.0.0/10 dev wifi0"))
    #expect(m.routesAroundTheTunnel(localRanges: [prefix("100.64.0.0/10")]).map(\.description)
            == ["0.0.0.0/1 dev wifi0", "10.77.0.128/25 dev wifi0", "2001:db8::/32 dev wifi0"])
}

/// The local networks are kept as changes arrive, not worked out from scratch: after every one
/// of a seeded random run of links coming, going, being renamed into the tunnel, and addresses
/// sharing subnets, turning tentative or link-local, they equal what every address says.
@Test func localNetworksFollowEveryChange() {
    var rng = SeededRandom(seed: 7)
    func pick(_ n: Int) -> Int { Int(rng.next() % UInt64(n)) }
    let names = ["wifi0", "eth0", "roam0", "lo"]
    let kinds: [LinkKind] = [.wifi, .ethernet, .tunnel, .loopback, .virtual]
    let subnets = ["192.168.1.", "10.20.0.", "fe80::", "2001:db8:1::"]
    var m = NetworkModel(tunnelInterface: "roam0")
    var renamed = 0
    for step in 0..<4000 {
        let index = Int32(2 + pick(4))
        switch pick(6) {
        case 0:
            m.apply(.linkChanged(Link(index: index, name: names[pick(names.count)], kind: kinds[pick(kinds.count)])))
        case 1:
            m.apply(.linkRemoved(index: index))
        case 2, 3:
            let subnet = subnets[pick(subnets.count)]
            let length = subnet.contains(":") ? [64, 48][pick(2)] : [24, 16][pick(2)]
            let flags: AddressFlags = pick(4) == 0 ? [.tentative] : []
            m.apply(.addressAdded(Address(linkIndex: index, prefix: prefix("\(subnet)\(1 + pick(3))/\(length)"), flags: flags)))
        case 4:
            if let key = m.addresses.keys.sorted(by: { "\($0)" < "\($1)" }).first(where: { $0.linkIndex == index }) {
                m.apply(.addressRemoved(key))
            }
        default:
            m.tunnelInterface = pick(2) == 0 ? "roam0" : "wifi0"
            renamed += 1
        }
        var expected = Set<Prefix>()
        for address in m.addresses.values where address.isUsable {
            guard let link = m.links[address.linkIndex], link.kind != .loopback, link.kind != .tunnel,
                  link.name != m.tunnelInterface else { continue }
            expected.insert(NetworkModel.localClaim(address.prefix))
        }
        #expect(Set(m.localNetworks) == expected, "step \(step)")
        #expect(m.localNetworks.count == expected.count, "each prefix once, step \(step)")
        #expect(zip(m.localNetworks, m.localNetworks.dropFirst()).allSatisfy { ($0.address, $0.length) < ($1.address, $1.length) },
                "in address order, step \(step)")
        if Set(m.localNetworks) != expected { break }
    }
    #expect(renamed > 100)
}

/// A network decides its mask: what it claims wider than a LAN (an IPv4 /16, an IPv6 /64) counts
/// as local only around the machine's own address, and is reported; a LAN's own subnet as it is.
@Test func aNetworkThatClaimsMoreThanALANGetsOnlyTheLANAroundTheLaptop() {
    var m = laptop()
    let before = m.localNetworks
    #expect(m.widerClaims.isEmpty)
    m.apply(.addressAdded(Address(linkIndex: 3, prefix: prefix("10.99.0.5/8"))))
    m.apply(.addressAdded(Address(linkIndex: 3, prefix: prefix("2001:db8:5:6::9/32"))))
    m.apply(.addressAdded(Address(linkIndex: 3, prefix: prefix("172.20.3.4/20"))))
    #expect(Set(m.localNetworks) == Set(before + [prefix("10.99.0.0/16"), prefix("2001:db8:5:6::/64"), prefix("172.20.0.0/20")]))
    #expect(m.widerClaims == [prefix("10.0.0.0/8"), prefix("2001:db8::/32")])
    // A /1 claims half the internet: the /16 around the address is all it gets (allow-lan then
    // opens none of it: not private).
    m.apply(.addressAdded(Address(linkIndex: 3, prefix: prefix("100.64.7.7/1"))))
    #expect(m.localNetworks.contains(prefix("100.64.0.0/16")) && !m.localNetworks.contains { $0.length < 16 && $0.address.family == .v4 })
    #expect(m.widerClaims.contains(prefix("0.0.0.0/1")))
    m.apply(.addressRemoved(Address.Key(linkIndex: 3, prefix: prefix("10.99.0.5/8"))))
    #expect(!m.localNetworks.contains(prefix("10.99.0.0/16")) && !m.widerClaims.contains(prefix("10.0.0.0/8")))
}

/// Containers' and VMs' bridges: a bridge with only virtual ports, no default route, private
/// subnets; a bridge that holds a physical port, carries the default route or a public subnet
/// is a LAN or an uplink, never a guest network.
@Test func guestNetworksAreBridgesWithVirtualPortsOnly() {
    var m = laptop()
    m.apply(.linkChanged(Link(index: 10, name: "docker0", kind: .virtual, isBridge: true)))
    m.apply(.addressAdded(Address(linkIndex: 10, prefix: prefix("172.17.0.1/16"))))
    m.apply(.linkChanged(Link(index: 11, name: "veth1a2b", kind: .virtual, master: 10, infoKind: "veth")))
    m.apply(.linkChanged(Link(index: 12, name: "virbr0", kind: .virtual, isBridge: true)))
    m.apply(.addressAdded(Address(linkIndex: 12, prefix: prefix("192.168.122.1/24"))))
    m.apply(.linkChanged(Link(index: 13, name: "vnet0", kind: .tunnel, master: 12, infoKind: "tun", isVirtualMachinesTap: true)))
    #expect(m.guestNetworks == [GuestNetwork(interface: "docker0", subnets: [prefix("172.17.0.0/16")]),
                                GuestNetwork(interface: "virbr0", subnets: [prefix("192.168.122.0/24")])])
    // A VPN's TAP bridged in (OpenVPN's, tinc's: no virtio header) is another site's LAN, alone or beside a VM.
    m.apply(.linkChanged(Link(index: 15, name: "br-site", kind: .virtual, isBridge: true)))
    m.apply(.addressAdded(Address(linkIndex: 15, prefix: prefix("10.8.0.1/24"))))
    m.apply(.linkChanged(Link(index: 16, name: "tap0", kind: .tunnel, master: 15, infoKind: "tun")))
    #expect(m.guestNetworks.map(\.interface) == ["docker0", "virbr0"])
    m.apply(.linkChanged(Link(index: 16, name: "tap0", kind: .tunnel, master: 12, infoKind: "tun")))
    #expect(m.guestNetworks.map(\.interface) == ["br-site", "docker0"])
    m.apply(.linkRemoved(index: 16))
    m.apply(.linkRemoved(index: 15))
    // An overlay bridged in (another site's layer 2), then a physical port (the LAN itself).
    m.apply(.linkChanged(Link(index: 14, name: "vxlan0", kind: .virtual, master: 12, infoKind: "vxlan")))
    #expect(m.guestNetworks.map(\.interface) == ["docker0"])
    m.apply(.linkRemoved(index: 14))
    #expect(m.guestNetworks.count == 2)
    m.apply(.linkChanged(Link(index: 3, name: "eth0", kind: .ethernet, master: 12)))
    #expect(m.guestNetworks.map(\.interface) == ["docker0"])
    // A default route through it: an uplink.
    m.apply(.routeAdded(Route(destination: .any(.v4), nextHops: [NextHop(gateway: IPAddress("172.17.0.254"), linkIndex: 10)], metric: 700)))
    #expect(m.guestNetworks.isEmpty)
    m.apply(.routeRemoved(Route(destination: .any(.v4), nextHops: [NextHop(gateway: IPAddress("172.17.0.254"), linkIndex: 10)], metric: 700).key))
    // A public subnet, down, no address: none of them.
    m.apply(.addressAdded(Address(linkIndex: 10, prefix: prefix("198.51.100.1/24"))))
    #expect(m.guestNetworks.isEmpty)
    m.apply(.addressRemoved(Address.Key(linkIndex: 10, prefix: prefix("198.51.100.1/24"))))
    #expect(m.guestNetworks.map(\.interface) == ["docker0"])
    m.apply(.linkChanged(Link(index: 10, name: "docker0", kind: .virtual, isUp: false, isBridge: true)))
    #expect(m.guestNetworks.isEmpty)
}

/// Another VPN's routes that meet what the tunnel carries are found in any table; the agent's
/// own tunnel and routes through uplinks are not another tunnel's.
@Test func otherTunnelsRoutesThatMeetTheTunnelsAreFound() {
    var m = laptop()
    m.apply(.linkChanged(Link(index: 20, name: "roam0", kind: .tunnel)))
    m.apply(.linkChanged(Link(index: 21, name: "tailscale0", kind: .tunnel)))
    m.apply(.routeAdded(Route(table: 51820, destination: .any(.v4), nextHops: [NextHop(linkIndex: 20)])))
    m.apply(.routeAdded(Route(table: 52, destination: prefix("100.64.0.0/10"), nextHops: [NextHop(linkIndex: 21)])))
    m.apply(.routeAdded(Route(destination: prefix("10.50.0.0/16"), nextHops: [NextHop(linkIndex: 21)])))
    let everything = [Prefix.any(.v4), .any(.v6)]
    #expect(m.otherTunnels(meeting: everything).map(\.description) == ["10.50.0.0/16 dev tailscale0", "100.64.0.0/10 dev tailscale0 table 52"])
    // Split mode: only what meets its prefixes, either way round.
    #expect(m.otherTunnels(meeting: [prefix("10.0.0.0/8")]).map(\.description) == ["10.50.0.0/16 dev tailscale0"])
    #expect(m.otherTunnels(meeting: [prefix("10.50.1.0/24")]).map(\.description) == ["10.50.0.0/16 dev tailscale0"])
    #expect(m.otherTunnels(meeting: [prefix("172.16.0.0/12")]).isEmpty)
}
