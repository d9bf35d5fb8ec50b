#ifndef ROAM_COPENSSL_H
#define ROAM_COPENSSL_H
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <string.h>
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
    // The gateway's side of the stream transport, and the client's ALPN.
    const SSL_METHOD *(*TLS_server_method)(void);
    void (*SSL_set_accept_state)(SSL *);
    int (*SSL_set_alpn_protos)(SSL *, const unsigned char *, unsigned int);
    void (*SSL_CTX_set_alpn_select_cb)(SSL_CTX *, SSL_CTX_alpn_select_cb_func, void *);
    int (*SSL_select_next_proto)(unsigned char **, unsigned char *, const unsigned char *, unsigned int,
                                 const unsigned char *, unsigned int);
    int (*SSL_CTX_use_certificate)(SSL_CTX *, X509 *);
    int (*SSL_CTX_use_PrivateKey)(SSL_CTX *, EVP_PKEY *);
    int (*SSL_CTX_use_certificate_chain_file)(SSL_CTX *, const char *);
    int (*SSL_CTX_use_PrivateKey_file)(SSL_CTX *, const char *, int);
    int (*SSL_CTX_check_private_key)(const SSL_CTX *);
    int (*SSL_pending)(const SSL *);
    EVP_PKEY *(*EVP_PKEY_Q_keygen)(OSSL_LIB_CTX *, const char *, const char *, ...);
    void (*EVP_PKEY_free)(EVP_PKEY *);
    X509 *(*X509_new)(void);
    int (*X509_set_version)(X509 *, long);
    ASN1_INTEGER *(*X509_get_serialNumber)(X509 *);
    int (*ASN1_INTEGER_set)(ASN1_INTEGER *, long);
    ASN1_TIME *(*X509_gmtime_adj)(ASN1_TIME *, long);
    ASN1_TIME *(*X509_getm_notBefore)(const X509 *);
    ASN1_TIME *(*X509_getm_notAfter)(const X509 *);
    int (*X509_set_pubkey)(X509 *, EVP_PKEY *);
    X509_NAME *(*X509_get_subject_name)(const X509 *);
    int (*X509_NAME_add_entry_by_txt)(X509_NAME *, const char *, int, const unsigned char *, int, int, int);
    int (*X509_set_issuer_name)(X509 *, const X509_NAME *);
    int (*X509_sign)(X509 *, EVP_PKEY *, const EVP_MD *);
    int (*SSL_has_pending)(const SSL *);
    int (*SSL_CTX_set_ciphersuites)(SSL_CTX *, const char *);
    const SSL_CIPHER *(*SSL_get_current_cipher)(const SSL *);
    const char *(*SSL_CIPHER_get_name)(const SSL_CIPHER *);
    // The stream transport's record layer takes over from libssl once the handshake is done.
    void (*SSL_CTX_set_keylog_callback)(SSL_CTX *, SSL_CTX_keylog_cb_func);
    int (*SSL_set_ex_data)(SSL *, int, void *);
    void *(*SSL_get_ex_data)(const SSL *, int);
    int (*SSL_CTX_set_num_tickets)(SSL_CTX *, size_t);
    int (*SSL_key_update)(SSL *, int);
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
        "TLS_server_method", "SSL_set_accept_state", "SSL_set_alpn_protos", "SSL_CTX_set_alpn_select_cb",
        "SSL_select_next_proto", "SSL_CTX_use_certificate", "SSL_CTX_use_PrivateKey",
        "SSL_CTX_use_certificate_chain_file", "SSL_CTX_use_PrivateKey_file", "SSL_CTX_check_private_key", "SSL_pending",
        "EVP_PKEY_Q_keygen", "EVP_PKEY_free", "X509_new", "X509_set_version", "X509_get_serialNumber",
        "ASN1_INTEGER_set", "X509_gmtime_adj", "X509_getm_notBefore", "X509_getm_notAfter", "X509_set_pubkey",
        "X509_get_subject_name", "X509_NAME_add_entry_by_txt", "X509_set_issuer_name", "X509_sign", "SSL_has_pending",
        "SSL_CTX_set_ciphersuites", "SSL_get_current_cipher", "SSL_CIPHER_get_name",
        "SSL_CTX_set_keylog_callback", "SSL_set_ex_data", "SSL_get_ex_data", "SSL_CTX_set_num_tickets", "SSL_key_update",
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
/// `SSL_set_mode(ssl, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER)`: a
/// write on a full socket says how much went, and what is left may be offered again from
/// another buffer.
static inline void COpenSSL_partial_writes(const COpenSSL_API *api, SSL *ssl) {
    api->SSL_ctrl(ssl, SSL_CTRL_MODE, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER, NULL);
}
/// `SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION)`.
static inline int COpenSSL_require_tls13(const COpenSSL_API *api, SSL_CTX *ctx) {
    return (int)api->SSL_CTX_ctrl(ctx, SSL_CTRL_SET_MIN_PROTO_VERSION, TLS1_3_VERSION, NULL);
}

/// The gateway answers a client's ALPN as a web server without HTTP/2 would: http/1.1 when
/// offered, else no protocol.
static inline int COpenSSL_select_http11(SSL *ssl, const unsigned char **out, unsigned char *outlen, const unsigned char *in,
                                  unsigned int inlen, void *arg) {
    (void)ssl;
    const COpenSSL_API *api = (const COpenSSL_API *)arg;
    static const unsigned char mine[] = "\x08http/1.1";
    unsigned char *chosen = NULL;
    if (api->SSL_select_next_proto(&chosen, outlen, mine, sizeof(mine) - 1, in, inlen) != OPENSSL_NPN_NEGOTIATED) {
        return SSL_TLSEXT_ERR_NOACK;
    }
    *out = chosen;
    return SSL_TLSEXT_ERR_OK;
}
static inline void COpenSSL_answer_alpn(const COpenSSL_API *api, SSL_CTX *ctx) {
    api->SSL_CTX_set_alpn_select_cb(ctx, COpenSSL_select_http11, (void *)api);
}

/// The TLS 1.3 application traffic secrets of one session (RFC 8446 7.1), as libssl derives them
/// during the handshake; lengths 0 until then. The stream transport's record layer protects
/// what follows the handshake with them, one direction per thread, where libssl would serialise
/// both directions on one lock.
typedef struct {
    unsigned char client[64];
    unsigned char server[64];
    size_t client_length;
    size_t server_length;
} COpenSSL_Secrets;

/// libssl's key log hook: keeps the two application traffic secrets in the `COpenSSL_Secrets`
/// that the session's ex data 0 points at (none: nothing is kept). The line, which libssl wipes
/// after the call, is never copied anywhere else.
static inline void COpenSSL_keep_secrets(const SSL *ssl, const char *line) {
    const COpenSSL_API *api = COpenSSL_library();
    if (api == NULL) return;
    COpenSSL_Secrets *secrets = (COpenSSL_Secrets *)api->SSL_get_ex_data(ssl, 0);
    if (secrets == NULL) return;
    static const char client[] = "CLIENT_TRAFFIC_SECRET_0 ", server[] = "SERVER_TRAFFIC_SECRET_0 ";
    unsigned char *out;
    size_t *length;
    if (strncmp(line, client, sizeof client - 1) == 0) {
        out = secrets->client;
        length = &secrets->client_length;
    } else if (strncmp(line, server, sizeof server - 1) == 0) {
        out = secrets->server;
        length = &secrets->server_length;
    } else {
        return;
    }
    // The label, the client random in hex, then the secret in hex.
    const char *hex = strchr(line + sizeof client - 1, ' ');
    if (hex == NULL) return;
    hex++;
    size_t n = 0;
    for (; hex[0] != 0 && hex[1] != 0 && n < sizeof secrets->client; hex += 2, n++) {
        int value = 0;
        for (int k = 0; k < 2; k++) {
            char c = hex[k];
            int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
            if (digit < 0) {
                memset(out, 0, sizeof secrets->client);
                *length = 0;
                return;
            }
            value = value * 16 + digit;
        }
        out[n] = (unsigned char)value;
    }
    *length = hex[0] == 0 ? n : 0;
}
static inline void COpenSSL_log_secrets(const COpenSSL_API *api, SSL_CTX *ctx) {
    api->SSL_CTX_set_keylog_callback(ctx, COpenSSL_keep_secrets);
}

/// A fresh P-256 key and a self-signed certificate for `name` (a year from yesterday, serial
/// `serial`), used by `ctx`. Nothing checks it: the tunnel's own handshake authenticates the
/// gateway. 1 when done.
static inline int COpenSSL_use_self_signed(const COpenSSL_API *api, SSL_CTX *ctx, const char *name, long serial) {
    EVP_PKEY *key = api->EVP_PKEY_Q_keygen(NULL, NULL, "EC", "P-256");
    if (key == NULL) return 0;
    X509 *cert = api->X509_new();
    int ok = cert != NULL && api->X509_set_version(cert, 2) == 1
        && api->ASN1_INTEGER_set(api->X509_get_serialNumber(cert), serial) == 1
        && api->X509_gmtime_adj(api->X509_getm_notBefore(cert), -86400) != NULL
        && api->X509_gmtime_adj(api->X509_getm_notAfter(cert), 365L * 86400) != NULL
        && api->X509_set_pubkey(cert, key) == 1
        && api->X509_NAME_add_entry_by_txt(api->X509_get_subject_name(cert), "CN", MBSTRING_ASC,
                                           (const unsigned char *)name, -1, -1, 0) == 1
        && api->X509_set_issuer_name(cert, api->X509_get_subject_name(cert)) == 1
        && api->X509_sign(cert, key, api->EVP_sha256()) > 0
        && api->SSL_CTX_use_certificate(ctx, cert) == 1 && api->SSL_CTX_use_PrivateKey(ctx, key) == 1;
    if (cert != NULL) api->X509_free(cert);
    api->EVP_PKEY_free(key);
    return ok;
}

#endif
