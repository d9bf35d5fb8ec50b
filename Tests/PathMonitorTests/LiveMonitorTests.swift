import Topology
import NamespaceLab
import Testing
import Basics
@testable import PathMonitor
import Netlink

private let server = IPAddress("198.51.100.7")!

@Suite(.enabled(if: NamespaceLab.isRoot, Comment(rawValue: NamespaceLab.skipReason)), .serialized)
struct LiveMonitorTests {
    @Test func dumpBuildsThePathsAndTheKernelAgrees() throws {
        let lab = try NamespaceLab()
        try lab.laptop()
        let monitor = try LiveMonitor(endpoint: server, namespace: lab.namespace)
        #expect(monitor.paths.map(\.interface) == ["eth0", "wifi0"])
        #expect(monitor.paths.first?.source == IPAddress("10.20.0.57"))
        #expect(monitor.paths.first?.gateway == IPAddress("10.20.0.1"))
        #expect(monitor.tracker.model.link(named: "eth0")?.kind == .virtual, "a veth is virtual, whatever its name")
        let kernel = try monitor.kernelRoute()
        #expect(kernel?.nextHops.first?.linkIndex == monitor.paths.first?.linkIndex)
    }

    @Test func uplinkLossAndReturnArriveAsPathEvents() throws {
        let lab = try NamespaceLab()
        try lab.laptop()
        let monitor = try LiveMonitor(endpoint: server, namespace: lab.namespace)

        try lab.ip("link set eth0-peer down")  // the cable: eth0 loses carrier, keeps its routes
        var events = monitor.events { $0.contains { $0.paths?.map(\.interface) == ["wifi0"] } }
        #expect(events.contains { $0.paths?.map(\.interface) == ["wifi0"] })

        try lab.ip("link set eth0-peer up")
        events = monitor.events { $0.contains { $0.paths?.first?.interface == "eth0" } }
        #expect(events.compactMap(\.paths).last?.map(\.interface) == ["eth0", "wifi0"])
    }

    @Test func addressChangeAndMetricChangeMoveThePath() throws {
        let lab = try NamespaceLab()
        try lab.laptop()
        let monitor = try LiveMonitor(endpoint: server, namespace: lab.namespace)
        // DHCP hands out a new lease: the old address goes (taking its routes), the new one comes.
        try lab.ip("address del 10.20.0.57/24 dev eth0")
        try lab.ip("address add 10.20.0.99/24 dev eth0")
        try lab.ip("route add default via 10.20.0.1 dev eth0 metric 100")
        var events = monitor.events { $0.contains { $0.paths?.first?.source == IPAddress("10.20.0.99") } }
        #expect(events.compactMap(\.paths).last?.first?.source == IPAddress("10.20.0.99"))

        try lab.ip("route add default via 192.168.1.1 dev wifi0 metric 50")
        events = monitor.events { $0.contains { $0.paths?.first?.interface == "wifi0" } }
        #expect(events.compactMap(\.paths).last?.first?.metric == 50)
    }

    @Test func unrelatedChurnProducesNoPathEvent() throws {
        let lab = try NamespaceLab()
        try lab.laptop()
        let monitor = try LiveMonitor(endpoint: server, namespace: lab.namespace)
        try lab.ip("link add docker0 type bridge")
        try lab.ip("address add 172.17.0.1/16 dev docker0")
        try lab.ip("link set docker0 up")
        try lab.ip("link add veth1a2b type veth peer name veth1a2b-c")
        try lab.ip("link set veth1a2b master docker0")
        try lab.ip("link set veth1a2b up")
        try lab.ip("link set veth1a2b-c up")
        try lab.ip("address add 2001:db8:1::99/64 dev wifi0")
        try lab.ip("address del 2001:db8:1::99/64 dev wifi0")
        try lab.ip("link del veth1a2b")
        try lab.ip("link del docker0")
        // Wait until the last deletion shows up, then check nothing moved the path.
        let events = monitor.events { $0.contains { if case .ignored(let text, _, _) = $0 { text.contains("docker0 removed") } else { false } } }
        #expect(events.contains { if case .ignored = $0 { true } else { false } })
        #expect(!events.contains { $0.paths != nil }, "\(events)")
        #expect(monitor.paths.map(\.interface) == ["eth0", "wifi0"])
    }

    /// The kernel's own word on a TAP port: a VM's (QEMU opens it with a virtio header) makes a
    /// guest bridge, a VPN's (OpenVPN's, tinc's: none) makes another site's LAN.
    @Test func aBridgeOfAVPNsTapIsNoGuestNetworkAndOneOfAVMsTapIs() throws {
        let lab = try NamespaceLab()
        try lab.laptop()
        for (bridge, subnet, tap, flags) in [("virbr0", "192.168.122.1/24", "vnet0", " vnet_hdr"), ("br-site", "10.8.0.1/24", "tap0", "")] {
            try lab.ip("link add \(bridge) type bridge")
            try lab.ip("address add \(subnet) dev \(bridge)")
            try lab.ip("link set \(bridge) up")
            try lab.ip("tuntap add mode tap name \(tap)\(flags)")
            try lab.ip("link set \(tap) master \(bridge)")
        }
        let model = try LiveMonitor(endpoint: server, namespace: lab.namespace).tracker.model
        #expect(model.link(named: "vnet0")?.isVirtualMachinesTap == true)
        #expect(model.link(named: "tap0")?.isVirtualMachinesTap == false)
        #expect(model.guestNetworks.map(\.interface) == ["virbr0"])
    }

    @Test func overrunResyncsToExactlyWhatAFreshDumpSays() throws {
        let lab = try NamespaceLab()
        try lab.laptop()
        // A tiny receive buffer, and nobody reading while thousands of routes arrive.
        let monitor = try LiveMonitor(endpoint: server, receiveBuffer: 4096, namespace: lab.namespace)
        try lab.batch((0..<3000).map { "route add 10.\(100 + $0 / 250).\($0 % 250).0/24 via 10.20.0.1 dev eth0 metric \($0 % 7)" })
        try lab.ip("link set eth0 down")  // flushes eth0's IPv4 routes, silently
        let events = monitor.events { $0.contains { if case .resynced = $0 { true } else { false } } }
        #expect(events.contains { if case .resynced = $0 { true } else { false } })
        #expect(monitor.resyncs >= 1)
        // Drain what is left, then compare with the kernel's own answer.
        _ = monitor.events(within: .milliseconds(300)) { _ in false }
        let fresh = try LiveMonitor(endpoint: server, namespace: lab.namespace)
        #expect(monitor.tracker.model == fresh.tracker.model)
        #expect(monitor.paths.map(\.interface) == ["wifi0"])
    }

    @Test func routesWrittenThroughNetlinkMoveThePathAndRefusalsAreErrors() throws {
        let lab = try NamespaceLab()
        try lab.laptop()
        let monitor = try LiveMonitor(endpoint: server, namespace: lab.namespace)
        let writer = try lab.namespace.run { () throws(NetlinkError) in try NetlinkSocket() }
        let wifi = try #require(monitor.tracker.model.link(named: "wifi0"))
        let host = Route(destination: Prefix("198.51.100.7/32")!, nextHops: [NextHop(gateway: IPAddress("192.168.1.1"), linkIndex: wifi.index)])
        try writer.write(host)
        var events = monitor.events { $0.contains { $0.paths?.first?.interface == "wifi0" } }
        #expect(events.compactMap(\.paths).last?.first?.prefixLength == 32)
        try writer.write(host, delete: true)
        events = monitor.events { $0.contains { $0.paths?.first?.interface == "eth0" } }
        #expect(events.compactMap(\.paths).last?.map(\.interface) == ["eth0", "wifi0"])
        #expect(throws: NetlinkError.self) { try writer.write(host, delete: true) }
        let bogus = Route(destination: Prefix("203.0.113.0/24")!, nextHops: [NextHop(gateway: IPAddress("172.31.0.1"), linkIndex: wifi.index)])
        #expect(throws: NetlinkError.self) { try writer.write(bogus) }
    }
}
