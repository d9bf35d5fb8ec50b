/// Version 3's handshake: Noise's XK pattern with ML-KEM-768 beside X25519, built from the same
/// Noise parts as version 2's IK (`SymmetricState`) and named and ordered as docs/PROTOCOL.md
/// writes it, so it can be checked line by line:
///
///     <- s
///     ...
///     -> ekem, e, es           initiation (two datagrams: the KEM key, then the rest)
///     <- e, ee, kem            response
///     -> s, se                 identity: the client's static key and credentials
///     <-                       verdict
///
/// `ekem` mixes the client's ephemeral ML-KEM key into the hash; `kem` encapsulates a secret to
/// it, mixes the ciphertext into the hash and the secret into the chaining key. So everything
/// after the response (the client's identity, its credentials, the verdict and every packet)
/// is sealed under keys that need both X25519's ephemeral secrets and ML-KEM's: recorded today,
/// it stays secret if either holds. Transport keys come from Split after the verdict.
enum HybridHandshake {
    static let protocolName = "Roam3_XKhybrid_25519+MLKEM768_ChaChaPoly_SHA256"
    static let prologue = Array("roam protocol version 3".utf8)
    /// Bytes of a sealed payload beyond its plaintext.
    static let tag = Primitives.tagLength

    /// The state both sides start from: the prologue and the server's static key mixed in.
    private static func start(serverKey: PublicKey) -> SymmetricState {
        var symmetric = SymmetricState(protocolName: protocolName)
        symmetric.mixHash(prologue)
        symmetric.mixHash(serverKey.bytes)  // <- s
        return symmetric
    }

    // MARK: The client

    /// The client, from its initiation until the response.
    struct Initiator {
        private let symmetric: SymmetricState
        private let ephemeral: PrivateKey
        private let kem: MLKEM.KeyPair

        /// The initiation's contents: the KEM key (the first datagram's), and the ephemeral key
        /// with the sealed `offer` (the second's). Nil only for a low-order server key.
        static func start(serverKey: PublicKey, ephemeral: PrivateKey, kem: MLKEM.KeyPair,
                          offer: [UInt8]) -> (Initiator, kemKey: [UInt8], rest: [UInt8])? {
            var symmetric = HybridHandshake.start(serverKey: serverKey)
            symmetric.mixHash(kem.publicKey)  // ekem
            symmetric.mixHash(ephemeral.publicKey.bytes)  // e
            guard let es = Primitives.dh(ephemeral, serverKey) else { return nil }
            symmetric.mixKey(es)  // es
            let rest = ephemeral.publicKey.bytes + symmetric.encryptAndHash(offer)
            return (Initiator(symmetric: symmetric, ephemeral: ephemeral, kem: kem), kem.publicKey, rest)
        }

        /// Reads the response's ephemeral key, ciphertext and sealed choice. Nil when it does not
        /// authenticate (a forgery, or a ciphertext someone changed); `self` stays as it was.
        func read(response ephemeralKey: [UInt8], ciphertext: [UInt8], sealedChoice: [UInt8]) -> (Identifying, choice: [UInt8])? {
            guard let remoteEphemeral = PublicKey(bytes: ephemeralKey) else { return nil }
            var symmetric = symmetric
            symmetric.mixHash(remoteEphemeral.bytes)  // e
            guard let ee = Primitives.dh(ephemeral, remoteEphemeral) else { return nil }
            symmetric.mixKey(ee)  // ee
            guard let shared = kem.decapsulate(ciphertext) else { return nil }
            symmetric.mixHash(ciphertext)  // kem
            symmetric.mixKey(shared)
            guard let choice = symmetric.decryptAndHash(sealedChoice) else { return nil }
            return (Identifying(symmetric: symmetric, remoteEphemeral: remoteEphemeral), choice)
        }
    }

    /// The client once the response authenticated: it says who it is.
    struct Identifying {
        fileprivate let symmetric: SymmetricState
        fileprivate let remoteEphemeral: PublicKey

        /// The sealed static key and the sealed `payload` (the credentials), and what waits for
        /// the verdict. Nil only for a low-order server ephemeral key.
        func identify(as localStatic: PrivateKey, payload: [UInt8]) -> (AwaitingVerdict, sealedKey: [UInt8], sealedPayload: [UInt8])? {
            var symmetric = symmetric
            let sealedKey = symmetric.encryptAndHash(localStatic.publicKey.bytes)  // s
            guard let se = Primitives.dh(localStatic, remoteEphemeral) else { return nil }
            symmetric.mixKey(se)  // se
            let sealedPayload = symmetric.encryptAndHash(payload)
            return (AwaitingVerdict(symmetric: symmetric), sealedKey, sealedPayload)
        }
    }

    /// The client until the verdict.
    struct AwaitingVerdict {
        fileprivate let symmetric: SymmetricState

        /// The verdict's payload and the transport keys (the client's sending key first); nil
        /// when it does not authenticate.
        func read(verdict sealed: [UInt8]) -> (payload: [UInt8], keys: TransportKeys, hash: [UInt8])? {
            var symmetric = symmetric
            guard let payload = symmetric.decryptAndHash(sealed) else { return nil }
            let (toServer, toClient) = symmetric.split()
            return (payload, TransportKeys(send: toServer, receive: toClient), symmetric.hash)
        }
    }

    // MARK: The server

    /// The server, having read a whole initiation.
    struct Responder {
        private let symmetric: SymmetricState
        private let remoteEphemeral: PublicKey
        private let kemKey: [UInt8]
        /// The client's offer.
        let offer: [UInt8]

        /// Reads the initiation's two parts; nil when they do not authenticate together (the
        /// offer is sealed under a hash that covers the KEM key, so a part from another
        /// initiation fails here) or a key is malformed.
        init?(kemKey: [UInt8], ephemeralKey: [UInt8], sealedOffer: [UInt8], localStatic: PrivateKey) {
            guard kemKey.count == MLKEM.publicKeyLength, let remoteEphemeral = PublicKey(bytes: ephemeralKey) else { return nil }
            var symmetric = HybridHandshake.start(serverKey: localStatic.publicKey)
            symmetric.mixHash(kemKey)  // ekem
            symmetric.mixHash(remoteEphemeral.bytes)  // e
            guard let es = Primitives.dh(localStatic, remoteEphemeral) else { return nil }
            symmetric.mixKey(es)  // es
            guard let offer = symmetric.decryptAndHash(sealedOffer) else { return nil }
            self.symmetric = symmetric
            self.remoteEphemeral = remoteEphemeral
            self.kemKey = kemKey
            self.offer = offer
        }

        /// The response's ephemeral key, ciphertext and sealed `choice`, and what waits for the
        /// client's identity. Nil when the KEM key is not a valid encoding or the client's
        /// ephemeral key is a low-order point. `entropy` fixes the encapsulation, for test vectors.
        func respond(ephemeral: PrivateKey, choice: [UInt8], entropy: [UInt8]? = nil)
            -> (AwaitingIdentity, ephemeralKey: [UInt8], ciphertext: [UInt8], sealedChoice: [UInt8])? {
            var symmetric = symmetric
            symmetric.mixHash(ephemeral.publicKey.bytes)  // e
            guard let ee = Primitives.dh(ephemeral, remoteEphemeral) else { return nil }
            symmetric.mixKey(ee)  // ee
            guard let (ciphertext, shared) = MLKEM.encapsulate(to: kemKey, entropy: entropy) else { return nil }
            symmetric.mixHash(ciphertext)  // kem
            symmetric.mixKey(shared)
            let sealedChoice = symmetric.encryptAndHash(choice)
            return (AwaitingIdentity(symmetric: symmetric, ephemeral: ephemeral), ephemeral.publicKey.bytes, ciphertext, sealedChoice)
        }
    }

    /// The server until the client says who it is.
    struct AwaitingIdentity {
        fileprivate let symmetric: SymmetricState
        fileprivate let ephemeral: PrivateKey

        /// The client's static key and its payload (in the secret arena: it may hold a password),
        /// and what writes the verdict; nil when the message does not authenticate, and then the
        /// server may wait on for the real one.
        func read(sealedKey: [UInt8], sealedPayload: [UInt8]) -> (Identified, remoteStatic: PublicKey, payload: SecretBuffer)? {
            var symmetric = symmetric
            guard let keyBytes = symmetric.decryptAndHash(sealedKey), let remoteStatic = PublicKey(bytes: keyBytes) else { return nil }
            guard let se = Primitives.dh(ephemeral, remoteStatic) else { return nil }
            symmetric.mixKey(se)  // se
            guard var plaintext = symmetric.decryptAndHash(sealedPayload), let payload = SecretBuffer(taking: &plaintext) else { return nil }
            return (Identified(symmetric: symmetric), remoteStatic, payload)
        }
    }

    /// The server once the client is known: the verdict, and the transport keys.
    struct Identified {
        fileprivate let symmetric: SymmetricState

        /// The sealed verdict `payload` and the transport keys (the server's sending key first).
        func verdict(_ payload: [UInt8]) -> (sealed: [UInt8], keys: TransportKeys, hash: [UInt8]) {
            var symmetric = symmetric
            let sealed = symmetric.encryptAndHash(payload)
            let (toServer, toClient) = symmetric.split()
            return (sealed, TransportKeys(send: toClient, receive: toServer), symmetric.hash)
        }
    }
}
