public import Basics
public import Reconnector
import Glibc
public import Logging
import Synchronization
public import Device

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
    /// The sessions and the sockets, changed and read together.
    private let peering: Mutex<Peering>
    /// The generation (`Peering.generation`) of the session the sending thread seals the batch
    /// in hand with, from reading its keys until the batch is sent; 0 between batches. A goodbye
    /// to a server left behind waits for it to move on (`sayGoodbye(to:left:)`).
    private let sealing = Atomic<UInt64>(0)
    /// How long the session left at a handover still opens packets from its server: those in
    /// flight when the traffic moved arrive within a round trip; then its keys go.
    static let retiredFor: Duration = .seconds(5)
    private let device: Mutex<TunDevice?> = Mutex(nil)
    private let outboundStarted = Atomic<Bool>(false)
    private let outboundThread = Mutex<OSThread?>(nil)
    private let counters = Mutex(TrafficCounters())
    private let lastEcho = Mutex<(id: UInt64, rtt: Duration)?>(nil)
    /// The path MTU to tell the server (`announcePathMTU`), and whether it still has to hear it.
    private let pathMTU = Mutex<(wanted: Int?, unheard: Bool)>((nil, false))
    private let lastInitiation = Mutex<Instant?>(nil)
    private let handshakes = Atomic<Int>(0)
    private let running = Atomic<Bool>(false)
    /// The session was ended on purpose (`endSession`): no handshake starts by itself.
    private let held = Atomic<Bool>(false)
    private let inboundWakeup: Wakeup
    private let outboundWakeup: Wakeup
    private let logger: Logger
    /// Where the facts the core needs go, as its events (`AgentEvent`): each reported once per
    /// change, never per packet.
    private let notify: @Sendable (AgentEvent) -> Void
    /// Whether `.dataSent` was reported and no packet has arrived since.
    private let awaitingReply = Atomic<Bool>(false)
    /// When the last authenticated packet arrived, and when an arrival was last reported
    /// (Instant nanoseconds; the rules are `LivenessNotices`).
    private let lastReceived = Atomic<Int64>(0)
    private let lastReported = Atomic<Int64>(0)
    /// When unanswered data was last reported (written by the sending thread alone).
    private let lastSentReport = Atomic<Int64>(0)

    /// Answers the server's "session unknown" hint with a handshake by itself; off when a
    /// state machine decides (it hears `.sessionUnknown` and asks for the handshake).
    private let answersHints: Bool
    /// With a value, a keepalive goes out after this long without a packet from the tunnel
    /// device, so a NAT on the way keeps its mapping; nil (the default) sends none.
    private let persistentKeepalive: Mutex<Duration?>

    /// `notify` hears the facts a driver needs. The client rekeys by itself, and with
    /// `answersHints` also re-handshakes on a hint, so it works on its own as well.
    public init(core: ClientCore, socket: any PacketCarrier, server: SocketAddress, answersHints: Bool = true,
                persistentKeepalive: Duration? = nil, logger: Logger,
                notify: @escaping @Sendable (AgentEvent) -> Void = { _ in }) throws(DeviceError)
    {
        self.answersHints = answersHints
        self.persistentKeepalive = Mutex(persistentKeepalive)
        peering = Mutex(Peering(session: ServerSession(core: core, server: server), socket: socket))
        self.logger = logger
        self.notify = notify
        inboundWakeup = try Wakeup()
        outboundWakeup = try Wakeup()
    }

    public var traffic: TrafficCounters { counters.withLock { $0 } }
    public var drops: DropCounters { peering.withLock { $0.drops } }
    /// Handshakes started since the client was made.
    public var handshakeCount: Int { handshakes.load(ordering: .relaxed) }
    /// The inner addresses the server gave this client.
    public var addresses: [IPAddress] { peering.withLock { $0.session.core.addresses } }
    /// What the session in use speaks (version and cipher); nil without one.
    public var sessionProtocol: SessionProtocol? { peering.withLock { $0.session.core.session } }
    /// The socket (or stream) the session uses now.
    public var socket: any PacketCarrier { peering.withLock { $0.socket } }
    /// Where the server is: every datagram goes there.
    public var server: SocketAddress { peering.withLock { $0.session.server } }

    /// Sends to the server at `address` from now on (its name resolves elsewhere now). The
    /// session and keys stay; whoever decides proves the new address with a probe.
    public func setServer(_ address: SocketAddress) {
        peering.withLock { $0.session.server = address }
    }

    // MARK: Several servers

    /// Talks to another server from now on, with `core` (which pins that server's key): the
    /// session with the previous one is over (its keys go with it). A handshake follows.
    public func useServer(_ core: ClientCore, at address: SocketAddress) {
        peering.withLock { $0.use(ServerSession(core: core, server: address)) }
        lastInitiation.withLock { $0 = nil }
    }

    /// Make-before-break across servers: handshakes with the server at `address` over the
    /// current socket while the current session keeps carrying the traffic. `.handoverReady`
    /// (or `.handoverRejected`) tells the outcome; `completeHandover()` then moves the traffic.
    public func prepareHandover(_ core: ClientCore, at address: SocketAddress) {
        var prepared = ServerSession(core: core, server: address)
        guard let initiation = try? prepared.core.initiation(now: Instant.now(), wallClock: TAI64N.now()) else { return }
        peering.withLock { $0.standby = prepared }
        handshakes.add(1, ordering: .relaxed)
        for datagram in initiation { send(datagram, to: address) }
        inboundWakeup.signal()
    }

    /// The prepared session takes the traffic. The old server is told goodbye, and packets
    /// still on their way from it are opened and delivered.
    public func completeHandover() {
        let until = Instant.now() + Self.retiredFor
        guard let (old, generation) = peering.withLock({ $0.completeHandover(retiredUntil: until) }) else { return }
        pathMTUUnheard()
        // The goodbye goes a moment later: the new server routes this client's inner addresses
        // to itself once the session's first packet reaches it, and until then what comes back
        // for the client still goes through the old one, which must still hold the session.
        do {
            try OSThread.detach { [self] in
                usleep(UInt32(Self.goodbyeDelay.nanoseconds / 1000))
                sayGoodbye(to: old, left: generation)
            }
        } catch {
            sayGoodbye(to: old, left: generation)
        }
    }

    /// How long after a handover the old server is told goodbye.
    static let goodbyeDelay: Duration = .milliseconds(200)

    /// Tells the server of `session`, which carried the traffic as generation `generation`, goodbye
    /// once no batch sealed with its keys is on its way out: the server forgets the session when
    /// it reads the goodbye. A batch takes well under a millisecond; the wait stops at 100 ms all
    /// the same, so a stalled sending thread cannot keep the goodbye back.
    private func sayGoodbye(to session: ServerSession, left generation: UInt64) {
        // One load tells: the handover replaced the session in a hold of the lock before this
        // runs. A batch that read the old keys did so in an earlier hold and stored `generation`
        // during it, so that store happens before this load, which sees it or a later one; and
        // every later store is a release made after that batch was sent (0, or the generation
        // of a batch read after the handover), so seeing one orders that send before ours.
        for _ in 0..<100 {
            guard sealing.load(ordering: .acquiring) == generation else { break }
            usleep(1000)
        }
        sayGoodbye(to: session)
    }

    /// Tells `server` of `session` goodbye on its keys: it forgets the session at once.
    private func sayGoodbye(to session: ServerSession) {
        var session = session
        if let goodbye = try? session.core.close(now: Instant.now()) { send(goodbye, to: session.server) }
    }

    /// Forgets the prepared session.
    public func cancelHandover() {
        peering.withLock { $0.standby = nil }
    }

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
                // What arrived, each message of a joined run (a stream's, or UDP's GRO) on its own.
                let events: [ClientEvent] = (try? buffer.withUnsafeMutableBytes { (raw) throws(DeviceError) -> [ClientEvent] in
                    guard let (length, peer, segment) = try socket.receiveJoined(into: raw, timeout: max(wait, .milliseconds(1))),
                          segment > 0
                    else { return [] }
                    return stride(from: 0, to: length, by: segment).map { start in
                        peering.withLock {
                            $0.session.receive(UnsafeMutableRawBufferPointer(rebasing: raw[start..<min(start + segment, length)]), from: peer,
                                               now: Instant.now())
                        }
                    }
                }) ?? []
                for event in events {
                    switch event {
                    case .established(let completion):
                        send(completion.confirmation)
                        return completion
                    case .rejected:
                        throw .rejected
                    case .cookie(let resend):
                        send(resend)
                    case .send(let datagrams):
                        for datagram in datagrams { send(datagram) }
                    default:
                        continue
                    }
                }
            }
        }
        throw .timeout(timeout)
    }

    /// Runs the data loops until `stop()`: datagrams in here, packets from the TUN out on a
    /// thread of its own. Without `tun` the session can come up first (its handshake gives the
    /// inner address the TUN needs); `attach(_:)` adds the device later.
    public func run(with tun: TunDevice? = nil) {
        running.store(true, ordering: .relaxed)
        if let tun { attach(tun) }
        inbound()
        outboundThread.withLock { $0 }?.join()
    }

    /// Gives the running client its TUN device, once: the device is configured once and stays.
    public func attach(_ tun: TunDevice) {
        guard !outboundStarted.exchange(true, ordering: .relaxed) else { return }
        device.withLock { $0 = tun }
        do {
            let thread = try OSThread { [self] in outbound(tun) }
            outboundThread.withLock { $0 = thread }
        } catch {
            logger.error("cannot start the outbound thread; packets from the tunnel device are not sent", error: error)
        }
    }

    /// Starts a handshake on the current socket without waiting: `.handshakeCompleted` (or
    /// `.rejected`) reports the outcome while `run` is going.
    public func startHandshake() {
        held.store(false, ordering: .relaxed)
        initiate(force: true)
    }

    /// Ends the session without stopping: the server is told goodbye (it forgets the session at
    /// once) and the keys are forgotten. The device stays attached; its packets are dropped as
    /// having no session, and no handshake starts by itself until `startHandshake`.
    public func endSession() {
        held.store(true, ordering: .relaxed)
        sayGoodbye(to: peering.withLock { $0.end() })
    }

    /// Tells the server this client is going away (it forgets the session at once), then stops.
    public func close() {
        sayGoodbye(to: peering.withLock { $0.session })
        stop()
    }

    public func stop() {
        running.store(false, ordering: .relaxed)
        inboundWakeup.signal()
        outboundWakeup.signal()
    }

    /// Moves the session to `socket` (a new path): the server follows on the first
    /// authenticated packet, so a keepalive goes out at once. No handshake, keys unchanged.
    public func rebind(to socket: any PacketCarrier) {
        peering.withLock { $0.rebind(to: socket) }
        inboundWakeup.signal()
        sendKeepalive()
    }

    private func sendKeepalive() {
        if let (keepalive, server) = try? peering.withLock({ (peering) throws(SealFailure) in
            (try peering.session.core.keepalive(now: Instant.now()), peering.session.server)
        }) {
            send(keepalive, to: server)
        }
    }

    /// Sends a probe over `socket` (a path being tried; the current one when nil), padded to
    /// stand for a tunnel packet of `size` bytes if given. Its echo is reported as
    /// `.probeEcho(id:rtt:size:)` and shown by `lastProbeEcho`.
    public func probe(id: UInt64, via socket: (any PacketCarrier)? = nil, size: Int? = nil) {
        guard let (datagram, server, candidate) = try? peering.withLock({ (peering) throws(SealFailure) in
            (try peering.session.core.probe(id: id, now: Instant.now(), size: size), peering.session.server,
             peering.probing(via: socket))
        }) else { return }
        guard let (socket, joined) = candidate else {
            send(datagram, to: server)
            return sendPathMTUNotice()
        }
        if joined { inboundWakeup.signal() }
        datagram.withUnsafeBytes { bytes in
            if (try? socket.send(bytes, to: server)) != true { counters.withLock { $0.sendFailures += 1 } }
        }
    }

    /// Tells the server the largest inner packet this client's path carries (the tunnel MTU path
    /// MTU discovery set), if it takes such notices; said again with every probe until the server
    /// answers, and after every handshake and handover.
    public func announcePathMTU(_ mtu: Int) {
        pathMTU.withLock { $0 = (mtu, true) }
        sendPathMTUNotice()
    }

    /// The path MTU notice, when there is one the server has not answered yet.
    private func sendPathMTUNotice() {
        guard let mtu = pathMTU.withLock({ $0.unheard ? $0.wanted : nil }) else { return }
        if let (notice, server) = try? peering.withLock({ (peering) throws(SealFailure) -> ([UInt8], SocketAddress)? in
            guard peering.session.core.takesPathMTUNotices else { return nil }
            return (try peering.session.core.pathMTUNotice(mtu, now: Instant.now()), peering.session.server)
        }) {
            send(notice, to: server)
        }
    }

    /// A new session (a handshake, a handover) holds nothing of what the last one was told.
    private func pathMTUUnheard() {
        pathMTU.withLock { if $0.wanted != nil { $0.unheard = true } }
        sendPathMTUNotice()
    }

    /// Changes the persistent keepalive interval (nil: none) of the running client.
    public func setPersistentKeepalive(_ interval: Duration?) {
        persistentKeepalive.withLock { $0 = interval }
        outboundWakeup.signal()
    }

    /// A carrier's descriptor changed (a stream opened or broke): poll the new set.
    public func carriersChanged() {
        inboundWakeup.signal()
    }

    /// Stops listening on a path that was tried and not taken.
    public func forget(candidate socket: any PacketCarrier) {
        peering.withLock { $0.forget(candidate: socket) }
        inboundWakeup.signal()
    }

    /// The newest probe echo: its id and round-trip time.
    public var lastProbeEcho: (id: UInt64, rtt: Duration)? { lastEcho.withLock { $0 } }

    // MARK: Loops

    private func inbound() {
        // Room for a run of datagrams the kernel joined (UDP_GRO).
        var buffer = [UInt8](repeating: 0, count: 65_536)
        // With a virtio header, consecutive segments of one TCP flow go to the TUN as one packet.
        var coalescer: Coalescer?
        defer { coalescer?.release() }
        while running.load(ordering: .relaxed) {
            let sockets = peering.withLock { [$0.socket] + $0.candidates }
            do {
                // A stream may hold messages already read, which no poll shows.
                let buffered = sockets.filter(\.hasBuffered)
                let ready = try pollReadable(sockets.compactMap(\.pollDescriptor) + [inboundWakeup.readEnd],
                                             timeout: buffered.isEmpty ? nil : .zero)
                if ready.contains(inboundWakeup.readEnd) { inboundWakeup.drain() }
                // Attached once and never changed: read once per wake, not per datagram.
                let tun = device.withLock { $0 }
                if coalescer == nil, tun?.hasVirtioHeader == true { coalescer = Coalescer() }
                for socket in sockets where socket.pollDescriptor.map(ready.contains) == true || buffered.contains(where: { $0 === socket }) {
                    // Drain what is queued, then poll again. (A typed-throws closure returning Void
                    // here crashes the 6.3 compiler's IRGen, hence the count it returns.)
                    // Counted once per drain: the sending thread shares the counters' lock.
                    var (joinedPackets, joinedBytes) = (0, 0)
                    defer {
                        if joinedPackets > 0 {
                            counters.withLock {
                                $0.packetsIn += joinedPackets
                                $0.bytesIn += joinedBytes
                            }
                        }
                    }
                    _ = try buffer.withUnsafeMutableBytes { (raw) throws(DeviceError) -> Int in
                        for handled in 0..<64 {
                            guard let (total, peer, segment) = try socket.receiveJoined(into: raw, timeout: .zero) else { return handled }
                            let now = Instant.now()
                            // A run the kernel joined is cut back into its datagrams.
                            var offset = 0
                            while offset < total {
                                let length = min(segment, total - offset)
                                let datagram = UnsafeMutableRawBufferPointer(rebasing: raw[offset..<(offset + length)])
                                offset += length
                                let (event, role) = peering.withLock { $0.receive(datagram, from: peer, now: now) }
                                guard role == .current else {
                                    handle(event, from: peer, by: role, in: datagram)
                                    continue
                                }
                                if case .packet(let range) = event, let tun, coalescer != nil {
                                    noteArrival()
                                    joinedPackets += 1
                                    joinedBytes += range.count
                                    coalescer!.add(UnsafeRawBufferPointer(rebasing: UnsafeRawBufferPointer(datagram)[range])) { write($0, $1, to: tun) }
                                    continue
                                }
                                if let tun { coalescer?.flush { write($0, $1, to: tun) } }
                                handle(event, in: datagram)
                            }
                        }
                        return 64
                    }
                    if let tun { coalescer?.flush { write($0, $1, to: tun) } }
                }
            } catch {
                logger.warning("receive failed", error: error, metadata: ["cause": "receive"])
            }
        }
    }

    /// An authenticated packet arrived: the conversation answers. A probe's echo or a handshake's
    /// answer is reported as such, not as data (`reporting: false`).
    private func noteArrival(reporting: Bool = true) {
        let now = Instant.now()
        lastReceived.store(now.nanoseconds, ordering: .relaxed)
        guard reporting else { return }
        let awaited = awaitingReply.exchange(false, ordering: .relaxed)
        guard LivenessNotices.reportsArrival(at: now, awaited: awaited,
                                             lastReport: Instant(nanoseconds: lastReported.load(ordering: .relaxed)))
        else { return }
        lastReported.store(now.nanoseconds, ordering: .relaxed)
        notify(.dataReceived)
    }

    private func write(_ packet: UnsafeRawBufferPointer, _ header: VirtioNetHeader, to tun: TunDevice) {
        do {
            try tun.write(packet, header: header)
            if header.gsoType != 0 { counters.withLock { $0.superPacketsWritten += 1 } }
        } catch {
            logger.warning("write to the tunnel device failed", error: error, metadata: ["cause": "tun-write", "tunnel": "\(tun.name)"])
        }
    }

    private func handle(_ event: ClientEvent, in raw: UnsafeMutableRawBufferPointer) {
        switch event {
        case .packet, .keepalive:
            noteArrival()
        case .probeEcho, .established:
            noteArrival(reporting: false)
        default:
            break
        }
        switch event {
        case .packet(let range):
            deliver(range, in: raw)
        case .established(let completion):
            send(completion.confirmation)
            logger.info("handshake completed", metadata: ["rtt": "\(completion.rtt.short)", "protocol": "\(completion.spoken.version)",
                                                          "cipher": "\(completion.spoken.cipher)"])
            notify(.handshakeCompleted(rtt: completion.rtt, sizedProbes: completion.sizedEchoes,
                                       carriesIPv6: completion.carriesIPv6, dns: completion.dns))
            pathMTUUnheard()
        case .rejected:
            logger.warning("the server rejected a handshake")
            notify(.handshakeRejected)
        case .probeEcho(let id, let rtt, let size):
            lastEcho.withLock { $0 = (id, rtt) }
            notify(.probeEcho(id: id, rtt: rtt, size: size))
        case .sessionUnknown:
            logger.info(answersHints ? "the server lost our session; handshaking" : "the server says it lost our session")
            notify(.sessionUnknown)
            if answersHints { initiate(force: false) }
        case .cookie(let resend):
            send(resend)
        case .send(let datagrams):
            for datagram in datagrams { send(datagram) }
        case .keepalive:
            counters.withLock { $0.keepalivesIn += 1 }
        case .draining:
            logger.notice("the server says it is being taken down")
            notify(.serverDraining)
        case .pathMTUAcknowledged(let mtu):
            pathMTU.withLock { if $0.wanted == mtu { $0.unheard = false } }
        case .dropped:
            break
        }
    }

    /// What the session being prepared with another server, or the one left at the last
    /// handover (`role`), made of a datagram from its server `peer`.
    private func handle(_ event: ClientEvent, from peer: SocketAddress, by role: Peering.Role,
                        in raw: UnsafeMutableRawBufferPointer) {
        if role == .standby {
            switch event {
            case .established(let completion):
                send(completion.confirmation, to: peer)
                logger.info("handshake with the next server completed", metadata: ["rtt": "\(completion.rtt.short)"])
                notify(.handoverReady(rtt: completion.rtt, sizedProbes: completion.sizedEchoes,
                                      carriesIPv6: completion.carriesIPv6, dns: completion.dns))
            case .rejected:
                logger.warning("the next server rejected a handshake")
                notify(.handoverRejected)
            case .cookie(let resend):
                send(resend, to: peer)
            case .send(let datagrams):
                for datagram in datagrams { send(datagram, to: peer) }
            case .packet(let range):
                deliver(range, in: raw)  // its answers may come before the traffic moves
            default:
                break
            }
        } else if case .packet(let range) = event {
            deliver(range, in: raw)
        }
    }

    private func deliver(_ range: Range<Int>, in raw: UnsafeMutableRawBufferPointer) {
        counters.withLock {
            $0.packetsIn += 1
            $0.bytesIn += range.count
        }
        guard let tun = device.withLock({ $0 }) else {
            counters.withLock { $0.noSession += 1 }  // no device yet: nowhere to deliver
            return
        }
        do { try tun.write(UnsafeRawBufferPointer(rebasing: raw[range])) } catch { logger.warning("write to the tunnel device failed", error: error, metadata: ["cause": "tun-write", "tunnel": "\(tun.name)"]) }
    }

    /// Packets from the TUN, sealed in place into a batch and sent with one `sendmmsg`.
    private func outbound(_ tun: TunDevice) {
        let batch = PacketBatch(capacity: 64)
        var reader = TunReader(tun)
        defer { reader.release() }
        while running.load(ordering: .relaxed) {
            do {
                // Without a persistent keepalive an idle tunnel wakes nobody here.
                let ready = try pollReadable([tun.fileDescriptor, outboundWakeup.readEnd],
                                             timeout: persistentKeepalive.withLock { $0 })
                if ready.isEmpty, running.load(ordering: .relaxed) { sendKeepalive() }
                if ready.contains(outboundWakeup.readEnd) { outboundWakeup.drain() }
                guard ready.contains(tun.fileDescriptor) else { continue }
            } catch {
                logger.warning("poll failed", error: error, metadata: ["cause": "poll"])
                continue
            }
            while !sendBatch(batch, from: &reader) {}
        }
    }

    /// Reads, seals and sends one batch; true when the TUN had no more waiting.
    private func sendBatch(_ batch: PacketBatch, from reader: inout TunReader) -> Bool {
        batch.removeAll()
        let now = Instant.now()
        // The server is read with the keys that seal for it, once per batch: a handover
        // sends each batch to the server that can open it, and sealing holds no lock the
        // receiving thread takes. Which keys they are is said in the same hold of the lock, and
        // unsaid (a release) only once the batch is sent: see `sayGoodbye(to:left:)`.
        let (sealer, server) = peering.withLock { peering in
            sealing.store(peering.generation, ordering: .releasing)
            return (peering.session.core.sealer, peering.session.server)
        }
        defer { sealing.store(0, ordering: .releasing) }
        let drained = fill(batch, from: &reader) { frame, length throws(SealFailure) in
            guard let sealer else { throw .noSession }
            return (try sealer.seal(frame, innerLength: length, now: now), server)
        }
        // Before the batch check: with an expired session every seal fails and the batch
        // is empty, and that is exactly when a handshake is most needed.
        let (renew, socket) = peering.withLock { ($0.session.core.needsHandshake(now: now), $0.socket) }
        if renew { initiate(force: false) }
        guard batch.count > 0 else { return drained }
        // Data after a quiet spell is worth a liveness check, and again while it goes
        // unanswered; in a conversation whose answers keep coming, the decider hears nothing,
        // so it is not woken per packet (`LivenessNotices`).
        if LivenessNotices.reportsSent(at: now, lastArrival: Instant(nanoseconds: lastReceived.load(ordering: .relaxed)),
                                       awaiting: awaitingReply.load(ordering: .relaxed),
                                       lastReport: Instant(nanoseconds: lastSentReport.load(ordering: .relaxed))) {
            awaitingReply.store(true, ordering: .relaxed)
            lastSentReport.store(now.nanoseconds, ordering: .relaxed)
            notify(.dataSent)
        }
        do {
            let sent = try socket.sendSegmented(batch)
            if sent < batch.count { counters.withLock { $0.sendFailures += batch.count - sent } }
        } catch {
            counters.withLock { $0.sendFailures += batch.count }
        }
        return drained
    }

    /// Reads packets from `tun` into `batch`, each sealed in place by `seal`; true when the
    /// TUN had no more waiting.
    private func fill(_ batch: PacketBatch, from reader: inout TunReader,
                      seal: (UnsafeMutableRawBufferPointer, Int) throws(SealFailure) -> (Int, SocketAddress)) -> Bool {
        // Counted once per batch: the receiving thread shares the counters' lock.
        var (packets, bytes, unsent) = (0, 0, 0)
        defer {
            counters.withLock {
                $0.packetsOut += packets
                $0.bytesOut += bytes
                $0.noSession += unsent
                $0.record(&reader)
            }
        }
        while !batch.isFull {
            var empty = false
            batch.append { slot -> (length: Int, peer: SocketAddress?)? in
                let inner = UnsafeMutableRawBufferPointer(rebasing: slot[DataPacket.headroom..<(slot.count - DataPacket.tailroom)])
                guard let length = try? reader.read(into: inner) else {
                    empty = true
                    return nil
                }
                do {
                    let (sealed, server) = try seal(UnsafeMutableRawBufferPointer(rebasing: slot[0..<(length + DataPacket.overhead)]), length)
                    packets += 1
                    bytes += length
                    return (sealed, server)
                } catch {
                    unsent += 1
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
        guard force || !held.load(ordering: .relaxed) else { return }
        let now = Instant.now()
        let due = lastInitiation.withLock { last -> Bool in
            if !force, let last, now - last < .seconds(1) { return false }
            last = now
            return true
        }
        guard due, let (initiation, server) = try? peering.withLock({ (peering) throws(CryptoError) in
            (try peering.session.core.initiation(now: now, wallClock: TAI64N.now()), peering.session.server)
        }) else { return }
        handshakes.add(1, ordering: .relaxed)
        for datagram in initiation { send(datagram, to: server) }
    }

    /// Sends to the server the session talks to now.
    private func send(_ datagram: [UInt8]) {
        send(datagram, to: server)
    }

    private func send(_ datagram: [UInt8], to server: SocketAddress) {
        datagram.withUnsafeBytes { send($0, to: server) }
    }

    private func send(_ datagram: UnsafeRawBufferPointer, to server: SocketAddress) {
        do {
            if try !socket.send(datagram, to: server) { counters.withLock { $0.sendFailures += 1 } }
        } catch {
            counters.withLock { $0.sendFailures += 1 }
        }
    }
}
