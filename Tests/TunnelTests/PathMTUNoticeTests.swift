import Foundation
import Basics
import Testing
@testable import Tunnel
import Device

/// The client tells the server what its path carries; the server keeps what it sends within
/// it, and answers a bigger packet as a router would.
@Test func theServerKeepsWhatItSendsWithinTheClientsPathMTUAndAnswersTheNotice() throws {
    var f = try ProtocolFixture()
    let peer = try f.connect()
    #expect(f.client.takesPathMTUNotices, "the server says it takes notices")
    var big = ProtocolFixture.ipv4(from: IPAddress("10.9.0.1")!, to: ProtocolFixture.innerV4, payload: [UInt8](repeating: 7, count: 1300))
    let mayFragment = big
    big[6] = 0x40  // don't fragment
    _ = try f.serverDatagram(big, to: peer)  // nothing said yet: no limit
    var notice = try f.client.pathMTUNotice(1220, now: f.now)
    guard case .echo(peer, var answer, _) = f.server.receive(&notice, from: ProtocolFixture.clientAddress, now: f.now) else {
        Issue.record("the notice is not answered")
        return
    }
    #expect(f.client.receive(&answer, now: f.now) == .pathMTUAcknowledged(1220))
    #expect(throws: SealFailure.tooBig(mtu: 1220)) { _ = try f.serverDatagram(big, to: peer) }
    // One that may be fragmented goes whole, as it did before the notice.
    _ = try f.serverDatagram(mayFragment, to: peer)
    let fits = ProtocolFixture.ipv4(from: IPAddress("10.9.0.1")!, to: ProtocolFixture.innerV4, payload: [UInt8](repeating: 7, count: 1200))
    _ = try f.serverDatagram(fits, to: peer)
    // A new handshake starts without it: the client says it again on the new session.
    f.now = f.now + .seconds(1)
    try f.connect()
    _ = try f.serverDatagram(big, to: peer)
}

@Test func aPathMTUNoticeOutsideWhatAPathCanBeIsMalformed() {
    for mtu: UInt64 in [0, 575, 65536, UInt64.max] {
        let notice = Control.encode(kind: Control.pathMTU, id: mtu, sentAt: .zero)
        #expect(notice.withUnsafeBytes { InnerContent($0) } == .malformed, "\(mtu)")
    }
    let fine = Control.encode(kind: Control.pathMTU, id: 1280, sentAt: .zero)
    #expect(fine.withUnsafeBytes { InnerContent($0) } == .pathMTU(1280))
    let padded = Control.encode(kind: Control.pathMTU, id: 1280, sentAt: .zero, paddedTo: 40)
    #expect(padded.withUnsafeBytes { InnerContent($0) } == .malformed, "only probes and echoes are padded")
}

@Test func bothFeaturesTravelInOneOption() throws {
    var payload = ResponsePayload(accepted: true, addresses: [IPAddress("10.7.0.2")!])
    payload.pathMTUNotices = true
    var read = try #require(ResponsePayload(decoding: payload.encoded()))
    #expect(read.pathMTUNotices && !read.sizedEchoes)
    payload.sizedEchoes = true
    read = try #require(ResponsePayload(decoding: payload.encoded()))
    #expect(read.pathMTUNotices && read.sizedEchoes)
}

// MARK: The answer to a packet too big

/// A TCP segment of `length` bytes from 10.77.0.1 to 10.77.0.2, don't-fragment set or not.
private func tcp4(length: Int, dontFragment: Bool = true) -> [UInt8] {
    var packet = [UInt8](repeating: 0xAB, count: length)
    packet[0] = 0x45
    packet[1] = 0
    packet[2] = UInt8(length >> 8)
    packet[3] = UInt8(length & 0xff)
    packet[6] = dontFragment ? 0x40 : 0
    packet[7] = 0
    packet[9] = 6
    packet.replaceSubrange(12..<16, with: [10, 77, 0, 1])
    packet.replaceSubrange(16..<20, with: [10, 77, 0, 2])
    return packet
}

@Test func anIPv4PacketTooBigGetsFragmentationNeededFromItsDestination() throws {
    let packet = tcp4(length: 1400)
    let answer = try #require(packet.withUnsafeBytes { PacketTooBig.answer(to: $0, mtu: 1220) })
    #expect(answer.count == 20 + 8 + 28, "header, ICMP header, the quoted header and 8 bytes")
    #expect(Array(answer[12..<16]) == [10, 77, 0, 2] && Array(answer[16..<20]) == [10, 77, 0, 1], "from the destination to the source")
    #expect(answer[9] == 1 && answer[20] == 3 && answer[21] == 4, "ICMP destination unreachable, fragmentation needed")
    #expect(Int(answer[26]) << 8 | Int(answer[27]) == 1220, "the next hop's MTU")
    #expect(Array(answer[28...]) == Array(packet[0..<28]), "the packet's header and first 8 bytes")
    #expect(sumsToOnes(answer[0..<20]), "a valid IP header checksum")
    #expect(sumsToOnes(answer[20...]), "a valid ICMP checksum")
    #expect(Int(answer[2]) << 8 | Int(answer[3]) == answer.count)
}

@Test func onlyWhatMayNotBeFragmentedAndIsNoErrorGetsAnAnswer() {
    #expect(tcp4(length: 1400, dontFragment: false).withUnsafeBytes { PacketTooBig.answer(to: $0, mtu: 1220) } == nil,
            "an IPv4 packet without don't-fragment")
    var error = tcp4(length: 1400)
    error[9] = 1
    error[20] = 3
    #expect(error.withUnsafeBytes { PacketTooBig.answer(to: $0, mtu: 1220) } == nil, "an ICMP error")
    error[20] = 8
    #expect(error.withUnsafeBytes { PacketTooBig.answer(to: $0, mtu: 1220) } != nil, "an echo request does get one")
    #expect([UInt8](repeating: 0, count: 60).withUnsafeBytes { PacketTooBig.answer(to: $0, mtu: 1220) } == nil, "not IP")
    #expect([UInt8]([0x45, 0, 0]).withUnsafeBytes { PacketTooBig.answer(to: $0, mtu: 1220) } == nil, "truncated")
    #expect([UInt8](repeating: 0x60, count: 20).withUnsafeBytes { PacketTooBig.answer(to: $0, mtu: 1280) } == nil, "truncated IPv6")
    var later = tcp4(length: 1400)
    later[7] = 185  // a fragment at offset 1480
    #expect(later.withUnsafeBytes { PacketTooBig.answer(to: $0, mtu: 1220) } == nil, "a later fragment")
    for first: UInt8 in [0, 127, 224, 255] {
        var nobody = tcp4(length: 1400)
        nobody[12] = first
        #expect(nobody.withUnsafeBytes { PacketTooBig.answer(to: $0, mtu: 1220) } == nil, "from \(first).x.x.x")
    }
}

@Test func anIPv6PacketTooBigGetsPacketTooBigWithinTheMinimumMTU() throws {
    var packet = [UInt8](repeating: 0xCD, count: 1400)
    packet[0] = 0x60
    packet[4] = UInt8((1400 - 40) >> 8)
    packet[5] = UInt8((1400 - 40) & 0xff)
    packet[6] = 6
    packet[7] = 64
    let source = IPAddress("fd77::1")!.bytes, destination = IPAddress("fd77::2")!.bytes
    packet.replaceSubrange(8..<24, with: source)
    packet.replaceSubrange(24..<40, with: destination)
    let answer = try #require(packet.withUnsafeBytes { PacketTooBig.answer(to: $0, mtu: 1220) })
    #expect(answer.count == 1280, "as much of the packet as keeps the answer within 1280 bytes")
    #expect(answer[6] == 58 && answer[40] == 2 && answer[41] == 0, "ICMPv6 packet too big")
    #expect(Array(answer[8..<24]) == destination && Array(answer[24..<40]) == source)
    #expect(answer[44..<48].reduce(0) { $0 << 8 | Int($1) } == 1280, "never below IPv6's minimum, which hosts ignore")
    var multicast = packet
    multicast[8] = 0xff
    #expect(multicast.withUnsafeBytes { PacketTooBig.answer(to: $0, mtu: 1280) } == nil, "from a multicast source")
    let length = answer.count - 40
    #expect(Int(answer[4]) << 8 | Int(answer[5]) == length)
    let pseudo = Array(answer[8..<40]) + [0, 0, UInt8(length >> 8), UInt8(length & 0xff), 0, 0, 0, 58]
    #expect(sumsToOnes((pseudo + answer[40...])[...]), "a valid ICMPv6 checksum")
}

@Test func answersAreLimitedPerClientAsARoutersICMPIs() {
    var limiter = KeyedRateLimiter<IPAddress>(PacketTooBig.rate, capacity: PacketTooBig.clientsKept)
    let client = IPAddress("10.77.0.2")!, other = IPAddress("10.77.0.3")!
    let start = Instant(nanoseconds: 1_000_000_000)
    let burst = (0..<50).filter { _ in limiter.allow(client, now: start) }.count
    #expect(burst == Int(PacketTooBig.rate.burst))
    let another = limiter.allow(other, now: start)
    #expect(another, "one client's answers never use up another's")
    let refilled = limiter.allow(client, now: start + .milliseconds(20))
    #expect(refilled, "refilled at its rate")
    let second = (1...1000).filter { limiter.allow(client, now: start + .milliseconds(20) + .milliseconds($0)) }.count
    #expect((90...111).contains(second), "about \(PacketTooBig.rate.perSecond) a second: \(second)")
}

/// The Internet checksum over `bytes` with their checksum in place: all ones when it is right.
private func sumsToOnes(_ bytes: ArraySlice<UInt8>) -> Bool {
    Array(bytes).withUnsafeBytes { Checksum.fold(Checksum.sum($0)) } == 0xFFFF
}
