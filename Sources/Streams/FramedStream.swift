import CShims
import Glibc
import Device

/// Protocol messages over an open TLS session, both ways, for either side; used under its
/// owner's lock, one call at a time.
///
/// Sending never waits and never queues more than the socket's own small queue: a stream that
/// cannot take a batch now drops it, as a congested link drops datagrams, so no inner packet
/// waits seconds behind a lost segment and the inner TCP sees loss, not delay (TCP in TCP
/// otherwise collapses: both loops retransmit into one queue). The socket's unsent bytes are
/// kept low (`TCP_NOTSENT_LOWAT`), so what is queued is what the path is about to carry.
final class FramedStream: @unchecked Sendable {  // called only under its owner's lock, one call at a time
    let channel: TLSChannel
    private var reader = FrameReader()
    /// Bytes of frames accepted by a write that the socket has not taken yet: they go first, and
    /// until they have, new messages are dropped (a frame is never cut).
    private var tail: [UInt8] = []
    /// Where a batch's frames are laid out for one write.
    private var scratch: [UInt8] = []
    /// Why the stream is over, once it is.
    private(set) var closed: String?
    /// The last read needs the socket writable first (TLS 1.3 answers a key update while
    /// reading): poll for writing, not reading, or the unread input keeps waking the poll.
    private(set) var readWantsWrite = false

    /// Unsent bytes past which the socket takes no more and a poll does not call it writable (a
    /// tail's flush waits for that): `queueCeiling`, so that `room` alone decides what is queued.
    /// (TCP_NOTSENT_LOWAT bounds writes too, not only polls: at 128 KB it held the queue under a
    /// millisecond at gigabit rates, and the inner TCP lost about 4 % of its segments.)
    static let unsentLimit = Int32(queueCeiling)
    /// How long (ms) what the socket holds unsent may take to leave, at the rate the path delivers:
    /// the queue a good router keeps. More is dropped, as such a router drops it.
    static let queueMilliseconds = 20
    /// The queue allowed whatever the rate (before the kernel knows it, or on a slow path), and
    /// the most on a fast one.
    static let queueFloor = 128 * 1024
    static let queueCeiling = 8 << 20

    init(_ channel: TLSChannel) {
        self.channel = channel
        let fd = channel.connection.fileDescriptor
        var one: Int32 = 1
        var limit = Self.unsentLimit
        let size = socklen_t(MemoryLayout<Int32>.size)
        _ = setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, size)
        _ = setsockopt(fd, Int32(IPPROTO_TCP), TCP_NOTSENT_LOWAT, &limit, size)
    }

    var fileDescriptor: Int32 { channel.connection.fileDescriptor }

    /// The last read wanted more from the socket: what libssl holds is part of a record, which
    /// waits for the poll (calling again would spin).
    private var readBlocked = false

    /// A whole message is waiting, or libssl holds bytes a poll would not show (records read
    /// ahead since the last read that gave data).
    var hasBuffered: Bool { closed == nil && (reader.hasMessage || (!readBlocked && channel.hasPending)) }

    // MARK: Receiving

    /// The next message that has arrived, read from the socket as needed, valid until the next
    /// call; nil when none has arrived whole (or the stream closed: see `closed`).
    func next() -> UnsafeMutableRawBufferPointer? {
        while closed == nil {
            if let message = reader.next() { return message }
            switch channel.read(into: reader.space()) {
            case .done(let n):
                reader.received(n)
                readWantsWrite = false
                readBlocked = false
            case .wantRead:
                readWantsWrite = false
                readBlocked = true
                return nil
            case .wantWrite:
                readWantsWrite = true
                readBlocked = true
                return nil
            case .closed(let why): closed = why
            }
        }
        return nil
    }

    /// What has arrived, copied into `buffer` as a UDP socket's GRO joins datagrams: the next
    /// message, then those already read that have its length, the last of them maybe shorter,
    /// while they fit; the run's length and the length of its messages but the last. Nil when no
    /// message has arrived whole (or the stream closed: see `closed`). One call per run keeps the
    /// lock the sending side shares to one hold per run, not per message.
    func nextRun(into buffer: UnsafeMutableRawBufferPointer) -> (length: Int, segment: Int)? {
        guard let first = next() else { return nil }
        let segment = min(first.count, buffer.count)
        buffer.baseAddress!.copyMemory(from: first.baseAddress!, byteCount: segment)
        var length = segment
        while segment > 0, length + segment <= buffer.count, let size = reader.peekLength, size > 0, size <= segment,
              let message = reader.next() {
            (buffer.baseAddress! + length).copyMemory(from: message.baseAddress!, byteCount: message.count)
            length += message.count
            if message.count < segment { break }
        }
        return (length, segment)
    }

    // MARK: Sending

    /// Sends as many of `messages` as the queue has room for (`room`), in order and in one
    /// write; returns how many went (the rest are dropped; none while earlier bytes wait).
    func send(_ messages: [UnsafeRawBufferPointer]) -> Int {
        guard closed == nil, flushTail() else { return 0 }
        var space = room
        var count = 0
        var total = 0
        for message in messages {
            let framed = StreamFraming.lengthBytes + message.count
            guard framed <= space else { break }
            space -= framed
            total += framed
            count += 1
        }
        guard count > 0 else { return 0 }
        let messages = messages.prefix(count)
        if scratch.count < total { scratch = [UInt8](repeating: 0, count: total) }
        scratch.withUnsafeMutableBytes { out in
            var offset = 0
            for message in messages { offset = StreamFraming.write(message, into: out, at: offset) }
        }
        var written = 0
        while written < total, closed == nil {
            // libssl returns after each record it wrote (partial writes).
            switch scratch.withUnsafeBytes({ channel.write(UnsafeRawBufferPointer(rebasing: $0[written..<total])) }) {
            case .done(let n): written += n
            case .wantRead, .wantWrite:
                tail = Array(scratch[written..<total])
                return count
            case .closed(let why):
                closed = why
                return 0
            }
        }
        return count
    }

    /// Offers what is left of the last write again; true when nothing is left.
    @discardableResult
    func flushTail() -> Bool {
        guard !tail.isEmpty, closed == nil else { return closed == nil }
        while !tail.isEmpty, closed == nil {
            switch tail.withUnsafeBytes({ channel.write($0) }) {
            case .done(let n): tail.removeFirst(n)
            case .wantRead, .wantWrite: return false
            case .closed(let why): closed = why
            }
        }
        return tail.isEmpty && closed == nil
    }

    /// Whether the socket must become writable before the stream can go on: bytes of frames are
    /// waiting for it (`flushTail`), or a read is.
    var wantsWrite: Bool { !tail.isEmpty || readWantsWrite }

    /// Bytes of frames the socket may take now: what the path delivers in `queueMilliseconds` (within
    /// the floor and the ceiling), less what it holds unsent already.
    private var room: Int {
        var unsent: UInt64 = 0
        var rate: UInt64 = 0
        guard CShims_tcp_sending(fileDescriptor, &unsent, &rate) == 0 else { return Self.queueFloor }
        let timely = Int(clamping: rate) / 1000 * Self.queueMilliseconds
        return min(max(Self.queueFloor, timely), Self.queueCeiling) - Int(clamping: unsent)
    }
}

extension FrameReader {
    /// Whether a whole message is waiting.
    var hasMessage: Bool { peekLength != nil }
}
