import CBoring

/// ML-KEM-768 (FIPS 203), from swift-crypto's BoringSSL: the post-quantum half of the hybrid
/// key exchange. A handshake's key pair is ephemeral: made for one handshake and wiped with it,
/// so what it protects stays secret even if a long-term key is later lost.
enum MLKEM {
    static let publicKeyLength = Int(ROAM_MLKEM_PUBLIC_BYTES)
    static let ciphertextLength = Int(ROAM_MLKEM_CIPHERTEXT_BYTES)
    static let seedLength = Int(ROAM_MLKEM_SEED_BYTES)

    /// The slots private keys live in.
    static let arena = SecretArena(slotSize: Int(ROAM_MLKEM_PRIVATE_SIZE))

    /// One key pair: the encoded public key, and the private key in the secret arena.
    final class KeyPair: Sendable {
        let publicKey: [UInt8]
        /// The private key, written in init only.
        private let slot: SecretSlot

        /// A random pair; with `seed` (64 bytes, d || z) the one it determines, for test vectors.
        init(seed: [UInt8]? = nil) {
            precondition(seed == nil || seed!.count == MLKEM.seedLength, "an ML-KEM seed is 64 bytes")
            slot = SecretSlot(from: MLKEM.arena)
            let privateKey = slot.pointer
            var encoded = [UInt8](repeating: 0, count: MLKEM.publicKeyLength)
            let made = if let seed {
                roam_mlkem_generate(&encoded, privateKey, seed)
            } else {
                roam_mlkem_generate(&encoded, privateKey, nil)
            }
            // Only a seed of the wrong length fails, which the precondition above rules out.
            precondition(made == 1, "ML-KEM key generation failed")
            publicKey = encoded
        }

        /// The shared secret a ciphertext carries. A ciphertext that was tampered with gives a
        /// secret nobody else has (FIPS 203's implicit rejection), so the handshake fails later,
        /// at its next authenticated message, like any other forgery; nil only for a wrong length.
        func decapsulate(_ ciphertext: [UInt8]) -> SecretBytes? {
            guard ciphertext.count == MLKEM.ciphertextLength else { return nil }
            var ok = false
            let shared = SecretBytes { out in
                ok = roam_mlkem_decapsulate(out, ciphertext, ciphertext.count, slot.pointer) == 1
            }
            return ok ? shared : nil
        }
    }

    /// Encapsulates a fresh secret to `publicKey`: the ciphertext for its holder and the secret.
    /// Nil when `publicKey` is not a valid encoding (wrong length, or coefficients out of range,
    /// FIPS 203's check). With `entropy` (32 bytes, m) the result is the one it determines.
    static func encapsulate(to publicKey: [UInt8], entropy: [UInt8]? = nil) -> (ciphertext: [UInt8], shared: SecretBytes)? {
        guard publicKey.count == publicKeyLength, entropy == nil || entropy!.count == 32 else { return nil }
        var ciphertext = [UInt8](repeating: 0, count: ciphertextLength)
        var ok = false
        let shared = SecretBytes { out in
            ok = if let entropy {
                roam_mlkem_encapsulate(&ciphertext, out, publicKey, entropy) == 1
            } else {
                roam_mlkem_encapsulate(&ciphertext, out, publicKey, nil) == 1
            }
        }
        return ok ? (ciphertext, shared) : nil
    }
}
