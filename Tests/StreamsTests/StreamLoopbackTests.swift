import Basics
import Device
import Glibc
import Synchronization
import Testing
@testable import Streams

/// What a stream told, in order.
private final class Told: Sendable {
    let events = Mutex<[StreamCarrier.Event]>([])
    func add(_ carrier: StreamCarrier, _ event: StreamCarrier.Event) { events.withLock { $0.append(event) } }

    /// The first event, waiting up to 5 s.
    func first() -> StreamCarrier.Event? {
        for _ in 0..<500 {
            if let event = events.withLock({ $0.first }) { return event }
            usleep(10_000)
        }
        return nil
    }
}

private let loopback = SocketAddress(IPAddress("127.0.0.1")!, port: 0)

/// A gateway's side on loopback: accepts one stream and moves it on until `until` says stop.
private func gatewaySide(_ listener: StreamListener, until done: ([UInt8]) -> Bool) throws -> GatewayStream? {
    var stream: GatewayStream?
    var buffer = [UInt8](repeating: 0, count: 65_536)
    for _ in 0..<500 {
        if stream == nil { stream = try listener.accept(on: listener.sockets[0], now: .now()) }
        if let stream {
            switch buffer.withUnsafeMutableBytes({ stream.advance(into: $0, now: .now()) }) {
            case .messages(let n, let segment):
                for start in stride(from: 0, to: n, by: segment) where done(Array(buffer[start..<min(start + segment, n)])) { return stream }
            case .closed(let why): Issue.record("the stream closed: \(why)"); return nil
            case .waiting: usleep(10_000)
            }
        } else {
            usleep(10_000)
        }
    }
    return nil
}

@Test func messagesGoBothWaysOverTLS() throws {
    let listener = try StreamListener(on: [loopback], context: try .server(name: "vpn.example.net"))
    let told = Told()
    let carrier = StreamCarrier.open(to: listener.sockets[0].local, from: nil, device: nil, mark: nil, proxy: nil,
                                     context: try .client(serverName: "vpn.example.net"), told: told.add)
    // Sent before the stream is open: kept, and sent first once it is.
    let early: [UInt8] = [2, 1, 0, 0] + [UInt8](repeating: 7, count: 100)
    #expect(try early.withUnsafeBytes { try carrier.send($0, to: loopback) })
    var received: [[UInt8]] = []
    let big = [UInt8](repeating: 0xEE, count: 65_535)
    let stream = try #require(try gatewaySide(listener) { message in
        received.append(message)
        if received.count == 1 { _ = big.withUnsafeBytes { try? carrier.send($0, to: loopback) } }
        return received.count == 2
    }, "received \(received.map(\.count)), told \(told.events.withLock { $0 }), dropped \(carrier.drops)")
    #expect(told.first() == .opened)
    // A browser's first choice, not libssl's (AES-256-GCM).
    #expect(carrier.suite == "TLS_AES_128_GCM_SHA256")
    #expect(received == [early, big])
    #expect(carrier.pollDescriptor != nil)

    // And back: what the gateway sends comes out whole at the client.
    // Mostly one size, some shorter: a joined run ends with its one shorter message.
    let answers = (1...40).map { [2, 3, 0, 0] + [UInt8](repeating: UInt8($0), count: $0 % 7 == 0 ? 600 : 1_400) }
    let sent = answers.withUnsafeBufferPointers { stream.send($0) }
    #expect(sent == answers.count)
    var buffer = [UInt8](repeating: 0, count: 65_536)
    var got: [[UInt8]] = []
    var runs = 0
    for _ in 0..<500 where got.count < answers.count {
        if let (n, peer, segment) = try buffer.withUnsafeMutableBytes({ try carrier.receiveJoined(into: $0, timeout: .milliseconds(10)) }) {
            #expect(peer == carrier.peer && peer == carrier.gateway)
            // Messages of one length that had all arrived come joined, as GRO joins datagrams.
            runs += 1
            for start in stride(from: 0, to: n, by: segment) { got.append(Array(buffer[start..<min(start + segment, n)])) }
        }
    }
    #expect(got == answers)
    #expect(runs < answers.count)
}

@Test func aGatewayThatIsNotListeningFailsTheStreamWithTheReason() throws {
    // A port nobody listens on: bound, never listening.
    let unused = try TCPListener(bindingTo: loopback)
    let port = unused.local.port
    _ = consume unused
    let told = Told()
    _ = StreamCarrier.open(to: SocketAddress(IPAddress("127.0.0.1")!, port: port), from: nil, device: nil, mark: nil,
                           proxy: nil, context: try .client(serverName: nil), told: told.add)
    guard case .failed(let why)? = told.first() else { Issue.record("no failure told"); return }
    #expect(why.contains("refused"), "\(why)")
}

@Test func somethingThatDoesNotSpeakTLSFailsTheHandshake() throws {
    let plain = try TCPListener(bindingTo: loopback)
    let told = Told()
    let carrier = StreamCarrier.open(to: plain.local, from: nil, device: nil, mark: nil, proxy: nil,
                                     context: try .client(serverName: "vpn.example.net"), told: told.add)
    var connection: TCPConnection?
    for _ in 0..<200 where connection == nil {
        connection = try plain.accept(timeout: .milliseconds(20))
    }
    let accepted = try #require(connection)
    _ = try accepted.write(Array("HTTP/1.1 400 Bad Request\r\n\r\n".utf8), deadline: .now + .seconds(1))
    guard case .failed(let why)? = told.first() else { Issue.record("no failure told"); return }
    #expect(why.contains("TLS"), "\(why)")
    #expect(carrier.pollDescriptor == nil)
    let message: [UInt8] = [2, 3, 0, 0]
    #expect(try message.withUnsafeBytes { try carrier.send($0, to: loopback) } == false, "nothing goes on a failed stream")
}

@Test func aProxyThatWantsCredentialsItWasNotGivenFailsTheStream() throws {
    let proxyListener = try TCPListener(bindingTo: loopback)
    let told = Told()
    let proxy = HTTPProxy(address: proxyListener.local)
    // The CONNECT names the gateway's own name when it has one, never the SNI name (a cover).
    _ = StreamCarrier.open(to: SocketAddress(IPAddress("192.0.2.1")!, port: 443), host: "vpn.example.net", from: nil, device: nil,
                           mark: nil, proxy: proxy, context: try .client(serverName: "www.example.com"), told: told.add)
    var connection: TCPConnection?
    for _ in 0..<200 where connection == nil {
        connection = try proxyListener.accept(timeout: .milliseconds(20))
    }
    let accepted = try #require(connection)
    let request = try accepted.read(until: Array("\r\n\r\n".utf8), limit: 4096, deadline: .now + .seconds(2))
    #expect(String(decoding: request, as: UTF8.self).hasPrefix("CONNECT vpn.example.net:443 HTTP/1.1\r\n"))
    _ = try accepted.write(Array("HTTP/1.1 407 Proxy Authentication Required\r\n\r\n".utf8), deadline: .now + .seconds(1))
    guard case .failed(let why)? = told.first() else { Issue.record("no failure told"); return }
    #expect(why.contains("asks for credentials"), "\(why)")
}
