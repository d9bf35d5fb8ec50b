#ifndef ROAM_CLIBPQ_H
#define ROAM_CLIBPQ_H
#include <dlfcn.h>
#include <stddef.h>
#include <postgresql/libpq-fe.h>

// libpq is loaded when a gateway reads its users from PostgreSQL, not when the agent starts: a
// client, or a gateway with its users in its file, never maps it and the libraries it brings
// (Kerberos, LDAP). The header gives the types and constants; every call goes through a pointer
// that dlsym found, so nothing here links against the library.

/// The libpq functions the user directory calls.
typedef struct {
    PGconn *(*PQconnectdb)(const char *);
    ConnStatusType (*PQstatus)(const PGconn *);
    char *(*PQerrorMessage)(const PGconn *);
    void (*PQfinish)(PGconn *);
    PGresult *(*PQexec)(PGconn *, const char *);
    ExecStatusType (*PQresultStatus)(const PGresult *);
    char *(*PQresultErrorMessage)(const PGresult *);
    int (*PQntuples)(const PGresult *);
    int (*PQnfields)(const PGresult *);
    char *(*PQgetvalue)(const PGresult *, int, int);
    int (*PQgetisnull)(const PGresult *, int, int);
    void (*PQclear)(PGresult *);
    int (*PQsocket)(const PGconn *);
    int (*PQconsumeInput)(PGconn *);
    PGnotify *(*PQnotifies)(PGconn *);
    void (*PQfreemem)(void *);
    PGresult *(*PQexecParams)(PGconn *, const char *, int, const Oid *, const char *const *, const int *, const int *, int);
    PQnoticeProcessor (*PQsetNoticeProcessor)(PGconn *, PQnoticeProcessor, void *);
    char *(*PQresultErrorField)(const PGresult *, int);
} CLibpq_API;

/// Fills `api` from libpq.so.5; 0 when it or one of the functions is missing.
static inline int CLibpq_load(CLibpq_API *api) {
    void *library = dlopen("libpq.so.5", RTLD_NOW | RTLD_LOCAL);
    if (library == NULL) return 0;
    void **slots = (void **)api;
    static const char *const names[] = {
        "PQconnectdb", "PQstatus", "PQerrorMessage", "PQfinish", "PQexec", "PQresultStatus", "PQresultErrorMessage",
        "PQntuples", "PQnfields", "PQgetvalue", "PQgetisnull", "PQclear", "PQsocket", "PQconsumeInput", "PQnotifies",
        "PQfreemem", "PQexecParams", "PQsetNoticeProcessor", "PQresultErrorField",
    };
    _Static_assert(sizeof(names) / sizeof(names[0]) == sizeof(CLibpq_API) / sizeof(void *), "one name per function");
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        slots[i] = dlsym(library, names[i]);
        if (slots[i] == NULL) return 0;  // the library stays loaded; nothing is used
    }
    return 1;
}

/// Notices the server sends (a shutdown's FATAL, a warning) go nowhere: libpq would print them on
/// the agent's standard error, outside its log; what matters comes back as an error anyway.
static void CLibpq_ignoreNotice(void *argument, const char *message) {
    (void)argument;
    (void)message;
}

#endif
