import Basics
import COpenSSL
import Device
import Glibc

/// What went wrong in a TLS session, in words for the log.
struct TLSError: Error, CustomStringConvertible {
    var description: String

    init(_ what: String, library: Bool = true) {
        var text = what
        // libssl's own reason, when it queued one.
        if let api = COpenSSL_library()?.pointee {
            if library, case let code = api.ERR_get_error(), code != 0 {
                var buffer = [CChar](repeating: 0, count: 256)
                api.ERR_error_string_n(code, &buffer, buffer.count)
                text += " (" + String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self) + ")"
            }
            api.ERR_clear_error()
        }
        description = text
    }
}

/// A TLS client session over a connected, non-blocking TCP socket, through libssl: the
/// handshake, the server's key, and reads and writes, each bounded by a deadline. It checks
/// no certificate authority and no name: its caller pins the server's key instead. The one
/// owner of its libssl objects. libssl is loaded on the first session (`COpenSSL_library`).
final class TLSSession {
    private let api: UnsafePointer<COpenSSL_API>
    private let context: OpaquePointer
    private let ssl: OpaquePointer
    /// The socket the session reads and writes; kept open for as long as the session.
    private let connection: TCPConnection

    /// A session on `connection`, sending `serverName` as SNI when there is one (a name, never
    /// an address literal).
    init(over connection: TCPConnection, serverName: String?) throws(TLSError) {
        self.connection = connection
        guard let api = COpenSSL_library() else {
            throw TLSError("cannot load libssl.so.3 (Debian's libssl3 package)", library: false)
        }
        self.api = api
        let lib = api.pointee
        guard let context = lib.SSL_CTX_new(lib.TLS_client_method()) else { throw TLSError("cannot make a TLS context") }
        guard COpenSSL_require_tls12(api, context) == 1 else {
            lib.SSL_CTX_free(context)
            throw TLSError("cannot require TLS 1.2")
        }
        COpenSSL_ignore_unexpected_eof(api, context)
        guard let ssl = lib.SSL_new(context) else {
            lib.SSL_CTX_free(context)
            throw TLSError("cannot make a TLS session")
        }
        self.context = context
        self.ssl = ssl
        guard lib.SSL_set_fd(ssl, connection.fileDescriptor) == 1 else { throw TLSError("cannot give the socket to the TLS session") }
        if let serverName, COpenSSL_set_host_name(api, ssl, serverName) != 1 { throw TLSError("cannot send \(serverName) as SNI") }
        lib.SSL_set_connect_state(ssl)
    }

    deinit {
        api.pointee.SSL_free(ssl)
        api.pointee.SSL_CTX_free(context)
    }

    /// The handshake, done by `deadline`.
    func handshake(deadline: ContinuousClock.Instant) throws(TLSError) {
        _ = try step("TLS handshake", deadline: deadline) { api.pointee.SSL_do_handshake(ssl) }
    }

    /// The SHA-256 of the DER SubjectPublicKeyInfo of the server's certificate (the leaf's).
    func serverKeyHash() throws(TLSError) -> [UInt8] {
        let lib = api.pointee
        guard let certificate = lib.SSL_get1_peer_certificate(ssl) else {
            throw TLSError("the server showed no certificate", library: false)
        }
        defer { lib.X509_free(certificate) }
        guard let key = lib.X509_get_X509_PUBKEY(certificate) else { throw TLSError("the server's certificate has no public key") }
        let length = lib.i2d_X509_PUBKEY(key, nil)
        guard length > 0 else { throw TLSError("cannot encode the server's public key") }
        var der = [UInt8](repeating: 0, count: Int(length))
        let written = der.withUnsafeMutableBufferPointer { buffer -> Int32 in
            var cursor = buffer.baseAddress
            return lib.i2d_X509_PUBKEY(key, &cursor)
        }
        guard written == length else { throw TLSError("cannot encode the server's public key") }
        var hash = [UInt8](repeating: 0, count: 32)
        var size: UInt32 = 0
        guard lib.EVP_Digest(der, der.count, &hash, &size, lib.EVP_sha256(), nil) == 1, size == 32 else {
            throw TLSError("cannot hash the server's public key")
        }
        return hash
    }

    /// Writes all of `bytes` by `deadline`.
    func write(_ bytes: [UInt8], deadline: ContinuousClock.Instant) throws(TLSError) {
        var offset = 0
        while offset < bytes.count {
            let n = try step("TLS write", deadline: deadline) {
                bytes.withUnsafeBytes { api.pointee.SSL_write(ssl, $0.baseAddress! + offset, Int32($0.count - offset)) }
            }
            guard n > 0 else { throw TLSError("the server closed the session before the request was sent", library: false) }
            offset += Int(n)
        }
    }

    /// What the server sends until it closes, `limit` bytes are in, or `deadline` passes (what
    /// came so far, then).
    func read(limit: Int, deadline: ContinuousClock.Instant) throws(TLSError) -> [UInt8] {
        var received: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        while received.count < limit {
            let n: Int32
            do {
                let wanted = Int32(min(chunk.count, limit - received.count))
                n = try step("TLS read", deadline: deadline) { chunk.withUnsafeMutableBytes { api.pointee.SSL_read(ssl, $0.baseAddress, wanted) } }
            } catch where !received.isEmpty {
                break
            }
            guard n > 0 else { break }
            received += chunk[0..<Int(n)]
        }
        return received
    }

    /// Runs `call` until it goes through, waiting on the socket for what libssl wants; 0 when
    /// the peer closed the session.
    private func step(_ what: String, deadline: ContinuousClock.Instant, _ call: () -> Int32) throws(TLSError) -> Int32 {
        while true {
            api.pointee.ERR_clear_error()
            errno = 0
            let result = call()
            if result > 0 { return result }
            let events: Int32
            switch api.pointee.SSL_get_error(ssl, result) {
            case SSL_ERROR_WANT_READ: events = POLLIN
            case SSL_ERROR_WANT_WRITE: events = POLLOUT
            case SSL_ERROR_ZERO_RETURN: return 0
            case SSL_ERROR_SYSCALL where errno == 0: throw TLSError("\(what): the server closed the connection", library: false)
            case SSL_ERROR_SYSCALL: throw TLSError("\(what): \(String(cString: strerror(errno)))", library: false)
            default: throw TLSError("\(what) failed")
            }
            let left = deadline - .now
            guard left > .zero else { throw TLSError("\(what): no answer in time", library: false) }
            var pending = pollfd(fd: connection.fileDescriptor, events: Int16(events), revents: 0)
            let ready = poll(&pending, 1, Int32(clamping: left.nanoseconds / 1_000_000 + 1))
            if ready < 0, errno != EINTR { throw TLSError("\(what): poll: \(String(cString: strerror(errno)))", library: false) }
        }
    }
}
