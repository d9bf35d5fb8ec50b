import Basics
import Testing
@testable import Tunnel

@Test func handshakeGivesBothSidesASessionAndTheInnerAddresses() throws {
    var f = try ProtocolFixture()
    var initiation = try f.client.initiate(now: f.now, wallClock: ProtocolFixture.wall)
    #expect(f.client.isHandshaking)
    guard case .handshake(let peer, var response, let to) = f.server.receive(&initiation, from: ProtocolFixture.clientAddress, now: f.now) else {
        Issue.record("no handshake")
        return
    }
    #expect(to == ProtocolFixture.clientAddress)
    #expect(response.count < initiation.count, "a response must never amplify")
    #expect(f.server.users[peer].label == "key:\(f.clientKey.publicKey)")
    f.now = f.now + .milliseconds(30)
    #expect(f.client.session == nil, "no session before the response")
    guard case .established(let done) = f.client.receive(&response, now: f.now) else {
        Issue.record("no session")
        return
    }
    #expect(f.client.session == SessionProtocol(version: 2, cipher: .chacha20Poly1305))
    #expect(done.rtt == .milliseconds(30))
    #expect(done.addresses == [ProtocolFixture.innerV4, ProtocolFixture.innerV6])
    #expect(f.client.addresses == done.addresses)
    #expect(!f.client.isHandshaking)
    #expect(f.client.hasSession(now: f.now))

    // Until the client uses the new keys, the server cannot know it has them: it does not send.
    var early = DataPacket.frame(ProtocolFixture.ipv4(from: IPAddress("10.9.0.1")!, to: ProtocolFixture.innerV4))
    #expect(throws: SealFailure.noSession) { try f.server.seal(&early, to: peer, now: f.now) }
    var confirmation = done.confirmation
    #expect(f.server.receive(&confirmation, from: ProtocolFixture.clientAddress, now: f.now) == .keepalive(from: peer))

    // Client to server.
    let packet = ProtocolFixture.ipv4(payload: Array("hello".utf8))
    var datagram = try f.clientDatagram(packet)
    #expect(datagram.count == packet.count + DataPacket.overhead)
    guard case .packet(peer, let range) = f.server.receive(&datagram, from: ProtocolFixture.clientAddress, now: f.now) else {
        Issue.record("packet not delivered")
        return
    }
    #expect(Array(datagram[range]) == packet)

    // Server to client, routed by inner destination.
    let reply = ProtocolFixture.ipv4(from: IPAddress("10.9.0.1")!, to: ProtocolFixture.innerV4, payload: [7])
    let owner = reply.withUnsafeBytes { InnerPacket.destination(of: $0) }.flatMap { f.server.peer(forInnerDestination: $0) }
    #expect(owner == peer)
    var framed = DataPacket.frame(reply)
    let sealed = try f.server.seal(&framed, to: peer, now: f.now)
    #expect(sealed.destination == ProtocolFixture.clientAddress)
    #expect(sealed.length == framed.count)
    guard case .packet(let back) = f.client.receive(&framed, now: f.now) else {
        Issue.record("reply not delivered")
        return
    }
    #expect(Array(framed[back]) == reply)
    #expect(f.server.drops.total == 0 && f.client.drops.total == 0)
}

@Test func aClientPinningTheWrongServerKeyIsDroppedBeforeAnyDiffieHellman() throws {
    var f = try ProtocolFixture()
    var impostor = try ClientCore(privateKey: f.clientKey, serverKey: PrivateKey.generate().publicKey)
    var initiation = try impostor.initiate(now: f.now, wallClock: ProtocolFixture.wall)
    #expect(f.server.receive(&initiation, from: ProtocolFixture.clientAddress, now: f.now) == .dropped(.badMAC))

    // Someone who knows the server's public key can forge mac1, but not the Noise message.
    var forged = initiation
    Mac1(serverKey: f.serverKey.publicKey).stamp(&forged)
    #expect(f.server.receive(&forged, from: ProtocolFixture.clientAddress, now: f.now) == .dropped(.handshakeFailed))
    #expect(f.server.drops[.badMAC] == 1 && f.server.drops[.handshakeFailed] == 1)
    #expect(f.server.sessionCount == 0)
}

@Test func aResponseFromAnotherServerOrTamperedFailsAtTheClient() throws {
    var f = try ProtocolFixture()
    var initiation = try f.client.initiate(now: f.now, wallClock: ProtocolFixture.wall)
    guard case .handshake(_, let response, _) = f.server.receive(&initiation, from: ProtocolFixture.clientAddress, now: f.now) else {
        Issue.record("no handshake")
        return
    }
    for i in Response.noiseOffset..<response.count {
        var tampered = response
        tampered[i] ^= 0x04
        #expect(f.client.receive(&tampered, now: f.now) == .dropped(.handshakeFailed))
    }
    var wrongIndex = response
    wrongIndex[Response.receiverOffset] ^= 1
    #expect(f.client.receive(&wrongIndex, now: f.now) == .dropped(.unexpected))
    // The genuine response still completes the handshake after all those forgeries.
    var genuine = response
    guard case .established = f.client.receive(&genuine, now: f.now) else {
        Issue.record("genuine response refused")
        return
    }
    var again = response
    #expect(f.client.receive(&again, now: f.now) == .dropped(.unexpected))
}

@Test func anUnknownKeyIsRejectedWithAResponseTheClientUnderstands() throws {
    let someone = try PrivateKey.generate().publicKey
    var f = try ProtocolFixture(users: [User(publicKey: someone, addresses: [IPAddress("10.9.0.9")!])], keyUser: false)
    var initiation = try f.client.initiate(now: f.now, wallClock: ProtocolFixture.wall)
    guard case .rejected(.unknownUser, var response, _) = f.server.receive(&initiation, from: ProtocolFixture.clientAddress, now: f.now) else {
        Issue.record("not rejected")
        return
    }
    #expect(f.client.receive(&response, now: f.now) == .rejected)
    #expect(!f.client.isHandshaking && !f.client.hasSession(now: f.now))
    #expect(f.server.drops[.unknownUser] == 1)
    #expect(f.server.sessionCount == 0)
}

@Test func passwordUsersLogInWithTheRightPasswordOnly() throws {
    let hash = try PasswordHash.create(password: "correct horse", cost: .minimum)
    let alice = User(name: "alice", addresses: [IPAddress("10.9.0.5")!], passwordHash: hash)
    var f = try ProtocolFixture(users: [alice], credentials: Credentials(username: "alice", password: "correct horse"), keyUser: false)
    let peer = try f.connect()
    #expect(f.server.users[peer].label == "alice")

    for (credentials, reason) in [
        (Credentials(username: "alice", password: "wrong horse"), DropReason.badPassword),
        (Credentials(username: "bob", password: "correct horse"), .unknownUser),
        (nil, .unknownUser),  // no name, and the key is nobody's
    ] {
        var other = try ClientCore(privateKey: f.clientKey, serverKey: f.serverKey.publicKey, credentials: credentials)
        f.now = f.now + .seconds(1)
        var initiation = try other.initiate(now: f.now, wallClock: TAI64N(unixNanoseconds: UInt64(f.now.nanoseconds) * 2_000_000_000))
        guard case .rejected(reason, var response, _) = f.deliver(&initiation, by: &other) else {
            Issue.record("expected \(reason)")
            continue
        }
        #expect(other.receive(&response, now: f.now) == .rejected)
    }
    #expect(f.server.drops[.badPassword] == 1 && f.server.drops[.unknownUser] == 2)
}

@Test func argon2idRunsOffTheDataPathOncePerPasswordAndAtALimitedRate() throws {
    let hash = try PasswordHash.create(password: "pw", cost: .minimum)
    let users = [User(name: "dave", addresses: [IPAddress("10.9.0.8")!], passwordHash: hash)]
    let limits = ServerLimits(passwordChecks: .init(perSecond: 1, burst: 1))
    var f = try ProtocolFixture(users: users, credentials: Credentials(username: "dave", password: "pw"), keyUser: false, limits: limits)
    var first = try f.client.initiate(now: f.now, wallClock: ProtocolFixture.wall)
    guard case .checkPassword(let check) = f.send(&first) else {
        Issue.record("a first login must wait for Argon2id")
        return
    }
    #expect(check.peer == PeerID(index: 0))
    // While the check runs, another attempt with an unproven password finds the bucket empty.
    var guesser = try ClientCore(privateKey: .generate(), serverKey: f.serverKey.publicKey, credentials: Credentials(username: "dave", password: "guess"))
    var guess = try guesser.initiate(now: f.now, wallClock: TAI64N(unixNanoseconds: 1_900_000_000_000_000_000))
    #expect(f.send(&guess, from: ProtocolFixture.attackerAddress, by: &guesser) == .dropped(.serverLimited))
    guard case .handshake = f.server.finish(check, verified: check.verify(), now: f.now) else {
        Issue.record("the verified login must complete")
        return
    }
    // A rekey presents the same password: no second Argon2id, and no token spent.
    var rekey = try f.client.initiate(now: f.now, wallClock: ProtocolFixture.wall)
    guard case .handshake = f.server.receive(&rekey, from: ProtocolFixture.clientAddress, now: f.now) else {
        Issue.record("a proven password must not be checked again")
        return
    }
    // A check that fails is a rejection like any other.
    f.now = f.now + .seconds(1)
    var wrong = try guesser.initiate(now: f.now, wallClock: TAI64N(unixNanoseconds: 1_950_000_000_000_000_000))
    guard case .checkPassword(let bad) = f.send(&wrong, from: ProtocolFixture.attackerAddress, by: &guesser) else {
        Issue.record("expected a check")
        return
    }
    guard case .rejected(.badPassword, _, _) = f.server.finish(bad, verified: bad.verify(), now: f.now) else {
        Issue.record("expected a rejection")
        return
    }
}

@Test func everyFactorAUserHasIsRequired() throws {
    let hash = try PasswordHash.create(password: "pw", cost: .minimum)
    let pinned = try PrivateKey.generate()
    let users = [
        // Key and password: the key alone is not enough.
        User(name: "carol", publicKey: pinned.publicKey, addresses: [IPAddress("10.9.0.7")!], passwordHash: hash),
    ]
    var f = try ProtocolFixture(users: users, keyUser: false)
    func attempt(key: PrivateKey, credentials: Credentials?) throws -> ServerEvent {
        var client = try ClientCore(privateKey: key, serverKey: f.serverKey.publicKey, credentials: credentials)
        f.now = f.now + .seconds(1)
        var initiation = try client.initiate(now: f.now, wallClock: TAI64N(unixNanoseconds: UInt64(f.now.nanoseconds)))
        return f.deliver(&initiation, by: &client)
    }
    guard case .rejected(.badPassword, _, _) = try attempt(key: pinned, credentials: nil) else {
        Issue.record("a missing password must be refused")
        return
    }
    guard case .rejected(.wrongKey, _, _) = try attempt(key: f.clientKey, credentials: Credentials(username: "carol", password: "pw")) else {
        Issue.record("the wrong key must be refused")
        return
    }
    guard case .handshake = try attempt(key: pinned, credentials: Credentials(username: "carol", password: "pw")) else {
        Issue.record("both factors must succeed")
        return
    }
}

@Test func aReplayedInitiationIsDroppedAndMovesNothing() throws {
    var f = try ProtocolFixture()
    let peer = try f.connect()
    var older = try f.client.initiate(now: f.now, wallClock: ProtocolFixture.wall)  // nudged past the first
    let captured = older
    var newer = try f.client.initiate(now: f.now, wallClock: TAI64N(unixNanoseconds: 1_800_000_000_000_000_000))
    guard case .handshake = f.server.receive(&newer, from: ProtocolFixture.clientAddress, now: f.now) else {
        Issue.record("newer initiation refused")
        return
    }
    #expect(f.server.receive(&older, from: ProtocolFixture.attackerAddress, now: f.now) == .dropped(.replayedHandshake))
    var again = captured
    #expect(f.server.receive(&again, from: ProtocolFixture.attackerAddress, now: f.now + .seconds(10)) == .dropped(.replayedHandshake))
    #expect(f.server.endpoint(of: peer) == ProtocolFixture.clientAddress)
    #expect(f.server.drops[.replayedHandshake] == 2)
}

@Test func aClockThatStandsStillStillDatesEachInitiationLater() throws {
    var f = try ProtocolFixture()
    for _ in 0..<3 {
        var initiation = try f.client.initiate(now: f.now, wallClock: ProtocolFixture.wall)
        guard case .handshake = f.server.receive(&initiation, from: ProtocolFixture.clientAddress, now: f.now) else {
            Issue.record("refused: \(f.server.drops)")
            return
        }
    }
}

@Test func handshakesAreRateLimitedPerSource() throws {
    var f = try ProtocolFixture()
    var stranger = try ClientCore(privateKey: .generate(), serverKey: f.serverKey.publicKey)
    // Cheap garbage with a valid mac1 still costs the flooder a token; without proof that it
    // receives at its address it gets half the burst, then cookies.
    var admitted = 0
    var cookies = 0
    for _ in 0..<50 {
        var initiation = try stranger.initiate(now: f.now, wallClock: ProtocolFixture.wall)
        switch f.server.receive(&initiation, from: ProtocolFixture.attackerAddress, now: f.now) {
        case .rejected(.unknownUser, _, _): admitted += 1
        case .cookie: cookies += 1
        default: break
        }
    }
    #expect(admitted == 6 && cookies == 44, "half the burst and one: \(admitted), \(cookies)")
    // With proof, the rest of the burst, then nothing.
    admitted = 0
    for _ in 0..<20 {
        var initiation = try stranger.initiate(now: f.now, wallClock: ProtocolFixture.wall)
        if case .rejected = f.send(&initiation, from: ProtocolFixture.attackerAddress, by: &stranger) { admitted += 1 }
    }
    #expect(admitted == 4)
    #expect(f.server.drops[.rateLimited] == 16)
    // Another source is unaffected; the flooder gets 5 a second back.
    try f.connect(from: ProtocolFixture.clientAddress)
    f.now = f.now + .seconds(1)
    admitted = 0
    for _ in 0..<20 {
        var initiation = try stranger.initiate(now: f.now, wallClock: ProtocolFixture.wall)
        if case .rejected = f.send(&initiation, from: ProtocolFixture.attackerAddress, by: &stranger) { admitted += 1 }
    }
    #expect(admitted == 5)
}

@Test func passwordsHashWithArgon2idAndNeverShow() throws {
    let hash = try PasswordHash.create(password: "s3cret", cost: .minimum)
    #expect(hash.encoded.hasPrefix("$argon2id$"))
    #expect(hash.verify("s3cret") && !hash.verify("s3cret ") && !hash.verify(""))
    #expect(PasswordHash(encoded: hash.encoded) == hash)
    #expect(PasswordHash(encoded: "$2y$10$abcdefghijklmnopqrstuv") == nil)
    #expect(!"\(hash)".contains(hash.encoded))
    #expect(PasswordCost.interactive.memory == 64 << 20)
    let credentials = try #require(Credentials(username: "alice", password: "s3cret"))
    #expect(!"\(credentials)".contains("s3cret"))
    #expect(Credentials(username: "", password: "x") == nil)
    #expect(Credentials(username: "a", password: String(repeating: "x", count: 256)) == nil)
}

@Test func theUsersFileMustMakeSense() throws {
    let key = try PrivateKey.generate().publicKey
    let hash = try PasswordHash.create(password: "pw", cost: .minimum)
    let a = IPAddress("10.0.0.2")!
    let b = IPAddress("10.0.0.3")!
    #expect(throws: UserDatabaseError.noIdentity(entry: 0)) { try UserDatabase([User(addresses: [a], passwordHash: hash)]) }
    #expect(throws: UserDatabaseError.noCredential(entry: 0)) { try UserDatabase([User(name: "x", addresses: [a])]) }
    #expect(throws: UserDatabaseError.badAddresses(entry: 0)) { try UserDatabase([User(publicKey: key, addresses: [])]) }
    #expect(throws: UserDatabaseError.badAddresses(entry: 0)) { try UserDatabase([User(publicKey: key, addresses: [a, b])]) }
    #expect(throws: UserDatabaseError.duplicateName("x")) {
        try UserDatabase([User(name: "x", addresses: [a], passwordHash: hash), User(name: "x", addresses: [b], passwordHash: hash)])
    }
    #expect(throws: UserDatabaseError.duplicateKey(key)) {
        try UserDatabase([User(publicKey: key, addresses: [a]), User(publicKey: key, addresses: [b])])
    }
    #expect(throws: UserDatabaseError.duplicateAddress(a)) {
        try UserDatabase([User(publicKey: key, addresses: [a]), User(name: "y", addresses: [a], passwordHash: hash)])
    }
    #expect("\(UserDatabaseError.noCredential(entry: 2))" == "user 3: needs a public key or a password hash, or anyone could log in as it")
    let db = try UserDatabase([User(publicKey: key, addresses: [a]), User(name: "y", addresses: [b, IPAddress("fd00::3")!], passwordHash: hash)])
    #expect(db.peer(forKey: key) == PeerID(index: 0))
    #expect(db.peer(named: "y") == PeerID(index: 1))
    #expect(db.peer(owning: IPAddress("fd00::3")!) == PeerID(index: 1))
    #expect(db.peer(owning: IPAddress("10.0.0.9")!) == nil)
}

@Test func keysRoundTripThroughBase64AndPrivateOnesNeverShow() throws {
    // RFC 7748 §6.1, Alice.
    let secret = hex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a")
    let key = try #require(PrivateKey(bytes: secret))
    #expect(key.publicKey.bytes == hex("8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a"))
    let text = key.revealBase64()
    #expect(text.count == 44)
    #expect(PrivateKey(base64: text)?.publicKey == key.publicKey)
    #expect(PublicKey(base64: key.publicKey.base64) == key.publicKey)
    #expect(!"\(key)".contains(text) && !String(reflecting: key).contains(text))
    #expect("\(key)".contains(key.publicKey.base64))
    for bad in ["", "abc", text + "A", String(text.dropLast(2)) + "==", String(repeating: "A", count: 43) + "!"] {
        #expect(PrivateKey(base64: bad) == nil, "\(bad)")
        #expect(PublicKey(base64: bad) == nil, "\(bad)")
    }
    let generated = try PrivateKey.generate()
    #expect(generated.publicKey != key.publicKey)
}

@Test func timestampsOrderAsTheirBytesDo() {
    let a = TAI64N(unixNanoseconds: 1_000_000_000_999_999_999)
    let b = a.successor
    #expect(a < b && b.nanoseconds == 0 && b.seconds == a.seconds + 1)
    #expect(a.bytes.lexicographicallyPrecedes(b.bytes))
    #expect(TAI64N(bytes: a.bytes[...]) == a)
    #expect(TAI64N(bytes: ([UInt8](repeating: 0xFF, count: 12))[...]) == nil)
    #expect("\(TAI64N(unixNanoseconds: 0))" == "@400000000000000a00000000")
}
