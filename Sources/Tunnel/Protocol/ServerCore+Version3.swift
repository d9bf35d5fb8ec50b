import Basics
import Device

/// Which protocol versions and ciphers a gateway speaks (`allow-versions:`, `cipher:`).
public struct ProtocolPolicy: Equatable, Sendable {
    /// The versions a client may start a handshake in: 2 and 3 unless the operator closes one
    /// (a fleet whose clients all speak 3 closes 2).
    public var versions: Set<UInt8>
    /// The one cipher version 3 sessions may use, when the operator pins one; nil: AES-256-GCM
    /// when both ends have AES in hardware, ChaCha20-Poly1305 otherwise.
    public var cipher: CipherSuite?

    /// The versions this build speaks.
    public static let supportedVersions: Set<UInt8> = [Wire.version, WireV3.version]

    public init(versions: Set<UInt8> = ProtocolPolicy.supportedVersions, cipher: CipherSuite? = nil) {
        self.versions = versions
        self.cipher = cipher
    }
}

/// What a datagram is to a server (see `ServerCore.kind(of:)`).
public enum ServerDatagram: Sendable {
    case data
    case handshake
}

// MARK: Version 3's handshake at the gateway
//
// Three messages reach the server per handshake, each through the steps version 2's
// initiation takes (admit, locked → open, outside the lock → decide, locked):
//   1. the first part (the KEM key): mac1, the cookie under load, then kept (`InitiationParts`);
//   2. the second part: mac1, a replay, the first part, the lane and budgets; opened: three
//      X25519 operations and the ML-KEM encapsulation; decided: the response, and the handshake
//      kept half-open (`HalfOpenHandshakes`) under a receiver index of its own;
//   3. the identity: its half-open handshake; opened: one X25519 operation; decided: the user,
//      the pinned key and the password as in version 2, then the verdict and the session.
// The identity proves that the client receives at its address (it needs the response), so a
// password check needs no cookie; and the server's fresh ephemeral key makes every transcript
// new, so there are no timestamps to compare.

extension ServerCore {
    mutating func admitVersion3(
        _ datagram: UnsafeRawBufferPointer, from source: SocketAddress, at local: IPAddress?, now: Instant
    ) -> Admission {
        let kind: WireV3.Kind
        switch WireV3.kind(of: datagram) {
        case .failure(let reason): return .answered(drop(reason))
        case .success(let found): kind = found
        }
        guard protocols.versions.contains(WireV3.version) else { return .answered(drop(.versionNotAllowed)) }
        switch kind {
        case .kemKey: return .answered(keepFirstPart(datagram, from: source, now: now))
        case .initiationRest: return admitSecondPart(datagram, from: source, at: local, now: now)
        case .identity: return admitIdentity(datagram, from: source, at: local, now: now)
        case .response, .verdict, .data, .sessionUnknown, .cookieReply: return .answered(drop(.unexpected))
        }
    }

    /// The first part: kept once its mac1 checks out and, when a second part would need one or
    /// the table is half taken where the part would go (`InitiationParts.needsProof`), its
    /// cookie: spoofed parts can take at most half of the table. A proven part from where a peer
    /// proved itself may take the peers' share when everyone's is full.
    private mutating func keepFirstPart(_ datagram: UnsafeRawBufferPointer, from source: SocketAddress, now: Instant) -> ServerEvent {
        guard mac1.verify(datagram) else { return drop(.badMAC) }
        var proven = false
        if needsProof(source.ip, now: now) || firstParts.needsProof(source.ip, now: now) {
            guard cookies.isProven(datagram, from: source, now: now) else { return cookieReply(to: datagram, from: source, now: now) }
            proven = true
        }
        typealias K = WireV3.KEMKeyPart
        let index = datagram.loadLittleEndian(UInt32.self, at: K.senderOffset)
        let kemKey = Array(datagram[K.keyOffset..<(K.keyOffset + MLKEM.publicKeyLength)])
        do {
            try firstParts.keep(kemKey, from: source, index: index, proven: proven,
                                peer: proven && sessions.peer(provenAt: source) != nil, now: now)
            return .held
        } catch {
            return drop(error.reason)
        }
    }

    /// The second part: the first part it belongs to, then the lane and budgets version 2's
    /// initiation takes. Nothing costly before both.
    private mutating func admitSecondPart(
        _ datagram: UnsafeRawBufferPointer, from source: SocketAddress, at local: IPAddress?, now: Instant
    ) -> Admission {
        guard mac1.verify(datagram) else { return .answered(drop(.badMAC)) }
        typealias R = WireV3.RestPart
        // A second part whose password check runs or failed, sent again, costs nothing.
        let ephemeral = Array(datagram[R.ephemeralOffset..<R.offerOffset])
        guard !checksInFlight.contains(ephemeral), !failedChecks.contains(ephemeral) else { return .answered(drop(.replayedHandshake)) }
        let index = datagram.loadLittleEndian(UInt32.self, at: R.senderOffset)
        guard let kemKey = firstParts.take(from: source, index: index, now: now) else { return .answered(drop(.missingPart)) }
        switch lane(for: datagram, from: source, now: now) {
        case .answered(let event): return .answered(event)
        case .lane(let lane, let proven):
            return .admitted(AdmittedInitiation(
                datagram: Array(datagram), source: source, local: local, ephemeral: ephemeral, addressProven: proven, lane: lane,
                step: .hybridInitiation(kemKey: kemKey, pinned: protocols.cipher)))
        }
    }

    /// The identity: the half-open handshake its receiver index names, if it comes from where
    /// the response went (which it proves), taken out while it is read (one identity per
    /// response: a copy finds nothing; a forgery puts it back, a few times at most).
    private mutating func admitIdentity(
        _ datagram: UnsafeRawBufferPointer, from source: SocketAddress, at local: IPAddress?, now: Instant
    ) -> Admission {
        let index = datagram.loadLittleEndian(UInt32.self, at: WireV3.Identity.receiverOffset)
        guard let handshake = halfOpen.take(index, from: source, now: now) else { return .answered(drop(.unexpected)) }
        return .admitted(AdmittedInitiation(
            datagram: Array(datagram), source: source, local: local, ephemeral: handshake.ephemeral, addressProven: true,
            lane: handshake.lane, step: .identity(handshake)))
    }

    /// The response written: kept half-open under a fresh receiver index and sent; with no
    /// cipher in common, sent as the end of the handshake (the client stops).
    mutating func decideResponse(_ admitted: AdmittedInitiation, _ written: Result<HybridAnswer, DropReason>, now: Instant) -> Decision {
        let answer: HybridAnswer
        switch written {
        case .failure(let reason): return .answered(drop(reason))
        case .success(let value): answer = value
        }
        let clientIndex = admitted.datagram.withUnsafeBytes { $0.loadLittleEndian(UInt32.self, at: WireV3.RestPart.senderOffset) }
        var index = Primitives.randomUInt32()
        while !sessions.isFree(index) || halfOpen.contains(index) { index = Primitives.randomUInt32() }
        let response = Self.response(answer.body, sender: index, receiver: clientIndex, header: WireV3.header(.response))
        guard let suite = answer.suite else {
            drops.count(.noCommonCipher)
            return .answered(.rejected(.noCommonCipher, response: response, to: admitted.source))
        }
        let handshake = HalfOpenHandshake(state: answer.state, index: index, clientIndex: clientIndex, suite: suite,
                                          source: admitted.source, lane: admitted.lane, ephemeral: admitted.ephemeral, at: now)
        guard halfOpen.insert(handshake, now: now) else { return .answered(drop(.serverLimited)) }
        return .answered(.reply(datagram: response, to: admitted.source))
    }

    /// The identity read: who it is, as for version 2 (`judge`).
    mutating func decideIdentity(_ admitted: AdmittedInitiation, _ read: IdentityRead?, now: Instant) -> Decision {
        guard case .identity(let handshake) = admitted.step else { return .answered(drop(.unexpected)) }
        guard let read else {
            // A forgery (someone who saw the response) must not end the real client's handshake.
            var kept = handshake
            kept.failures += 1
            if kept.failures < HalfOpenHandshakes.attempts { _ = halfOpen.insert(kept, now: now) }
            return .answered(drop(.handshakeFailed))
        }
        // The payload and the password are buffers of their own, shared by whoever holds them
        // (a password check): these wipes clear the only copies.
        defer { read.payload.wipe() }
        if let refusal = laneRefusal(admitted, key: read.key, now: now) { return .answered(drop(refusal)) }
        guard let (username, password) = WireV3.Credentials.decode(read.payload) else { return .answered(drop(.malformed)) }
        defer { password?.wipe() }
        let initiation = HeldInitiation(
            source: admitted.source, local: admitted.local, senderIndex: handshake.clientIndex,
            handshake: .hybrid(read.state, index: handshake.index, suite: handshake.suite), remoteStatic: read.key,
            ephemeral: handshake.ephemeral, claim: username.map { [1] + $0 } ?? [2] + read.key.bytes)
        return admitted.datagram.withUnsafeBytes {
            judge(username: username, password: password, initiation, proven: true, datagram: $0, now: now)
        }
    }
}

/// Version 3's response, written away from the core: what the client's initiation offered
/// and what the server chose.
struct HybridAnswer: Sendable {
    let state: HybridHandshake.AwaitingIdentity
    /// The response after its indices: the ephemeral key, the ciphertext, the sealed choice.
    let body: [UInt8]
    /// Nil when the offer has no cipher this server may use.
    let suite: CipherSuite?

    /// Reads the initiation (`kemKey` from the first part, `rest` the second part) and answers
    /// it; a failure says why: a forgery or parts of different initiations (`handshakeFailed`),
    /// an offer or a KEM key that is not well-formed (`malformed`).
    static func write(kemKey: [UInt8], rest: [UInt8], pinned: CipherSuite?, key: PrivateKey) -> Result<HybridAnswer, DropReason> {
        typealias R = WireV3.RestPart
        guard let responder = HybridHandshake.Responder(
            kemKey: kemKey, ephemeralKey: Array(rest[R.ephemeralOffset..<R.offerOffset]),
            sealedOffer: Array(rest[R.offerOffset..<(rest.count - Initiation.macsLength)]), localStatic: key)
        else { return .failure(.handshakeFailed) }
        guard let offer = WireV3.Offer(decoding: responder.offer) else { return .failure(.malformed) }
        let suite = WireV3.choose(offer, pinned: pinned)
        // Nil here: the KEM key is not an encoding of one (its low-order X25519 case failed above).
        guard let (state, ephemeralKey, ciphertext, sealedChoice) = responder.respond(
            ephemeral: .random(), choice: WireV3.Choice(suite: suite).encoded())
        else { return .failure(.malformed) }
        return .success(HybridAnswer(state: state, body: ephemeralKey + ciphertext + sealedChoice, suite: suite))
    }
}

/// Version 3's identity, read: the handshake that writes the verdict, the client's static key,
/// and the credentials (in the secret arena).
struct IdentityRead: Sendable {
    let state: HybridHandshake.Identified
    let key: PublicKey
    let payload: SecretBuffer
}

/// A version 3 handshake answered, waiting for the client's identity.
struct HalfOpenHandshake: Sendable {
    let state: HybridHandshake.AwaitingIdentity
    /// The server's receiver index, named in the response: the session's, if it comes to one.
    let index: UInt32
    let clientIndex: UInt32
    let suite: CipherSuite
    /// Where the response went: the identity must come from there.
    let source: SocketAddress
    /// Whose budgets the initiation spent; the identity's static key must fit a peer's lane.
    let lane: Lane
    /// The client's ephemeral X25519 key, which names the handshake for replays.
    let ephemeral: [UInt8]
    let at: Instant
    /// Identities for it that did not authenticate.
    var failures = 0
}

/// Version 3 handshakes between the response and the identity, by the server's receiver index,
/// for `lifetime` at most. Each was admitted under the handshake budgets, so the table never
/// holds more than they let through in a lifetime (`capacity(for:)`); what one holds is a
/// handshake state and an ephemeral private key, a few hundred bytes.
struct HalfOpenHandshakes {
    static let lifetime: Duration = .seconds(5)
    /// Identities that may fail to authenticate before the handshake is given up.
    static let attempts = 3
    let capacity: Int
    private var handshakes: [UInt32: HalfOpenHandshake] = [:]
    private var nextSweep: Instant?

    init(capacity: Int) { self.capacity = capacity }

    /// What the budgets let through in a lifetime: both lanes' bursts and their rates.
    static func capacity(for limits: ServerLimits) -> Int {
        let seconds = Double(lifetime.components.seconds)
        return Int(limits.handshakes.burst + limits.handshakes.perSecond * seconds
                   + limits.peerHandshakes.burst + limits.peerHandshakes.perSecond * seconds)
    }

    var count: Int { handshakes.count }

    func contains(_ index: UInt32) -> Bool { handshakes[index] != nil }

    /// False when the table is full of handshakes younger than `lifetime`.
    mutating func insert(_ handshake: HalfOpenHandshake, now: Instant) -> Bool {
        sweep(now: now)
        guard handshakes.count < capacity else { return false }
        handshakes[handshake.index] = handshake
        return true
    }

    /// The handshake waiting under `index` for an identity from `source`, taken out; nil when
    /// there is none younger than `lifetime` (one for another source stays).
    mutating func take(_ index: UInt32, from source: SocketAddress, now: Instant) -> HalfOpenHandshake? {
        guard let handshake = handshakes[index], handshake.source == source else { return nil }
        handshakes[index] = nil
        return now - handshake.at < Self.lifetime ? handshake : nil
    }

    /// Forgets what is older than `lifetime` (its keys go with it), at most once a second
    /// unless the table is full.
    mutating func sweep(now: Instant) {
        if let due = nextSweep, now < due, handshakes.count < capacity { return }
        nextSweep = now + .seconds(1)
        handshakes = handshakes.filter { now - $0.value.at < Self.lifetime }
    }
}
