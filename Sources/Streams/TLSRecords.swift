import CBoring
import Glibc

/// TLS 1.3's record layer (RFC 8446 5), for the stream transport once libssl has done the
/// handshake: as the kernel's TLS offload takes a session over from a library, each direction
/// then runs on the thread that uses it, with its own keys, sequence and lock, where libssl
/// would serialise both directions on one lock (a read may write in libssl, so one `SSL` is
/// never used by two threads).
///
/// What goes on the wire is what libssl would send: application_data records of at most
/// 2^14 bytes, each sealed with the suite's AEAD under a nonce from the record's sequence
/// number; a key update (RFC 8446 4.6.3) is sent long before a key nears its limit, and
/// answered when the other side asks for one.
enum RecordSuite: Equatable, Sendable {
    case aes128GCM, aes256GCM, chacha20Poly1305

    /// The suite libssl names `name` (`SSL_CIPHER_get_name`); nil for one the layer does not have.
    init?(name: String) {
        switch name {
        case "TLS_AES_128_GCM_SHA256": self = .aes128GCM
        case "TLS_AES_256_GCM_SHA384": self = .aes256GCM
        case "TLS_CHACHA20_POLY1305_SHA256": self = .chacha20Poly1305
        default: return nil
        }
    }

    var aead: Int32 {
        switch self {
        case .aes128GCM: Int32(ROAM_AEAD_AES_128_GCM.rawValue)
        case .aes256GCM: Int32(ROAM_AEAD_AES_256_GCM.rawValue)
        case .chacha20Poly1305: Int32(ROAM_AEAD_CHACHA20_POLY1305.rawValue)
        }
    }

    var keyLength: Int { self == .aes128GCM ? 16 : 32 }
    var hash: Int32 { Int32(self == .aes256GCM ? ROAM_HASH_SHA384.rawValue : ROAM_HASH_SHA256.rawValue) }
    var hashLength: Int { self == .aes256GCM ? 48 : 32 }
}

/// The record layer's sizes and types (RFC 8446 5.1, 5.2).
enum Record {
    static let headerLength = 5
    static let tagLength = 16
    /// The most content one record carries.
    static let maxContent = 16_384
    /// The longest encrypted_record a peer may send: content, type, padding and tag.
    static let maxEncrypted = maxContent + 256
    /// What one record of `content` bytes takes on the wire.
    static func wireLength(content: Int) -> Int { headerLength + content + 1 + tagLength }

    static let applicationData: UInt8 = 23
    static let alert: UInt8 = 21
    static let handshake: UInt8 = 22
    static let keyUpdate: UInt8 = 24
    static let newSessionTicket: UInt8 = 4

    /// Records sealed under one key before a key update: well under AES-GCM's limit of 2^24.5
    /// full records (RFC 8446 5.5).
    static let keyUpdateAfter: UInt64 = 1 << 23
}

/// One direction's protection: the traffic secret, the key and IV derived from it, and the
/// sequence number of the next record. The one owner of its memory, which it wipes.
final class RecordProtection {
    let suite: RecordSuite
    /// The AEAD context, then the secret (64 bytes), then the IV (12).
    private let memory: UnsafeMutableRawPointer
    private static let secretOffset = Int(ROAM_AEAD_SIZE)
    private static let ivOffset = secretOffset + 64
    private static let size = ivOffset + 12
    private var ready = false
    /// The next record's sequence number.
    private(set) var sequence: UInt64 = 0

    /// Protection under `secret` (the suite's hash long), or the reason there can be none.
    init(_ suite: RecordSuite, secret: UnsafeRawBufferPointer) throws(StreamError) {
        self.suite = suite
        memory = .allocate(byteCount: Self.size, alignment: 64)
        memset(memory, 0, Self.size)
        guard secret.count == suite.hashLength else { throw StreamError("TLS: a traffic secret of \(secret.count) bytes") }
        (memory + Self.secretOffset).copyMemory(from: secret.baseAddress!, byteCount: secret.count)
        try install()
    }

    deinit {
        if ready { roam_aead_cleanup(memory) }
        memset(memory, 0, Self.size)
        memory.deallocate()
    }

    /// The next generation of the secret (RFC 8446 7.2), its key and IV; the sequence starts over.
    func update() throws(StreamError) {
        let secret = memory + Self.secretOffset
        var next = [UInt8](repeating: 0, count: suite.hashLength)
        defer { memset(&next, 0, next.count) }
        guard Self.expandLabel(suite, secret: UnsafeRawPointer(secret), "traffic upd", into: &next) else {
            throw StreamError("TLS: cannot derive the next traffic secret")
        }
        secret.copyMemory(from: next, byteCount: next.count)
        if ready { roam_aead_cleanup(memory) }
        ready = false
        try install()
        sequence = 0
    }

    /// The key and IV from the secret (RFC 8446 7.3).
    private func install() throws(StreamError) {
        var key = [UInt8](repeating: 0, count: suite.keyLength)
        defer { memset(&key, 0, key.count) }
        var iv = [UInt8](repeating: 0, count: 12)
        let secret = UnsafeRawPointer(memory + Self.secretOffset)
        guard Self.expandLabel(suite, secret: secret, "key", into: &key), Self.expandLabel(suite, secret: secret, "iv", into: &iv),
              roam_aead_init(memory, suite.aead, key) == 1
        else { throw StreamError("TLS: cannot set up the record keys") }
        (memory + Self.ivOffset).copyMemory(from: iv, byteCount: 12)
        ready = true
    }

    /// HKDF-Expand-Label(secret, label, "", out.count) (RFC 8446 7.1).
    static func expandLabel(_ suite: RecordSuite, secret: UnsafeRawPointer, _ label: String, into out: inout [UInt8]) -> Bool {
        let full = Array("tls13 \(label)".utf8)
        let info = [UInt8(out.count >> 8), UInt8(truncatingIfNeeded: out.count), UInt8(full.count)] + full + [0]
        let count = out.count
        return out.withUnsafeMutableBytes { output in
            roam_hkdf_expand(suite.hash, secret.assumingMemoryBound(to: UInt8.self), suite.hashLength, info, info.count,
                             output.baseAddress!.assumingMemoryBound(to: UInt8.self), count) == 1
        }
    }

    /// Calls `body` with the next record's 12-byte nonce, then counts the record; false when
    /// the sequence is spent (a key update comes long before).
    private func withNonce(_ body: (UnsafePointer<UInt8>) -> Bool) -> Bool {
        guard ready, sequence < UInt64.max else { return false }
        // The IV with the sequence number, big-endian, XORed into its last eight bytes (16 bytes
        // of room, 12 used).
        var nonce = (UInt64(0), UInt64(0))
        let iv = memory + Self.ivOffset
        withUnsafeMutableBytes(of: &nonce) { raw in
            raw.baseAddress!.copyMemory(from: iv, byteCount: 12)
            var counter = sequence.bigEndian
            withUnsafeBytes(of: &counter) { count in
                for k in 0..<8 { raw[4 + k] ^= count[k] }
            }
        }
        let ok = withUnsafeBytes(of: &nonce) { body($0.baseAddress!.assumingMemoryBound(to: UInt8.self)) }
        if ok { sequence += 1 }
        return ok
    }

    /// Seals the record whose header is at `record` (its length already written) and whose
    /// inner plaintext (content and type) of `length` bytes follows it; the tag after that.
    func seal(record: UnsafeMutableRawPointer, length: Int) -> Bool {
        let text = (record + Record.headerLength).assumingMemoryBound(to: UInt8.self)
        return withNonce { nonce in
            roam_aead_seal(memory, nonce, record.assumingMemoryBound(to: UInt8.self), Record.headerLength, text, length, text + length) == 1
        }
    }

    /// Opens the record at `record` (header, then `length` bytes of encrypted_record) into
    /// `out` (room for `length - tagLength` bytes, not overlapping); false when it does not verify.
    func open(record: UnsafeRawPointer, length: Int, into out: UnsafeMutableRawPointer) -> Bool {
        let text = (record + Record.headerLength).assumingMemoryBound(to: UInt8.self)
        let body = length - Record.tagLength
        return withNonce { nonce in
            roam_aead_open_to(memory, nonce, record.assumingMemoryBound(to: UInt8.self), Record.headerLength, text, body, text + body,
                              out.assumingMemoryBound(to: UInt8.self)) == 1
        }
    }
}
