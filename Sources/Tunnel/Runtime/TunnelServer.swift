import PathMonitor
import Glibc
import Synchronization

/// The server's data plane: a TUN device, a UDP socket per address family, and the protocol
/// core between them.
///
/// Three threads: datagrams in (decrypt, deliver to the TUN), TUN packets out (route by inner
/// destination, encrypt, send to the client's current endpoint), and handshakes (the
/// initiations the inbound thread hands over, so a burst of Diffie-Hellman or a flood of cookie
/// replies never holds up established sessions' packets behind it in the socket). A packet from
/// one client to another goes through the TUN and the host's kernel like any other, so the
/// host's forwarding setting and firewall decide whether clients reach each other (see the
/// README's server section).
/// Argon2id password checks run on threads of their own, never on the data path.
public final class TunnelServer: Sendable {
    public let device: TunDevice
    /// The listening sockets: one IPv4, one IPv6, or both.
    public let sockets: [UDPSocket]
    private let core: Mutex<ServerCore>
    private let counters = Mutex(TrafficCounters())
    private let running = Atomic<Bool>(false)
    /// Password checks waiting for the worker; bounded by the core's own limit on checks in flight.
    private let checks = Mutex<[PasswordCheck]>([])
    private let checksReady = Semaphore()
    /// Initiations waiting for the handshake thread, with where they came from and the address
    /// they were sent to.
    private let initiations = Mutex(InitiationQueue(capacity: TunnelServer.initiationQueueCapacity))
    private let initiationsReady = Semaphore()
    /// Initiations queued at most (each up to 712 bytes: 180 KB in all); past it, new ones are
    /// dropped and counted. The handshake thread answers a flood's initiation with a cookie in
    /// tens of microseconds, so the queue is that many milliseconds of work at most.
    static let initiationQueueCapacity = 256
    private let log: @Sendable (String) -> Void
    /// With a value, each peer reachable here has its inner addresses routed to this server's
    /// TUN device (host routes, replacing another server's), and the routes go when it leaves:
    /// several servers on one host hand sessions over without a lost packet, and a routing
    /// daemon can announce the routes for servers on several hosts. Used by the inbound thread only.
    private let routes: PeerRoutes?
    /// Draining: sessions are told to move to another server; `run()` returns once none is left.
    private let draining = Atomic<Bool>(false)
    /// Refused handshakes: one line per cause per interval, never one per packet.
    private let refusals = Mutex(LogThrottle<DropReason>(interval: .seconds(10)))
    /// How often the drop counters are logged when they changed.
    static let dropSummaryInterval: Duration = .seconds(60)

    public init(core: ServerCore, device: TunDevice, sockets: [UDPSocket], publishesRoutes: Bool = false,
                log: @escaping @Sendable (String) -> Void) {
        routes = publishesRoutes ? PeerRoutes(device: device, log: log) : nil
        self.core = Mutex(core)
        self.device = device
        self.sockets = sockets
        self.log = log
    }

    /// Traffic so far.
    public var traffic: TrafficCounters { counters.withLock { $0 } }
    /// Drops by cause, from the protocol core.
    public var drops: DropCounters { core.withLock { $0.drops } }
    public var sessionCount: Int { core.withLock { $0.sessionCount } }

    /// Runs until `stop()`: the outbound loop on a thread of its own, the inbound one here.
    public func run() {
        running.store(true, ordering: .relaxed)
        var threads: [OSThread] = []
        for (name, body) in [("outbound", outbound), ("handshake", handshakes), ("password", checkPasswords)] as
            [(String, @Sendable () -> Void)]
        {
            do {
                threads.append(try OSThread(body))
            } catch {
                log("cannot start the \(name) thread: \(error)")
                stop()
                wake()
                for thread in threads { thread.join() }
                return
            }
        }
        inbound()
        wake()
        for thread in threads { thread.join() }
    }

    /// Lets the waiting workers see that the server stopped.
    private func wake() {
        checksReady.signal()
        initiationsReady.signal()
    }

    /// Makes `run()` return within a second.
    public func stop() { running.store(false, ordering: .relaxed) }

    /// Peers reachable here now.
    public var liveSessions: Int { core.withLock { $0.livePeerCount } }

    /// Tells every session that this server is being taken down (again each second while
    /// draining, for a message lost on the way); `run()` returns once no session is left.
    public func drain() {
        draining.store(true, ordering: .relaxed)
        let messages = core.withLock { $0.drainMessages(now: Instant.now()) }
        for message in messages { send(message.datagram, to: message.to, from: message.from) }
    }

    /// Initiations, one at a time, off the inbound thread. The core's lock is held for the
    /// cheap steps only; the Diffie-Hellman ones (open, write) run outside it, so the data
    /// threads never wait for a handshake.
    private func handshakes() {
        var buffer = [UInt8](repeating: 0, count: PacketBatch.slotSize)
        let key = core.withLock { $0.handshakeKey }
        while true {
            initiationsReady.wait()
            guard running.load(ordering: .relaxed) else { return }
            while let (length, source, local) = initiations.withLock({ $0.pop(into: &buffer) }) {
                let event = buffer.withUnsafeBytes { raw in
                    handshake(UnsafeRawBufferPointer(rebasing: raw[0..<length]), from: source, at: local, key: key)
                }
                [UInt8]().withUnsafeBytes { handle(event, in: $0, local: local) }
            }
        }
    }

    private func handshake(_ datagram: UnsafeRawBufferPointer, from source: SocketAddress, at local: IPAddress?,
                            key: HandshakeKey) -> ServerEvent {
        let admitted: AdmittedInitiation
        switch core.withLock({ $0.admit(datagram, from: source, at: local, now: Instant.now()) }) {
        case .answered(let event): return event
        case .admitted(let initiation): admitted = initiation
        }
        let opened = admitted.open(with: key)
        switch core.withLock({ $0.decide(opened, now: Instant.now()) }) {
        case .answered(let event): return event
        case .respond(let plan):
            let written = plan.write()
            return core.withLock { $0.complete(written, now: Instant.now()) }
        }
    }

    /// One worker runs the Argon2id checks in turn (each takes tens of milliseconds and 64 MiB),
    /// so a burst of logins costs time, not memory, and never the data path's.
    private func checkPasswords() {
        while true {
            checksReady.wait()
            guard running.load(ordering: .relaxed) else { return }
            guard let check = checks.withLock({ $0.isEmpty ? nil : $0.removeFirst() }) else { continue }
            let verified = check.verify()
            let event = core.withLock { $0.finish(check, verified: verified, now: Instant.now()) }
            [UInt8]().withUnsafeBytes { handle(event, in: $0, local: check.local) }
        }
    }

    // MARK: Inbound: datagrams to the TUN

    private func inbound() {
        // Sockets that receive joined runs of datagrams need slots of 64 KB (1 MB in all).
        let joins = sockets.contains { $0.joinsReceived }
        let batch = joins ? PacketBatch(capacity: 16, slotBytes: 65_536) : PacketBatch(capacity: 32)
        // With a virtio header, a batch's segments of one TCP flow go to the TUN as one packet.
        var coalescer = device.hasVirtioHeader ? Coalescer() : nil
        defer { coalescer?.release() }
        var (joinedPackets, joinedBytes) = (0, 0)
        var lastTick = Instant.now()
        var lastSummary = (at: Instant.now(), drops: DropCounters())
        while running.load(ordering: .relaxed) {
            let ready: [Int32]
            do {
                ready = try pollReadable(sockets.map(\.fileDescriptor), timeout: .seconds(1))
            } catch {
                log("poll failed: \(error)")
                continue
            }
            let now = Instant.now()
            if now - lastTick >= .seconds(1) {
                core.withLock { $0.tick(now: now) }
                lastTick = now
                // Once a second while draining, for a message lost on the way.
                if draining.load(ordering: .relaxed), liveSessions > 0 { drain() }
            }
            // What was dropped and why, once a minute when anything was: floods show in the log
            // as counts, not as lines.
            if now - lastSummary.at >= Self.dropSummaryInterval {
                let drops = self.drops
                if drops != lastSummary.drops { log("drops so far: \(drops)") }
                lastSummary = (now, drops)
            }
            // Every ready socket gets its turn, so a flood on one family cannot starve the other.
            for socket in sockets where ready.contains(socket.fileDescriptor) {
                let received: Int
                do {
                    received = try socket.receive(into: batch, timeout: .zero)
                } catch {
                    log("receive failed: \(error)")
                    continue
                }
                for i in 0..<received {
                    guard let source = batch.peer(at: i) else { continue }
                    let local = batch.local(at: i)
                    let total = batch.packet(at: i).count
                    let whole = batch.slot(at: i)
                    // A run the kernel joined is cut back into its datagrams.
                    let step = batch.segmentSize(at: i) ?? max(total, 1)
                    var offset = 0
                    while offset < total {
                        let length = min(step, total - offset)
                        let slot = UnsafeMutableRawBufferPointer(rebasing: whole[offset..<(offset + length)])
                        offset += length
                        // Initiations go to the handshake thread; everything else is handled here.
                        if length > 1, length <= Initiation.maxLength, slot[1] == MessageType.initiation.rawValue {
                            let (queued, wasEmpty) = initiations.withLock { queue in
                                let wasEmpty = queue.count == 0
                                return (queue.push(UnsafeRawBufferPointer(rebasing: slot[0..<length]), from: source, at: local), wasEmpty)
                            }
                            // The worker drains the whole queue per wake: one signal per batch of work.
                            if queued, wasEmpty { initiationsReady.signal() }
                            if !queued { counters.withLock { $0.initiationsOverflowed += 1 } }
                            continue
                        }
                        let event = core.withLock { $0.receive(slot, from: source, at: local, now: now) }
                        if case .packet(_, let range) = event, coalescer != nil {
                            joinedPackets += 1
                            joinedBytes += range.count
                            coalescer!.add(UnsafeRawBufferPointer(rebasing: UnsafeRawBufferPointer(slot)[range])) { write($0, $1) }
                            continue
                        }
                        coalescer?.flush { write($0, $1) }
                        handle(event, in: UnsafeRawBufferPointer(slot), local: local)
                    }
                }
                coalescer?.flush { write($0, $1) }
                // Counted once per batch: the sending thread shares the counters' lock.
                if joinedPackets > 0 {
                    counters.withLock {
                        $0.packetsIn += joinedPackets
                        $0.bytesIn += joinedBytes
                    }
                    (joinedPackets, joinedBytes) = (0, 0)
                }
            }
            publishRoutes()
            if draining.load(ordering: .relaxed), liveSessions == 0 {
                log("drained: no session left")
                stop()
            }
        }
    }

    private func count(_ range: Range<Int>) {
        counters.withLock {
            $0.packetsIn += 1
            $0.bytesIn += range.count
        }
    }

    private func write(_ packet: UnsafeRawBufferPointer, _ header: VirtioNetHeader) {
        do {
            try device.write(packet, header: header)
            if header.gsoType != 0 { counters.withLock { $0.superPacketsWritten += 1 } }
        } catch {
            log("write to \(device.name) failed: \(error)")
        }
    }

    /// Routes for peers that became reachable here or left since the last call.
    private func publishRoutes() {
        guard let routes else { return }
        let changes = core.withLock { core in core.takeLiveChanges().map { (core.users[$0.peer].addresses, $0.live) } }
        for (addresses, live) in changes { routes.set(addresses, live: live) }
    }

    /// Acts on what the core made of a datagram that was sent to `local` (replies go out from it).
    private func handle(_ event: ServerEvent, in raw: UnsafeRawBufferPointer, local: IPAddress?) {
        switch event {
        case .packet(_, let range):
            count(range)
            // Also when it is for another client: the kernel routes it back out of the TUN only
            // if forwarding is on and the host's firewall lets it through.
            write(UnsafeRawBufferPointer(rebasing: raw[range]), VirtioNetHeader())
        case .handshake(let peer, let response, let to):
            send(response, to: to, from: local)
            log("handshake from \(to) for \(core.withLock { $0.users[peer].label })")
        case .rejected(let reason, let response, let to):
            send(response, to: to, from: local)
            if let line = refusals.withLock({ $0.line(for: reason, now: Instant.now()) { "handshake from \(to) rejected: \(reason)" } }) {
                log(line)
            }
        case .checkPassword(let check):
            checks.withLock { $0.append(check) }
            checksReady.signal()
        case .echo(_, let datagram, let to), .sessionUnknown(let datagram, let to), .cookie(let datagram, let to):
            send(datagram, to: to, from: local)
        case .keepalive:
            counters.withLock { $0.keepalivesIn += 1 }
        case .closed(let peer):
            log("session closed by \(core.withLock { $0.users[peer].label })")
        case .dropped:
            break
        }
    }

    // MARK: Outbound: TUN packets to datagrams

    /// Packets from the TUN, each sealed in place for the client owning its destination,
    /// batched and sent with one `sendmmsg`.
    private func outbound() {
        let batch = PacketBatch(capacity: 64)
        var reader = TunReader(device)
        defer { reader.release() }
        var (sealedPackets, sealedBytes, unsent) = (0, 0, 0)
        while running.load(ordering: .relaxed) {
            do {
                guard try !pollReadable([device.fileDescriptor], timeout: .seconds(1)).isEmpty else { continue }
            } catch {
                log("poll \(device.name) failed: \(error)")
                continue
            }
            var drained = false
            while !drained {
                batch.removeAll()
                let now = Instant.now()
                while !batch.isFull && !drained {
                    var source: IPAddress?
                    let appended = batch.append { slot in
                        let inner = UnsafeMutableRawBufferPointer(rebasing: slot[DataPacket.headroom..<(slot.count - DataPacket.tailroom)])
                        guard let length = try? reader.read(into: inner) else {
                            drained = true
                            return nil
                        }
                        guard let destination = InnerPacket.destination(of: UnsafeRawBufferPointer(rebasing: inner[0..<length])) else {
                            return nil
                        }
                        let frame = UnsafeMutableRawBufferPointer(rebasing: slot[0..<(length + DataPacket.overhead)])
                        do {
                            let sealed = try core.withLock { (core) throws(SealFailure) -> SealedDatagram in
                                guard let peer = core.peer(forInnerDestination: destination) else { throw .noSession }
                                return try core.seal(frame, innerLength: length, to: peer, now: now)
                            }
                            sealedPackets += 1
                            sealedBytes += length
                            source = sealed.source
                            return (sealed.length, sealed.destination)
                        } catch {
                            unsent += 1
                            return nil
                        }
                    }
                    // From the address the client sends to, as its NAT expects.
                    if appended { batch.setSource(source, at: batch.count - 1) }
                }
                // Counted once per batch: the receiving thread shares the counters' lock.
                counters.withLock { counters in
                    counters.record(reader)
                    counters.packetsOut += sealedPackets
                    counters.bytesOut += sealedBytes
                    counters.noSession += unsent
                }
                (sealedPackets, sealedBytes, unsent) = (0, 0, 0)
                guard batch.count > 0 else { continue }
                // One socket per family: a batch goes out through the socket of its first
                // datagram's family, any others one by one.
                let family = batch.peer(at: 0)?.ip.family
                guard let socket = sockets.first(where: { $0.local.ip.family == family }) else { continue }
                if (0..<batch.count).allSatisfy({ batch.peer(at: $0)?.ip.family == family }) {
                    do {
                        let sent = try socket.sendSegmented(batch)
                        if sent < batch.count { counters.withLock { $0.sendFailures += batch.count - sent } }
                    } catch {
                        counters.withLock { $0.sendFailures += batch.count }
                        log("send failed: \(error)")
                    }
                } else {
                    for i in 0..<batch.count {
                        if let peer = batch.peer(at: i) { send(batch.packet(at: i), to: peer, from: batch.source(at: i)) }
                    }
                }
            }
        }
    }

    private func send(_ datagram: [UInt8], to peer: SocketAddress, from source: IPAddress?) {
        datagram.withUnsafeBytes { send($0, to: peer, from: source) }
    }

    /// Sends from `source` when given (the address the peer sent to); if that address is gone
    /// from the host, from whichever the kernel picks.
    private func send(_ datagram: UnsafeRawBufferPointer, to peer: SocketAddress, from source: IPAddress?) {
        guard let socket = sockets.first(where: { $0.local.ip.family == peer.ip.family }) else {
            counters.withLock { $0.sendFailures += 1 }
            return
        }
        do {
            let sent: Bool
            do {
                sent = try socket.send(datagram, to: peer, from: source?.family == peer.ip.family ? source : nil)
            } catch where source != nil && (error.code == EINVAL || error.code == EADDRNOTAVAIL) {
                sent = try socket.send(datagram, to: peer)
            }
            if !sent { counters.withLock { $0.sendFailures += 1 } }
        } catch {
            counters.withLock { $0.sendFailures += 1 }
            log("send to \(peer) failed: \(error)")
        }
    }
}

/// A bounded first-in, first-out queue of datagrams in one preallocated ring: no allocation per
/// initiation, and a flood cannot grow it.
struct InitiationQueue {
    private var storage: [UInt8]
    private var lengths: [Int]
    private var sources: [SocketAddress?]
    private var locals: [IPAddress?]
    private var head = 0
    private(set) var count = 0
    let capacity: Int

    init(capacity: Int) {
        self.capacity = capacity
        storage = [UInt8](repeating: 0, count: capacity * Initiation.maxLength)
        lengths = [Int](repeating: 0, count: capacity)
        sources = [SocketAddress?](repeating: nil, count: capacity)
        locals = [IPAddress?](repeating: nil, count: capacity)
    }

    /// Copies `datagram` in; false when the queue is full or it is longer than an initiation can be.
    mutating func push(_ datagram: UnsafeRawBufferPointer, from source: SocketAddress, at local: IPAddress? = nil) -> Bool {
        guard count < capacity, datagram.count <= Initiation.maxLength else { return false }
        let slot = (head + count) % capacity
        storage.withUnsafeMutableBytes { ($0.baseAddress! + slot * Initiation.maxLength).copyMemory(from: datagram.baseAddress!, byteCount: datagram.count) }
        lengths[slot] = datagram.count
        sources[slot] = source
        locals[slot] = local
        count += 1
        return true
    }

    /// Copies the oldest datagram into `buffer` and returns its length, its source and the
    /// address it was sent to; nil when empty.
    mutating func pop(into buffer: inout [UInt8]) -> (Int, SocketAddress, IPAddress?)? {
        guard count > 0, let source = sources[head] else { return nil }
        let length = lengths[head]
        let start = head * Initiation.maxLength
        buffer.withUnsafeMutableBytes { out in
            storage.withUnsafeBytes { out.baseAddress!.copyMemory(from: $0.baseAddress! + start, byteCount: length) }
        }
        let local = locals[head]
        sources[head] = nil
        head = (head + 1) % capacity
        count -= 1
        return (length, source, local)
    }
}

/// Host routes for the inner addresses of the peers reachable through one TUN device.
final class PeerRoutes: @unchecked Sendable {  // used by the server's inbound thread only
    private let device: TunDevice
    private let netlink: NetlinkSocket?
    private let log: @Sendable (String) -> Void

    init(device: TunDevice, log: @escaping @Sendable (String) -> Void) {
        self.device = device
        self.log = log
        do {
            netlink = try NetlinkSocket()
        } catch {
            log("cannot open a routing socket; sessions' host routes are not published: \(error)")
            netlink = nil
        }
    }

    /// Routes `addresses` to the device (replacing any other route for them), or removes the
    /// routes through the device (one another server put in since stays).
    func set(_ addresses: [IPAddress], live: Bool) {
        guard let netlink else { return }
        for address in addresses {
            guard let prefix = Prefix(address, length: address.family.bitWidth) else { continue }
            let route = Route(destination: prefix, nextHops: [NextHop(linkIndex: device.index)])
            do throws(NetlinkError) {
                try netlink.write(route, delete: !live)
            } catch where !live && [ENOENT, ESRCH, ENODEV].contains(error.code) {
                // Replaced by another server's route, or gone with the device.
            } catch {
                log("cannot \(live ? "add" : "remove") the route to \(prefix): \(error)")
            }
        }
    }
}
