import Topology
import Foundation
import Glibc
import Synchronization
import Basics
public import Device
import Netlink
import Streams

/// An HTTP proxy that answers `CONNECT address:port` and relays both ways, as a network that lets
/// out nothing but its proxy has one; inside a lab namespace. With `credentials`, a request
/// without the matching `Proxy-Authorization: Basic` is answered 407. Every loop is bounded by
/// `stop()`; each connection ends when either side closes.
public final class ConnectProxy: Sendable {
    public let address: SocketAddress
    private let listener: TCPListener
    private let running = Atomic<Bool>(true)
    private let opened = Atomic<Int>(0)
    private let refused = Atomic<Int>(0)
    private let namespace: NetworkNamespace

    public init(on address: SocketAddress, in lab: NamespaceLab, credentials: (user: String, password: String)? = nil) throws {
        listener = try TCPListener(bindingTo: address, namespace: lab.namespace)
        self.address = listener.local
        namespace = lab.namespace
        let expected = credentials.map { "Proxy-Authorization: Basic " + HTTPProxy.base64(Array("\($0.user):\($0.password)".utf8)) }
        Thread { [self] in
            while running.load(ordering: .relaxed) {
                guard let connection = try? listener.accept(timeout: .milliseconds(100)) else { continue }
                let handed = Handed(connection: connection)
                Thread { [self] in serve(handed.connection, expecting: expected) }.start()
            }
        }.start()
    }

    /// Tunnels opened, and requests refused (407 or a target it could not reach).
    public var counts: (opened: Int, refused: Int) { (opened.load(ordering: .relaxed), refused.load(ordering: .relaxed)) }

    public func stop() { running.store(false, ordering: .relaxed) }

    private func serve(_ client: TCPConnection, expecting expected: String?) {
        guard let request = try? client.read(until: Array("\r\n\r\n".utf8), limit: 8192, deadline: .now + .seconds(5)) else { return }
        let text = String(decoding: request, as: UTF8.self)
        let words = text.split(separator: "\r\n").first?.split(separator: " ") ?? []
        func answer(_ status: String) { _ = try? client.write(Array("HTTP/1.1 \(status)\r\n\r\n".utf8), deadline: .now + .seconds(1)) }
        if let expected, !text.contains(expected + "\r\n") {
            refused.add(1, ordering: .relaxed)
            return answer("407 Proxy Authentication Required")
        }
        guard words.count == 3, words[0] == "CONNECT", let target = Endpoint(String(words[1])).flatMap(SocketAddress.init),
              let upstream = try? TCPConnection.connect(to: target, namespace: namespace, deadline: .now + .seconds(3))
        else {
            refused.add(1, ordering: .relaxed)
            return answer("502 Bad Gateway")
        }
        answer("200 Connection established")
        opened.add(1, ordering: .relaxed)
        relay(client, upstream)
    }

    /// Copies what either side sends to the other until one closes or the proxy stops.
    private func relay(_ a: TCPConnection, _ b: TCPConnection) {
        var buffer = [UInt8](repeating: 0, count: 65_536)
        while running.load(ordering: .relaxed) {
            var fds = [pollfd(fd: a.fileDescriptor, events: Int16(POLLIN), revents: 0),
                       pollfd(fd: b.fileDescriptor, events: Int16(POLLIN), revents: 0)]
            guard poll(&fds, 2, 100) >= 0 else { return }
            for (from, to, entry) in [(a, b, fds[0]), (b, a, fds[1])] where entry.revents != 0 {
                let n = buffer.withUnsafeMutableBytes { read(from.fileDescriptor, $0.baseAddress, $0.count) }
                if n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR) { return }
                if n > 0, (try? to.write(Array(buffer[0..<n]), deadline: .now + .seconds(5))) != true { return }
            }
        }
    }
}

/// A connection on its way to the one thread that serves it.
private struct Handed: @unchecked Sendable {  // moved to one thread, never shared
    let connection: TCPConnection
}

/// A TLS server where the gateway's stream would be that is not the gateway: a network that
/// intercepts TLS and answers itself. It completes TLS (with a certificate of its own), reads
/// the frames the client sends, counts them and answers nothing.
public final class TLSImpostor: Sendable {
    private let listener: StreamListener
    private let running = Atomic<Bool>(true)
    private let frames = Atomic<Int>(0)

    public init(on address: SocketAddress, in lab: NamespaceLab) throws {
        listener = try StreamListener(on: [address], context: try TLSContext.server(name: "intercepted.example"),
                                      namespace: lab.namespace)
        Thread { [self] in
            var streams: [GatewayStream] = []
            var buffer = [UInt8](repeating: 0, count: 65_536)
            while running.load(ordering: .relaxed) {
                if let stream = try? listener.accept(on: listener.sockets[0], now: .now()) { streams.append(stream) }
                for stream in streams {
                    for _ in 0..<16 {
                        guard case .messages(let length, let segment) = buffer.withUnsafeMutableBytes({ stream.advance(into: $0, now: .now()) })
                        else { break }
                        frames.add((length + segment - 1) / segment, ordering: .relaxed)
                    }
                }
                usleep(10_000)
            }
        }.start()
    }

    /// Messages the client sent it.
    public var framesRead: Int { frames.load(ordering: .relaxed) }

    public func stop() { running.store(false, ordering: .relaxed) }
}
