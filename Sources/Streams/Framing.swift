/// The stream transport's framing: on the byte stream inside TLS, each protocol message (any of
/// both versions' messages, exactly as UDP carries it in one datagram) follows its length, two
/// bytes big-endian, as DNS over TCP (RFC 1035 4.2.2) and IKE over TCP (RFC 8229) frame theirs.
public enum StreamFraming {
    /// Bytes of the length before each message.
    public static let lengthBytes = 2
    /// The longest message a frame carries.
    public static let maxMessage = 65_535

    /// Writes the frame of `message` (its length, then the message) into `out` at `offset`;
    /// returns the offset after it. `out` must have room for `message.count + lengthBytes`.
    @inline(__always)
    public static func write(_ message: UnsafeRawBufferPointer, into out: UnsafeMutableRawBufferPointer, at offset: Int) -> Int {
        precondition(message.count <= maxMessage && offset + lengthBytes + message.count <= out.count)
        out[offset] = UInt8(truncatingIfNeeded: message.count >> 8)
        out[offset + 1] = UInt8(truncatingIfNeeded: message.count)
        if let base = message.baseAddress, message.count > 0 {
            (out.baseAddress! + offset + lengthBytes).copyMemory(from: base, byteCount: message.count)
        }
        return offset + lengthBytes + message.count
    }
}

/// Cuts the bytes a stream delivers into messages. A whole frame always fits beside a read's worth
/// of bytes, so `space` is never empty while `next` has nothing to give; nothing is allocated
/// after it is made. A frame of length 0 carries nothing and is skipped.
public struct FrameReader: ~Copyable {
    /// Room for one TLS record's plaintext (its content, type and padding), which `space` always has.
    public static let recordRoom = 16_384 + 256
    /// A frame's worth and four TLS records: a read never waits for room.
    public static let capacity = StreamFraming.lengthBytes + StreamFraming.maxMessage + 4 * 16_384
    /// Made on the first read: a gateway holds many streams that may never send a byte.
    private var storage = UnsafeMutableRawBufferPointer(start: nil, count: 0)
    /// The bytes received and not yet taken: `start..<end`.
    private var start = 0
    private var end = 0

    public init() {}

    deinit { storage.deallocate() }

    /// Bytes held that no message has taken yet.
    public var buffered: Int { end - start }

    /// Where the next read goes; at least `recordRoom` bytes whenever `next` returned nil.
    public mutating func space() -> UnsafeMutableRawBufferPointer {
        if storage.baseAddress == nil { storage = .allocate(byteCount: Self.capacity, alignment: 16) }
        if Self.capacity - end < Self.recordRoom, start > 0 {
            // Move what is left of a frame to the front.
            if end > start { storage.baseAddress!.copyMemory(from: storage.baseAddress! + start, byteCount: end - start) }
            end -= start
            start = 0
        }
        return UnsafeMutableRawBufferPointer(rebasing: storage[end...])
    }

    /// `count` bytes were read into `space()`.
    public mutating func received(_ count: Int) {
        precondition(count >= 0 && end + count <= Self.capacity)
        end += count
    }

    /// The length of the next message once it has arrived whole.
    var peekLength: Int? {
        guard end - start >= StreamFraming.lengthBytes else { return nil }
        let length = Int(storage[start]) << 8 | Int(storage[start + 1])
        return end - start >= StreamFraming.lengthBytes + length ? length : nil
    }

    /// The next whole message, valid until the next call on the reader; nil until one has
    /// arrived whole.
    public mutating func next() -> UnsafeMutableRawBufferPointer? {
        while end - start >= StreamFraming.lengthBytes {
            let length = Int(storage[start]) << 8 | Int(storage[start + 1])
            guard end - start >= StreamFraming.lengthBytes + length else { return nil }
            let first = start + StreamFraming.lengthBytes
            start = first + length
            if start == end { (start, end) = (0, 0) }
            guard length > 0 else { continue }
            return UnsafeMutableRawBufferPointer(rebasing: storage[first..<(first + length)])
        }
        return nil
    }
}
