import Topology
import Foundation
import Glibc
import Synchronization
import Basics
public import Device
import Netlink

/// A host that a forged answer for the server's name points the laptop at (TunnelCrack's
/// "ServerIP"): it answers whatever comes to its UDP port as a VPN server might seem to (a
/// handshake response of random bytes for the initiation's index, a "session unknown" for it,
/// and the datagram echoed), and keeps who sent it what, on a thread of its own until `stop()`.
public final class ImpostorServer: @unchecked Sendable {  // every mutable field is read and written under `lock`
    private let running = Atomic<Bool>(true)
    private let done = DispatchGroup()
    private let lock = NSLock()
    private var heard: [(peer: SocketAddress, bytes: [UInt8])] = []

    public init(at address: SocketAddress, in lab: NamespaceLab) throws {
        let socket = try UDPSocket(bindingTo: address, namespace: lab.namespace)
        done.enter()
        Thread { [self] in
            var random = SystemRandomNumberGenerator()
            while running.load(ordering: .relaxed) {
                guard let (datagram, peer) = (try? socket.receive(timeout: .milliseconds(100))) ?? nil else { continue }
                lock.withLock { heard.append((peer, datagram)) }
                // An initiation (version 2, type 1; version 3's first part, type 1) carries the
                // client's index at 4..<8: a made-up response of the right length, and a hint.
                if datagram.count >= 8, [2, 3].contains(datagram[0]), datagram[1] == 1 {
                    let version = datagram[0]
                    let index = Array(datagram[4..<8])
                    let response = [version, 2, 0, 0] + (0..<4).map { _ in UInt8.random(in: 0...255, using: &random) } + index
                        + (0..<(version == 2 ? 70 : 1152)).map { _ in UInt8.random(in: 0...255, using: &random) }
                    _ = try? socket.send(response, to: peer)
                    _ = try? socket.send([version, 4, 0, 0] + index, to: peer)
                }
                _ = try? socket.send(datagram, to: peer)
            }
            done.leave()
        }.start()
    }

    /// The datagrams received so far, with their senders.
    public var received: [(peer: SocketAddress, bytes: [UInt8])] { lock.withLock { heard } }

    public func stop() {
        running.store(false, ordering: .relaxed)
        _ = done.wait(timeout: .now() + 2)
    }

    deinit { stop() }
}

/// Named nftables counters in a lab's namespace (table `inet watch`), each counting the packets
/// that match its rule as they arrive there (prerouting, before anything else), in the order
/// given: a packet is counted by the first rule it matches only.
public final class RouterCounters {
    private let lab: NamespaceLab

    /// `rules`: a counter's name and its match, e.g. `("clear", "iifname \"eth-l\" ip daddr 203.0.113.80")`.
    public init(in lab: NamespaceLab, _ rules: [(name: String, match: String)]) throws {
        self.lab = lab
        let text = "table inet watch {\n" + rules.map { "    counter \($0.name) {}\n" }.joined()
            + "    chain arriving {\n        type filter hook prerouting priority -300; policy accept;\n"
            + rules.map { "        \($0.match) counter name \($0.name) accept\n" }.joined() + "    }\n}\n"
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("watch-\(lab.name).nft").path
        try text.write(toFile: file, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: file) }
        let (status, output) = try NamespaceLab.capture(NamespaceLab.ipTool, ["netns", "exec", lab.name, "nft", "-f", file])
        guard status == 0 else { throw NamespaceLab.Failure(description: "nft in \(lab.name): \(output)\n\(text)") }
    }

    /// The packets each counter holds now; nil when the table cannot be read.
    public func packets() -> [String: Int]? {
        guard let (status, text) = try? NamespaceLab.capture(NamespaceLab.ipTool,
                  ["netns", "exec", lab.name, "nft", "list", "counters", "table", "inet", "watch"]), status == 0 else { return nil }
        var counts: [String: Int] = [:]
        for chunk in text.components(separatedBy: "counter ").dropFirst() {
            let words = chunk.split(whereSeparator: \.isWhitespace)
            guard let name = words.first, let at = words.firstIndex(of: "packets"), at + 1 < words.count,
                  let n = Int(words[at + 1]) else { continue }
            counts[String(name)] = n
        }
        return counts
    }
}

extension NamespaceLab {
    /// Whether a TCP connection from this namespace to `peer` is accepted within `seconds`: from
    /// a socket bound to `device` and carrying `mark`, when given (an ordinary process may bind
    /// to an interface; one with CAP_NET_RAW may set a mark).
    public func tcpConnects(to peer: SocketAddress, device: String? = nil, mark: UInt32? = nil, seconds: Int32 = 1) -> Bool {
        guard let fd = try? namespace.run({ () throws(NetlinkError) -> Int32 in
            socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
        }), fd >= 0 else { return false }
        defer { close(fd) }
        if let device { _ = setsockopt(fd, SOL_SOCKET, SO_BINDTODEVICE, device, socklen_t(device.utf8.count)) }
        if var mark { _ = setsockopt(fd, SOL_SOCKET, SO_MARK, &mark, socklen_t(MemoryLayout<UInt32>.size)) }
        var address = TCPStream.sockaddr(peer)
        let started = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard started == 0 || errno == EINPROGRESS else { return false }
        var waiting = pollfd(fd: fd, events: Int16(POLLOUT), revents: 0)
        guard poll(&waiting, 1, seconds * 1000) == 1 else { return false }
        var failure: Int32 = 0
        var length = socklen_t(MemoryLayout<Int32>.size)
        return getsockopt(fd, SOL_SOCKET, SO_ERROR, &failure, &length) == 0 && failure == 0
    }
}
