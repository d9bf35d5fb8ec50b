import Basics
import Device
import Testing
@testable import Tunnel

/// Version 3 between the client's core and the gateway's, beside version 2 on the same gateway:
/// the whole handshake, the negotiated cipher, the operator's limits (versions, a pinned
/// cipher), and every way a message can be missing, late, replayed or changed.
struct ProtocolVersion3Tests {
    typealias Fixture = ProtocolFixture

    /// A whole handshake: two parts (the first kept, nothing sent), the response, the identity,
    /// the verdict; then packets both ways on the chosen cipher, in version 3's datagrams.
    @Test(arguments: [CipherSuite.chacha20Poly1305, .aes256GCM])
    func aHandshakeGivesBothSidesASessionOnTheChosenCipher(_ cipher: CipherSuite) throws {
        var f = try Fixture(version: 3, cipher: cipher)
        let outcome = try f.handshake()
        guard case .handshake(let peer, _, let to) = outcome.server, case .established(let done) = outcome.client else {
            Issue.record("no session: \(outcome.server) \(String(describing: outcome.client)) server drops \(f.server.drops)")
            return
        }
        #expect(to == Fixture.clientAddress)
        #expect(outcome.sent.map(\.count) == [1224, 104, 328], "first part, second part, identity")
        #expect(outcome.received.map(\.count).first == 1164 && outcome.received.count == 2, "response, verdict")
        #expect(outcome.received.allSatisfy { $0[0] == 3 } && outcome.sent.allSatisfy { $0[0] == 3 })
        // The server never sends more than it received, message by message.
        #expect(outcome.received[0].count < outcome.sent[0].count + outcome.sent[1].count)
        #expect(outcome.received[1].count < outcome.sent[2].count)
        #expect(done.addresses == [Fixture.innerV4, Fixture.innerV6])
        #expect(f.client.session == SessionProtocol(version: 3, cipher: cipher))

        var confirmation = done.confirmation
        #expect(confirmation[0] == 3)
        #expect(f.server.receive(&confirmation, from: Fixture.clientAddress, now: f.now) == .keepalive(from: peer))
        let packet = Fixture.ipv4(payload: Array("over version 3".utf8))
        var datagram = try f.clientDatagram(packet)
        guard case .packet(peer, let range) = f.server.receive(&datagram, from: Fixture.clientAddress, now: f.now) else {
            Issue.record("packet not delivered: \(f.server.drops)")
            return
        }
        #expect(Array(datagram[range]) == packet)
        var back = try f.serverDatagram(Fixture.ipv4(from: IPAddress("10.9.0.1")!, to: Fixture.innerV4, payload: [9]), to: peer)
        #expect(back[0] == 3)
        guard case .packet = f.client.receive(&back, now: f.now) else {
            Issue.record("reply not delivered: \(f.client.drops)")
            return
        }
        #expect(f.server.sessions.newestProtocol(of: peer) == SessionProtocol(version: 3, cipher: cipher))
        #expect(f.server.drops.total == 0 && f.client.drops.total == 0)
    }

    /// Without a pin, the gateway picks AES-256-GCM only when both ends have AES in hardware.
    @Test func theGatewayChoosesByBothEndsHardware() throws {
        var f = try Fixture(version: 3)
        _ = try f.handshake()
        let expected: CipherSuite = CipherSuite.aesInHardware ? .aes256GCM : .chacha20Poly1305
        #expect(f.client.session == SessionProtocol(version: 3, cipher: expected))
    }

    /// One gateway, a version 2 client and a version 3 client at once (a fleet mid-rollout).
    @Test func oneGatewayServesBothVersionsAtOnce() throws {
        let old = try PrivateKey.generate()
        var f = try Fixture(users: [User(publicKey: old.publicKey, addresses: [IPAddress("10.9.0.3")!])], version: 3)
        var v2 = try ClientCore(privateKey: old, serverKey: f.serverKey.publicKey)
        var initiation = try v2.initiate(now: f.now, wallClock: Fixture.wall)
        guard case .handshake(let oldPeer, var response, _) = f.server.receive(&initiation, from: Fixture.attackerAddress, now: f.now),
              case .established = v2.receive(&response, now: f.now) else {
            Issue.record("version 2 refused: \(f.server.drops)")
            return
        }
        guard let newPeer = f.establish() else { return }
        #expect(v2.session == SessionProtocol(version: 2, cipher: .chacha20Poly1305))
        #expect(f.server.sessions.newestProtocol(of: oldPeer)?.version == 2)
        #expect(f.server.sessions.newestProtocol(of: newPeer)?.version == 3)
        #expect(f.server.sessions.liveProtocols.values.reduce(0, +) == 1, "only the version 3 client sent a packet yet")
    }

    /// `allow-versions:` closes a version: its handshakes are dropped and counted, the other's go on.
    @Test(arguments: [UInt8(2), 3])
    func aVersionTheOperatorClosedIsRefused(_ closed: UInt8) throws {
        let open: UInt8 = closed == 2 ? 3 : 2
        var refused = try Fixture(version: closed, protocols: ProtocolPolicy(versions: [open]))
        let outcome = try refused.handshake()
        #expect(outcome.server == .dropped(.versionNotAllowed))
        #expect(refused.server.drops[.versionNotAllowed] == UInt64(closed == 3 ? 2 : 1), "each part counted")
        #expect(refused.server.sessionCount == 0)
        var allowed = try Fixture(version: open, protocols: ProtocolPolicy(versions: [open]))
        #expect(allowed.establish() != nil)
    }

    /// A pinned cipher: clients that offer it get it; a client that offers only another one
    /// is told (an authenticated "none") and the refusal is counted, never a downgrade.
    @Test func aPinnedCipherIsUsedOrTheHandshakeEnds() throws {
        var f = try Fixture(version: 3, protocols: ProtocolPolicy(cipher: .chacha20Poly1305))
        #expect(f.establish() != nil)
        #expect(f.client.session?.cipher == .chacha20Poly1305)

        var g = try Fixture(version: 3, cipher: .aes256GCM, protocols: ProtocolPolicy(cipher: .chacha20Poly1305))
        let outcome = try g.handshake()
        #expect(outcome.server == .rejected(.noCommonCipher, response: outcome.received.last ?? [], to: Fixture.clientAddress))
        #expect(outcome.client == .rejected)
        #expect(g.server.drops[.noCommonCipher] == 1 && g.server.sessionCount == 0 && g.client.session == nil)
    }

    /// The choice is in the transcript: a changed offer or choice fails where it is read, so
    /// an active attacker cannot steer the cipher.
    @Test func aChangedOfferOrChoiceFails() throws {
        var f = try Fixture(version: 3)
        let mac1 = Mac1(serverKey: f.serverKey.publicKey)
        let outcome = try f.handshake(tamper: { datagram in
            if datagram[1] == WireV3.Kind.initiationRest.rawValue { datagram[WireV3.RestPart.offerOffset] ^= 2 }
            mac1.stamp(&datagram)
        })
        #expect(outcome.server == .dropped(.handshakeFailed))

        var g = try Fixture(version: 3)
        var parts = try g.client.initiation(now: g.now, wallClock: Fixture.wall)
        #expect(g.server.receive(&parts[0], from: Fixture.clientAddress, now: g.now) == .held)
        guard case .reply(var response, _) = g.server.receive(&parts[1], from: Fixture.clientAddress, now: g.now) else {
            Issue.record("no response")
            return
        }
        response[WireV3.ResponseV3.choiceOffset] ^= 3
        #expect(g.client.receive(&response, now: g.now) == .dropped(.handshakeFailed))
    }

    /// The parts must belong together and arrive in time, from one source.
    @Test func aSecondPartWithoutItsFirstIsDroppedBeforeAnyWork() throws {
        var f = try Fixture(version: 3)
        var parts = try f.client.initiation(now: f.now, wallClock: Fixture.wall)
        var second = parts[1]
        #expect(f.server.receive(&second, from: Fixture.clientAddress, now: f.now) == .dropped(.missingPart))
        // The first part from another address does not count.
        #expect(f.server.receive(&parts[0], from: Fixture.attackerAddress, now: f.now) == .held)
        second = parts[1]
        #expect(f.server.receive(&second, from: Fixture.clientAddress, now: f.now) == .dropped(.missingPart))
        // Nor one older than two seconds.
        #expect(f.server.receive(&parts[0], from: Fixture.clientAddress, now: f.now) == .held)
        f.now = f.now + InitiationParts.lifetime
        second = parts[1]
        #expect(f.server.receive(&second, from: Fixture.clientAddress, now: f.now) == .dropped(.missingPart))
        // Parts of two initiations with the same index: the offer does not open under the other's KEM key.
        var other = try f.client.initiation(now: f.now, wallClock: Fixture.wall)
        let index = parts[0].withUnsafeBytes { $0.loadLittleEndian(UInt32.self, at: 4) }
        other[0].replaceSubrange(4..<8, with: withUnsafeBytes(of: index.littleEndian) { Array($0) })
        Mac1(serverKey: f.serverKey.publicKey).stamp(&other[0])
        #expect(f.server.receive(&other[0], from: Fixture.clientAddress, now: f.now) == .held)
        second = parts[1]
        #expect(f.server.receive(&second, from: Fixture.clientAddress, now: f.now) == .dropped(.handshakeFailed))
        #expect(f.server.drops[.missingPart] == 3 && f.server.admissions.general == 1, "only the mismatched pair reached the budgets")
    }

    /// A KEM key that is no encoding of one (a coefficient of q or more), from a client that
    /// sealed its offer over it: the encapsulation refuses it, counted as malformed.
    @Test func aMalformedKEMKeyIsDroppedAndCounted() throws {
        var f = try Fixture(version: 3)
        var badKey = MLKEM.KeyPair().publicKey
        badKey[0] = 0xFF  // the first 12-bit coefficient: 4095, and q is 3329
        badKey[1] |= 0x0F
        let ephemeral = PrivateKey.random()
        var symmetric = SymmetricState(protocolName: HybridHandshake.protocolName)
        symmetric.mixHash(HybridHandshake.prologue)
        symmetric.mixHash(f.serverKey.publicKey.bytes)
        symmetric.mixHash(badKey)
        symmetric.mixHash(ephemeral.publicKey.bytes)
        symmetric.mixKey(try #require(Primitives.dh(ephemeral, f.serverKey.publicKey)))
        let offer = WireV3.Offer(suites: [.chacha20Poly1305], preferred: .chacha20Poly1305, aesHardware: false)
        let index: [UInt8] = [1, 2, 3, 4]
        let macs = [UInt8](repeating: 0, count: Initiation.macsLength)
        var first = WireV3.header(.kemKey) + index + badKey + macs
        var second = WireV3.header(.initiationRest) + index + ephemeral.publicKey.bytes + symmetric.encryptAndHash(offer.encoded()) + macs
        let mac1 = Mac1(serverKey: f.serverKey.publicKey)
        mac1.stamp(&first)
        mac1.stamp(&second)
        #expect(f.server.receive(&first, from: Fixture.clientAddress, now: f.now) == .held)
        #expect(f.server.receive(&second, from: Fixture.clientAddress, now: f.now) == .dropped(.malformed))
        #expect(f.server.drops[.malformed] == 1 && f.server.halfOpen.count == 0)

        // The same key changed after the client sealed its offer over the real one fails sooner.
        let outcome = try f.handshake(tamper: { datagram in
            guard datagram[1] == WireV3.Kind.kemKey.rawValue else { return }
            datagram[WireV3.KEMKeyPart.keyOffset] ^= 1
            mac1.stamp(&datagram)
        })
        #expect(outcome.server == .dropped(.handshakeFailed))
        #expect(f.server.sessionCount == 0)
    }

    /// Every identity is for one response and comes from where the response went: one from
    /// elsewhere finds nothing, a forgery (someone who saw the response and spoofs the client's
    /// address) does not end the real handshake, a copy of the real one finds nothing, and a
    /// late one neither.
    @Test func anIdentityIsTakenOnceFromItsAddressAndInTime() throws {
        var f = try Fixture(version: 3)
        guard let identity = try f.identity() else { return }
        var elsewhere = identity
        #expect(f.server.receive(&elsewhere, from: Fixture.attackerAddress, now: f.now) == .dropped(.unexpected))
        var forged = identity
        forged[WireV3.Identity.payloadOffset] ^= 1
        for _ in 0..<(HalfOpenHandshakes.attempts - 1) {
            var copy = forged
            #expect(f.server.receive(&copy, from: Fixture.clientAddress, now: f.now) == .dropped(.handshakeFailed))
        }
        var real = identity
        guard case .handshake(_, var verdict, _) = f.server.receive(&real, from: Fixture.clientAddress, now: f.now),
              case .established = f.client.receive(&verdict, now: f.now) else {
            Issue.record("the real identity did not get through after the forgeries: \(f.server.drops)")
            return
        }
        var again = identity
        #expect(f.server.receive(&again, from: Fixture.clientAddress, now: f.now) == .dropped(.unexpected))

        // A few forgeries at most: then the handshake is given up.
        var e = try Fixture(version: 3)
        guard let sent = try e.identity() else { return }
        var bad = sent
        bad[WireV3.Identity.payloadOffset] ^= 1
        for _ in 0..<HalfOpenHandshakes.attempts {
            var copy = bad
            _ = e.server.receive(&copy, from: Fixture.clientAddress, now: e.now)
        }
        var afterThem = sent
        #expect(e.server.receive(&afterThem, from: Fixture.clientAddress, now: e.now) == .dropped(.unexpected))

        // Late: the half-open handshake is gone after five seconds.
        var g = try Fixture(version: 3)
        guard let late = try g.identity() else { return }
        g.now = g.now + HalfOpenHandshakes.lifetime
        var copy = late
        #expect(g.server.receive(&copy, from: Fixture.clientAddress, now: g.now) == .dropped(.unexpected))
        #expect(g.server.sessionCount == 0)
    }

    /// Users and passwords as in version 2, the password sealed under both ephemeral secrets;
    /// no cookie round trip before Argon2id (the identity proves the address).
    @Test func passwordsAreCheckedWithoutACookieAndRefusalsAreAnswered() throws {
        let hash = try PasswordHash.create(password: "correct horse", cost: .minimum)
        let alice = User(name: "alice", addresses: [IPAddress("10.9.0.7")!], passwordHash: hash)
        var f = try Fixture(users: [alice], credentials: Credentials(username: "alice", password: "correct horse"), keyUser: false,
                            version: 3)
        var events: [ServerEvent] = []
        var outgoing = try f.client.initiation(now: f.now, wallClock: Fixture.wall)
        for var part in outgoing { events.append(f.server.receive(&part, from: Fixture.clientAddress, now: f.now)) }
        guard case .reply(var response, _) = events.last, case .send(let identity) = f.client.receive(&response, now: f.now) else {
            Issue.record("no response: \(events)")
            return
        }
        outgoing = identity
        guard case .checkPassword(let check) = f.server.receive(&outgoing[0], from: Fixture.clientAddress, now: f.now) else {
            Issue.record("no password check")
            return
        }
        #expect(!check.password.isWiped)
        let verified = check.verify()
        #expect(check.password.isWiped, "the check's password is wiped once checked")
        guard case .hybrid = check.initiation.handshake else {
            Issue.record("not a version 3 handshake")
            return
        }
        guard case .handshake(_, var verdict, _) = f.server.finish(check, verified: verified, now: f.now),
              case .established(let done) = f.client.receive(&verdict, now: f.now) else {
            Issue.record("not accepted")
            return
        }
        #expect(done.addresses == [IPAddress("10.9.0.7")!])
        #expect(f.server.drops[.cookieRequired] == 0)

        var wrong = try Fixture(users: [alice], credentials: Credentials(username: "alice", password: "wrong"), keyUser: false,
                                version: 3)
        let outcome = try wrong.handshake()
        guard case .rejected(.badPassword, _, _) = outcome.server else {
            Issue.record("not refused: \(outcome.server)")
            return
        }
        #expect(outcome.client == .rejected, "the client is told, and stops")
        #expect(wrong.server.sessionCount == 0)
    }

    /// Under load both parts need a cookie; the client resends both with it and gets through.
    @Test func underLoadBothPartsProveTheirAddress() throws {
        let tight = ServerLimits(handshakes: ServerLimits.Rate(perSecond: 0.001, burst: 4))
        var f = try Fixture(limits: tight, version: 3)
        // Three handshakes from elsewhere leave one of four: the server is under load.
        for n in 0..<3 {
            var other = try ClientCore(privateKey: PrivateKey.generate(), serverKey: f.serverKey.publicKey, version: 3)
            var parts = try other.initiation(now: f.now, wallClock: Fixture.wall)
            let from = SocketAddress(.v4(0x0A00_0000 | UInt32(n) << 8), port: 1000)
            #expect(f.server.receive(&parts[0], from: from, now: f.now) == .held)
            guard case .reply = f.server.receive(&parts[1], from: from, now: f.now) else {
                Issue.record("the load's handshake \(n) was not answered: \(f.server.drops)")
                return
            }
        }
        let outcome = try f.handshake()
        #expect(outcome.received.first.map { Array($0[0..<2]) } == [3, WireV3.Kind.cookieReply.rawValue], "a cookie reply in version 3")
        guard case .established = outcome.client else {
            Issue.record("not through: \(outcome.server) \(f.server.drops)")
            return
        }
        #expect(f.server.drops[.cookieRequired] == 1)
    }

    /// A data packet for a session the gateway does not hold draws a hint in the packet's
    /// version, which the client takes as the sign to handshake again.
    @Test func theHintSpeaksThePacketsVersion() throws {
        var f = try Fixture(version: 3)
        guard f.establish() != nil else { return }
        var restarted = try ServerCore(privateKey: f.serverKey, users: f.server.users)
        var datagram = try f.clientDatagram()
        guard case .sessionUnknown(var hint, _) = restarted.receive(&datagram, from: Fixture.clientAddress, now: f.now) else {
            Issue.record("no hint")
            return
        }
        #expect(hint[0] == 3)
        #expect(f.client.receive(&hint, now: f.now) == .sessionUnknown)
    }

    /// A response whose identity never comes leaves nothing behind after five seconds.
    @Test func anUnansweredResponseIsForgotten() throws {
        var f = try Fixture(version: 3)
        var parts = try f.client.initiation(now: f.now, wallClock: Fixture.wall)
        _ = f.server.receive(&parts[0], from: Fixture.clientAddress, now: f.now)
        guard case .reply = f.server.receive(&parts[1], from: Fixture.clientAddress, now: f.now) else {
            Issue.record("no response")
            return
        }
        #expect(f.server.halfOpen.count == 1)
        f.server.tick(now: f.now + .seconds(4))
        #expect(f.server.halfOpen.count == 1)
        f.now = f.now + HalfOpenHandshakes.lifetime + .seconds(1)
        f.server.tick(now: f.now)
        #expect(f.server.halfOpen.count == 0)
        // And a first part whose second never comes, after two.
        var again = try f.client.initiation(now: f.now, wallClock: Fixture.wall)
        _ = f.server.receive(&again[0], from: Fixture.clientAddress, now: f.now)
        #expect(f.server.firstParts.count == 1)
        f.server.tick(now: f.now + .seconds(1))
        #expect(f.server.firstParts.count == 1)
        f.server.tick(now: f.now + InitiationParts.lifetime)
        #expect(f.server.firstParts.count == 0)
    }
}

/// A client's fallback: only when configured, only after version 3 handshakes went wholly
/// unanswered, and only for a while.
struct ProtocolFallbackTests {
    typealias Fixture = ProtocolFixture

    /// Against a gateway that closed version 3 (or predates it): two silent version 3
    /// handshakes, then version 2, kept for ten minutes, then version 3 again.
    @Test func aClientFallsBackOnlyWhenToldAndOnlyForAWhile() throws {
        var f = try Fixture(version: 3, protocols: ProtocolPolicy(versions: [2]))
        f.client = try ClientCore(privateKey: f.clientKey, serverKey: f.serverKey.publicKey, version: 3, fallback: true)
        var versions: [UInt8] = []
        for _ in 0..<3 {
            #expect(f.client.nextVersion(now: f.now) == (versions.count < 2 ? 3 : 2))
            let outcome = try f.handshake()
            versions.append(outcome.sent[0][0])
            f.now = f.now + ClientCore.handshakeRetry
        }
        #expect(versions == [3, 3, 2])
        #expect(f.client.session == SessionProtocol(version: 2, cipher: .chacha20Poly1305))
        #expect(f.server.drops[.versionNotAllowed] == 4, "both parts of two handshakes")
        // Rekeys stay on version 2 for ten minutes, then version 3 is tried again.
        f.now = f.now + .seconds(120)
        #expect(try f.handshake().sent[0][0] == 2)
        f.now = f.now + ClientCore.fallbackHold
        #expect(f.client.nextVersion(now: f.now) == 3)
        #expect(try f.handshake().sent[0][0] == 3)

        // Without the setting, version 3 it stays, whatever happens.
        var strict = try Fixture(version: 3, protocols: ProtocolPolicy(versions: [2]))
        for _ in 0..<4 {
            #expect(try strict.handshake().sent[0][0] == 3)
            strict.now = strict.now + ClientCore.handshakeRetry
        }
        #expect(strict.client.session == nil)
    }

    /// An answer of any kind (a cookie reply, a response) shows the gateway speaks version 3:
    /// a handshake that then fails is no reason to fall back.
    @Test func anAnsweredHandshakeIsNoReasonToFallBack() throws {
        var f = try Fixture(version: 3)
        f.client = try ClientCore(privateKey: f.clientKey, serverKey: f.serverKey.publicKey, version: 3, fallback: true)
        for _ in 0..<3 {
            // The response comes, the identity is lost.
            var parts = try f.client.initiation(now: f.now, wallClock: Fixture.wall)
            #expect(parts[0][0] == 3)
            _ = f.server.receive(&parts[0], from: Fixture.clientAddress, now: f.now)
            guard case .reply(var response, _) = f.server.receive(&parts[1], from: Fixture.clientAddress, now: f.now) else {
                Issue.record("no response")
                return
            }
            _ = f.client.receive(&response, now: f.now)
            f.now = f.now + ClientCore.handshakeRetry
        }
        #expect(f.client.nextVersion(now: f.now) == 3)
    }
}

extension ProtocolFixture {
    /// A version 3 handshake up to the client's identity: both parts and the response
    /// delivered from the client's address; the identity, not yet sent (nil, recorded, when the
    /// handshake did not get that far).
    mutating func identity() throws -> [UInt8]? {
        var parts = try client.initiation(now: now, wallClock: Self.wall)
        _ = server.receive(&parts[0], from: Self.clientAddress, now: now)
        guard case .reply(var response, _) = server.receive(&parts[1], from: Self.clientAddress, now: now),
              case .send(let identities) = client.receive(&response, now: now), let identity = identities.first else {
            Issue.record("no identity: \(server.drops)")
            return nil
        }
        return identity
    }

    /// A version 3 (or 2) handshake to its end, the confirmation delivered; the peer, or nil
    /// (recorded) when it did not come to a session.
    mutating func establish(from source: SocketAddress = clientAddress) -> PeerID? {
        guard let outcome = try? handshake(from: source), case .handshake(let peer, _, _) = outcome.server,
              case .established(let done) = outcome.client else {
            Issue.record("no session: \(server.drops)")
            return nil
        }
        var confirmation = done.confirmation
        guard server.receive(&confirmation, from: source, now: now) == .keepalive(from: peer) else {
            Issue.record("confirmation not taken")
            return nil
        }
        return peer
    }
}
