import CSodium
public import Basics

/// Argon2id work per password check. Production uses `.interactive`; tests use `.minimum`.
public struct PasswordCost: Equatable, Sendable {
    /// Passes over memory.
    public var operations: Int
    /// Bytes of memory.
    public var memory: Int

    public init(operations: Int, memory: Int) {
        self.operations = operations
        self.memory = memory
    }

    /// libsodium's interactive level (2 passes over 64 MiB): tens of milliseconds per check.
    public static var interactive: PasswordCost {
        PasswordCost(operations: crypto_pwhash_opslimit_interactive(), memory: crypto_pwhash_memlimit_interactive())
    }

    /// The least libsodium allows: only for tests, where speed matters more than strength.
    public static var minimum: PasswordCost {
        PasswordCost(operations: crypto_pwhash_opslimit_min(), memory: crypto_pwhash_memlimit_min())
    }
}

/// A password as the server stores it: an Argon2id string (`$argon2id$v=19$m=...,t=...,p=1$salt$hash`)
/// that carries its own salt and cost, so hashes made at different costs verify alike.
public struct PasswordHash: Hashable, Sendable, CustomStringConvertible {
    /// The encoded hash, as the users file stores it.
    public let encoded: String

    /// A stored hash; nil unless it is an Argon2id string of sane length and cost
    /// (`refusal(of:)` says why not).
    public init?(encoded: String) {
        guard Self.refusal(of: encoded) == nil else { return nil }
        self.encoded = encoded
    }

    /// Why `encoded` cannot be a stored hash, in words for the operator; nil when it can.
    public static func refusal(of encoded: String) -> String? {
        guard encoded.hasPrefix("$argon2id$"), encoded.utf8.count < crypto_pwhash_strbytes() else {
            return "not an Argon2id hash made by `agent passwd`"
        }
        // libsodium parses it (-1: not a hash it can verify): a malformed hash would fail at once
        // where a real check takes its time, and tell a prober that this user exists.
        let parsed = encoded.withCString {
            crypto_pwhash_str_needs_rehash($0, UInt64(crypto_pwhash_opslimit_min()), crypto_pwhash_memlimit_min())
        }
        guard parsed != -1, let cost = cost(of: encoded) else { return "not an Argon2id hash made by `agent passwd`" }
        guard cost.lanes == 1, cost.passes >= 1 else {
            return "made with \(cost.lanes) lanes and \(cost.passes) passes; `agent passwd` makes one lane and at least one pass"
        }
        // Every check of it, a decoy's for an unknown name included, holds the gateway's one
        // password thread, at the call of whoever sends a handshake naming this user.
        guard cost.memoryKiB.multipliedReportingOverflow(by: cost.passes).partialValue <= Self.maxWork,
              cost.memoryKiB <= Self.maxWork, cost.passes <= Self.maxWork
        else {
            return "too costly to check: \(cost.memoryKiB) KiB × \(cost.passes) passes, past the \(Self.maxWork) the gateway affords "
                + "(twice `agent passwd`'s \(Self.interactiveWork)); make it again with `agent passwd`"
        }
        return nil
    }

    /// The work (KiB of memory × passes) of a check at `agent passwd`'s cost, libsodium's
    /// interactive level: about 0.1 s on a core.
    static var interactiveWork: Int { crypto_pwhash_memlimit_interactive() / 1024 * Int(crypto_pwhash_opslimit_interactive()) }

    /// The most work a stored hash may ask for: twice `agent passwd`'s. The gateway checks at
    /// most 5 passwords a second (`ServerLimits.passwordChecks`) on one thread; at twice the
    /// interactive cost that is the thread's whole second, and more would let one name that an
    /// operator hashed at a higher cost (libsodium's "sensitive" level: 1 GiB, 4 passes, 7.3 s
    /// here) hold every first login on every gateway sharing the directory.
    static var maxWork: Int { 2 * interactiveWork }

    /// The cost the encoded hash asks for (`m=65536,t=2,p=1`), or nil when it does not say.
    var cost: (memoryKiB: Int, passes: Int, lanes: Int)? { Self.cost(of: encoded) }

    private static func cost(of encoded: String) -> (memoryKiB: Int, passes: Int, lanes: Int)? {
        let fields = encoded.split(separator: "$", omittingEmptySubsequences: false)
        guard fields.count == 6 else { return nil }
        var values: [Substring: Int] = [:]
        for pair in fields[3].split(separator: ",") {
            let parts = pair.split(separator: "=", maxSplits: 1)
            guard parts.count == 2, let value = Int(parts[1]), value >= 0 else { return nil }
            values[parts[0]] = value
        }
        guard let memory = values["m"], let passes = values["t"], let lanes = values["p"] else { return nil }
        return (memory, passes, lanes)
    }

    /// Hashes `password` with a fresh random salt (for `agent passwd` and for tests).
    public static func create(password: String, cost: PasswordCost = .interactive) throws(CryptoError) -> PasswordHash {
        try Sodium.initialize()
        var out = [CChar](repeating: 0, count: crypto_pwhash_strbytes())
        // A NUL past the end so even an empty password has an address to pass.
        var bytes = Array(password.utf8) + [0]
        defer { bytes.withUnsafeMutableBytes { sodium_memzero($0.baseAddress, $0.count) } }
        let status = bytes.withUnsafeBufferPointer { password in
            password.withMemoryRebound(to: CChar.self) {
                crypto_pwhash_str_alg(
                    &out, $0.baseAddress!, UInt64($0.count - 1), UInt64(cost.operations), cost.memory,
                    crypto_pwhash_alg_argon2id13())
            }
        }
        guard status == 0,
              let hash = PasswordHash(encoded: String(decoding: out.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self))
        else { throw .passwordHashing }
        return hash
    }

    /// True when `password` matches.
    public func verify(_ password: String) -> Bool { verify(Array(password.utf8)) }

    func verify(_ password: [UInt8]) -> Bool {
        var bytes = password
        defer { Primitives.wipe(&bytes) }
        return bytes.withUnsafeBytes { verify($0) }
    }

    /// Checks the bytes where they are: no copy of the password is made.
    func verify(_ password: SecretBuffer) -> Bool { password.withBytes { verify($0) } }

    private func verify(_ password: UnsafeRawBufferPointer) -> Bool {
        // libsodium reads exactly `count` bytes: no terminating zero needed.
        var none: UInt8 = 0
        return encoded.withCString { hash in
            withUnsafePointer(to: &none) { fallback in
                let base = (password.baseAddress ?? UnsafeRawPointer(fallback)).assumingMemoryBound(to: CChar.self)
                return crypto_pwhash_str_verify(hash, base, UInt64(password.count)) == 0
            }
        }
    }

    /// The cost part of the encoded hash (`$argon2id$v=19$m=65536,t=2,p=1$`): everything before
    /// the salt. Hashes with equal parameters cost the same to check.
    var parameters: String? {
        let fields = encoded.split(separator: "$", omittingEmptySubsequences: false)
        return fields.count == 6 ? "$" + fields[1...3].joined(separator: "$") + "$" : nil
    }

    /// A hash that no password matches, with `parameters`: checking a password against it costs
    /// what a check against a real hash with these parameters costs.
    static func decoy(parameters: String) -> PasswordHash {
        PasswordHash(unchecked: parameters + randomBase64(16) + "$" + randomBase64(32))
    }

    private init(unchecked encoded: String) { self.encoded = encoded }

    /// `count` random bytes in unpadded base64, as Argon2id strings write salts and hashes.
    private static func randomBase64(_ count: Int) -> String {
        var bytes = [UInt8](repeating: 0, count: count)
        randombytes_buf(&bytes, count)
        let variant = Int32(sodium_base64_VARIANT_ORIGINAL_NO_PADDING)
        var out = [CChar](repeating: 0, count: sodium_base64_encoded_len(count, variant))
        _ = sodium_bin2base64(&out, out.count, bytes, count, variant)
        return String(decoding: out.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// Hashes are not secrets, but they invite offline guessing: logs show only the kind.
    public var description: String { "argon2id(redacted)" }
}

/// What a password that cannot succeed is checked against (an unknown user's, or one sent with
/// a key the user does not pin), so that a refusal takes as long as a wrong password would:
/// a hash no password matches, at the cost of the claimed user's own hash when there is one.
/// For a name or key that is nobody's, one of the costs the users' hashes use, picked by a keyed
/// hash of the claim (the key drawn at start): the same claim always costs the same, and the
/// claims spread over the costs as the users do, so timing does not tell a user with an unusual
/// cost from a name nobody has.
struct DecoyHashes: Sendable {
    /// A decoy per cost in use, with how many users' hashes have it, in a fixed order.
    private let decoys: [(parameters: String, users: Int, hash: PasswordHash)]
    private let pickKey = SecretBytes { randombytes_buf($0, SecretBytes.count) }

    init(costOf hashes: [PasswordHash]) {
        var counts: [String: Int] = [:]
        for hash in hashes { if let parameters = hash.parameters { counts[parameters, default: 0] += 1 } }
        if counts.isEmpty {
            let interactive = PasswordCost.interactive
            counts["$argon2id$v=19$m=\(interactive.memory / 1024),t=\(interactive.operations),p=1$"] = 1
        }
        decoys = counts.sorted { $0.key < $1.key }.map { ($0.key, $0.value, PasswordHash.decoy(parameters: $0.key)) }
    }

    /// The decoy for a claim that names `user`'s hash: at its cost.
    func matching(_ hash: PasswordHash) -> PasswordHash {
        decoys.first { $0.parameters == hash.parameters }?.hash ?? decoys[0].hash
    }

    /// The decoy for a claimed name or key (as bytes) that is nobody's.
    func forUnknown(_ claim: [UInt8]) -> PasswordHash {
        var digest = [UInt8](repeating: 0, count: Primitives.hashLength)
        pickKey.withBytes { key in
            claim.withUnsafeBytes { claim in
                Primitives.hmac(key: UnsafeRawBufferPointer(start: key, count: SecretBytes.count), [claim], into: &digest)
            }
        }
        let total = decoys.reduce(0) { $0 + $1.users }
        var pick = Int(digest.prefix(8).reduce(UInt64(0)) { $0 << 8 | UInt64($1) } % UInt64(total))
        for decoy in decoys {
            if pick < decoy.users { return decoy.hash }
            pick -= decoy.users
        }
        return decoys[0].hash
    }
}

/// One person or device allowed in, and the inner addresses that are always theirs.
public struct User: Hashable, Sendable {
    /// The login name, for password users (at most 255 bytes of UTF-8, compared byte for byte).
    public var name: String?
    /// The static key the client must hold, when pinned.
    public var publicKey: PublicKey?
    /// At most one IPv4 and one IPv6 address: the only sources this user's packets may carry,
    /// and where packets to them are routed.
    public var addresses: [IPAddress]
    /// Argon2id hash of the password, for users who must give one.
    public var passwordHash: PasswordHash?
    /// Resolvers and search domains for this user instead of the server's.
    public var dns: DNSSettings?

    public init(
        name: String? = nil, publicKey: PublicKey? = nil, addresses: [IPAddress], passwordHash: PasswordHash? = nil,
        dns: DNSSettings? = nil
    ) {
        self.name = name
        self.publicKey = publicKey
        self.addresses = addresses
        self.passwordHash = passwordHash
        self.dns = dns
    }

    /// How logs name the user: the name, else the key.
    public var label: String { name ?? publicKey.map { "key:\($0)" } ?? "?" }

    /// The name and key alone (equal users have equal ones): replacing 100,000 users hashes each
    /// twice, and the password hash and resolvers added nothing but time.
    public func hash(into hasher: inout Hasher) {
        hasher.combine(name)
        hasher.combine(publicKey)
    }
}

/// A user by position in the server's database: cheap to hash on the data path.
public struct PeerID: Hashable, Comparable, Sendable, CustomStringConvertible {
    /// Index into `UserDatabase.users`.
    public let index: Int
    public init(index: Int) { self.index = index }
    public static func < (a: PeerID, b: PeerID) -> Bool { a.index < b.index }
    public var description: String { "peer#\(index)" }
}

/// A users file that cannot work as written.
public enum UserDatabaseError: Error, Equatable, CustomStringConvertible {
    /// The entry has neither a name nor a key: no handshake could ever select it.
    case noIdentity(entry: Int)
    /// The entry has no key and no password: anyone who knew the name could log in.
    case noCredential(entry: Int)
    /// The name is empty or longer than 255 bytes.
    case badName(entry: Int)
    /// The entry needs one or two addresses, at most one per family.
    case badAddresses(entry: Int)
    /// Two entries have the same name.
    case duplicateName(String)
    /// Two entries pin the same key.
    case duplicateKey(PublicKey)
    /// Two entries claim the same inner address.
    case duplicateAddress(IPAddress)

    public var description: String {
        switch self {
        case .noIdentity(let n): "user \(n + 1): needs a name or a public key"
        case .noCredential(let n): "user \(n + 1): needs a public key or a password hash, or anyone could log in as it"
        case .badName(let n): "user \(n + 1): the name must be 1 to 255 bytes"
        case .badAddresses(let n): "user \(n + 1): needs an IPv4 and/or an IPv6 address, at most one of each"
        case .duplicateName(let name): "user '\(name)' is listed twice"
        case .duplicateKey(let key): "key \(key) is listed for two users"
        case .duplicateAddress(let address): "address \(address) is given to two users"
        }
    }
}

/// The server's users: who may connect, how they prove it, and their stable inner addresses.
public struct UserDatabase: Sendable {
    public let users: [User]
    /// By the name's UTF-8 bytes: Swift's `String` equality would let differently spelled but
    /// canonically equal names (a Kelvin sign for a K) reach one user under many budgets.
    private let byName: [[UInt8]: PeerID]
    private let byKey: [PublicKey: PeerID]
    private let byAddress: [IPAddress: PeerID]

    /// Checks that every user can be selected, needs a secret, and owns addresses nobody else has.
    public init(_ users: [User]) throws(UserDatabaseError) {
        var byName: [[UInt8]: PeerID] = [:]
        var byKey: [PublicKey: PeerID] = [:]
        var byAddress: [IPAddress: PeerID] = [:]
        byName.reserveCapacity(users.count)
        byKey.reserveCapacity(users.count)
        byAddress.reserveCapacity(users.count)
        for (index, user) in users.enumerated() {
            let peer = PeerID(index: index)
            guard user.name != nil || user.publicKey != nil else { throw .noIdentity(entry: index) }
            guard user.publicKey != nil || user.passwordHash != nil else { throw .noCredential(entry: index) }
            let families = user.addresses.map(\.family)
            guard (1...2).contains(families.count), Set(families).count == families.count else {
                throw .badAddresses(entry: index)
            }
            if let name = user.name {
                guard (1...255).contains(name.utf8.count) else { throw .badName(entry: index) }
                guard byName.updateValue(peer, forKey: Array(name.utf8)) == nil else { throw .duplicateName(name) }
            }
            if let key = user.publicKey {
                guard byKey.updateValue(peer, forKey: key) == nil else { throw .duplicateKey(key) }
            }
            for address in user.addresses {
                guard byAddress.updateValue(peer, forKey: address) == nil else { throw .duplicateAddress(address) }
            }
        }
        self.users = users
        self.byName = byName
        self.byKey = byKey
        self.byAddress = byAddress
    }

    /// Nobody: a gateway whose users are still to come.
    public static let empty = UserDatabase()
    private init() {
        users = []
        byName = [:]
        byKey = [:]
        byAddress = [:]
    }

    public subscript(peer: PeerID) -> User { users[peer.index] }

    /// The user with this login name, compared byte for byte.
    public func peer(named name: String) -> PeerID? { byName[Array(name.utf8)] }

    /// The user whose login name is these bytes.
    func peer(named bytes: [UInt8]) -> PeerID? { byName[bytes] }
    /// The user who pinned this static key.
    public func peer(forKey key: PublicKey) -> PeerID? { byKey[key] }
    /// The user whose inner address this is: where the server routes a packet for `address`.
    public func peer(owning address: IPAddress) -> PeerID? { byAddress[address] }
}
