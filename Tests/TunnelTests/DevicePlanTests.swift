import Topology
import Glibc
import Basics
import Testing
import Tunnel
import Device
import Netlink

/// The device layer's pure parts: no root, no kernel state.
struct DevicePlanTests {
    @Test func splitRoutesEachPrefixThroughTheMainTable() {
        let plan = RoutingMode.split([Prefix("10.8.0.0/16")!, Prefix("fd00:8::/32")!]).plan(linkIndex: 7)
        #expect(plan.rules.isEmpty)
        #expect(plan.routes == [
            Route(destination: Prefix("10.8.0.0/16")!, nextHops: [NextHop(linkIndex: 7)]),
            Route(destination: Prefix("fd00:8::/32")!, nextHops: [NextHop(linkIndex: 7)]),
        ])
        #expect(RoutingMode.split([]).socketMark == nil)
    }

    @Test func fullTunnelIsWgQuicksRulesPerFamily() {
        let mode = RoutingMode.full(FullTunnel())
        let plan = mode.plan(linkIndex: 9)
        #expect(mode.socketMark == 0xca6c)
        #expect(plan.routes == [
            Route(table: 51820, destination: .any(.v4), nextHops: [NextHop(linkIndex: 9)]),
            Route(table: 51820, destination: .any(.v6), nextHops: [NextHop(linkIndex: 9)]),
        ])
        #expect(plan.rules.map(\.description) == [
            "v4 32764: from all lookup main suppress_prefixlength 0",
            "v4 32765: not fwmark 0xca6c lookup 51820",
            "v6 32764: from all lookup main suppress_prefixlength 0",
            "v6 32765: not fwmark 0xca6c lookup 51820",
        ])
        // A tunnel with only an IPv4 inner address: IPv6 is unreachable, never in clear.
        let v4Only = RoutingMode.full(FullTunnel(table: 100, mark: 1, priority: 1000)).plan(linkIndex: 9, tunneled: [.v4])
        #expect(v4Only.routes == [
            Route(table: 100, destination: .any(.v4), nextHops: [NextHop(linkIndex: 9)]),
            Route(table: 100, destination: .any(.v6), type: .reject, nextHops: []),
        ])
        #expect(v4Only.rules.map(\.priority) == [1000, 1001, 1000, 1001])
    }

    @Test func socketAddressesReadLikeEndpoints() {
        #expect(SocketAddress(IPAddress("192.0.2.1")!, port: 51820).description == "192.0.2.1:51820")
        #expect(SocketAddress(IPAddress("2001:db8::1")!, port: 443).description == "[2001:db8::1]:443")
        #expect(SocketAddress(Endpoint("[2001:db8::7]:51820")!) == SocketAddress(IPAddress("2001:db8::7")!, port: 51820))
        #expect(SocketAddress(Endpoint("vpn.example:51820")!) == nil, "a name must be resolved first")
        #expect(SocketAddress(Endpoint("192.0.2.1")!) == nil, "no port")
    }

    @Test func batchSlotsHoldPacketsAndPeersUntilFull() {
        let batch = PacketBatch(capacity: 2)
        let peer = SocketAddress(IPAddress("2001:db8::7")!, port: 9)
        #expect([UInt8](repeating: 1, count: 1400).withUnsafeBytes { batch.append($0, to: peer) })
        #expect(batch.append { slot in
            slot.storeBytes(of: 0xAB, as: UInt8.self)
            return 1
        })
        #expect(!batch.append { _ in 1 }, "full")
        #expect(batch.count == 2 && batch.isFull)
        #expect(batch.packet(at: 0).count == 1400 && batch.peer(at: 0) == peer)
        #expect(Array(batch.packet(at: 1)) == [0xAB] && batch.peer(at: 1) == nil)
        batch.removeAll()
        let tooLong = [UInt8](repeating: 0, count: PacketBatch.slotSize + 1)
        #expect(!tooLong.withUnsafeBytes { batch.append($0) })
        #expect(!batch.append { _ in nil })
        #expect(batch.count == 0)
        #expect(PacketBatch(capacity: 0).capacity == 1 && PacketBatch(capacity: 1 << 20).capacity == PacketBatch.maximumCapacity)
    }

    @Test func badInputIsRefusedBeforeTheKernelSeesIt() {
        for name in ["", "a-name-longer-than-15", "has space", "a/b", "eth%d"] {
            #expect { try TunDevice(name: name, mtu: 1420, addresses: []) } throws: { error in
                (error as? DeviceError)?.code == EINVAL && (error as? DeviceError)?.help?.contains("1 to 15") == true
            }
        }
        #expect { try TunDevice(name: "roam0", mtu: 1200, addresses: [Prefix("fd00::2/64")!]) } throws: { error in
            "\(error)".contains("the MTU must be 1280 to 65535 with an IPv6 address")
        }
        #expect { try UDPSocket(bindingTo: SocketAddress(.v4(0), port: 0), device: "no such device!") } throws: { error in
            (error as? DeviceError)?.code == EINVAL
        }
    }

    @Test func errorsReadAsOneLineOfHelp() {
        let error = DeviceError("open /dev/net/tun", EACCES)
        #expect(error.description == "open /dev/net/tun: Permission denied (errno 13); run the agent as root or give it CAP_NET_ADMIN")
        #expect(!error.description.contains("\n"))
        #expect(DeviceError(NetlinkError("add rule", EEXIST)).description == "add rule: File exists (errno 17)")
        // The kernel's own reason beats the errno's usual meaning.
        let refused = DeviceError(NetlinkError("add route ::/0", EACCES, message: "IPv6 is disabled on nexthop device"))
        #expect(refused.description == "add route ::/0: IPv6 is disabled on nexthop device (Permission denied, errno 13)")
    }

    @Test func pollReportsReadyDescriptorsAndTimesOut() throws {
        var ends: [Int32] = [0, 0]
        #expect(pipe(&ends) == 0)
        defer { close(ends[0]); close(ends[1]) }
        let start = ContinuousClock.now
        #expect(try pollReadable([ends[0]], timeout: .milliseconds(20)).isEmpty)
        #expect(ContinuousClock.now - start >= .milliseconds(20))
        #expect(write(ends[1], "x", 1) == 1)
        #expect(try pollReadable([ends[1], ends[0]], timeout: nil) == [ends[0]])
        #expect(throws: DeviceError.self) { try pollReadable([999], timeout: .zero) }
    }
}

/// Others' policy rules that decide before a full tunnel's: a rule to another table with a lower
/// priority (Tailscale's 5270), not the kernel's own tables nor the tunnel's, and none in split mode.
@Test func rulesBeforeTheFullTunnelsAreOthersTablesFirst() {
    let full = RoutingMode.full(FullTunnel())
    let rules = [
        RoutingRule(family: .v4, priority: 0, table: 255),
        RoutingRule(family: .v4, priority: 5270, table: 52),
        RoutingRule(family: .v6, priority: 5270, table: 52),
        RoutingRule(family: .v4, priority: 32764, table: Route.mainTable, suppressPrefixLength: 0),
        RoutingRule(family: .v4, priority: 32765, table: 51820, mark: 0xca6c, inverted: true),
        RoutingRule(family: .v4, priority: 32766, table: Route.mainTable),
        RoutingRule(family: .v4, priority: 40000, table: 99),
        RoutingRule(family: .v4, priority: 100, table: Route.mainTable),
    ]
    #expect(full.rulesBefore(in: rules).map(\.priority) == [5270, 5270])
    #expect(RoutingMode.split([Prefix("10.77.0.0/16")!]).rulesBefore(in: rules).isEmpty)
    #expect(full.carried == [.any(.v4), .any(.v6)])
}
