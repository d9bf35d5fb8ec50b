import Topology
import Basics
import Glibc
public import Logging
import Synchronization
public import Device
import Netlink
public import Streams

/// The server's data plane: a TUN device, UDP sockets, and the protocol core between them,
/// spread over workers.
///
/// Each worker has a queue of the (multi-queue) TUN device and a socket per address family
/// bound to the shared port (`SO_REUSEPORT`): the kernel hands each client's datagrams to one
/// worker's socket and each inner flow's packets to one worker's queue, so the workers, two
/// threads each, never wait for one another. A worker's inbound thread reads datagrams, opens
/// them and writes them to its queue; its outbound thread reads its queue, seals each packet
/// for the client owning its destination and sends it. The sessions they share synchronise per
/// peer (`SessionTable`); each thread counts into counters of its own, summed when read.
///
/// Off the data threads: a handshake thread (the initiations the inbound threads hand over, so
/// a burst of Diffie-Hellman or a flood of cookie replies never holds up established sessions'
/// packets) and a password thread (Argon2id). The core's lock guards the handshake state only.
/// A packet from one client to another goes through the TUN and the host's kernel like any
/// other, so the host's forwarding setting and firewall decide whether clients reach each other
/// (see docs/OPERATOR-GUIDE.md, "Traffic between clients").
public final class TunnelServer: Sendable {
    public let device: TunDevice
    /// The listening sockets of each worker: one IPv4, one IPv6, or both.
    public let workers: [[UDPSocket]]
    /// The first worker's sockets.
    public var sockets: [UDPSocket] { workers[0] }
    /// Handshake state: cookies, budgets, password checks. Never taken on the data path.
    let core: Mutex<ServerCore>
    /// The sessions, replaced whole when the users are (`replaceUsers`). Each data thread keeps
    /// its own reference and takes the new one when `tableGeneration` moves, so the data path
    /// takes no shared lock for it.
    private let table: Mutex<SessionTable>
    let tableGeneration = Atomic<Int>(0)
    /// The table now, for everything off the data path.
    var sessions: SessionTable { table.withLock { $0 } }
    /// Counters of the handshake and password threads (first), then of each data thread.
    let counters: [Counters]
    let running = Atomic<Bool>(false)
    /// Password checks waiting for the worker; bounded by the core's own limit on checks in flight.
    private let checks = Mutex<[PasswordCheck]>([])
    private let checksReady = Semaphore()
    /// Initiations waiting for the handshake thread, with where they came from and the address
    /// they were sent to: peers' and everyone else's in queues of their own.
    private let initiations = Mutex(HandshakeQueues(capacity: TunnelServer.initiationQueueCapacity))
    private let initiationsReady = Semaphore()
    /// Handshake messages queued at most (each up to 1,224 bytes, version 3's first part: 390 KB
    /// in all with the peers' queue); past it, new ones are dropped and counted. The handshake thread answers a flood's initiation with a cookie in
    /// tens of microseconds, so the queue is that many milliseconds of work at most.
    static let initiationQueueCapacity = 256
    let logger: Logger
    /// With a value, each peer reachable here has its inner addresses routed to this server's
    /// TUN device (host routes, replacing another server's), and the routes go when it leaves:
    /// several servers on one host hand sessions over without a lost packet, and a routing
    /// daemon can announce the routes for servers on several hosts.
    private let routes: Mutex<PeerRoutes?>
    /// Draining: sessions are told to move to another server; `run()` returns once none is left.
    private let draining = Atomic<Bool>(false)
    private let handshakesAccepted = Atomic<Int>(0)
    private let handshakesRejected = Atomic<Int>(0)
    /// The stream transport (TLS on TCP), when the gateway offers it: accepted on a thread of its
    /// own, which reads every stream; any data thread sends on them.
    private let streamListener: StreamListener?
    let streamLimits: StreamLimits
    /// The streams by the address they come from: the endpoint the sessions know a client by
    /// while it sends over its stream. A stream that closed stays a while (sending on it drops),
    /// so what is sealed for its client is not sent as datagrams to a TCP port.
    let streams = Mutex<[SocketAddress: GatewayStream]>([:])
    /// How many entries `streams` has: the data path looks no further while it is 0.
    let streamCount = Atomic<Int>(0)
    /// Streams open now, and accepted since start.
    let streamsOpen = Atomic<Int>(0)
    let streamsAccepted = Atomic<Int>(0)
    let streamsRefused = Atomic<Int>(0)
    /// How often the drop counters are logged when they changed.
    static let dropSummaryInterval: Duration = .seconds(60)

    /// An inbound thread per set of sockets (each bound to the same addresses, see
    /// `UDPSocket.listening(on:count:)`; at least one) and an outbound thread per queue of the
    /// device: as many of each, for workers that share nothing.
    public init(core: ServerCore, device: TunDevice, workers: [[UDPSocket]], streams: StreamListener? = nil,
                streamLimits: StreamLimits = StreamLimits(), publishesRoutes: Bool = false, logger: Logger) {
        precondition(!workers.isEmpty, "a server needs sockets to listen on")
        streamListener = streams
        self.streamLimits = streamLimits
        routes = Mutex(publishesRoutes ? PeerRoutes(device: device, logger: logger) : nil)
        table = Mutex(core.sessions)
        self.core = Mutex(core)
        self.device = device
        self.workers = workers
        counters = (0..<(1 + workers.count + device.queues.count)).map { _ in Counters() }
        self.logger = logger
    }

    /// One worker on `sockets`.
    public convenience init(core: ServerCore, device: TunDevice, sockets: [UDPSocket], streams: StreamListener? = nil,
                            publishesRoutes: Bool = false, logger: Logger) {
        self.init(core: core, device: device, workers: [sockets], streams: streams, publishesRoutes: publishesRoutes, logger: logger)
    }

    /// Streams open now, accepted since start, and connections refused past `StreamLimits`.
    public var streamCounts: (open: Int, accepted: Int, refused: Int) {
        (streamsOpen.load(ordering: .relaxed), streamsAccepted.load(ordering: .relaxed), streamsRefused.load(ordering: .relaxed))
    }

    /// Whether the gateway takes streams.
    public var servesStreams: Bool { streamListener != nil }

    /// Reachable peers whose packets come over a stream now.
    public var sessionsOnStreams: Int {
        guard streamCount.load(ordering: .relaxed) > 0 else { return 0 }
        let streams = self.streams.withLock { $0 }
        return records.filter { streams[$0.endpoint]?.isOpen == true }.count
    }

    /// Traffic so far, summed over the threads.
    public var traffic: TrafficCounters {
        counters.reduce(into: TrafficCounters()) { sum, cell in sum.add(cell.value.withLock { $0.traffic }) }
    }
    /// Drops by cause: the handshakes' and every data thread's.
    public var drops: DropCounters {
        counters.reduce(into: core.withLock { $0.drops }) { sum, cell in sum.add(cell.value.withLock { $0.drops }) }
    }
    public var sessionCount: Int { sessions.sessionCount }
    /// Reachable peers by the version and cipher of the session they use.
    public var sessionsByProtocol: [SessionProtocol: Int] { sessions.liveProtocols }
    /// Handshakes answered with a session, and refused with an answer (both since start).
    public var handshakeCounts: (accepted: Int, rejected: Int) {
        (handshakesAccepted.load(ordering: .relaxed), handshakesRejected.load(ordering: .relaxed))
    }
    /// Initiations let through to Diffie-Hellman since start, by lane: the budgets of everyone
    /// without a session, or the lane reserved for peers with one.
    public var admissions: Admissions { core.withLock { $0.admissions } }

    /// Runs until `stop()`: each worker's two threads, the handshake and password threads, and
    /// the first worker's inbound loop here.
    public func run() {
        running.store(true, ordering: .relaxed)
        var bodies: [(String, @Sendable () -> Void)] = [("handshake", handshakes), ("password", checkPasswords)]
        for queue in device.queues.indices { bodies.append(("outbound \(queue)", { self.outbound(queue) })) }
        for worker in workers.indices.dropFirst() { bodies.append(("inbound \(worker)", { self.inbound(worker) })) }
        if let listener = streamListener { bodies.append(("streams", { self.serveStreams(listener) })) }
        var threads: [OSThread] = []
        for (name, body) in bodies {
            do {
                threads.append(try OSThread(body))
            } catch {
                logger.error("cannot start a thread", error: error, metadata: ["thread": "\(name)"])
                stop()
                wake()
                for thread in threads { thread.join() }
                return
            }
        }
        inbound(0)
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
    public var liveSessions: Int { sessions.livePeerCount }
    /// Users served now.
    public var userCount: Int { sessions.users.users.count }

    /// Every peer reachable here now: who, where from, since when, how many bytes.
    public var records: [SessionRecord] { sessions.records(now: Instant.now()) }

    /// Serves `users` from now on: users listed exactly as before keep their sessions (no
    /// packet of theirs waits or is lost); removed or changed users' sessions end and their
    /// routes go. Returns how many sessions that were reachable ended.
    public func replaceUsers(_ users: UserDatabase) -> Int {
        let (fresh, ended) = core.withLock { $0.replaceUsers(users) }
        table.withLock { $0 = fresh }
        tableGeneration.add(1, ordering: .releasing)
        routes.withLock { routes in
            for addresses in ended { routes?.set(addresses, live: false) }
        }
        return ended.count
    }

    /// This thread's table: the one it had, or the new one since a replacement.
    func refresh(_ sessions: inout SessionTable, seen: inout Int) {
        let generation = tableGeneration.load(ordering: .acquiring)
        guard generation != seen else { return }
        sessions = self.sessions
        seen = generation
    }

    /// What logs call `peer` in the current table (a label from a table just replaced may name
    /// someone else for the moment it takes).
    private func label(_ peer: PeerID) -> String {
        let users = sessions.users.users
        return users.indices.contains(peer.index) ? users[peer.index].label : "\(peer)"
    }

    /// Tells every session that this server is being taken down (again each second while
    /// draining, for a message lost on the way); `run()` returns once no session is left.
    public func drain() {
        draining.store(true, ordering: .relaxed)
        for message in sessions.drainMessages(now: Instant.now()) {
            send(message.datagram, to: message.to, from: message.from, worker: 0, counters: counters[0])
        }
    }

    /// Initiations, one at a time, off the data threads. The core's lock is held for the
    /// cheap steps only; the Diffie-Hellman ones (open, write) run outside it.
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
                [UInt8]().withUnsafeBytes { handle(event, in: $0, local: local, worker: 0, counters: counters[0]) }
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
            [UInt8]().withUnsafeBytes { handle(event, in: $0, local: check.local, worker: 0, counters: counters[0]) }
        }
    }

    // MARK: Inbound: datagrams to the TUN

    /// A worker's datagrams, opened and written to its queue. The first worker also keeps the
    /// core's upkeep (once a second) and the drop summary.
    private func inbound(_ worker: Int) {
        let sockets = workers[worker]
        let mine = counters[1 + worker]
        let queue = worker % device.queues.count
        var hints = core.withLock { $0.hintShare(of: workers.count) }
        var sessions = self.sessions
        var seen = tableGeneration.load(ordering: .acquiring)
        // Sockets that receive joined runs of datagrams need slots of 64 KB (1 MB in all).
        let joins = sockets.contains { $0.joinsReceived }
        let batch = joins ? PacketBatch(capacity: 16, slotBytes: 65_536) : PacketBatch(capacity: 32)
        // With a virtio header, a batch's segments of one TCP flow go to the TUN as one packet.
        var coalescer = device.hasVirtioHeader ? Coalescer() : nil
        defer { coalescer?.release() }
        var traffic = TrafficCounters()
        var drops = DropCounters()
        var lastTick = Instant.now()
        var lastSummary = (at: Instant.now(), drops: DropCounters())
        let write = { (packet: UnsafeRawBufferPointer, header: VirtioNetHeader) in
            self.write(packet, header, queue: queue, traffic: &traffic)
        }
        while running.load(ordering: .relaxed) {
            let ready: [Int32]
            do {
                ready = try pollReadable(sockets.map(\.fileDescriptor), timeout: .seconds(1))
            } catch {
                logger.warning("poll failed", error: error, metadata: ["cause": "poll"])
                continue
            }
            let now = Instant.now()
            if now - lastTick >= .seconds(1) {
                hints.prune(now: now)
                lastTick = now
                if worker == 0 {
                    core.withLock { $0.tick(now: now) }
                    // Once a second while draining, for a message lost on the way.
                    if draining.load(ordering: .relaxed), liveSessions > 0 { drain() }
                    // What was dropped and why, once a minute when anything was: floods show in
                    // the log as counts, not as lines.
                    if now - lastSummary.at >= Self.dropSummaryInterval {
                        let drops = self.drops
                        if drops != lastSummary.drops { logger.notice("drops so far", metadata: ["drops": "\(drops)"]) }
                        lastSummary = (now, drops)
                    }
                }
            }
            refresh(&sessions, seen: &seen)
            // Every ready socket gets its turn, so a flood on one family cannot starve the other.
            for socket in sockets where ready.contains(socket.fileDescriptor) {
                let received: Int
                do {
                    received = try socket.receive(into: batch, timeout: .zero)
                } catch {
                    logger.warning("receive failed", error: error, metadata: ["cause": "receive"])
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
                        let event: ServerEvent
                        switch ServerCore.kind(of: UnsafeRawBufferPointer(slot)) {
                        case .success(.data):
                            event = sessions.receive(slot, from: source, at: local, now: now, drops: &drops, hints: &hints)
                        case .success(.handshake):
                            // For the handshake thread.
                            handOver(UnsafeRawBufferPointer(slot), from: source, at: local,
                                     fromPeer: sessions.peer(provenAt: source) != nil, traffic: &traffic)
                            continue
                        case .failure(let reason):
                            drops.count(reason)
                            continue
                        }
                        if case .packet(_, let range) = event, coalescer != nil {
                            traffic.packetsIn += 1
                            traffic.bytesIn += range.count
                            coalescer!.add(UnsafeRawBufferPointer(rebasing: UnsafeRawBufferPointer(slot)[range]), write: write)
                            continue
                        }
                        coalescer?.flush(write: write)
                        handle(event, in: UnsafeRawBufferPointer(slot), local: local, worker: worker, queue: queue, traffic: &traffic)
                    }
                }
                coalescer?.flush(write: write)
                // Counted once per batch, into this thread's own counters.
                mine.add(&traffic, &drops)
            }
            if sessions.hasLiveChanges { publishRoutes(sessions) }
            if draining.load(ordering: .relaxed), liveSessions == 0 {
                logger.info("drained: no session left")
                stop()
            }
        }
    }

    /// Hands an initiation to the handshake thread.
    func handOver(_ datagram: UnsafeRawBufferPointer, from source: SocketAddress, at local: IPAddress?,
                          fromPeer: Bool, traffic: inout TrafficCounters) {
        let (queued, wasEmpty) = initiations.withLock { queue in
            let wasEmpty = queue.count == 0
            return (queue.push(datagram, from: source, at: local, fromPeer: fromPeer), wasEmpty)
        }
        // The handshake thread drains the whole queue per wake: one signal per batch of work.
        if queued, wasEmpty { initiationsReady.signal() }
        if !queued { traffic.initiationsOverflowed += 1 }
    }

    func write(_ packet: UnsafeRawBufferPointer, _ header: VirtioNetHeader, queue: Int, traffic: inout TrafficCounters) {
        do {
            try device.write(packet, header: header, queue: queue)
            if header.gsoType != 0 { traffic.superPacketsWritten += 1 }
        } catch {
            logger.warning("write to the tunnel device failed", error: error, metadata: ["cause": "tun-write", "tunnel": "\(device.name)"])
        }
    }

    /// Routes for peers that became reachable here or left since the last call.
    func publishRoutes(_ sessions: SessionTable) {
        routes.withLock { routes in
            let changes = sessions.takeLiveChanges()
            guard let routes else { return }
            for change in changes { routes.set(sessions.users[change.peer].addresses, live: change.live) }
        }
    }

    /// Acts on what the core made of a datagram that was sent to `local` (replies go out from
    /// it), on a data thread: counts go into its own `traffic`.
    func handle(_ event: ServerEvent, in raw: UnsafeRawBufferPointer, local: IPAddress?, worker: Int, queue: Int,
                        traffic: inout TrafficCounters) {
        switch event {
        case .packet(_, let range):
            traffic.packetsIn += 1
            traffic.bytesIn += range.count
            // Also when it is for another client: the kernel routes it back out of the TUN only
            // if forwarding is on and the host's firewall lets it through.
            write(UnsafeRawBufferPointer(rebasing: raw[range]), VirtioNetHeader(), queue: queue, traffic: &traffic)
        case .keepalive:
            traffic.keepalivesIn += 1
        default:
            handle(event, in: raw, local: local, worker: worker, counters: counters[1 + worker])
        }
    }

    /// Acts on an event that needs no data thread's counters: answers, refusals, checks to run.
    private func handle(_ event: ServerEvent, in raw: UnsafeRawBufferPointer, local: IPAddress?, worker: Int, counters: Counters) {
        switch event {
        case .packet, .keepalive:
            var traffic = TrafficCounters()
            handle(event, in: raw, local: local, worker: worker, queue: worker % device.queues.count, traffic: &traffic)
            var none = DropCounters()
            counters.add(&traffic, &none)
        case .handshake(let peer, let response, let to):
            proveStream(to)
            send(response, to: to, from: local, worker: worker, counters: counters)
            handshakesAccepted.add(1, ordering: .relaxed)
            let spoken = sessions.newestProtocol(of: peer)
            logger.info("handshake", metadata: ["from": "\(to)", "user": "\(label(peer))",
                                                "protocol": "\(spoken.map { "\($0.version)" } ?? "-")",
                                                "cipher": "\(spoken.map { "\($0.cipher)" } ?? "-")"])
        case .rejected(let reason, let response, let to):
            send(response, to: to, from: local, worker: worker, counters: counters)
            handshakesRejected.add(1, ordering: .relaxed)
            // One line per cause per interval (the log handler counts the rest): a flood of
            // refused handshakes must not become a flood of log lines.
            logger.warning("handshake rejected", metadata: ["cause": "rejected:\(reason)", "reason": "\(reason)", "from": "\(to)"])
        case .checkPassword(let check):
            checks.withLock { $0.append(check) }
            checksReady.signal()
        case .echo(_, let datagram, let to), .sessionUnknown(let datagram, let to), .cookie(let datagram, let to),
             .reply(let datagram, let to):
            send(datagram, to: to, from: local, worker: worker, counters: counters)
        case .held:
            break
        case .closed(let peer):
            logger.info("session closed by the client", metadata: ["user": "\(label(peer))"])
        case .dropped:
            break
        }
    }

    // MARK: Outbound: TUN packets to datagrams

    /// A queue of the device: packets from the TUN, each sealed in place for the client owning
    /// its destination, batched and sent with one `sendmmsg` on the sockets of its worker.
    private func outbound(_ queue: Int) {
        let worker = queue % workers.count
        let sockets = workers[worker]
        let mine = counters[1 + workers.count + queue]
        let batch = PacketBatch(capacity: 64)
        var reader = TunReader(device, queue: queue)
        defer { reader.release() }
        var traffic = TrafficCounters()
        var drops = DropCounters()
        let fd = device.queues[queue]
        var sessions = self.sessions
        var seen = tableGeneration.load(ordering: .acquiring)
        // Per client (the packet's destination), so one client's answers never use up another's.
        var tooBigLimiter = KeyedRateLimiter<IPAddress>(PacketTooBig.rate, capacity: PacketTooBig.clientsKept)
        while running.load(ordering: .relaxed) {
            do {
                guard try !pollReadable([fd], timeout: .seconds(1)).isEmpty else { continue }
            } catch {
                logger.warning("poll failed", error: error, metadata: ["cause": "poll-tunnel", "tunnel": "\(device.name)"])
                continue
            }
            refresh(&sessions, seen: &seen)
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
                            let sealed = try sessions.seal(frame, innerLength: length, toInner: destination, now: now)
                            traffic.packetsOut += 1
                            traffic.bytesOut += length
                            source = sealed.source
                            return (sealed.length, sealed.destination)
                        } catch SealFailure.tooBig(let mtu) {
                            // The client's path would lose it: its sender hears so, as from a router.
                            let packet = UnsafeRawBufferPointer(rebasing: inner[0..<length])
                            answerTooBig(packet, to: destination, mtu: mtu, queue: queue, limiter: &tooBigLimiter,
                                         now: now, traffic: &traffic)
                            return nil
                        } catch {
                            traffic.noSession += 1
                            return nil
                        }
                    }
                    // From the address the client sends to, as its NAT expects.
                    if appended { batch.setSource(source, at: batch.count - 1) }
                }
                traffic.record(&reader)
                if batch.count > 0 { send(batch, on: sockets, worker: worker, traffic: &traffic) }
                // Counted once per batch, into this thread's own counters.
                mine.add(&traffic, &drops)
            }
        }
    }

    /// Writes the ICMP answer to a packet bigger than its client's path carries into the device,
    /// within `PacketTooBig.rate` per client (`destination`) and queue.
    private func answerTooBig(_ packet: UnsafeRawBufferPointer, to destination: IPAddress, mtu: Int, queue: Int,
                              limiter: inout KeyedRateLimiter<IPAddress>, now: Instant, traffic: inout TrafficCounters) {
        traffic.tooBig += 1
        guard limiter.allow(destination, now: now), let answer = PacketTooBig.answer(to: packet, mtu: mtu) else { return }
        answer.withUnsafeBytes { write($0, VirtioNetHeader(), queue: queue, traffic: &traffic) }
        traffic.tooBigAnswered += 1
    }

    /// Sends a batch through the socket of its first datagram's family, any others one by one.
    private func send(_ batch: PacketBatch, on sockets: [UDPSocket], worker: Int, traffic: inout TrafficCounters) {
        if batch.streamPeers > 0 {
            sendOnStreams(batch, worker: worker, traffic: &traffic)
            return
        }
        let family = batch.peer(at: 0)?.ip.family
        guard let socket = sockets.first(where: { $0.local.ip.family == family }) else {
            traffic.sendFailures += batch.count
            return
        }
        if (0..<batch.count).allSatisfy({ batch.peer(at: $0)?.ip.family == family }) {
            do {
                let sent = try socket.sendSegmented(batch)
                traffic.sendFailures += batch.count - sent
            } catch {
                traffic.sendFailures += batch.count
                logger.warning("send failed", error: error, metadata: ["cause": "send"])
            }
        } else {
            for i in 0..<batch.count {
                if let peer = batch.peer(at: i) {
                    send(batch.packet(at: i), to: peer, from: batch.source(at: i), worker: worker, traffic: &traffic)
                }
            }
        }
    }

    /// Sends the packets of `batch` sealed for clients on streams, each stream's in one write
    /// (a stream gone: dropped), and the rest one by one.
    private func sendOnStreams(_ batch: PacketBatch, worker: Int, traffic: inout TrafficCounters) {
        let streams = self.streams.withLock { $0 }
        var byStream: [ObjectIdentifier: (stream: GatewayStream, packets: [Int])] = [:]
        var datagrams: [Int] = []
        for i in 0..<batch.count {
            guard let peer = batch.peer(at: i) else { continue }
            if !peer.overStream {
                datagrams.append(i)
            } else if let stream = streams[peer] {
                byStream[ObjectIdentifier(stream), default: (stream, [])].packets.append(i)
            } else {
                traffic.sendFailures += 1
            }
        }
        for (stream, packets) in byStream.values {
            let sent = stream.send(packets.map { batch.packet(at: $0) })
            traffic.sendFailures += packets.count - sent
        }
        for i in datagrams {
            if let peer = batch.peer(at: i) { send(batch.packet(at: i), to: peer, from: batch.source(at: i), worker: worker, traffic: &traffic) }
        }
    }

    private func send(_ datagram: [UInt8], to peer: SocketAddress, from source: IPAddress?, worker: Int, counters: Counters) {
        var traffic = TrafficCounters()
        datagram.withUnsafeBytes { send($0, to: peer, from: source, worker: worker, traffic: &traffic) }
        var none = DropCounters()
        counters.add(&traffic, &none)
    }

    /// Sends from `source` when given (the address the peer sent to); if that address is gone
    /// from the host, from whichever the kernel picks.
    private func send(_ datagram: UnsafeRawBufferPointer, to peer: SocketAddress, from source: IPAddress?, worker: Int,
                      traffic: inout TrafficCounters) {
        if peer.overStream {
            // A stream's far end: on its stream, or nowhere (never as a datagram to a TCP port).
            let stream = streamCount.load(ordering: .relaxed) > 0 ? streams.withLock { $0[peer] } : nil
            if stream?.send([datagram]) != 1 { traffic.sendFailures += 1 }
            return
        }
        guard let socket = workers[worker].first(where: { $0.local.ip.family == peer.ip.family }) else {
            traffic.sendFailures += 1
            return
        }
        do {
            let sent: Bool
            do {
                sent = try socket.send(datagram, to: peer, from: source?.family == peer.ip.family ? source : nil)
            } catch where source != nil && (error.code == EINVAL || error.code == EADDRNOTAVAIL) {
                sent = try socket.send(datagram, to: peer)
            }
            if !sent { traffic.sendFailures += 1 }
        } catch {
            traffic.sendFailures += 1
            logger.warning("send failed", error: error, metadata: ["cause": "send", "to": "\(peer)"])
        }
    }
}

/// One thread's counters, behind a lock only their reader shares: exact, and never contended
/// between threads.
final class Counters: Sendable {
    let value = Mutex((traffic: TrafficCounters(), drops: DropCounters()))

    /// Adds what a thread counted since its last call and zeroes it. Runs once per batch: no
    /// drop counters are made or compared unless something was dropped.
    func add(_ traffic: inout TrafficCounters, _ drops: inout DropCounters) {
        let dropped = drops.total > 0
        guard dropped || traffic != TrafficCounters() else { return }
        value.withLock { value in
            value.traffic.add(traffic)
            if dropped { value.drops.add(drops) }
        }
        traffic = TrafficCounters()
        if dropped { drops = DropCounters() }
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
        storage = [UInt8](repeating: 0, count: capacity * ServerCore.maxHandshakeLength)
        lengths = [Int](repeating: 0, count: capacity)
        sources = [SocketAddress?](repeating: nil, count: capacity)
        locals = [IPAddress?](repeating: nil, count: capacity)
    }

    /// Copies `datagram` in; false when the queue is full or it is longer than an initiation can be.
    mutating func push(_ datagram: UnsafeRawBufferPointer, from source: SocketAddress, at local: IPAddress? = nil) -> Bool {
        guard count < capacity, datagram.count <= ServerCore.maxHandshakeLength else { return false }
        let slot = (head + count) % capacity
        storage.withUnsafeMutableBytes { ($0.baseAddress! + slot * ServerCore.maxHandshakeLength).copyMemory(from: datagram.baseAddress!, byteCount: datagram.count) }
        lengths[slot] = datagram.count
        sources[slot] = source
        locals[slot] = local
        count += 1
        return true
    }

    /// How many of the queued datagrams came from `source` (a scan of the ring: the queues are small).
    func count(from source: SocketAddress) -> Int {
        var n = 0
        for i in 0..<count where sources[(head + i) % capacity] == source { n += 1 }
        return n
    }

    /// Copies the oldest datagram into `buffer` and returns its length, its source and the
    /// address it was sent to; nil when empty.
    mutating func pop(into buffer: inout [UInt8]) -> (Int, SocketAddress, IPAddress?)? {
        guard count > 0, let source = sources[head] else { return nil }
        let length = lengths[head]
        let start = head * ServerCore.maxHandshakeLength
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

/// The handshake thread's two queues: initiations from an address where a peer proved itself
/// lately (`SessionTable.peer(provenAt:)`; nothing proven yet, the core checks that) and everyone
/// else's. Taken in turn, so a flood that fills one cannot keep the other waiting: a peer's rekey
/// waits behind one flood initiation at most, however full the other queue is. The lane is
/// chosen by the source address before any check of the datagram, so someone who can send from
/// a peer's address (its IP and port) could fill the peers' queue with garbage: each address
/// holds at most `perSourceInPeers` places in it, and what comes from it beyond that waits with
/// everyone else's, under the core's per-source budgets.
struct HandshakeQueues {
    private var peers: InitiationQueue
    private var others: InitiationQueue
    private var peersNext = true
    /// A peer's rekey needs one initiation (version 3: two parts and the identity), and room
    /// for a resend; a version 3 second part behind its first part in the same queue.
    static let perSourceInPeers = 4

    /// `capacity` for everyone else's; the peers' queue holds a quarter as many.
    init(capacity: Int) {
        peers = InitiationQueue(capacity: max(capacity / 4, 1))
        others = InitiationQueue(capacity: capacity)
    }

    var count: Int { peers.count + others.count }

    /// False when the queue it belongs in is full (see `InitiationQueue.push`).
    mutating func push(_ datagram: UnsafeRawBufferPointer, from source: SocketAddress, at local: IPAddress? = nil,
                       fromPeer: Bool) -> Bool {
        if fromPeer, peers.count(from: source) < Self.perSourceInPeers, peers.push(datagram, from: source, at: local) { return true }
        return others.push(datagram, from: source, at: local)
    }

    /// The next initiation, from each queue in turn while both hold some.
    mutating func pop(into buffer: inout [UInt8]) -> (Int, SocketAddress, IPAddress?)? {
        defer { peersNext.toggle() }
        return peersNext ? peers.pop(into: &buffer) ?? others.pop(into: &buffer) : others.pop(into: &buffer) ?? peers.pop(into: &buffer)
    }
}

/// Host routes for the inner addresses of the peers reachable through one TUN device.
final class PeerRoutes: @unchecked Sendable {  // used under the server's lock for it only
    private let device: TunDevice
    private let netlink: NetlinkSocket?
    private let logger: Logger

    init(device: TunDevice, logger: Logger) {
        self.device = device
        self.logger = logger
        do {
            netlink = try NetlinkSocket()
        } catch {
            logger.error("cannot open a routing socket; sessions' host routes are not published", error: error)
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
                logger.error(live ? "cannot add a session's route" : "cannot remove a session's route", error: error, metadata: ["prefix": "\(prefix)"])
            }
        }
    }
}

