public import Basics
import Synchronization
public import Device

/// The sessions a server holds, shared by its data threads with no lock that all of them take:
/// each peer's state has a lock of its own, held for a few loads and stores and never around
/// the cryptography (a `TransportSession` synchronises itself), and receiver indices are found
/// in one of 64 shards. Two clients' packets never wait for each other; one client's two
/// directions wait only for the other's few stores.
///
/// The handshake steps of `ServerCore` install sessions here; `ServerCore.receive` and
/// `ServerCore.seal` reach the same methods, so tests of the core cover this path.
public final class SessionTable: Sendable {
    let users: UserDatabase
    let limits: SessionLimits
    private let peers: [PeerCell]
    private let shards: [IndexShard]
    /// Where each peer proved itself lately, to its slot: its endpoint (the address and port its
    /// authenticated packets come from) and the source of its last accepted handshake. The
    /// reserved lane for rekeys starts here (`ServerCore.admit`). Changed only when one of the
    /// two moves (a roam, a handshake), never per packet; taken after a peer's lock, never before.
    private let provenSources = Mutex<[SocketAddress: Int]>([:])
    private let liveChanges = Mutex<[(peer: PeerID, live: Bool)]>([])
    private let changed = Atomic<Bool>(false)
    private let live = Atomic<Int>(0)
    private let sessions = Atomic<Int>(0)
    private static let shardCount = 64

    convenience init(users: UserDatabase, limits: SessionLimits) {
        self.init(users: users, limits: limits, peers: users.users.map { PeerCell(addresses: $0.addresses) })
    }

    private init(users: UserDatabase, limits: SessionLimits, peers: [PeerCell]) {
        self.users = users
        self.limits = limits
        self.peers = peers
        shards = (0..<Self.shardCount).map { _ in IndexShard() }
    }

    /// A table for `users` that keeps the sessions of every user `old` lists exactly so (the
    /// same name, key, password, addresses and resolvers): their state moves over whole, under
    /// new slots. Everyone else's sessions end, their keys wiped; `ended` holds the inner
    /// addresses of those who were reachable, whose routes must go.
    func reloaded(with users: UserDatabase) -> (table: SessionTable, ended: [[IPAddress]]) {
        var kept: [User: PeerCell] = [:]
        kept.reserveCapacity(self.users.users.count)
        for (slot, user) in self.users.users.enumerated() { kept[user] = peers[slot] }
        let cells = users.users.map { kept.removeValue(forKey: $0) ?? PeerCell(addresses: $0.addresses) }
        let table = SessionTable(users: users, limits: limits, peers: cells)
        var proven: [(SocketAddress, Int)] = []
        for (slot, cell) in cells.enumerated() {
            // Most users have no session here: one look under the lock, nothing else.
            let held = cell.state.withLock { state -> (indices: [UInt32], live: Bool, sources: [SocketAddress])? in
                guard state.current != nil || state.next != nil || state.previous != nil || state.endpoint != nil
                    || state.handshakeSource != nil
                else { return nil }
                return ([state.current, state.next, state.previous].compactMap { $0?.localIndex }, state.endpoint != nil,
                        [state.endpoint, state.handshakeSource?.address].compactMap { $0 })
            }
            guard let held else { continue }
            for index in held.indices where table.shard(index).claim(index, for: slot) { table.sessions.add(1, ordering: .relaxed) }
            if held.live { table.live.add(1, ordering: .relaxed) }
            for source in held.sources { proven.append((source, slot)) }
        }
        table.provenSources.withLock { for (source, slot) in proven { $0[source] = slot } }
        var ended: [[IPAddress]] = []
        for cell in kept.values {
            let live = cell.state.withLock { state in
                defer { state = PeerState() }
                return state.endpoint != nil
            }
            if live { ended.append(cell.addresses) }
        }
        // Changes not published yet (routes to add or remove) go with the peers they are about.
        let changes = takeLiveChanges()
        var slots: [ObjectIdentifier: Int] = [:]
        if !changes.isEmpty { for (slot, cell) in cells.enumerated() { slots[ObjectIdentifier(cell)] = slot } }
        for change in changes {
            guard let slot = slots[ObjectIdentifier(peers[change.peer.index])] else { continue }
            table.noteLive(PeerID(index: slot), change.live, counted: false)
        }
        return (table, ended)
    }

    // MARK: Receiving

    /// Opens a data packet in place and says what it was; drops are counted in `drops`, which
    /// belong to the calling thread.
    func receive(
        _ datagram: UnsafeMutableRawBufferPointer, from source: SocketAddress, at local: IPAddress?, now: Instant,
        drops: inout DropCounters, hints: inout HintBudget
    ) -> ServerEvent {
        func drop(_ reason: DropReason) -> ServerEvent {
            drops.count(reason)
            return .dropped(reason)
        }
        let index = UnsafeRawBufferPointer(datagram).loadLittleEndian(UInt32.self, at: DataPacket.receiverOffset)
        guard let slot = shard(index).slot(of: index),
              let (session, which) = peers[slot].state.withLock({ $0.session(index) })
        else {
            drops.count(.unknownSession)
            guard hints.allow(source.ip, now: now) else { return .dropped(.unknownSession) }
            return .sessionUnknown(hint: SessionUnknown.encode(index: index, version: datagram[0]), to: source)
        }
        let peer = PeerID(index: slot)
        let opened: TransportSession.Opened
        switch session.open(datagram, now: now, limits: limits) {
        case .failure(let reason): return drop(reason)
        case .success(let result): opened = result
        }
        // Promotion, and the endpoint's move on a roam: only an authenticated packet on the
        // session in use, newer than the one that moved it last, may move it (see
        // docs/PROTOCOL.md, "Roaming"); decided under the peer's lock, so two threads opening
        // packets from the old and the new address cannot leave the older one in place.
        // Nothing moves when the session went while the packet was opened (closed, forgotten).
        if which != .previous {
            let retired = peers[slot].state.withLock { state -> TransportSession? in
                var retired: TransportSession?
                if which == .next, state.next === session { retired = state.promote() }
                guard state.current === session,
                      state.endpointMark.map({ $0.session !== session || opened.counter > $0.counter }) ?? true
                else { return retired }
                if state.endpoint == nil {
                    noteLive(peer, true)
                    state.liveSince = now
                }
                if state.endpoint != source {
                    let old = state.endpoint
                    state.endpoint = source
                    reindex(slot, leaving: old, for: state)
                }
                state.endpointLocal = local
                state.endpointMark = (session, opened.counter)
                return retired
            }
            if let retired { forget(retired.localIndex) }
        }
        let plaintext = UnsafeRawBufferPointer(rebasing: datagram[opened.range])
        switch InnerContent(plaintext) {
        case .keepalive:
            return .keepalive(from: peer)
        case .packet(let inner):
            guard peers[slot].addresses.contains(inner) else { return drop(.wrongInnerSource) }
            peers[slot].received.add(UInt64(opened.range.count), ordering: .relaxed)
            return .packet(from: peer, range: opened.range)
        case .probe(let id, let sentAt, let size):
            // Padded as the probe was, so the echo proves the size on the way back too; never
            // bigger than what came, so a probe cannot make the server amplify.
            let echo = Control.encode(kind: Control.echo, id: id, sentAt: sentAt, paddedTo: size)
            guard let current = peers[slot].state.withLock({ $0.current }),
                  let datagram = try? current.seal(message: echo, now: now, limits: limits)
            else { return drop(.sessionExpired) }
            return .echo(peer: peer, datagram: datagram, to: source)
        case .pathMTU(let mtu):
            // Kept for the peer; the client says it again after each handshake and on each
            // change, and the answer tells it the notice arrived. Only on the session in use:
            // one that lingered from a session since replaced says nothing about the new one.
            let inUse = peers[slot].state.withLock { state -> Bool in
                guard state.current === session else { return false }
                state.pathMTU = mtu
                return true
            }
            guard inUse else { return drop(.unexpected) }
            let answer = Control.encode(kind: Control.pathMTU, id: UInt64(mtu), sentAt: .zero)
            guard let datagram = try? session.seal(message: answer, now: now, limits: limits) else { return drop(.sessionExpired) }
            return .echo(peer: peer, datagram: datagram, to: source)
        case .close:
            // Only on the session in use, checked under the lock: a close that lingered in the
            // network from before the client's newest handshake (or one opened while another
            // thread promoted that handshake's session) must not end the session made since.
            let forgotten = peers[slot].state.withLock { state -> [UInt32]? in
                guard state.current === session else { return nil }
                if state.endpoint != nil { noteLive(peer, false) }
                let old = state.endpoint
                (state.endpoint, state.endpointLocal, state.endpointMark) = (nil, nil, nil)
                reindex(slot, leaving: old, for: state)
                return state.forgetEstablished()
            }
            guard let forgotten else { return drop(.unexpected) }
            for index in forgotten { forget(index) }
            return .closed(peer: peer)
        case .echo, .drain:
            return drop(.unexpected)
        case .malformed:
            return drop(.malformed)
        }
    }

    // MARK: Sending

    /// Seals an inner packet for `peer` in place: `buffer` holds `DataPacket.headroom` spare
    /// bytes, `innerLength` bytes of packet, and `DataPacket.tailroom` spare bytes.
    func seal(_ buffer: UnsafeMutableRawBufferPointer, innerLength: Int, to peer: PeerID, now: Instant) throws(SealFailure) -> SealedDatagram {
        guard peers.indices.contains(peer.index) else { throw .noSession }
        let (session, endpoint, local, mtu) = peers[peer.index].state.withLock {
            ($0.current, $0.endpoint, $0.endpointLocal, $0.pathMTU)
        }
        guard let session, let endpoint else { throw .noSession }
        if let mtu, innerLength > mtu,
           PacketTooBig.mayNotBeFragmented(UnsafeRawBufferPointer(rebasing: buffer[DataPacket.headroom..<(DataPacket.headroom + innerLength)])) {
            throw .tooBig(mtu: mtu)
        }
        let length = try session.seal(buffer, innerLength: innerLength, now: now, limits: limits)
        peers[peer.index].sent.add(UInt64(innerLength), ordering: .relaxed)
        return SealedDatagram(length: length, destination: endpoint, source: local)
    }

    /// Seals an inner packet for whoever owns its destination address.
    public func seal(
        _ buffer: UnsafeMutableRawBufferPointer, innerLength: Int, toInner destination: IPAddress, now: Instant
    ) throws(SealFailure) -> SealedDatagram {
        guard let peer = users.peer(owning: destination) else { throw .noSession }
        return try seal(buffer, innerLength: innerLength, to: peer, now: now)
    }

    /// Where `peer` was last heard from with an authenticated packet.
    func endpoint(of peer: PeerID) -> SocketAddress? {
        peers.indices.contains(peer.index) ? peers[peer.index].state.withLock { $0.endpoint } : nil
    }

    /// The peer that proved itself lately at `source` (see `provenSources`).
    func peer(provenAt source: SocketAddress) -> PeerID? {
        provenSources.withLock { $0[source] }.map { PeerID(index: $0) }
    }

    /// Called under the peer's lock once `old` is no longer one of its two addresses as such:
    /// the index forgets it unless the peer still proves itself there, and learns the new ones.
    private func reindex(_ slot: Int, leaving old: SocketAddress?, for state: PeerState) {
        provenSources.withLock { index in
            if let old, old != state.endpoint, old != state.handshakeSource?.address, index[old] == slot { index[old] = nil }
            for source in [state.endpoint, state.handshakeSource?.address].compactMap({ $0 }) { index[source] = slot }
        }
    }

    // MARK: Installing

    /// Reads or changes one peer's state under its lock; for the handshake steps.
    func withPeer<R>(_ peer: PeerID, _ body: (inout PeerState) -> R) -> R {
        peers[peer.index].state.withLock { body(&$0) }
    }

    /// Installs a session from a new handshake as `peer`'s next one, under a fresh receiver
    /// index; the unconfirmed one it replaces goes.
    /// `source` and `key` are where the handshake came from and the static key it proved: a
    /// rekey from there, with that key, gets the peer's reserved lane.
    func install(_ peer: PeerID, remoteIndex: UInt32, keys: TransportKeys, source: SocketAddress, key: PublicKey,
                 now: Instant) -> UInt32 {
        let index = claimIndex(for: peer.index)
        place(TransportSession(localIndex: index, remoteIndex: remoteIndex, keys: keys, established: now), for: peer, source: source, key: key)
        return index
    }

    /// Installs a version 3 session under the receiver `index` its response named (see
    /// `isFree`); nil when a session took that index meanwhile.
    func install(_ peer: PeerID, remoteIndex: UInt32, keys: TransportKeys, source: SocketAddress, key: PublicKey,
                 suite: CipherSuite, version: UInt8, index: UInt32, now: Instant) -> UInt32? {
        guard index != 0, shard(index).claim(index, for: peer.index) else { return nil }
        sessions.add(1, ordering: .relaxed)
        place(TransportSession(localIndex: index, remoteIndex: remoteIndex, keys: keys, suite: suite, version: version, established: now),
              for: peer, source: source, key: key)
        return index
    }

    /// What `peer`'s newest session speaks (the one a handshake just installed); nil without one.
    func newestProtocol(of peer: PeerID) -> SessionProtocol? {
        guard peers.indices.contains(peer.index) else { return nil }
        return peers[peer.index].state.withLock { ($0.next ?? $0.current)?.spoken }
    }

    /// How many reachable peers use a session of each version and cipher (a walk over the users).
    var liveProtocols: [SessionProtocol: Int] {
        var counts: [SessionProtocol: Int] = [:]
        for cell in peers {
            let spoken = cell.state.withLock { state in
                state.endpoint == nil ? nil : state.current?.spoken
            }
            if let spoken { counts[spoken, default: 0] += 1 }
        }
        return counts
    }

    /// Whether no session uses receiver `index` now (zero never is).
    func isFree(_ index: UInt32) -> Bool { index != 0 && shard(index).slot(of: index) == nil }

    private func place(_ session: TransportSession, for peer: PeerID, source: SocketAddress, key: PublicKey) {
        let replaced = peers[peer.index].state.withLock { state in
            // What the client said of its path was about the sessions before; it says it again.
            defer { (state.next, state.pathMTU) = (session, nil) }
            let old = state.handshakeSource?.address
            state.handshakeSource = (source, key)
            reindex(peer.index, leaving: old, for: state)
            return state.next
        }
        if let replaced { forget(replaced.localIndex) }
    }

    /// A random receiver index that no session uses (zero is reserved for rejections), taken for `slot`.
    private func claimIndex(for slot: Int) -> UInt32 {
        while true {
            let index = Primitives.randomUInt32()
            if index != 0, shard(index).claim(index, for: slot) {
                sessions.add(1, ordering: .relaxed)
                return index
            }
        }
    }

    private func forget(_ index: UInt32) {
        if shard(index).remove(index) { sessions.subtract(1, ordering: .relaxed) }
    }

    private func shard(_ index: UInt32) -> IndexShard { shards[Int(index % UInt32(Self.shardCount))] }

    // MARK: Upkeep

    /// Forgets sessions three reject-times old (wiping their keys, as WireGuard does). Takes
    /// each peer's lock in turn, never all at once.
    func tick(now: Instant) {
        let forgetAfter = limits.rejectAfterTime * 3
        for slot in peers.indices {
            let forgotten = peers[slot].state.withLock { state in
                let forgotten = state.forget(olderThan: forgetAfter, now: now)
                // A peer with no session left is no longer reached here.
                if state.endpoint != nil || state.handshakeSource != nil, state.current == nil, state.next == nil,
                   state.previous == nil {
                    let old = (state.endpoint, state.handshakeSource?.address)
                    if state.endpoint != nil { noteLive(PeerID(index: slot), false) }
                    (state.endpoint, state.endpointLocal, state.endpointMark, state.handshakeSource) = (nil, nil, nil, nil)
                    reindex(slot, leaving: old.0, for: state)
                    reindex(slot, leaving: old.1, for: state)
                }
                return forgotten
            }
            for index in forgotten { forget(index) }
        }
    }

    /// Sessions held, counting unconfirmed and previous ones.
    public var sessionCount: Int { sessions.load(ordering: .relaxed) }

    /// How many peers are reachable here now, without walking every user.
    public var livePeerCount: Int { live.load(ordering: .relaxed) }

    /// Every peer reachable here now, with what the fleet's session records show. Takes each
    /// peer's lock in turn.
    public func records(now: Instant) -> [SessionRecord] {
        peers.indices.compactMap { slot in
            guard let (endpoint, since) = peers[slot].state.withLock({ state in state.endpoint.map { ($0, state.liveSince ?? now) } })
            else { return nil }
            let user = users.users[slot]
            return SessionRecord(user: user.label, addresses: user.addresses, endpoint: endpoint, since: since,
                                 received: peers[slot].received.load(ordering: .relaxed), sent: peers[slot].sent.load(ordering: .relaxed))
        }
    }

    /// Peers reachable here now: an authenticated packet came on a session they still hold.
    var livePeers: [PeerID] {
        peers.indices.filter { slot in peers[slot].state.withLock { $0.endpoint != nil } }.map { PeerID(index: $0) }
    }

    /// True when `takeLiveChanges()` has something: one atomic load, for the data threads.
    public var hasLiveChanges: Bool { changed.load(ordering: .acquiring) }

    /// See `ServerCore.takeLiveChanges()`.
    public func takeLiveChanges() -> [(peer: PeerID, live: Bool)] {
        liveChanges.withLock { changes in
            changed.store(false, ordering: .releasing)
            defer { changes.removeAll(keepingCapacity: true) }
            return changes
        }
    }

    /// Called under the peer's lock, so a peer's changes are queued in the order they happened.
    private func noteLive(_ peer: PeerID, _ isLive: Bool, counted: Bool = true) {
        liveChanges.withLock { changes in
            changes.append((peer, isLive))
            changed.store(true, ordering: .releasing)
        }
        if counted { live.add(isLive ? 1 : -1, ordering: .relaxed) }
    }

    /// "This server is being taken down" for every peer reachable here, sealed on its session.
    func drainMessages(now: Instant) -> [(datagram: [UInt8], to: SocketAddress, from: IPAddress?)] {
        let message = Control.encode(kind: Control.drain, id: 0, sentAt: now)
        return peers.compactMap { cell in
            let (session, endpoint, local) = cell.state.withLock { ($0.current, $0.endpoint, $0.endpointLocal) }
            guard let endpoint, let datagram = try? session?.seal(message: message, now: now, limits: limits) else { return nil }
            return (datagram, endpoint, local)
        }
    }
}

/// One peer's state and its lock.
private final class PeerCell: Sendable {
    /// The user's inner addresses: the only sources their packets may carry.
    let addresses: [IPAddress]
    let state = Mutex(PeerState())
    /// Inner bytes received from the peer and sent to it, over all its sessions here: one relaxed
    /// add per packet, on a line no other peer touches.
    let received = Atomic<UInt64>(0)
    let sent = Atomic<UInt64>(0)

    init(addresses: [IPAddress]) { self.addresses = addresses }
}

/// A peer reachable on this server, for the fleet's session records.
public struct SessionRecord: Sendable, Equatable {
    public var user: String
    public var addresses: [IPAddress]
    public var endpoint: SocketAddress
    public var since: Instant
    /// Inner bytes from the peer and to it since this server began serving the user.
    public var received: UInt64
    public var sent: UInt64

    public init(user: String, addresses: [IPAddress], endpoint: SocketAddress, since: Instant, received: UInt64, sent: UInt64) {
        self.user = user
        self.addresses = addresses
        self.endpoint = endpoint
        self.since = since
        self.received = received
        self.sent = sent
    }
}

/// Receiver indices of one shard, to their peer's slot.
private final class IndexShard: Sendable {
    private let slots = Mutex<[UInt32: Int]>([:])

    func slot(of index: UInt32) -> Int? { slots.withLock { $0[index] } }

    /// False when the index is taken.
    func claim(_ index: UInt32, for slot: Int) -> Bool {
        slots.withLock { slots in
            guard slots[index] == nil else { return false }
            slots[index] = slot
            return true
        }
    }

    /// False when it was not there.
    func remove(_ index: UInt32) -> Bool { slots.withLock { $0.removeValue(forKey: index) != nil } }
}

/// How many "session unknown" hints go out: per source and in all, so a flood of made-up
/// receiver indices cannot turn the server into a reflector. Each data thread has a share of
/// its own, so such a flood never makes the threads wait for one another.
public struct HintBudget: Sendable {
    private var bySource: SourceRateLimiter
    private var all: TokenBucket

    /// One of `shares` equal parts of the budget `limits` set.
    init(_ limits: ServerLimits, shares: Int = 1) {
        let part = { (rate: ServerLimits.Rate) in
            ServerLimits.Rate(perSecond: rate.perSecond / Double(shares), burst: max(1, rate.burst / Double(shares)))
        }
        bySource = SourceRateLimiter(part(limits.hintsPerSource), capacity: limits.trackedSources)
        all = TokenBucket(part(limits.hints))
    }

    mutating func allow(_ source: IPAddress, now: Instant) -> Bool {
        bySource.allow(source, now: now) && all.take(now: now)
    }

    mutating func prune(now: Instant) { bySource.prune(now: now) }
}

/// What the server keeps per user, under the user's lock.
///
/// Up to three sessions: `current` (used to send), `next` (from the newest handshake, promoted
/// when the client first uses it: only then does the server know the client holds the keys) and
/// `previous` (still accepted, for packets that were in flight during a rekey).
struct PeerState {
    enum Slot { case current, next, previous }

    var endpoint: SocketAddress?
    /// The server's address the endpoint sends to.
    var endpointLocal: IPAddress?
    /// The session and counter of the packet that set the endpoint last.
    var endpointMark: (session: TransportSession, counter: UInt64)?
    var current: TransportSession?
    var next: TransportSession?
    var previous: TransportSession?
    /// The greatest initiation timestamp accepted: older or equal ones are replays.
    var lastTimestamp: TAI64N?
    /// Where the newest accepted handshake came from, and the static key it proved: kept while
    /// a session is held (see `SessionTable.provenSources`).
    var handshakeSource: (address: SocketAddress, key: PublicKey)?
    /// The keyed hash of the last password that passed Argon2id for this peer.
    var passwordProof: [UInt8]?
    /// The largest inner packet the client's path carries, as it last said (nil: it has not).
    var pathMTU: Int?
    /// Since when the peer is reachable here (set when it becomes so).
    var liveSince: Instant?

    /// The session with receiver index `index`, and which one it is.
    func session(_ index: UInt32) -> (TransportSession, Slot)? {
        if let current, current.localIndex == index { return (current, .current) }
        if let next, next.localIndex == index { return (next, .next) }
        if let previous, previous.localIndex == index { return (previous, .previous) }
        return nil
    }

    /// The client used the newest session: it becomes current. Returns the session pushed out.
    mutating func promote() -> TransportSession? {
        let retired = previous
        previous = current
        current = next
        next = nil
        return retired
    }

    /// Drops the sessions in use and before (the client closed); returns their indices. A
    /// `next` session stays: it comes from a handshake newer than the close, which a client
    /// started since (a restart whose handshake overtook its old process's goodbye).
    mutating func forgetEstablished() -> [UInt32] {
        defer { (current, previous) = (nil, nil) }
        return [current, previous].compactMap { $0?.localIndex }
    }

    /// Drops sessions established longer than `age` ago; returns their indices.
    mutating func forget(olderThan age: Duration, now: Instant) -> [UInt32] {
        var forgotten: [UInt32] = []
        func check(_ session: inout TransportSession?) {
            if let s = session, now - s.established >= age {
                forgotten.append(s.localIndex)
                session = nil
            }
        }
        check(&current)
        check(&next)
        check(&previous)
        return forgotten
    }
}
