import CBoring

/// The AEADs a session's packets may be sealed with. Version 2 seals with ChaCha20-Poly1305
/// only; the suite is a property of the session, so a later version can choose.
public enum CipherSuite: UInt8, Sendable, CaseIterable, CustomStringConvertible {
    case chacha20Poly1305 = 1
    case aes256GCM = 2

    public var description: String {
        switch self {
        case .chacha20Poly1305: "chacha20-poly1305"
        case .aes256GCM: "aes-256-gcm"
        }
    }

    /// The 96-bit nonce for message `counter`, as Noise forms it for this cipher: 32 zero bits,
    /// then the counter little-endian for ChaCha20-Poly1305, big-endian for AES-GCM.
    /// (Three 32-bit words: a tuple of a UInt32 and a UInt64 would be padded to 16 bytes.)
    @inline(__always)
    func nonce(_ counter: UInt64) -> (UInt32, UInt32, UInt32) {
        let low = UInt32(truncatingIfNeeded: counter), high = UInt32(truncatingIfNeeded: counter >> 32)
        return switch self {
        case .chacha20Poly1305: (0, low.littleEndian, high.littleEndian)
        case .aes256GCM: (0, high.bigEndian, low.bigEndian)
        }
    }
}

/// One direction of a session: a 32-byte key expanded once into BoringSSL's AEAD context (the
/// AES key schedule and GHASH table, or the ChaCha20 key), which lives in a slot of the secret
/// arena (locked in memory, out of core dumps, wiped when given back). Sealing and opening only
/// read the context, so the threads of a session share it without a lock, as they shared the
/// key before; nothing is allocated per packet.
final class AEADKey: Sendable {
    let suite: CipherSuite
    /// The context, written in init and deinit only.
    private let slot: SecretSlot

    /// The slots the contexts live in.
    static let arena = SecretArena(slotSize: Int(ROAM_AEAD_SIZE))

    /// Expands `key` for `suite`. Set-up fails only when the linked BoringSSL is not the one
    /// CBoring was written for, which `selfTest()` finds at start.
    init(_ suite: CipherSuite, key: SecretBytes) {
        self.suite = suite
        slot = SecretSlot(from: Self.arena)
        let ready = key.withBytes { roam_aead_init(slot.pointer, Int32(suite.rawValue), $0) }
        precondition(ready == 1, "the linked BoringSSL's AEAD context is not the one this build expects (run the self-test)")
    }

    /// BoringSSL's cleanup first; the slot is wiped and given back after.
    deinit { roam_aead_cleanup(slot.pointer) }

    private var context: UnsafeMutableRawPointer { slot.pointer }

    /// Seals `text` in place with message `counter`'s nonce; the 16-byte tag goes to `tag`.
    @inline(__always)
    func seal(counter: UInt64, ad: UnsafeRawBufferPointer, text: UnsafeMutableRawBufferPointer, tag: UnsafeMutableRawPointer) {
        var nonce = suite.nonce(counter)
        let sealed = withUnsafeBytes(of: &nonce) { nonce in
            roam_aead_seal(context, nonce.baseAddress!.assumingMemoryBound(to: UInt8.self),
                           ad.baseAddress?.assumingMemoryBound(to: UInt8.self), ad.count,
                           text.baseAddress?.assumingMemoryBound(to: UInt8.self) ?? Self.empty, text.count,
                           tag.assumingMemoryBound(to: UInt8.self))
        }
        // Sealing can fail only for lengths past what a datagram holds, which callers check;
        // BoringSSL zeroes text and tag then, and such a packet must not go out anyway.
        precondition(sealed == 1, "sealing failed")
    }

    /// Opens `text` in place; false when the tag does not verify, and then `text` is zeroed
    /// (BoringSSL decrypts before it checks the tag): a caller cannot try another key on it.
    @inline(__always)
    func open(counter: UInt64, ad: UnsafeRawBufferPointer, text: UnsafeMutableRawBufferPointer, tag: UnsafeRawPointer) -> Bool {
        var nonce = suite.nonce(counter)
        return withUnsafeBytes(of: &nonce) { nonce in
            roam_aead_open(context, nonce.baseAddress!.assumingMemoryBound(to: UInt8.self),
                           ad.baseAddress?.assumingMemoryBound(to: UInt8.self), ad.count,
                           text.baseAddress?.assumingMemoryBound(to: UInt8.self) ?? Self.empty, text.count,
                           tag.assumingMemoryBound(to: UInt8.self)) == 1
        }
    }

    /// Where an empty text points (BoringSSL wants a pointer even for no bytes).
    nonisolated(unsafe) private static let empty = UnsafeMutablePointer<UInt8>.allocate(capacity: 1)

    /// Checks, once at start, that the linked BoringSSL does what CBoring was written for: each
    /// suite sets up in a scratch context and reproduces a known answer (RFC 8439's AEAD test
    /// vector for ChaCha20-Poly1305; for AES-256-GCM, McGrew and Viega's test case 16), and so
    /// does ML-KEM-768 (kyber-py's). Nil when all is well, else what failed.
    static func selfTest() -> String? {
        for vector in KnownAnswer.all {
            let slot = SecretSlot(from: arena)
            defer { withExtendedLifetime(slot) {} }  // the slot outlives every use of its pointer below
            let scratch = slot.pointer
            guard roam_aead_init(scratch, Int32(vector.suite.rawValue), vector.key) == 1 else {
                return "\(vector.suite): the linked BoringSSL's AEAD context does not match this build"
            }
            defer { roam_aead_cleanup(scratch) }
            var text = vector.plaintext
            var tag = [UInt8](repeating: 0, count: 16)
            let sealed = roam_aead_seal(scratch, vector.nonce, vector.ad, vector.ad.count, &text, text.count, &tag)
            guard sealed == 1, text == vector.ciphertext, tag == vector.tag else {
                return "\(vector.suite): sealing does not reproduce the known answer"
            }
            guard roam_aead_open(scratch, vector.nonce, vector.ad, vector.ad.count, &text, text.count, tag) == 1,
                  text == vector.plaintext else {
                return "\(vector.suite): opening does not reproduce the known answer"
            }
        }
        // ML-KEM-768: a key pair from a fixed seed, an encapsulation with fixed randomness and
        // its decapsulation reproduce kyber-py's answers (Tests/Fixtures/mlkem.json, vector 0).
        let pair = MLKEM.KeyPair(seed: KnownAnswer.kemSeed)
        guard Primitives.hash(pair.publicKey) == KnownAnswer.kemPublicKeyHash else { return "ML-KEM-768: the key pair does not reproduce the known answer" }
        guard let (ciphertext, shared) = MLKEM.encapsulate(to: pair.publicKey, entropy: KnownAnswer.kemEntropy),
              Primitives.hash(ciphertext) == KnownAnswer.kemCiphertextHash,
              shared.matches(KnownAnswer.kemShared),
              let opened = pair.decapsulate(ciphertext), opened.matches(KnownAnswer.kemShared)
        else { return "ML-KEM-768: encapsulation does not reproduce the known answer" }
        return nil
    }
}

/// Published AEAD test vectors, for `AEADKey.selfTest()`.
struct KnownAnswer {
    var suite: CipherSuite
    var key: [UInt8]
    var nonce: [UInt8]
    var ad: [UInt8]
    var plaintext: [UInt8]
    var ciphertext: [UInt8]
    var tag: [UInt8]

    static let all = [
        // RFC 8439, section 2.8.2.
        KnownAnswer(
            suite: .chacha20Poly1305, key: Array(0x80...0x9f), nonce: hex("070000004041424344454647"),
            ad: hex("50515253c0c1c2c3c4c5c6c7"),
            plaintext: Array("Ladies and Gentlemen of the class of '99: If I could offer you only one tip for the future, sunscreen would be it.".utf8),
            ciphertext: hex("d31a8d34648e60db7b86afbc53ef7ec2a4aded51296e08fea9e2b5a736ee62d63dbea45e8ca9671282fafb69da92728b"
                + "1a71de0a9e060b2905d6a5b67ecd3b3692ddbd7f2d778b8c9803aee328091b58fab324e4fad675945585808b4831d7bc3ff4def08e4b7a9de576d26586cec64b6116"),
            tag: hex("1ae10b594f09e26a7e902ecbd0600691")),
        // McGrew and Viega, "The Galois/Counter Mode of Operation", test case 16.
        KnownAnswer(
            suite: .aes256GCM, key: hex("feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308"),
            nonce: hex("cafebabefacedbaddecaf888"), ad: hex("feedfacedeadbeeffeedfacedeadbeefabaddad2"),
            plaintext: hex("d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a721c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b39"),
            ciphertext: hex("522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a0abcc9f662"),
            tag: hex("76fc6ece0f4e1768cddf8853bb2d551b")),
    ]

    /// ML-KEM-768 from kyber-py (Tests/Fixtures/mlkem.json, vector 0): the seed and the
    /// encapsulation's randomness, SHA-256 of the public key and of the ciphertext, the secret.
    static let kemSeed = hex("6393f4d1ac4b7a87fa89ceb99206525064f0f53d9671ee80b88dc7016f7d8ad9"
        + "e212dc633a1b246282879a7c1bd7ccd9f721b633ba79f042fe86f84c5821f2d8")
    static let kemPublicKeyHash = hex("f271cf60e75d72a842b6acbb39a006c91391350ac19faf89024a03dfd7d89fed")
    static let kemEntropy = hex("87d66072dd5351c186e880e42c16acd8ab08a3f27a9bcc8ea68ed25bd8d91780")
    static let kemCiphertextHash = hex("4a480fa80f11fd3a1391583298a1d90cac8addb553249d20c2e7a086cc3c671c")
    static let kemShared = hex("c6c7d0ffb0740abb6b18ef049ba14f8889e19c4cbe46d0dcb839fa0bf3230b0c")

    /// Bytes from hex text (known answers, and the tests' vectors).
    static func hex(_ text: String) -> [UInt8] {
        var bytes: [UInt8] = []
        var index = text.startIndex
        while index < text.endIndex {
            let next = text.index(index, offsetBy: 2)
            bytes.append(UInt8(text[index..<next], radix: 16)!)
            index = next
        }
        return bytes
    }
}

/// What the daemons check before they seal anything.
public enum CipherSelfTest {
    /// Nil when every cipher suite reproduces its known answer; else what failed.
    public static func run() -> String? { AEADKey.selfTest() }
}
