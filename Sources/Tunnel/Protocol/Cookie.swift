import CSodium
import Basics
import Device

/// Cookies: WireGuard's proof that an initiation's sender receives at its address (WireGuard
/// paper, §5.4.7), so that a flood from spoofed sources costs the server one MAC each and never a
/// Diffie-Hellman or an Argon2id.
///
/// The server, under load or before it would spend an Argon2id check, answers an initiation
/// that carries no valid mac2 with a cookie reply instead of a handshake. The cookie is a MAC of
/// the source's address and port under a secret that changes every two minutes, so the server
/// keeps no state per source. The client puts the cookie into mac2 of the same initiation and
/// sends it again: only a sender that got the reply at that address can do so.
enum Cookie {
    /// Bytes in a cookie.
    static let length = 16
    /// How long a server's secret lasts; a cookie is good under the current and the previous one.
    static let secretLifetime: Duration = .seconds(120)
    /// How long a client uses a cookie: a little under the secret's lifetime.
    static let clientLifetime: Duration = .seconds(110)

    /// The key that seals cookie replies: HASH("cookie--" || server public key). Public, like
    /// mac1's; what keeps the reply from being forged is the initiation's mac1 bound into it.
    static func replyKey(serverKey: PublicKey) -> [UInt8] { Primitives.hash(Array("cookie--".utf8), serverKey.bytes) }

    /// Writes mac2 of `initiation` (a MAC under `cookie` of everything before it) into its last 16 bytes.
    static func stamp(_ initiation: inout [UInt8], cookie: [UInt8]) {
        let covered = initiation.count - Initiation.macLength
        let mac = initiation.withUnsafeBytes { MAC.compute(key: cookie, over: UnsafeRawBufferPointer(rebasing: $0[..<covered])) }
        initiation.replaceSubrange(covered..., with: mac)
    }

    /// The initiation's mac1, which a cookie reply binds itself to.
    static func mac1(of initiation: UnsafeRawBufferPointer) -> [UInt8] {
        let start = initiation.count - Initiation.macsLength
        return Array(initiation[start..<(start + Initiation.macLength)])
    }
}

/// Cookie reply layout (64 bytes):
///
///     0   header (version, 5, 0, 0)
///     4   receiver index: the initiation's sender index (u32 LE)
///     8   nonce (24, random)
///     32  the cookie (16), sealed with XChaCha20-Poly1305 under `Cookie.replyKey`, the
///         initiation's mac1 as associated data (16-byte tag)
enum CookieReply {
    static let length = 64
    static let receiverOffset = 4
    static let nonceOffset = 8
    static let nonceLength = Int(crypto_aead_xchacha20poly1305_ietf_NPUBBYTES)
    static let sealedOffset = 32

    /// The reply to an initiation from `receiver` whose mac1 is `mac1`.
    static func seal(cookie: [UInt8], receiver: UInt32, mac1: [UInt8], key: [UInt8]) -> [UInt8] {
        var reply = Wire.header(.cookieReply) + withUnsafeBytes(of: receiver.littleEndian) { Array($0) }
            + [UInt8](repeating: 0, count: length - 8)
        reply.withUnsafeMutableBytes { out in
            let base = out.baseAddress!.assumingMemoryBound(to: UInt8.self)
            randombytes_buf(base + nonceOffset, nonceLength)
            var sealedLength: UInt64 = 0
            _ = crypto_aead_xchacha20poly1305_ietf_encrypt(
                base + sealedOffset, &sealedLength, cookie, UInt64(cookie.count), mac1, UInt64(mac1.count), nil,
                base + nonceOffset, key)
        }
        return reply
    }

    /// The cookie inside `reply`; nil unless it authenticates under `key` with `mac1` bound in.
    static func open(_ reply: UnsafeRawBufferPointer, mac1: [UInt8], key: [UInt8]) -> [UInt8]? {
        guard reply.count == length else { return nil }
        var cookie = [UInt8](repeating: 0, count: Cookie.length)
        var cookieLength: UInt64 = 0
        let base = reply.baseAddress!.assumingMemoryBound(to: UInt8.self)
        let status = crypto_aead_xchacha20poly1305_ietf_decrypt(
            &cookie, &cookieLength, nil, base + sealedOffset, UInt64(length - sealedOffset), mac1, UInt64(mac1.count),
            base + nonceOffset, key)
        return status == 0 ? cookie : nil
    }
}

/// The server's cookies: a secret drawn at random every two minutes, and the cookie of a source
/// computed from it on demand (no state per source). The secrets live in the secret arena: with
/// one, anyone could make mac2 for any address.
struct CookieJar {
    private let replyKey: [UInt8]
    private var secret = CookieJar.freshSecret()
    private var drawnAt: Instant?
    private var previous: (secret: SecretBytes, drawnAt: Instant)?

    init(serverKey: PublicKey) { replyKey = Cookie.replyKey(serverKey: serverKey) }

    /// True when `initiation` (whose mac1 was checked) carries the mac2 of a cookie this server
    /// gave `source` from a secret less than two lifetimes old: a cookie is good for two to four minutes.
    mutating func isProven(_ initiation: UnsafeRawBufferPointer, from source: SocketAddress, now: Instant) -> Bool {
        rotate(now: now)
        let mac2Start = initiation.count - Initiation.macLength
        let mac2 = UnsafeRawBufferPointer(rebasing: initiation[mac2Start...])
        // A client without a cookie sends zeros: no MAC to compute.
        guard mac2.contains(where: { $0 != 0 }) else { return false }
        let covered = UnsafeRawBufferPointer(rebasing: initiation[..<mac2Start])
        if MAC.verify(key: Self.cookie(for: source, secret: secret), over: covered, mac: mac2) { return true }
        guard let previous, now - previous.drawnAt < Cookie.secretLifetime * 2 else { return false }
        return MAC.verify(key: Self.cookie(for: source, secret: previous.secret), over: covered, mac: mac2)
    }

    /// The cookie reply that answers `initiation` from `source`.
    mutating func reply(to initiation: UnsafeRawBufferPointer, from source: SocketAddress, now: Instant) -> [UInt8] {
        rotate(now: now)
        let receiver = initiation.loadLittleEndian(UInt32.self, at: Initiation.senderOffset)
        var reply = CookieReply.seal(
            cookie: Self.cookie(for: source, secret: secret), receiver: receiver, mac1: Cookie.mac1(of: initiation), key: replyKey)
        // In the initiation's version (the sender index sits at the same offset in both), so
        // the client reads it; the header is not sealed, the initiation's mac1 is what binds it.
        reply[0] = initiation[0]
        return reply
    }

    private mutating func rotate(now: Instant) {
        guard let drawnAt else {
            self.drawnAt = now
            return
        }
        guard now - drawnAt >= Cookie.secretLifetime else { return }
        previous = (secret, drawnAt)
        secret = Self.freshSecret()
        self.drawnAt = now
    }

    /// The cookie of `source`: MAC(secret, address || port).
    private static func cookie(for source: SocketAddress, secret: SecretBytes) -> [UInt8] {
        let port = withUnsafeBytes(of: source.port.bigEndian) { Array($0) }
        let identity = source.ip.bytes + port
        return secret.withBytes { key in
            identity.withUnsafeBytes { MAC.compute(key: UnsafeRawBufferPointer(start: key, count: SecretBytes.count), over: $0) }
        }
    }

    private static func freshSecret() -> SecretBytes { SecretBytes { randombytes_buf($0, SecretBytes.count) } }
}

/// The client's side: the newest cookie the server gave, used in mac2 while it is fresh.
struct CookieHolder {
    private let replyKey: [UInt8]
    private var cookie: [UInt8]?
    private var receivedAt: Instant?

    init(serverKey: PublicKey) { replyKey = Cookie.replyKey(serverKey: serverKey) }

    /// Keeps the cookie in `reply` to the initiation whose mac1 is `mac1`; false when the reply
    /// does not authenticate.
    mutating func accept(_ reply: UnsafeRawBufferPointer, mac1: [UInt8], now: Instant) -> Bool {
        guard let opened = CookieReply.open(reply, mac1: mac1, key: replyKey) else { return false }
        cookie = opened
        receivedAt = now
        return true
    }

    /// Stamps mac2 with the cookie while it is fresh; zeros otherwise.
    func stamp(_ initiation: inout [UInt8], now: Instant) {
        guard let cookie, let receivedAt, now - receivedAt < Cookie.clientLifetime else { return }
        Cookie.stamp(&initiation, cookie: cookie)
    }
}
