#ifndef ROAM_COPENSSL_H
#define ROAM_COPENSSL_H
#include <openssl/ssl.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/x509.h>

// The macros of libssl's API that Swift cannot import, as functions.

/// Wraps `SSL_set_tlsext_host_name`: the name sent as SNI.
static inline int COpenSSL_set_host_name(SSL *ssl, const char *name) { return (int)SSL_set_tlsext_host_name(ssl, name); }
/// Wraps `SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION)`.
static inline int COpenSSL_require_tls12(SSL_CTX *ctx) { return (int)SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION); }
/// Wraps `SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF)`: a server that closes
/// without close_notify has still said what it said.
static inline void COpenSSL_ignore_unexpected_eof(SSL_CTX *ctx) { SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF); }

#endif
