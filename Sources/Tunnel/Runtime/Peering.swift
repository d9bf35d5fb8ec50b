import Basics
import Device

/// A protocol core and the server it talks to, changed together so that no packet is sealed
/// for one server and sent to another.
struct ServerSession: Sendable {
    var core: ClientCore
    var server: SocketAddress

    /// Opens `datagram` from `peer` in place with this session's keys.
    mutating func receive(_ datagram: UnsafeMutableRawBufferPointer, from peer: SocketAddress, now: Instant) -> ClientEvent {
        core.receive(datagram, from: peer, server: server, now: now)
    }
}

/// Whom the client's data plane talks to, and through which sockets: what the deciding thread's
/// commands change and the data loops read, kept under one lock (`TunnelClient`'s) as
/// wireguard-go keeps a peer's mutex beside the fields it guards. A command changes it in one
/// short hold; the sending thread reads it twice a batch, the receiving thread once a datagram
/// and once a wake (for the sockets to poll).
struct Peering: Sendable {
    /// Which of the sessions opened a datagram.
    enum Role {
        /// The session carrying the traffic.
        case current
        /// The session being prepared with another server.
        case standby
        /// The session left at the last handover.
        case retired
    }

    /// The session carrying the traffic.
    var session: ServerSession
    /// Which `session` this is: one more each time another server's session replaces it, so the
    /// sending thread can say which keys a batch is sealed with (`TunnelClient.sealing`).
    private(set) var generation: UInt64 = 1
    /// A session being prepared with another server while `session` carries the traffic.
    var standby: ServerSession?
    /// The session left at the last handover, still opening packets that were on their way from
    /// its server until `until`.
    private var retired: (session: ServerSession, until: Instant)?
    /// The socket the session uses now.
    private(set) var socket: any PacketCarrier
    /// Sockets on paths being tried (make-before-break): polled for echoes beside `socket`.
    private(set) var candidates: [any PacketCarrier] = []
    /// Drops counted by sessions with servers left behind.
    private var earlierDrops = DropCounters()

    init(session: ServerSession, socket: any PacketCarrier) {
        self.session = session
        self.socket = socket
    }

    /// Drops counted by every session so far but the retired one, until its keys go.
    var drops: DropCounters {
        var all = earlierDrops
        all.add(session.core.drops)
        return all
    }

    /// `next` carries the traffic from now on; returns the session it replaces and that one's
    /// generation.
    private mutating func replaceSession(with next: ServerSession) -> (old: ServerSession, generation: UInt64) {
        defer {
            session = next
            generation += 1
        }
        return (session, generation)
    }

    /// Talks to another server with `next`; the session before, and any prepared or retired, are over.
    mutating func use(_ next: ServerSession) {
        earlierDrops.add(replaceSession(with: next).old.core.drops)
        standby = nil
        retired = nil
    }

    /// The prepared session takes the traffic; the one it replaces is retired until `retiredUntil`
    /// and returned with its generation, for the goodbye. Nil when none was prepared.
    mutating func completeHandover(retiredUntil: Instant) -> (old: ServerSession, generation: UInt64)? {
        guard let next = standby else { return nil }
        standby = nil
        let left = replaceSession(with: next)
        retired = (left.old, retiredUntil)
        return left
    }

    /// The session ends on purpose: returns a copy holding its keys, for the goodbye, and forgets
    /// them here, with any session being prepared.
    mutating func end() -> ServerSession {
        defer {
            session.core.forgetSession()
            standby = nil
        }
        return session
    }

    /// Moves the session to `socket`, which is no longer a path being tried.
    mutating func rebind(to socket: any PacketCarrier) {
        self.socket = socket
        forget(candidate: socket)
    }

    /// Stops polling `socket` as a path being tried.
    mutating func forget(candidate socket: any PacketCarrier) {
        candidates.removeAll { $0 === socket }
    }

    /// Where a probe via `socket` goes: nil for the current socket (also when `socket` is nil);
    /// otherwise `socket`, polled as a path being tried from now on, and whether it just joined.
    mutating func probing(via socket: (any PacketCarrier)?) -> (candidate: any PacketCarrier, joined: Bool)? {
        guard let socket, socket !== self.socket else { return nil }
        guard !candidates.contains(where: { $0 === socket }) else { return (socket, false) }
        candidates.append(socket)
        return (socket, true)
    }

    /// Opens `datagram` from `peer` with the session its server holds: the prepared one, the
    /// retired one (whose keys go once its time is up), or else the current one.
    mutating func receive(_ datagram: UnsafeMutableRawBufferPointer, from peer: SocketAddress,
                          now: Instant) -> (event: ClientEvent, by: Role) {
        if standby?.server == peer { return (standby!.receive(datagram, from: peer, now: now), .standby) }
        if let until = retired?.until {
            if now >= until {
                earlierDrops.add(retired!.session.core.drops)
                retired = nil  // its keys are wiped as the core goes
            } else if retired!.session.server == peer {
                return (retired!.session.receive(datagram, from: peer, now: now), .retired)
            }
        }
        return (session.receive(datagram, from: peer, now: now), .current)
    }
}
