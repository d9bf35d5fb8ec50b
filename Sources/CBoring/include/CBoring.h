#ifndef ROAM_CBORING_H
#define ROAM_CBORING_H
#include <stddef.h>
#include <stdint.h>

// The AEADs of the BoringSSL that swift-crypto vendors and links into the binary (swift-crypto
// is pinned to one version in Package.swift; CBoring.c compiles against its headers and checks
// the sizes below against them). Its EVP_AEAD_CTX holds the expanded key and needs no heap, and
// sealing and opening only read it, so one context serves every thread at once; it lives in
// memory the caller gives, a slot of the secret arena of ROAM_AEAD_SIZE bytes.

/// Which AEAD a context seals with.
enum roam_aead_kind { ROAM_AEAD_CHACHA20_POLY1305 = 1, ROAM_AEAD_AES_256_GCM = 2, ROAM_AEAD_AES_128_GCM = 3 };

/// Bytes a context takes.
#define ROAM_AEAD_SIZE 640

/// Sets up `ctx` (ROAM_AEAD_SIZE bytes) for `kind` with its key (16 bytes for AES-128-GCM, 32 for
/// the others); 0 on failure, when the context must not be used.
int roam_aead_init(void *ctx, int kind, const uint8_t *key);

/// 1 when this CPU has AES in hardware, as BoringSSL uses it (AES-NI and carry-less multiply).
int roam_has_aes_hardware(void);

/// Wipes what BoringSSL keeps in `ctx`.
void roam_aead_cleanup(void *ctx);

/// Seals `length` bytes at `text` in place with the 12-byte `nonce`, the 16-byte tag to `tag`.
/// 1 on success.
int roam_aead_seal(const void *ctx, const uint8_t *nonce, const uint8_t *ad, size_t ad_length,
                   uint8_t *text, size_t length, uint8_t *tag);

/// Opens `length` bytes at `text` in place; 1 when the tag verifies (else `text` is zeroed).
int roam_aead_open(const void *ctx, const uint8_t *nonce, const uint8_t *ad, size_t ad_length,
                   uint8_t *text, size_t length, const uint8_t *tag);

/// Opens `length` bytes at `text` into `out` (which holds `length` bytes and does not overlap
/// `text`); 1 when the tag verifies.
int roam_aead_open_to(const void *ctx, const uint8_t *nonce, const uint8_t *ad, size_t ad_length,
                      const uint8_t *text, size_t length, const uint8_t *tag, uint8_t *out);

/// Which hash an HKDF uses.
enum roam_hash_kind { ROAM_HASH_SHA256 = 1, ROAM_HASH_SHA384 = 2 };

/// HKDF-Expand (RFC 5869) with `hash`: `out_length` bytes from the pseudo-random key `prk` and
/// `info`. 1 on success.
int roam_hkdf_expand(int hash, const uint8_t *prk, size_t prk_length, const uint8_t *info, size_t info_length,
                     uint8_t *out, size_t out_length);

// ML-KEM-768 (FIPS 203) from the same BoringSSL. A private key is BoringSSL's expanded form,
// ROAM_MLKEM_PRIVATE_SIZE bytes in memory the caller gives (a slot of the secret arena).

#define ROAM_MLKEM_PUBLIC_BYTES 1184
#define ROAM_MLKEM_CIPHERTEXT_BYTES 1088
#define ROAM_MLKEM_SEED_BYTES 64
#define ROAM_MLKEM_SHARED_BYTES 32
/// BoringSSL's MLKEM768_private_key is 7776 bytes; the slot leaves room.
#define ROAM_MLKEM_PRIVATE_SIZE 8192

/// A new key pair: the encoded public key to `public_key`, the private key to `private_key`.
/// With a `seed` (64 bytes, d || z as FIPS 203 names them) the pair is the one it determines
/// (for test vectors); without, a random one. 1 on success.
int roam_mlkem_generate(uint8_t *public_key, void *private_key, const uint8_t *seed);

/// Encapsulates to the encoded `public_key`: the ciphertext and the 32-byte shared secret. With
/// `entropy` (32 bytes, FIPS 203's m) the result is the one it determines (for test vectors).
/// 0 when the public key is not a valid encoding (FIPS 203's input check).
int roam_mlkem_encapsulate(uint8_t *ciphertext, uint8_t *shared, const uint8_t *public_key, const uint8_t *entropy);

/// Decapsulates `ciphertext` (ROAM_MLKEM_CIPHERTEXT_BYTES) with `private_key`: the shared
/// secret (a pseudo-random one for a ciphertext that was tampered with, as FIPS 203 specifies).
/// 0 only on a wrong length.
int roam_mlkem_decapsulate(uint8_t *shared, const uint8_t *ciphertext, size_t length, const void *private_key);

#endif
