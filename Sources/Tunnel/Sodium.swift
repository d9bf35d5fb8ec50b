import CSodium

/// Errors from the cryptographic library.
public enum CryptoError: Error, Equatable {
    /// `sodium_init` failed: the library could not find a source of randomness.
    case unavailable
    /// A public key is a low-order point: any Diffie-Hellman with it yields zero, so it cannot
    /// be anybody's key (a corrupted or hostile configuration).
    case weakPublicKey
    /// Argon2id could not hash a password, almost always because memory ran out.
    case passwordHashing
}

/// libsodium, initialised once before any key is made or used.
public enum Sodium {
    /// Initialises libsodium; safe to call from any thread, any number of times.
    public static func initialize() throws(CryptoError) {
        // sodium_init returns 1 when already initialised, -1 on failure.
        guard sodium_init() >= 0 else { throw .unavailable }
    }

    /// Overwrites secret bytes in a way the optimiser cannot drop (`sodium_memzero`).
    public static func wipe(_ bytes: inout [UInt8]) {
        bytes.withUnsafeMutableBytes { sodium_memzero($0.baseAddress, $0.count) }
    }

    /// The linked libsodium's version, as operators see it in `agent --version`.
    public static var version: String { String(cString: sodium_version_string()) }
}
