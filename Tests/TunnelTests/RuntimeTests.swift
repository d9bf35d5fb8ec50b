import Topology
import Foundation
import Glibc
import Basics
import NamespaceLab
import Logging
import Synchronization
import Testing
@testable import Tunnel
import Device
import Netlink
import Streams

/// A TCP endpoint for traffic through the tunnel, made inside a lab namespace.
private struct TCP {
    let fd: Int32

    static func listen(on address: SocketAddress, in lab: TunnelLab) throws -> TCP {
        try lab.namespace.run { () throws(NetlinkError) -> TCP in
            let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            var yes: Int32 = 1
            setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, socklen_t(MemoryLayout<Int32>.size))
            var sa = TCPStream.sockaddr(address)
            let ok = withUnsafePointer(to: &sa) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
            guard ok == 0, Glibc.listen(fd, 4) == 0 else { throw NetlinkError("listen", errno) }
            return TCP(fd: fd)
        }
    }

    static func connect(to address: SocketAddress, in lab: TunnelLab) throws -> TCP {
        let fd = try lab.namespace.run { () throws(NetlinkError) -> Int32 in socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0) }
        let tcp = TCP(fd: fd)
        tcp.timeouts(.seconds(5))
        var sa = TCPStream.sockaddr(address)
        let ok = withUnsafePointer(to: &sa) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        guard ok == 0 else { _ = Glibc.close(fd); throw NetlinkError("connect to \(address)", errno) }
        return tcp
    }

    func accept() throws -> TCP {
        timeouts(.seconds(5))
        let client = Glibc.accept(fd, nil, nil)
        guard client >= 0 else { throw NetlinkError("accept", errno) }
        let tcp = TCP(fd: client)
        tcp.timeouts(.seconds(5))
        return tcp
    }

    func timeouts(_ d: Duration) { TCPStream.timeouts(fd, seconds: Int(d.components.seconds)) }

    func close() { _ = Glibc.close(fd) }
}

private final class Running: Sendable {
    let done = DispatchSemaphore(value: 0)
    init(_ body: @escaping @Sendable () -> Void) {
        Thread.detachNewThread { [done] in
            body()
            done.signal()
        }
    }
    func wait() { _ = done.wait(timeout: .now() + 5) }
}

@Suite(.enabled(if: TunnelLab.isRoot, Comment(rawValue: TunnelLab.skipReason)), .serialized)
struct RuntimeTests {
    let serverKey: PrivateKey
    let clientKey: PrivateKey
    /// A second user, for traffic between clients.
    let bobKey: PrivateKey
    let users: UserDatabase

    init() throws {
        serverKey = try PrivateKey.generate()
        clientKey = try PrivateKey.generate()
        bobKey = try PrivateKey.generate()
        users = try UserDatabase([User(name: "alice", publicKey: clientKey.publicKey, addresses: [IPAddress("10.77.0.2")!]),
                                  User(name: "bob", publicKey: bobKey.publicKey, addresses: [IPAddress("10.77.0.3")!])])
    }

    private func startServer(in lab: TunnelLab) throws -> (TunnelServer, Running) {
        let tun = try TunDevice(name: "roam0", mtu: 1420, addresses: [Prefix("10.77.0.1/24")!], namespace: lab.namespace)
        let sockets = [try UDPSocket(bindingTo: SocketAddress(.v4(0), port: 51820), namespace: lab.namespace),
                       try UDPSocket(bindingTo: SocketAddress(.v6(0, 0), port: 51820), namespace: lab.namespace)]
        let server = TunnelServer(core: try ServerCore(privateKey: serverKey, users: users), device: tun, sockets: sockets, logger: quiet)
        return (server, Running { server.run() })
    }

    /// A client of `endpoint` on `socket`, with its session up; its inner address checked
    /// (alice's unless `key` is another user's).
    func connect(_ socket: any PacketCarrier, to endpoint: SocketAddress, as key: PrivateKey? = nil,
                 address: IPAddress = IPAddress("10.77.0.2")!) throws -> TunnelClient {
        let client = try TunnelClient(core: try ClientCore(privateKey: key ?? clientKey, serverKey: serverKey.publicKey),
                                      socket: socket, server: endpoint, logger: quiet)
        let completion = try client.handshake(timeout: .seconds(3))
        #expect(completion.addresses == [address])
        return client
    }

    @Test func tcpStreamSurvivesARebindWithNoHandshakeAndServerRestartRecovers() throws {
        let (laptop, serverLab) = try TunnelLab.laptopAndServer()
        var (server, serverThread): (TunnelServer?, Running) = try startServer(in: serverLab)
        let endpoint = SocketAddress(IPAddress("198.51.100.7")!, port: 51820)
        let eth0 = try UDPSocket(bindingTo: SocketAddress(IPAddress("10.20.0.57")!, port: 0), device: "eth0", namespace: laptop.namespace)
        let client = try connect(eth0, to: endpoint)
        let tun = try TunDevice(name: "roam0", mtu: 1420, addresses: [Prefix("10.77.0.2/24")!], namespace: laptop.namespace)
        let clientThread = Running { client.run(with: tun) }
        defer {
            client.stop()
            server?.stop()
            clientThread.wait()
            serverThread.wait()
        }
        let linkBefore = try laptop.ip("-o link show roam0")
        let addressBefore = try laptop.ip("-o address show dev roam0")

        // 4 MB through the tunnel, with a rebind from eth0 to wifi0 after the first megabyte.
        let total = 4 << 20
        var rebound = false
        let (count, intact) = try sendThroughTunnel(total, from: laptop, to: serverLab) { sent in
            if sent >= 1 << 20 && !rebound {
                let wifi0 = try UDPSocket(bindingTo: SocketAddress(IPAddress("192.168.1.23")!, port: 0), device: "wifi0", namespace: laptop.namespace)
                client.rebind(to: wifi0)
                rebound = true
            }
        }
        #expect(count == total)
        #expect(intact, "every byte arrived in order")
        #expect(client.handshakeCount == 1, "the rebind needed no handshake")
        #expect(client.socket.device == "wifi0")
        #expect(try laptop.ip("-o link show roam0") == linkBefore, "the TUN device is untouched")
        #expect(try laptop.ip("-o address show dev roam0") == addressBefore)
        #expect(try serverLab.ip("-s link show wifi-l").contains("RX"))

        // The server restarts with no sessions: the client's next packet draws the hint, the
        // client handshakes at once, and datagrams sent every 20 ms flow again within a second.
        server?.stop()
        serverThread.wait()
        server = nil  // its TUN device goes with it, once the server thread has let go of it
        for _ in 0..<100 where (try? serverLab.ip("link show roam0")) != nil { usleep(20_000) }
        (server, serverThread) = try startServer(in: serverLab)
        let restartedAt = ContinuousClock.now
        let inner = SocketAddress(IPAddress("10.77.0.1")!, port: 5003)
        let sink = try UDPSocket(bindingTo: inner, namespace: serverLab.namespace)
        let source = try UDPSocket(bindingTo: SocketAddress(IPAddress("10.77.0.2")!, port: 0), namespace: laptop.namespace)
        var arrived: Duration?
        var buffer = [UInt8](repeating: 0, count: 64)
        for _ in 0..<150 where arrived == nil {  // 3 s at most
            _ = try [UInt8](repeating: 7, count: 32).withUnsafeBytes { try source.send($0, to: inner) }
            if try buffer.withUnsafeMutableBytes({ try sink.receive(into: $0, timeout: .milliseconds(20)) }) != nil {
                arrived = ContinuousClock.now - restartedAt
            }
        }
        let recovery = try #require(arrived, "traffic never came back after the restart")
        #expect(recovery < .seconds(1), "traffic back \(recovery) after the restart")
        #expect(client.handshakeCount == 2)
    }
}

extension RuntimeTests {
    /// Full tunnel: everything goes into the tunnel, yet the session's own marked UDP socket
    /// leaves through the physical uplink, and keeps doing so through another after a roam.
    @Test func fullTunnelCarriesEverythingAndSurvivesLosingTheUplink() throws {
        let (laptop, serverLab) = try TunnelLab.laptopAndServer()
        let (server, serverThread) = try startServer(in: serverLab)
        let mode = RoutingMode.full(FullTunnel())
        let endpoint = SocketAddress(IPAddress("198.51.100.7")!, port: 51820)
        let eth0 = try UDPSocket(bindingTo: SocketAddress(IPAddress("10.20.0.57")!, port: 0), device: "eth0",
                                 mark: mode.socketMark, namespace: laptop.namespace)
        let client = try connect(eth0, to: endpoint)
        let tun = try TunDevice(name: "roam0", mtu: 1420, addresses: [Prefix("10.77.0.2/32")!], namespace: laptop.namespace)
        let routes = try TunnelRoutes(mode, device: tun, namespace: laptop.namespace)
        let clientThread = Running { client.run(with: tun) }
        defer {
            client.stop()
            server.stop()
            clientThread.wait()
            serverThread.wait()
            try? routes.remove()
        }
        // The server's outer address is reached through the tunnel too: the default route is the tunnel's.
        #expect(try laptop.ip("route get 198.51.100.7").contains("dev roam0"))
        let listener = try TCP.listen(on: SocketAddress(IPAddress("198.51.100.7")!, port: 5002), in: serverLab)
        defer { listener.close() }
        let first = try TCP.connect(to: SocketAddress(IPAddress("198.51.100.7")!, port: 5002), in: laptop)
        first.close()
        // The data thread publishes its counters after the batch it is on: wait for them (2 s at most).
        for _ in 0..<200 where server.traffic.packetsIn == 0 { usleep(10_000) }
        #expect(server.traffic.packetsIn > 0, "the connection came through the tunnel")

        // eth0 goes down: the marked socket moves to wifi0, with no route added for the server.
        try laptop.ip("link set eth0 down")
        let wifi0 = try UDPSocket(bindingTo: SocketAddress(IPAddress("192.168.1.23")!, port: 0), device: "wifi0",
                                  mark: mode.socketMark, namespace: laptop.namespace)
        client.rebind(to: wifi0)
        let second = try TCP.connect(to: SocketAddress(IPAddress("198.51.100.7")!, port: 5002), in: laptop)
        second.close()
        #expect(client.handshakeCount == 1)
        #expect(!(try laptop.ip("route show table main")).contains("198.51.100.7"), "no host route to strand")
    }
}

extension RuntimeTests {
    /// The session runs over IPv6 just as well: the server listens on both families.
    @Test func sessionOverAnIPv6Uplink() throws {
        try withSession(from: SocketAddress(IPAddress("fd00:20::57")!, port: 0),
                        to: SocketAddress(IPAddress("fd00:20::1")!, port: 51820)) { _, server, laptop, serverLab in
            let listener = try TCP.listen(on: SocketAddress(IPAddress("10.77.0.1")!, port: 5004), in: serverLab)
            defer { listener.close() }
            let connection = try TCP.connect(to: SocketAddress(IPAddress("10.77.0.1")!, port: 5004), in: laptop)
            connection.close()
            // The data thread publishes its counters after the batch it is on: wait for them (2 s at most).
            for _ in 0..<200 where server.traffic.packetsIn == 0 { usleep(10_000) }
            #expect(server.traffic.packetsIn > 0)
        }
    }

    /// Runs `body` with a server and a client whose session is up (from `local` on the laptop's
    /// eth0 to `endpoint`) and whose TUN device is attached; stops both afterwards.
    func withSession(from local: SocketAddress, to endpoint: SocketAddress,
                     _ body: (TunnelClient, TunnelServer, TunnelLab, TunnelLab) throws -> Void) throws {
        let (laptop, serverLab) = try TunnelLab.laptopAndServer()
        let (server, serverThread) = try startServer(in: serverLab)
        let socket = try UDPSocket(bindingTo: local, device: "eth0", namespace: laptop.namespace)
        let client = try connect(socket, to: endpoint)
        let tun = try TunDevice(name: "roam0", mtu: 1420, addresses: [Prefix("10.77.0.2/24")!], namespace: laptop.namespace)
        let clientThread = Running { client.run(with: tun) }
        defer {
            client.stop()
            server.stop()
            clientThread.wait()
            serverThread.wait()
        }
        try body(client, server, laptop, serverLab)
    }
}

extension RuntimeTests {
    /// Off by default, an idle tunnel sends nothing; with an interval, a keepalive reaches the
    /// server after every idle spell of that length; turned off while running, they stop.
    @Test func persistentKeepaliveOnlyWhenAsked() throws {
        try withSession(from: SocketAddress(IPAddress("10.20.0.57")!, port: 0),
                        to: SocketAddress(IPAddress("198.51.100.7")!, port: 51820)) { client, server, _, _ in
            usleep(100_000)
            let confirmed = server.traffic.keepalivesIn  // the handshake's confirmation is one
            usleep(1_000_000)
            #expect(server.traffic.keepalivesIn == confirmed, "no keepalive without the option")

            client.setPersistentKeepalive(.milliseconds(200))
            usleep(1_100_000)
            let kept = server.traffic.keepalivesIn - confirmed
            #expect((3...6).contains(kept), "about one per 200 ms idle, got \(kept)")

            client.setPersistentKeepalive(nil)
            usleep(100_000)
            let stopped = server.traffic.keepalivesIn
            usleep(600_000)
            #expect(server.traffic.keepalivesIn == stopped)
        }
    }
}

extension RuntimeTests {
    /// A packet from one client to another goes into the server's TUN like any other, so the
    /// server host's kernel decides: nothing with forwarding off, delivered with it on, and
    /// stopped again by a drop rule in the host's nftables forward chain.
    @Test func clientToClientTrafficIsForTheHostToAllowOrForbid() throws {
        let (laptop, serverLab) = try TunnelLab.laptopAndServer()
        // Bob's desktop: a third namespace, wired to the server like the laptop's eth0.
        let desktop = try TunnelLab()
        try desktop.attach(to: serverLab, device: "eth0", peer: "eth-d", address: "10.30.0.57", gateway: "10.30.0.1", defaultRoute: false)
        let (server, serverThread) = try startServer(in: serverLab)
        let endpoint = SocketAddress(IPAddress("198.51.100.7")!, port: 51820)
        let alice = try connect(try UDPSocket(bindingTo: SocketAddress(IPAddress("10.20.0.57")!, port: 0), device: "eth0",
                                              namespace: laptop.namespace), to: endpoint)
        let bob = try connect(try UDPSocket(bindingTo: SocketAddress(IPAddress("10.30.0.57")!, port: 0), device: "eth0",
                                            namespace: desktop.namespace), to: SocketAddress(IPAddress("10.30.0.1")!, port: 51820),
                              as: bobKey, address: IPAddress("10.77.0.3")!)
        let aliceTun = try TunDevice(name: "roam0", mtu: 1420, addresses: [Prefix("10.77.0.2/24")!], namespace: laptop.namespace)
        let bobTun = try TunDevice(name: "roam0", mtu: 1420, addresses: [Prefix("10.77.0.3/24")!], namespace: desktop.namespace)
        let aliceThread = Running { alice.run(with: aliceTun) }
        let bobThread = Running { bob.run(with: bobTun) }
        defer {
            alice.stop()
            bob.stop()
            server.stop()
            aliceThread.wait()
            bobThread.wait()
            serverThread.wait()
        }
        let inner = SocketAddress(IPAddress("10.77.0.3")!, port: 5005)
        let sink = try UDPSocket(bindingTo: inner, namespace: desktop.namespace)
        let source = try UDPSocket(bindingTo: SocketAddress(IPAddress("10.77.0.2")!, port: 0), namespace: laptop.namespace)
        /// Whether a datagram from alice reaches bob within a second, tagged so none from an
        /// earlier step counts.
        func reachesBob(_ tag: UInt8) throws -> Bool {
            var buffer = [UInt8](repeating: 0, count: 64)
            for _ in 0..<25 {
                _ = try [UInt8](repeating: tag, count: 16).withUnsafeBytes { try source.send($0, to: inner) }
                for _ in 0..<8 {
                    guard let n = try buffer.withUnsafeMutableBytes({ try sink.receive(into: $0, timeout: .milliseconds(40)) })?.length
                    else { break }
                    if n == 16 && buffer[0] == tag { return true }
                }
            }
            return false
        }
        func inServer(_ command: String) throws {
            let (status, output) = try NamespaceLab.capture(NamespaceLab.ipTool, ["netns", "exec", serverLab.name, "/bin/sh", "-c", command])
            try #require(status == 0, "\(command): \(output)")
        }

        try inServer("echo 0 > /proc/sys/net/ipv4/ip_forward")
        #expect(try !reachesBob(1), "with forwarding off the server's kernel drops it")
        #expect(server.traffic.packetsIn > 0, "alice's datagrams did reach the server")
        try inServer("echo 1 > /proc/sys/net/ipv4/ip_forward")
        #expect(try reachesBob(2), "with forwarding on the kernel routes it back out of the TUN to bob")
        try inServer("nft add table inet roamtest && nft add chain inet roamtest forward '{ type filter hook forward priority 0; }' "
            + "&& nft add rule inet roamtest forward iifname roam0 oifname roam0 drop")
        #expect(try !reachesBob(3), "the host's firewall forbids it")
    }
}

/// Runs nft in `lab`'s namespace with `arguments` (a failure is thrown, with nft's words).
private func nft(_ lab: NamespaceLab, _ arguments: String) throws { try lab.nft(arguments) }

/// Tells a client that its stream opened or broke, once the client exists.
private final class StreamHook: Sendable {
    let client = Mutex<TunnelClient?>(nil)
    let events = Mutex<[StreamCarrier.Event]>([])
    func told(_ carrier: StreamCarrier, _ event: StreamCarrier.Event) {
        events.withLock { $0.append(event) }
        client.withLock { $0 }?.carriersChanged()
    }
}

extension RuntimeTests {
    /// The gateway at 198.51.100.7 with UDP on 51820 and the stream transport on 443.
    private func startServerWithStreams(in lab: TunnelLab, limits: StreamLimits = StreamLimits()) throws -> (TunnelServer, Running) {
        let tun = try TunDevice(name: "roam0", mtu: 1420, addresses: [Prefix("10.77.0.1/24")!], namespace: lab.namespace)
        let sockets = [try UDPSocket(bindingTo: SocketAddress(.v4(0), port: 51820), namespace: lab.namespace)]
        let streams = try StreamListener(on: [SocketAddress(.v4(0), port: 443)], context: try .server(name: "vpn.example.net"),
                                         namespace: lab.namespace)
        let server = TunnelServer(core: try ServerCore(privateKey: serverKey, users: users), device: tun, workers: [sockets],
                                  streams: streams, streamLimits: limits, logger: quiet)
        return (server, Running { server.run() })
    }

    /// A network that drops UDP: the session comes up over TLS on port 443, a TCP stream through
    /// the tunnel flows, the session moves to UDP once UDP flows again and back onto a new stream
    /// when it is blocked again, with no handshake for either move and every byte in order.
    @Test func aSessionRunsOverTheStreamAndMovesToUDPAndBackWithNoHandshake() throws {
        let (laptop, serverLab) = try TunnelLab.laptopAndServer()
        let (server, serverThread) = try startServerWithStreams(in: serverLab)
        try nft(serverLab, "add table inet block")
        try nft(serverLab, "add chain inet block input { type filter hook input priority 0 ; }")
        try nft(serverLab, "add rule inet block input udp dport 51820 counter drop")
        let gateway = SocketAddress(IPAddress("198.51.100.7")!, port: 51820)
        let hook = StreamHook()
        let stream = StreamCarrier.open(to: SocketAddress(gateway.ip, port: 443), as: gateway, from: IPAddress("10.20.0.57")!, device: "eth0",
                                        mark: nil, proxy: nil, context: try .client(serverName: "vpn.example.net"),
                                        namespace: laptop.namespace, told: hook.told)
        let client = try connect(stream, to: gateway)
        hook.client.withLock { $0 = client }
        #expect(hook.events.withLock { $0 } == [.opened])
        let tun = try TunDevice(name: "roam0", mtu: 1380, addresses: [Prefix("10.77.0.2/24")!], namespace: laptop.namespace)
        let clientThread = Running { client.run(with: tun) }
        defer {
            client.stop()
            server.stop()
            clientThread.wait()
            serverThread.wait()
        }
        #expect(server.streamCounts.accepted == 1)

        let total = 6 << 20
        var moves = 0
        let (count, intact) = try sendThroughTunnel(total, from: laptop, to: serverLab) { sent in
            if sent >= 2 << 20 && moves == 0 {
                // UDP flows again: the session moves onto a UDP socket on wifi0.
                try nft(serverLab, "flush chain inet block input")
                let wifi0 = try UDPSocket(bindingTo: SocketAddress(IPAddress("192.168.1.23")!, port: 0), device: "wifi0",
                                          namespace: laptop.namespace)
                client.rebind(to: wifi0)
                moves = 1
            } else if sent >= 4 << 20 && moves == 1 {
                // Blocked again: onto a new stream on eth0.
                try nft(serverLab, "add rule inet block input udp dport 51820 counter drop")
                let again = StreamCarrier.open(to: SocketAddress(gateway.ip, port: 443), as: gateway, from: IPAddress("10.20.0.57")!,
                                               device: "eth0", mark: nil, proxy: nil,
                                               context: try .client(serverName: "vpn.example.net"),
                                               namespace: laptop.namespace, told: hook.told)
                client.rebind(to: again)
                moves = 2
            }
        }
        #expect(count == total)
        #expect(intact, "every byte arrived in order")
        #expect(client.handshakeCount == 1, "neither move needed a handshake")
        #expect(server.streamCounts.accepted == 2)
        #expect(hook.events.withLock { $0 } == [.opened, .opened])
        #expect(client.socket.label.hasPrefix("TLS to 198.51.100.7:443"))
    }

    /// Streams that carry no session keep nothing: garbage frames do not keep one open, one that
    /// never proves itself is closed after `provenWithin`, and a network gets no more open
    /// streams than its share, while a real client still connects beside them.
    @Test func streamsThatCarryNoSessionAreClosedAndCapped() throws {
        let (laptop, serverLab) = try TunnelLab.laptopAndServer()
        var limits = StreamLimits(connectionsPerNetwork: 3, provenWithin: .seconds(1))
        limits.acceptsPerNetwork = .init(perSecond: 100, burst: 100)
        let (server, serverThread) = try startServerWithStreams(in: serverLab, limits: limits)
        defer {
            server.stop()
            serverThread.wait()
        }
        let gateway = SocketAddress(IPAddress("198.51.100.7")!, port: 443)
        let context = try TLSContext.client(serverName: "vpn.example.net")
        let hook = StreamHook()
        // Four from one network (eth0's /24): three are taken.
        let squatters = (0..<4).map { _ in
            StreamCarrier.open(to: gateway, from: IPAddress("10.20.0.57")!, device: "eth0", mark: nil, proxy: nil,
                               context: context, namespace: laptop.namespace, told: hook.told)
        }
        for _ in 0..<300 where hook.events.withLock({ $0.count }) < 4 { usleep(10_000) }
        usleep(200_000)
        #expect(server.streamCounts.open == 3 && server.streamCounts.accepted == 3, "\(server.streamCounts)")
        // Garbage every 200 ms: no session's message, so it keeps nothing alive.
        let junk: [UInt8] = [2, 3, 0, 0] + [UInt8](repeating: 0x5A, count: 60)
        for _ in 0..<10 {
            for squatter in squatters { _ = try junk.withUnsafeBytes { try squatter.send($0, to: gateway) } }
            usleep(200_000)
        }
        #expect(server.streamCounts.open == 0, "streams with no session closed after 1 s: \(server.streamCounts)")
        // A real client from another network is served.
        let client = try connect(StreamCarrier.open(to: gateway, as: SocketAddress(gateway.ip, port: 51820),
                                                    from: IPAddress("192.168.1.23")!, device: "wifi0", mark: nil, proxy: nil,
                                                    context: context, namespace: laptop.namespace, told: hook.told),
                                 to: SocketAddress(gateway.ip, port: 51820))
        for _ in 0..<100 where server.liveSessions == 0 { usleep(10_000) }
        #expect(client.handshakeCount == 1 && server.liveSessions == 1)
        usleep(1_500_000)
        #expect(server.streamCounts.open == 1, "the stream that carried a handshake stays: \(server.streamCounts)")
    }

    /// One gateway, two clients at once: alice over the stream, bob over UDP, then each moves to
    /// the other's transport (alice to UDP on wifi0, bob onto a stream on eth0); every datagram
    /// sent through the tunnel by either arrives, and neither move needs a handshake.
    @Test func aGatewayServesStreamAndUDPClientsAtOnceAsBothRoam() throws {
        let (laptop, serverLab) = try TunnelLab.laptopAndServer()
        let (server, serverThread) = try startServerWithStreams(in: serverLab)
        let gateway = SocketAddress(IPAddress("198.51.100.7")!, port: 51820)
        let hook = StreamHook()
        func stream(on device: String, from source: String) throws -> StreamCarrier {
            StreamCarrier.open(to: SocketAddress(gateway.ip, port: 443), as: gateway, from: IPAddress(source)!, device: device,
                               mark: nil, proxy: nil, context: try .client(serverName: "vpn.example.net"),
                               namespace: laptop.namespace, told: hook.told)
        }
        let alice = try connect(try stream(on: "eth0", from: "10.20.0.57"), to: gateway)
        let bob = try connect(try UDPSocket(bindingTo: SocketAddress(IPAddress("192.168.1.23")!, port: 0), device: "wifi0",
                                            namespace: laptop.namespace),
                              to: gateway, as: bobKey, address: IPAddress("10.77.0.3")!)
        hook.client.withLock { $0 = alice }
        // Two tunnel devices in the laptop, one per client, each with its own route to the gateway.
        let aliceTun = try TunDevice(name: "roam0", mtu: 1380, addresses: [Prefix("10.77.0.2/32")!], namespace: laptop.namespace)
        let bobTun = try TunDevice(name: "roam1", mtu: 1380, addresses: [Prefix("10.77.0.3/32")!], namespace: laptop.namespace)
        try laptop.ip("route add 10.77.0.1/32 dev roam0 metric 5")
        try laptop.ip("route add 10.77.0.1/32 dev roam1 metric 6")
        let aliceThread = Running { alice.run(with: aliceTun) }
        let bobThread = Running { bob.run(with: bobTun) }
        defer {
            alice.stop()
            bob.stop()
            server.stop()
            aliceThread.wait()
            bobThread.wait()
            serverThread.wait()
        }
        let sink = try UDPSocket(bindingTo: SocketAddress(IPAddress("10.77.0.1")!, port: 4001), namespace: serverLab.namespace)
        let senders = [try UDPSocket(bindingTo: SocketAddress(IPAddress("10.77.0.2")!, port: 0), device: "roam0", namespace: laptop.namespace),
                       try UDPSocket(bindingTo: SocketAddress(IPAddress("10.77.0.3")!, port: 0), device: "roam1", namespace: laptop.namespace)]
        /// Datagrams from both clients through the tunnel, `rounds` each: how many were sent and arrived.
        func exchange(_ rounds: Int) throws -> (sent: Int, arrived: Int) {
            var arrived = 0
            var buffer = [UInt8](repeating: 0, count: 256)
            for i in 0..<rounds {
                for sender in senders {
                    _ = try [UInt8](repeating: UInt8(i & 0xFF), count: 64).withUnsafeBytes { try sender.send($0, to: sink.local) }
                }
                while try buffer.withUnsafeMutableBytes({ try sink.receive(into: $0, timeout: .milliseconds(5)) }) != nil { arrived += 1 }
            }
            for _ in 0..<50 {
                guard try buffer.withUnsafeMutableBytes({ try sink.receive(into: $0, timeout: .milliseconds(20)) }) != nil else { break }
                arrived += 1
            }
            return (rounds * senders.count, arrived)
        }
        let first = try exchange(100)
        #expect(first.arrived == first.sent, "before the moves: \(first.arrived) of \(first.sent)")
        #expect(server.sessionsOnStreams == 1 && server.liveSessions == 2)

        alice.rebind(to: try UDPSocket(bindingTo: SocketAddress(IPAddress("192.168.1.23")!, port: 0), device: "wifi0",
                                       namespace: laptop.namespace))
        let bobStream = try stream(on: "eth0", from: "10.20.0.57")
        hook.client.withLock { $0 = bob }
        bob.rebind(to: bobStream)
        for _ in 0..<200 where !bobStream.isOpen { usleep(10_000) }
        let second = try exchange(100)
        #expect(second.arrived == second.sent, "after the moves: \(second.arrived) of \(second.sent)")
        #expect(server.sessionsOnStreams == 1 && server.liveSessions == 2)
        #expect(alice.handshakeCount == 1 && bob.handshakeCount == 1, "no move needed a handshake")
        #expect(server.streamCounts.accepted == 2)
    }
}

/// Writes `total` bytes of `TCPStream`'s pattern over TCP from `laptop` to 10.77.0.1:5001 in
/// `serverLab`, through the tunnel, calling `before` with the count sent before each 32 KB; returns
/// how many bytes arrived and whether each was where it belonged.
private func sendThroughTunnel(_ total: Int, from laptop: TunnelLab, to serverLab: TunnelLab,
                               before: (Int) throws -> Void) throws -> (Int, Bool) {
    let listener = try TCP.listen(on: SocketAddress(IPAddress("10.77.0.1")!, port: 5001), in: serverLab)
    defer { listener.close() }
    let sender = try TCP.connect(to: SocketAddress(IPAddress("10.77.0.1")!, port: 5001), in: laptop)
    defer { sender.close() }
    let receiver = try listener.accept()
    defer { receiver.close() }
    let received = Mutex2()
    let reader = Running {
        var buffer = [UInt8](repeating: 0, count: 65536)
        var offset = 0
        var intact = true
        while offset < total {
            let n = read(receiver.fd, &buffer, buffer.count)
            if n <= 0 { break }
            for i in 0..<n where buffer[i] != TCPStream.byte(offset + i) { intact = false }
            offset += n
        }
        received.set(offset, intact)
    }
    var sent = 0
    var chunk = [UInt8](repeating: 0, count: 32768)
    while sent < total {
        try before(sent)
        for i in 0..<chunk.count { chunk[i] = TCPStream.byte(sent + i) }
        let n = write(sender.fd, chunk, min(chunk.count, total - sent))
        try #require(n > 0, "send failed after \(sent) bytes: errno \(errno)")
        sent += n
    }
    reader.wait()
    return received.get()
}

private final class Mutex2: Sendable {
    private let value = Mutex((0, false))
    func set(_ count: Int, _ intact: Bool) { value.withLock { $0 = (count, intact) } }
    func get() -> (Int, Bool) { value.withLock { $0 } }
}

/// The data plane's log lines are not what these tests look at.
let quiet = Logger(label: "test") { _ in SwiftLogNoOpLogHandler() }
