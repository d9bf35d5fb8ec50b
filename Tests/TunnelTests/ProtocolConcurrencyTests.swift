import Dispatch
import Basics
import Synchronization
import Testing
@testable import Tunnel
import Device

/// The server's data threads share sessions with no lock around the cryptography: these run
/// the real session table from several threads at once.

@Test func threadsSealingForOnePeerAtOnceNeverReuseACounter() throws {
    var f = try ProtocolFixture()
    let peer = try f.connect()
    let table = f.server.sessions
    let now = f.now
    let threads = 4, each = 2_000
    let sealed = Mutex<[[UInt8]]>([])
    DispatchQueue.concurrentPerform(iterations: threads) { thread in
        var mine: [[UInt8]] = []
        for i in 0..<each {
            var framed = DataPacket.frame(ProtocolFixture.ipv4(payload: bytes(thread * each + i)))
            let length = try? framed.withMutableBytes { (buffer) throws(SealFailure) in
                try table.seal(buffer, innerLength: buffer.count - DataPacket.overhead, to: peer, now: now).length
            }
            if let length { mine.append(Array(framed[..<length])) }
        }
        sealed.withLock { $0 += mine }
    }
    let datagrams = sealed.withLock { $0 }
    #expect(datagrams.count == threads * each)
    let counters = Set(datagrams.map { $0.withUnsafeBytes { $0.loadLittleEndian(UInt64.self, at: DataPacket.counterOffset) } })
    #expect(counters.count == threads * each, "every datagram has a counter of its own")
    // The client opens every one, in any order within its replay window.
    var opened = 0
    for var datagram in datagrams.sorted(by: { counter($0) < counter($1) }) {
        if case .packet = f.client.receive(&datagram, now: now) { opened += 1 }
    }
    #expect(opened == threads * each && f.client.drops.total == 0, "\(f.client.drops)")
}

@Test func aDatagramOpenedOnTwoThreadsAtOnceIsTakenOnce() throws {
    var f = try ProtocolFixture()
    _ = try f.connect()
    let table = f.server.sessions
    let now = f.now
    let count = 2_000
    var datagrams: [[UInt8]] = []
    for i in 0..<count {
        var framed = DataPacket.frame(ProtocolFixture.ipv4(payload: bytes(i)))
        try f.client.seal(&framed, now: now)
        datagrams.append(framed)
    }
    // Two copies of each datagram, opened by two threads racing each other.
    let copies = datagrams
    let results = Mutex((packets: 0, replays: 0, other: 0))
    DispatchQueue.concurrentPerform(iterations: 2) { _ in
        var drops = DropCounters()
        var hints = HintBudget(ServerLimits())
        var (packets, other) = (0, 0)
        for original in copies {
            var datagram = original
            let event = datagram.withUnsafeMutableBytes {
                table.receive($0, from: ProtocolFixture.clientAddress, at: nil, now: now, drops: &drops, hints: &hints)
            }
            if case .packet = event { packets += 1 } else if event != .dropped(.replayed) { other += 1 }
        }
        let replays = Int(drops[.replayed])
        results.withLock { $0.packets += packets; $0.replays += replays; $0.other += other }
    }
    let (packets, replays, other) = results.withLock { $0 }
    #expect(packets == count, "each datagram delivered once")
    #expect(replays == count, "and its copy dropped as a replay")
    #expect(other == 0)
}

@Test func rekeysWhileAnotherThreadSealsNeverFailASeal() throws {
    var f = try ProtocolFixture()
    let peer = try f.connect()
    let table = f.server.sessions
    let now = f.now
    let stop = Atomic<Bool>(false)
    let sent = Atomic<Int>(0)
    let failures = Atomic<Int>(0)
    // One thread seals for the peer without pause while handshakes replace its session here.
    let sealer = try OSThread {
        var i = 0
        while !stop.load(ordering: .relaxed), i < 10_000_000 {
            var framed = DataPacket.frame(ProtocolFixture.ipv4(payload: bytes(i)))
            do {
                _ = try framed.withMutableBytes { (buffer) throws(SealFailure) in
                    try table.seal(buffer, innerLength: buffer.count - DataPacket.overhead, to: peer, now: now)
                }
                sent.add(1, ordering: .relaxed)
            } catch {
                failures.add(1, ordering: .relaxed)
            }
            i += 1
        }
    }
    var wall = ProtocolFixture.wall
    for _ in 0..<20 {
        wall = wall.successor
        f.now = f.now + .milliseconds(250)  // within the per-source handshake budget
        _ = try f.connect(wall: wall)
        #expect(table.sessionCount <= 3, "current, next and previous at most")
    }
    stop.store(true, ordering: .relaxed)
    sealer.join()
    #expect(failures.load(ordering: .relaxed) == 0)
    #expect(sent.load(ordering: .relaxed) > 0)
}

/// Four bytes that tell packets apart.
private func bytes(_ i: Int) -> [UInt8] { withUnsafeBytes(of: UInt32(truncatingIfNeeded: i).littleEndian) { Array($0) } }

private func counter(_ datagram: [UInt8]) -> UInt64 {
    datagram.withUnsafeBytes { $0.loadLittleEndian(UInt64.self, at: DataPacket.counterOffset) }
}

@Test func aCloseRacingTheNextSessionsFirstPacketNeverEndsTheNextSession() throws {
    var f = try ProtocolFixture()
    _ = try f.connect()
    let table = f.server.sessions
    var wall = ProtocolFixture.wall
    for trial in 0..<300 {
        f.now = f.now + .seconds(1)  // within the per-source handshake budget
        wall = wall.successor
        let goodbye = try f.client.close(now: f.now)  // on the session in use
        // A new handshake, its confirmation (the first packet on the new session) not yet sent.
        var initiation = try f.client.initiate(now: f.now, wallClock: wall)
        guard case .handshake(let peer, var response, _) = f.deliver(&initiation),
              case .established(let done) = f.client.receive(&response, now: f.now)
        else {
            Issue.record("trial \(trial): no handshake: \(f.server.drops)")
            return
        }
        let now = f.now
        // Either may start first; each order in turn.
        DispatchQueue.concurrentPerform(iterations: 2) { thread in
            var datagram = (thread + trial) % 2 == 0 ? goodbye : done.confirmation
            var drops = DropCounters()
            var hints = HintBudget(ServerLimits())
            _ = datagram.withUnsafeMutableBytes {
                table.receive($0, from: ProtocolFixture.clientAddress, at: nil, now: now, drops: &drops, hints: &hints)
            }
        }
        // Whichever came first, the new session carries on.
        var framed = DataPacket.frame(ProtocolFixture.ipv4(payload: bytes(trial)))
        try f.client.seal(&framed, now: f.now)
        guard case .packet = f.server.receive(&framed, from: ProtocolFixture.clientAddress, now: f.now) else {
            Issue.record("trial \(trial): the new session is gone: \(f.server.drops)")
            return
        }
        #expect(f.server.endpoint(of: peer) == ProtocolFixture.clientAddress)
    }
}

@Test func packetsFromTheOldAndTheNewAddressOpenedAtOnceLeaveTheNewOne() throws {
    var f = try ProtocolFixture()
    let peer = try f.connect()
    let table = f.server.sessions
    let now = f.now
    for trial in 0..<500 {
        var older = DataPacket.frame(ProtocolFixture.ipv4(payload: bytes(2 * trial)))
        var newer = DataPacket.frame(ProtocolFixture.ipv4(payload: bytes(2 * trial + 1)))
        try f.client.seal(&older, now: now)
        try f.client.seal(&newer, now: now)
        let (oldAddress, newAddress) = trial % 2 == 0
            ? (ProtocolFixture.clientAddress, ProtocolFixture.roamedAddress) : (ProtocolFixture.roamedAddress, ProtocolFixture.clientAddress)
        let pair = [(older, oldAddress), (newer, newAddress)]
        // Either may start first; each order in turn.
        DispatchQueue.concurrentPerform(iterations: 2) { thread in
            var (datagram, address) = pair[(thread + trial / 2) % 2]
            var drops = DropCounters()
            var hints = HintBudget(ServerLimits())
            _ = datagram.withUnsafeMutableBytes {
                table.receive($0, from: address, at: nil, now: now, drops: &drops, hints: &hints)
            }
        }
        guard f.server.endpoint(of: peer) == newAddress else {
            Issue.record("trial \(trial): the older packet's address won")
            return
        }
    }
}
