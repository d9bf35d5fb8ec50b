import Foundation
import Glibc
public import Basics
import Synchronization
public import Tunnel
public import Device

/// A handshake flood from addresses that really receive: one UDP socket per address in a
/// flooder namespace, each with a client core of a random key that answers every cookie reply
/// (so its initiations carry the proof of address, as a determined flooder's would), sending
/// in turn at `rate` a second until `stop()`. Each initiation is sent again and again once it
/// holds its cookie: every one the server admits costs it the Diffie-Hellman and a refusal.
public final class CookieFlood: @unchecked Sendable {  // `cores` and `initiations` are guarded by `lock`; the rest is set once
    public let rate: Int
    private let server: SocketAddress
    private let sockets: [UDPSocket]
    private let lock = NSLock()
    private var cores: [ClientCore]
    private var initiations: [[UInt8]]
    private let running = Atomic<Bool>(true)
    private let sent = Atomic<Int>(0)
    private let cookies = Atomic<Int>(0)
    private let refusals = Atomic<Int>(0)
    private var threads: [OSThread] = []
    public private(set) var startedAt = LabClock.now

    /// Starts at once, from `addresses` (each on `lab`'s interfaces) to `server`, whose key is `serverKey`.
    public init(from addresses: [IPAddress], in lab: NamespaceLab, to server: SocketAddress, serverKey: PublicKey, rate: Int) throws {
        self.rate = rate
        self.server = server
        sockets = try addresses.map { try UDPSocket(bindingTo: SocketAddress($0, port: 0), namespace: lab.namespace) }
        var cores = try addresses.map { _ in try ClientCore(privateKey: .generate(), serverKey: serverKey) }
        var initiations: [[UInt8]] = []
        for i in cores.indices { initiations.append(try cores[i].initiate(now: .now(), wallClock: .now())) }
        self.cores = cores
        self.initiations = initiations
        startedAt = LabClock.now
        threads.append(try OSThread { [self] in send() })
        threads.append(try OSThread { [self] in answer() })
    }

    /// Initiations sent so far.
    public var count: Int { sent.load(ordering: .relaxed) }
    /// Cookie replies answered: from then on that source's initiations carry the proof.
    public var cookiesAnswered: Int { cookies.load(ordering: .relaxed) }
    /// Refusals received: initiations the server let through to Diffie-Hellman.
    public var refused: Int { refusals.load(ordering: .relaxed) }

    public func stop() {
        guard running.exchange(false, ordering: .relaxed) else { return }
        for thread in threads { thread.join() }
    }

    deinit { stop() }

    private func send() {
        var n = 0
        while running.load(ordering: .relaxed) {
            let due = Int(Double((LabClock.now - startedAt).nanoseconds) / 1e9 * Double(rate))
            while n < due, running.load(ordering: .relaxed) {
                let i = n % sockets.count
                let initiation = lock.withLock { initiations[i] }
                _ = try? initiation.withUnsafeBytes { try sockets[i].send($0, to: server) }
                n += 1
            }
            sent.store(n, ordering: .relaxed)
            usleep(1000)
        }
    }

    /// Takes each cookie for the source it came to; after a refusal (the handshake is over, so a
    /// later cookie could not be answered) the source starts a fresh one.
    private func answer() {
        var buffer = [UInt8](repeating: 0, count: 2048)
        let descriptors = sockets.map(\.fileDescriptor)
        while running.load(ordering: .relaxed) {
            guard let ready = try? pollReadable(descriptors, timeout: .milliseconds(50)) else { continue }
            for (i, socket) in sockets.enumerated() where ready.contains(socket.fileDescriptor) {
                while let (length, _) = (try? buffer.withUnsafeMutableBytes({ try socket.receive(into: $0, timeout: .zero) })) ?? nil {
                    var datagram = Array(buffer[0..<length])
                    // A response (type 2): a refusal, whether or not the core still has its handshake.
                    if length > 1, buffer[1] == 2 { refusals.add(1, ordering: .relaxed) }
                    lock.withLock {
                        switch cores[i].receive(&datagram, now: .now()) {
                        case .cookie(let resend):
                            initiations[i] = resend
                            cookies.add(1, ordering: .relaxed)
                        case .rejected: break
                        default:
                            // A cookie for a handshake that ended: start another, to be proven anew.
                            if datagram.count > 1, datagram[1] == 5, let fresh = try? cores[i].initiate(now: .now(), wallClock: .now()) {
                                initiations[i] = fresh
                            }
                        }
                    }
                }
            }
        }
    }
}

/// A user's client that handshakes on demand from one socket, as a client rekeying does: it
/// answers a cookie reply and confirms the session, so its address is the session's endpoint.
public final class Rekeyer: @unchecked Sendable {  // used from one thread at a time
    private var core: ClientCore
    private let socket: UDPSocket
    private let server: SocketAddress

    public init(key: PrivateKey, serverKey: PublicKey, from address: IPAddress, in lab: NamespaceLab, to server: SocketAddress) throws {
        core = try ClientCore(privateKey: key, serverKey: serverKey)
        socket = try UDPSocket(bindingTo: SocketAddress(address, port: 0), namespace: lab.namespace)
        self.server = server
    }

    /// One handshake, the initiation sent again each second as a client does: how long it took,
    /// or nil when it did not complete within `timeout`.
    public func handshake(timeout: Duration) -> Duration? {
        let start = LabClock.now
        var buffer = [UInt8](repeating: 0, count: 2048)
        while LabClock.now - start < timeout {
            guard let initiation = try? core.initiate(now: .now(), wallClock: .now()) else { return nil }
            send(initiation)
            let resendAt = LabClock.now + .seconds(1)
            while LabClock.now < resendAt, LabClock.now - start < timeout {
                guard let (length, _) = (try? buffer.withUnsafeMutableBytes({ try socket.receive(into: $0, timeout: .milliseconds(20)) })) ?? nil
                else { continue }
                var datagram = Array(buffer[0..<length])
                switch core.receive(&datagram, now: .now()) {
                case .cookie(let resend): send(resend)
                case .established(let done):
                    send(done.confirmation)
                    return LabClock.now - start
                case .rejected: return nil
                default: continue
                }
            }
        }
        return nil
    }

    private func send(_ datagram: [UInt8]) { _ = try? datagram.withUnsafeBytes { try socket.send($0, to: server) } }
}

extension NamespaceLab {
    /// A flooder's namespace wired to `server` (`fl0`, 203.0.113.2, whose peer `fl0-s` is
    /// 203.0.113.1), with `networks` IPv4 /24s of 100.64.0.0/10 holding `perNetwork` addresses
    /// each, and, when the kernel has IPv6, one address in each of the 256 /64s of
    /// 2001:db8:56::/56 (one host with a routed /56). The server routes both back to it. Returns
    /// the addresses, and why there are no IPv6 ones when there are none.
    public static func flooder(attachedTo server: NamespaceLab, networks: Int, perNetwork: Int) throws
        -> (lab: NamespaceLab, v4: [IPAddress], v6: [IPAddress], v6Missing: String?)
    {
        let lab = try NamespaceLab()
        try lab.attach(to: server, device: "fl0", peer: "fl0-s", address: "203.0.113.2", gateway: "203.0.113.1")
        var v4: [IPAddress] = []
        for network in 0..<networks {
            for host in 0..<perNetwork { v4.append(.v4(0x6440_0000 | UInt32(network) << 8 | UInt32(2 + host))) }
        }
        try lab.batch(v4.map { "address add \($0)/32 dev fl0" })
        try server.ip("route add 100.64.0.0/16 via 203.0.113.2")
        guard FileManager.default.fileExists(atPath: "/proc/sys/net/ipv6") else {
            return (lab, v4, [], "IPv6 is disabled in this kernel (no /proc/sys/net/ipv6)")
        }
        let v6 = (0..<256).map { IPAddress.v6(0x2001_0db8_0056_0000 | UInt64($0), 1) }
        do {
            try lab.ip("address add 2001:db8:ffff::2/64 dev fl0 nodad")
            try server.ip("address add 2001:db8:ffff::1/64 dev fl0-s nodad")
            try server.ip("address add 2001:db8:7::7/128 dev lo")
            try lab.batch(v6.map { "address add \($0)/128 dev fl0 nodad" } + ["route add default via 2001:db8:ffff::1 dev fl0"])
            try server.ip("route add 2001:db8:56::/56 via 2001:db8:ffff::2 dev fl0-s")
        } catch {
            return (lab, v4, [], "IPv6 addresses cannot be added here: \(error)")
        }
        return (lab, v4, v6, nil)
    }
}
