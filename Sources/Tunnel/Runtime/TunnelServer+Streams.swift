import Basics
import Device
import Glibc
import Streams

/// Bounds on the gateway's streams (TLS on TCP), checked when a connection is accepted, before
/// its TLS handshake costs anything: a flood of connections cannot use up descriptors, memory or
/// the handshake thread, and what a stream carries then meets the same budgets, cookies and
/// per-network limits as datagrams do.
public struct StreamLimits: Equatable, Sendable {
    /// Streams open at once, in all.
    public var connections: Int
    /// Streams open at once from one address (a hotel's NAT puts many users behind one).
    public var connectionsPerSource: Int
    /// Connections accepted per second from one network (an IPv4 /24, an IPv6 /48).
    public var acceptsPerNetwork: ServerLimits.Rate
    /// Connections accepted per second in all (each costs a TLS handshake: about 0.2 ms of a core).
    public var accepts: ServerLimits.Rate
    /// How long a connection may take to finish TLS and send its first message.
    public var firstMessageWithin: Duration
    /// How long a stream may stay silent before it is closed: a client on it sends keepalives
    /// or probes well within this.
    public var idleFor: Duration

    public init(connections: Int = 4_096, connectionsPerSource: Int = 64,
                acceptsPerNetwork: ServerLimits.Rate = .init(perSecond: 20, burst: 50),
                accepts: ServerLimits.Rate = .init(perSecond: 1_000, burst: 500),
                firstMessageWithin: Duration = .seconds(10), idleFor: Duration = .seconds(300)) {
        self.connections = connections
        self.connectionsPerSource = connectionsPerSource
        self.acceptsPerNetwork = acceptsPerNetwork
        self.accepts = accepts
        self.firstMessageWithin = firstMessageWithin
        self.idleFor = idleFor
    }
}

extension TunnelServer {
    /// How long a closed stream stays in the table (sending on it drops): the client moves its
    /// session elsewhere within that.
    static let closedStreamKept: Duration = .seconds(180)

    /// The stream thread: accepts connections within `StreamLimits`, moves each stream's TLS
    /// handshake on, and reads its messages into the same steps a datagram takes (worker 0's
    /// sockets and counters, queue 0 of the device).
    func serveStreams(_ listener: StreamListener) {
        var buffer = [UInt8](repeating: 0, count: 65_536)
        var live: [GatewayStream] = []
        var wantsWrite: Set<ObjectIdentifier> = []
        var perSource: [IPAddress: Int] = [:]
        var acceptsByNetwork = SourceRateLimiter(streamLimits.acceptsPerNetwork, capacity: 65_536, per: .network)
        var allAccepts = TokenBucket(streamLimits.accepts)
        var closedAt: [SocketAddress: Instant] = [:]
        var sessions = self.sessions
        var seen = tableGeneration.load(ordering: .acquiring)
        var hints = core.withLock { $0.hintShare(of: workers.count) }
        var traffic = TrafficCounters()
        var drops = DropCounters()
        var refused = 0
        var lastTick = Instant.now()
        let mine = counters[1]

        func end(_ stream: GatewayStream, _ why: String, now: Instant) {
            stream.close(why)
            live.removeAll { $0 === stream }
            wantsWrite.remove(ObjectIdentifier(stream))
            perSource[stream.peer.ip, default: 1] -= 1
            if perSource[stream.peer.ip] == 0 { perSource[stream.peer.ip] = nil }
            closedAt[stream.peer] = now
            streamsOpen.store(live.count, ordering: .relaxed)
            logger.debug("stream closed", metadata: ["from": "\(stream.peer)", "why": "\(why)"])
        }

        while running.load(ordering: .relaxed) {
            var entries = listener.sockets.map { pollfd(fd: $0.fileDescriptor, events: Int16(POLLIN), revents: 0) }
            for stream in live {
                let write = wantsWrite.contains(ObjectIdentifier(stream)) ? Int16(POLLOUT) : 0
                entries.append(pollfd(fd: stream.fileDescriptor, events: Int16(POLLIN) | write, revents: 0))
            }
            let buffered = live.contains { $0.hasBuffered }
            _ = poll(&entries, nfds_t(entries.count), buffered ? 0 : 1_000)
            let now = Instant.now()
            refresh(&sessions, seen: &seen)

            for (k, socket) in listener.sockets.enumerated() where entries[k].revents != 0 {
                for _ in 0..<64 {
                    let stream: GatewayStream?
                    do { stream = try listener.accept(on: socket, now: now) } catch { break }
                    guard let stream else { break }
                    let ip = stream.peer.ip
                    guard live.count < streamLimits.connections, perSource[ip, default: 0] < streamLimits.connectionsPerSource,
                          acceptsByNetwork.allow(ip, now: now), allAccepts.take(now: now)
                    else {
                        refused += 1
                        continue  // closed as it goes
                    }
                    live.append(stream)
                    perSource[ip, default: 0] += 1
                    closedAt[stream.peer] = nil
                    streams.withLock { $0[stream.peer] = stream }
                    streamCount.store(streams.withLock { $0.count }, ordering: .relaxed)
                    streamsOpen.store(live.count, ordering: .relaxed)
                    streamsAccepted.add(1, ordering: .relaxed)
                }
            }

            let polled = Dictionary(entries.dropFirst(listener.sockets.count).map { ($0.fd, $0.revents) }, uniquingKeysWith: { a, _ in a })
            for stream in live where polled[stream.fileDescriptor, default: 0] != 0 || stream.hasBuffered {
                read: for _ in 0..<64 {
                    let progress = buffer.withUnsafeMutableBytes { stream.advance(into: $0, now: now) }
                    switch progress {
                    case .message(let length):
                        buffer.withUnsafeMutableBytes { raw in
                            receive(UnsafeMutableRawBufferPointer(rebasing: raw[0..<length]), on: stream, now: now,
                                    sessions: &sessions, hints: &hints, traffic: &traffic, drops: &drops)
                        }
                    case .waiting(let write):
                        if write { wantsWrite.insert(ObjectIdentifier(stream)) } else { wantsWrite.remove(ObjectIdentifier(stream)) }
                        break read
                    case .closed(let why):
                        end(stream, why, now: now)
                        break read
                    }
                }
            }
            mine.add(&traffic, &drops)
            if sessions.hasLiveChanges { publishRoutes(sessions) }

            // Once a second: streams that never spoke or went silent close; closed ones are forgotten.
            if now - lastTick >= .seconds(1) {
                lastTick = now
                hints.prune(now: now)
                for stream in live {
                    let heard = stream.lastMessage
                    if heard == stream.accepted, now - stream.accepted > streamLimits.firstMessageWithin {
                        end(stream, "no message within \(streamLimits.firstMessageWithin)", now: now)
                    } else if now - heard > streamLimits.idleFor {
                        end(stream, "silent for \(streamLimits.idleFor)", now: now)
                    }
                }
                let forgotten = closedAt.filter { now - $0.value > Self.closedStreamKept }.map(\.key)
                if !forgotten.isEmpty {
                    streams.withLock { table in for peer in forgotten where closedAt[peer] != nil { table[peer] = nil } }
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

    /// One message from a stream: what a datagram from the stream's address would get.
    private func receive(_ message: UnsafeMutableRawBufferPointer, on stream: GatewayStream, now: Instant,
                         sessions: inout SessionTable, hints: inout HintBudget, traffic: inout TrafficCounters,
                         drops: inout DropCounters) {
        switch ServerCore.kind(of: UnsafeRawBufferPointer(message)) {
        case .success(.data):
            let event = sessions.receive(message, from: stream.peer, at: stream.local, now: now, drops: &drops, hints: &hints)
            handle(event, in: UnsafeRawBufferPointer(message), local: stream.local, worker: 0, queue: 0, traffic: &traffic)
        case .success(.handshake):
            handOver(UnsafeRawBufferPointer(message), from: stream.peer, at: stream.local,
                     fromPeer: sessions.peer(provenAt: stream.peer) != nil, traffic: &traffic)
        case .failure(let reason):
            drops.count(reason)
        }
    }
}
