import Topology
import Glibc
import Basics
import NamespaceLab
import Testing
import Tunnel
import Device
import Netlink

@Suite(.enabled(if: TunnelLab.isRoot, Comment(rawValue: TunnelLab.skipReason)), .serialized)
struct DeviceTunTests {
    @Test func tunHasItsMTUAddressesAndRoutesAndClosingDeletesIt() throws {
        let lab = try TunnelLab()
        let netlink = try lab.namespace.run { () throws(NetlinkError) in try NetlinkSocket() }
        var tun: TunDevice? = try TunDevice(name: "roam0", mtu: 1420,
                                            addresses: [Prefix("10.66.0.2/24")!, Prefix("fd00:66::2/64")!],
                                            namespace: lab.namespace)
        let link = try #require(try netlink.link(named: "roam0"))
        #expect(link.index == tun?.index)
        #expect(link.mtu == 1420 && link.isUp)
        let addresses = try lab.ip("address show dev roam0")
        #expect(addresses.contains("inet 10.66.0.2/24") && addresses.contains("inet6 fd00:66::2/64"), "\(addresses)")
        // No link-local address: the kernel has no source for router solicitations or MLD
        // chatter, which would wake an idle tunnel and cross the network for nothing.
        #expect(!addresses.contains("fe80:"), "\(addresses)")
        #expect(try lab.ip("route show dev roam0").contains("10.66.0.0/24 proto kernel"))
        #expect(try lab.ip("-6 route show dev roam0").contains("fd00:66::/64 proto kernel"))

        tun = nil  // the descriptor closes: the interface and its routes go with it
        // The kernel unregisters the device after the close returns (RCU): give it a moment under load.
        var gone = false
        for _ in 0..<200 where !gone {
            gone = try netlink.link(named: "roam0") == nil
            if !gone { usleep(10_000) }
        }
        #expect(gone)
        #expect(try !lab.ip("route show").contains("10.66.0.0/24"))
    }

    @Test func aMultiQueueDeviceHandsEachFlowToOneQueueAndTakesPacketsOnAny() throws {
        let lab = try TunnelLab()
        let tun = try TunDevice(name: "roam0", mtu: 1420, addresses: [Prefix("10.66.0.2/24")!], namespace: lab.namespace, queues: 4)
        #expect(tun.queues.count == 4 && Set(tun.queues).count == 4)
        let routes = try TunnelRoutes(.split([Prefix("198.18.0.0/15")!]), device: tun, namespace: lab.namespace)
        let socket = try UDPSocket(bindingTo: SocketAddress(.v4(0), port: 0), namespace: lab.namespace)
        // 32 flows (one destination port each), two packets each.
        for round in 0..<2 {
            for port in 0..<32 {
                #expect(try socket.send([UInt8(round), UInt8(port)], to: SocketAddress(IPAddress("198.18.5.5")!, port: UInt16(9000 + port))))
            }
        }
        var queueOfFlow: [UInt16: Set<Int>] = [:]
        var packets = 0
        var buffer = [UInt8](repeating: 0, count: 2048)
        for queue in 0..<4 {
            while let n = try buffer.withUnsafeMutableBytes({ try tun.read(into: $0, timeout: .milliseconds(100), queue: queue) }) {
                guard let packet = IPv4Header(Array(buffer[..<n])), packet.protocolNumber == 17 else { continue }
                let port = UInt16(packet.payload[2]) << 8 | UInt16(packet.payload[3])
                queueOfFlow[port, default: []].insert(queue)
                packets += 1
            }
        }
        #expect(packets == 64, "every packet read once, from one queue or another")
        #expect(queueOfFlow.values.allSatisfy { $0.count == 1 }, "a flow stays on its queue: \(queueOfFlow)")
        #expect(Set(queueOfFlow.values.flatMap { $0 }).count > 1, "flows spread over the queues")
        // Any queue takes a packet for the host.
        let me = SocketAddress(IPAddress("10.66.0.2")!, port: socket.local.port)
        let far = SocketAddress(IPAddress("198.18.5.5")!, port: 9999)
        #expect(try IPv4Header.udp(from: far, to: me, payload: Array("back".utf8)).withUnsafeBytes {
            try tun.write($0, header: VirtioNetHeader(), queue: 3)
        })
        #expect(try socket.receive()?.bytes == Array("back".utf8))
        _ = routes
    }

    @Test func packetsRoutedIntoTheTunArriveThereAndPacketsWrittenToItArrive() throws {
        let lab = try TunnelLab()
        let tun = try TunDevice(name: "roam0", mtu: 1420, addresses: [Prefix("10.66.0.2/24")!], namespace: lab.namespace)
        let routes = try TunnelRoutes(.split([Prefix("198.18.0.0/15")!]), device: tun, namespace: lab.namespace)
        let socket = try UDPSocket(bindingTo: SocketAddress(.v4(0), port: 0), namespace: lab.namespace)
        let far = SocketAddress(IPAddress("198.18.5.5")!, port: 9999)

        // Out: the kernel routes the datagram into the TUN, where the agent reads it.
        #expect(try socket.send(Array("hello".utf8), to: far))
        let packet = try #require(try tun.nextIPv4 { $0.destination == far.ip })
        #expect(packet.version == 4 && packet.protocolNumber == 17)
        #expect(packet.source == IPAddress("10.66.0.2"))
        #expect(Array(packet.payload.dropFirst(8)) == Array("hello".utf8))

        // In: a packet the agent writes to the TUN arrives at the socket it is addressed to.
        let me = SocketAddress(IPAddress("10.66.0.2")!, port: socket.local.port)
        #expect(try IPv4Header.udp(from: far, to: me, payload: Array("back".utf8)).withUnsafeBytes { try tun.write($0) })
        let answer = try #require(try socket.receive())
        #expect(answer.bytes == Array("back".utf8) && answer.peer == far)

        // Nothing more for IPv4 (the kernel's own IPv6 chatter may come): reads time out.
        let start = ContinuousClock.now
        #expect(try tun.nextIPv4(within: .milliseconds(100)) { _ in true } == nil)
        #expect(ContinuousClock.now - start >= .milliseconds(100))
        try routes.remove()
        #expect(try !lab.ip("route show").contains("198.18.0.0/15"))
    }

    @Test func batchesReadEveryWaitingPacketAndWriteThemBack() throws {
        let lab = try TunnelLab()
        let tun = try TunDevice(name: "roam0", mtu: 1420, addresses: [Prefix("10.66.0.2/24")!], namespace: lab.namespace)
        let socket = try UDPSocket(bindingTo: SocketAddress(.v4(0), port: 0), namespace: lab.namespace)
        for i in 0..<10 { try socket.send([UInt8(i)], to: SocketAddress(IPAddress("10.66.0.\(100 + i)")!, port: 9)) }
        let batch = PacketBatch(capacity: 64)
        var seen: [IPv4Header] = []
        let deadline = ContinuousClock.now + .seconds(2)
        while seen.count < 10, ContinuousClock.now < deadline {
            _ = try pollReadable([tun.fileDescriptor], timeout: .milliseconds(100))
            let n = try tun.read(into: batch)
            seen += (0..<n).compactMap { IPv4Header(Array(batch.packet(at: $0))) }.filter { $0.protocolNumber == 17 }
            #expect((0..<n).allSatisfy { batch.peer(at: $0) == nil })
        }
        #expect(seen.map(\.destination) == (0..<10).map { IPAddress("10.66.0.\(100 + $0)")! })

        batch.removeAll()
        let me = SocketAddress(IPAddress("10.66.0.2")!, port: socket.local.port)
        for i in 0..<5 {
            let packet = IPv4Header.udp(from: SocketAddress(IPAddress("10.66.0.9")!, port: 7), to: me, payload: [UInt8(i)])
            packet.withUnsafeBytes { _ = batch.append($0) }
        }
        #expect(try tun.write(batch) == 5)
        for i in 0..<5 { #expect(try socket.receive()?.bytes == [UInt8(i)]) }
        #expect { try [UInt8](repeating: 0x12, count: 40).withUnsafeBytes { try tun.write($0) } } throws: { error in
            (error as? DeviceError)?.code == EINVAL
        }
    }

    @Test func aTakenNameIsAClearErrorAndNeverAttaches() throws {
        let lab = try TunnelLab()
        let first = try TunDevice(name: "roam0", mtu: 1420, addresses: [], namespace: lab.namespace)
        for name in ["roam0", "lo"] {
            #expect { try TunDevice(name: name, mtu: 1420, addresses: [], namespace: lab.namespace) } throws: { error in
                let error = error as? DeviceError
                return error?.code == EBUSY && error?.help?.contains("'\(name)' exists already") == true
            }
        }
        #expect(try lab.ip("link show roam0").contains("roam0"))
        withExtendedLifetime(first) {}
    }

    @Test func configurationTheKernelRefusesLeavesNoDevice() throws {
        let lab = try TunnelLab()
        // A multicast group is no interface address; the kernel refuses it after the first.
        #expect { try TunDevice(name: "roam0", mtu: 1420, addresses: [Prefix("10.66.0.2/24")!, Prefix("ff02::1/128")!],
                                namespace: lab.namespace) } throws: { error in
            "\(error)".contains("add address ff02::1/128")
        }
        #expect(try !lab.ip("link show").contains("roam0"))
    }
}

/// What a user without privilege sees; as root (CI) there is nothing to check.
@Suite(.enabled(if: !TunnelLab.isRoot, "checks the errors an unprivileged user sees; root has every privilege"))
struct DeviceWithoutPrivilegeTests {
    @Test func creatingATunOrMarkingASocketSaysWhatToDo() {
        #expect { try TunDevice(name: "roam0", mtu: 1420, addresses: []) } throws: { error in
            // No privilege, or no TUN driver at all: either way the line says what to do.
            let help = (error as? DeviceError)?.help ?? ""
            return help.contains("CAP_NET_ADMIN") || help.contains("modprobe tun")
        }
        #expect { try UDPSocket(bindingTo: SocketAddress(.v4(0), port: 0), mark: 0xca6c) } throws: { error in
            "\(error)".hasSuffix("(errno 1); run the agent as root or give it CAP_NET_ADMIN")
        }
    }
}
