#ifndef ROAM_CBORING_H
#define ROAM_CBORING_H
#include <stddef.h>
#include <stdint.h>

// The AEADs of the BoringSSL that swift-crypto vendors and links into the binary (its symbols
// carry the prefix CCryptoBoringSSL_; swift-crypto is pinned to one version in Package.swift).
// Its EVP_AEAD_CTX holds the expanded key and needs no heap, and sealing and opening only read
// it, so one context serves every thread at once; it lives in memory the caller gives, a slot
// of the secret arena of ROAM_AEAD_SIZE bytes (more than the 576 BoringSSL's needs, so a
// larger one in a later version still fits, and `roam_aead_init` checks itself at once).

/// Which AEAD a context seals with.
enum roam_aead_kind { ROAM_AEAD_CHACHA20_POLY1305 = 1, ROAM_AEAD_AES_256_GCM = 2 };

/// Bytes a context takes.
#define ROAM_AEAD_SIZE 640

/// Sets up `ctx` (ROAM_AEAD_SIZE bytes) for `kind` with a 32-byte key; 0 on failure, when the
/// context must not be used.
int roam_aead_init(void *ctx, int kind, const uint8_t *key);

/// Wipes what BoringSSL keeps in `ctx`.
void roam_aead_cleanup(void *ctx);

/// Seals `length` bytes at `text` in place with the 12-byte `nonce`, the 16-byte tag to `tag`.
/// 1 on success.
int roam_aead_seal(const void *ctx, const uint8_t *nonce, const uint8_t *ad, size_t ad_length,
                   uint8_t *text, size_t length, uint8_t *tag);

/// Opens `length` bytes at `text` in place; 1 when the tag verifies (else `text` is garbage).
int roam_aead_open(const void *ctx, const uint8_t *nonce, const uint8_t *ad, size_t ad_length,
                   uint8_t *text, size_t length, const uint8_t *tag);

#endif
