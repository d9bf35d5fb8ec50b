import CSodium

/// 32 secret bytes that this process alone holds, in the secret arena (locked, left out of
/// core dumps), wiped when the last reference goes away.
///
/// A class so that copies of a key share one buffer and `deinit` runs exactly once; the bytes
/// are written only inside `init`, which is why sharing it across threads is safe.
final class SecretBytes: @unchecked Sendable {  // written only in init
    static let count = 32
    private let pointer: UnsafeMutablePointer<UInt8>
    /// From the heap, when the arena could not map a chunk.
    private let fromHeap: Bool

    /// Lets `fill` write the 32 bytes, once; they never change after.
    init(_ fill: (UnsafeMutablePointer<UInt8>) -> Void) {
        if let slot = SecretArena.keys.allocate() {
            pointer = slot.bindMemory(to: UInt8.self, capacity: Self.count)
            fromHeap = false
        } else {
            pointer = .allocate(capacity: Self.count)
            fromHeap = true
        }
        pointer.initialize(repeating: 0, count: Self.count)
        fill(pointer)
    }

    /// Copies `bytes`, which must hold exactly 32 bytes.
    convenience init(copying bytes: UnsafeRawBufferPointer) {
        precondition(bytes.count == Self.count, "SecretBytes needs exactly 32 bytes")
        self.init { $0.update(from: bytes.bindMemory(to: UInt8.self).baseAddress!, count: Self.count) }
    }

    deinit {
        if fromHeap {
            sodium_memzero(pointer, Self.count)
            pointer.deallocate()
        } else {
            SecretArena.keys.release(UnsafeMutableRawPointer(pointer))
        }
    }

    /// Runs `body` with the bytes; `self` stays alive for the whole call.
    func withBytes<R>(_ body: (UnsafePointer<UInt8>) throws -> R) rethrows -> R {
        try body(pointer)
    }

    /// Whether the secret is `bytes`, compared in constant time, with no copy of the secret made.
    func matches(_ bytes: [UInt8]) -> Bool {
        bytes.withUnsafeBytes { Primitives.constantTimeEqual(UnsafeRawBufferPointer(start: pointer, count: Self.count), $0) }
    }
}

/// An X25519 public key: a server's identity that clients pin, or a client's that the server knows.
public struct PublicKey: Hashable, Sendable, CustomStringConvertible {
    /// Bytes in a key.
    public static let length = 32
    /// The key's 32 bytes.
    public let bytes: [UInt8]

    /// A key from its 32 bytes; nil for any other length.
    public init?(bytes: some Collection<UInt8>) {
        guard bytes.count == Self.length else { return nil }
        self.bytes = Array(bytes)
    }

    /// A key from its standard base64 form (44 characters, as WireGuard prints keys).
    public init?(base64: String) {
        guard let bytes = Base64.decode(base64, length: Self.length) else { return nil }
        self.bytes = bytes
    }

    /// The standard base64 form, as configuration files and `agent pubkey` show it.
    public var base64: String { Base64.encode(bytes) }

    public var description: String { base64 }

    /// The 32 bytes in one go: hashing them one at a time made a gateway's 100,000-user tables
    /// cost twice as much to build.
    public func hash(into hasher: inout Hasher) { bytes.withUnsafeBytes { hasher.combine(bytes: $0) } }
}

/// An X25519 private key. Its description never shows the key; `revealBase64()` does, for
/// `agent keygen` and nothing else. The bytes are wiped from memory when the last copy goes.
public struct PrivateKey: Sendable, CustomStringConvertible, CustomDebugStringConvertible {
    let secret: SecretBytes
    /// The matching public key.
    public let publicKey: PublicKey

    /// A fresh key from the operating system's randomness.
    public static func generate() throws(CryptoError) -> PrivateKey {
        try Sodium.initialize()
        return random()
    }

    /// A fresh key, once libsodium is initialised (the cores make sure of it in their `init`).
    static func random() -> PrivateKey {
        PrivateKey(secret: SecretBytes { bytes in
            randombytes_buf(bytes, SecretBytes.count)
            // Clamp as RFC 7748 does, so a stored key reads the same as WireGuard's would.
            bytes[0] &= 248
            bytes[31] = (bytes[31] & 127) | 64
        })
    }

    /// A key from its 32 bytes; nil for any other length.
    public init?(bytes: some Collection<UInt8>) {
        guard bytes.count == SecretBytes.count else { return nil }
        var copy = Array(bytes)
        defer { copy.withUnsafeMutableBytes { sodium_memzero($0.baseAddress, $0.count) } }
        self.init(secret: copy.withUnsafeBytes { SecretBytes(copying: $0) })
    }

    /// A key from its standard base64 form; nil when the text is not 32 bytes of base64.
    public init?(base64: String) {
        guard var bytes = Base64.decode(base64, length: SecretBytes.count) else { return nil }
        defer { bytes.withUnsafeMutableBytes { sodium_memzero($0.baseAddress, $0.count) } }
        self.init(bytes: bytes)
    }

    init(secret: SecretBytes) {
        self.secret = secret
        var bytes = [UInt8](repeating: 0, count: PublicKey.length)
        secret.withBytes { _ = crypto_scalarmult_base(&bytes, $0) }
        publicKey = PublicKey(bytes: bytes)!
    }

    /// The key in base64: a secret. Only for writing a key file.
    public func revealBase64() -> String {
        secret.withBytes { Base64.encode(UnsafeRawBufferPointer(start: $0, count: SecretBytes.count)) }
    }

    public var description: String { "PrivateKey(public: \(publicKey), private: redacted)" }
    public var debugDescription: String { description }
}

/// Base64 in the standard alphabet with padding, through libsodium's constant-time codec
/// (a key's text must not leak through timing while it is parsed).
enum Base64 {
    static func encode(_ bytes: [UInt8]) -> String { bytes.withUnsafeBytes { encode($0) } }

    static func encode(_ raw: UnsafeRawBufferPointer) -> String {
        let variant = Int32(sodium_base64_VARIANT_ORIGINAL)
        let length = sodium_base64_encoded_len(raw.count, variant)
        var text = [CChar](repeating: 0, count: length)
        _ = sodium_bin2base64(&text, length, raw.bindMemory(to: UInt8.self).baseAddress, raw.count, variant)
        return String(decoding: text.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// Decodes `text`, which must encode exactly `length` bytes with nothing left over.
    static func decode(_ text: String, length: Int) -> [UInt8]? {
        let utf8 = Array(text.utf8)
        guard !utf8.isEmpty else { return nil }
        var out = [UInt8](repeating: 0, count: length)
        var decoded = 0
        var end: UnsafePointer<CChar>?
        let status = utf8.withUnsafeBufferPointer { input in
            input.withMemoryRebound(to: CChar.self) { chars in
                let result = sodium_base642bin(
                    &out, length, chars.baseAddress, chars.count, nil, &decoded, &end,
                    Int32(sodium_base64_VARIANT_ORIGINAL))
                let consumed = end.map { $0 - chars.baseAddress! } ?? -1
                return result == 0 && consumed == chars.count ? 0 : -1
            }
        }
        guard status == 0, decoded == length else { return nil }
        return out
    }
}
