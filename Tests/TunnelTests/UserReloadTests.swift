import Basics
import Testing
@testable import Tunnel

/// Replacing the users keeps the sessions of users listed exactly as before, under their new
/// slots, and ends everyone else's.
@Suite struct UserReloadTests {
    func packet(_ f: inout ProtocolFixture, _ byte: UInt8) throws -> [UInt8] {
        var framed = DataPacket.frame(ProtocolFixture.ipv4(payload: [byte]))
        try f.client.seal(&framed, now: f.now)
        return framed
    }

    @Test func aUserListedAsBeforeKeepsTheSessionUnderANewSlot() throws {
        let bob = User(publicKey: try PrivateKey.generate().publicKey, addresses: [IPAddress("10.9.0.3")!])
        let carol = User(publicKey: try PrivateKey.generate().publicKey, addresses: [IPAddress("10.9.0.4")!])
        var f = try ProtocolFixture(users: [bob])
        let alice = f.server.users.users[0]
        _ = try f.connect()
        var first = try packet(&f, 1)
        guard case .packet(let before, _) = f.server.receive(&first, from: ProtocolFixture.clientAddress, now: f.now) else {
            Issue.record("not opened")
            return
        }
        #expect(before.index == 0)
        // Carol comes first now, Bob goes: Alice's session moves to slot 1 with her keys.
        let (table, ended) = f.server.replaceUsers(try UserDatabase([carol, alice]))
        #expect(ended.isEmpty, "Bob had no session")
        #expect(table === f.server.sessions && table.livePeerCount == 1 && table.sessionCount == 1)
        var second = try packet(&f, 2)
        guard case .packet(let after, _) = f.server.receive(&second, from: ProtocolFixture.clientAddress, now: f.now) else {
            Issue.record("Alice's session did not survive: \(f.server.drops)")
            return
        }
        #expect(after.index == 1)
        // Packets to her inner address still find her session.
        let inner = ProtocolFixture.ipv4(from: IPAddress("10.9.0.1")!, to: ProtocolFixture.innerV4, payload: [3])
        var framed = DataPacket.frame(inner)
        let table2 = f.server.sessions
        let now = f.now
        let sealed = try framed.withUnsafeMutableBytes { raw in
            try table2.seal(raw, innerLength: inner.count, toInner: ProtocolFixture.innerV4, now: now)
        }
        #expect(sealed.destination == ProtocolFixture.clientAddress)
    }

    @Test func aRemovedOrChangedUserLosesTheSessionAndItsRoute() throws {
        var f = try ProtocolFixture()
        let alice = f.server.users.users[0]
        _ = try f.connect()
        var first = try packet(&f, 1)
        _ = f.server.receive(&first, from: ProtocolFixture.clientAddress, now: f.now)
        #expect(f.server.sessions.livePeerCount == 1)
        // Her addresses change: another user as far as sessions go.
        var moved = alice
        moved.addresses = [IPAddress("10.9.0.9")!]
        let (table, ended) = f.server.replaceUsers(try UserDatabase([moved]))
        #expect(ended == [alice.addresses], "her route goes")
        #expect(table.livePeerCount == 0 && table.sessionCount == 0)
        var second = try packet(&f, 2)
        #expect(f.server.receive(&second, from: ProtocolFixture.clientAddress, now: f.now).isSessionUnknown)
        // Her next handshake is accepted as the user she is now.
        f.now = f.now + .seconds(1)
        let peer = try f.connect(wall: TAI64N(unixNanoseconds: 1_700_000_001_000_000_000))
        #expect(peer.index == 0)
    }
}

extension ServerEvent {
    var isSessionUnknown: Bool { if case .sessionUnknown = self { true } else { false } }
}
