import Basics
import Device
import Testing
@testable import Tunnel

/// The gateway's table of first parts: bounded in all and per address, parts expire, a full
/// table refuses rather than pushes out, and a part is taken once.
struct InitiationPartsTests {
    let key = [UInt8](repeating: 7, count: 1184)
    func address(_ n: UInt32, port: UInt16 = 4000) -> SocketAddress { SocketAddress(.v4(0x0a00_0000 | n), port: port) }

    @Test func aPartIsTakenOnceAndOnlyByItsSourceAndIndex() throws {
        var table = InitiationParts()
        try table.keep(key, from: address(1), index: 9, now: .zero)
        #expect(table.take(from: address(2), index: 9, now: .zero) == nil, "another address")
        #expect(table.take(from: address(1, port: 4001), index: 9, now: .zero) == nil, "another port")
        #expect(table.take(from: address(1), index: 8, now: .zero) == nil, "another index")
        #expect(table.take(from: address(1), index: 9, now: .zero + .milliseconds(500)) == key)
        #expect(table.take(from: address(1), index: 9, now: .zero + .milliseconds(600)) == nil, "taken once")
        #expect(table.count == 0)
    }

    @Test func partsExpire() throws {
        var table = InitiationParts()
        try table.keep(key, from: address(1), index: 1, now: .zero)
        #expect(table.take(from: address(1), index: 1, now: .zero + InitiationParts.lifetime) == nil)
        // Expired parts make room again, and give their address's places back.
        var small = InitiationParts(capacity: 2, perSource: 2)
        try small.keep(key, from: address(1), index: 1, proven: true, now: .zero)
        try small.keep(key, from: address(1), index: 2, proven: true, now: .zero)
        #expect(throws: InitiationParts.Refusal.tooManyFromSource) { try small.keep(key, from: address(1), index: 3, proven: true, now: .zero) }
        #expect(throws: InitiationParts.Refusal.full) { try small.keep(key, from: address(2), index: 1, proven: true, now: .zero) }
        try small.keep(key, from: address(1), index: 3, proven: true, now: .zero + .seconds(3))
        try small.keep(key, from: address(2), index: 1, proven: true, now: .zero + .seconds(3))
        #expect(small.count == 2)
    }

    /// One address (any port) holds at most its share; a full table keeps what it has: a flood
    /// that fills it cannot push out a real client's first part.
    @Test func oneAddressAndAFloodAreBounded() throws {
        var table = InitiationParts(capacity: 16, perSource: 4)
        try table.keep(key, from: address(99), index: 1, proven: true, now: .zero)
        for port in 0..<10 {
            let kept = (try? table.keep(key, from: address(1, port: UInt16(5000 + port)), index: UInt32(port), proven: true, now: .zero)) != nil
            #expect(kept == (port < 4), "port \(port)")
        }
        for n in 2..<40 { try? table.keep(key, from: address(UInt32(n) << 8), index: 1, proven: true, now: .zero) }
        #expect(table.count == 16)
        #expect(table.take(from: address(99), index: 1, now: .zero + .milliseconds(100)) == key, "the first one stayed")
        // The same part again replaces, never counts twice.
        try table.keep(key, from: address(2 << 8), index: 1, proven: true, now: .zero + .milliseconds(200))
        #expect(table.count == 15)
    }

    /// mac1 proves nothing (anyone computes it, and a part replays from any source): parts whose
    /// senders did not prove their address take at most half of each bound, and say so before
    /// they are refused; proven ones take the rest; only proven parts from a peer's address take
    /// the peers' share.
    @Test func unprovenPartsTakeHalfAndProvenOnesTheRest() throws {
        var table = InitiationParts(capacity: 8, peerCapacity: 2, perSource: 4, perNetwork: 32)
        // One host: two unproven, then it must prove itself, and proven ones fill its four.
        let proofNeeded1 = table.needsProof(address(1).ip, now: .zero)
        #expect(!proofNeeded1)
        for i in 0..<2 { try table.keep(key, from: address(1), index: UInt32(i), now: .zero) }
        let proofNeeded2 = table.needsProof(address(1).ip, now: .zero)
        #expect(proofNeeded2)
        #expect(throws: InitiationParts.Refusal.tooManyFromSource) { try table.keep(key, from: address(1), index: 9, now: .zero) }
        for i in 2..<4 { try table.keep(key, from: address(1), index: UInt32(i), proven: true, now: .zero) }
        // Everyone's share: unproven parts stop at half of it (four here, all from host 1).
        let proofNeeded3 = table.needsProof(address(2 << 8).ip, now: .zero)
        #expect(proofNeeded3)
        #expect(throws: InitiationParts.Refusal.full) { try table.keep(key, from: address(2 << 8), index: 1, now: .zero) }
        for n in 2..<6 { try table.keep(key, from: address(UInt32(n) << 8), index: 1, proven: true, now: .zero) }
        #expect(table.count == 8)
        // Full: a proven peer gets the peers' share; an unproven claim to be one does not.
        #expect(throws: InitiationParts.Refusal.full) { try table.keep(key, from: address(7 << 8), index: 1, peer: true, now: .zero) }
        try table.keep(key, from: address(7 << 8), index: 1, proven: true, peer: true, now: .zero)
        #expect(table.count == 9)
    }
}
