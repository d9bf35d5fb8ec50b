import Glibc
import Basics
import NamespaceLab
import Testing
import Tunnel
import Device

@Suite(.enabled(if: TunnelLab.isRoot, Comment(rawValue: TunnelLab.skipReason)), .serialized)
struct DeviceUDPSocketTests {
    @Test func batchesOf64GoOverAVethAndComeBackAsTheyAre() throws {
        let (laptop, server) = try TunnelLab.laptopAndServer()
        let listener = try UDPSocket(bindingTo: SocketAddress(IPAddress("198.51.100.7")!, port: 51820), namespace: server.namespace)
        let client = try UDPSocket(bindingTo: SocketAddress(IPAddress("10.20.0.57")!, port: 0), device: "eth0",
                                   namespace: laptop.namespace)
        #expect(client.local.port != 0 && client.local.ip == IPAddress("10.20.0.57"))

        let outgoing = PacketBatch(capacity: 64)
        for i in 0..<64 {
            #expect(outgoing.append(to: listener.local) { slot in
                for j in 0..<1400 { slot[j] = UInt8(truncatingIfNeeded: i &+ j) }
                return 1400
            })
        }
        #expect(try client.send(outgoing) == 64)

        // The listener takes them 32 at a time, then echoes each batch as it stands: a
        // received batch keeps its peers.
        let incoming = PacketBatch(capacity: 32)
        var firstBytes: [UInt8] = []
        let deadline = ContinuousClock.now + .seconds(3)
        while firstBytes.count < 64, ContinuousClock.now < deadline {
            let n = try listener.receive(into: incoming, timeout: .milliseconds(500))
            for i in 0..<n {
                #expect(incoming.packet(at: i).count == 1400)
                #expect(incoming.peer(at: i) == client.local)
                firstBytes.append(incoming.packet(at: i)[0])
            }
            #expect(try listener.send(incoming) == n)
        }
        #expect(firstBytes == (0..<64).map { UInt8($0) })

        var echoed = 0
        while echoed < 64, ContinuousClock.now < deadline {
            let n = try client.receive(into: incoming, timeout: .milliseconds(500))
            #expect((0..<n).allSatisfy { incoming.peer(at: $0) == listener.local })
            echoed += n
        }
        #expect(echoed == 64)
        #expect(try client.receive(into: incoming) == 0, "nothing waiting: no wait, no error")
    }

    /// Runs of equal-size datagrams go as one message the kernel cuts; a shorter datagram ends
    /// a run, another size or peer starts one. Every datagram arrives as it was, in order.
    @Test func segmentedSendsArriveAsTheDatagramsTheyWere() throws {
        let (laptop, server) = try TunnelLab.laptopAndServer()
        let listener = try UDPSocket(bindingTo: SocketAddress(IPAddress("198.51.100.7")!, port: 51820), namespace: server.namespace)
        let other = try UDPSocket(bindingTo: SocketAddress(IPAddress("198.51.100.7")!, port: 51821), namespace: server.namespace)
        let client = try UDPSocket(bindingTo: SocketAddress(IPAddress("10.20.0.57")!, port: 0), device: "eth0",
                                   namespace: laptop.namespace)
        // 70 of 1400 (more than one run can hold), a 900, 3 of 1400, 2 of 1200 to another peer, 1 of 1400.
        let plan: [(Int, UDPSocket)] = Array(repeating: (1400, listener), count: 70) + [(900, listener)]
            + Array(repeating: (1400, listener), count: 3) + [(1200, other), (1200, other), (1400, listener)]
        let outgoing = PacketBatch(capacity: plan.count)
        for (i, (size, to)) in plan.enumerated() {
            #expect(outgoing.append(to: to.local) { slot in
                for j in 0..<size { slot[j] = UInt8(truncatingIfNeeded: i &* 3 &+ j) }
                return size
            })
        }
        #expect(try client.sendSegmented(outgoing) == plan.count)
        #expect(client.sendsSegmented, "a veth takes segmented sends")
        var got: [UInt16: [[UInt8]]] = [:]
        var buffer = [UInt8](repeating: 0, count: 2048)
        let deadline = ContinuousClock.now + .seconds(3)
        while got.values.map(\.count).reduce(0, +) < plan.count, ContinuousClock.now < deadline {
            for socket in [listener, other] {
                while let (n, _) = try buffer.withUnsafeMutableBytes({ (raw) throws(DeviceError) in try socket.receive(into: raw, timeout: .milliseconds(20)) }) {
                    got[socket.local.port, default: []].append(Array(buffer[0..<n]))
                }
            }
        }
        let expected = { (socket: UDPSocket) in
            plan.enumerated().filter { $0.element.1 === socket }.map { i, p in (0..<p.0).map { UInt8(truncatingIfNeeded: i &* 3 &+ $0) } }
        }
        #expect(got[listener.local.port] == expected(listener))
        #expect(got[other.local.port] == expected(other))
    }

    /// A run sent segmented arrives joined at a socket that asks for it (UDP_GRO), with its
    /// segment size; cut there, it gives back every datagram, in one buffer or in a batch slot.
    @Test(arguments: [false, true])
    func joinedRunsCutBackIntoTheirDatagrams(batch: Bool) throws {
        let (laptop, server) = try TunnelLab.laptopAndServer()
        let listener = try UDPSocket(bindingTo: SocketAddress(IPAddress("198.51.100.7")!, port: 51820), namespace: server.namespace,
                                     joinsReceived: true)
        #expect(listener.joinsReceived)
        let client = try UDPSocket(bindingTo: SocketAddress(IPAddress("10.20.0.57")!, port: 0), device: "eth0",
                                   namespace: laptop.namespace)
        let sizes = Array(repeating: 1400, count: 20) + [333]
        let outgoing = PacketBatch(capacity: sizes.count)
        for (i, size) in sizes.enumerated() {
            _ = outgoing.append(to: listener.local) { slot in
                for j in 0..<size { slot[j] = UInt8(truncatingIfNeeded: i &+ j) }
                return size
            }
        }
        #expect(try client.sendSegmented(outgoing) == sizes.count)
        var datagrams: [[UInt8]] = []
        var joined = false
        let deadline = ContinuousClock.now + .seconds(3)
        while datagrams.count < sizes.count, ContinuousClock.now < deadline {
            if batch {
                let incoming = PacketBatch(capacity: 4, slotBytes: 65_536)
                let n = try listener.receive(into: incoming, timeout: .milliseconds(100))
                for i in 0..<n {
                    let bytes = Array(incoming.packet(at: i))
                    let step = incoming.segmentSize(at: i) ?? bytes.count
                    if step < bytes.count { joined = true }
                    datagrams += stride(from: 0, to: bytes.count, by: step).map { Array(bytes[$0..<min($0 + step, bytes.count)]) }
                }
            } else {
                var buffer = [UInt8](repeating: 0, count: 65_536)
                guard let (n, _, step) = try buffer.withUnsafeMutableBytes({ (raw) throws(DeviceError) in
                    try listener.receiveJoined(into: raw, timeout: .milliseconds(100))
                }) else { continue }
                if step < n { joined = true }
                datagrams += stride(from: 0, to: n, by: step).map { Array(buffer[$0..<min($0 + step, n)]) }
            }
        }
        #expect(joined, "the kernel joined the run")
        #expect(datagrams == sizes.enumerated().map { i, size in (0..<size).map { UInt8(truncatingIfNeeded: i &+ $0) } })
    }

    @Test func aSocketBoundToAnUplinkLeavesThroughItOrFails() throws {
        let (laptop, server) = try TunnelLab.laptopAndServer()
        let target = SocketAddress(IPAddress("198.51.100.7")!, port: 51820)
        // The server sees which uplink a packet came in on: one listener per ingress.
        let viaEth = try UDPSocket(bindingTo: target, device: "eth-l", namespace: server.namespace)
        let viaWifi = try UDPSocket(bindingTo: target, device: "wifi-l", namespace: server.namespace)

        // The main table prefers eth0 (metric 100); the socket bound to wifi0 still uses wifi0.
        let wifi = try UDPSocket(bindingTo: SocketAddress(IPAddress("192.168.1.23")!, port: 0), device: "wifi0",
                                 namespace: laptop.namespace)
        #expect(try wifi.send(Array("over wifi".utf8), to: target))
        #expect(try viaWifi.receive()?.bytes == Array("over wifi".utf8))
        #expect(try viaEth.receive(timeout: .milliseconds(200)) == nil)

        let eth = try UDPSocket(bindingTo: SocketAddress(IPAddress("10.20.0.57")!, port: 0), device: "eth0",
                                namespace: laptop.namespace)
        #expect(try eth.send(Array("over eth".utf8), to: target))
        #expect(try viaEth.receive()?.peer == eth.local)

        // The uplink goes down: its socket fails at once instead of wandering to wifi0.
        try laptop.ip("link set eth0 down")
        #expect { try eth.send(Array("lost".utf8), to: target) } throws: { error in
            (error as? DeviceError)?.code == ENETUNREACH
        }
        #expect(try viaWifi.receive(timeout: .milliseconds(200)) == nil)
    }

    @Test func ipv6SocketsSendAndReceive() throws {
        let (laptop, server) = try TunnelLab.laptopAndServer()
        let listener = try UDPSocket(bindingTo: SocketAddress(IPAddress("fd00:20::1")!, port: 0), namespace: server.namespace)
        let client = try UDPSocket(bindingTo: SocketAddress(IPAddress("fd00:20::57")!, port: 0), device: "eth0",
                                   namespace: laptop.namespace)
        #expect(try client.send(Array("v6".utf8), to: listener.local))
        let got = try #require(try listener.receive())
        #expect(got.bytes == Array("v6".utf8) && got.peer == client.local)
        #expect(got.peer.description.hasPrefix("[fd00:20::57]:"))
        // One socket, one family.
        #expect { try client.send([1], to: SocketAddress(IPAddress("10.20.0.1")!, port: 9)) } throws: { error in
            error is DeviceError
        }
    }

    /// A socket bound to every address learns which one each datagram was sent to, and answers
    /// from it (one datagram, or a batch), whatever its route would pick; IPv4 and IPv6 alike.
    @Test(arguments: [("198.51.100.7", "10.20.0.57", "0.0.0.0"), ("fd00:77::7", "fd00:20::57", "::")])
    func aServerAnswersFromTheAddressItWasSentTo(_ served: String, _ laptopAddress: String, _ any: String) throws {
        let (laptop, server) = try TunnelLab.laptopAndServer()
        if served.contains(":") {
            try server.ip("address add fd00:77::7/128 dev lo")
            try laptop.ip("-6 route add fd00:77::/64 via fd00:20::1 dev eth0")
        }
        let listener = try UDPSocket(bindingTo: SocketAddress(IPAddress(any)!, port: 0), namespace: server.namespace,
                                     reportsDestination: true)
        let target = SocketAddress(IPAddress(served)!, port: listener.local.port)
        let client = try UDPSocket(bindingTo: SocketAddress(IPAddress(laptopAddress)!, port: 0), device: "eth0", namespace: laptop.namespace)
        #expect(try client.send(Array("hello".utf8), to: target))
        let batch = PacketBatch(capacity: 4)
        let deadline = ContinuousClock.now + .seconds(2)
        while batch.count == 0, ContinuousClock.now < deadline { _ = try listener.receive(into: batch, timeout: .milliseconds(100)) }
        try #require(batch.count == 1)
        #expect(batch.local(at: 0) == IPAddress(served), "the address the datagram was sent to")
        let peer = try #require(batch.peer(at: 0))
        // One datagram from that address, then a batch.
        #expect(try Array("one".utf8).withUnsafeBytes { try listener.send($0, to: peer, from: IPAddress(served)) })
        let one = try #require(try client.receive())
        #expect(one.bytes == Array("one".utf8) && one.peer == target, "from \(one.peer), not the route's choice")
        let out = PacketBatch(capacity: 2)
        for text in ["two", "three"] {
            #expect(Array(text.utf8).withUnsafeBytes { out.append($0, to: peer) })
            out.setSource(IPAddress(served), at: out.count - 1)
        }
        #expect(out.source(at: 1) == IPAddress(served), "the batch keeps the source it was given")
        #expect(try listener.send(out) == 2)
        for text in ["two", "three"] {
            let got = try #require(try client.receive())
            #expect(got.bytes == Array(text.utf8) && got.peer == target, "\(text) from \(got.peer)")
        }
        // Without a source, the route's choice: the server's address on the laptop's link.
        #expect(try Array("four".utf8).withUnsafeBytes { try listener.send($0, to: peer, from: nil) })
        #expect(try client.receive()?.peer.ip != IPAddress(served))
    }

    @Test func badBindingsAreClearErrors() throws {
        let (laptop, _) = try TunnelLab.laptopAndServer()
        let any = SocketAddress(.v4(0), port: 0)
        #expect { try UDPSocket(bindingTo: any, device: "nope0", namespace: laptop.namespace) } throws: { error in
            let error = error as? DeviceError
            return error?.code == ENODEV && error?.help == "there is no interface named 'nope0'"
        }
        #expect { try UDPSocket(bindingTo: SocketAddress(IPAddress("10.99.0.1")!, port: 0), namespace: laptop.namespace) } throws: { error in
            "\(error)".contains("10.99.0.1 is not an address of this host")
        }
        // A port taken is said as such (on the namespace's loopback: what is checked is the port).
        let taken = try UDPSocket(bindingTo: SocketAddress(IPAddress("127.0.0.1")!, port: 0), namespace: laptop.namespace)
        #expect { try UDPSocket(bindingTo: taken.local, namespace: laptop.namespace) } throws: { error in
            (error as? DeviceError)?.code == EADDRINUSE
        }
    }

    @Test func socketsSharingAPortSplitTheSendersAndRefuseAPortTaken() throws {
        let (laptop, server) = try TunnelLab.laptopAndServer()
        let here = SocketAddress(IPAddress("10.20.0.57")!, port: 0)
        let shared = try UDPSocket.listening(on: here, count: 3, namespace: laptop.namespace)
        #expect(shared.count == 3 && Set(shared.map(\.local)).count == 1, "one address and port for all")
        // A second server on the port, sharing or not, is refused: it would take half the clients.
        #expect { try UDPSocket.listening(on: shared[0].local, count: 2, namespace: laptop.namespace) } throws: { error in
            (error as? DeviceError)?.code == EADDRINUSE
        }
        #expect { try UDPSocket(bindingTo: shared[0].local, namespace: laptop.namespace) } throws: { error in
            (error as? DeviceError)?.code == EADDRINUSE
        }
        // Each of 24 senders lands on one socket, every datagram exactly once, and not all on one.
        let senders = try (0..<24).map { _ in try UDPSocket(bindingTo: SocketAddress(.v4(0), port: 0), namespace: server.namespace) }
        for (i, sender) in senders.enumerated() { #expect(try sender.send([UInt8(i)], to: shared[0].local)) }
        var received: [Int: Set<UInt8>] = [:]
        for (i, socket) in shared.enumerated() {
            while let datagram = try socket.receive(timeout: .milliseconds(200)) { received[i, default: []].insert(datagram.bytes[0]) }
        }
        #expect(received.values.reduce(0) { $0 + $1.count } == 24)
        #expect(Set(received.values.flatMap { $0 }) == Set(0..<24))
        #expect(received.count > 1, "the kernel spreads senders over the sockets: \(received.mapValues(\.count))")
    }
}
