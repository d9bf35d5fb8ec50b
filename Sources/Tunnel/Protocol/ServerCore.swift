import CSodium
public import Basics
public import Device

/// What the server core made of one datagram. Replies go to the datagram's source, which is
/// not always the peer's endpoint (a probe over a path the client is still trying, say).
public enum ServerEvent: Equatable, Sendable {
    /// `peer` sent an inner IP packet, now decrypted in place at `range` of the datagram's buffer.
    case packet(from: PeerID, range: Range<Int>)
    /// `peer` completed a handshake: send `response` to `to`. Its previous session, if any,
    /// keeps working until the client's first packet on the new one.
    case handshake(peer: PeerID, response: [UInt8], to: SocketAddress)
    /// A handshake authenticated but the user may not connect: send `response` (a Noise
    /// response saying "rejected", with no session behind it) to `to`. Counted under `reason`.
    case rejected(DropReason, response: [UInt8], to: SocketAddress)
    /// A handshake needs an Argon2id password check, which takes tens of milliseconds: run
    /// `check.verify()` away from the data path, then pass the result to `finish(_:verified:now:)`.
    case checkPassword(PasswordCheck)
    /// `peer` probed: send `echo` to `to`.
    case echo(peer: PeerID, datagram: [UInt8], to: SocketAddress)
    /// A version 3 handshake goes on: send `datagram` (the response) to `to`; the handshake
    /// waits for the client's identity.
    case reply(datagram: [UInt8], to: SocketAddress)
    /// A version 3 initiation's first part, kept until its second part comes: nothing to send.
    case held
    /// An initiation came without proof that its sender receives at its address while the server
    /// (or the source's or network's budget) is under load, or before a password check, or from
    /// where a peer proved itself: send `reply` (a cookie) to `to`; the client
    /// sends the initiation again with it. Counted as a `cookieRequired` drop.
    case cookie(reply: [UInt8], to: SocketAddress)
    /// A data packet named a session this server does not hold (it restarted, or forgot an idle
    /// one): send `hint` to `to`. Counted as an `unknownSession` drop.
    case sessionUnknown(hint: [UInt8], to: SocketAddress)
    /// `peer` sent a keepalive: the session is alive, nothing to deliver.
    case keepalive(from: PeerID)
    /// `peer` said it is going away: its sessions are forgotten (their keys wiped); its next
    /// packet draws a "session unknown" hint.
    case closed(peer: PeerID)
    /// The datagram was dropped, and counted, for `reason`.
    case dropped(DropReason)
}

/// Where a sealed datagram goes.
public struct SealedDatagram: Equatable, Sendable {
    /// Bytes of the datagram, from the start of the buffer.
    public var length: Int
    /// The peer's current endpoint.
    public var destination: SocketAddress
    /// The server's address the peer sends to, to send from; nil when the driver did not say.
    public var source: IPAddress? = nil
}

/// The server's side of the protocol: datagrams, their sources and the time in; replies,
/// decrypted packets and drop counts out. No sockets, no clock, no threads.
///
/// Each user of the database is a peer with up to three sessions: `current` (used to send),
/// `next` (from the newest handshake, promoted when the client first uses it: only then does
/// the server know the client holds the keys) and `previous` (still accepted, for packets that
/// were in flight during a rekey).
public struct ServerCore: Sendable {
    /// The server's static public key, which clients pin.
    public let publicKey: PublicKey
    /// Who may connect.
    public private(set) var users: UserDatabase
    /// How many times the users were replaced: a password check started before a replacement
    /// is for a peer that may be someone else now.
    private var usersGeneration = 0
    /// Resolvers and search domains for users who have none of their own.
    public let dns: DNSSettings
    /// Dropped datagrams by reason.
    public internal(set) var drops = DropCounters()

    private let privateKey: PrivateKey
    let mac1: Mac1
    var cookies: CookieJar
    private let sessionLimits: SessionLimits
    private let passwordProofKey = SecretBytes { randombytes_buf($0, SecretBytes.count) }
    /// What a password for an unknown user or a wrong key is checked against: a hash no password
    /// matches, at the cost the claimed user's own hash would take, so a refusal takes as long
    /// whether or not the user exists.
    private var decoys: DecoyHashes
    /// Every peer's sessions, shared with the data threads (see `SessionTable`).
    public private(set) var sessions: SessionTable
    /// "Session unknown" hints for datagrams that come through `receive`; a data thread has a
    /// share of its own (`hintShare(of:)`).
    private var hints: HintBudget
    /// The limits this core was made with.
    private let limits: ServerLimits
    private var handshakesBySource: SourceRateLimiter
    private var handshakesByNetwork: SourceRateLimiter
    /// What each network may take of the reserve (`ServerLimits.reservePerNetwork`).
    private var reserveByNetwork: SourceRateLimiter
    private var handshakes: TokenBucket
    /// The lane reserved for peers with a session (see `admit`): in all, and per peer.
    private var peerHandshakes: TokenBucket
    private var handshakesByPeer: KeyedRateLimiter<PeerID>
    /// Handshakes let through to Diffie-Hellman, by lane.
    public private(set) var admissions = Admissions()
    /// Until when the server counts as under load (see `isUnderLoad`).
    private var underLoadUntil: Instant?
    private var passwordChecks: TokenBucket
    private var passwordChecksBySource: SourceRateLimiter
    private var passwordChecksByAccount: KeyedRateLimiter<[UInt8]>
    /// The same budget for checks that cannot succeed, by the name or key they claim: spent
    /// alike, so a prober cannot tell them apart, but never an account's.
    private var decoyChecksByClaim: KeyedRateLimiter<[UInt8]>
    private var passwordChecksByNetwork: SourceRateLimiter
    /// Password checks handed out and not finished yet, by the initiation's ephemeral key: a
    /// replayed initiation must not buy a second Argon2id while the first runs.
    var checksInFlight: Set<[UInt8]> = []
    /// Initiations whose check failed lately, by ephemeral key: a replay costs nothing.
    var failedChecks = RecentSet<[UInt8]>(capacity: 4096)
    /// Checks in flight at most; past it, new ones wait for a retry.
    static let maxChecksInFlight = 32
    /// The versions and ciphers this server speaks.
    public let protocols: ProtocolPolicy
    /// Version 3 initiations' first parts, until their second parts come.
    var firstParts = InitiationParts()
    /// Version 3 handshakes answered and waiting for the client's identity.
    var halfOpen: HalfOpenHandshakes
    public init(
        privateKey: PrivateKey, users: UserDatabase, dns: DNSSettings = .none, limits: ServerLimits = ServerLimits(),
        sessionLimits: SessionLimits = SessionLimits(), protocols: ProtocolPolicy = ProtocolPolicy()
    ) throws(CryptoError) {
        try Sodium.initialize()
        self.privateKey = privateKey
        self.protocols = protocols
        halfOpen = HalfOpenHandshakes(capacity: HalfOpenHandshakes.capacity(for: limits))
        publicKey = privateKey.publicKey
        self.users = users
        self.dns = dns
        mac1 = Mac1(serverKey: privateKey.publicKey)
        cookies = CookieJar(serverKey: privateKey.publicKey)
        decoys = DecoyHashes(costOf: users.users.compactMap(\.passwordHash))
        self.sessionLimits = sessionLimits
        self.limits = limits
        sessions = SessionTable(users: users, limits: sessionLimits)
        hints = HintBudget(limits)
        handshakesBySource = SourceRateLimiter(limits.handshakesPerSource, capacity: limits.trackedSources)
        handshakesByNetwork = SourceRateLimiter(limits.handshakesPerNetwork, capacity: limits.trackedSources, per: .network)
        reserveByNetwork = SourceRateLimiter(limits.reservePerNetwork, capacity: limits.trackedSources, per: .network)
        handshakes = TokenBucket(limits.handshakes)
        peerHandshakes = TokenBucket(limits.peerHandshakes)
        handshakesByPeer = KeyedRateLimiter(limits.handshakesPerPeer, capacity: max(users.users.count, 1))
        passwordChecks = TokenBucket(limits.passwordChecks)
        passwordChecksBySource = SourceRateLimiter(limits.passwordChecksPerSource, capacity: limits.trackedSources)
        passwordChecksByAccount = KeyedRateLimiter(limits.passwordChecksPerAccount, capacity: limits.trackedSources)
        decoyChecksByClaim = KeyedRateLimiter(limits.passwordChecksPerAccount, capacity: limits.trackedSources)
        passwordChecksByNetwork = SourceRateLimiter(limits.passwordChecksPerNetwork, capacity: limits.trackedSources, per: .network)
    }

    /// Replaces the users: those listed exactly as before keep their sessions, everyone else's
    /// end. Returns the new table for the data threads and the inner addresses of the ended
    /// sessions that were reachable, whose routes must go.
    public mutating func replaceUsers(_ new: UserDatabase) -> (sessions: SessionTable, ended: [[IPAddress]]) {
        let (table, ended) = sessions.reloaded(with: new)
        users = new
        sessions = table
        decoys = DecoyHashes(costOf: new.users.compactMap(\.passwordHash))
        // Peers are slots in the users list: a budget kept for one slot may be someone else's now.
        handshakesByPeer = KeyedRateLimiter(limits.handshakesPerPeer, capacity: max(new.users.count, 1))
        usersGeneration += 1
        return (table, ended)
    }

    // MARK: Receiving

    /// Handles one datagram from `source`, decrypting a data packet in place. `local` is the
    /// server's address it was sent to, when the socket tells: replies and the peer's packets
    /// then go out from it, as a client (or a NAT before it) expects.
    public mutating func receive(
        _ datagram: UnsafeMutableRawBufferPointer, from source: SocketAddress, at local: IPAddress? = nil, now: Instant
    ) -> ServerEvent {
        switch Self.kind(of: UnsafeRawBufferPointer(datagram)) {
        case .failure(let reason): drop(reason)
        case .success(.data): receiveData(datagram, from: source, at: local, now: now)
        case .success(.handshake): receiveInitiation(UnsafeRawBufferPointer(datagram), from: source, at: local, now: now)
        }
    }

    /// What a datagram is to a server, from its header and length alone: a data packet (of
    /// either version: the session's keys tell which it may be), a handshake message for the
    /// handshake steps, or a drop and why.
    public static func kind(of datagram: UnsafeRawBufferPointer) -> Result<ServerDatagram, DropReason> {
        if datagram.first == WireV3.version {
            return switch WireV3.kind(of: datagram) {
            case .failure(let reason): .failure(reason)
            case .success(.data): .success(.data)
            case .success(.kemKey), .success(.initiationRest), .success(.identity): .success(.handshake)
            case .success(.response), .success(.verdict), .success(.sessionUnknown), .success(.cookieReply): .failure(.unexpected)
            }
        }
        return switch Wire.messageType(of: datagram) {
        case .failure(let reason): .failure(reason)
        case .success(.data): .success(.data)
        case .success(.initiation): .success(.handshake)
        case .success(.response), .success(.sessionUnknown), .success(.cookieReply): .failure(.unexpected)
        }
    }

    /// The longest handshake message a server takes: version 3's first part.
    public static let maxHandshakeLength = max(Initiation.maxLength, WireV3.KEMKeyPart.length, WireV3.Identity.maxLength)

    /// Handles one datagram held in an array; a packet's `range` then indexes `datagram`.
    public mutating func receive(_ datagram: inout [UInt8], from source: SocketAddress, at local: IPAddress? = nil, now: Instant) -> ServerEvent {
        datagram.withUnsafeMutableBytes { receive($0, from: source, at: local, now: now) }
    }

    private mutating func receiveData(
        _ datagram: UnsafeMutableRawBufferPointer, from source: SocketAddress, at local: IPAddress?, now: Instant
    ) -> ServerEvent {
        sessions.receive(datagram, from: source, at: local, now: now, drops: &drops, hints: &hints)
    }

    /// An initiation from start to end: the steps below, in one call.
    private mutating func receiveInitiation(
        _ datagram: UnsafeRawBufferPointer, from source: SocketAddress, at local: IPAddress?, now: Instant
    ) -> ServerEvent {
        switch admit(datagram, from: source, at: local, now: now) {
        case .answered(let event): return event
        case .admitted(let admitted):
            switch decide(admitted.open(with: handshakeKey), now: now) {
            case .answered(let event): return event
            case .respond(let plan): return complete(plan.write(), now: now)
            }
        }
    }

    // MARK: Handshakes in steps
    //
    // A handshake costs five X25519 operations, about 0.2 ms. A driver that shares the core
    // between threads runs the two Diffie-Hellman steps, `AdmittedInitiation.open` and
    // `PlannedResponse.write`, outside its lock, so established sessions' packets never wait
    // behind them: admit (locked) → open → decide (locked) → write → complete (locked).

    /// One of `shares` equal parts of the "session unknown" hint budget, for a data thread.
    public func hintShare(of shares: Int) -> HintBudget { HintBudget(limits, shares: shares) }

    /// The server's static key, for opening initiations and writing responses away from the core.
    public var handshakeKey: HandshakeKey { HandshakeKey(privateKey: privateKey) }

    /// The cheap checks, cheapest first, before any Diffie-Hellman: mac1, a replay of a checked
    /// initiation, then the lane and its budgets.
    ///
    /// A sender that proves (by a cookie in mac2) that it receives at an address and port where a
    /// peer proved itself lately (see `SessionTable.provenSources`) takes the peer's reserved
    /// lane, held only to that peer's budget and the lane's, which nobody else can spend; once
    /// the initiation is read, `decide` checks that it comes from that peer's static key.
    /// Everyone else is held to the budgets of its source (an IPv4 address, an IPv6 /64), its
    /// network (an IPv4 /24, an IPv6 /48) and the server's. Proof of address is asked for while
    /// the server is under load, or the source's or network's budget is less than half full, so
    /// spoofed initiations can use up at most half of a network's budget and never a lane.
    public mutating func admit(
        _ datagram: UnsafeRawBufferPointer, from source: SocketAddress, at local: IPAddress? = nil, now: Instant
    ) -> Admission {
        if datagram.first == WireV3.version { return admitVersion3(datagram, from: source, at: local, now: now) }
        switch Wire.messageType(of: datagram) {
        case .success(.initiation): break
        case .failure(let reason): return .answered(drop(reason))
        case .success: return .answered(drop(.unexpected))
        }
        guard protocols.versions.contains(Wire.version) else { return .answered(drop(.versionNotAllowed)) }
        guard mac1.verify(datagram) else { return .answered(drop(.badMAC)) }
        // An initiation whose password check runs or failed, sent again: its ephemeral key, in
        // clear at the front, says so before any Diffie-Hellman.
        let ephemeral = Array(datagram[Initiation.ephemeralOffset..<(Initiation.ephemeralOffset + PublicKey.length)])
        guard !checksInFlight.contains(ephemeral), !failedChecks.contains(ephemeral) else { return .answered(drop(.replayedHandshake)) }
        switch lane(for: datagram, from: source, now: now) {
        case .answered(let event): return .answered(event)
        case .lane(let lane, let proven):
            return .admitted(AdmittedInitiation(
                datagram: Array(datagram), source: source, local: local, ephemeral: ephemeral, addressProven: proven,
                lane: lane, step: .noiseIK))
        }
    }

    /// Which lane a handshake (past mac1) takes, its budgets spent; or the cookie reply or the
    /// drop that answers it. `proven` says whether its mac2 was checked and good.
    enum LaneChoice {
        case lane(Lane, proven: Bool)
        case answered(ServerEvent)
    }

    /// The lane and budgets of `admit`, for either version's initiation (version 3's second part).
    mutating func lane(for datagram: UnsafeRawBufferPointer, from source: SocketAddress, now: Instant) -> LaneChoice {
        // mac2 costs a few MACs: checked only when the answer matters, and once.
        var proof: Bool?
        func proven() -> Bool {
            if let proof { return proof }
            let result = cookies.isProven(datagram, from: source, now: now)
            proof = result
            return result
        }
        let known = sessions.peer(provenAt: source)
        if let known, proven() {
            if peerLaneRefusal(known, now: now) == nil {
                handshakesByPeer.take(known, now: now)
                _ = peerHandshakes.take(now: now)
                admissions.peer += 1
                return .lane(.peer(known), proven: true)
            }
        }
        if needsProof(source.ip, now: now), !proven() { return .answered(cookieReply(to: datagram, from: source, now: now)) }
        if let refusal = generalRefusal(source.ip, now: now) {
            // A peer's rekey from its own address, over budgets a flood spent: a cookie lets it
            // prove the address and come back in its own lane.
            if known != nil, !proven() { return .answered(cookieReply(to: datagram, from: source, now: now)) }
            return .answered(drop(refusal))
        }
        takeGeneral(source.ip, now: now)
        return .lane(.general, proven: proof ?? false)
    }

    /// Whether a handshake from `source` must prove its address (a cookie in mac2) now: while
    /// the server is under load, or the source's or its network's budget is less than half full.
    mutating func needsProof(_ source: IPAddress, now: Instant) -> Bool {
        isUnderLoad(now: now) || handshakesBySource.isLow(source, now: now) || handshakesByNetwork.isLow(source, now: now)
    }

    /// Why the peer's lane is closed to `peer` now; nil when it is open.
    private mutating func peerLaneRefusal(_ peer: PeerID, now: Instant) -> DropReason? {
        handshakesByPeer.wouldAllow(peer, now: now) && peerHandshakes.canTake(now: now) ? nil : .peerLimited
    }

    /// Which of the budgets of everyone without a session would refuse `source` now (the first,
    /// cheapest to explain); nil when all allow. Takes nothing.
    private mutating func generalRefusal(_ source: IPAddress, now: Instant) -> DropReason? {
        if !handshakesBySource.wouldAllow(source, now: now) { return .rateLimited }
        if !handshakesByNetwork.wouldAllow(source, now: now) { return .networkLimited }
        if !handshakes.canTake(now: now) { return .serverLimited }
        // The budget's last part is shared out by network: a flood from many networks, each
        // within its own limits, spends the rest, and then each network may take from this part
        // only its small share of it (`reserveByNetwork`), which a flooding network spends at once
        // and a user's first login from a hotel does not. Who sends is not known before the
        // Diffie-Hellman work this budget pays for; how much its network has sent is.
        if inReserve(now: now), !reserveByNetwork.wouldAllow(source, now: now) {
            return .serverLimited
        }
        return nil
    }

    /// The part of everyone's handshake budget shared out by network (`generalRefusal`).
    static let reserve = 0.25

    /// Whether everyone's handshake budget is down to the part shared out by network.
    private func inReserve(now: Instant) -> Bool { handshakes.available(now: now) < handshakes.rate.burst * Self.reserve }

    private mutating func takeGeneral(_ source: IPAddress, now: Instant) {
        if inReserve(now: now) { reserveByNetwork.take(source, now: now) }
        handshakesBySource.take(source, now: now)
        handshakesByNetwork.take(source, now: now)
        _ = handshakes.take(now: now)
        admissions.general += 1
    }

    /// The user and every factor, once the Noise message is read: the answer (a drop, a cookie,
    /// a password check), or a response to write.
    public mutating func decide(_ opened: OpenedInitiation, now: Instant) -> Decision {
        switch opened.read {
        case .noiseIK(let responder): decideNoiseIK(opened.admitted, responder, now: now)
        case .hybridResponse(let answer): decideResponse(opened.admitted, answer, now: now)
        case .identity(let identity): decideIdentity(opened.admitted, identity, now: now)
        }
    }

    /// The reserved lane is the peer's only: the static key a handshake authenticated must be
    /// the one its last accepted handshake proved. Anyone else at that address (a new program on
    /// the peer's port) pays as everyone else does, now; nil when it may go on.
    mutating func laneRefusal(_ admitted: AdmittedInitiation, key: PublicKey, now: Instant) -> DropReason? {
        guard case .peer(let expected) = admitted.lane, sessions.withPeer(expected, { $0.handshakeSource?.key }) != key else {
            return nil
        }
        admissions.peer -= 1
        if let refusal = generalRefusal(admitted.source.ip, now: now) { return refusal }
        takeGeneral(admitted.source.ip, now: now)
        return nil
    }

    /// Version 2: the initiation read, its payload holds the timestamp and the credentials.
    private mutating func decideNoiseIK(_ admitted: AdmittedInitiation, _ responder: NoiseIK.Responder?, now: Instant) -> Decision {
        guard let responder else { return .answered(drop(.handshakeFailed)) }
        if let refusal = laneRefusal(admitted, key: responder.remoteStatic, now: now) {
            responder.wipePayload()
            return .answered(drop(refusal))
        }
        // The payload and the password are buffers of their own, shared by whoever holds them
        // (a password check): these wipes clear the only copies.
        defer { responder.wipePayload() }
        guard let payload = InitiationPayload(decoding: responder.payload) else { return .answered(drop(.malformed)) }
        defer { payload.password?.wipe() }
        let datagram = admitted.datagram
        let initiation = HeldInitiation(
            source: admitted.source, local: admitted.local,
            senderIndex: datagram.withUnsafeBytes { $0.loadLittleEndian(UInt32.self, at: Initiation.senderOffset) },
            handshake: .noiseIK(responder, timestamp: payload.timestamp, limit: datagram.count), remoteStatic: responder.remoteStatic,
            ephemeral: admitted.ephemeral, claim: payload.username.map { [1] + $0 } ?? [2] + responder.remoteStatic.bytes)
        return datagram.withUnsafeBytes {
            judge(username: payload.username, password: payload.password, initiation, proven: admitted.addressProven, datagram: $0, now: now)
        }
    }

    /// Who a read handshake says it is, for either version: the user, the pinned key, the
    /// password (an Argon2id check, or the proof of one that passed). `datagram` is what mac2
    /// is checked on when a check needs proof of address and `proven` does not give it.
    mutating func judge(username: [UInt8]?, password: SecretBuffer?, _ initiation: HeldInitiation, proven: Bool,
                        datagram: UnsafeRawBufferPointer, now: Instant) -> Decision {
        func check(_ password: SecretBuffer, against hash: PasswordHash, for peer: PeerID?, proof: [UInt8],
                   refusing refusal: DropReason?) -> Decision {
            .answered(startCheck(password, against: hash, for: peer, proof: proof, refusing: refusal, initiation,
                                 proven: proven, datagram: datagram, now: now))
        }
        let key = initiation.remoteStatic
        let peer: PeerID
        switch identify(username: username, key: key) {
        case .success(let found):
            peer = found
        case .failure(let reason):
            // Refused either way; but with a password, only after an Argon2id on a decoy at the
            // cost the claimed user's own check takes, as a wrong password would be, so neither
            // timing nor answer tells which users exist or which cost their hashes have.
            guard let password else { return .respond(refusal(reason, initiation)) }
            let claimed = username.flatMap { users.peer(named: $0) } ?? users.peer(forKey: key)
            let decoy = claimed.flatMap { users[$0].passwordHash }.map(decoys.matching) ?? decoys.forUnknown(initiation.claim)
            return check(password, against: decoy, for: nil, proof: [], refusing: reason)
        }
        guard let hash = users[peer].passwordHash else { return acceptUnlessReplayed(peer, initiation) }
        guard let password else { return .respond(refusal(.badPassword, initiation)) }
        // A password this peer already proved (every rekey sends it again) costs one HMAC.
        let proof = passwordProof(password)
        let known = sessions.withPeer(peer) { $0.passwordProof }.map { known in
            known.withUnsafeBytes { a in proof.withUnsafeBytes { Primitives.constantTimeEqual(a, $0) } }
        } ?? false
        if known { return acceptUnlessReplayed(peer, initiation) }
        return check(password, against: hash, for: peer, proof: proof, refusing: nil)
    }

    /// Installs the session of an accepted handshake, or sends the refusal, once its response is written.
    public mutating func complete(_ written: WrittenResponse, now: Instant) -> ServerEvent {
        let initiation = written.plan.initiation
        switch written.plan.verdict {
        case .reject(let reason):
            drops.count(reason)
            guard let message = written.message else { return .dropped(reason) }
            let response = switch initiation.handshake {
            case .noiseIK: Self.response(message, sender: 0, receiver: initiation.senderIndex)
            case .hybrid: message
            }
            return .rejected(reason, response: response, to: initiation.source)
        case .accept(let peer):
            guard let message = written.message, let keys = written.keys else { return drop(.handshakeFailed) }
            let response: [UInt8]
            switch initiation.handshake {
            case .noiseIK(_, let timestamp, _):
                // Another handshake of this peer may have been accepted while the response was written.
                let fresh = sessions.withPeer(peer) { state in
                    if let last = state.lastTimestamp, timestamp <= last { return false }
                    state.lastTimestamp = timestamp
                    return true
                }
                guard fresh else { return drop(.replayedHandshake) }
                let index = sessions.install(peer, remoteIndex: initiation.senderIndex, keys: keys, source: initiation.source,
                                             key: initiation.remoteStatic, now: now)
                response = Self.response(message, sender: index, receiver: initiation.senderIndex)
            case .hybrid(_, let index, let suite):
                // Version 3 needs no timestamp: the server's fresh ephemeral key makes every
                // transcript new, and the half-open handshake was taken out when its identity came.
                guard sessions.install(peer, remoteIndex: initiation.senderIndex, keys: keys, source: initiation.source,
                                       key: initiation.remoteStatic, suite: suite, version: WireV3.version, index: index, now: now) != nil
                else { return drop(.handshakeFailed) }
                response = message
            }
            // The endpoint stays: it moves only on the first authenticated packet of the new
            // session, so a late or replayed initiation cannot drag it back to an old address.
            return .handshake(peer: peer, response: response, to: initiation.source)
        }
    }

    /// Hands out an Argon2id check, the most expensive thing a stranger can ask of the server:
    /// only for a sender that proved it receives at its address (a cookie in mac2), once per
    /// initiation, and within the per-source, per-network, per-account (or, for a check that
    /// cannot succeed, per-claim) and server-wide budgets.
    /// `proof` is what the server remembers of the password if it passes (empty for the decoy).
    private mutating func startCheck(
        _ password: SecretBuffer, against hash: PasswordHash, for peer: PeerID?, proof: [UInt8], refusing refusal: DropReason?,
        _ initiation: HeldInitiation, proven: Bool, datagram: UnsafeRawBufferPointer, now: Instant
    ) -> ServerEvent {
        guard proven || cookies.isProven(datagram, from: initiation.source, now: now) else {
            return cookieReply(to: datagram, from: initiation.source, now: now)
        }
        // Every budget is looked at before any is spent: a refusal by one uses up none of the others.
        // The sender's own budgets come first: an account's is spent only once they allowed it.
        let source = initiation.source.ip
        let claim = initiation.claim
        let couldSucceed = peer != nil
        if checksInFlight.count >= Self.maxChecksInFlight { return drop(.serverLimited) }
        if !passwordChecksBySource.wouldAllow(source, now: now) { return drop(.rateLimited) }
        if !passwordChecksByNetwork.wouldAllow(source, now: now) { return drop(.networkLimited) }
        let account = couldSucceed ? passwordChecksByAccount.wouldAllow(claim, now: now) : decoyChecksByClaim.wouldAllow(claim, now: now)
        if !account { return drop(.accountLimited) }
        if !passwordChecks.canTake(now: now) { return drop(.serverLimited) }
        passwordChecksBySource.take(source, now: now)
        passwordChecksByNetwork.take(source, now: now)
        if couldSucceed { passwordChecksByAccount.take(claim, now: now) } else { decoyChecksByClaim.take(claim, now: now) }
        _ = passwordChecks.take(now: now)
        // The check gets a buffer of its own: the one here is wiped on the way out.
        guard let held = password.slice(0..<password.count) else { return drop(.malformed) }
        checksInFlight.insert(initiation.ephemeral)
        return .checkPassword(PasswordCheck(
            peer: peer, refusal: refusal, initiation: initiation, hash: hash, password: held,
            proof: proof, generation: usersGeneration))
    }

    /// Completes a handshake held for a password check, once `check.verify()` has run.
    public mutating func finish(_ check: PasswordCheck, verified: Bool, now: Instant) -> ServerEvent {
        checksInFlight.remove(check.initiation.ephemeral)
        // Checked against a users list that is gone: the client's next initiation gets a fresh check.
        guard check.generation == usersGeneration else { return drop(.unexpected) }
        guard verified, let peer = check.peer else {
            failedChecks.insert(check.initiation.ephemeral)
            return complete(refusal(check.refusal ?? .badPassword, check.initiation).write(), now: now)
        }
        let event: ServerEvent
        switch acceptUnlessReplayed(peer, check.initiation) {
        case .answered(let answer): event = answer
        case .respond(let plan): event = complete(plan.write(), now: now)
        }
        if case .handshake = event { sessions.withPeer(peer) { $0.passwordProof = check.proof } }
        return event
    }

    /// Accepts the handshake unless its timestamp is not newer than the last one accepted for
    /// `peer` (a replay), which is dropped without an answer. Checked only once every factor
    /// passed: a prober without the password cannot tell "replay" from "wrong password".
    /// Version 3 has no timestamps and no replays to check (see `complete`).
    private mutating func acceptUnlessReplayed(_ peer: PeerID, _ initiation: HeldInitiation) -> Decision {
        var limit = Response.maxLength
        if case .noiseIK(_, let timestamp, let initiationLength) = initiation.handshake {
            if let last = sessions.withPeer(peer, { $0.lastTimestamp }), timestamp <= last { return .answered(drop(.replayedHandshake)) }
            limit = initiationLength
        }
        var accepted = ResponsePayload(accepted: true, addresses: users[peer].addresses, dns: users[peer].dns ?? dns)
        accepted.sizedEchoes = true
        accepted.pathMTUNotices = true
        return .respond(PlannedResponse(verdict: .accept(peer), initiation: initiation, payload: accepted.encoded(limit: limit)))
    }

    /// A refusal to write: an authenticated "rejected", so the client stops retrying.
    private func refusal(_ reason: DropReason, _ initiation: HeldInitiation) -> PlannedResponse {
        PlannedResponse(verdict: .reject(reason), initiation: initiation, payload: ResponsePayload(accepted: false, addresses: []).encoded())
    }

    /// Under load when less than half the handshake budget is left, and for a second after:
    /// initiations then need a cookie before any Diffie-Hellman, so a spoofed flood costs one
    /// MAC each and the budget stays for senders that can prove their address.
    private mutating func isUnderLoad(now: Instant) -> Bool {
        if handshakes.available(now: now) < handshakes.rate.burst / 2 { underLoadUntil = now + .seconds(1) }
        return underLoadUntil.map { now < $0 } ?? false
    }

    mutating func cookieReply(to datagram: UnsafeRawBufferPointer, from source: SocketAddress, now: Instant) -> ServerEvent {
        drops.count(.cookieRequired)
        return .cookie(reply: cookies.reply(to: datagram, from: source, now: now), to: source)
    }

    /// Finds the user and checks the pinned key, which costs nothing.
    private func identify(username: [UInt8]?, key: PublicKey) -> Result<PeerID, DropReason> {
        let found: PeerID?
        if let username {
            found = users.peer(named: username)
        } else {
            found = users.peer(forKey: key)
        }
        guard let peer = found else { return .failure(.unknownUser) }
        if let pinned = users[peer].publicKey, pinned != key { return .failure(.wrongKey) }
        return .success(peer)
    }

    /// HMAC of a password under a key this process draws at start: what the server remembers of
    /// a password that passed Argon2id, so it need not run Argon2id again for the same peer.
    private func passwordProof(_ password: SecretBuffer) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: Primitives.hashLength)
        passwordProofKey.withBytes { key in
            password.withBytes { password in
                out.withUnsafeMutableBufferPointer {
                    Primitives.hmac(key: UnsafeRawBufferPointer(start: key, count: SecretBytes.count), [password], into: $0.baseAddress!)
                }
            }
        }
        return out
    }

    /// A message to the client laid out as every answer to a handshake is: `header`, the
    /// server's index, the client's index, then `body` (version 2's response; version 3's
    /// response and verdict).
    static func response(_ body: [UInt8], sender: UInt32, receiver: UInt32, header: [UInt8] = Wire.header(.response)) -> [UInt8] {
        header + withUnsafeBytes(of: sender.littleEndian) { Array($0) } + withUnsafeBytes(of: receiver.littleEndian) { Array($0) } + body
    }

    // MARK: Sending

    /// The peer an inner packet for `destination` goes to (a client's stable address).
    public func peer(forInnerDestination destination: IPAddress) -> PeerID? { users.peer(owning: destination) }

    /// Where `peer` was last heard from with an authenticated packet.
    public func endpoint(of peer: PeerID) -> SocketAddress? { sessions.endpoint(of: peer) }

    /// Seals an inner packet for `peer` in place: `buffer` holds `DataPacket.headroom` spare
    /// bytes, `innerLength` bytes of packet, and `DataPacket.tailroom` spare bytes.
    public func seal(
        _ buffer: UnsafeMutableRawBufferPointer, innerLength: Int, to peer: PeerID, now: Instant
    ) throws(SealFailure) -> SealedDatagram {
        try sessions.seal(buffer, innerLength: innerLength, to: peer, now: now)
    }

    /// Seals a framed packet (see `DataPacket.frame`) for `peer`; the array becomes the datagram.
    public func seal(_ framed: inout [UInt8], to peer: PeerID, now: Instant) throws(SealFailure) -> SealedDatagram {
        let innerLength = framed.count - DataPacket.overhead
        return try framed.withMutableBytes { (buffer) throws(SealFailure) in
            try seal(buffer, innerLength: innerLength, to: peer, now: now)
        }
    }

    // MARK: Upkeep

    /// Call about once a second: forgets sessions three reject-times old (wiping their keys, as
    /// WireGuard does) and idle rate-limit state.
    public mutating func tick(now: Instant) {
        sessions.tick(now: now)
        hints.prune(now: now)
        firstParts.sweep(now: now)
        halfOpen.sweep(now: now)
        handshakesBySource.prune(now: now)
        handshakesByNetwork.prune(now: now)
        reserveByNetwork.prune(now: now)
        handshakesByPeer.prune(now: now)
        decoyChecksByClaim.prune(now: now)
        passwordChecksBySource.prune(now: now)
        passwordChecksByAccount.prune(now: now)
        passwordChecksByNetwork.prune(now: now)
    }

    /// Sessions held, counting unconfirmed and previous ones.
    public var sessionCount: Int { sessions.sessionCount }

    /// Peers that became reachable here (their first authenticated packet) or stopped being so
    /// (closed, or every session forgotten) since the last call, in order: for the routes that
    /// send their inner addresses to this server.
    public func takeLiveChanges() -> [(peer: PeerID, live: Bool)] { sessions.takeLiveChanges() }

    /// Peers reachable here now: an authenticated packet came on a session they still hold.
    public var livePeers: [PeerID] { sessions.livePeers }
    /// How many peers are reachable here now, without walking every user.
    public var livePeerCount: Int { sessions.livePeerCount }

    /// "This server is being taken down" for every peer reachable here, sealed on its session:
    /// only the server can say it (see docs/PROTOCOL.md, "Draining").
    public func drainMessages(now: Instant) -> [(datagram: [UInt8], to: SocketAddress, from: IPAddress?)] {
        sessions.drainMessages(now: now)
    }

    mutating func drop(_ reason: DropReason) -> ServerEvent {
        drops.count(reason)
        return .dropped(reason)
    }
}

/// The server's static key, for the Diffie-Hellman steps of a handshake away from the core.
public struct HandshakeKey: Sendable {
    let privateKey: PrivateKey
}

/// What `ServerCore.admit` made of an initiation.
public enum Admission: Sendable {
    /// Answered already: a drop, or a cookie reply.
    case answered(ServerEvent)
    /// Past the cheap checks: `open(with:)` it, then `decide`.
    case admitted(AdmittedInitiation)
}

/// A handshake message past the cheap checks, to be opened away from the core.
public struct AdmittedInitiation: Sendable {
    let datagram: [UInt8]
    let source: SocketAddress
    let local: IPAddress?
    /// The client's ephemeral X25519 key: what makes a handshake unique, and a replay recognisable.
    let ephemeral: [UInt8]
    let addressProven: Bool
    let lane: Lane
    let step: Step

    /// Which message it is, and what opening it needs beyond the datagram.
    enum Step: Sendable {
        /// Version 2's initiation.
        case noiseIK
        /// Version 3's initiation, `datagram` its second part; `kemKey` from the first, and the
        /// cipher the operator pinned.
        case hybridInitiation(kemKey: [UInt8], pinned: CipherSuite?)
        /// Version 3's identity, for the handshake the server answered.
        case identity(HalfOpenHandshake)
    }

    /// The Diffie-Hellman and KEM work: version 2's initiation read (two X25519 operations);
    /// version 3's initiation read and answered (three, and an ML-KEM encapsulation); version
    /// 3's identity read (one).
    public func open(with key: HandshakeKey) -> OpenedInitiation {
        switch step {
        case .noiseIK:
            let noise = Array(datagram[Initiation.noiseOffset..<(datagram.count - Initiation.macsLength)])
            return OpenedInitiation(
                admitted: self, read: .noiseIK(NoiseIK.Responder(message: noise, localStatic: key.privateKey, prologue: Wire.prologue)))
        case .hybridInitiation(let kemKey, let pinned):
            return OpenedInitiation(admitted: self, read: .hybridResponse(HybridAnswer.write(
                kemKey: kemKey, rest: datagram, pinned: pinned, key: key.privateKey)))
        case .identity(let halfOpen):
            typealias I = WireV3.Identity
            let read = halfOpen.state.read(sealedKey: Array(datagram[I.keyOffset..<I.payloadOffset]),
                                           sealedPayload: Array(datagram[I.payloadOffset...]))
            return OpenedInitiation(admitted: self, read: .identity(read.map { IdentityRead(state: $0.0, key: $0.remoteStatic, payload: $0.payload) }))
        }
    }
}

/// Whose budgets an admitted initiation spent.
enum Lane: Sendable, Equatable {
    /// The source's, its network's and the server's.
    case general
    /// The reserved lane of `peer`, whose address the sender proved it receives at.
    case peer(PeerID)
}

/// Handshakes let through to Diffie-Hellman since start, by lane.
public struct Admissions: Equatable, Sendable {
    /// Held to the budgets of their source, network and the server.
    public var general = 0
    /// In the lane reserved for peers with a session.
    public var peer = 0

    public init() {}
}

/// A handshake message opened.
public struct OpenedInitiation: Sendable {
    let admitted: AdmittedInitiation
    let read: Read

    enum Read: Sendable {
        /// Version 2's initiation; nil when it did not authenticate.
        case noiseIK(NoiseIK.Responder?)
        /// Version 3's response, written; or why there is none.
        case hybridResponse(Result<HybridAnswer, DropReason>)
        /// Version 3's identity; nil when it did not authenticate.
        case identity(IdentityRead?)
    }
}

/// What `ServerCore.decide` made of an opened initiation.
public enum Decision: Sendable {
    /// Answered already: a drop, a cookie reply, or a password check to run.
    case answered(ServerEvent)
    /// A response to `write()`, then to `complete`.
    case respond(PlannedResponse)
}

/// A response decided (accept or refuse, and its payload), its Diffie-Hellman still to do.
public struct PlannedResponse: Sendable {
    enum Verdict: Sendable {
        case accept(PeerID)
        case reject(DropReason)
    }
    let verdict: Verdict
    let initiation: HeldInitiation
    let payload: [UInt8]

    /// Version 2: writes Noise message 2, a fresh ephemeral key and two X25519 operations.
    /// Version 3: seals the verdict, which costs no Diffie-Hellman.
    public func write() -> WrittenResponse {
        switch initiation.handshake {
        case .noiseIK(let responder, _, _):
            let result = responder.respond(payload: payload, ephemeral: .random())
            return WrittenResponse(plan: self, message: result?.message, keys: result?.keys)
        case .hybrid(let identified, let index, _):
            let (sealed, keys, _) = identified.verdict(payload)
            // A refusal names the response's index too: the client matches the verdict to it.
            let message = ServerCore.response(sealed, sender: index, receiver: initiation.senderIndex, header: WireV3.header(.verdict))
            return WrittenResponse(plan: self, message: message, keys: keys)
        }
    }
}

/// A response written; `message` is nil only for a low-order initiator key. Version 2's is
/// the Noise message, version 3's the whole verdict datagram.
public struct WrittenResponse: Sendable {
    let plan: PlannedResponse
    let message: [UInt8]?
    let keys: TransportKeys?
}

/// What a handshake needs from its initiation to be answered later.
struct HeldInitiation: Sendable {
    let source: SocketAddress
    /// The server's address the initiation was sent to: the response goes out from it.
    let local: IPAddress?
    /// The client's index for the session.
    let senderIndex: UInt32
    let handshake: HeldHandshake
    /// The client's static key, authenticated.
    let remoteStatic: PublicKey
    /// The initiation's ephemeral public key: what makes it unique, and a replay recognisable.
    let ephemeral: [UInt8]
    /// What the initiation claims to be: the username as sent, or the static key. A check that
    /// could succeed spends the account's budget under it; one that cannot, the claim's own.
    let claim: [UInt8]
}

/// The handshake state that writes the answer.
enum HeldHandshake: Sendable {
    /// Version 2: Noise IK's responder, the initiation's timestamp and length (the response
    /// may not be longer).
    case noiseIK(NoiseIK.Responder, timestamp: TAI64N, limit: Int)
    /// Version 3: the handshake with the client identified, the server's index (the response's),
    /// the cipher chosen.
    case hybrid(HybridHandshake.Identified, index: UInt32, suite: CipherSuite)
}

/// A handshake held while its password is checked. It carries the password, so keep it only
/// as long as the check runs.
public struct PasswordCheck: Equatable, Sendable {
    /// The user who claims to be logging in; nil when the check is against the decoy (an unknown
    /// user or a wrong key) and ends in a refusal whatever its result.
    public let peer: PeerID?
    /// Why the handshake is refused after a decoy check.
    let refusal: DropReason?
    /// The server's address the initiation was sent to: send the answer from it.
    public var local: IPAddress? { initiation.local }
    let initiation: HeldInitiation
    let hash: PasswordHash
    /// The one buffer that holds the password: wiped for every holder once checked.
    let password: SecretBuffer
    let proof: [UInt8]
    /// The users list it was started under (see `ServerCore.replaceUsers`).
    let generation: Int

    /// Runs Argon2id (tens of milliseconds and 64 MiB at the interactive cost): call it off the data path.
    /// The password is wiped once checked: a check runs once.
    public func verify() -> Bool {
        defer { password.wipe() }
        return hash.verify(password)
    }

    public static func == (a: PasswordCheck, b: PasswordCheck) -> Bool {
        a.peer == b.peer && a.initiation.ephemeral == b.initiation.ephemeral
    }
}
