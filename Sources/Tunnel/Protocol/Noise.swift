/// The Noise Protocol Framework (revision 34), as much of it as `Noise_IK_25519_ChaChaPoly_SHA256`
/// needs, named and ordered as in the specification so it can be checked line by line.

/// CipherState (spec §5.1): a key, or none, and a nonce.
struct CipherState {
    private(set) var key: SecretBytes?
    private(set) var nonce: UInt64 = 0

    /// InitializeKey: a fresh key (or none) with the nonce back at zero.
    init(key: SecretBytes? = nil) { self.key = key }

    /// EncryptWithAd: the plaintext itself while there is no key yet.
    mutating func encrypt(ad: [UInt8], _ plaintext: [UInt8]) -> [UInt8] {
        guard let key else { return plaintext }
        defer { nonce += 1 }
        return Primitives.seal(key: key, counter: nonce, ad: ad, plaintext: plaintext)
    }

    /// DecryptWithAd: nil when authentication fails, and then the nonce does not advance.
    mutating func decrypt(ad: [UInt8], _ ciphertext: [UInt8]) -> [UInt8]? {
        guard let key else { return ciphertext }
        guard let plaintext = Primitives.open(key: key, counter: nonce, ad: ad, ciphertext: ciphertext) else {
            return nil
        }
        nonce += 1
        return plaintext
    }
}

/// SymmetricState (spec §5.2): the chaining key, the handshake hash, and the current cipher.
struct SymmetricState {
    private var chainingKey: SecretBytes
    private(set) var hash: [UInt8]
    private var cipher = CipherState()

    /// InitializeSymmetric: a name of at most HASHLEN bytes is zero-padded, a longer one hashed.
    init(protocolName: String) {
        let name = Array(protocolName.utf8)
        hash = name.count <= Primitives.hashLength
            ? name + [UInt8](repeating: 0, count: Primitives.hashLength - name.count)
            : Primitives.hash(name)
        chainingKey = hash.withUnsafeBytes { SecretBytes(copying: $0) }
    }

    /// MixKey: derives a new chaining key and cipher key from `input` (a DH result).
    mutating func mixKey(_ input: SecretBytes) {
        let (chaining, key) = input.withBytes {
            Primitives.hkdf(chainingKey: chainingKey, input: UnsafeRawBufferPointer(start: $0, count: SecretBytes.count))
        }
        chainingKey = chaining
        cipher = CipherState(key: key)
    }

    /// MixHash: h = HASH(h || data).
    mutating func mixHash(_ data: [UInt8]) { hash = Primitives.hash(hash, data) }

    /// EncryptAndHash: encrypts with h as associated data, then mixes the ciphertext in.
    mutating func encryptAndHash(_ plaintext: [UInt8]) -> [UInt8] {
        let ciphertext = cipher.encrypt(ad: hash, plaintext)
        mixHash(ciphertext)
        return ciphertext
    }

    /// DecryptAndHash: nil when authentication fails.
    mutating func decryptAndHash(_ ciphertext: [UInt8]) -> [UInt8]? {
        guard let plaintext = cipher.decrypt(ad: hash, ciphertext) else { return nil }
        mixHash(ciphertext)
        return plaintext
    }

    /// Split: the two transport keys, initiator-to-responder first.
    func split() -> (SecretBytes, SecretBytes) {
        Primitives.hkdf(chainingKey: chainingKey, input: UnsafeRawBufferPointer(start: nil, count: 0))
    }
}

/// The keys a finished handshake leaves behind, from one side's point of view.
struct TransportKeys: Sendable {
    let send: SecretBytes
    let receive: SecretBytes
}

/// The IK pattern:
///
///     <- s
///     ...
///     -> e, es, s, ss
///     <- e, ee, se
///
/// The initiator knows the responder's static key beforehand (the client pins the server's),
/// sends its own static key encrypted in the first message, and both sides hold forward-secret
/// transport keys after one round trip.
enum NoiseIK {
    static let protocolName = "Noise_IK_25519_ChaChaPoly_SHA256"
    /// Bytes of the first message around its payload: e, encrypted s (with tag), the payload's tag.
    static let initiationOverhead = 32 + 48 + 16
    /// Bytes of the second message around its payload: e and the payload's tag.
    static let responseOverhead = 32 + 16

    /// The initiator, between sending the first message and reading the second.
    struct Initiator {
        private var symmetric: SymmetricState
        private let localStatic: PrivateKey
        private let ephemeral: PrivateKey

        /// Writes the first message with `payload`. Nil only when `remoteStatic` is a low-order point.
        static func start(
            localStatic: PrivateKey, remoteStatic: PublicKey, prologue: [UInt8], ephemeral: PrivateKey,
            payload: [UInt8]
        ) -> (Initiator, message: [UInt8])? {
            var symmetric = SymmetricState(protocolName: protocolName)
            symmetric.mixHash(prologue)
            symmetric.mixHash(remoteStatic.bytes)  // <- s
            // -> e
            var message = ephemeral.publicKey.bytes
            symmetric.mixHash(ephemeral.publicKey.bytes)
            // es
            guard let es = Primitives.dh(ephemeral, remoteStatic) else { return nil }
            symmetric.mixKey(es)
            // s
            message += symmetric.encryptAndHash(localStatic.publicKey.bytes)
            // ss
            guard let ss = Primitives.dh(localStatic, remoteStatic) else { return nil }
            symmetric.mixKey(ss)
            message += symmetric.encryptAndHash(payload)
            return (Initiator(symmetric: symmetric, localStatic: localStatic, ephemeral: ephemeral), message)
        }

        /// Reads the second message. Nil when it does not authenticate; `self` is left as it was,
        /// so a forged response cannot spoil the handshake in flight.
        func finish(_ message: [UInt8]) -> (payload: [UInt8], keys: TransportKeys, hash: [UInt8])? {
            guard message.count >= responseOverhead, let remoteEphemeral = PublicKey(bytes: message.prefix(32))
            else { return nil }
            var symmetric = symmetric
            // <- e
            symmetric.mixHash(remoteEphemeral.bytes)
            // ee
            guard let ee = Primitives.dh(ephemeral, remoteEphemeral) else { return nil }
            symmetric.mixKey(ee)
            // se
            guard let se = Primitives.dh(localStatic, remoteEphemeral) else { return nil }
            symmetric.mixKey(se)
            guard let payload = symmetric.decryptAndHash(Array(message.dropFirst(32))) else { return nil }
            let (toResponder, toInitiator) = symmetric.split()
            return (payload, TransportKeys(send: toResponder, receive: toInitiator), symmetric.hash)
        }
    }

    /// The responder, between reading the first message and writing the second.
    struct Responder {
        private var symmetric: SymmetricState
        private let remoteEphemeral: PublicKey
        /// The initiator's static key, authenticated by the first message.
        let remoteStatic: PublicKey
        /// The first message's payload, in the secret arena (it may hold a password).
        let payload: SecretBuffer

        /// Reads the first message; nil when it is malformed or does not authenticate.
        init?(message: [UInt8], localStatic: PrivateKey, prologue: [UInt8]) {
            guard message.count >= initiationOverhead, let remoteEphemeral = PublicKey(bytes: message.prefix(32))
            else { return nil }
            var symmetric = SymmetricState(protocolName: NoiseIK.protocolName)
            symmetric.mixHash(prologue)
            symmetric.mixHash(localStatic.publicKey.bytes)  // <- s
            // -> e
            symmetric.mixHash(remoteEphemeral.bytes)
            // es
            guard let es = Primitives.dh(localStatic, remoteEphemeral) else { return nil }
            symmetric.mixKey(es)
            // s
            guard let staticBytes = symmetric.decryptAndHash(Array(message[32..<80])),
                  let remoteStatic = PublicKey(bytes: staticBytes)
            else { return nil }
            // ss
            guard let ss = Primitives.dh(localStatic, remoteStatic) else { return nil }
            symmetric.mixKey(ss)
            guard var plaintext = symmetric.decryptAndHash(Array(message[80...])),
                  let payload = SecretBuffer(taking: &plaintext)
            else { return nil }
            self.symmetric = symmetric
            self.remoteEphemeral = remoteEphemeral
            self.remoteStatic = remoteStatic
            self.payload = payload
        }

        /// Overwrites the payload (it may hold a password) once it has been read.
        func wipePayload() { payload.wipe() }

        /// Writes the second message with `payload`; nil only for a low-order initiator key.
        func respond(
            payload: [UInt8], ephemeral: PrivateKey
        ) -> (message: [UInt8], keys: TransportKeys, hash: [UInt8])? {
            var symmetric = symmetric
            // <- e
            var message = ephemeral.publicKey.bytes
            symmetric.mixHash(ephemeral.publicKey.bytes)
            // ee
            guard let ee = Primitives.dh(ephemeral, remoteEphemeral) else { return nil }
            symmetric.mixKey(ee)
            // se
            guard let se = Primitives.dh(ephemeral, remoteStatic) else { return nil }
            symmetric.mixKey(se)
            message += symmetric.encryptAndHash(payload)
            let (toResponder, toInitiator) = symmetric.split()
            return (message, TransportKeys(send: toInitiator, receive: toResponder), symmetric.hash)
        }
    }
}
