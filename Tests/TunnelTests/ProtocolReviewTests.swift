import Basics
import Testing
@testable import Tunnel

/// Regressions from a security review of the protocol core and its driver.
@Suite struct ProtocolReviewTests {
    /// A rekey whose initiation (or response) is lost is tried again after the retry time,
    /// instead of waiting forever while the session runs out.
    @Test func aLostRekeyHandshakeIsRetried() throws {
        var f = try ProtocolFixture()
        try f.connect()
        #expect(!f.client.needsHandshake(now: f.now))
        f.now = f.now + .seconds(121)  // past REKEY_AFTER_TIME
        #expect(f.client.needsHandshake(now: f.now))
        _ = try f.client.initiate(now: f.now, wallClock: ProtocolFixture.wall)  // lost on the way
        #expect(!f.client.needsHandshake(now: f.now + .seconds(4)), "the handshake in flight gets its time")
        #expect(f.client.needsHandshake(now: f.now + ClientCore.handshakeRetry), "then another is due")
        #expect(f.client.needsHandshake(now: f.now + .seconds(70)), "and stays due after the session expired")
    }

    /// A late or replayed initiation from an old address cannot drag the endpoint back.
    @Test func anInitiationDoesNotMoveTheEndpoint() throws {
        var f = try ProtocolFixture()
        let peer = try f.connect()
        var late = try f.client.initiate(now: f.now, wallClock: TAI64N(unixNanoseconds: 1_700_000_001_000_000_000))
        var data = try f.clientDatagram()
        _ = f.server.receive(&data, from: ProtocolFixture.roamedAddress, now: f.now)
        #expect(f.server.endpoint(of: peer) == ProtocolFixture.roamedAddress)
        _ = f.server.receive(&late, from: ProtocolFixture.clientAddress, now: f.now)
        #expect(f.server.endpoint(of: peer) == ProtocolFixture.roamedAddress)
    }

    /// One host guessing passwords cannot use up the server's Argon2id budget, and a replay of
    /// an initiation whose check is running or failed buys no second check.
    @Test func passwordChecksAreLimitedPerSourceAndNotRepeatedForReplays() throws {
        let hash = try PasswordHash.create(password: "right", cost: .minimum)
        let alice = User(name: "alice", addresses: [IPAddress("10.9.0.7")!], passwordHash: hash)
        var f = try ProtocolFixture(users: [alice], credentials: Credentials(username: "alice", password: "wrong")!,
                                    keyUser: false)
        var checks = 0
        var limited = 0
        for i in 0..<10 {
            var initiation = try f.client.initiate(now: f.now, wallClock: TAI64N(unixNanoseconds: 1_700_000_000_000_000_000 + UInt64(i)))
            switch f.send(&initiation, from: ProtocolFixture.attackerAddress) {
            case .checkPassword: checks += 1
            case .dropped(.rateLimited): limited += 1
            default: break
            }
        }
        #expect(checks == Int(ServerLimits().passwordChecksPerSource.burst), "the attacker burst")
        #expect(limited == 10 - checks)
        // The same initiation twice while its check is outstanding, and again once it failed: one check only.
        var g = try ProtocolFixture(users: [alice], credentials: Credentials(username: "alice", password: "wrong")!, keyUser: false)
        var first = try g.client.initiate(now: g.now, wallClock: ProtocolFixture.wall)
        guard case .checkPassword(let check) = g.send(&first) else {
            Issue.record("expected a password check")
            return
        }
        var replay = first  // as resent, with the cookie in mac2
        #expect(g.server.receive(&replay, from: ProtocolFixture.clientAddress, now: g.now) == .dropped(.replayedHandshake))
        guard case .rejected = g.server.finish(check, verified: check.verify(), now: g.now) else {
            Issue.record("a wrong password is refused")
            return
        }
        g.now = g.now + .seconds(10)
        replay = first
        #expect(g.server.receive(&replay, from: ProtocolFixture.clientAddress, now: g.now) == .dropped(.replayedHandshake),
                "a replay of a failed initiation costs no Argon2id")
    }
}
