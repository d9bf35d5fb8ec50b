import Topology
import Foundation
public import Glibc
import Synchronization
import Basics
import Tunnel
public import Device
import Netlink

/// Time as the lab measures it: one monotonic clock for every thread.
public typealias LabClock = ContinuousClock
public typealias LabInstant = ContinuousClock.Instant

/// A UDP probe stream through a tunnel: a numbered datagram every `interval` from `source` in
/// one namespace to an echo at `echo` in another, and the time every echo came back.
public final class ProbeStream: @unchecked Sendable {  // every mutable field is read and written under `lock`
    public let interval: Duration
    private let lock = NSLock()
    private var sent: [(seq: UInt32, at: LabInstant)] = []
    private var replies: [UInt32: LabInstant] = [:]
    private var paused = false
    private let running = Atomic<Bool>(true)
    private var threads: [Thread] = []
    private let done = DispatchGroup()

    /// Starts the echo and the sender at once.
    public init(from source: SocketAddress, in sourceLab: NamespaceLab, to echo: SocketAddress, in echoLab: NamespaceLab,
                interval: Duration = .milliseconds(20), size: Int = 100) throws {
        self.interval = interval
        let echoSocket = try Self.bind(echo, in: echoLab)
        let sender = try UDPSocket(bindingTo: source, namespace: sourceLab.namespace)
        run { [self] in
            var buffer = [UInt8](repeating: 0, count: 2048)
            while running.load(ordering: .relaxed) {
                let got = try? buffer.withUnsafeMutableBytes { try echoSocket.receive(into: $0, timeout: .milliseconds(50)) }
                guard let (length, peer) = got ?? nil else { continue }
                _ = try? buffer.withUnsafeBytes { try echoSocket.send(UnsafeRawBufferPointer(rebasing: $0[0..<length]), to: peer) }
            }
        }
        run { [self] in
            var buffer = [UInt8](repeating: 0, count: 2048)
            while running.load(ordering: .relaxed) {
                let got = try? buffer.withUnsafeMutableBytes { try sender.receive(into: $0, timeout: .milliseconds(50)) }
                guard let (length, _) = got ?? nil, length >= 4 else { continue }
                let seq = UInt32(buffer[0]) << 24 | UInt32(buffer[1]) << 16 | UInt32(buffer[2]) << 8 | UInt32(buffer[3])
                let now = LabClock.now
                lock.withLock { if replies[seq] == nil { replies[seq] = now } }
            }
        }
        run { [self] in
            var payload = [UInt8](repeating: 0x5a, count: max(size, 4))
            var seq: UInt32 = 0
            var next = LabClock.now
            while running.load(ordering: .relaxed) {
                if !lock.withLock({ paused }) {
                    payload[0] = UInt8(seq >> 24); payload[1] = UInt8(seq >> 16 & 0xff)
                    payload[2] = UInt8(seq >> 8 & 0xff); payload[3] = UInt8(seq & 0xff)
                    let at = LabClock.now
                    lock.withLock { sent.append((seq, at)) }
                    _ = try? payload.withUnsafeBytes { try sender.send($0, to: echo) }
                    seq += 1
                }
                next = next + interval
                let now = LabClock.now
                if next > now { Thread.sleep(forTimeInterval: Double((next - now).nanoseconds) / 1e9) } else { next = now }
            }
        }
    }

    /// Binds the echo's socket, waiting up to 5 s for its address to appear (a TUN device
    /// that is still coming up).
    private static func bind(_ address: SocketAddress, in lab: NamespaceLab) throws -> UDPSocket {
        var lastError: (any Error)?
        for _ in 0..<250 {
            do { return try UDPSocket(bindingTo: address, namespace: lab.namespace) } catch { lastError = error }
            usleep(20_000)
        }
        throw lastError ?? NamespaceLab.Failure(description: "cannot bind \(address)")
    }

    private func run(_ body: @escaping @Sendable () -> Void) {
        done.enter()
        let thread = Thread { [done] in
            body()
            done.leave()
        }
        thread.start()
        threads.append(thread)
    }

    /// Stops sending (a suspended laptop sends nothing) until `resume()`.
    public func pause() { lock.withLock { paused = true } }
    public func resume() { lock.withLock { paused = false } }

    /// Stops every thread (within 50 ms).
    public func stop() {
        running.store(false, ordering: .relaxed)
        _ = done.wait(timeout: .now() + 2)
    }

    deinit { stop() }

    /// The longest time without an echo in `from...to`, counting from `from` to the first echo
    /// and from the last echo to `to`.
    public func outage(from: LabInstant, to: LabInstant) -> Duration {
        let times = lock.withLock { replies.values.filter { $0 > from && $0 <= to }.sorted() }
        var previous = from
        var longest = Duration.zero
        for t in times {
            longest = max(longest, t - previous)
            previous = t
        }
        return max(longest, to - previous)
    }

    /// The last echo that came back so far.
    public var lastEcho: LabInstant? { lock.withLock { replies.values.max() } }

    /// The first echo that came back after `instant`.
    public func firstEcho(after instant: LabInstant) -> LabInstant? {
        lock.withLock { replies.values.filter { $0 > instant }.min() }
    }

    /// Round-trip times of the probes sent in `from...to` that came back, sorted.
    public func roundTrips(from: LabInstant, to: LabInstant) -> [Duration] {
        lock.withLock {
            sent.filter { $0.at >= from && $0.at <= to }.compactMap { probe in replies[probe.seq].map { $0 - probe.at } }.sorted()
        }
    }

    /// Probes sent in `from...to` that never came back, and how many were sent.
    public func lost(from: LabInstant, to: LabInstant) -> (lost: Int, sent: Int) {
        lock.withLock {
            let window = sent.filter { $0.at >= from && $0.at <= to }
            return (window.filter { replies[$0.seq] == nil }.count, window.count)
        }
    }
}

/// A paced TCP stream through a tunnel whose every byte is checked at the far end: a lost,
/// duplicated or reordered byte breaks the pattern.
public final class TCPStream: @unchecked Sendable {  // every mutable field is read and written under `lock`
    private let sender: Int32
    private let receiver: Int32
    private let lock = NSLock()
    private var paused = false
    private var sent = 0
    private var received = 0
    private var intact = true
    private var failure: String?
    private let writing = Atomic<Bool>(true)
    private let done = DispatchGroup()

    /// Connects from `sourceLab` to a listener at `address` in `listenerLab` and starts
    /// writing `bytesPerSecond` in 20 ms steps.
    public init(to address: SocketAddress, listenerIn listenerLab: NamespaceLab, from sourceLab: NamespaceLab,
                bytesPerSecond: Int = 1 << 20) throws {
        let listener = try listenerLab.namespace.run { () throws(NetlinkError) -> Int32 in
            let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            guard fd >= 0 else { throw NetlinkError("socket", errno) }
            var yes: Int32 = 1
            setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, socklen_t(MemoryLayout<Int32>.size))
            var sa = Self.sockaddr(address)
            let ok = withUnsafePointer(to: &sa) { $0.withMemoryRebound(to: Glibc.sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
            guard ok == 0, listen(fd, 1) == 0 else { let e = errno; close(fd); throw NetlinkError("listen on \(address)", e) }
            return fd
        }
        defer { close(listener) }
        let out = try sourceLab.namespace.run { () throws(NetlinkError) -> Int32 in socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0) }
        Self.timeouts(out, seconds: 10)
        var sa = Self.sockaddr(address)
        let ok = withUnsafePointer(to: &sa) { $0.withMemoryRebound(to: Glibc.sockaddr.self, capacity: 1) { connect(out, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        guard ok == 0 else { let e = errno; close(out); throw NetlinkError("connect to \(address)", e) }
        Self.timeouts(listener, seconds: 5)
        let into = accept(listener, nil, nil)
        guard into >= 0 else { let e = errno; close(out); throw NetlinkError("accept", e) }
        sender = out
        receiver = into
        Self.timeouts(receiver, seconds: 60)
        Self.boundBackoff(sender)
        Self.boundBackoff(receiver)
        let step = max(bytesPerSecond / 50, 1)
        done.enter()
        Thread { [self] in
            var chunk = [UInt8](repeating: 0, count: step)
            var next = LabClock.now
            while writing.load(ordering: .relaxed) {
                if !lock.withLock({ paused }) {
                    let offset = lock.withLock { sent }
                    for i in 0..<step { chunk[i] = Self.byte(offset + i) }
                    var written = 0
                    while written < step && writing.load(ordering: .relaxed) {
                        let n = chunk.withUnsafeBytes { write(sender, $0.baseAddress! + written, step - written) }
                        if n < 0 && (errno == EINTR || errno == EAGAIN) { continue }
                        guard n > 0 else { lock.withLock { failure = "write failed after \(sent) bytes: errno \(errno)" }; writing.store(false, ordering: .relaxed); break }
                        written += n
                    }
                    lock.withLock { sent += written }
                }
                next = next + .milliseconds(20)
                let now = LabClock.now
                if next > now { Thread.sleep(forTimeInterval: Double((next - now).nanoseconds) / 1e9) } else { next = now }
            }
            shutdown(sender, Int32(SHUT_WR))
            done.leave()
        }.start()
        done.enter()
        Thread { [self] in
            var buffer = [UInt8](repeating: 0, count: 65536)
            while true {
                let n = read(receiver, &buffer, buffer.count)
                if n < 0 && errno == EINTR { continue }
                if n < 0 { lock.withLock { failure = failure ?? "read failed after \(received) bytes: errno \(errno)" } }
                if n <= 0 { break }
                lock.withLock {
                    for i in 0..<n where buffer[i] != Self.byte(received + i) { intact = false }
                    received += n
                }
            }
            done.leave()
        }.start()
    }

    deinit {
        writing.store(false, ordering: .relaxed)
        shutdown(receiver, Int32(SHUT_RDWR))
        _ = done.wait(timeout: .now() + 5)
        close(sender)
        close(receiver)
    }

    /// Stops writing; returns once nothing written is left unacknowledged (at most `limit`),
    /// so an outage that follows holds no data in flight.
    @discardableResult
    public func pause(drainingWithin limit: Duration = .seconds(5)) -> Bool {
        lock.withLock { paused = true }
        let deadline = LabClock.now + limit
        while LabClock.now < deadline {
            var unsent: Int32 = 0
            if ioctl(sender, UInt(TIOCOUTQ), &unsent) == 0 && unsent == 0 { return true }
            usleep(5_000)
        }
        return false
    }

    public func resume() { lock.withLock { paused = false } }

    /// Bytes written so far.
    public var written: Int { lock.withLock { sent } }

    /// Stops writing, waits up to `limit` for the far end to read everything, and says how it went.
    public func finish(within limit: Duration = .seconds(30)) -> (sent: Int, received: Int, intact: Bool, failure: String?) {
        writing.store(false, ordering: .relaxed)
        let seconds = Double(limit.nanoseconds) / 1e9
        if done.wait(timeout: .now() + seconds) == .timedOut {
            // What the sender's TCP was doing when the wait ran out, for the failure to tell.
            let stuck = "not delivered within \(limit); sender's TCP: \(Self.tcpState(sender)); receiver's: \(Self.tcpState(receiver))"
            lock.withLock { failure = failure ?? stuck }
            shutdown(receiver, Int32(SHUT_RDWR))
            _ = done.wait(timeout: .now() + 2)
        }
        return lock.withLock { (sent, received, intact, failure) }
    }

    /// A TCP socket's state from TCP_INFO, in a few numbers.
    static func tcpState(_ fd: Int32) -> String {
        var info = tcp_info()
        var size = socklen_t(MemoryLayout<tcp_info>.size)
        guard getsockopt(fd, Int32(IPPROTO_TCP), TCP_INFO, &info, &size) == 0 else { return "unknown (errno \(errno))" }
        return "state \(info.tcpi_state) ca \(info.tcpi_ca_state) backoff \(info.tcpi_backoff) rto \(info.tcpi_rto / 1000) ms "
            + "unacked \(info.tcpi_unacked) sacked \(info.tcpi_sacked) lost \(info.tcpi_lost) retransmitted \(info.tcpi_total_retrans) cwnd \(info.tcpi_snd_cwnd) "
            + "pmtu \(info.tcpi_pmtu) mss \(info.tcpi_snd_mss)/\(info.tcpi_rcv_mss) rcv space \(info.tcpi_rcv_space) "
            + "last sent \(info.tcpi_last_data_sent) ms ago, last received \(info.tcpi_last_data_recv) ms ago, last ack \(info.tcpi_last_ack_recv) ms ago"
    }

    /// The byte at `offset` of a test stream.
    public static func byte(_ offset: Int) -> UInt8 { UInt8(truncatingIfNeeded: offset &* 2_654_435_761 >> 7) }

    /// Send and receive timeouts, so a stalled socket fails a test instead of hanging it.
    public static func timeouts(_ fd: Int32, seconds: Int) {
        var tv = timeval(tv_sec: seconds, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
    }

    /// Caps the time between TCP's retransmissions at 2 s where the kernel allows it (Linux 6.15's
    /// TCP_RTO_MAX_MS, 44): under heavy loss a stream's back-off otherwise doubles towards two
    /// minutes, and a stream whose tunnel works again would wait out TCP's timer, not the tunnel's.
    public static func boundBackoff(_ fd: Int32) {
        var milliseconds: Int32 = 2000
        _ = setsockopt(fd, Int32(IPPROTO_TCP), 44 /* TCP_RTO_MAX_MS */, &milliseconds, socklen_t(MemoryLayout<Int32>.size))
    }

    public static func sockaddr(_ address: SocketAddress) -> sockaddr_in {
        var sa = sockaddr_in()
        sa.sin_family = sa_family_t(AF_INET)
        sa.sin_port = address.port.bigEndian
        if case .v4(let a) = address.ip { sa.sin_addr.s_addr = a.bigEndian }
        return sa
    }
}

/// Watches the UDP datagrams that arrive on a namespace's interfaces for one port: which
/// interface each came in on, when, how long its payload was and its first bytes. It sees
/// the tunnel's outer packets, so it tells which uplink a VPN really uses.
public final class PacketTap: @unchecked Sendable {  // every mutable field is read and written under `lock`
    public struct Packet: Sendable {
        public var interface: Int32
        public var at: LabInstant
        public var payloadLength: Int
        public var head: [UInt8]
    }

    private let lock = NSLock()
    private var packets: [Packet] = []
    private var capture: PacketCapture?

    public init(port: UInt16, in lab: NamespaceLab) throws {
        capture = try PacketCapture(ethertype: 0x0800 /* ETH_P_IP */, in: lab, snapshot: 256) { [weak self] buffer, _, from in
            let ihl = Int(buffer[0] & 0x0f) * 4
            guard buffer[0] >> 4 == 4, buffer[9] == 17, ihl + 12 <= buffer.count else { return }
            let destination = UInt16(buffer[ihl + 2]) << 8 | UInt16(buffer[ihl + 3])
            guard destination == port else { return }
            let udpLength = Int(UInt16(buffer[ihl + 4]) << 8 | UInt16(buffer[ihl + 5]))
            let packet = Packet(interface: from.interface, at: LabClock.now, payloadLength: udpLength - 8,
                                head: Array(buffer[(ihl + 8)..<min(ihl + 12, buffer.count)]))
            guard let self else { return }
            self.lock.withLock { self.packets.append(packet) }
        }
    }

    /// The packets seen so far that match `filter`.
    public func packets(where filter: (Packet) -> Bool = { _ in true }) -> [Packet] {
        lock.withLock { packets.filter(filter) }
    }
}

/// An AF_PACKET socket in a namespace for one ethertype (or all), read on a thread of its own:
/// every packet that arrives on an interface there (not those it sends) goes to `handle`, with
/// its first `snapshot` bytes (layer 3 on), its whole length and where it came from. Stops and
/// closes its socket on deinit (the thread holds none of it, so the owner's release ends it).
final class PacketCapture: @unchecked Sendable {  // immutable: the socket, an atomic flag and a group
    private let fd: Int32
    private let running = Running()
    private let done = DispatchGroup()

    private final class Running: Sendable {
        let value = Atomic<Bool>(true)
    }

    init(ethertype: UInt16, in lab: NamespaceLab, snapshot: Int,
         handle: @escaping @Sendable (_ head: ArraySlice<UInt8>, _ length: Int, _ from: LinkLayerAddress) -> Void) throws {
        let protocolNumber = Int32(ethertype.bigEndian)
        fd = try lab.namespace.run { () throws(NetlinkError) -> Int32 in
            let fd = socket(AF_PACKET, Int32(SOCK_DGRAM.rawValue), protocolNumber)
            guard fd >= 0 else { throw NetlinkError("packet socket", errno) }
            return fd
        }
        var tv = timeval(tv_sec: 0, tv_usec: 50_000)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        done.enter()
        Thread { [fd, running, done] in
            var buffer = [UInt8](repeating: 0, count: snapshot)
            var from = LinkLayerAddress()
            while running.value.load(ordering: .relaxed) {
                var length = socklen_t(MemoryLayout<LinkLayerAddress>.size)
                let n = withUnsafeMutablePointer(to: &from) { sa in
                    sa.withMemoryRebound(to: sockaddr.self, capacity: 1) { recvfrom(fd, &buffer, buffer.count, Int32(MSG_TRUNC), $0, &length) }
                }
                guard n > 0, from.packetType != 4 /* PACKET_OUTGOING */ else { continue }
                handle(buffer[0..<min(n, buffer.count)], n, from)
            }
            done.leave()
        }.start()
    }

    deinit {
        running.value.store(false, ordering: .relaxed)
        _ = done.wait(timeout: .now() + 1)
        close(fd)
    }
}

/// struct sockaddr_ll (<linux/if_packet.h>), which the C library module does not export.
struct LinkLayerAddress {
    var family: UInt16 = 0
    var networkProtocol: UInt16 = 0
    var interface: Int32 = 0
    var hardwareType: UInt16 = 0
    var packetType: UInt8 = 0
    var addressLength: UInt8 = 0
    var address: (UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8) = (0, 0, 0, 0, 0, 0, 0, 0)
}

extension UDPSocket {
    /// Sends `bytes` to `peer`; false when the socket had no room.
    @discardableResult
    public func send(_ bytes: [UInt8], to peer: SocketAddress) throws -> Bool {
        try bytes.withUnsafeBytes { try send($0, to: peer) }
    }

    /// The next datagram within `timeout`, copied out.
    public func receive(timeout: Duration = .seconds(2)) throws -> (bytes: [UInt8], peer: SocketAddress)? {
        var buffer = [UInt8](repeating: 0, count: PacketBatch.slotSize)
        guard let (length, peer) = try buffer.withUnsafeMutableBytes({ try receive(into: $0, timeout: timeout) }) else { return nil }
        return (Array(buffer[..<length]), peer)
    }
}
