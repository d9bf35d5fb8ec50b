#include "CBoring.h"
#include <string.h>
// BoringSSL's own headers, from swift-crypto's CCryptoBoringSSL target (its symbols carry the
// prefix CCryptoBoringSSL_, which these headers apply): the prototypes and struct layouts are
// the linked library's, checked here when this file compiles.
#include <CCryptoBoringSSL_aead.h>
#include <CCryptoBoringSSL_bytestring.h>
#include <CCryptoBoringSSL_digest.h>
#include <CCryptoBoringSSL_hkdf.h>
#include <CCryptoBoringSSL_mem.h>
#include <CCryptoBoringSSL_mlkem.h>

_Static_assert(sizeof(EVP_AEAD_CTX) <= ROAM_AEAD_SIZE, "an AEAD context outgrew its slot");
_Static_assert(_Alignof(EVP_AEAD_CTX) <= 64, "an AEAD context needs more alignment than its slot has");
_Static_assert(sizeof(struct MLKEM768_private_key) <= ROAM_MLKEM_PRIVATE_SIZE, "an ML-KEM private key outgrew its slot");
_Static_assert(_Alignof(struct MLKEM768_private_key) <= 64, "an ML-KEM private key needs more alignment than its slot has");
_Static_assert(MLKEM768_PUBLIC_KEY_BYTES == ROAM_MLKEM_PUBLIC_BYTES, "ML-KEM-768's public key size");
_Static_assert(MLKEM768_CIPHERTEXT_BYTES == ROAM_MLKEM_CIPHERTEXT_BYTES, "ML-KEM-768's ciphertext size");
_Static_assert(MLKEM_SEED_BYTES == ROAM_MLKEM_SEED_BYTES, "ML-KEM's seed size");

int roam_aead_init(void *ctx, int kind, const uint8_t *key) {
    const EVP_AEAD *aead;
    size_t key_length = 32;
    switch (kind) {
    case ROAM_AEAD_CHACHA20_POLY1305: aead = EVP_aead_chacha20_poly1305(); break;
    case ROAM_AEAD_AES_256_GCM: aead = EVP_aead_aes_256_gcm(); break;
    case ROAM_AEAD_AES_128_GCM: aead = EVP_aead_aes_128_gcm(); key_length = 16; break;
    default: return 0;
    }
    memset(ctx, 0, ROAM_AEAD_SIZE);
    return EVP_AEAD_CTX_init((EVP_AEAD_CTX *)ctx, aead, key, key_length, 16, NULL) == 1;
}

void roam_aead_cleanup(void *ctx) { EVP_AEAD_CTX_cleanup((EVP_AEAD_CTX *)ctx); }

int roam_has_aes_hardware(void) { return EVP_has_aes_hardware(); }

int roam_aead_seal(const void *ctx, const uint8_t *nonce, const uint8_t *ad, size_t ad_length,
                   uint8_t *text, size_t length, uint8_t *tag) {
    size_t tag_length = 0;
    int ok = EVP_AEAD_CTX_seal_scatter((const EVP_AEAD_CTX *)ctx, text, tag, &tag_length, 16, nonce, 12, text, length,
                                       NULL, 0, ad, ad_length);
    return ok == 1 && tag_length == 16;
}

int roam_aead_open(const void *ctx, const uint8_t *nonce, const uint8_t *ad, size_t ad_length,
                   uint8_t *text, size_t length, const uint8_t *tag) {
    return EVP_AEAD_CTX_open_gather((const EVP_AEAD_CTX *)ctx, text, nonce, 12, text, length, tag, 16, ad, ad_length) == 1;
}

int roam_aead_open_to(const void *ctx, const uint8_t *nonce, const uint8_t *ad, size_t ad_length,
                      const uint8_t *text, size_t length, const uint8_t *tag, uint8_t *out) {
    return EVP_AEAD_CTX_open_gather((const EVP_AEAD_CTX *)ctx, out, nonce, 12, text, length, tag, 16, ad, ad_length) == 1;
}

int roam_hkdf_expand(int hash, const uint8_t *prk, size_t prk_length, const uint8_t *info, size_t info_length,
                     uint8_t *out, size_t out_length) {
    const EVP_MD *digest;
    switch (hash) {
    case ROAM_HASH_SHA256: digest = EVP_sha256(); break;
    case ROAM_HASH_SHA384: digest = EVP_sha384(); break;
    default: return 0;
    }
    return HKDF_expand(out, out_length, digest, prk, prk_length, info, info_length) == 1;
}

// BoringSSL's hook for encapsulating with given randomness (FIPS 203's m), which only test
// vectors use; it lives in its internal C++ interface, so it is declared here. It returns an
// int-sized enum that is not a failure indication.
struct BCM_mlkem768_public_key;
int CCryptoBoringSSL_BCM_mlkem768_encap_external_entropy(uint8_t *out_ciphertext, uint8_t *out_shared_secret,
                                                        const struct BCM_mlkem768_public_key *key, const uint8_t *entropy);

int roam_mlkem_generate(uint8_t *public_key, void *private_key, const uint8_t *seed) {
    struct MLKEM768_private_key *key = private_key;
    if (!seed) {
        MLKEM768_generate_key(public_key, NULL, key);
        return 1;
    }
    if (MLKEM768_private_key_from_seed(key, seed, MLKEM_SEED_BYTES) != 1) return 0;
    struct MLKEM768_public_key derived;
    MLKEM768_public_from_private(&derived, key);
    CBB out;
    size_t written = 0;
    int ok = CBB_init_fixed(&out, public_key, MLKEM768_PUBLIC_KEY_BYTES) && MLKEM768_marshal_public_key(&out, &derived)
        && CBB_finish(&out, NULL, &written) && written == MLKEM768_PUBLIC_KEY_BYTES;
    OPENSSL_cleanse(&derived, sizeof derived);
    return ok;
}

int roam_mlkem_encapsulate(uint8_t *ciphertext, uint8_t *shared, const uint8_t *public_key, const uint8_t *entropy) {
    struct MLKEM768_public_key parsed;
    CBS input;
    CBS_init(&input, public_key, MLKEM768_PUBLIC_KEY_BYTES);
    if (MLKEM768_parse_public_key(&parsed, &input) != 1 || CBS_len(&input) != 0) return 0;
    if (entropy) {
        (void)CCryptoBoringSSL_BCM_mlkem768_encap_external_entropy(ciphertext, shared,
                                                                   (const struct BCM_mlkem768_public_key *)&parsed, entropy);
    } else {
        MLKEM768_encap(ciphertext, shared, &parsed);
    }
    OPENSSL_cleanse(&parsed, sizeof parsed);
    return 1;
}

int roam_mlkem_decapsulate(uint8_t *shared, const uint8_t *ciphertext, size_t length, const void *private_key) {
    return MLKEM768_decap(shared, ciphertext, length, (const struct MLKEM768_private_key *)private_key) == 1;
}
