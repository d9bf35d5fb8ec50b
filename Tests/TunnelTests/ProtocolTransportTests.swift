import Foundation
import Basics
import Testing
@testable import Tunnel
import Device

@Test func tamperedDataIsDroppedCountedAndMovesNothing() throws {
    var f = try ProtocolFixture()
    let peer = try f.connect()
    let datagram = try f.clientDatagram()
    var drops = 0
    for i in datagram.indices {
        var tampered = datagram
        tampered[i] ^= 0x20
        let event = f.server.receive(&tampered, from: ProtocolFixture.attackerAddress, now: f.now)
        switch i {
        case 0: #expect(event == .dropped(.unsupportedVersion))
        case 1...3: #expect(event == .dropped(.malformed))
        case 4..<8:
            // An index nobody holds: a hint goes back while the source's bucket lasts.
            if case .sessionUnknown = event {} else { #expect(event == .dropped(.unknownSession)) }
        default: #expect(event == .dropped(.decryptFailed), "byte \(i)")
        }
        drops += 1
    }
    #expect(f.server.drops.total == UInt64(drops))
    #expect(f.server.endpoint(of: peer) == ProtocolFixture.clientAddress)
    // The genuine packet, untouched by all of that, still gets through.
    var genuine = datagram
    guard case .packet = f.server.receive(&genuine, from: ProtocolFixture.clientAddress, now: f.now) else {
        Issue.record("genuine packet refused")
        return
    }
}

@Test func truncatedAndOversizedDataIsDropped() throws {
    var f = try ProtocolFixture()
    let peer = try f.connect()
    let datagram = try f.clientDatagram()
    for length in 0..<datagram.count {
        var short = Array(datagram.prefix(length))
        let event = f.server.receive(&short, from: ProtocolFixture.attackerAddress, now: f.now)
        #expect(event == .dropped(length < 4 ? .malformed : length < DataPacket.overhead ? .malformed : .decryptFailed), "\(length)")
    }
    var long = datagram + [0]
    #expect(f.server.receive(&long, from: ProtocolFixture.attackerAddress, now: f.now) == .dropped(.decryptFailed))
    var huge = Array(datagram.prefix(16)) + [UInt8](repeating: 0, count: Wire.maxDatagram)
    #expect(f.server.receive(&huge, from: ProtocolFixture.attackerAddress, now: f.now) == .dropped(.malformed))
    #expect(f.server.endpoint(of: peer) == ProtocolFixture.clientAddress)
    // Sealing refuses what a datagram cannot carry.
    var tooBig = DataPacket.frame([UInt8](repeating: 0x45, count: DataPacket.maxInnerLength + 1))
    #expect(throws: SealFailure.badLength) { try f.client.seal(&tooBig, now: f.now) }
    var noRoom: [UInt8] = [0x45]
    #expect(throws: SealFailure.badLength) { try f.client.seal(&noRoom, now: f.now) }
}

@Test func replayedDataIsDroppedAndMovesNothing() throws {
    var f = try ProtocolFixture()
    let peer = try f.connect()
    let datagram = try f.clientDatagram()
    var first = datagram
    guard case .packet = f.server.receive(&first, from: ProtocolFixture.clientAddress, now: f.now) else {
        Issue.record("refused")
        return
    }
    var replay = datagram
    #expect(f.server.receive(&replay, from: ProtocolFixture.attackerAddress, now: f.now) == .dropped(.replayed))
    #expect(f.server.endpoint(of: peer) == ProtocolFixture.clientAddress)
    #expect(f.server.drops[.replayed] == 1)
}

@Test func theEndpointMovesOnlyWithTheNewestAuthenticatedPacket() throws {
    var f = try ProtocolFixture()
    let peer = try f.connect()
    let early = try f.clientDatagram()  // sealed before the roam, delivered after it
    var roamed = try f.clientDatagram()
    guard case .packet = f.server.receive(&roamed, from: ProtocolFixture.roamedAddress, now: f.now) else {
        Issue.record("roamed packet refused")
        return
    }
    #expect(f.server.endpoint(of: peer) == ProtocolFixture.roamedAddress)
    var late = early
    guard case .packet = f.server.receive(&late, from: ProtocolFixture.clientAddress, now: f.now) else {
        Issue.record("late packet refused")
        return
    }
    #expect(f.server.endpoint(of: peer) == ProtocolFixture.roamedAddress, "a late packet must not undo a roam")
    var framed = DataPacket.frame(ProtocolFixture.ipv4(from: IPAddress("10.9.0.1")!, to: ProtocolFixture.innerV4))
    #expect(try f.server.seal(&framed, to: peer, now: f.now).destination == ProtocolFixture.roamedAddress)
    // Garbage from yet another address moves nothing either.
    var garbage = roamed
    garbage[20] ^= 1
    _ = f.server.receive(&garbage, from: ProtocolFixture.attackerAddress, now: f.now)
    #expect(f.server.endpoint(of: peer) == ProtocolFixture.roamedAddress)
}

@Test func probesComeBackAsEchoesWithTheirRoundTrip() throws {
    var f = try ProtocolFixture()
    let peer = try f.connect()
    var probe = try f.client.probe(id: 42, now: f.now)
    guard case .echo(peer, var echo, let to) = f.server.receive(&probe, from: ProtocolFixture.roamedAddress, now: f.now) else {
        Issue.record("no echo")
        return
    }
    #expect(to == ProtocolFixture.roamedAddress, "an echo answers the path the probe came on")
    #expect(f.client.receive(&echo, now: f.now + .milliseconds(25)) == .probeEcho(id: 42, rtt: .milliseconds(25), size: 18))
    var keepalive = try f.client.keepalive(now: f.now)
    #expect(f.server.receive(&keepalive, from: ProtocolFixture.roamedAddress, now: f.now) == .keepalive(from: peer))
}

@Test func aPaddedProbeIsAsBigAsTheTunnelPacketItStandsForAndSoIsItsEcho() throws {
    var f = try ProtocolFixture()
    let peer = try f.connect()
    var probe = try f.client.probe(id: 7, now: f.now, size: 1420)
    #expect(probe.count == 1420 + DataPacket.overhead, "the datagram of a full-size tunnel packet")
    guard case .echo(peer, var echo, _) = f.server.receive(&probe, from: ProtocolFixture.roamedAddress, now: f.now) else {
        Issue.record("no echo")
        return
    }
    #expect(echo.count == 1420 + DataPacket.overhead, "the echo proves the size on the way back")
    #expect(f.client.receive(&echo, now: f.now + .milliseconds(5)) == .probeEcho(id: 7, rtt: .milliseconds(5), size: 1420))
}

@Test func onlyProbesAndEchoesArePaddedAndOnlyWithZeros() {
    let now = Instant(nanoseconds: 5)
    let close = Control.encode(kind: Control.close, id: 0, sentAt: now, paddedTo: 40)
    #expect(close.withUnsafeBytes { InnerContent($0) } == .malformed, "a padded close is malformed")
    var probe = Control.encode(kind: Control.probe, id: 1, sentAt: now, paddedTo: 64)
    #expect(probe.withUnsafeBytes { InnerContent($0) } == .probe(id: 1, sentAt: now, size: 64))
    probe[50] = 1
    #expect(probe.withUnsafeBytes { InnerContent($0) } == .malformed, "padding that carries data is malformed")
}

@Test func theServerSaysItEchoesSizesAndAnOlderClientStillReadsItsResponse() throws {
    var payload = ResponsePayload(accepted: true, addresses: [IPAddress("10.7.0.2")!],
                                  dns: try DNSSettings(resolvers: [IPAddress("10.7.0.1")!], searchDomains: ["corp.example"]))
    payload.sizedEchoes = true
    let bytes = payload.encoded()
    let read = try #require(ResponsePayload(decoding: bytes))
    #expect(read.sizedEchoes)
    #expect(read.dns == payload.dns, "the DNS options after the features option are read as before")
    // A revision 2 client reads only the DNS options, skipping the unknown one.
    #expect(DNSSettings.decode(bytes[ResponsePayload.length...]) == payload.dns)
    // Without room for options (an initiation that was not padded) the features go too.
    #expect(ResponsePayload(decoding: payload.encoded(limit: Response.minLength))?.sizedEchoes == false)
}

@Test func aClientMaySendOnlyFromItsOwnInnerAddresses() throws {
    var f = try ProtocolFixture()
    try f.connect()
    var spoofed = try f.clientDatagram(ProtocolFixture.ipv4(from: IPAddress("10.9.0.3")!))
    #expect(f.server.receive(&spoofed, from: ProtocolFixture.clientAddress, now: f.now) == .dropped(.wrongInnerSource))
    var junk = try f.clientDatagram([0x45, 0, 0])  // an IPv4 nibble, but no header
    #expect(f.server.receive(&junk, from: ProtocolFixture.clientAddress, now: f.now) == .dropped(.malformed))
    var unknownControl = try f.clientDatagram([0, 9] + [UInt8](repeating: 0, count: 16))
    #expect(f.server.receive(&unknownControl, from: ProtocolFixture.clientAddress, now: f.now) == .dropped(.malformed))
    var v6 = [UInt8](repeating: 0, count: 40)
    v6[0] = 0x60
    v6.replaceSubrange(8..<24, with: ProtocolFixture.innerV6.bytes)
    var fromV6 = try f.clientDatagram(v6)
    guard case .packet = f.server.receive(&fromV6, from: ProtocolFixture.clientAddress, now: f.now) else {
        Issue.record("IPv6 from the client's own address refused")
        return
    }
}

@Test func aRestartedServerHintsAndTheHintTearsNothingDown() throws {
    var f = try ProtocolFixture()
    try f.connect()
    let users = f.server.users
    f.server = try ServerCore(privateKey: f.serverKey, users: users)  // restarted: no sessions
    var datagram = try f.clientDatagram()
    guard case .sessionUnknown(var hint, let to) = f.server.receive(&datagram, from: ProtocolFixture.clientAddress, now: f.now) else {
        Issue.record("no hint")
        return
    }
    #expect(to == ProtocolFixture.clientAddress)
    #expect(hint.count < datagram.count, "a hint must never amplify")
    let copy = hint
    #expect(f.client.receive(&hint, now: f.now) == .sessionUnknown)
    var again = copy
    #expect(f.client.receive(&again, now: f.now) == .dropped(.unexpected), "one hint per session is enough")
    #expect(f.client.hasSession(now: f.now), "the hint alone must not end the session")
    // A hint naming some other index is noise.
    var forged = copy
    forged[4] ^= 1
    #expect(f.client.receive(&forged, now: f.now) == .dropped(.unexpected))
    // The re-handshake the hint prompts works at once.
    try f.connect()
}

/// A hint is unauthenticated: only the server's own address counts, and once the server is
/// heard on the session again (the hint was forged), a later hint is news again.
@Test func hintsCountOnlyFromTheServerAndAnAnswerMakesTheNextOneNews() throws {
    var f = try ProtocolFixture()
    let peer = try f.connect()
    let real = f.server
    f.server = try ServerCore(privateKey: f.serverKey, users: f.server.users)
    var datagram = try f.clientDatagram()
    guard case .sessionUnknown(let hint, _) = f.server.receive(&datagram, from: ProtocolFixture.clientAddress, now: f.now) else {
        Issue.record("no hint")
        return
    }
    var fromElsewhere = hint
    #expect(f.client.receive(&fromElsewhere, fromServer: false, now: f.now) == .dropped(.foreignSource))
    #expect(f.client.drops[.foreignSource] == 1)
    var first = hint
    #expect(f.client.receive(&first, now: f.now) == .sessionUnknown)
    var again = hint
    #expect(f.client.receive(&again, now: f.now) == .dropped(.unexpected))
    // The server had the session after all: its data proves it, and the next hint counts.
    f.server = real
    var data = try f.serverDatagram(ProtocolFixture.ipv4(from: IPAddress("10.9.0.1")!, to: ProtocolFixture.innerV4), to: peer)
    guard case .packet = f.client.receive(&data, now: f.now) else {
        Issue.record("data refused")
        return
    }
    var later = hint
    #expect(f.client.receive(&later, now: f.now) == .sessionUnknown)

    // By address: the one we send to, or the one the server's authenticated answers came from.
    let configured = SocketAddress(IPAddress("198.51.100.7")!, port: 51820)
    let answering = SocketAddress(IPAddress("198.51.100.9")!, port: 51820)
    func deliver(_ bytes: [UInt8], from peer: SocketAddress) -> ClientEvent {
        var copy = bytes
        return copy.withUnsafeMutableBytes { f.client.receive($0, from: peer, server: configured, now: f.now) }
    }
    let spoofed = deliver(hint, from: ProtocolFixture.attackerAddress)
    #expect(spoofed == .dropped(.foreignSource))
    let fromOther = deliver(hint, from: answering)
    #expect(fromOther == .dropped(.foreignSource), "not heard from there yet")
    let proof = try f.serverDatagram(ProtocolFixture.ipv4(from: IPAddress("10.9.0.1")!, to: ProtocolFixture.innerV4), to: peer)
    guard case .packet = deliver(proof, from: answering) else { Issue.record("data refused"); return }
    let fromAnswering = deliver(hint, from: answering)
    #expect(fromAnswering == .sessionUnknown)
}

/// A split tunnel accepts inner packets only from the prefixes it routes, as WireGuard's
/// allowed IPs do: the server (or whoever holds its keys) cannot pose as the LAN or the internet.
@Test func aSplitClientAcceptsOnlySourcesItRoutes() throws {
    var f = try ProtocolFixture(acceptedSources: [Prefix("10.9.0.0/24")!, Prefix("fd00::/64")!])
    let peer = try f.connect()
    let to = ProtocolFixture.innerV4
    for (source, accepted) in [("10.9.0.1", true), ("10.9.0.254", true), ("192.168.1.1", false), ("8.8.8.8", false),
                               ("10.9.1.1", false)] {
        var d = try f.serverDatagram(ProtocolFixture.ipv4(from: IPAddress(source)!, to: to), to: peer)
        let event = f.client.receive(&d, now: f.now)
        if accepted {
            guard case .packet = event else { Issue.record("\(source) refused: \(event)"); continue }
        } else {
            #expect(event == .dropped(.wrongInnerSource), "\(source)")
        }
    }
    #expect(f.client.drops[.wrongInnerSource] == 3)
    var v6 = [UInt8](repeating: 0, count: 40)
    v6[0] = 0x60
    v6.replaceSubrange(8..<24, with: IPAddress("2001:4860::8888")!.bytes)
    var outside = try f.serverDatagram(v6, to: peer)
    #expect(f.client.receive(&outside, now: f.now) == .dropped(.wrongInnerSource))
    // Full mode (no list) takes any source: everything goes through the tunnel.
    var full = try ProtocolFixture()
    let fullPeer = try full.connect()
    var anywhere = try full.serverDatagram(ProtocolFixture.ipv4(from: IPAddress("8.8.8.8")!, to: to), to: fullPeer)
    guard case .packet = full.client.receive(&anywhere, now: full.now) else {
        Issue.record("full mode refused a packet from the internet")
        return
    }
}

@Test func hintsAreRateLimitedPerSource() throws {
    var f = try ProtocolFixture()
    try f.connect()
    f.server = try ServerCore(privateKey: f.serverKey, users: f.server.users)
    var hints = 0
    for _ in 0..<20 {
        var datagram = try f.clientDatagram()
        if case .sessionUnknown = f.server.receive(&datagram, from: ProtocolFixture.clientAddress, now: f.now) { hints += 1 }
    }
    #expect(hints == 3, "the burst")
    #expect(f.server.drops[.unknownSession] == 20)
    f.now = f.now + .seconds(1)
    var datagram = try f.clientDatagram()
    guard case .sessionUnknown = f.server.receive(&datagram, from: ProtocolFixture.clientAddress, now: f.now) else {
        Issue.record("the bucket should have refilled one hint")
        return
    }
    var other = try f.clientDatagram()
    guard case .sessionUnknown = f.server.receive(&other, from: ProtocolFixture.roamedAddress, now: f.now) else {
        Issue.record("another source has its own bucket")
        return
    }
}

@Test func rekeyIsDueAtTheSoftLimitsAndSealingStopsAtTheHardOnes() throws {
    let limits = SessionLimits(rekeyAfterMessages: 4, rejectAfterMessages: 6, rekeyAfterTime: .seconds(10), rejectAfterTime: .seconds(20))
    var f = try ProtocolFixture(sessionLimits: limits)
    #expect(f.client.needsRekey(now: f.now), "no session yet")
    try f.connect()  // the confirmation keepalive used counter 0
    #expect(!f.client.needsRekey(now: f.now))
    for _ in 1..<4 { _ = try f.clientDatagram() }
    #expect(f.client.needsRekey(now: f.now), "after rekeyAfterMessages")
    _ = try f.clientDatagram()
    _ = try f.clientDatagram()
    #expect(throws: SealFailure.sessionExpired) { try f.clientDatagram() }
    #expect(!f.client.hasSession(now: f.now))

    try f.connect()
    #expect(!f.client.needsRekey(now: f.now + .seconds(9)))
    #expect(f.client.needsRekey(now: f.now + .seconds(10)))
    let old = try f.clientDatagram()
    f.now = f.now + .seconds(20)
    #expect(throws: SealFailure.sessionExpired) { try f.clientDatagram() }
    var late = old
    #expect(f.server.receive(&late, from: ProtocolFixture.clientAddress, now: f.now) == .dropped(.sessionExpired))
}

@Test func packetsInFlightDuringARekeyStillArrive() throws {
    var f = try ProtocolFixture()
    let peer = try f.connect()
    let inFlight = try f.clientDatagram()
    var framed = DataPacket.frame(ProtocolFixture.ipv4(from: IPAddress("10.9.0.1")!, to: ProtocolFixture.innerV4))
    _ = try f.server.seal(&framed, to: peer, now: f.now)
    try f.connect()
    var up = inFlight
    guard case .packet = f.server.receive(&up, from: ProtocolFixture.clientAddress, now: f.now) else {
        Issue.record("server dropped a packet sealed with the previous keys")
        return
    }
    guard case .packet = f.client.receive(&framed, now: f.now) else {
        Issue.record("client dropped a packet sealed with the previous keys")
        return
    }
}

@Test func sessionsAreForgottenAfterThreeRejectTimes() throws {
    var f = try ProtocolFixture()
    try f.connect()
    #expect(f.server.sessionCount == 1)
    f.server.tick(now: f.now + .seconds(539))
    #expect(f.server.sessionCount == 1)
    f.server.tick(now: f.now + .seconds(540))
    #expect(f.server.sessionCount == 0)
}

@Test func theReplayWindowKeepsTheNewest1984Counters() {
    var window = ReplayWindow()
    func accept(_ n: UInt64) -> Bool { window.accept(n) }
    #expect(accept(0) && !accept(0))
    #expect(accept(2) && accept(1) && !accept(1) && !accept(2))
    #expect(accept(5000))
    #expect(!window.check(5000 - 1984), "just too old")
    #expect(accept(5000 - 1983), "the oldest still tracked")
    #expect(!accept(5000 - 1983))
    #expect(accept(4999) && accept(3100))
    // A jump past the whole ring forgets everything behind the new head.
    #expect(accept(1_000_000))
    #expect(!window.check(5000) && window.check(999_999) && !window.check(1_000_000))
    // Every bit of every word is tracked as the head walks forward one at a time.
    var walk = ReplayWindow()
    for n in UInt64(0)..<5000 {
        let fresh = walk.accept(n)
        #expect(fresh)
        if n >= 1983 { #expect(!walk.check(n - 1983)) }
        if n >= 64 { #expect(!walk.check(n - 64)) }
    }
    #expect(!ReplayWindow().check(.max))
}

@Test func aCloseForgetsTheClientsSessionsButAStaleOneCannot() throws {
    var f = try ProtocolFixture()
    let peer = try f.connect()
    let stale = try f.client.close(now: f.now)  // sealed under the first session's keys
    try f.connect()  // a newer handshake: the first session is now the previous one
    var old = stale
    #expect(f.server.receive(&old, from: ProtocolFixture.clientAddress, now: f.now) == .dropped(.unexpected),
            "a close from an older session ends nothing")
    #expect(f.server.sessionCount > 0)

    var close = try f.client.close(now: f.now)
    #expect(f.server.receive(&close, from: ProtocolFixture.clientAddress, now: f.now) == .closed(peer: peer))
    #expect(f.server.sessionCount == 0 && f.server.endpoint(of: peer) == nil)
    var after = try f.clientDatagram()
    guard case .sessionUnknown = f.server.receive(&after, from: ProtocolFixture.clientAddress, now: f.now) else {
        Issue.record("data after a close should draw the hint")
        return
    }
    var replayed = close
    #expect(f.server.receive(&replayed, from: ProtocolFixture.clientAddress, now: f.now) != .closed(peer: peer))
}

@Test func aRestartedClientsHandshakeSurvivesTheOldProcesssGoodbye() throws {
    var f = try ProtocolFixture()
    let peer = try f.connect()
    let goodbye = try f.client.close(now: f.now)  // the old process's last datagram, still on its way
    // The restarted process handshakes with the same key; its response is out, its first packet not yet.
    var restarted = try ClientCore(privateKey: f.clientKey, serverKey: f.serverKey.publicKey)
    var initiation = try restarted.initiate(now: f.now, wallClock: TAI64N(unixNanoseconds: 1_700_000_001_000_000_000))
    guard case .handshake(_, var response, _) = f.deliver(&initiation) else { Issue.record("handshake refused"); return }
    guard case .established = restarted.receive(&response, now: f.now) else { Issue.record("response refused"); return }

    var late = goodbye
    #expect(f.server.receive(&late, from: ProtocolFixture.clientAddress, now: f.now) == .closed(peer: peer))
    var framed = DataPacket.frame(ProtocolFixture.ipv4())
    try restarted.seal(&framed, now: f.now)
    guard case .packet = f.server.receive(&framed, from: ProtocolFixture.clientAddress, now: f.now) else {
        Issue.record("the new process's session was ended by the old one's goodbye")
        return
    }
}

/// Keys live in the secret arena: pages left out of core dumps (VmFlags "dd") and, where the
/// locked-memory limit allows, locked in RAM ("lo"); a released slot is wiped.
@Test func keysLiveInPagesLeftOutOfCoreDumps() throws {
    let key = try PrivateKey.generate()
    let address = key.secret.withBytes { UInt(bitPattern: $0) }
    // procfs files have no size: read to the end.
    let handle = try #require(FileHandle(forReadingAtPath: "/proc/self/smaps"))
    let smaps = String(decoding: handle.readDataToEndOfFile(), as: UTF8.self)
    var inRegion = false
    var flags: String?
    for line in smaps.split(separator: "\n") {
        let fields = line.split(separator: " ")
        if let range = fields.first, range.contains("-"), let dash = range.firstIndex(of: "-"),
           let start = UInt(range[..<dash], radix: 16), let end = UInt(range[range.index(after: dash)...], radix: 16) {
            inRegion = (start..<end).contains(address)
        } else if inRegion, line.hasPrefix("VmFlags:") {
            flags = String(line)
            break
        }
    }
    let found = try #require(flags, "the key's page is not in /proc/self/smaps")
    #expect(found.contains(" dd"), "left out of core dumps: \(found)")
    // An arena of its own, so that parallel tests' keys do not move the counts: a released
    // slot is wiped and given back.
    let arena = SecretArena(slotSize: 32)
    let slot = try #require(arena.allocate())
    slot.initializeMemory(as: UInt8.self, repeating: 0xAB, count: 32)
    arena.release(slot)
    #expect(UnsafeRawBufferPointer(start: slot, count: 32).allSatisfy { $0 == 0 }, "wiped on release")
    #expect(arena.usage.live == 0 && arena.usage.chunks == 1)
    #expect(arena.allocate() == slot, "the slot is given back for reuse")
}

/// A password check wipes the one buffer that held the password, for every holder.
@Test func aPasswordCheckWipesThePasswordItHeld() throws {
    let hash = try PasswordHash.create(password: "correct horse battery", cost: .minimum)
    let user = User(name: "carol", addresses: [IPAddress("10.9.0.7")!], passwordHash: hash)
    var f = try ProtocolFixture(users: [user], credentials: Credentials(username: "carol", password: "correct horse battery"),
                                keyUser: false)
    var initiation = try f.client.initiate(now: f.now, wallClock: ProtocolFixture.wall)
    guard case .checkPassword(let check) = f.send(&initiation) else {
        Issue.record("no password check")
        return
    }
    #expect(!check.password.isWiped)
    guard case .noiseIK(let responder, _, _) = check.initiation.handshake else {
        Issue.record("not a version 2 handshake")
        return
    }
    #expect(responder.payload.isWiped, "the decrypted payload is wiped once read")
    #expect(check.verify())
    #expect(check.password.isWiped, "the check's password is wiped once checked")
}

@Test func daemonsCanForbidCoreDumps() {
    #expect(ProcessHardening.forbidCoreDumps())
    #expect(!ProcessHardening.isDumpable)
}

/// A password read from its file goes straight into the secret arena; the bytes it came in are wiped.
@Test func aPasswordFileIsMovedIntoTheArenaAndWiped() throws {
    var bytes = Array("  correct horse battery\n".utf8)
    let credentials = try #require(Credentials(username: "carol", passwordFile: &bytes))
    #expect(bytes.allSatisfy { $0 == 0 }, "the bytes read from the file are wiped")
    #expect(credentials.password.withBytes { Array($0) } == Array("correct horse battery".utf8), "the newline is not part of it")
    var blank = Array(" \n".utf8)
    #expect(Credentials(username: "carol", passwordFile: &blank) == nil)
    var long = [UInt8](repeating: 0x61, count: Credentials.maxLength + 1)
    #expect(Credentials(username: "carol", passwordFile: &long) == nil)
}

/// "This server is being taken down" comes only sealed on the session: the client takes it as
/// `.draining`; the same bytes changed anywhere, a drain on another session's index, or one a
/// client sends to the server, are dropped and counted.
@Test func onlyTheServerCanSayItIsDraining() throws {
    var f = try ProtocolFixture()
    try f.connect()
    let messages = f.server.drainMessages(now: f.now)
    try #require(messages.count == 1)
    #expect(messages[0].to == ProtocolFixture.clientAddress)
    var genuine = messages[0].datagram
    var tampered = genuine
    tampered[tampered.count - 1] ^= 1
    #expect(f.client.receive(&tampered, now: f.now) == .dropped(.decryptFailed))
    #expect(f.client.receive(&genuine, now: f.now) == .draining)
    var replayed = messages[0].datagram
    #expect(f.client.receive(&replayed, now: f.now) == .dropped(.replayed))
    // A stranger's "drain" is not even a session's packet.
    var forged = Wire.header(.data) + [UInt8](repeating: 0, count: 40)
    if case .draining = f.client.receive(&forged, now: f.now) { Issue.record("a forged drain was taken") }
    // Clients cannot drain servers.
    let drops = f.server.drops.total
    var fromClient = try f.client.sealControlForTest(kind: 4)
    #expect(f.server.receive(&fromClient, from: ProtocolFixture.clientAddress, now: f.now) == .dropped(.unexpected))
    #expect(f.server.drops.total == drops + 1)
}

/// A peer is reachable at the server from its first authenticated packet until it closes or
/// its sessions are forgotten: the moments its inner addresses' routes come and go.
@Test func theServerReportsWhenAPeerBecomesReachableAndWhenItLeaves() throws {
    var f = try ProtocolFixture()
    #expect(f.server.takeLiveChanges().isEmpty)
    let peer = try f.connect()
    let joined = f.server.takeLiveChanges()
    #expect(joined.count == 1 && joined[0].peer == peer && joined[0].live)
    #expect(f.server.livePeers == [peer] && f.server.livePeerCount == 1)
    var packet = try f.clientDatagram()
    _ = f.server.receive(&packet, from: ProtocolFixture.roamedAddress, now: f.now)
    #expect(f.server.takeLiveChanges().isEmpty, "a roam is no change")
    var close = try f.client.close(now: f.now)
    #expect(f.server.receive(&close, from: ProtocolFixture.roamedAddress, now: f.now) == .closed(peer: peer))
    let left = f.server.takeLiveChanges()
    #expect(left.count == 1 && left[0].peer == peer && !left[0].live)
    #expect(f.server.livePeers.isEmpty && f.server.livePeerCount == 0 && f.server.drainMessages(now: f.now).isEmpty)
    // Sessions that expire unused end the same way.
    try f.connect()
    _ = f.server.takeLiveChanges()
    f.server.tick(now: f.now + SessionLimits().rejectAfterTime * 3 + .seconds(1))
    let expired = f.server.takeLiveChanges()
    #expect(expired.count == 1 && !expired[0].live && f.server.livePeerCount == 0)
}
