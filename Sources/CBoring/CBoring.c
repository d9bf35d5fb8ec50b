#include "CBoring.h"
#include <string.h>

typedef struct evp_aead_st EVP_AEAD;
const EVP_AEAD *CCryptoBoringSSL_EVP_aead_aes_256_gcm(void);
const EVP_AEAD *CCryptoBoringSSL_EVP_aead_chacha20_poly1305(void);
int CCryptoBoringSSL_EVP_AEAD_CTX_init(void *ctx, const EVP_AEAD *aead, const uint8_t *key, size_t key_len,
                                       size_t tag_len, void *engine);
void CCryptoBoringSSL_EVP_AEAD_CTX_cleanup(void *ctx);
int CCryptoBoringSSL_EVP_AEAD_CTX_seal_scatter(const void *ctx, uint8_t *out, uint8_t *out_tag, size_t *out_tag_len,
                                               size_t max_out_tag_len, const uint8_t *nonce, size_t nonce_len,
                                               const uint8_t *in, size_t in_len, const uint8_t *extra_in,
                                               size_t extra_in_len, const uint8_t *ad, size_t ad_len);
int CCryptoBoringSSL_EVP_AEAD_CTX_open_gather(const void *ctx, uint8_t *out, const uint8_t *nonce, size_t nonce_len,
                                              const uint8_t *in, size_t in_len, const uint8_t *in_tag,
                                              size_t in_tag_len, const uint8_t *ad, size_t ad_len);

int roam_aead_init(void *ctx, int kind, const uint8_t *key) {
    const EVP_AEAD *aead;
    switch (kind) {
    case ROAM_AEAD_CHACHA20_POLY1305: aead = CCryptoBoringSSL_EVP_aead_chacha20_poly1305(); break;
    case ROAM_AEAD_AES_256_GCM: aead = CCryptoBoringSSL_EVP_aead_aes_256_gcm(); break;
    default: return 0;
    }
    memset(ctx, 0, ROAM_AEAD_SIZE);
    if (CCryptoBoringSSL_EVP_AEAD_CTX_init(ctx, aead, key, 32, 16, NULL) != 1) return 0;
    // The context's first field is the AEAD it was set up for: a layout that moved shows here.
    const EVP_AEAD *stored;
    memcpy(&stored, ctx, sizeof stored);
    return stored == aead;
}

void roam_aead_cleanup(void *ctx) { CCryptoBoringSSL_EVP_AEAD_CTX_cleanup(ctx); }

int CCryptoBoringSSL_EVP_has_aes_hardware(void);
int roam_has_aes_hardware(void) { return CCryptoBoringSSL_EVP_has_aes_hardware(); }

int roam_aead_seal(const void *ctx, const uint8_t *nonce, const uint8_t *ad, size_t ad_length,
                   uint8_t *text, size_t length, uint8_t *tag) {
    size_t tag_length = 0;
    int ok = CCryptoBoringSSL_EVP_AEAD_CTX_seal_scatter(ctx, text, tag, &tag_length, 16, nonce, 12, text, length,
                                                        NULL, 0, ad, ad_length);
    return ok == 1 && tag_length == 16;
}

int roam_aead_open(const void *ctx, const uint8_t *nonce, const uint8_t *ad, size_t ad_length,
                   uint8_t *text, size_t length, const uint8_t *tag) {
    return CCryptoBoringSSL_EVP_AEAD_CTX_open_gather(ctx, text, nonce, 12, text, length, tag, 16, ad, ad_length) == 1;
}

// ML-KEM-768. The MLKEM768_* functions are BoringSSL's public API; the two BCM_* ones with
// external randomness are its own test hooks (their return value, an int-sized enum, is not
// a failure indication). CBS is BoringSSL's read-only byte string.
typedef struct { const uint8_t *data; size_t len; } roam_cbs;
struct roam_mlkem_public { union { uint8_t bytes[512 * (3 + 9) + 32 + 32]; uint16_t alignment; } opaque; };
void CCryptoBoringSSL_MLKEM768_generate_key(uint8_t *out_encoded_public_key, uint8_t *optional_out_seed, void *out_private_key);
int CCryptoBoringSSL_BCM_mlkem768_generate_key_external_seed(uint8_t *out_encoded_public_key, void *out_private_key,
                                                            const uint8_t *seed);
int CCryptoBoringSSL_MLKEM768_parse_public_key(struct roam_mlkem_public *out, roam_cbs *in);
void CCryptoBoringSSL_MLKEM768_encap(uint8_t *out_ciphertext, uint8_t *out_shared_secret, const struct roam_mlkem_public *key);
int CCryptoBoringSSL_BCM_mlkem768_encap_external_entropy(uint8_t *out_ciphertext, uint8_t *out_shared_secret,
                                                        const struct roam_mlkem_public *key, const uint8_t *entropy);
int CCryptoBoringSSL_MLKEM768_decap(uint8_t *out_shared_secret, const uint8_t *ciphertext, size_t ciphertext_len,
                                    const void *private_key);
void CCryptoBoringSSL_OPENSSL_cleanse(void *ptr, size_t len);

void roam_mlkem_generate(uint8_t *public_key, void *private_key, const uint8_t *seed) {
    if (seed) {
        (void)CCryptoBoringSSL_BCM_mlkem768_generate_key_external_seed(public_key, private_key, seed);
    } else {
        CCryptoBoringSSL_MLKEM768_generate_key(public_key, NULL, private_key);
    }
}

int roam_mlkem_encapsulate(uint8_t *ciphertext, uint8_t *shared, const uint8_t *public_key, const uint8_t *entropy) {
    struct roam_mlkem_public parsed;
    roam_cbs input = { public_key, ROAM_MLKEM_PUBLIC_BYTES };
    if (CCryptoBoringSSL_MLKEM768_parse_public_key(&parsed, &input) != 1 || input.len != 0) return 0;
    if (entropy) {
        (void)CCryptoBoringSSL_BCM_mlkem768_encap_external_entropy(ciphertext, shared, &parsed, entropy);
    } else {
        CCryptoBoringSSL_MLKEM768_encap(ciphertext, shared, &parsed);
    }
    CCryptoBoringSSL_OPENSSL_cleanse(&parsed, sizeof parsed);
    return 1;
}

int roam_mlkem_decapsulate(uint8_t *shared, const uint8_t *ciphertext, size_t length, const void *private_key) {
    return CCryptoBoringSSL_MLKEM768_decap(shared, ciphertext, length, private_key) == 1;
}
