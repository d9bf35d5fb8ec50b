import Basics
import Foundation
import Testing
@testable import Tunnel

extension SeededRandom {
    mutating func below(_ n: Int) -> Int { Int(next() % UInt64(n)) }
    mutating func byte() -> UInt8 { UInt8(truncatingIfNeeded: next()) }
}

@Test(arguments: [UInt64(1), 0xC0FFEE, 0x5EED_5EED])
func garbageAndMutantsNeverCrashEitherCoreAndEveryDropIsCounted(seed: UInt64) throws {
    var f = try ProtocolFixture(limits: ServerLimits(handshakesPerSource: .init(perSecond: 1e9, burst: 1e9)))
    let peer = try f.connect()
    // One genuine datagram of every kind, each delivered once first: from then on an unmodified
    // copy is a replay and must be dropped like any mutant.
    let initiation = try f.client.initiate(now: f.now, wallClock: ProtocolFixture.wall)
    var copy = initiation
    guard case .handshake(_, let response, _) = f.server.receive(&copy, from: ProtocolFixture.clientAddress, now: f.now) else {
        Issue.record("no handshake")
        return
    }
    copy = response
    guard case .established(let done) = f.client.receive(&copy, now: f.now) else {
        Issue.record("no session")
        return
    }
    var framed = DataPacket.frame(ProtocolFixture.ipv4(from: IPAddress("10.9.0.1")!, to: ProtocolFixture.innerV4))
    _ = try f.server.seal(&framed, to: peer, now: f.now)
    let toServer = [done.confirmation, try f.clientDatagram(), try f.client.probe(id: 1, now: f.now)]
    for datagram in toServer {
        copy = datagram
        _ = f.server.receive(&copy, from: ProtocolFixture.clientAddress, now: f.now)
    }
    copy = framed
    _ = f.client.receive(&copy, now: f.now)
    #expect(f.server.drops.total == 0 && f.client.drops.total == 0)
    let seeds = [initiation, response, framed, SessionUnknown.encode(index: 7)] + toServer
    let sources = [ProtocolFixture.clientAddress, ProtocolFixture.roamedAddress, ProtocolFixture.attackerAddress]

    var rng = SeededRandom(seed: seed)
    var serverDrops: UInt64 = 0
    var clientDrops: UInt64 = 0
    for _ in 0..<3000 {
        var datagram: [UInt8]
        switch rng.below(4) {
        case 0:
            datagram = (0..<rng.below(200)).map { _ in rng.byte() }
            if datagram.count >= 4, rng.below(2) == 0 {
                datagram.replaceSubrange(0..<4, with: [1, UInt8(1 + rng.below(4)), 0, 0])
            }
        case 1:
            datagram = seeds[rng.below(seeds.count)]
            for _ in 0...rng.below(4) where !datagram.isEmpty {
                datagram[rng.below(datagram.count)] ^= UInt8(1 + rng.below(255))
            }
        case 2:
            datagram = seeds[rng.below(seeds.count)]
            datagram = Array(datagram.prefix(rng.below(datagram.count + 1)))
        default:
            datagram = seeds[rng.below(seeds.count)] + (0...rng.below(40)).map { _ in rng.byte() }
        }
        var forServer = datagram
        switch f.server.receive(&forServer, from: sources[rng.below(sources.count)], now: f.now) {
        case .dropped, .sessionUnknown, .rejected: serverDrops += 1
        case let event: Issue.record("server accepted a mutant: \(event)")
        }
        if f.clientDrops(datagram) { clientDrops += 1 }
        f.now = f.now + .milliseconds(1)
    }
    #expect(f.server.drops.total == serverDrops)
    #expect(f.client.drops.total == clientDrops)
    // And the real session never noticed.
    var datagram = try f.clientDatagram()
    guard case .packet(peer, _) = f.server.receive(&datagram, from: ProtocolFixture.clientAddress, now: f.now) else {
        Issue.record("the session did not survive the fuzzing")
        return
    }
}

/// Version 3's messages, real and mutated, at both cores beside a live version 3 session: every
/// mutant is dropped and counted, nothing crashes, no mutant gets a session, and the session
/// goes on. `ROAM_FUZZ_ROUNDS` runs longer on demand (the suite runs 3,000 per seed).
@Test(arguments: [UInt64(3), 0xFEED, 0xB0B0_CAFE])
func versionThreeMutantsAreDroppedAndCounted(seed: UInt64) throws {
    let open = ServerLimits.Rate(perSecond: 1e9, burst: 1e9)
    var f = try ProtocolFixture(limits: ServerLimits(handshakesPerSource: open, handshakesPerNetwork: open, handshakes: open),
                                version: 3)
    let outcome = try f.handshake()
    guard case .handshake(let peer, _, _) = outcome.server, case .established(let done) = outcome.client else {
        Issue.record("no session")
        return
    }
    var confirmation = done.confirmation
    _ = f.server.receive(&confirmation, from: ProtocolFixture.clientAddress, now: f.now)
    var framed = DataPacket.frame(ProtocolFixture.ipv4(from: IPAddress("10.9.0.1")!, to: ProtocolFixture.innerV4))
    _ = try f.server.seal(&framed, to: peer, now: f.now)
    var copy = framed
    _ = f.client.receive(&copy, now: f.now)
    // Every message of the handshake (both parts, the identity, the response, the verdict), a
    // data packet each way and a hint: delivered once already, so a plain copy is stale too.
    let seeds = outcome.sent + outcome.received + [framed, try f.clientDatagram(), SessionUnknown.encode(index: 7, version: 3)]
    #expect(f.server.drops.total == 0 && f.client.drops.total == 0, "\(f.server.drops) \(f.client.drops)")
    let sessionsBefore = f.server.sessionCount
    let sources = [ProtocolFixture.clientAddress, ProtocolFixture.roamedAddress, ProtocolFixture.attackerAddress]
    let rounds = ProcessInfo.processInfo.environment["ROAM_FUZZ_ROUNDS"].flatMap(Int.init) ?? 3000
    var rng = SeededRandom(seed: seed)
    var serverDrops: UInt64 = 0
    var clientDrops: UInt64 = 0
    var held = 0
    var replies = 0
    for _ in 0..<rounds {
        var datagram = seeds[rng.below(seeds.count)]
        switch rng.below(4) {
        case 0:
            for _ in 0...rng.below(4) { datagram[rng.below(datagram.count)] ^= UInt8(1 + rng.below(255)) }
        case 1:
            datagram = Array(datagram.prefix(rng.below(datagram.count)))
        case 2:
            datagram += (0...rng.below(64)).map { _ in rng.byte() }
        default:
            // A well-formed header of any kind over a body of random bytes of a plausible length.
            let kind = UInt8(1 + rng.below(8))
            datagram = [3, kind, 0, 0] + (0..<rng.below(1300)).map { _ in rng.byte() }
        }
        // mac1 made good half the time, as anyone who knows the server's key can.
        if rng.below(2) == 0, datagram.count >= 36, datagram[1] == 1 || datagram[1] == 6 {
            Mac1(serverKey: f.serverKey.publicKey).stamp(&datagram)
        }
        var forServer = datagram
        switch f.server.receive(&forServer, from: sources[rng.below(sources.count)], now: f.now) {
        case .dropped, .sessionUnknown, .rejected, .cookie: serverDrops += 1
        case .held: held += 1  // a first part with a good mac1: kept, and taken by nobody
        case .reply where seeds.contains(datagram): replies += 1  // a replayed initiation: answered, never a session
        case let event: Issue.record("server accepted a mutant: \(event)")
        }
        if f.clientDrops(datagram) { clientDrops += 1 }
        f.now = f.now + .milliseconds(1)
    }
    #expect(f.server.drops.total == serverDrops, "every refusal counted: \(f.server.drops)")
    #expect(f.client.drops.total == clientDrops)
    #expect(f.server.sessionCount == sessionsBefore, "no mutant made a session")
    var datagram = try f.clientDatagram()
    guard case .packet(peer, _) = f.server.receive(&datagram, from: ProtocolFixture.clientAddress, now: f.now) else {
        Issue.record("the session did not survive the fuzzing")
        return
    }
    print("version 3 mutants (seed \(seed)): \(rounds) each way; server drops \(f.server.drops), \(held) first parts kept, \(replies) replays answered")
}

extension ProtocolFixture {
    /// Gives the client a mutant: true when it dropped it (and counted the drop); anything else
    /// it made of it is recorded as a failure.
    mutating func clientDrops(_ mutant: [UInt8]) -> Bool {
        var datagram = mutant
        switch client.receive(&datagram, now: now) {
        case .dropped: return true
        case let event:
            Issue.record("client accepted a mutant: \(event)")
            return false
        }
    }
}
