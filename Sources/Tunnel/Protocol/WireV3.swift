import CBoring

/// Version 3's handshake messages on the wire (docs/PROTOCOL.md, "Version 3"). Data, session
/// unknown and cookie replies keep version 2's layouts with the version byte 3.
enum WireV3 {
    static let version: UInt8 = 3

    /// The second header byte in version 3.
    enum Kind: UInt8 {
        /// Client to server: the initiation's first part, the ephemeral ML-KEM key.
        case kemKey = 1
        /// Server to client: its ephemeral key, the KEM ciphertext, the sealed choice.
        case response = 2
        case data = 3
        case sessionUnknown = 4
        case cookieReply = 5
        /// Client to server: the initiation's second part, the ephemeral X25519 key and the offer.
        case initiationRest = 6
        /// Client to server: its static key and credentials, sealed.
        case identity = 7
        /// Server to client: the verdict, sealed.
        case verdict = 8

        /// Datagram lengths this kind may have.
        var lengths: ClosedRange<Int> {
            switch self {
            case .kemKey: KEMKeyPart.length...KEMKeyPart.length
            case .initiationRest: RestPart.length...RestPart.length
            case .response: ResponseV3.length...ResponseV3.length
            case .identity: Identity.minLength...Identity.maxLength
            case .verdict: Verdict.minLength...Verdict.maxLength
            case .data: DataPacket.overhead...Wire.maxDatagram
            case .sessionUnknown: SessionUnknown.length...SessionUnknown.length
            case .cookieReply: CookieReply.length...CookieReply.length
            }
        }
    }

    /// The kind of a version 3 datagram, once the header and the length fit it; otherwise why not.
    static func kind(of datagram: UnsafeRawBufferPointer) -> Result<Kind, DropReason> {
        guard datagram.count >= Wire.headerLength else { return .failure(.malformed) }
        guard datagram[0] == version else { return .failure(.unsupportedVersion) }
        guard datagram[2] == 0, datagram[3] == 0, let kind = Kind(rawValue: datagram[1]) else { return .failure(.malformed) }
        guard kind.lengths.contains(datagram.count) else { return .failure(.malformed) }
        // The credentials are padded to whole 64-byte blocks.
        if kind == .identity, (datagram.count - Identity.minLength) % 64 != 0 { return .failure(.malformed) }
        return .success(kind)
    }

    static func header(_ kind: Kind) -> [UInt8] { [version, kind.rawValue, 0, 0] }

    /// The initiation's first part:
    ///
    ///     0     header (3, 1, 0, 0)
    ///     4     sender index: the client's index for the new session (u32 LE)
    ///     8     the ephemeral ML-KEM-768 encapsulation key (1,184)
    ///     1192  mac1 (16), 1208 mac2 (16), as an initiation's in version 2
    enum KEMKeyPart {
        static let senderOffset = 4
        static let keyOffset = 8
        static let length = keyOffset + MLKEM.publicKeyLength + Initiation.macsLength
    }

    /// The initiation's second part:
    ///
    ///     0     header (3, 6, 0, 0)
    ///     4     sender index (the first part's)
    ///     8     ephemeral X25519 public key (32)
    ///     40    the sealed offer (16 + 16)
    ///     72    mac1 (16), 88 mac2 (16)
    enum RestPart {
        static let senderOffset = 4
        static let ephemeralOffset = 8
        static let offerOffset = 40
        static let length = offerOffset + Offer.length + HybridHandshake.tag + Initiation.macsLength
    }

    /// The response:
    ///
    ///     0     header (3, 2, 0, 0)
    ///     4     sender index: the server's index for the new session (u32 LE)
    ///     8     receiver index: the client's (u32 LE)
    ///     12    ephemeral X25519 public key (32)
    ///     44    ML-KEM-768 ciphertext (1,088)
    ///     1132  the sealed choice (16 + 16)
    enum ResponseV3 {
        static let senderOffset = 4
        static let receiverOffset = 8
        static let ephemeralOffset = 12
        static let ciphertextOffset = 44
        static let choiceOffset = ciphertextOffset + MLKEM.ciphertextLength
        static let length = choiceOffset + Choice.length + HybridHandshake.tag
    }

    /// The identity:
    ///
    ///     0     header (3, 7, 0, 0)
    ///     4     receiver index: the server's, from the response (u32 LE)
    ///     8     the sealed static key (32 + 16)
    ///     56    the sealed credentials (n + 16), n a multiple of 64, 256...512
    enum Identity {
        static let receiverOffset = 4
        static let keyOffset = 8
        static let payloadOffset = 56
        static let minLength = payloadOffset + Credentials.minPadded + HybridHandshake.tag
        static let maxLength = payloadOffset + Credentials.paddedLength(2 + 255 + 255) + HybridHandshake.tag
    }

    /// The verdict:
    ///
    ///     0     header (3, 8, 0, 0)
    ///     4     sender index: the server's (u32 LE)
    ///     8     receiver index: the client's (u32 LE)
    ///     12    the sealed response payload (version 2's: 22 + options, + 16)
    enum Verdict {
        static let senderOffset = 4
        static let receiverOffset = 8
        static let payloadOffset = 12
        static let minLength = payloadOffset + ResponsePayload.length + HybridHandshake.tag
        static let maxLength = payloadOffset + 256 + HybridHandshake.tag
    }

    /// What the client can seal with and prefers:
    ///
    ///     0     suites: bit 0 ChaCha20-Poly1305, bit 1 AES-256-GCM
    ///     1     the preferred suite (its number)
    ///     2     flags: bit 0 the client has AES in hardware
    ///     3     13 reserved bytes, zero when sent, ignored when read
    struct Offer: Equatable {
        static let length = 16
        var suites: Set<CipherSuite>
        var preferred: CipherSuite
        var aesHardware: Bool

        func encoded() -> [UInt8] {
            var bytes = [UInt8](repeating: 0, count: Self.length)
            for suite in suites { bytes[0] |= 1 << (suite.rawValue - 1) }
            bytes[1] = preferred.rawValue
            bytes[2] = aesHardware ? 1 : 0
            return bytes
        }

        /// Nil when it offers no suite or prefers one it does not offer; unknown suite bits
        /// (a later revision's) are ignored.
        init?(decoding bytes: [UInt8]) {
            guard bytes.count == Self.length else { return nil }
            suites = Set(CipherSuite.allCases.filter { bytes[0] & (1 << ($0.rawValue - 1)) != 0 })
            guard let preferred = CipherSuite(rawValue: bytes[1]), suites.contains(preferred) else { return nil }
            self.preferred = preferred
            aesHardware = bytes[2] & 1 != 0
        }

        init(suites: Set<CipherSuite>, preferred: CipherSuite, aesHardware: Bool) {
            self.suites = suites
            self.preferred = preferred
            self.aesHardware = aesHardware
        }
    }

    /// The server's choice: byte 0 the suite (0: none in common), 15 reserved zero bytes.
    struct Choice: Equatable {
        static let length = 16
        var suite: CipherSuite?

        func encoded() -> [UInt8] { [suite?.rawValue ?? 0] + [UInt8](repeating: 0, count: Self.length - 1) }

        /// Nil when the suite is one this build does not know (the server chose from the offer,
        /// so that would be a broken server).
        init?(decoding bytes: [UInt8]) {
            guard bytes.count == Self.length else { return nil }
            if bytes[0] == 0 {
                suite = nil
            } else {
                guard let suite = CipherSuite(rawValue: bytes[0]) else { return nil }
                self.suite = suite
            }
        }

        init(suite: CipherSuite?) { self.suite = suite }
    }

    /// The identity's payload: version 2's credentials without the timestamp.
    ///
    ///     0     U: username length, 0 = none
    ///     1     P: password length, 0 = none
    ///     2     username (U bytes), then password (P bytes)
    ///     ..    zero padding to a multiple of 64 bytes, at least 256
    enum Credentials {
        static let minPadded = 256
        static func paddedLength(_ n: Int) -> Int { max(minPadded, (n + 63) / 64 * 64) }

        /// The plaintext to seal; the caller wipes it once sealed.
        static func encoded(username: [UInt8]?, password: SecretBuffer?) -> [UInt8] {
            let user = username ?? []
            let passLength = password?.count ?? 0
            var bytes = [UInt8](repeating: 0, count: paddedLength(2 + user.count + passLength))
            bytes[0] = UInt8(user.count)
            bytes[1] = UInt8(passLength)
            bytes.replaceSubrange(2..<2 + user.count, with: user)
            bytes.withUnsafeMutableBytes { out in
                password?.withBytes { pass in
                    if let base = pass.baseAddress { (out.baseAddress! + 2 + user.count).copyMemory(from: base, byteCount: pass.count) }
                }
            }
            return bytes
        }

        /// The username and the password (copied into a buffer of its own); nil when the
        /// lengths overrun the payload.
        static func decode(_ bytes: SecretBuffer) -> (username: [UInt8]?, password: SecretBuffer?)? {
            let parsed = bytes.withBytes { raw -> ([UInt8]?, Range<Int>?)? in
                guard raw.count >= 2 else { return nil }
                let userLength = Int(raw[0]), passLength = Int(raw[1])
                guard raw.count >= 2 + userLength + passLength else { return nil }
                return (userLength == 0 ? nil : Array(raw[2..<2 + userLength]),
                        passLength == 0 ? nil : (2 + userLength)..<(2 + userLength + passLength))
            }
            guard let (username, range) = parsed else { return nil }
            guard let range else { return (username, nil) }
            guard let password = bytes.slice(range) else { return nil }
            return (username, password)
        }
    }

    /// What the server seals with, given the client's `offer`: the suite its operator `pinned`
    /// when the client offers it (else none: the handshake ends), otherwise AES-256-GCM when
    /// both sides have AES in hardware and the client offers it, else ChaCha20-Poly1305 when
    /// offered, else whatever the client offers.
    static func choose(_ offer: Offer, pinned: CipherSuite?, serverHasAES: Bool = CipherSuite.aesInHardware) -> CipherSuite? {
        if let pinned { return offer.suites.contains(pinned) ? pinned : nil }
        if serverHasAES, offer.aesHardware, offer.suites.contains(.aes256GCM) { return .aes256GCM }
        if offer.suites.contains(.chacha20Poly1305) { return .chacha20Poly1305 }
        return offer.suites.contains(.aes256GCM) ? .aes256GCM : nil
    }
}

extension CipherSuite {
    /// Whether this machine has AES in hardware, as BoringSSL uses it.
    static let aesInHardware = roam_has_aes_hardware() == 1
}
