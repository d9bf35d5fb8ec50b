import COpenSSL
import Glibc
import Device
import Basics

/// What went wrong on a stream, in words for the log and the status.
public struct StreamError: Error, Equatable, CustomStringConvertible {
    public var description: String

    public init(_ description: String) { self.description = description }

    /// `what` with libssl's own reason, when it queued one.
    static func library(_ what: String, _ api: UnsafePointer<COpenSSL_API>) -> StreamError {
        var text = what
        let code = api.pointee.ERR_get_error()
        if code != 0 {
            var buffer = [CChar](repeating: 0, count: 256)
            api.pointee.ERR_error_string_n(code, &buffer, buffer.count)
            text += " (" + String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self) + ")"
        }
        api.pointee.ERR_clear_error()
        return StreamError(text)
    }
}

/// libssl's functions, or the error that says it cannot be had. libssl writes to its socket
/// with write(2), so a peer that closed would end the process with SIGPIPE: ignored from the
/// first stream on, as every program that gives libssl a socket must (the agent ignores it anyway).
func openSSL() throws(StreamError) -> UnsafePointer<COpenSSL_API> {
    guard let api = COpenSSL_library() else { throw StreamError("cannot load libssl.so.3 (Debian's libssl3 package)") }
    signal(SIGPIPE, SIG_IGN)
    return api
}

/// A TLS context for one side of the stream transport; the one owner of its `SSL_CTX`.
///
/// TLS here is a disguise, not the security: a network that lets only TLS out sees TLS 1.3 to
/// port 443 with the gateway's name and a browser's ALPN. The tunnel's own handshake inside
/// authenticates the gateway by its pinned key, so the client checks no certificate, and a
/// middlebox that intercepts TLS gets nothing it could use.
public final class TLSContext: @unchecked Sendable {  // libssl's SSL_CTX is safe to share once set up, which init finishes
    let api: UnsafePointer<COpenSSL_API>
    let context: OpaquePointer
    /// The client's side: the name it sends as SNI, nil for none (an address is never sent).
    let serverName: String?

    private init(api: UnsafePointer<COpenSSL_API>, context: OpaquePointer, serverName: String?) {
        self.api = api
        self.context = context
        self.serverName = serverName
    }

    deinit { api.pointee.SSL_CTX_free(context) }

    /// The client's context: TLS 1.3, SNI `serverName` when it is a name.
    public static func client(serverName: String?) throws(StreamError) -> TLSContext {
        let api = try openSSL()
        guard let context = api.pointee.SSL_CTX_new(api.pointee.TLS_client_method()) else {
            throw .library("cannot make a TLS context", api)
        }
        let made = TLSContext(api: api, context: context, serverName: serverName.flatMap { IPAddress($0) == nil ? $0 : nil })
        guard COpenSSL_require_tls13(api, context) == 1 else { throw .library("cannot require TLS 1.3", api) }
        try offerSuites(api, context)
        COpenSSL_log_secrets(api, context)
        return made
    }

    /// TLS 1.3's suites in a browser's order, AES-128-GCM first: libssl's own default puts
    /// AES-256-GCM first, which no browser does. (The tunnel's own AEAD protects what the stream
    /// carries; TLS's cipher is there to look like TLS.)
    static let suites = "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256"

    private static func offerSuites(_ api: UnsafePointer<COpenSSL_API>, _ context: OpaquePointer) throws(StreamError) {
        guard api.pointee.SSL_CTX_set_ciphersuites(context, suites) == 1 else { throw .library("cannot set the TLS 1.3 suites", api) }
    }

    /// The gateway's context: TLS 1.3 with the certificate chain and key in the files given (PEM;
    /// a public CA's makes the gateway look like any web server), or else a self-signed P-256
    /// certificate for `name` made now, since nothing checks it.
    public static func server(name: String, certificate: (chain: String, key: String)? = nil) throws(StreamError) -> TLSContext {
        let api = try openSSL()
        guard let context = api.pointee.SSL_CTX_new(api.pointee.TLS_server_method()) else {
            throw .library("cannot make a TLS context", api)
        }
        let made = TLSContext(api: api, context: context, serverName: nil)
        guard COpenSSL_require_tls13(api, context) == 1 else { throw .library("cannot require TLS 1.3", api) }
        try offerSuites(api, context)
        if let certificate {
            guard api.pointee.SSL_CTX_use_certificate_chain_file(context, certificate.chain) == 1 else {
                throw .library("cannot read the TLS certificate chain in \(certificate.chain)", api)
            }
            guard api.pointee.SSL_CTX_use_PrivateKey_file(context, certificate.key, SSL_FILETYPE_PEM) == 1,
                  api.pointee.SSL_CTX_check_private_key(context) == 1
            else {
                throw .library("cannot use the TLS key in \(certificate.key) with \(certificate.chain)", api)
            }
        } else {
            var serial: Int = 0
            withUnsafeMutableBytes(of: &serial) { arc4random_buf($0.baseAddress!, $0.count) }
            guard COpenSSL_use_self_signed(api, context, name, serial & Int.max) == 1 else {
                throw .library("cannot make a certificate for \(name)", api)
            }
        }
        COpenSSL_answer_alpn(api, context)
        COpenSSL_log_secrets(api, context)
        // No session tickets: libssl would send them after the handshake, under the keys the
        // record layer takes over (and no client resumes a session).
        guard api.pointee.SSL_CTX_set_num_tickets(context, 0) == 1 else { throw .library("cannot turn session tickets off", api) }
        return made
    }
}

/// A TLS session's handshake on a connected, non-blocking TCP socket, either side; the one owner
/// of its `SSL` and of the traffic secrets libssl derives. Once the handshake is done, the
/// stream's own record layer takes over (`recordProtection`, `FramedStream`). libssl reads no
/// record ahead, so nothing past the handshake is left in its buffers. Not for two threads at
/// once: its owner serialises every call.
final class TLSChannel: @unchecked Sendable {  // called only under its owner's lock (or before it has one), one call at a time
    let context: TLSContext
    private let ssl: OpaquePointer
    let connection: TCPConnection
    /// The server's side.
    let accepting: Bool
    /// Where libssl's key log hook puts the application traffic secrets (`COpenSSL_keep_secrets`).
    private let secrets: UnsafeMutablePointer<COpenSSL_Secrets>
    private var api: COpenSSL_API { context.api.pointee }

    /// What a call did.
    enum Outcome: Equatable {
        /// This many bytes went (read or written); the handshake is done when 0 after a handshake.
        case done(Int)
        /// Nothing can go until the socket is readable.
        case wantRead
        /// Nothing can go until the socket is writable.
        case wantWrite
        /// The session is over: the peer closed it or it failed.
        case closed(String)
    }

    init(_ context: TLSContext, over connection: TCPConnection, accepting: Bool) throws(StreamError) {
        self.context = context
        self.connection = connection
        self.accepting = accepting
        let api = context.api
        secrets = .allocate(capacity: 1)
        secrets.initialize(to: COpenSSL_Secrets())
        guard let ssl = api.pointee.SSL_new(context.context) else {
            secrets.deallocate()
            throw .library("cannot make a TLS session", api)
        }
        self.ssl = ssl
        guard api.pointee.SSL_set_ex_data(ssl, 0, secrets) == 1 else { throw .library("cannot attach the session's secrets", api) }
        guard api.pointee.SSL_set_fd(ssl, connection.fileDescriptor) == 1 else {
            throw .library("cannot give the socket to the TLS session", api)
        }
        COpenSSL_partial_writes(api, ssl)
        if accepting {
            api.pointee.SSL_set_accept_state(ssl)
        } else {
            if let name = context.serverName, COpenSSL_set_host_name(api, ssl, name) != 1 {
                throw .library("cannot send \(name) as SNI", api)
            }
            // As a browser offers them.
            let alpn: [UInt8] = [2] + Array("h2".utf8) + [8] + Array("http/1.1".utf8)
            guard api.pointee.SSL_set_alpn_protos(ssl, alpn, UInt32(alpn.count)) == 0 else {
                throw .library("cannot offer ALPN", api)
            }
            api.pointee.SSL_set_connect_state(ssl)
        }
    }

    deinit {
        api.SSL_free(ssl)
        wipeSecrets()
        secrets.deallocate()
    }

    private func wipeSecrets() { memset(secrets, 0, MemoryLayout<COpenSSL_Secrets>.size) }

    /// The record layer's protection for each direction, from the traffic secrets of the
    /// finished handshake (which are wiped here: this is called once), or why there can be none.
    func recordProtection() throws(StreamError) -> (suite: String, sending: RecordProtection, receiving: RecordProtection) {
        defer { wipeSecrets() }
        guard let name = suite, let suite = RecordSuite(name: name) else {
            throw StreamError("TLS: the handshake chose no suite the stream can carry (\(self.suite ?? "none"))")
        }
        guard !hasPending else { throw StreamError("TLS: libssl holds bytes past the handshake") }
        let base = UnsafeRawPointer(secrets)
        let layout = MemoryLayout<COpenSSL_Secrets>.self
        let client = UnsafeRawBufferPointer(start: base + layout.offset(of: \.client)!, count: min(64, secrets.pointee.client_length))
        let server = UnsafeRawBufferPointer(start: base + layout.offset(of: \.server)!, count: min(64, secrets.pointee.server_length))
        guard !client.isEmpty, !server.isEmpty else { throw StreamError("TLS: libssl gave no traffic secrets") }
        let (mine, theirs) = accepting ? (server, client) : (client, server)
        let sending = try RecordProtection(suite, secret: mine)
        let receiving = try RecordProtection(suite, secret: theirs)
        return (name, sending, receiving)
    }

    /// A step of the handshake; `.done(0)` once it is complete.
    func handshake() -> Outcome {
        outcome(of: "TLS handshake") { api.SSL_do_handshake(ssl) }.map { _ in 0 }
    }

    /// Decrypted bytes into `buffer`, through libssl's own record layer (the reference the
    /// stream's record layer is tested against).
    func read(into buffer: UnsafeMutableRawBufferPointer) -> Outcome {
        outcome(of: "TLS read") { api.SSL_read(ssl, buffer.baseAddress, Int32(clamping: buffer.count)) }
    }

    /// Bytes out through libssl's own record layer; `.done(n)` may be fewer than given (the socket filled), and the rest must be
    /// offered again, first, before anything else.
    func write(_ bytes: UnsafeRawBufferPointer) -> Outcome {
        outcome(of: "TLS write") { api.SSL_write(ssl, bytes.baseAddress, Int32(clamping: bytes.count)) }
    }

    /// Asks libssl to send a key update with its next write, `requested`: asking the other side
    /// for one back (libssl's own record layer, the reference the stream's is tested against).
    func updateKeys(requested: Bool) -> Bool { api.SSL_key_update(ssl, requested ? SSL_KEY_UPDATE_REQUESTED : SSL_KEY_UPDATE_NOT_REQUESTED) == 1 }

    /// The TLS suite the handshake chose (`TLS_AES_128_GCM_SHA256`); nil before it is done.
    var suite: String? {
        guard let cipher = api.SSL_get_current_cipher(ssl), let name = api.SSL_CIPHER_get_name(cipher) else { return nil }
        return String(cString: name)
    }

    /// Whether libssl holds bytes a poll of the socket would not show: decrypted ones, or
    /// records read ahead and not yet decrypted.
    var hasPending: Bool { api.SSL_has_pending(ssl) == 1 }

    private func outcome(of what: String, _ call: () -> Int32) -> Outcome {
        api.ERR_clear_error()
        errno = 0
        let result = call()
        if result > 0 { return .done(Int(result)) }
        switch api.SSL_get_error(ssl, result) {
        case SSL_ERROR_NONE: return .done(0)
        case SSL_ERROR_WANT_READ: return .wantRead
        case SSL_ERROR_WANT_WRITE: return .wantWrite
        case SSL_ERROR_ZERO_RETURN: return .closed("the other side closed the stream")
        case SSL_ERROR_SYSCALL where errno == 0: return .closed("\(what): the connection was closed")
        case SSL_ERROR_SYSCALL: return .closed("\(what): \(String(cString: strerror(errno)))")
        default: return .closed(StreamError.library("\(what) failed", context.api).description)
        }
    }
}

extension TLSChannel.Outcome {
    func map(_ transform: (Int) -> Int) -> Self {
        if case .done(let n) = self { return .done(transform(n)) }
        return self
    }
}
