#ifndef ROAM_COPENSSL_H
#define ROAM_COPENSSL_H
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <openssl/ssl.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/x509.h>

// libssl is loaded the first time a pinned probe runs, not when the agent starts: a client
// without such a rule never maps libssl and libcrypto (about 1.7 MB resident). The headers give
// the types and constants; every call goes through a pointer that dlsym found, so nothing here
// links against the libraries.

/// The libssl functions the probe calls, found in libssl.so.3 and the libcrypto it loads.
typedef struct {
    const SSL_METHOD *(*TLS_client_method)(void);
    SSL_CTX *(*SSL_CTX_new)(const SSL_METHOD *);
    void (*SSL_CTX_free)(SSL_CTX *);
    long (*SSL_CTX_ctrl)(SSL_CTX *, int, long, void *);
    uint64_t (*SSL_CTX_set_options)(SSL_CTX *, uint64_t);
    SSL *(*SSL_new)(SSL_CTX *);
    void (*SSL_free)(SSL *);
    long (*SSL_ctrl)(SSL *, int, long, void *);
    int (*SSL_set_fd)(SSL *, int);
    void (*SSL_set_connect_state)(SSL *);
    int (*SSL_do_handshake)(SSL *);
    int (*SSL_read)(SSL *, void *, int);
    int (*SSL_write)(SSL *, const void *, int);
    int (*SSL_get_error)(const SSL *, int);
    X509 *(*SSL_get1_peer_certificate)(const SSL *);
    void (*X509_free)(X509 *);
    X509_PUBKEY *(*X509_get_X509_PUBKEY)(const X509 *);
    int (*i2d_X509_PUBKEY)(const X509_PUBKEY *, unsigned char **);
    const EVP_MD *(*EVP_sha256)(void);
    int (*EVP_Digest)(const void *, size_t, unsigned char *, unsigned int *, const EVP_MD *, ENGINE *);
    void (*ERR_clear_error)(void);
    unsigned long (*ERR_get_error)(void);
    void (*ERR_error_string_n)(unsigned long, char *, size_t);
} COpenSSL_API;

/// Fills `api` from libssl.so.3; 0 when it or one of the functions is missing.
static inline int COpenSSL_load(COpenSSL_API *api) {
    void *library = dlopen("libssl.so.3", RTLD_NOW | RTLD_LOCAL);
    if (library == NULL) return 0;
    void **slots = (void **)api;
    static const char *const names[] = {
        "TLS_client_method", "SSL_CTX_new", "SSL_CTX_free", "SSL_CTX_ctrl", "SSL_CTX_set_options", "SSL_new",
        "SSL_free", "SSL_ctrl", "SSL_set_fd", "SSL_set_connect_state", "SSL_do_handshake", "SSL_read", "SSL_write",
        "SSL_get_error", "SSL_get1_peer_certificate", "X509_free", "X509_get_X509_PUBKEY", "i2d_X509_PUBKEY",
        "EVP_sha256", "EVP_Digest", "ERR_clear_error", "ERR_get_error", "ERR_error_string_n",
    };
    _Static_assert(sizeof(names) / sizeof(names[0]) == sizeof(COpenSSL_API) / sizeof(void *), "one name per function");
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        slots[i] = dlsym(library, names[i]);
        if (slots[i] == NULL) return 0;  // the library stays loaded; nothing is used
    }
    return 1;
}

/// libssl's functions, loaded on first use (one try, under a lock); NULL when libssl.so.3
/// cannot be loaded.
static inline const COpenSSL_API *COpenSSL_library(void) {
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    static COpenSSL_API api;
    static int tried, loaded;
    pthread_mutex_lock(&lock);
    if (!tried) {
        tried = 1;
        loaded = COpenSSL_load(&api);
    }
    pthread_mutex_unlock(&lock);
    return loaded ? &api : NULL;
}

// The macros of libssl's API that Swift cannot import, as functions.

/// `SSL_set_tlsext_host_name`: the name sent as SNI.
static inline int COpenSSL_set_host_name(const COpenSSL_API *api, SSL *ssl, const char *name) {
    return (int)api->SSL_ctrl(ssl, SSL_CTRL_SET_TLSEXT_HOSTNAME, TLSEXT_NAMETYPE_host_name, (void *)name);
}
/// `SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION)`.
static inline int COpenSSL_require_tls12(const COpenSSL_API *api, SSL_CTX *ctx) {
    return (int)api->SSL_CTX_ctrl(ctx, SSL_CTRL_SET_MIN_PROTO_VERSION, TLS1_2_VERSION, NULL);
}
/// `SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF)`: a server that closes without
/// close_notify has still said what it said.
static inline void COpenSSL_ignore_unexpected_eof(const COpenSSL_API *api, SSL_CTX *ctx) {
    api->SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF);
}

#endif
