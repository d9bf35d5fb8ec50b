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

    /// Unsent bytes the socket may hold before it stops being writable.
    static let unsentLimit: Int32 = 128 * 1024

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

    /// A whole message is waiting, or libssl holds bytes a poll would not show.
    var hasBuffered: Bool { closed == nil && (reader.hasMessage || channel.hasPending) }

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
            case .wantRead:
                readWantsWrite = false
                return nil
            case .wantWrite:
                readWantsWrite = true
                return nil
            case .closed(let why): closed = why
            }
        }
        return nil
    }

    // MARK: Sending

    /// Sends `messages` as frames, in one write; returns how many went (all or none, and none
    /// when the socket still holds earlier bytes or its unsent queue is full).
    func send(_ messages: [UnsafeRawBufferPointer]) -> Int {
        guard closed == nil, flushTail(), isWritable else { return 0 }
        let total = messages.reduce(0) { $0 + StreamFraming.lengthBytes + $1.count }
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
                return messages.count
            case .closed(let why):
                closed = why
                return 0
            }
        }
        return messages.count
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

    /// The socket takes more now: its unsent bytes are below `unsentLimit`.
    private var isWritable: Bool {
        var entry = pollfd(fd: fileDescriptor, events: Int16(POLLOUT), revents: 0)
        return poll(&entry, 1, 0) == 1 && entry.revents & Int16(POLLOUT) != 0
    }
}

extension FrameReader {
    /// Whether a whole message is waiting.
    var hasMessage: Bool { peekLength != nil }
}
