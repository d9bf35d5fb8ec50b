import CSodium

/// The Noise functions for `25519_ChaChaPoly_SHA256` (spec §4), over libsodium.
///
/// Handshake helpers allocate; the `inPlace` AEAD pair is the data path and does not.
/// Where an empty buffer points, so C never sees NULL; nothing is ever written to it.
nonisolated(unsafe) private let emptyByte = UnsafeMutablePointer<UInt8>.allocate(capacity: 1)

enum Primitives {
    static let keyLength = 32
    static let hashLength = 32
    static let tagLength = 16

    /// HASH: SHA-256 of the concatenation of `parts`.
    static func hash(_ parts: [UInt8]...) -> [UInt8] {
        var state = crypto_hash_sha256_state()
        crypto_hash_sha256_init(&state)
        for part in parts { crypto_hash_sha256_update(&state, part, UInt64(part.count)) }
        var out = [UInt8](repeating: 0, count: hashLength)
        crypto_hash_sha256_final(&state, &out)
        return out
    }

    /// HMAC-SHA256 of the concatenation of `parts`, written to `out` (32 bytes).
    static func hmac(
        key: UnsafeRawBufferPointer, _ parts: [UnsafeRawBufferPointer], into out: UnsafeMutablePointer<UInt8>
    ) {
        var state = crypto_auth_hmacsha256_state()
        crypto_auth_hmacsha256_init(&state, bytes(key), key.count)
        for part in parts { crypto_auth_hmacsha256_update(&state, bytes(part), UInt64(part.count)) }
        crypto_auth_hmacsha256_final(&state, out)
        // The state holds the key, padded; don't leave it on the stack.
        withUnsafeMutableBytes(of: &state) { sodium_memzero($0.baseAddress, $0.count) }
    }

    /// HKDF with two outputs (spec §4.3): the new chaining key and a cipher key.
    static func hkdf(chainingKey: SecretBytes, input: UnsafeRawBufferPointer) -> (SecretBytes, SecretBytes) {
        let temp = SecretBytes { out in
            chainingKey.withBytes { hmac(key: UnsafeRawBufferPointer(start: $0, count: keyLength), [input], into: out) }
        }
        var one: UInt8 = 1
        var two: UInt8 = 2
        let first = SecretBytes { out in
            temp.withBytes { key in
                withUnsafeBytes(of: &one) { hmac(key: UnsafeRawBufferPointer(start: key, count: keyLength), [$0], into: out) }
            }
        }
        let second = SecretBytes { out in
            temp.withBytes { key in
                first.withBytes { previous in
                    withUnsafeBytes(of: &two) {
                        hmac(
                            key: UnsafeRawBufferPointer(start: key, count: keyLength),
                            [UnsafeRawBufferPointer(start: previous, count: keyLength), $0], into: out)
                    }
                }
            }
        }
        return (first, second)
    }

    /// DH: X25519. Nil when `publicKey` is a low-order point (the shared secret would be zero).
    static func dh(_ privateKey: PrivateKey, _ publicKey: PublicKey) -> SecretBytes? {
        var failed = false
        let shared = SecretBytes { out in
            privateKey.secret.withBytes { secret in
                failed = crypto_scalarmult(out, secret, publicKey.bytes) != 0
            }
        }
        return failed ? nil : shared
    }

    /// ENCRYPT: ChaCha20-Poly1305 (IETF), in place, the tag written to `tag` (16 bytes).
    /// The nonce is 32 zero bits then `counter` little-endian, as Noise specifies.
    @inline(__always)
    static func sealInPlace(
        key: SecretBytes, counter: UInt64, ad: UnsafeRawBufferPointer,
        text: UnsafeMutableRawBufferPointer, tag: UnsafeMutableRawPointer
    ) {
        var nonce = (UInt32(0), UInt32(truncatingIfNeeded: counter).littleEndian,
                     UInt32(truncatingIfNeeded: counter >> 32).littleEndian)
        withUnsafeBytes(of: &nonce) { nonce in
            key.withBytes { key in
                let text = mutableBytes(text)
                _ = crypto_aead_chacha20poly1305_ietf_encrypt_detached(
                    text.pointer, tag.assumingMemoryBound(to: UInt8.self), nil, text.pointer, text.count,
                    bytes(ad), UInt64(ad.count), nil, bytes(nonce), key)
            }
        }
    }

    /// DECRYPT in place; false (and `text` zeroed) when the tag does not verify.
    @inline(__always)
    static func openInPlace(
        key: SecretBytes, counter: UInt64, ad: UnsafeRawBufferPointer,
        text: UnsafeMutableRawBufferPointer, tag: UnsafeRawPointer
    ) -> Bool {
        var nonce = (UInt32(0), UInt32(truncatingIfNeeded: counter).littleEndian,
                     UInt32(truncatingIfNeeded: counter >> 32).littleEndian)
        return withUnsafeBytes(of: &nonce) { nonce in
            key.withBytes { key in
                let text = mutableBytes(text)
                return crypto_aead_chacha20poly1305_ietf_decrypt_detached(
                    text.pointer, nil, text.pointer, text.count, tag.assumingMemoryBound(to: UInt8.self),
                    bytes(ad), UInt64(ad.count), bytes(nonce), key) == 0
            }
        }
    }

    /// ENCRYPT into a new array: ciphertext then tag.
    static func seal(key: SecretBytes, counter: UInt64, ad: [UInt8], plaintext: [UInt8]) -> [UInt8] {
        var out = plaintext + [UInt8](repeating: 0, count: tagLength)
        let length = plaintext.count
        ad.withUnsafeBytes { ad in
            out.withUnsafeMutableBytes { out in
                sealInPlace(
                    key: key, counter: counter, ad: ad,
                    text: UnsafeMutableRawBufferPointer(rebasing: out[..<length]),
                    tag: out.baseAddress! + length)
            }
        }
        return out
    }

    /// DECRYPT a ciphertext-then-tag array; nil when too short or the tag does not verify.
    static func open(key: SecretBytes, counter: UInt64, ad: [UInt8], ciphertext: [UInt8]) -> [UInt8]? {
        guard ciphertext.count >= tagLength else { return nil }
        var out = ciphertext
        let length = ciphertext.count - tagLength
        let ok = ad.withUnsafeBytes { ad in
            out.withUnsafeMutableBytes { out in
                openInPlace(
                    key: key, counter: counter, ad: ad,
                    text: UnsafeMutableRawBufferPointer(rebasing: out[..<length]),
                    tag: UnsafeRawPointer(out.baseAddress! + length))
            }
        }
        guard ok else { return nil }
        out.removeLast(tagLength)
        return out
    }

    /// A random 32-bit value, for session indices.
    static func randomUInt32() -> UInt32 { randombytes_random() }

    /// libsodium wants a valid pointer even for zero bytes; an empty buffer may have none.
    @inline(__always)
    private static func bytes(_ buffer: UnsafeRawBufferPointer) -> UnsafePointer<UInt8> {
        UnsafePointer((buffer.baseAddress ?? UnsafeRawPointer(emptyByte)).assumingMemoryBound(to: UInt8.self))
    }

    @inline(__always)
    private static func mutableBytes(_ buffer: UnsafeMutableRawBufferPointer) -> (pointer: UnsafeMutablePointer<UInt8>, count: UInt64) {
        ((buffer.baseAddress ?? UnsafeMutableRawPointer(emptyByte)).assumingMemoryBound(to: UInt8.self), UInt64(buffer.count))
    }

    /// Overwrites `bytes` with zeros in a way the optimiser cannot skip.
    static func wipe(_ bytes: inout [UInt8]) {
        bytes.withUnsafeMutableBytes { sodium_memzero($0.baseAddress, $0.count) }
    }

    /// Compares in time independent of where the bytes differ.
    static func constantTimeEqual(_ a: UnsafeRawBufferPointer, _ b: UnsafeRawBufferPointer) -> Bool {
        a.count == b.count && sodium_memcmp(a.baseAddress, b.baseAddress, a.count) == 0
    }
}
