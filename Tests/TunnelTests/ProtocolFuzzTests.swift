import Basics
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
        var forClient = datagram
        switch f.client.receive(&forClient, now: f.now) {
        case .dropped: clientDrops += 1
        case let event: Issue.record("client accepted a mutant: \(event)")
        }
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
