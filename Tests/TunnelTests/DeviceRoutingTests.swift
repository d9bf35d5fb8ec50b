import Topology
import Glibc
import Basics
import NamespaceLab
import Testing
import Tunnel
import Device
import Netlink

@Suite(.enabled(if: TunnelLab.isRoot, Comment(rawValue: TunnelLab.skipReason)), .serialized)
struct DeviceRoutingTests {
    @Test func fullTunnelInstallsWgQuicksRulesAndRemovesThem() throws {
        let (laptop, server) = try TunnelLab.laptopAndServer()
        let tun = try TunDevice(name: "roam0", mtu: 1420, addresses: [Prefix("10.66.0.2/24")!], namespace: laptop.namespace)
        let routes = try TunnelRoutes(.full(FullTunnel()), device: tun, namespace: laptop.namespace)
        for family in ["-4", "-6"] {
            let rules = try laptop.ip("\(family) rule show")
            #expect(rules.contains("32764:\tfrom all lookup main suppress_prefixlength 0"), "\(rules)")
            #expect(rules.contains("32765:\tnot from all fwmark 0xca6c lookup 51820"), "\(rules)")
        }
        #expect(try laptop.ip("-4 route show table 51820").contains("default dev roam0"))
        // The kernel's own answer: everything unmarked goes into the tunnel, marked packets
        // take the main table's best uplink, and the LAN stays on the LAN.
        let netlink = try laptop.namespace.run { () throws(NetlinkError) in try NetlinkSocket() }
        let far = IPAddress("198.51.100.7")!
        let eth0 = try #require(try netlink.link(named: "eth0"))
        #expect(try netlink.lookupRoute(to: far)?.nextHops.first?.linkIndex == tun.index)
        #expect(try netlink.lookupRoute(to: far, mark: 0xca6c)?.nextHops.first?.linkIndex == eth0.index)
        #expect(try netlink.lookupRoute(to: IPAddress("10.20.0.1")!)?.nextHops.first?.linkIndex == eth0.index)
        // No IPv6 inner address: IPv6 is unreachable rather than sent in clear.
        #expect(try laptop.ip("-6 route show table 51820").contains("unreachable default"))
        #expect(try netlink.lookupRoute(to: IPAddress("2001:db8::1")!) == nil)

        try routes.remove()
        try routes.remove()  // again: nothing left, no error
        for family in ["-4", "-6"] {
            let rules = try laptop.ip("\(family) rule show")
            #expect(!rules.contains("51820") && !rules.contains("suppress_prefixlength"), "\(rules)")
            #expect(try laptop.ip("\(family) route show table all").contains("table 51820") == false)
        }
        withExtendedLifetime(server) {}
    }

    /// What of the plan is missing is read from the kernel: a deleted rule or flushed table is
    /// named, a look-alike rule that matches on more (an interface, a narrower mask) hides
    /// nothing, and `reinstall` puts back exactly what went.
    @Test func missingRulesAndRoutesAreFoundAndPutBack() throws {
        let (laptop, server) = try TunnelLab.laptopAndServer()
        let tun = try TunDevice(name: "roam0", mtu: 1420, addresses: [Prefix("10.66.0.2/24")!], namespace: laptop.namespace)
        let routes = try TunnelRoutes(.full(FullTunnel()), device: tun, namespace: laptop.namespace)
        let netlink = try laptop.namespace.run { () throws(NetlinkError) in try NetlinkSocket() }
        func kernelRoutes() throws -> [Route] {
            var decoder = NetlinkDecoder()
            return try netlink.dump(decoder: &decoder).compactMap { if case .routeAdded(let route) = $0 { route } else { nil } }
        }
        #expect(try routes.missing(routes: kernelRoutes()).isEmpty)
        try laptop.ip("-4 rule del priority 32765")
        try laptop.ip("-4 rule add priority 32765 not fwmark 0xca6c lookup 51820 iif lo")
        try laptop.ip("-4 rule add priority 32765 not fwmark 0xca6c/0xff lookup 51820")
        try laptop.ip("-4 route flush table 51820")
        let missing = try routes.missing(routes: kernelRoutes())
        #expect(missing == ["route default table 51820", "rule v4 32765: not fwmark 0xca6c lookup 51820"], "\(missing)")
        let present = try netlink.rules()
        let alike = present.filter { $0.priority == 32765 && $0.family == .v4 }
        #expect(alike.count == 2 && alike.allSatisfy { $0.matchesMore }, "\(present)")
        try routes.reinstall()
        #expect(try routes.missing(routes: kernelRoutes()).isEmpty)
        #expect(try laptop.ip("-4 route show table 51820").contains("default dev roam0"))
        try routes.remove()
        withExtendedLifetime(server) {}
    }

    @Test func theSessionsMarkedSocketReachesTheServerPastTheTunnel() throws {
        let (laptop, server) = try TunnelLab.laptopAndServer()
        let tun = try TunDevice(name: "roam0", mtu: 1420, addresses: [Prefix("10.66.0.2/24")!], namespace: laptop.namespace)
        let mode = RoutingMode.full(FullTunnel())
        let routes = try TunnelRoutes(mode, device: tun, namespace: laptop.namespace)
        let listener = try UDPSocket(bindingTo: SocketAddress(IPAddress("198.51.100.7")!, port: 51820), namespace: server.namespace)

        // The session's socket: marked, so it takes the current uplink (eth0, metric 100).
        let session = try UDPSocket(bindingTo: SocketAddress(.v4(0), port: 0), mark: mode.socketMark, namespace: laptop.namespace)
        var mark: UInt32 = 0
        var length = socklen_t(MemoryLayout<UInt32>.size)
        #expect(getsockopt(session.fileDescriptor, SOL_SOCKET, SO_MARK, &mark, &length) == 0 && mark == 0xca6c)
        #expect(try session.send(Array("handshake".utf8), to: listener.local))
        let arrived = try #require(try listener.receive())
        #expect(arrived.bytes == Array("handshake".utf8) && arrived.peer.ip == IPAddress("10.20.0.57"))
        // And the answer comes back to it.
        #expect(try listener.send(Array("welcome".utf8), to: arrived.peer))
        #expect(try session.receive()?.bytes == Array("welcome".utf8))

        // Any other socket's packet to the same server goes into the tunnel instead.
        let other = try UDPSocket(bindingTo: SocketAddress(.v4(0), port: 0), namespace: laptop.namespace)
        #expect(try other.send(Array("app".utf8), to: listener.local))
        #expect(try tun.nextIPv4 { $0.destination == listener.local.ip } != nil)
        #expect(try listener.receive(timeout: .milliseconds(200)) == nil)

        // The uplink goes: the marked socket follows the main table to wifi0, no route to fix.
        try laptop.ip("link set eth0 down")
        #expect(try session.send(Array("roamed".utf8), to: listener.local))
        #expect(try listener.receive()?.peer.ip == IPAddress("192.168.1.23"))
        try routes.remove()
    }

    /// A network claims 10/8 (mask 255.0.0.0 on eth0): with the claim's rules, what counts as
    /// local (the /16 around the address) keeps the LAN, the rest of 10/8 goes into the tunnel,
    /// the session's marked socket keeps the main table; the kernel reads the rules back as
    /// written, a removed one is found missing and put back, and dropping them leaves none.
    @Test func whatANetworkClaimedBeyondTheLANGoesIntoTheTunnel() throws {
        let (laptop, server) = try TunnelLab.laptopAndServer()
        try laptop.ip("address add 10.20.0.57/8 dev eth0")
        let tun = try TunDevice(name: "roam0", mtu: 1420, addresses: [Prefix("10.66.0.2/24")!], namespace: laptop.namespace)
        let mode = RoutingMode.full(FullTunnel())
        let routes = try TunnelRoutes(mode, device: tun, namespace: laptop.namespace)
        let rules = mode.claimRules(local: [Prefix("10.20.0.0/16")!, Prefix("192.168.1.0/24")!], widerClaims: [Prefix("10.0.0.0/8")!])
        #expect(rules.map(\.description) == ["v4 32760: fwmark 0xca6c lookup main", "v4 32762: from all to 10.20.0.0/16 lookup main suppress_prefixlength 0",
                                               "v4 32763: from all to 10.0.0.0/8 lookup 51820"])
        try routes.follow(rules)
        let netlink = try laptop.namespace.run { () throws(NetlinkError) in try NetlinkSocket() }
        let present = try netlink.rules()
        for rule in rules { #expect(present.contains(rule), "\(rule) not read back: \(present)") }
        #expect(try laptop.ip("-4 route get 10.50.0.9").contains("dev roam0"))
        #expect(try laptop.ip("-4 route get 10.20.0.1").contains("dev eth0"))
        #expect(try laptop.ip("-4 route get 10.50.0.9 mark 0xca6c").contains("dev eth0"))
        func kernelRoutes() throws -> [Route] {
            var decoder = NetlinkDecoder()
            return try netlink.dump(decoder: &decoder).compactMap { if case .routeAdded(let route) = $0 { route } else { nil } }
        }
        #expect(try routes.missing(routes: kernelRoutes()).isEmpty)
        try laptop.ip("-4 rule del priority 32763")
        #expect(try routes.missing(routes: kernelRoutes()) == ["rule v4 32763: from all to 10.0.0.0/8 lookup 51820"])
        try routes.reinstall()
        #expect(try routes.missing(routes: kernelRoutes()).isEmpty)
        // The network goes back to a LAN's mask: no rule is left.
        try routes.follow(mode.claimRules(local: [Prefix("10.20.0.0/24")!], widerClaims: []))
        #expect(try netlink.rules().filter { $0.priority < 32764 && $0.priority > 32700 }.isEmpty)
        try routes.remove()
        withExtendedLifetime(server) {}
    }

    @Test func rulesLeftByACrashAreAdoptedAndRemoved() throws {
        let lab = try TunnelLab()
        try lab.ip("rule add priority 32765 not fwmark 0xca6c lookup 51820")
        let tun = try TunDevice(name: "roam0", mtu: 1420, addresses: [], namespace: lab.namespace)
        let routes = try TunnelRoutes(.full(FullTunnel()), device: tun, namespace: lab.namespace)
        #expect(try lab.ip("rule show").components(separatedBy: "lookup 51820").count == 2, "one rule, not two")
        #expect(try lab.ip("-6 rule show").components(separatedBy: "lookup 51820").count == 2)
        try routes.remove()
        #expect(try !lab.ip("rule show").contains("51820"))
    }

    /// Laptops often run with IPv6 switched off: full mode still comes up, IPv6 unreachable.
    @Test func fullTunnelComesUpWhereIPv6IsDisabled() throws {
        let lab = try TunnelLab()
        try NamespaceLab.ip(["netns", "exec", lab.name, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1",
                             "net.ipv6.conf.default.disable_ipv6=1"])
        let tun = try TunDevice(name: "roam0", mtu: 1420, addresses: [Prefix("10.66.0.2/24")!], namespace: lab.namespace)
        let routes = try TunnelRoutes(.full(FullTunnel()), device: tun, namespace: lab.namespace)
        #expect(try lab.ip("-6 route show table 51820").contains("unreachable default"))
        #expect(try lab.ip("-4 route show table 51820").contains("default dev roam0"))
        // A route the kernel refuses there names the kernel's reason, not "run as root".
        let netlink = try lab.namespace.run { () throws(NetlinkError) in try NetlinkSocket() }
        #expect { try netlink.write(Route(table: 51820, destination: .any(.v6), nextHops: [NextHop(linkIndex: tun.index)])) }
            throws: { error in
                let description = "\(DeviceError(error as! NetlinkError))"
                return description.contains("IPv6 is disabled") && !description.contains("run the agent as root")
            }
        try routes.remove()
    }

    @Test func droppingTheOwnerRemovesRulesAndARefusedPlanLeavesNothing() throws {
        let lab = try TunnelLab()
        var tun: TunDevice? = try TunDevice(name: "roam0", mtu: 1420, addresses: [], namespace: lab.namespace)
        var routes: TunnelRoutes? = try TunnelRoutes(.full(FullTunnel()), device: tun!, namespace: lab.namespace)
        tun = nil  // the TUN goes first: its table routes die with it, the rules do not
        #expect(try lab.ip("rule show").contains("51820"))
        routes = nil
        #expect(try !lab.ip("rule show").contains("51820"))
        #expect(try !lab.ip("-6 rule show").contains("51820"))
        withExtendedLifetime(routes) {}

        // A mode the kernel refuses halfway (host bits set in a route's prefix) rolls back
        // what it had installed.
        let second = try TunDevice(name: "roam1", mtu: 1420, addresses: [], namespace: lab.namespace)
        #expect(throws: DeviceError.self) {
            try TunnelRoutes(.split([Prefix("198.18.0.0/15")!, Prefix("10.1.2.3/8")!]), device: second, namespace: lab.namespace)
        }
        #expect(try !lab.ip("route show").contains("198.18.0.0/15"))
    }
}
