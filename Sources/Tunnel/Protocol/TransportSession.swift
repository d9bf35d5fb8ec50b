import Basics
import Synchronization

/// When a session should be replaced and when it must stop, as WireGuard sets them
/// (whitepaper §6.1); tests shrink them to reach the edges.
public struct SessionLimits: Equatable, Sendable {
    /// After sending this many messages the client starts a new handshake.
    public var rekeyAfterMessages: UInt64
    /// No counter at or past this is sent or accepted: far below 2^64, where the nonce would repeat.
    public var rejectAfterMessages: UInt64
    /// A session this old makes the client start a new handshake.
    public var rekeyAfterTime: Duration
    /// A session this old is used for nothing, in either direction.
    public var rejectAfterTime: Duration

    public init(
        rekeyAfterMessages: UInt64 = 1 << 60,
        rejectAfterMessages: UInt64 = .max - 1984 - 1,  // 2^64 - 1 - ReplayWindow.size
        rekeyAfterTime: Duration = .seconds(120),
        rejectAfterTime: Duration = .seconds(180)
    ) {
        self.rekeyAfterMessages = rekeyAfterMessages
        self.rejectAfterMessages = rejectAfterMessages
        self.rekeyAfterTime = rekeyAfterTime
        self.rejectAfterTime = rejectAfterTime
    }
}

/// Why an outgoing packet could not be sealed.
public enum SealFailure: Error, Equatable, Sendable {
    /// No session to seal with: no handshake has completed, or (at the server) the peer has not
    /// yet confirmed the newest one.
    case noSession
    /// The session reached its message or age limit; a new handshake is needed.
    case sessionExpired
    /// The buffer cannot hold headroom, packet and tailroom, or the packet exceeds a datagram.
    case badLength
    /// The packet is bigger than the client said its path carries (`mtu`, inner bytes).
    case tooBig(mtu: Int)
}

/// One direction pair of keys after a handshake, with the counter and replay window that keep
/// its nonces unique and its packets fresh.
///
/// Shared by the threads that send and receive on it, without a lock around the cryptography
/// (as wireguard-go's keypairs are): sending takes its counter with one atomic add, receiving
/// checks the replay window, opens the packet unlocked, and then records its counter under the
/// window's own lock, where a copy that raced it in is found out.
final class TransportSession: Sendable {
    /// The index this side chose: peers put it in the packets they send us.
    let localIndex: UInt32
    /// The index the other side chose: we put it in the packets we send.
    let remoteIndex: UInt32
    /// The two directions' keys, expanded for the session's cipher.
    private let sealer: AEADKey
    private let opener: AEADKey
    /// When the handshake completed, on this side's clock.
    let established: Instant
    private let nextCounter = Atomic<UInt64>(0)
    private let window = Mutex(ReplayWindow())

    /// The protocol version its data packets carry in their first byte (authenticated with them).
    let version: UInt8

    init(localIndex: UInt32, remoteIndex: UInt32, keys: TransportKeys, suite: CipherSuite = .chacha20Poly1305,
         version: UInt8 = Wire.version, established: Instant) {
        self.localIndex = localIndex
        self.remoteIndex = remoteIndex
        self.version = version
        sealer = AEADKey(suite, key: keys.send)
        opener = AEADKey(suite, key: keys.receive)
        self.established = established
    }

    /// The cipher its packets are sealed with.
    var suite: CipherSuite { sealer.suite }

    /// Its version and cipher, as status and logs give them.
    var spoken: SessionProtocol { SessionProtocol(version: version, cipher: suite) }

    /// Messages sealed so far.
    var sendCounter: UInt64 { nextCounter.load(ordering: .relaxed) }

    func isExpired(now: Instant, limits: SessionLimits) -> Bool {
        now - established >= limits.rejectAfterTime
    }

    func needsRekey(now: Instant, limits: SessionLimits) -> Bool {
        sendCounter >= limits.rekeyAfterMessages || now - established >= limits.rekeyAfterTime
    }

    /// Seals in place: `buffer` holds `DataPacket.headroom` spare bytes, `innerLength` bytes of
    /// inner packet, then `DataPacket.tailroom` spare bytes. Returns the datagram's length.
    func seal(
        _ buffer: UnsafeMutableRawBufferPointer, innerLength: Int, now: Instant, limits: SessionLimits
    ) throws(SealFailure) -> Int {
        guard innerLength >= 0, innerLength <= DataPacket.maxInnerLength,
              buffer.count >= innerLength + DataPacket.overhead
        else { throw .badLength }
        guard sendCounter < limits.rejectAfterMessages, !isExpired(now: now, limits: limits) else {
            throw .sessionExpired
        }
        // Each counter is taken once, whichever thread takes it, and never one past the limit:
        // the counter stops there rather than wrap into nonces used already.
        var counter = nextCounter.load(ordering: .relaxed)
        while true {
            guard counter < limits.rejectAfterMessages else { throw .sessionExpired }
            let (taken, seen) = nextCounter.compareExchange(expected: counter, desired: counter + 1, ordering: .relaxed)
            if taken { break }
            counter = seen
        }
        let header = UInt32(version) | UInt32(MessageType.data.rawValue) << 8  // version, type, 0, 0
        buffer.storeBytes(of: header.littleEndian, toByteOffset: 0, as: UInt32.self)
        buffer.storeBytes(of: remoteIndex.littleEndian, toByteOffset: DataPacket.receiverOffset, as: UInt32.self)
        buffer.storeBytes(of: counter.littleEndian, toByteOffset: DataPacket.counterOffset, as: UInt64.self)
        let end = DataPacket.headroom + innerLength
        sealer.seal(
            counter: counter,
            ad: UnsafeRawBufferPointer(rebasing: buffer[..<DataPacket.headroom]),
            text: UnsafeMutableRawBufferPointer(rebasing: buffer[DataPacket.headroom..<end]),
            tag: buffer.baseAddress! + end)
        return end + DataPacket.tailroom
    }

    /// Seals a whole message (a keepalive or control message) into a new datagram.
    func seal(message: [UInt8], now: Instant, limits: SessionLimits) throws(SealFailure) -> [UInt8] {
        var datagram = DataPacket.frame(message)
        let count = message.count
        _ = try datagram.withMutableBytes { (buffer) throws(SealFailure) in
            try seal(buffer, innerLength: count, now: now, limits: limits)
        }
        return datagram
    }

    /// What opening a data packet yields.
    struct Opened {
        /// Where the plaintext lies in the datagram.
        var range: Range<Int>
        /// The packet's counter: only a packet newer than the one that last moved the peer's
        /// endpoint may move it, so a late packet from an old address cannot undo a roam.
        var counter: UInt64
    }

    /// Opens a data packet in place, after the caller matched its receiver index to this session.
    /// Nothing changes unless the packet authenticates and is fresh.
    func open(
        _ datagram: UnsafeMutableRawBufferPointer, now: Instant, limits: SessionLimits
    ) -> Result<Opened, DropReason> {
        let counter = UnsafeRawBufferPointer(datagram).loadLittleEndian(UInt64.self, at: DataPacket.counterOffset)
        guard counter < limits.rejectAfterMessages, !isExpired(now: now, limits: limits) else {
            return .failure(.sessionExpired)
        }
        // Obvious replays skip the AEAD.
        guard window.withLock({ $0.check(counter) }) else { return .failure(.replayed) }
        let end = datagram.count - DataPacket.tailroom
        let authentic = opener.open(
            counter: counter,
            ad: UnsafeRawBufferPointer(rebasing: datagram[..<DataPacket.headroom]),
            text: UnsafeMutableRawBufferPointer(rebasing: datagram[DataPacket.headroom..<end]),
            tag: UnsafeRawPointer(datagram.baseAddress! + end))
        guard authentic else { return .failure(.decryptFailed) }
        // Checked again where it is recorded: a copy opened on another thread meanwhile loses.
        guard window.withLock({ $0.accept(counter) }) else { return .failure(.replayed) }
        return .success(Opened(range: DataPacket.headroom..<end, counter: counter))
    }
}
