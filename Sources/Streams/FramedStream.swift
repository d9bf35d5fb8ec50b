import CShims
import Glibc
import Synchronization
import Device

/// Protocol messages over a TLS 1.3 session whose handshake libssl did, both ways, for either
/// side. Each direction has its own record protection (`TLSRecords`) and lock: a data thread
/// sends while the reading thread reads, neither waiting for the other.
///
/// Sending never waits and never queues more than the socket's own small queue: a stream that
/// cannot take a batch now drops it, as a congested link drops datagrams, so no inner packet
/// waits seconds behind a lost segment and the inner TCP sees loss, not delay (TCP in TCP
/// otherwise collapses: both loops retransmit into one queue). The socket's unsent bytes are
/// kept low (`TCP_NOTSENT_LOWAT`), so what is queued is what the path is about to carry.
final class FramedStream: Sendable {
    let connection: TCPConnection
    /// The TLS suite the handshake chose (`TLS_AES_128_GCM_SHA256`).
    let suite: String
    private let outbound: Mutex<Outbound>
    private let inbound: Mutex<Inbound>
    /// Why the stream is over, once either direction found it over.
    private let failure = Mutex<String?>(nil)
    private let isClosed = Atomic<Bool>(false)
    /// Sealed bytes wait for the socket (`flushTail`); set under the sending direction's lock.
    private let tailWaiting = Atomic<Bool>(false)

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

    /// The stream on `channel`'s connection, once its handshake is done: the record layer takes
    /// over from libssl with the session's traffic secrets. `keyUpdateAfter`: records sealed
    /// under one key before the next.
    init(_ channel: TLSChannel, keyUpdateAfter: UInt64 = Record.keyUpdateAfter) throws(StreamError) {
        let keys = try channel.recordProtection()
        connection = channel.connection
        suite = keys.suite
        let fd = channel.connection.fileDescriptor
        outbound = Mutex(Outbound(fd: fd, protection: keys.sending, keyUpdateAfter: keyUpdateAfter))
        inbound = Mutex(Inbound(fd: fd, protection: keys.receiving, takesTickets: !channel.accepting))
        var one: Int32 = 1
        var limit = Self.unsentLimit
        let size = socklen_t(MemoryLayout<Int32>.size)
        _ = setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, size)
        _ = setsockopt(fd, Int32(IPPROTO_TCP), TCP_NOTSENT_LOWAT, &limit, size)
    }

    var fileDescriptor: Int32 { connection.fileDescriptor }

    /// Why the stream is over; nil while it works.
    var closed: String? { isClosed.load(ordering: .acquiring) ? failure.withLock { $0 } : nil }

    private func fail(_ why: String) {
        failure.withLock { if $0 == nil { $0 = why } }
        isClosed.store(true, ordering: .releasing)
    }

    /// A whole message or record is waiting that a poll of the socket would not show.
    var hasBuffered: Bool { !isClosed.load(ordering: .relaxed) && inbound.withLock { $0.hasBuffered } }

    // MARK: Receiving

    /// What has arrived, copied into `buffer` as a UDP socket's GRO joins datagrams: the next
    /// message, then those already read that have its length, the last of them maybe shorter,
    /// while they fit; the run's length and the length of its messages but the last. Nil when no
    /// message has arrived whole (or the stream closed: see `closed`).
    func nextRun(into buffer: UnsafeMutableRawBufferPointer) -> (length: Int, segment: Int)? {
        guard !isClosed.load(ordering: .relaxed) else { return nil }
        let (run, why, wantsUpdate) = inbound.withLock { inbound in
            let run = inbound.nextRun(into: buffer)
            defer { inbound.updateAsked = false }
            return (run, inbound.failed, inbound.updateAsked)
        }
        // Owed until a send seals it (RFC 8446 4.6.3).
        if wantsUpdate { outbound.withLock { $0.updateOwed = true } }
        if let why { fail(why) }
        return run
    }

    // MARK: Sending

    /// Sends as many of `messages` as the queue has room for (`room`), in order and in one
    /// write; returns how many went (the rest are dropped; none while earlier bytes wait).
    func send(_ messages: [UnsafeRawBufferPointer]) -> Int {
        guard !isClosed.load(ordering: .relaxed) else { return 0 }
        let (sent, why) = outbound.withLock { outbound in
            let sent = outbound.send(messages)
            tailWaiting.store(!outbound.tail.isEmpty, ordering: .relaxed)
            return (sent, outbound.failed)
        }
        if let why { fail(why) }
        return sent
    }

    /// Offers what is left of the last write again; true when nothing is left.
    @discardableResult
    func flushTail() -> Bool {
        guard tailWaiting.load(ordering: .relaxed) else { return !isClosed.load(ordering: .relaxed) }
        let (empty, why) = outbound.withLock { outbound in
            let empty = outbound.flushTail()
            tailWaiting.store(!outbound.tail.isEmpty, ordering: .relaxed)
            return (empty, outbound.failed)
        }
        if let why { fail(why) }
        return empty && why == nil
    }

    /// Whether the socket must become writable before the stream can go on: sealed bytes are
    /// waiting for it (`flushTail`).
    var wantsWrite: Bool { tailWaiting.load(ordering: .relaxed) }
}

/// The sending direction: messages framed into records, sealed, written; what the socket did
/// not take kept whole for the next write. Used under its stream's lock.
private final class Outbound: @unchecked Sendable {  // only ever used inside its stream's Mutex
    let fd: Int32
    let protection: RecordProtection
    /// Sealed bytes the socket has not taken yet, from `tailStart`: they go first, and until they
    /// have, new messages are dropped (a record is never cut).
    var tail: [UInt8] = []
    private var tailStart = 0
    /// Where a batch's records are laid out and sealed for one write.
    private var scratch = UnsafeMutableRawBufferPointer(start: nil, count: 0)
    private(set) var failed: String?
    /// The other side asked for a key update: the next send seals one.
    var updateOwed = false

    /// A KeyUpdate that asks for none back (RFC 8446 4.6.3).
    private static let keyUpdate: [UInt8] = [Record.keyUpdate, 0, 0, 1, 0]

    /// Records sealed under one key before the next.
    let keyUpdateAfter: UInt64

    init(fd: Int32, protection: RecordProtection, keyUpdateAfter: UInt64) {
        self.fd = fd
        self.protection = protection
        self.keyUpdateAfter = keyUpdateAfter
    }

    deinit { scratch.deallocate() }

    func send(_ messages: [UnsafeRawBufferPointer]) -> Int {
        guard failed == nil, flushTail() else { return 0 }
        var space = room
        var count = 0
        var content = 0
        for message in messages {
            let framed = StreamFraming.lengthBytes + message.count
            guard message.count <= StreamFraming.maxMessage, framed <= space else { break }
            space -= framed
            content += framed
            count += 1
        }
        let update = updateOwed || protection.sequence >= keyUpdateAfter
        guard count > 0 || update else { return 0 }
        let records = (content + Record.maxContent - 1) / Record.maxContent
        let total = content + records * Record.wireLength(content: 0) + (update ? Record.wireLength(content: Self.keyUpdate.count) : 0)
        if scratch.count < total {
            scratch.deallocate()
            scratch = .allocate(byteCount: max(total, 2 * scratch.count), alignment: 16)
        }
        var layout = RecordLayout(out: UnsafeMutableRawBufferPointer(rebasing: scratch[..<total]), protection: protection)
        if update {
            // The KeyUpdate under the old key; the records after it under the new one.
            Self.keyUpdate.withUnsafeBytes { layout.append($0) }
            guard layout.close(type: Record.handshake) else { return fail("TLS: cannot seal a record") }
            do throws(StreamError) { try protection.update() } catch { return fail(error.description) }
            updateOwed = false
        }
        var length = [UInt8](repeating: 0, count: StreamFraming.lengthBytes)
        for message in messages.prefix(count) {
            length[0] = UInt8(truncatingIfNeeded: message.count >> 8)
            length[1] = UInt8(truncatingIfNeeded: message.count)
            length.withUnsafeBytes { layout.append($0) }
            layout.append(message)
        }
        guard layout.close(type: Record.applicationData) else { return fail("TLS: cannot seal a record") }
        precondition(layout.offset == total, "records laid out as counted")
        var written = 0
        while written < layout.offset, failed == nil {
            let n = Glibc.send(fd, scratch.baseAddress! + written, layout.offset - written, Int32(MSG_NOSIGNAL))
            if n > 0 {
                written += n
            } else if n < 0, errno == EINTR {
                continue
            } else if n < 0, errno == EAGAIN || errno == EWOULDBLOCK {
                tail = Array(UnsafeRawBufferPointer(rebasing: scratch[written..<layout.offset]))
                tailStart = 0
                return count
            } else {
                return fail(n == 0 ? "TLS write: the connection was closed" : "TLS write: \(String(cString: strerror(errno)))")
            }
        }
        return failed == nil ? count : 0
    }

    private func fail(_ why: String) -> Int {
        if failed == nil { failed = why }
        return 0
    }

    /// Offers what is left of the last write again; true when nothing is left.
    @discardableResult
    func flushTail() -> Bool {
        while tailStart < tail.count, failed == nil {
            let n = tail.withUnsafeBytes { Glibc.send(fd, $0.baseAddress! + tailStart, $0.count - tailStart, Int32(MSG_NOSIGNAL)) }
            if n > 0 {
                tailStart += n
            } else if n < 0, errno == EINTR {
                continue
            } else if n < 0, errno == EAGAIN || errno == EWOULDBLOCK {
                return false
            } else {
                _ = fail(n == 0 ? "TLS write: the connection was closed" : "TLS write: \(String(cString: strerror(errno)))")
            }
        }
        if tailStart >= tail.count {
            tail = []
            tailStart = 0
        }
        return failed == nil && tail.isEmpty
    }

    /// Bytes of frames the socket may take now: what the path delivers in `queueMilliseconds` (within
    /// the floor and the ceiling), less what it holds unsent already.
    private var room: Int {
        var unsent: UInt64 = 0
        var rate: UInt64 = 0
        guard CShims_tcp_sending(fd, &unsent, &rate) == 0 else { return FramedStream.queueFloor }
        let timely = Int(clamping: rate) / 1000 * FramedStream.queueMilliseconds
        return min(max(FramedStream.queueFloor, timely), FramedStream.queueCeiling) - Int(clamping: unsent)
    }
}

/// Lays content out into records at `out`, each of at most `Record.maxContent` bytes, sealing
/// each as it fills (and the last at `close`).
private struct RecordLayout {
    /// Where the records go; what is written past its end stops the process (`precondition`),
    /// never another allocation.
    let buffer: UnsafeMutableRawBufferPointer
    private var out: UnsafeMutableRawPointer { buffer.baseAddress! }
    let protection: RecordProtection
    /// Where the next byte goes.
    private(set) var offset = 0
    /// The open record's start and content so far; nil when none is open.
    private var record: Int?
    private var filled = 0
    private var sealed = true

    init(out: UnsafeMutableRawBufferPointer, protection: RecordProtection) {
        buffer = out
        self.protection = protection
    }

    mutating func append(_ bytes: UnsafeRawBufferPointer) {
        var from = 0
        while from < bytes.count {
            if record == nil {
                record = offset
                offset += Record.headerLength
                filled = 0
            }
            let take = min(bytes.count - from, Record.maxContent - filled)
            precondition(offset + take + 1 + Record.tagLength <= buffer.count, "a record past its buffer")
            (out + offset).copyMemory(from: bytes.baseAddress! + from, byteCount: take)
            offset += take
            filled += take
            from += take
            if filled == Record.maxContent { sealed = close(type: Record.applicationData) && sealed }
        }
    }

    /// Seals the open record, its content of `type`; false when sealing failed (now or before).
    mutating func close(type: UInt8) -> Bool {
        guard let start = record else { return sealed }
        record = nil
        let header = out + start
        let length = filled + 1 + Record.tagLength
        header.storeBytes(of: Record.applicationData, as: UInt8.self)
        (header + 1).storeBytes(of: 3, as: UInt8.self)
        (header + 2).storeBytes(of: 3, as: UInt8.self)
        (header + 3).storeBytes(of: UInt8(length >> 8), as: UInt8.self)
        (header + 4).storeBytes(of: UInt8(truncatingIfNeeded: length), as: UInt8.self)
        (out + offset).storeBytes(of: type, as: UInt8.self)
        offset += 1 + Record.tagLength
        sealed = protection.seal(record: header, length: filled + 1) && sealed
        return sealed
    }
}

/// The receiving direction: bytes read as they come, many records a read, each opened into the
/// frame reader, alerts and post-handshake messages acted on. Used under its stream's lock.
private final class Inbound: @unchecked Sendable {  // only ever used inside its stream's Mutex
    let fd: Int32
    let protection: RecordProtection
    private var reader = FrameReader()
    /// Bytes read and not yet opened: `start..<end`. Made on the first read.
    private var wire = UnsafeMutableRawBufferPointer(start: nil, count: 0)
    private var start = 0
    private var end = 0
    private(set) var failed: String?
    /// The other side asked for a key update in return.
    var updateAsked = false
    /// The client's side: a server may send session tickets, which are ignored; a client may not.
    private let takesTickets: Bool
    /// Records in a row that carried no application data (a peer's empty records, tickets and key
    /// updates cost work and give nothing): past `emptyLimit`, the stream fails, as libssl's does.
    private var empty = 0
    static let emptyLimit = 32
    /// Records opened since the other side's last key update (none yet: no bound).
    private var sinceUpdate = Int.max
    /// Records the other side must send between two key updates of its own: a legitimate peer
    /// updates once in millions of records, and each update costs three key derivations here.
    static let recordsBetweenUpdates = 4_096

    /// Two records: what one read takes at most.
    static let capacity = 2 * (Record.headerLength + Record.maxEncrypted)

    init(fd: Int32, protection: RecordProtection, takesTickets: Bool) {
        self.fd = fd
        self.protection = protection
        self.takesTickets = takesTickets
    }

    deinit { wire.deallocate() }

    var hasBuffered: Bool { failed == nil && (reader.hasMessage || wholeRecord != nil) }

    /// The length of the encrypted_record of the whole record at `start`; nil until it is in.
    private var wholeRecord: Int? {
        guard end - start >= Record.headerLength else { return nil }
        let length = Int(wire[start + 3]) << 8 | Int(wire[start + 4])
        return end - start >= Record.headerLength + length ? length : nil
    }

    /// The length the header at `start` gives is longer than any record may be.
    private var overlong: Bool {
        end - start >= Record.headerLength && Int(wire[start + 3]) << 8 | Int(wire[start + 4]) > Record.maxEncrypted
    }

    /// The next message that has arrived, opened and read as needed (one read at most: a peer
    /// whose records give nothing cannot hold the reading thread), valid until the next call;
    /// nil when none has arrived whole (or the stream failed: see `failed`).
    func next() -> UnsafeMutableRawBufferPointer? {
        var didRead = false
        while failed == nil {
            if let message = reader.next() { return message }
            if let length = wholeRecord {
                open(length)
                continue
            }
            if overlong {
                failed = "TLS: a record longer than \(Record.maxEncrypted) bytes"
                return nil
            }
            guard !didRead, read() else { return nil }
            didRead = true
        }
        return nil
    }

    /// See `FramedStream.nextRun`.
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

    /// Reads what the socket holds; false when nothing came (or the stream failed).
    private func read() -> Bool {
        if wire.baseAddress == nil { wire = .allocate(byteCount: Self.capacity, alignment: 16) }
        if start > 0, Self.capacity - end < Record.headerLength + Record.maxEncrypted {
            if end > start { wire.baseAddress!.copyMemory(from: wire.baseAddress! + start, byteCount: end - start) }
            end -= start
            start = 0
        }
        while true {
            let n = Glibc.read(fd, wire.baseAddress! + end, Self.capacity - end)
            if n > 0 {
                end += n
                return true
            }
            if n < 0, errno == EINTR { continue }
            if n < 0, errno == EAGAIN || errno == EWOULDBLOCK { return false }
            failed = n == 0 ? "TLS read: the connection was closed" : "TLS read: \(String(cString: strerror(errno)))"
            return false
        }
    }

    /// Opens the whole record at `start` (`length` bytes after its header) and acts on it.
    private func open(_ length: Int) {
        let record = wire.baseAddress! + start
        start += Record.headerLength + length
        if start == end { (start, end) = (0, 0) }
        guard record.load(as: UInt8.self) == Record.applicationData else {
            failed = "TLS: a record of type \(record.load(as: UInt8.self)) after the handshake"
            return
        }
        guard length > Record.tagLength, length <= Record.maxEncrypted else {
            failed = "TLS: a record of \(length) bytes"
            return
        }
        let space = reader.space()
        guard space.count >= length - Record.tagLength else {
            failed = "TLS: no room for a record"
            return
        }
        guard protection.open(record: record, length: length, into: space.baseAddress!) else {
            failed = "TLS: a record failed authentication"
            return
        }
        // The content type is the last byte that is not padding.
        var inner = length - Record.tagLength
        while inner > 0, space[inner - 1] == 0 { inner -= 1 }
        guard inner > 0, inner - 1 <= Record.maxContent else {
            failed = "TLS: a record with no content type"
            return
        }
        let content = UnsafeRawBufferPointer(rebasing: space[..<(inner - 1)])
        sinceUpdate = sinceUpdate == Int.max ? sinceUpdate : sinceUpdate + 1
        empty = content.isEmpty || space[inner - 1] != Record.applicationData ? empty + 1 : 0
        guard empty <= Self.emptyLimit else {
            failed = "TLS: \(empty) records in a row with no data"
            return
        }
        switch space[inner - 1] {
        case Record.applicationData:
            reader.received(content.count)
        case Record.alert:
            let closing = content.count == 2 && content[1] == 0
            failed = closing ? "the other side closed the stream" : "TLS alert \(content.count == 2 ? content[1] : 0) from the other side"
        case Record.handshake where content.isEmpty:
            failed = "TLS: an empty handshake record"
        case Record.handshake:
            handshakeMessages(content)
        case let type:
            failed = "TLS: a record of content type \(type)"
        }
    }

    /// Messages of the handshake protocol after the handshake: a key update (the next records
    /// come under the next key; answered when asked), session tickets (not used: ignored).
    private func handshakeMessages(_ bytes: UnsafeRawBufferPointer) {
        var at = 0
        while at < bytes.count, failed == nil {
            guard bytes.count - at >= 4 else {
                failed = "TLS: a handshake message split across records"
                return
            }
            let type = bytes[at]
            let length = Int(bytes[at + 1]) << 16 | Int(bytes[at + 2]) << 8 | Int(bytes[at + 3])
            guard bytes.count - at - 4 >= length else {
                failed = "TLS: a handshake message split across records"
                return
            }
            switch type {
            case Record.keyUpdate:
                guard length == 1, bytes[at + 4] <= 1 else {
                    failed = "TLS: a malformed key update"
                    return
                }
                // The next key starts with the next record: nothing may follow in this one.
                guard at + 5 == bytes.count else {
                    failed = "TLS: a key update before the end of its record"
                    return
                }
                guard sinceUpdate >= Self.recordsBetweenUpdates else {
                    failed = "TLS: key updates \(sinceUpdate) records apart"
                    return
                }
                sinceUpdate = 0
                if bytes[at + 4] == 1 { updateAsked = true }
                do throws(StreamError) { try protection.update() } catch { failed = error.description }
            case Record.newSessionTicket where takesTickets:
                break
            default:
                failed = "TLS: handshake message \(type) after the handshake"
            }
            at += 4 + length
        }
    }
}

extension FrameReader {
    /// Whether a whole message is waiting.
    var hasMessage: Bool { peekLength != nil }
}
