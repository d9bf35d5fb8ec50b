import Basics
import Device
import Glibc
import Streams

/// Bounds on the gateway's streams (TLS on TCP), checked when a connection is accepted, before
/// its TLS handshake costs anything: a flood of connections cannot use up descriptors, memory or
/// the handshake thread, and what a stream carries then meets the same budgets, cookies and
/// per-network limits as datagrams do.
public struct StreamLimits: Equatable, Sendable {
    /// Streams open at once, in all (and at most what the descriptors the process may open
    /// leave, see `fitting(descriptors:)`).
    public var connections: Int
    /// Streams open at once from one address (a hotel's NAT puts many users behind one).
    public var connectionsPerSource: Int
    /// Streams open at once from one network (an IPv4 /24, an IPv6 /48).
    public var connectionsPerNetwork: Int
    /// Connections accepted per second from one network.
    public var acceptsPerNetwork: ServerLimits.Rate
    /// Connections accepted per second in all (each costs a TLS handshake: about 0.2 ms of a core).
    public var accepts: ServerLimits.Rate
    /// How long a stream may take to carry a session (an authenticated message, or a handshake
    /// the gateway answered) after it is accepted.
    public var provenWithin: Duration
    /// How long a stream may go without carrying a session's message before it is closed: a
    /// client on it sends keepalives or probes well within this. Garbage keeps nothing alive.
    public var idleFor: Duration

    public init(connections: Int = 4_096, connectionsPerSource: Int = 64, connectionsPerNetwork: Int = 256,
                acceptsPerNetwork: ServerLimits.Rate = .init(perSecond: 20, burst: 50),
                accepts: ServerLimits.Rate = .init(perSecond: 1_000, burst: 500),
                provenWithin: Duration = .seconds(10), idleFor: Duration = .seconds(300)) {
        self.connections = connections
        self.connectionsPerSource = connectionsPerSource
        self.connectionsPerNetwork = connectionsPerNetwork
        self.acceptsPerNetwork = acceptsPerNetwork
        self.accepts = accepts
        self.provenWithin = provenWithin
        self.idleFor = idleFor
    }

    /// Descriptors kept for everything but streams (sockets, the TUN's queues, files, the
    /// database, the control and metrics sockets).
    public static let descriptorReserve = 256

    /// The limits with `connections` lowered to what `descriptors` (the process's open-file
    /// limit) leaves after the reserve: past it, accepting fails and everything else that opens
    /// a file fails with it.
    public func fitting(descriptors: Int) -> StreamLimits {
        var limits = self
        limits.connections = max(0, min(connections, descriptors - Self.descriptorReserve))
        return limits
    }
}

extension TunnelServer {
    /// How long a closed stream stays in the table (sending on it drops): the client moves its
    /// session elsewhere within that.
    static let closedStreamKept: Duration = .seconds(180)

    /// The stream thread: accepts connections within `StreamLimits` (when full, a stream that
    /// never carried a session makes room), moves each stream's TLS handshake on, and reads its
    /// messages into the same steps a datagram takes (worker 0's sockets and counters, queue 0 of
    /// the device).
    func serveStreams(_ listener: StreamListener) {
        var buffer = [UInt8](repeating: 0, count: 65_536)
        var live: [GatewayStream] = []
        var wantsWrite: Set<ObjectIdentifier> = []
        var perSource: [IPAddress: Int] = [:]
        var perNetwork: [IPAddress: Int] = [:]
        var acceptsByNetwork = SourceRateLimiter(streamLimits.acceptsPerNetwork, capacity: 65_536, per: .network)
        var allAccepts = TokenBucket(streamLimits.accepts)
        /// Streams that carried a session and closed: kept in `streams` a while (sending drops).
        var closedAt: [SocketAddress: Instant] = [:]
        var sessions = self.sessions
        var seen = tableGeneration.load(ordering: .acquiring)
        var hints = core.withLock { $0.hintShare(of: workers.count) }
        var traffic = TrafficCounters()
        var drops = DropCounters()
        // With a virtio header, a stream's consecutive segments of one TCP flow go to the TUN as
        // one packet, as a UDP worker's do.
        var coalescer = device.hasVirtioHeader ? Coalescer() : nil
        defer { coalescer?.release() }
        var refused = 0
        var lastTick = Instant.now()
        /// Accepting failed for want of descriptors: the listeners wait until then.
        var listenersPausedUntil: Instant?
        let mine = counters[1]

        func count(_ stream: GatewayStream, _ change: Int) {
            let network = SourceRateLimiter.key(stream.peer.ip, .network)
            perSource[stream.peer.ip, default: 0] += change
            perNetwork[network, default: 0] += change
            if perSource[stream.peer.ip] == 0 { perSource[stream.peer.ip] = nil }
            if perNetwork[network] == 0 { perNetwork[network] = nil }
        }
        func end(_ stream: GatewayStream, _ why: String, now: Instant) {
            stream.close(why)
            live.removeAll { $0 === stream }
            wantsWrite.remove(ObjectIdentifier(stream))
            count(stream, -1)
            if stream.lastProof != nil {
                closedAt[stream.peer] = now
            } else {
                streams.withLock { if $0[stream.peer] === stream { $0[stream.peer] = nil } }
            }
            streamCount.store(streams.withLock { $0.count }, ordering: .relaxed)
            streamsOpen.store(live.count, ordering: .relaxed)
            logger.debug("stream closed", metadata: ["from": "\(stream.peer)", "why": "\(why)"])
        }

        while running.load(ordering: .relaxed) {
            let listening = listenersPausedUntil.map { Instant.now() >= $0 } ?? true
            var entries = listening ? listener.sockets.map { pollfd(fd: $0.fileDescriptor, events: Int16(POLLIN), revents: 0) } : []
            let first = entries.count
            for stream in live {
                // A stream waiting to write is polled for that alone: its unread input would
                // otherwise wake the poll again and again.
                let events = wantsWrite.contains(ObjectIdentifier(stream)) ? Int16(POLLOUT) : Int16(POLLIN)
                entries.append(pollfd(fd: stream.fileDescriptor, events: events, revents: 0))
            }
            let buffered = live.contains { $0.hasBuffered }
            _ = poll(&entries, nfds_t(entries.count), buffered ? 0 : (listening ? 1_000 : 100))
            let now = Instant.now()
            if !listening, now >= listenersPausedUntil! { listenersPausedUntil = nil }
            refresh(&sessions, seen: &seen)

            for (k, socket) in listener.sockets.enumerated() where k < first && entries[k].revents != 0 {
                for _ in 0..<64 {
                    let stream: GatewayStream?
                    do {
                        stream = try listener.accept(on: socket, now: now)
                    } catch where [EMFILE, ENFILE, ENOBUFS, ENOMEM].contains(error.code) {
                        // No descriptor for it: the connection waits in the backlog, and the
                        // listener is not polled for a second (it would wake the poll at once).
                        logger.warning("cannot accept a stream", error: error, metadata: ["cause": "accept"])
                        listenersPausedUntil = now + .seconds(1)
                        break
                    } catch {
                        break
                    }
                    guard let stream else { break }
                    let ip = stream.peer.ip
                    let network = SourceRateLimiter.key(ip, .network)
                    if live.count >= streamLimits.connections, let idle = live.first(where: { $0.lastProof == nil }) {
                        end(idle, "made room: it carried no session", now: now)
                    }
                    guard live.count < streamLimits.connections, perSource[ip, default: 0] < streamLimits.connectionsPerSource,
                          perNetwork[network, default: 0] < streamLimits.connectionsPerNetwork,
                          acceptsByNetwork.allow(ip, now: now), allAccepts.take(now: now)
                    else {
                        refused += 1
                        continue  // closed as it goes
                    }
                    live.append(stream)
                    count(stream, 1)
                    closedAt[stream.peer] = nil
                    streams.withLock { $0[stream.peer] = stream }
                    streamCount.store(streams.withLock { $0.count }, ordering: .relaxed)
                    streamsOpen.store(live.count, ordering: .relaxed)
                    streamsAccepted.add(1, ordering: .relaxed)
                }
            }

            let polled = Dictionary(entries[first...].map { ($0.fd, $0.revents) }, uniquingKeysWith: { a, _ in a })
            for stream in live where polled[stream.fileDescriptor, default: 0] != 0 || stream.hasBuffered {
                // At most 64 messages from one stream per turn, however they came joined: the
                // others' turn comes as soon.
                var handled = 0
                read: while handled < 64 {
                    let progress = buffer.withUnsafeMutableBytes { stream.advance(into: $0, now: now) }
                    switch progress {
                    case .messages(let length, let segment):
                        handled += (length + segment - 1) / segment
                        buffer.withUnsafeMutableBytes { raw in
                            for start in stride(from: 0, to: length, by: segment) {
                                receive(UnsafeMutableRawBufferPointer(rebasing: raw[start..<min(start + segment, length)]), on: stream,
                                        now: now, sessions: &sessions, hints: &hints, traffic: &traffic, drops: &drops, coalescer: &coalescer)
                            }
                        }
                    case .waiting(let write):
                        if write { wantsWrite.insert(ObjectIdentifier(stream)) } else { wantsWrite.remove(ObjectIdentifier(stream)) }
                        break read
                    case .closed(let why):
                        end(stream, why, now: now)
                        break read
                    }
                }
                flush(&coalescer, traffic: &traffic)
            }
            mine.add(&traffic, &drops)
            if sessions.hasLiveChanges { publishRoutes(sessions) }

            // Once a second: streams that never carried a session or stopped carrying one close;
            // closed ones are forgotten.
            if now - lastTick >= .seconds(1) {
                lastTick = now
                hints.prune(now: now)
                for stream in live {
                    if let proof = stream.lastProof {
                        if now - proof > streamLimits.idleFor { end(stream, "carried no session for \(streamLimits.idleFor)", now: now) }
                    } else if now - stream.accepted > streamLimits.provenWithin {
                        end(stream, "carried no session within \(streamLimits.provenWithin)", now: now)
                    }
                }
                let forgotten = closedAt.filter { now - $0.value > Self.closedStreamKept }.map(\.key)
                if !forgotten.isEmpty {
                    streams.withLock { table in for peer in forgotten where table[peer]?.isOpen != true { table[peer] = nil } }
                    for peer in forgotten { closedAt[peer] = nil }
                    streamCount.store(streams.withLock { $0.count }, ordering: .relaxed)
                }
                if refused > 0 {
                    logger.notice("stream connections refused past the limits", metadata: ["refused": "\(refused)"])
                    streamsRefused.add(refused, ordering: .relaxed)
                    refused = 0
                }
            }
        }
        for stream in live { stream.close("the gateway stopped") }
    }

    /// The gateway answered a handshake to `peer`: when that is a stream, it carries a session.
    func proveStream(_ peer: SocketAddress) {
        guard peer.overStream, streamCount.load(ordering: .relaxed) > 0 else { return }
        streams.withLock { $0[peer] }?.prove(Instant.now())
    }

    /// Writes what the coalescer holds to the device (queue 0).
    private func flush(_ coalescer: inout Coalescer?, traffic: inout TrafficCounters) {
        var written = TrafficCounters()
        coalescer?.flush { packet, header in self.write(packet, header, queue: 0, traffic: &written) }
        traffic.add(written)
    }

    /// One message from a stream: what a datagram from the stream's address would get. Inner
    /// packets join the coalescer's run (flushed before anything else is written).
    private func receive(_ message: UnsafeMutableRawBufferPointer, on stream: GatewayStream, now: Instant,
                         sessions: inout SessionTable, hints: inout HintBudget, traffic: inout TrafficCounters,
                         drops: inout DropCounters, coalescer: inout Coalescer?) {
        switch ServerCore.kind(of: UnsafeRawBufferPointer(message)) {
        case .success(.data):
            let event = sessions.receive(message, from: stream.peer, at: stream.local, now: now, drops: &drops, hints: &hints)
            switch event {
            case .packet, .keepalive, .echo: stream.prove(now)
            default: break
            }
            if case .packet(_, let range) = event, coalescer != nil {
                traffic.packetsIn += 1
                traffic.bytesIn += range.count
                var written = TrafficCounters()
                coalescer!.add(UnsafeRawBufferPointer(rebasing: UnsafeRawBufferPointer(message)[range])) { packet, header in
                    self.write(packet, header, queue: 0, traffic: &written)
                }
                traffic.add(written)
                return
            }
            flush(&coalescer, traffic: &traffic)
            handle(event, in: UnsafeRawBufferPointer(message), local: stream.local, worker: 0, queue: 0, traffic: &traffic)
        case .success(.handshake):
            handOver(UnsafeRawBufferPointer(message), from: stream.peer, at: stream.local,
                     fromPeer: sessions.peer(provenAt: stream.peer) != nil, traffic: &traffic)
        case .failure(let reason):
            drops.count(reason)
        }
    }
}
