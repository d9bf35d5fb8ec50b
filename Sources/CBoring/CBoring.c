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
