import PathMonitor
import Foundation
import Synchronization

/// Why the client could not bring the session up.
public enum ClientError: Error, Equatable, CustomStringConvertible {
    /// No handshake response within the time allowed.
    case timeout(Duration)
    /// The server refused our key or credentials.
    case rejected
    case device(DeviceError)

    public var description: String {
        switch self {
        case .timeout(let d): "no handshake response from the server in \(d) (is it running, and is this its key?)"
        case .rejected: "the server rejected this client's key or credentials (check the server's users)"
        case .device(let e): "\(e)"
        }
    }
}

/// The client's data plane: the TUN device, the session's current UDP socket, and the protocol
/// core between them. A rebind swaps the socket; the device and the session keys stay.
public final class TunnelClient: Sendable {
    public let server: SocketAddress
    private let core: Mutex<ClientCore>
    private let current: Mutex<UDPSocket>
    private let device: Mutex<TunDevice?> = Mutex(nil)
    private let counters = Mutex(TrafficCounters())
    private let lastEcho = Mutex<(id: UInt64, rtt: Duration)?>(nil)
    private let lastInitiation = Mutex<Instant?>(nil)
    private let handshakes = Atomic<Int>(0)
    private let running = Atomic<Bool>(false)
    private let inboundWakeup: Wakeup
    private let outboundWakeup: Wakeup
    private let log: @Sendable (String) -> Void

    public init(core: ClientCore, socket: UDPSocket, server: SocketAddress, log: @escaping @Sendable (String) -> Void)
        throws(DeviceError)
    {
        self.core = Mutex(core)
        self.current = Mutex(socket)
        self.server = server
        self.log = log
        inboundWakeup = try Wakeup()
        outboundWakeup = try Wakeup()
    }

    public var traffic: TrafficCounters { counters.withLock { $0 } }
    public var drops: DropCounters { core.withLock { $0.drops } }
    /// Handshakes started since the client was made.
    public var handshakeCount: Int { handshakes.load(ordering: .relaxed) }
    /// The socket the session uses now.
    public var socket: UDPSocket { current.withLock { $0 } }

    /// Handshakes on the current socket, sending the initiation again every second, before
    /// the data loops run.
    public func handshake(timeout: Duration) throws(ClientError) -> HandshakeCompletion {
        let deadline = Instant.now() + timeout
        var buffer = [UInt8](repeating: 0, count: PacketBatch.slotSize)
        while Instant.now() < deadline {
            initiate(force: true)
            let resend = Instant.now() + .seconds(1)
            while Instant.now() < min(resend, deadline) {
                let socket = self.socket
                let wait = min(resend, deadline) - Instant.now()
                let event: ClientEvent? = try? buffer.withUnsafeMutableBytes { (raw) throws(DeviceError) -> ClientEvent? in
                    guard let (length, _) = try socket.receive(into: raw, timeout: max(wait, .milliseconds(1))) else { return nil }
                    return core.withLock { $0.receive(UnsafeMutableRawBufferPointer(rebasing: raw[0..<length]), now: Instant.now()) }
                }
                switch event {
                case .established(let completion)?:
                    send(completion.confirmation)
                    return completion
                case .rejected?:
                    throw .rejected
                default:
                    continue
                }
            }
        }
        throw .timeout(timeout)
    }

    /// Runs the data loops until `stop()`: packets from `tun` out, datagrams in.
    public func run(with tun: TunDevice) {
        device.withLock { $0 = tun }
        running.store(true, ordering: .relaxed)
        let outboundDone = DispatchSemaphore(value: 0)
        Thread.detachNewThread { [self] in
            outbound(tun)
            outboundDone.signal()
        }
        inbound(tun)
        outboundDone.wait()
    }

    public func stop() {
        running.store(false, ordering: .relaxed)
        inboundWakeup.signal()
        outboundWakeup.signal()
    }

    /// Moves the session to `socket` (a new path): the server follows on the first
    /// authenticated packet, so a keepalive goes out at once. No handshake, keys unchanged.
    public func rebind(to socket: UDPSocket) {
        current.withLock { $0 = socket }
        inboundWakeup.signal()
        if let keepalive = try? core.withLock({ (core) throws(SealFailure) in try core.keepalive(now: Instant.now()) }) {
            send(keepalive)
        }
    }

    /// Sends a probe on the current socket; `lastProbeEcho` shows the answer.
    public func probe(id: UInt64) {
        if let datagram = try? core.withLock({ (core) throws(SealFailure) in try core.probe(id: id, now: Instant.now()) }) {
            send(datagram)
        }
    }

    /// The newest probe echo: its id and round-trip time.
    public var lastProbeEcho: (id: UInt64, rtt: Duration)? { lastEcho.withLock { $0 } }

    // MARK: Loops

    private func inbound(_ tun: TunDevice) {
        var buffer = [UInt8](repeating: 0, count: PacketBatch.slotSize)
        while running.load(ordering: .relaxed) {
            let socket = self.socket
            do {
                let ready = try pollReadable([socket.fileDescriptor, inboundWakeup.readEnd], timeout: nil)
                if ready.contains(inboundWakeup.readEnd) { inboundWakeup.drain() }
                guard ready.contains(socket.fileDescriptor) else { continue }
                // Drain what is queued, then poll again. (A typed-throws closure returning Void
                // here crashes the 6.3 compiler's IRGen, hence the count it returns.)
                _ = try buffer.withUnsafeMutableBytes { (raw) throws(DeviceError) -> Int in
                    for handled in 0..<64 {
                        guard let (length, _) = try socket.receive(into: raw, timeout: .zero) else { return handled }
                        let now = Instant.now()
                        let event = core.withLock { $0.receive(UnsafeMutableRawBufferPointer(rebasing: raw[0..<length]), now: now) }
                        handle(event, in: raw, tun: tun)
                    }
                    return 64
                }
            } catch {
                log("receive failed: \(error)")
            }
        }
    }

    private func handle(_ event: ClientEvent, in raw: UnsafeMutableRawBufferPointer, tun: TunDevice) {
        switch event {
        case .packet(let range):
            counters.withLock {
                $0.packetsIn += 1
                $0.bytesIn += range.count
            }
            do { try tun.write(UnsafeRawBufferPointer(rebasing: raw[range])) } catch { log("write to \(tun.name) failed: \(error)") }
        case .established(let completion):
            send(completion.confirmation)
            log("session rekeyed, rtt \(completion.rtt)")
        case .rejected:
            log("the server rejected a handshake")
        case .probeEcho(let id, let rtt):
            lastEcho.withLock { $0 = (id, rtt) }
        case .sessionUnknown:
            log("the server lost our session; handshaking")
            initiate(force: false)
        case .keepalive, .dropped:
            break
        }
    }

    /// Packets from the TUN, sealed in place into a batch and sent with one `sendmmsg`.
    private func outbound(_ tun: TunDevice) {
        let batch = PacketBatch(capacity: 32)
        while running.load(ordering: .relaxed) {
            do {
                let ready = try pollReadable([tun.fileDescriptor, outboundWakeup.readEnd], timeout: nil)
                if ready.contains(outboundWakeup.readEnd) { outboundWakeup.drain() }
                guard ready.contains(tun.fileDescriptor) else { continue }
            } catch {
                log("poll failed: \(error)")
                continue
            }
            var drained = false
            while !drained {
                batch.removeAll()
                let now = Instant.now()
                drained = fill(batch, from: tun) { frame, length throws(SealFailure) in
                    try core.withLock { (core) throws(SealFailure) in try core.seal(frame, innerLength: length, now: now) }
                }
                // Before the batch check: with an expired session every seal fails and the batch
                // is empty, and that is exactly when a handshake is most needed.
                if core.withLock({ $0.needsHandshake(now: now) }) { initiate(force: false) }
                guard batch.count > 0 else { continue }
                let socket = self.socket
                do {
                    let sent = try socket.send(batch)
                    if sent < batch.count { counters.withLock { $0.sendFailures += batch.count - sent } }
                } catch {
                    counters.withLock { $0.sendFailures += batch.count }
                }
            }
        }
    }

    /// Reads packets from `tun` into `batch`, each sealed in place by `seal`; true when the
    /// TUN had no more waiting.
    private func fill(_ batch: PacketBatch, from tun: TunDevice,
                      seal: (UnsafeMutableRawBufferPointer, Int) throws(SealFailure) -> Int) -> Bool {
        while !batch.isFull {
            var empty = false
            batch.append(to: server) { slot in
                let inner = UnsafeMutableRawBufferPointer(rebasing: slot[DataPacket.headroom..<(slot.count - DataPacket.tailroom)])
                guard let length = try? tun.read(into: inner, timeout: .zero) else {
                    empty = true
                    return nil
                }
                do {
                    let sealed = try seal(UnsafeMutableRawBufferPointer(rebasing: slot[0..<(length + DataPacket.overhead)]), length)
                    counters.withLock {
                        $0.packetsOut += 1
                        $0.bytesOut += length
                    }
                    return sealed
                } catch {
                    counters.withLock { $0.noSession += 1 }
                    return nil
                }
            }
            if empty { return true }
        }
        return false
    }

    // MARK: Sending

    /// Sends a handshake initiation, at most once a second unless `force`.
    private func initiate(force: Bool) {
        let now = Instant.now()
        let due = lastInitiation.withLock { last -> Bool in
            if !force, let last, now - last < .seconds(1) { return false }
            last = now
            return true
        }
        guard due, let initiation = try? core.withLock({ (core) throws(CryptoError) in
            try core.initiate(now: now, wallClock: TAI64N.now())
        }) else { return }
        handshakes.add(1, ordering: .relaxed)
        send(initiation)
    }

    private func send(_ datagram: [UInt8]) {
        datagram.withUnsafeBytes { send($0) }
    }

    private func send(_ datagram: UnsafeRawBufferPointer) {
        do {
            if try !socket.send(datagram, to: server) { counters.withLock { $0.sendFailures += 1 } }
        } catch {
            counters.withLock { $0.sendFailures += 1 }
        }
    }
}
