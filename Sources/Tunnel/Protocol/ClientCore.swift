public import Basics
public import Device

/// A username and password for servers that ask for one. The description never shows the password.
public struct Credentials: Sendable, CustomStringConvertible {
    /// The most bytes of UTF-8 either field may have.
    public static let maxLength = 255

    public let username: String
    /// In the secret arena, wiped when the last copy of the credentials goes.
    let password: SecretBuffer

    /// Nil when either is empty or longer than `maxLength` bytes of UTF-8.
    public init?(username: String, password: String) {
        guard (1...Self.maxLength).contains(username.utf8.count), (1...Self.maxLength).contains(password.utf8.count)
        else { return nil }
        var bytes = Array(password.utf8)
        guard let secret = SecretBuffer(taking: &bytes) else { return nil }
        self.username = username
        self.password = secret
    }

    /// From a password file's bytes, which are moved into the secret arena and wiped where they
    /// were, so no `String` copy of the password is ever made. Whitespace at either end (the
    /// file's last newline) is not part of the password. Nil when either is empty or too long.
    public init?(username: String, passwordFile bytes: inout [UInt8]) {
        defer { Primitives.wipe(&bytes) }
        let isSpace = { (byte: UInt8) in byte == 0x20 || byte == 0x09 || byte == 0x0A || byte == 0x0D }
        guard (1...Self.maxLength).contains(username.utf8.count),
              let first = bytes.firstIndex(where: { !isSpace($0) }), let last = bytes.lastIndex(where: { !isSpace($0) }),
              last - first < Self.maxLength,
              let secret = bytes.withUnsafeBytes({ SecretBuffer(copying: UnsafeRawBufferPointer(rebasing: $0[first...last])) })
        else { return nil }
        self.username = username
        password = secret
    }

    public var description: String { "\(username):<redacted>" }
}

/// What a session speaks: its protocol version and the cipher its packets are sealed with.
public struct SessionProtocol: Hashable, Sendable {
    public var version: UInt8
    public var cipher: CipherSuite

    public init(version: UInt8, cipher: CipherSuite) {
        self.version = version
        self.cipher = cipher
    }
}

/// What the client core made of one datagram.
public enum ClientEvent: Equatable, Sendable {
    /// An inner IP packet from the server, decrypted in place at `range` of the datagram's buffer.
    case packet(range: Range<Int>)
    /// The handshake completed: the new session is in use.
    case established(HandshakeCompletion)
    /// The server refused our key or credentials; retrying with the same ones will not help.
    case rejected
    /// The echo of our probe `id`, `rtt` after we sent it; `size`: its plaintext's length, the
    /// tunnel packet a padded probe stood for.
    case probeEcho(id: UInt64, rtt: Duration, size: Int)
    /// The server says it holds no session for the one we use: it restarted. Start a handshake;
    /// keep the session meanwhile (the hint is unauthenticated, see docs/PROTOCOL.md).
    case sessionUnknown
    /// The server is under load or wants proof of our address before a password check: send
    /// `initiation` (the handshake in flight, now carrying the server's cookie in mac2) at once.
    /// The same handshake, so it costs no new attempt.
    case cookie(resend: [UInt8])
    /// Version 3: handshake datagrams to send to the server now (the identity after the
    /// response, or both parts of the initiation again with a cookie).
    case send([[UInt8]])
    /// The server sent a keepalive.
    case keepalive
    /// The server said, on the session, that it is being taken down: move to another one.
    case draining
    /// The server took our path MTU notice saying `mtu`.
    case pathMTUAcknowledged(Int)
    /// The datagram was dropped, and counted, for `reason`.
    case dropped(DropReason)
}

/// A finished handshake.
public struct HandshakeCompletion: Equatable, Sendable {
    /// From sending the initiation to reading the response.
    public var rtt: Duration
    /// The inner addresses the server holds for us.
    public var addresses: [IPAddress]
    /// One of them is IPv6: the tunnel's MTU stays at 1,280 or above.
    public var carriesIPv6: Bool { addresses.contains { $0.family == .v6 } }
    /// The resolvers and search domains the server gave, or why those it sent cannot be used.
    public var dns: Result<DNSSettings, DNSSettingsError>
    /// A keepalive on the new session: send it at once if no data is about to go, so the
    /// server learns we hold the keys and starts using them too.
    public var confirmation: [UInt8]
    /// The server echoes padded probes padded alike: the path's MTU can be discovered.
    public var sizedEchoes = false
    /// What the new session speaks.
    public var spoken: SessionProtocol
}

/// The client's side of the protocol: builds initiations, turns responses into a session, seals
/// and opens packets. It knows nothing of sockets, so a session survives any rebind.
public struct ClientCore: Sendable {
    /// Our static public key, as the server's users file lists it.
    public let publicKey: PublicKey
    /// The server's static key, pinned.
    public let serverKey: PublicKey
    /// The protocol version this client speaks: 2, or 3 (the hybrid post-quantum handshake).
    public let version: UInt8
    /// Version 3 only: speak version 2 to a server that answers none of `fallbackAfter` version
    /// 3 handshakes in a row, for `fallbackHold`, then try version 3 again.
    public let fallback: Bool
    /// Version 3 handshakes in a row that got no answer at all (no response, no cookie reply).
    private var unanswered = 0
    /// Until when version 2 is spoken after a fallback.
    private var fallbackUntil: Instant?
    static let fallbackAfter = 2
    static let fallbackHold: Duration = .seconds(600)
    /// Dropped datagrams by reason.
    public private(set) var drops = DropCounters()
    /// The server of the last accepted handshake takes path MTU notices (`pathMTUNotice`).
    public private(set) var takesPathMTUNotices = false
    /// The inner addresses from the last accepted handshake.
    public private(set) var addresses: [IPAddress] = []

    private let privateKey: PrivateKey
    private let credentials: Credentials?
    private let mac1: Mac1
    private var cookie: CookieHolder
    private let limits: SessionLimits
    private var pending: Pending?
    private var current: TransportSession?
    private var previous: TransportSession?
    private var lastTimestamp: TAI64N?
    /// Whether `current` has had its session-unknown hint reported: one is enough.
    private var hints = HintLatch()
    /// Where the server's authenticated answers last came from.
    private var authenticatedSource: SocketAddress?

    private struct Pending {
        var handshake: Handshake
        var localIndex: UInt32
        var sentAt: Instant
        /// The initiation as sent (version 3: its two parts), to send again with a cookie.
        var datagrams: [[UInt8]]
        /// Cookie replies answered for this initiation.
        var resends = 0
        /// The server answered it (a cookie reply, a response): it speaks its version.
        var answered = false
    }

    /// Where a handshake in flight stands.
    private enum Handshake {
        /// Version 2: the initiation is out.
        case ik(NoiseIK.Initiator)
        /// Version 3: the initiation is out, with this offer.
        case hybrid(HybridHandshake.Initiator, offer: WireV3.Offer)
        /// Version 3: the identity is out; the verdict will say.
        case identified(HybridHandshake.AwaitingVerdict, remoteIndex: UInt32, suite: CipherSuite)
    }

    /// Version 3's offer: every suite, AES-256-GCM first where this machine has AES in hardware,
    /// or only the `pinned` one.
    private let offer: WireV3.Offer

    /// Cookie replies a handshake answers at once; after these, one more per `cookieResendSpacing`
    /// since it was sent. A forger who saw the initiation can make replies too: they cannot use up
    /// the client's answers for good (the real server's next reply still counts), nor make it
    /// send faster than this.
    static let cookieResendBurst = 3
    static let cookieResendSpacing: Duration = .milliseconds(100)

    /// The inner sources the tunnel accepts packets from: the prefixes it routes (split mode),
    /// or any (nil, full mode). Like WireGuard's allowed IPs: the server, or whoever holds its
    /// keys, cannot inject packets that claim to come from the laptop's LAN or anywhere else.
    public let acceptedSources: [Prefix]?

    /// Throws `weakPublicKey` when `serverKey` is a low-order point that no server can hold.
    public init(
        privateKey: PrivateKey, serverKey: PublicKey, credentials: Credentials? = nil,
        limits: SessionLimits = SessionLimits(), acceptedSources: [Prefix]? = nil,
        version: UInt8 = 2, cipher pinned: CipherSuite? = nil, fallback: Bool = false
    ) throws(CryptoError) {
        self.acceptedSources = acceptedSources
        self.version = version
        self.fallback = fallback && version == WireV3.version
        let aes = CipherSuite.aesInHardware
        offer = if let pinned {
            WireV3.Offer(suites: [pinned], preferred: pinned, aesHardware: aes)
        } else {
            WireV3.Offer(suites: Set(CipherSuite.allCases), preferred: aes ? .aes256GCM : .chacha20Poly1305, aesHardware: aes)
        }
        try Sodium.initialize()
        guard Primitives.dh(privateKey, serverKey) != nil else { throw .weakPublicKey }
        self.privateKey = privateKey
        publicKey = privateKey.publicKey
        self.serverKey = serverKey
        self.credentials = credentials
        mac1 = Mac1(serverKey: serverKey)
        cookie = CookieHolder(serverKey: serverKey)
        self.limits = limits
    }

    // MARK: Handshake

    /// A new handshake initiation, replacing any in flight. `wallClock` dates it so the server
    /// can refuse replays; a clock that stands still or steps back is nudged forward.
    public mutating func initiate(now: Instant, wallClock: TAI64N) throws(CryptoError) -> [UInt8] {
        var timestamp = wallClock
        if let last = lastTimestamp, timestamp <= last { timestamp = last.successor }
        lastTimestamp = timestamp
        let payload = InitiationPayload(
            timestamp: timestamp, username: credentials.map { Array($0.username.utf8) }, password: credentials?.password)
        var plaintext = payload.encoded()
        defer { Primitives.wipe(&plaintext) }
        let index = freshIndex()
        guard let (initiator, message) = NoiseIK.Initiator.start(
            localStatic: privateKey, remoteStatic: serverKey, prologue: Wire.prologue, ephemeral: .random(),
            payload: plaintext)
        else { throw .weakPublicKey }
        var datagram = Wire.header(.initiation) + withUnsafeBytes(of: index.littleEndian) { Array($0) } + message
            + [UInt8](repeating: 0, count: Initiation.macsLength)
        mac1.stamp(&datagram)
        cookie.stamp(&datagram, now: now)
        pending = Pending(handshake: .ik(initiator), localIndex: index, sentAt: now, datagrams: [datagram])
        return datagram
    }

    /// A new handshake's datagrams, replacing any in flight: version 2's initiation, or version
    /// 3's two parts (the KEM key first). `ephemeral` and `kem` fix the keys, for test vectors.
    /// With `fallback`, version 2's after `fallbackAfter` version 3 handshakes went unanswered.
    public mutating func initiation(now: Instant, wallClock: TAI64N) throws(CryptoError) -> [[UInt8]] {
        guard version == WireV3.version else { return [try initiate(now: now, wallClock: wallClock)] }
        let speaks = nextVersion(now: now)
        unanswered = unansweredCounting(pending)
        // The fallback starts once and lasts its hold, rekeys or not; then version 3 is tried again.
        if fallback, unanswered >= Self.fallbackAfter {
            fallbackUntil = now + Self.fallbackHold
            unanswered = 0
        }
        return speaks == Wire.version ? [try initiate(now: now, wallClock: wallClock)] : try hybridInitiation(now: now)
    }

    /// The version the next handshake speaks.
    public func nextVersion(now: Instant) -> UInt8 {
        guard fallback else { return version }
        return unansweredCounting(pending) >= Self.fallbackAfter || fallbackUntil.map({ now < $0 }) ?? false ? Wire.version : version
    }

    /// The version 3 handshakes in a row without an answer, `handshake` (the one in flight) among them.
    private func unansweredCounting(_ handshake: Pending?) -> Int {
        guard let handshake, case .hybrid = handshake.handshake else { return unanswered }
        return handshake.answered ? 0 : unanswered + 1
    }

    mutating func hybridInitiation(now: Instant, ephemeral: PrivateKey = .random(), kem: MLKEM.KeyPair = MLKEM.KeyPair(),
                                   index: UInt32? = nil) throws(CryptoError) -> [[UInt8]] {
        let index = index ?? freshIndex()
        guard let (initiator, kemKey, rest) = HybridHandshake.Initiator.start(serverKey: serverKey, ephemeral: ephemeral, kem: kem,
                                                                              offer: offer.encoded())
        else { throw .weakPublicKey }
        let sender = withUnsafeBytes(of: index.littleEndian) { Array($0) }
        let macs = [UInt8](repeating: 0, count: Initiation.macsLength)
        var parts = [WireV3.header(.kemKey) + sender + kemKey + macs, WireV3.header(.initiationRest) + sender + rest + macs]
        for i in parts.indices {
            mac1.stamp(&parts[i])
            cookie.stamp(&parts[i], now: now)
        }
        pending = Pending(handshake: .hybrid(initiator, offer: offer), localIndex: index, sentAt: now, datagrams: parts)
        return parts
    }

    /// True when a handshake is due: no usable session, or the current one has sent
    /// `rekeyAfterMessages` or is `rekeyAfterTime` old.
    public func needsRekey(now: Instant) -> Bool {
        guard let current, !current.isExpired(now: now, limits: limits) else { return true }
        return current.needsRekey(now: now, limits: limits)
    }

    /// True while a session can seal packets.
    public func hasSession(now: Instant) -> Bool {
        current.map { !$0.isExpired(now: now, limits: limits) && $0.sendCounter < limits.rejectAfterMessages } ?? false
    }

    /// What the session in use speaks; nil without one.
    public var session: SessionProtocol? { current?.spoken }

    /// True while an initiation awaits its response.
    public var isHandshaking: Bool { pending != nil }

    /// How long a handshake may go unanswered before another is due (WireGuard's REKEY_TIMEOUT):
    /// an initiation or its response can be lost, and waiting for it forever kills the tunnel.
    public static let handshakeRetry: Duration = .seconds(5)

    /// True when a new initiation is due: the session needs new keys (or has none) and no
    /// handshake is in flight, or the one in flight went unanswered too long.
    public func needsHandshake(now: Instant) -> Bool {
        guard needsRekey(now: now) || !hasSession(now: now) else { return false }
        guard let pending else { return true }
        return now - pending.sentAt >= Self.handshakeRetry
    }

    // MARK: Receiving

    /// Handles one datagram from `peer`, decrypting a data packet in place. Authenticated
    /// messages prove themselves wherever they come from; an unauthenticated hint counts only
    /// from the server's address (`server`, where we send) or the one its authenticated answers
    /// last came from (a server with several addresses may answer from another).
    public mutating func receive(_ datagram: UnsafeMutableRawBufferPointer, from peer: SocketAddress, server: SocketAddress,
                                 now: Instant) -> ClientEvent {
        let fromServer = peer == server || peer == authenticatedSource
        let event = receive(datagram, fromServer: fromServer, now: now)
        switch event {
        case .packet, .keepalive, .probeEcho, .established, .rejected: authenticatedSource = peer
        default: break
        }
        return event
    }

    /// Handles one datagram, decrypting a data packet in place; `fromServer` tells whether an
    /// unauthenticated hint may count (see `receive(_:from:server:now:)`).
    public mutating func receive(_ datagram: UnsafeMutableRawBufferPointer, fromServer: Bool, now: Instant) -> ClientEvent {
        // A version 3 client that may fall back reads version 2 too: what answers a fallback's
        // handshake, and its session. Without a fallback it refuses version 2 at the first byte.
        if version == WireV3.version, datagram.first == WireV3.version || !fallback {
            return receiveV3(datagram, fromServer: fromServer, now: now)
        }
        return switch Wire.messageType(of: UnsafeRawBufferPointer(datagram)) {
        case .failure(let reason): drop(reason)
        case .success(.data): receiveData(datagram, now: now)
        case .success(.response): receiveResponse(UnsafeRawBufferPointer(datagram), now: now)
        case .success(.sessionUnknown): fromServer ? receiveHint(UnsafeRawBufferPointer(datagram)) : drop(.foreignSource)
        // A cookie reply authenticates itself (it is bound to our initiation's mac1), and a server
        // with several addresses may send it from another than the one we used.
        case .success(.cookieReply): receiveCookie(UnsafeRawBufferPointer(datagram), now: now)
        case .success(.initiation): drop(.unexpected)
        }
    }

    /// Handles one datagram held in an array; a packet's `range` then indexes `datagram`.
    public mutating func receive(_ datagram: inout [UInt8], fromServer: Bool = true, now: Instant) -> ClientEvent {
        datagram.withUnsafeMutableBytes { receive($0, fromServer: fromServer, now: now) }
    }

    /// Version 3's datagrams: its handshake messages, and data, hints and cookie replies with
    /// version 2's layouts.
    private mutating func receiveV3(_ datagram: UnsafeMutableRawBufferPointer, fromServer: Bool, now: Instant) -> ClientEvent {
        return switch WireV3.kind(of: UnsafeRawBufferPointer(datagram)) {
        case .failure(let reason): drop(reason)
        case .success(.data): receiveData(datagram, now: now)
        case .success(.response): receiveHybridResponse(UnsafeRawBufferPointer(datagram), now: now)
        case .success(.verdict): receiveVerdict(UnsafeRawBufferPointer(datagram), now: now)
        case .success(.sessionUnknown): fromServer ? receiveHint(UnsafeRawBufferPointer(datagram)) : drop(.foreignSource)
        case .success(.cookieReply): receiveCookie(UnsafeRawBufferPointer(datagram), now: now)
        case .success(.kemKey), .success(.initiationRest), .success(.identity): drop(.unexpected)
        }
    }

    /// Version 3's response: the client checks the choice against its offer and says who it is.
    private mutating func receiveHybridResponse(_ datagram: UnsafeRawBufferPointer, now: Instant) -> ClientEvent {
        typealias R = WireV3.ResponseV3
        let receiver = datagram.loadLittleEndian(UInt32.self, at: R.receiverOffset)
        guard var pending, pending.localIndex == receiver, case .hybrid(let initiator, let offer) = pending.handshake else {
            return drop(.unexpected)
        }
        guard let (identifying, choiceBytes) = initiator.read(
            response: Array(datagram[R.ephemeralOffset..<R.ciphertextOffset]),
            ciphertext: Array(datagram[R.ciphertextOffset..<R.choiceOffset]), sealedChoice: Array(datagram[R.choiceOffset...]))
        else { return drop(.handshakeFailed) }
        // The server is authenticated now, and speaks version 3: a choice outside the offer, or
        // none, ends the handshake.
        unanswered = 0
        guard let choice = WireV3.Choice(decoding: choiceBytes), let suite = choice.suite, offer.suites.contains(suite) else {
            self.pending = nil
            return .rejected
        }
        let username = credentials.map { Array($0.username.utf8) }
        var plaintext = WireV3.Credentials.encoded(username: username, password: credentials?.password)
        defer { Primitives.wipe(&plaintext) }
        guard let (waiting, sealedKey, sealedPayload) = identifying.identify(as: privateKey, payload: plaintext) else {
            return drop(.handshakeFailed)
        }
        let sender = datagram.loadLittleEndian(UInt32.self, at: R.senderOffset)
        let identity = WireV3.header(.identity) + withUnsafeBytes(of: sender.littleEndian) { Array($0) } + sealedKey + sealedPayload
        pending.handshake = .identified(waiting, remoteIndex: sender, suite: suite)
        pending.datagrams = []
        self.pending = pending
        return .send([identity])
    }

    /// Version 3's verdict: the session, on the chosen suite, or the refusal.
    private mutating func receiveVerdict(_ datagram: UnsafeRawBufferPointer, now: Instant) -> ClientEvent {
        typealias V = WireV3.Verdict
        let receiver = datagram.loadLittleEndian(UInt32.self, at: V.receiverOffset)
        let sender = datagram.loadLittleEndian(UInt32.self, at: V.senderOffset)
        guard let pending, pending.localIndex == receiver, case .identified(let waiting, let remoteIndex, let suite) = pending.handshake,
              sender == remoteIndex else { return drop(.unexpected) }
        guard let (payload, keys, _) = waiting.read(verdict: Array(datagram[V.payloadOffset...])) else { return drop(.handshakeFailed) }
        guard let verdict = ResponsePayload(decoding: payload) else { return drop(.malformed) }
        return establish(verdict, keys: keys, localIndex: receiver, remoteIndex: sender, suite: suite, version: WireV3.version,
                         started: pending.sentAt, now: now)
    }

    private mutating func receiveResponse(_ datagram: UnsafeRawBufferPointer, now: Instant) -> ClientEvent {
        let receiver = datagram.loadLittleEndian(UInt32.self, at: Response.receiverOffset)
        guard let pending, pending.localIndex == receiver, case .ik(let initiator) = pending.handshake else { return drop(.unexpected) }
        guard let (payload, keys, _) = initiator.finish(Array(datagram[Response.noiseOffset...])) else {
            return drop(.handshakeFailed)
        }
        guard let verdict = ResponsePayload(decoding: payload) else { return drop(.malformed) }
        let sender = datagram.loadLittleEndian(UInt32.self, at: Response.senderOffset)
        return establish(verdict, keys: keys, localIndex: receiver, remoteIndex: sender, suite: .chacha20Poly1305, version: Wire.version,
                         started: pending.sentAt, now: now)
    }

    /// An authenticated verdict: the new session when accepted, its confirmation to send at once.
    private mutating func establish(_ verdict: ResponsePayload, keys: TransportKeys, localIndex receiver: UInt32, remoteIndex sender: UInt32,
                                    suite: CipherSuite, version: UInt8, started: Instant, now: Instant) -> ClientEvent {
        self.pending = nil
        guard verdict.accepted else { return .rejected }
        // A session in version 3 ends any fallback.
        if self.version == WireV3.version, version == WireV3.version {
            fallbackUntil = nil
            unanswered = 0
        }
        previous = current
        current = TransportSession(localIndex: receiver, remoteIndex: sender, keys: keys, suite: suite, version: version, established: now)
        hints.reset()
        addresses = verdict.addresses
        takesPathMTUNotices = verdict.pathMTUNotices
        let confirmation = (try? current?.seal(message: [], now: now, limits: limits)) ?? []
        return .established(HandshakeCompletion(rtt: now - started, addresses: verdict.addresses, dns: verdict.dns,
                                                confirmation: confirmation, sizedEchoes: verdict.sizedEchoes,
                                                spoken: SessionProtocol(version: version, cipher: suite)))
    }

    /// A cookie reply for the handshake in flight: keep the cookie and send the same initiation
    /// again with mac2. The reply is bound to the initiation's mac1, so only someone who saw the
    /// initiation can forge one, and then it costs us a resend, never the handshake.
    private mutating func receiveCookie(_ datagram: UnsafeRawBufferPointer, now: Instant) -> ClientEvent {
        let receiver = datagram.loadLittleEndian(UInt32.self, at: CookieReply.receiverOffset)
        guard var pending, pending.localIndex == receiver, !pending.datagrams.isEmpty else { return drop(.unexpected) }
        // The reply is bound to the mac1 of the datagram it answers: either of version 3's parts.
        guard pending.datagrams.contains(where: { part in
            cookie.accept(datagram, mac1: part.withUnsafeBytes { Cookie.mac1(of: $0) }, now: now)
        }) else { return drop(.handshakeFailed) }
        // The newest cookie is kept either way; the next initiation carries it.
        let allowed = Self.cookieResendBurst + Int((now - pending.sentAt) / Self.cookieResendSpacing)
        guard pending.resends < allowed else { return drop(.rateLimited) }
        for i in pending.datagrams.indices { cookie.stamp(&pending.datagrams[i], now: now) }
        pending.resends += 1
        pending.answered = true
        self.pending = pending
        return pending.datagrams.count == 1 ? .cookie(resend: pending.datagrams[0]) : .send(pending.datagrams)
    }

    private mutating func receiveHint(_ datagram: UnsafeRawBufferPointer) -> ClientEvent {
        let index = datagram.loadLittleEndian(UInt32.self, at: 4)
        guard let current, current.remoteIndex == index, hints.hint() else { return drop(.unexpected) }
        return .sessionUnknown
    }

    private mutating func receiveData(_ datagram: UnsafeMutableRawBufferPointer, now: Instant) -> ClientEvent {
        let index = UnsafeRawBufferPointer(datagram).loadLittleEndian(UInt32.self, at: DataPacket.receiverOffset)
        let result: Result<TransportSession.Opened, DropReason>
        let onCurrent = current?.localIndex == index
        if onCurrent, let opened = current?.open(datagram, now: now, limits: limits) {
            result = opened
        } else if previous?.localIndex == index, let opened = previous?.open(datagram, now: now, limits: limits) {
            result = opened
        } else {
            return drop(.unknownSession)
        }
        let opened: TransportSession.Opened
        switch result {
        case .failure(let reason): return drop(reason)
        case .success(let value): opened = value
        }
        // The server has the session after all: a later hint is news again.
        hints.reset()
        switch InnerContent(UnsafeRawBufferPointer(rebasing: datagram[opened.range])) {
        case .keepalive: return .keepalive
        case .packet(let source):
            if let accepted = acceptedSources, !accepted.contains(where: { $0.contains(source) }) {
                return drop(.wrongInnerSource)
            }
            return .packet(range: opened.range)
        case .echo(let id, let sentAt, let size): return .probeEcho(id: id, rtt: now - sentAt, size: size)
        case .drain: return .draining
        case .pathMTU(let mtu):
            // An answer to a notice of the session before says nothing of the one in use.
            return onCurrent ? .pathMTUAcknowledged(mtu) : drop(.unexpected)
        case .probe, .close: return drop(.unexpected)
        case .malformed: return drop(.malformed)
        }
    }

    // MARK: Sending

    /// Seals an inner packet in place: `buffer` holds `DataPacket.headroom` spare bytes,
    /// `innerLength` bytes of packet, and `DataPacket.tailroom` spare bytes. Returns the
    /// datagram's length.
    public func seal(_ buffer: UnsafeMutableRawBufferPointer, innerLength: Int, now: Instant) throws(SealFailure) -> Int {
        guard let sealer else { throw .noSession }
        return try sealer.seal(buffer, innerLength: innerLength, now: now)
    }

    /// The session in use, to seal with away from the core: a sending thread takes it once per
    /// batch and seals without holding anything the receiving thread needs.
    public var sealer: Sealer? { current.map { Sealer(session: $0, limits: limits) } }

    /// Seals a framed packet (see `DataPacket.frame`); the array becomes the datagram.
    public func seal(_ framed: inout [UInt8], now: Instant) throws(SealFailure) {
        let innerLength = framed.count - DataPacket.overhead
        _ = try framed.withMutableBytes { (buffer) throws(SealFailure) in try seal(buffer, innerLength: innerLength, now: now) }
    }

    /// A probe the server echoes: liveness and round-trip time for the path it is sent on.
    /// `size` pads it to stand for a tunnel packet of that many bytes (its datagram is then
    /// exactly as big as one), and a server that echoes sizes pads the echo alike.
    public mutating func probe(id: UInt64, now: Instant, size: Int? = nil) throws(SealFailure) -> [UInt8] {
        try sealMessage(Control.encode(kind: Control.probe, id: id, sentAt: now, paddedTo: size ?? Control.length), now: now)
    }

    /// Tells the server the largest inner packet this client's path carries (its tunnel MTU):
    /// a server that takes such notices keeps what it sends within it, and answers bigger
    /// packets from its side as a router would, so their senders make them smaller.
    public mutating func pathMTUNotice(_ mtu: Int, now: Instant) throws(SealFailure) -> [UInt8] {
        guard Control.pathMTURange.contains(mtu) else { throw .badLength }
        return try sealMessage(Control.encode(kind: Control.pathMTU, id: UInt64(mtu), sentAt: now), now: now)
    }

    /// Tells the server this client is going away, so it forgets the session at once rather
    /// than after its timeouts.
    public mutating func close(now: Instant) throws(SealFailure) -> [UInt8] {
        try sealMessage(Control.encode(kind: Control.close, id: 0, sentAt: now), now: now)
    }

    /// Forgets the session's keys and any handshake in flight (after `close`): nothing more is
    /// sealed or opened until a new handshake completes.
    public mutating func forgetSession() {
        pending = nil
        current = nil
        previous = nil
        hints.reset()
    }

    /// An empty data packet: keeps NAT state and tells the server we are here.
    public mutating func keepalive(now: Instant) throws(SealFailure) -> [UInt8] {
        try sealMessage([], now: now)
    }

    /// A control message of any kind on the session, for tests of what the server accepts.
    mutating func sealControlForTest(kind: UInt8) throws(SealFailure) -> [UInt8] {
        try sealMessage(Control.encode(kind: kind, id: 0, sentAt: .zero), now: .zero)
    }

    private mutating func sealMessage(_ message: [UInt8], now: Instant) throws(SealFailure) -> [UInt8] {
        guard let datagram = try current?.seal(message: message, now: now, limits: limits) else { throw .noSession }
        return datagram
    }

    private mutating func drop(_ reason: DropReason) -> ClientEvent {
        drops.count(reason)
        return .dropped(reason)
    }

    /// A random index for a new session, distinct from the ones still in use.
    private func freshIndex() -> UInt32 {
        while true {
            let index = Primitives.randomUInt32()
            if index != 0, index != current?.localIndex, index != previous?.localIndex { return index }
        }
    }
}

/// One session's sending side, shared with the core that made it: each seal takes the next
/// counter atomically, so several holders never reuse a nonce.
public struct Sealer: Sendable {
    let session: TransportSession
    let limits: SessionLimits

    /// Seals in place, as `ClientCore.seal(_:innerLength:now:)` does.
    public func seal(_ buffer: UnsafeMutableRawBufferPointer, innerLength: Int, now: Instant) throws(SealFailure) -> Int {
        try session.seal(buffer, innerLength: innerLength, now: now, limits: limits)
    }
}
