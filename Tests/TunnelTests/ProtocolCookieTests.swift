import Basics
import Testing
@testable import Tunnel
import Device

/// Cookies, the proof of address that keeps spoofed floods off Diffie-Hellman and Argon2id, and
/// the uniform answers that keep usernames secret.
@Suite struct ProtocolCookieTests {
    /// The fixture's wall clock `seconds` later.
    static func wall(_ seconds: UInt64) -> TAI64N { TAI64N(unixNanoseconds: 1_700_000_000_000_000_000 + seconds * 1_000_000_000) }

    /// A source in a /24 of its own (10.x.y.1): spoofed floods choose sources across the internet.
    static func spoofed(_ i: Int) -> SocketAddress { SocketAddress(.v4(0x0A00_0001 | UInt32(i) << 8), port: UInt16(1024 + i % 60_000)) }

    /// Initiations with a valid mac1 from strangers (keys nobody's); an attacker needs only the
    /// server's public key to make them.
    static func strangerInitiations(_ count: Int, server: PublicKey, credentials: Credentials? = nil) throws -> [[UInt8]] {
        try (0..<count).map { i in
            var stranger = try ClientCore(privateKey: .generate(), serverKey: server, credentials: credentials)
            return try stranger.initiate(now: Instant(nanoseconds: 1), wallClock: TAI64N(unixNanoseconds: 1_800_000_000_000_000_000 + UInt64(i)))
        }
    }

    /// Wrong-password logins from spoofed sources get cookie replies, never an Argon2id, and the
    /// real user, who can receive, logs in at once.
    @Test func spoofedSourcesNeverBuyAnArgon2id() throws {
        let hash = try PasswordHash.create(password: "correct horse battery", cost: .minimum)
        let alice = User(name: "alice", addresses: [IPAddress("10.9.0.5")!], passwordHash: hash)
        var f = try ProtocolFixture(users: [alice], credentials: Credentials(username: "alice", password: "correct horse battery"),
                                    keyUser: false)
        let guesses = try Self.strangerInitiations(
            8, server: f.serverKey.publicKey, credentials: Credentials(username: "alice", password: "guess"))
        var checks = 0
        for i in 0..<200 {
            f.now = f.now + .milliseconds(5)
            var guess = guesses[i % guesses.count]
            switch f.server.receive(&guess, from: Self.spoofed(i), now: f.now) {
            case .checkPassword: checks += 1
            case .cookie(let reply, let to):
                #expect(to == Self.spoofed(i))
                #expect(reply.count < guess.count, "a cookie reply never amplifies")
            default: break
            }
        }
        #expect(checks == 0)
        #expect(f.server.drops[.cookieRequired] == 200)
        let peer = try f.connect()
        #expect(f.server.users[peer].label == "alice")
    }

    /// A flood of spoofed initiations well past the server's handshake budget: every real
    /// handshake still succeeds, with one extra round trip for the cookie while under load.
    @Test func underAFloodEveryRealHandshakeSucceeds() throws {
        var f = try ProtocolFixture()
        let flood = try Self.strangerInitiations(8, server: f.serverKey.publicKey)
        var attempts = 0
        var succeeded = 0
        var cookies = 0
        var sent = 0
        // 1,400 spoofed initiations a second for 3 seconds; a real handshake every 250 ms (a
        // client makes one every two minutes, and retries after five seconds).
        for step in 0..<4200 {
            f.now = f.now + .nanoseconds(714_286)
            var initiation = flood[step % flood.count]
            _ = f.server.receive(&initiation, from: Self.spoofed(step), now: f.now)
            sent += 1
            guard step % 350 == 0 else { continue }
            attempts += 1
            var real = try f.client.initiate(now: f.now, wallClock: ProtocolFixture.wall)
            var event = f.server.receive(&real, from: ProtocolFixture.clientAddress, now: f.now)
            if case .cookie(var reply, _) = event, case .cookie(var resend) = f.client.receive(&reply, now: f.now) {
                cookies += 1
                event = f.server.receive(&resend, from: ProtocolFixture.clientAddress, now: f.now)
            }
            guard case .handshake(let peer, var response, _) = event else { continue }
            guard case .established(let done) = f.client.receive(&response, now: f.now) else { continue }
            var confirmation = done.confirmation
            if f.server.receive(&confirmation, from: ProtocolFixture.clientAddress, now: f.now) == .keepalive(from: peer) { succeeded += 1 }
        }
        #expect(sent == 4200)
        #expect(attempts == 12 && succeeded == attempts, "every real handshake succeeds: \(succeeded)/\(attempts)")
        #expect(cookies > 0, "the server was under load and asked for cookies")
        // Most of the flood costs a cookie reply, not Diffie-Hellman: only while the server is
        // not under load does it spend tokens, and then never below half the bucket.
        #expect(f.server.drops[.cookieRequired] > 2000)
        #expect(f.server.drops[.unknownUser] < 2000, "flood initiations that reached Diffie-Hellman: \(f.server.drops[.unknownUser])")
    }

    /// What a prober without secrets sees for a username does not depend on whether the user
    /// exists, has a password, pins a key, or logged in since the server started: with a
    /// password, a cookie, then an Argon2id, then a refusal; without one, a refusal at once.
    @Test func aProberLearnsNothingAboutUsernames() throws {
        let hash = try PasswordHash.create(password: "correct horse battery", cost: .minimum)
        let pinned = try PrivateKey.generate()
        let users = [
            User(name: "alice", addresses: [IPAddress("10.9.0.5")!], passwordHash: hash),
            User(name: "bob", publicKey: pinned.publicKey, addresses: [IPAddress("10.9.0.6")!]),
            User(name: "carol", publicKey: try PrivateKey.generate().publicKey, addresses: [IPAddress("10.9.0.7")!], passwordHash: hash),
        ]
        var f = try ProtocolFixture(users: users, credentials: Credentials(username: "alice", password: "correct horse battery"),
                                    keyUser: false)
        try f.connect(wall: Self.wall(1000))  // alice logged in: her last timestamp is set

        func probe(_ name: String, password: String?, wall: TAI64N) throws -> [String] {
            var prober = try ClientCore(
                privateKey: .generate(), serverKey: f.serverKey.publicKey,
                credentials: password.flatMap { Credentials(username: name, password: $0) })
            f.now = f.now + .seconds(5)  // past every per-source and per-account budget
            var initiation = try prober.initiate(now: f.now, wallClock: wall)
            var shape: [String] = []
            var event = f.server.receive(&initiation, from: ProtocolFixture.attackerAddress, now: f.now)
            for _ in 0..<3 {
                switch event {
                case .cookie(var reply, _):
                    shape.append("cookie")
                    guard case .cookie(var resend) = prober.receive(&reply, now: f.now) else { return shape + ["no resend"] }
                    event = f.server.receive(&resend, from: ProtocolFixture.attackerAddress, now: f.now)
                case .checkPassword(let check):
                    shape.append("argon2id")
                    #expect(check.hash.encoded.hasPrefix("$argon2id$v=19$m=8,t=1,p=1$"), "the same cost as the users' hashes")
                    event = f.server.finish(check, verified: check.verify(), now: f.now)
                case .rejected(_, var response, _):
                    #expect(prober.receive(&response, now: f.now) == .rejected)
                    return shape + ["rejected"]
                default:
                    return shape + ["\(event)"]
                }
            }
            return shape
        }
        let old = ProtocolFixture.wall  // older than alice's login
        let fresh = Self.wall(5000)
        for wall in [old, fresh] {
            for name in ["alice", "bob", "carol", "zed"] {
                #expect(try probe(name, password: "guess", wall: wall) == ["cookie", "argon2id", "rejected"], "\(name) with a password")
                #expect(try probe(name, password: nil, wall: wall) == ["rejected"], "\(name) without one")
            }
        }
    }

    /// A cookie proves one address and port: another sender cannot use it, and a cookie reply
    /// counts only for the initiation in flight, unaltered.
    @Test func aCookieProvesOneAddressOnly() throws {
        var f = try ProtocolFixture(limits: ServerLimits(handshakes: .init(perSecond: 1, burst: 1)))
        var first = try f.client.initiate(now: f.now, wallClock: ProtocolFixture.wall)
        #expect(f.send(&first) != .dropped(.rateLimited))  // a token, no cookie needed
        var second = try f.client.initiate(now: f.now, wallClock: Self.wall(1))
        guard case .cookie(let reply, _) = f.server.receive(&second, from: ProtocolFixture.clientAddress, now: f.now) else {
            Issue.record("under load, an initiation without mac2 gets a cookie reply")
            return
        }
        // Anyone else's, or one changed on the way: refused.
        var strangers = try ClientCore(privateKey: .generate(), serverKey: f.serverKey.publicKey)
        _ = try strangers.initiate(now: f.now, wallClock: ProtocolFixture.wall)
        var notTheirs = reply
        #expect(strangers.receive(&notTheirs, now: f.now) == .dropped(.unexpected))
        var tampered = reply
        tampered[40] ^= 1
        #expect(f.client.receive(&tampered, now: f.now) == .dropped(.handshakeFailed))
        var good = reply
        guard case .cookie(var resend) = f.client.receive(&good, now: f.now) else {
            Issue.record("the real reply is answered")
            return
        }
        var stolen = resend
        guard case .cookie = f.server.receive(&stolen, from: ProtocolFixture.attackerAddress, now: f.now) else {
            Issue.record("mac2 made for one address proves nothing from another")
            return
        }
        f.now = f.now + .seconds(1)
        guard case .handshake(_, var response, _) = f.server.receive(&resend, from: ProtocolFixture.clientAddress, now: f.now) else {
            Issue.record("with its cookie the client gets through: \(f.server.drops)")
            return
        }
        guard case .established = f.client.receive(&response, now: f.now) else {
            Issue.record("the handshake completes")
            return
        }
        var replyAgain = reply
        #expect(f.client.receive(&replyAgain, now: f.now) == .dropped(.unexpected), "no handshake in flight any more")
    }
}

/// Findings of a review of the cookies, each a regression test.
@Suite struct ProtocolCookieReviewTests {
    /// Names are compared byte for byte, so canonically equal spellings are other (unknown)
    /// accounts, not more budgets for one.
    @Test func namesAreComparedByteForByte() throws {
        let hash = try PasswordHash.create(password: "correct horse battery", cost: .minimum)
        let db = try UserDatabase([User(name: "Kate", addresses: [IPAddress("10.9.0.5")!], passwordHash: hash)])
        #expect(db.peer(named: "Kate") != nil)
        #expect(db.peer(named: "\u{212A}ate") == nil, "a Kelvin sign is not a K")
    }

    /// Forged cookie replies (anyone who saw the initiation can make them) cannot use up the
    /// client's answers: the real cookie is kept, and the next initiation carries it.
    @Test func forgedCookieRepliesDoNotBlockALogin() throws {
        var f = try ProtocolFixture(limits: ServerLimits(handshakes: .init(perSecond: 1, burst: 1)))
        var first = try f.client.initiate(now: f.now, wallClock: ProtocolFixture.wall)
        _ = f.send(&first)  // spends the only token: the server is under load from now on
        var initiation = try f.client.initiate(now: f.now, wallClock: ProtocolFixture.wall)
        let receiver = initiation.withUnsafeBytes { $0.loadLittleEndian(UInt32.self, at: Initiation.senderOffset) }
        let mac1 = initiation.withUnsafeBytes { Cookie.mac1(of: $0) }
        let key = Cookie.replyKey(serverKey: f.serverKey.publicKey)
        for _ in 0..<10 {
            var forged = CookieReply.seal(cookie: [UInt8](repeating: 7, count: 16), receiver: receiver, mac1: mac1, key: key)
            _ = f.client.receive(&forged, now: f.now)
        }
        guard case .cookie(var real, _) = f.server.receive(&initiation, from: ProtocolFixture.clientAddress, now: f.now) else {
            Issue.record("under load: a cookie reply")
            return
        }
        #expect(f.client.receive(&real, now: f.now) == .dropped(.rateLimited), "no more resends at once")
        f.now = f.now + .seconds(1)
        var next = try f.client.initiate(now: f.now, wallClock: ProtocolFixture.wall)
        guard case .handshake = f.server.receive(&next, from: ProtocolFixture.clientAddress, now: f.now) else {
            Issue.record("the next initiation carries the real cookie: \(f.server.drops)")
            return
        }
    }

    /// One host with a routed IPv6 prefix has thousands of /64s: its Argon2id budget is its /48's.
    @Test func aRoutedIPv6PrefixGetsOneNetworksArgon2idBudget() throws {
        let hash = try PasswordHash.create(password: "correct horse battery", cost: .minimum)
        let alice = User(name: "alice", addresses: [IPAddress("10.9.0.5")!], passwordHash: hash)
        var f = try ProtocolFixture(users: [alice], keyUser: false)
        var checks = 0
        for i in 0..<10 {
            // Made-up names, so the per-account budget does not hold them: only the network's does.
            var guesser = try ClientCore(privateKey: .generate(), serverKey: f.serverKey.publicKey,
                                         credentials: Credentials(username: "user\(i)", password: "guess"))
            var initiation = try guesser.initiate(now: f.now, wallClock: ProtocolFixture.wall)
            let source = SocketAddress(.v6(0x2001_0db8_0042_0000 | UInt64(i), 1), port: 4000)
            if case .checkPassword = f.send(&initiation, from: source, by: &guesser) { checks += 1 }
        }
        #expect(checks == Int(ServerLimits().passwordChecksPerNetwork.burst))
    }

    /// A cookie is good for two to four minutes, however late the secret is rotated.
    @Test func aCookieExpiresWithinTwoSecretLifetimes() throws {
        let serverKey = try PrivateKey.generate()
        var jar = CookieJar(serverKey: serverKey.publicKey)
        var holder = CookieHolder(serverKey: serverKey.publicKey)
        var client = try ClientCore(privateKey: .generate(), serverKey: serverKey.publicKey)
        let t0 = Instant(nanoseconds: 1_000_000_000)
        let source = ProtocolFixture.clientAddress
        var initiation = try client.initiate(now: t0, wallClock: ProtocolFixture.wall)
        let reply = initiation.withUnsafeBytes { jar.reply(to: $0, from: source, now: t0) }
        #expect(reply.withUnsafeBytes { holder.accept($0, mac1: initiation.withUnsafeBytes { Cookie.mac1(of: $0) }, now: t0) })
        holder.stamp(&initiation, now: t0)
        func proven(_ at: Duration) -> Bool { initiation.withUnsafeBytes { jar.isProven($0, from: source, now: t0 + at) } }
        #expect(proven(.seconds(100)))
        #expect(proven(.seconds(230)), "rotated at 230 s: the old secret is the previous one, 230 s old")
        #expect(!proven(.seconds(241)), "past two lifetimes of its secret")
        #expect(!initiation.withUnsafeBytes { jar.isProven($0, from: ProtocolFixture.roamedAddress, now: t0) }, "another address")
    }

    @Test func aMalformedHashIsRefusedWhenTheUsersAreRead() {
        #expect(PasswordHash(encoded: "$argon2id$v=19$m=65536,t=2,p=1$notbase64!$x") == nil)
        #expect(PasswordHash(encoded: "$argon2id$") == nil)
    }
}

/// The server's queue of initiations for its handshake thread: first in, first out, bounded,
/// and a datagram comes out as it went in.
@Test func theInitiationQueueIsBoundedAndKeepsOrder() {
    var queue = InitiationQueue(capacity: 3)
    let source = ProtocolFixture.clientAddress
    for n in 1...4 {
        let datagram = [UInt8](repeating: UInt8(n), count: 100 + n)
        let pushed = datagram.withUnsafeBytes { queue.push($0, from: source, at: .v4(0xC633_6407 + UInt32(n))) }
        #expect(pushed == (n <= 3), "datagram \(n)")
    }
    #expect([UInt8](repeating: 0, count: Initiation.maxLength + 1).withUnsafeBytes { queue.push($0, from: source) } == false)
    var buffer = [UInt8](repeating: 0, count: 2048)
    for n in 1...3 {
        guard let (length, from, local) = queue.pop(into: &buffer) else {
            Issue.record("datagram \(n) missing")
            return
        }
        #expect(length == 100 + n && from == source && buffer[0..<length].allSatisfy { $0 == UInt8(n) })
        #expect(local == .v4(0xC633_6407 + UInt32(n)), "the address it was sent to comes out with it")
        let refill = [UInt8](repeating: 9, count: 50)
        if n == 1 { #expect(refill.withUnsafeBytes { queue.push($0, from: source) }, "room again, wrapping around") }
    }
    #expect(queue.pop(into: &buffer).map { $0.0 } == 50)
    #expect(queue.pop(into: &buffer) == nil)
}

/// A driver runs a handshake's Diffie-Hellman steps outside its lock, so two handshakes of one
/// user can finish in either order: the older one, completed last, is a replay and changes nothing.
@Test func handshakesInStepsFinishInEitherOrder() throws {
    var f = try ProtocolFixture()
    let key = f.server.handshakeKey
    var plans: [PlannedResponse] = []
    for second in [1, 2] as [UInt64] {
        let initiation = try f.client.initiate(now: f.now, wallClock: TAI64N(unixNanoseconds: 1_700_000_000_000_000_000 + second * 1_000_000_000))
        guard case .admitted(let admitted) = initiation.withUnsafeBytes({ f.server.admit($0, from: ProtocolFixture.clientAddress, now: f.now) }),
              case .respond(let plan) = f.server.decide(admitted.open(with: key), now: f.now)
        else {
            Issue.record("initiation \(second) not admitted: \(f.server.drops)")
            return
        }
        plans.append(plan)
    }
    let newer = plans[1].write()
    let older = plans[0].write()
    guard case .handshake(_, var response, _) = f.server.complete(newer, now: f.now) else {
        Issue.record("the newer handshake completes")
        return
    }
    #expect(f.server.complete(older, now: f.now) == .dropped(.replayedHandshake))
    #expect(f.server.sessionCount == 1)
    guard case .established = f.client.receive(&response, now: f.now) else {
        Issue.record("the client takes the newer response (its handshake in flight)")
        return
    }
}

/// A peer's initiation waits behind one flood initiation at most, however full everyone else's
/// queue is; and a full peers' queue never keeps everyone else's waiting either.
@Test func peersInitiationsTakeTurnsWithEveryoneElses() {
    var queues = HandshakeQueues(capacity: 8)
    let flood = SocketAddress(.v4(0x6440_0002), port: 5000)
    let peer = ProtocolFixture.clientAddress
    for n in 0..<8 { #expect([UInt8](repeating: UInt8(n), count: 200).withUnsafeBytes { queues.push($0, from: flood, fromPeer: false) }) }
    #expect(![UInt8](repeating: 9, count: 200).withUnsafeBytes { queues.push($0, from: flood, fromPeer: false) }, "everyone else's is full")
    var buffer = [UInt8](repeating: 0, count: 2048)
    #expect(queues.pop(into: &buffer)?.1 == flood)
    #expect([UInt8](repeating: 1, count: 200).withUnsafeBytes { queues.push($0, from: peer, fromPeer: true) }, "the peer still gets in")
    let next = [queues.pop(into: &buffer)?.1, queues.pop(into: &buffer)?.1]
    #expect(next.contains(peer), "\(next)")
    for _ in 0..<2 { #expect([UInt8](repeating: 1, count: 200).withUnsafeBytes { queues.push($0, from: peer, fromPeer: true) }) }
    let order = (0..<4).map { _ in queues.pop(into: &buffer)?.1 }
    #expect(order.filter { $0 == flood }.count == 2, "taken in turn: \(order)")
}

/// The lane is chosen by the source address alone, before any check: one address (a peer's,
/// which someone may send from) holds at most `perSourceInPeers` places in the peers' queue
/// (a version 3 rekey's messages and a resend), and what it sends beyond them waits with
/// everyone else's; another peer still finds room.
@Test func oneAddressCannotFillThePeersQueue() {
    let places = HandshakeQueues.perSourceInPeers
    var queues = HandshakeQueues(capacity: 32)  // the peers' queue holds 8
    let spoofed = ProtocolFixture.clientAddress
    let other = SocketAddress(.v4(0xc000_0207), port: 41000)
    var buffer = [UInt8](repeating: 0, count: 2048)
    for _ in 0..<12 { #expect([UInt8](repeating: 7, count: 200).withUnsafeBytes { queues.push($0, from: spoofed, fromPeer: true) }) }
    #expect([UInt8](repeating: 8, count: 200).withUnsafeBytes { queues.push($0, from: other, fromPeer: true) }, "another peer gets in")
    // Taken in turn: the peers' lane holds the busy address's places and the other peer's,
    // which comes after them and as many of everyone else's.
    let lanes = (0..<(2 * places + 1)).map { _ in queues.pop(into: &buffer)?.1 }
    #expect(lanes.last == other, "the other peer's initiation waited behind at most \(2 * places): \(lanes)")
    // Everyone else's queue took the rest: nothing from the busy address got more places in
    // the peers' queue.
    #expect(queues.count == 13 - lanes.count)
    // Past its places and a full queue of everyone else's, what it sends is dropped.
    var full = HandshakeQueues(capacity: 32)
    for n in 0..<(32 + places) {
        #expect([UInt8](repeating: 1, count: 200).withUnsafeBytes { full.push($0, from: spoofed, fromPeer: true) }, "\(n)")
    }
    #expect(![UInt8](repeating: 1, count: 200).withUnsafeBytes { full.push($0, from: spoofed, fromPeer: true) })
    #expect(full.count == 32 + places)
}
