public import Basics

/// Every datagram starts with the same 4-byte header:
///
///     0       1       2       3
///     version type    reserved (zero)
///
/// Multi-byte integers are little-endian except inside TAI64N labels and IP addresses.
enum Wire {
    /// The protocol version this build speaks.
    static let version: UInt8 = 2
    /// The Noise prologue. It names the version, so a transcript of one version can never
    /// complete as another's: both sides hash it before the first message.
    static let prologue = Array("roam protocol version 2".utf8)
    static let headerLength = 4
    /// The largest datagram either side reads: the largest UDP payload.
    static let maxDatagram = 65_535

    /// The message type, once the header and the length fit it; otherwise why not.
    static func messageType(of datagram: UnsafeRawBufferPointer) -> Result<MessageType, DropReason> {
        guard datagram.count >= headerLength else { return .failure(.malformed) }
        guard datagram[0] == version else { return .failure(.unsupportedVersion) }
        guard datagram[2] == 0, datagram[3] == 0, let type = MessageType(rawValue: datagram[1]) else {
            return .failure(.malformed)
        }
        guard type.lengths.contains(datagram.count) else { return .failure(.malformed) }
        return .success(type)
    }

    /// The header for `type`.
    static func header(_ type: MessageType) -> [UInt8] { [version, type.rawValue, 0, 0] }
}

/// The second header byte.
enum MessageType: UInt8 {
    /// Client to server: Noise IK message 1, credentials and timestamp inside, mac1 outside.
    case initiation = 1
    /// Server to client: Noise IK message 2, the verdict and inner addresses inside.
    case response = 2
    /// Either way: an encrypted inner IP packet, keepalive or control message.
    case data = 3
    /// Server to client, unauthenticated: "I hold no session for the index you used".
    case sessionUnknown = 4
    /// Server to client, under load or before a password check: a cookie that proves, once
    /// used in mac2, that the client receives at its address.
    case cookieReply = 5

    /// Datagram lengths this type may have.
    var lengths: ClosedRange<Int> {
        switch self {
        case .initiation: Initiation.minLength...Initiation.maxLength
        case .response: Response.minLength...Response.maxLength
        case .data: DataPacket.overhead...Wire.maxDatagram
        case .sessionUnknown: SessionUnknown.length...SessionUnknown.length
        case .cookieReply: CookieReply.length...CookieReply.length
        }
    }
}

/// Handshake initiation layout:
///
///     0   header (version, 1, 0, 0)
///     4   sender index: the client's index for the new session (u32 LE)
///     8   ephemeral public key (32)
///     40  encrypted static public key (32 + 16 tag)
///     88  encrypted payload (n + 16 tag), n padded to a multiple of 64, at least 256
///     -32 mac1 (16): over everything before it
///     -16 mac2 (16): over everything before it, keyed with a cookie; zero without one
enum Initiation {
    static let senderOffset = 4
    static let noiseOffset = 8
    static let ephemeralOffset = 8
    static let macLength = 16
    /// mac1 and mac2.
    static let macsLength = 2 * macLength
    /// The payload before padding: timestamp, two lengths, username and password of 0...255 bytes.
    static let minPayload = TAI64N.length + 2
    static let maxPayload = paddedLength(minPayload + 255 + 255)
    static let minLength = noiseOffset + NoiseIK.initiationOverhead + minPayload + macsLength
    static let maxLength = noiseOffset + NoiseIK.initiationOverhead + maxPayload + macsLength

    /// Payloads are padded to 64-byte blocks so the length of a username and password barely shows,
    /// and to at least `minPaddedPayload`, so that the response may be as long as it can be.
    static func paddedLength(_ n: Int) -> Int { max(minPaddedPayload, (n + 63) / 64 * 64) }
    /// An initiation this long (392 bytes) leaves room for the longest response (316 bytes): the
    /// server never answers with more bytes than it got, so it cannot amplify a spoofed flood.
    static let minPaddedPayload = 256
}

/// mac1, WireGuard's cheap filter: HMAC-SHA256 over the initiation up to the MAC, keyed with
/// HASH("mac1----" || server public key) and truncated to 16 bytes. Anyone who knows the server's
/// public key can compute it, so it proves nothing about the sender; it lets the server discard
/// random and misdirected packets before any Diffie-Hellman, and a scan cannot confirm that a
/// server exists without its public key.
/// Package-visible for the protocol's fuzzer, which stamps mutated handshake messages so they
/// reach what lies behind the check.
package struct Mac1 {
    private let key: [UInt8]

    package init(serverKey: PublicKey) { key = Primitives.hash(Array("mac1----".utf8), serverKey.bytes) }

    /// Writes mac1 of `initiation` into its place (mac2 stays as it is).
    package func stamp(_ initiation: inout [UInt8]) {
        let covered = initiation.count - Initiation.macsLength
        let mac = initiation.withUnsafeBytes { MAC.compute(key: key, over: UnsafeRawBufferPointer(rebasing: $0[..<covered])) }
        initiation.replaceSubrange(covered..<(covered + Initiation.macLength), with: mac)
    }

    /// True when `initiation` carries the right mac1.
    func verify(_ initiation: UnsafeRawBufferPointer) -> Bool {
        let covered = initiation.count - Initiation.macsLength
        guard covered > 0 else { return false }
        return MAC.verify(key: key, over: UnsafeRawBufferPointer(rebasing: initiation[..<covered]),
                          mac: UnsafeRawBufferPointer(rebasing: initiation[covered..<(covered + Initiation.macLength)]))
    }
}

/// HMAC-SHA256 truncated to 16 bytes, the size of mac1, mac2 and a cookie.
enum MAC {
    static func compute(key: [UInt8], over covered: UnsafeRawBufferPointer) -> [UInt8] {
        key.withUnsafeBytes { compute(key: $0, over: covered) }
    }

    static func compute(key: UnsafeRawBufferPointer, over covered: UnsafeRawBufferPointer) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: Primitives.hashLength)
        out.withUnsafeMutableBufferPointer { Primitives.hmac(key: key, [covered], into: $0.baseAddress!) }
        return Array(out.prefix(Initiation.macLength))
    }

    /// True when `mac` is the MAC of `covered`, compared in constant time.
    static func verify(key: [UInt8], over covered: UnsafeRawBufferPointer, mac: UnsafeRawBufferPointer) -> Bool {
        compute(key: key, over: covered).withUnsafeBytes { Primitives.constantTimeEqual($0, mac) }
    }
}

/// The initiation's encrypted payload:
///
///     0   timestamp (TAI64N, 12)
///     12  username length U (0 = none)
///     13  password length P (0 = none)
///     14  username (U bytes, UTF-8), then password (P bytes, UTF-8)
///     ..  zero padding to a multiple of 64 bytes, at least 256
struct InitiationPayload {
    var timestamp: TAI64N
    var username: [UInt8]?
    /// Shared, never copied: a wipe by any holder clears the one buffer.
    var password: SecretBuffer?

    /// The plaintext to encrypt; the caller wipes it once sent.
    func encoded() -> [UInt8] {
        let user = username ?? []
        let passLength = password?.count ?? 0
        var bytes = [UInt8](repeating: 0, count: Initiation.paddedLength(TAI64N.length + 2 + user.count + passLength))
        bytes.replaceSubrange(0..<TAI64N.length, with: timestamp.bytes)
        bytes[TAI64N.length] = UInt8(user.count)
        bytes[TAI64N.length + 1] = UInt8(passLength)
        bytes.replaceSubrange(14..<14 + user.count, with: user)
        bytes.withUnsafeMutableBytes { out in
            password?.withBytes { pass in
                if let base = pass.baseAddress { (out.baseAddress! + 14 + user.count).copyMemory(from: base, byteCount: pass.count) }
            }
        }
        return bytes
    }

    /// Nil when the lengths overrun the payload or the timestamp is not a TAI64N label. The
    /// password is copied into a buffer of its own; `bytes` stays the caller's to wipe.
    init?(decoding bytes: SecretBuffer) {
        let parsed = bytes.withBytes { raw -> (TAI64N, [UInt8]?, Range<Int>?)? in
            guard raw.count >= Initiation.minPayload,
                  let timestamp = TAI64N(bytes: Array(raw[0..<TAI64N.length])[...])
            else { return nil }
            let userLength = Int(raw[12])
            let passLength = Int(raw[13])
            guard raw.count >= Initiation.minPayload + userLength + passLength else { return nil }
            let user = userLength == 0 ? nil : Array(raw[14..<14 + userLength])
            return (timestamp, user, passLength == 0 ? nil : (14 + userLength)..<(14 + userLength + passLength))
        }
        guard let (timestamp, username, passwordRange) = parsed else { return nil }
        self.timestamp = timestamp
        self.username = username
        if let passwordRange {
            guard let password = bytes.slice(passwordRange) else { return nil }
            self.password = password
        }
    }

    init(timestamp: TAI64N, username: [UInt8]?, password: SecretBuffer?) {
        self.timestamp = timestamp
        self.username = username
        self.password = password
    }
}

/// Handshake response layout:
///
///     0   header (version, 2, 0, 0)
///     4   sender index: the server's index for the new session (u32 LE)
///     8   receiver index: the client's index from the initiation (u32 LE)
///     12  ephemeral public key (32)
///     44  encrypted payload (22 + options + 16 tag)
enum Response {
    static let senderOffset = 4
    static let receiverOffset = 8
    static let noiseOffset = 12
    static let minLength = noiseOffset + NoiseIK.responseOverhead + ResponsePayload.length
    /// Room for options after the fixed payload (234 bytes).
    static let maxLength = noiseOffset + NoiseIK.responseOverhead + 256
}

/// The response's encrypted payload:
///
///     0   verdict: 0 accepted, 1 rejected (unknown user, wrong key or wrong password; which is not said)
///     1   flags: bit 0 an IPv4 address follows, bit 1 an IPv6 address follows
///     2   IPv4 inner address (4, zero when absent)
///     6   IPv6 inner address (16, zero when absent)
///     22  options until the end: type (1), length (1), value; see `DNSSettings.Option`
struct ResponsePayload: Equatable {
    static let length = 22
    var accepted: Bool
    var addresses: [IPAddress]
    /// The resolvers and search domains pushed for the tunnel, or why those received are unusable.
    var dns: Result<DNSSettings, DNSSettingsError>
    /// The server echoes padded probes padded alike (`Features.sizedEchoes`).
    var sizedEchoes = false
    /// The server takes the client's path MTU notices (`Features.pathMTUNotices`).
    var pathMTUNotices = false

    /// The payload, with the DNS options only when the whole response stays within `limit` bytes
    /// (the initiation's length): a client too old to pad its initiation could not read them anyway.
    func encoded(limit: Int = Response.maxLength) -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: Self.length)
        bytes[0] = accepted ? 0 : 1
        for address in addresses {
            switch address {
            case .v4:
                bytes[1] |= 1
                bytes.replaceSubrange(2..<6, with: address.bytes)
            case .v6:
                bytes[1] |= 2
                bytes.replaceSubrange(6..<22, with: address.bytes)
            }
        }
        // The features first: three bytes, within every initiation's room.
        let features = (sizedEchoes ? Features.sizedEchoes : 0) | (pathMTUNotices ? Features.pathMTUNotices : 0)
        if features != 0, Response.minLength + 3 <= limit { bytes += [Features.option, 1, features] }
        if case .success(let settings) = dns {
            let options = settings.encoded()
            if Response.minLength + (bytes.count - Self.length) + options.count <= limit { bytes += options }
        }
        return bytes
    }

    /// The response option that says what this server does beyond revision 2's protocol; a
    /// client of an earlier revision skips it as an unknown option.
    enum Features {
        static let option: UInt8 = 3
        /// The server echoes a padded probe padded alike (path MTU discovery).
        static let sizedEchoes: UInt8 = 1
        /// The server takes path MTU notices and keeps what it sends the client within them,
        /// answering bigger packets as a router would (revision 3).
        static let pathMTUNotices: UInt8 = 2

        /// The feature bits in the response's options (zero when they do not say).
        static func decode(_ options: ArraySlice<UInt8>) -> UInt8 {
            DNSSettings.options(options)?.first { $0.type == option }?.value.first ?? 0
        }
    }

    init(accepted: Bool, addresses: [IPAddress], dns: DNSSettings = .none) {
        self.accepted = accepted
        self.addresses = addresses
        self.dns = .success(dns)
    }

    /// Nil when the fixed part is malformed; options that are not are reported in `dns`, and the
    /// session stands without them.
    init?(decoding bytes: [UInt8]) {
        guard bytes.count >= Self.length, bytes[0] <= 1, bytes[1] & ~3 == 0 else { return nil }
        accepted = bytes[0] == 0
        addresses = []
        if bytes[1] & 1 != 0, let v4 = IPAddress(bytes: bytes[2..<6]) { addresses.append(v4) }
        if bytes[1] & 2 != 0, let v6 = IPAddress(bytes: bytes[6..<22]) { addresses.append(v6) }
        dns = DNSSettings.decode(bytes[Self.length...])
        let features = Features.decode(bytes[Self.length...])
        sizedEchoes = features & Features.sizedEchoes != 0
        pathMTUNotices = features & Features.pathMTUNotices != 0
    }
}

/// Data packet layout, the only message on the hot path:
///
///     0   header (version, 3, 0, 0)
///     4   receiver index: the index the receiving side chose for this session (u32 LE)
///     8   counter: the sender's message number, also the AEAD nonce (u64 LE)
///     16  ciphertext of the inner packet (n bytes)
///     16+n  Poly1305 tag (16)
///
/// The 16-byte header is the AEAD's associated data. Sealing and opening work in place: a
/// buffer holds `headroom` spare bytes, the inner packet, then `tailroom` spare bytes.
public enum DataPacket {
    /// Bytes before the inner packet in a sealed datagram.
    public static let headroom = 16
    /// Bytes after the inner packet in a sealed datagram.
    public static let tailroom = Primitives.tagLength
    /// Bytes a datagram adds to its inner packet.
    public static let overhead = headroom + tailroom
    /// The largest inner packet a datagram can carry.
    public static let maxInnerLength = Wire.maxDatagram - overhead

    static let receiverOffset = 4
    static let counterOffset = 8

    /// `packet` framed for sealing: zeroed headroom, the packet, zeroed tailroom.
    public static func frame(_ packet: some Collection<UInt8>) -> [UInt8] {
        var buffer = [UInt8](repeating: 0, count: headroom)
        buffer.reserveCapacity(packet.count + overhead)
        buffer += packet
        buffer += [UInt8](repeating: 0, count: tailroom)
        return buffer
    }
}

/// Session-unknown hint layout:
///
///     0   header (version, 4, 0, 0)
///     4   the receiver index the server did not recognise (u32 LE)
enum SessionUnknown {
    static let length = 8

    /// The hint for a data packet to `index`, in the packet's `version` (the client reads its own).
    static func encode(index: UInt32, version: UInt8 = Wire.version) -> [UInt8] {
        [version] + Wire.header(.sessionUnknown).dropFirst() + withUnsafeBytes(of: index.littleEndian) { Array($0) }
    }
}

/// Control messages ride inside data packets. An IP packet's first nibble is 4 or 6, so a first
/// byte of zero cannot be one; an empty plaintext is a keepalive.
///
///     0   zero
///     1   kind: 1 probe, 2 echo, 3 close (the client is going away: forget its sessions),
///         4 drain (server to client: this server is being taken down; move to another)
///     2   probe id (u64 LE), chosen by the prober; zero in a close
///     10  the prober's clock when it sent the probe, in nanoseconds (i64 LE); echoed unchanged
///     18  a probe or an echo only: zeros, padding it to the size of the tunnel packet it stands
///         for (path MTU discovery); the echo of a padded probe is padded alike
enum Control {
    static let length = 18
    static let probe: UInt8 = 1
    static let echo: UInt8 = 2
    static let close: UInt8 = 3
    static let drain: UInt8 = 4
    /// The client's path MTU (revision 3): the largest inner packet its path carries, in the id
    /// field; the server acknowledges with the same message.
    static let pathMTU: UInt8 = 5
    /// What a path MTU notice may say: IPv4's minimum datagram up to the largest IPv6 packet.
    static let pathMTURange = 576...65535

    static func encode(kind: UInt8, id: UInt64, sentAt: Instant, paddedTo size: Int = length) -> [UInt8] {
        var bytes = [0, kind] + withUnsafeBytes(of: id.littleEndian) { Array($0) }
            + withUnsafeBytes(of: sentAt.nanoseconds.littleEndian) { Array($0) }
        if size > length { bytes += repeatElement(0, count: size - length) }
        return bytes
    }
}

/// What an authenticated plaintext turned out to be.
enum InnerContent: Equatable {
    case keepalive
    case packet(source: IPAddress)
    /// `size`: the plaintext's length, padding included.
    case probe(id: UInt64, sentAt: Instant, size: Int)
    case echo(id: UInt64, sentAt: Instant, size: Int)
    case close
    case drain
    /// The largest inner packet the client's path carries (`Control.pathMTU`).
    case pathMTU(Int)
    case malformed

    init(_ plaintext: UnsafeRawBufferPointer) {
        guard let first = plaintext.first else {
            self = .keepalive
            return
        }
        if first != 0 {
            self = InnerPacket.source(of: plaintext).map { .packet(source: $0) } ?? .malformed
            return
        }
        let kind = plaintext.count > 1 ? plaintext[1] : 0
        let padded = kind == Control.probe || kind == Control.echo
        guard plaintext.count == Control.length
                || (padded && plaintext.count > Control.length && plaintext[Control.length...].allSatisfy { $0 == 0 })
        else {
            self = .malformed
            return
        }
        let id = plaintext.loadLittleEndian(UInt64.self, at: 2)
        let sentAt = Instant(nanoseconds: Int64(bitPattern: plaintext.loadLittleEndian(UInt64.self, at: 10)))
        switch kind {
        case Control.probe: self = .probe(id: id, sentAt: sentAt, size: plaintext.count)
        case Control.echo: self = .echo(id: id, sentAt: sentAt, size: plaintext.count)
        case Control.close: self = .close
        case Control.drain: self = .drain
        case Control.pathMTU where Control.pathMTURange.contains(Int(clamping: id)):
            self = .pathMTU(Int(id))
        default: self = .malformed
        }
    }
}

/// Addresses in an inner IPv4 or IPv6 header, read without allocating, for routing by inner
/// destination and for checking that a client sends only from its own inner address.
public enum InnerPacket {
    /// The source address; nil when the bytes are not an IPv4 or IPv6 header.
    public static func source(of packet: UnsafeRawBufferPointer) -> IPAddress? {
        address(in: packet, v4Offset: 12, v6Offset: 8)
    }

    /// The destination address; nil when the bytes are not an IPv4 or IPv6 header.
    public static func destination(of packet: UnsafeRawBufferPointer) -> IPAddress? {
        address(in: packet, v4Offset: 16, v6Offset: 24)
    }

    private static func address(in packet: UnsafeRawBufferPointer, v4Offset: Int, v6Offset: Int) -> IPAddress? {
        guard let first = packet.first else { return nil }
        switch first >> 4 {
        case 4 where packet.count >= 20:
            return .v4(packet.loadBigEndian(UInt32.self, at: v4Offset))
        case 6 where packet.count >= 40:
            return .v6(packet.loadBigEndian(UInt64.self, at: v6Offset), packet.loadBigEndian(UInt64.self, at: v6Offset + 8))
        default:
            return nil
        }
    }
}

extension Array where Element == UInt8 {
    /// `withUnsafeMutableBytes` for a body that throws a typed error, which `rethrows` would erase.
    mutating func withMutableBytes<R, E: Error>(_ body: (UnsafeMutableRawBufferPointer) throws(E) -> R) throws(E) -> R {
        let result: Result<R, E> = withUnsafeMutableBytes { buffer in
            do throws(E) {
                return .success(try body(buffer))
            } catch {
                return .failure(error)
            }
        }
        return try result.get()
    }
}
