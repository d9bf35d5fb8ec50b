import Basics
import Testing
@testable import Tunnel
import Device

/// A straightforward RFC 1071 checksum, independent of the one under test.
private func referenceSum(_ bytes: [UInt8]) -> UInt32 {
    var sum: UInt32 = 0
    var i = 0
    while i + 1 < bytes.count {
        sum += UInt32(bytes[i]) << 8 | UInt32(bytes[i + 1])
        i += 2
    }
    if i < bytes.count { sum += UInt32(bytes[i]) << 8 }
    while sum > 0xFFFF { sum = (sum & 0xFFFF) + (sum >> 16) }
    return sum
}

/// True when the IPv4 header's checksum and the TCP checksum (with its pseudo-header) verify.
private func checksumsVerify(_ packet: [UInt8]) -> Bool {
    let v6 = packet[0] >> 4 == 6
    let ipLength = v6 ? 40 : Int(packet[0] & 0x0F) * 4
    if !v6, referenceSum(Array(packet[0..<ipLength])) != 0xFFFF { return false }
    let tcp = Array(packet[ipLength...])
    let addresses = v6 ? Array(packet[8..<40]) : Array(packet[12..<20])
    let pseudo = addresses + [0, 6, UInt8(tcp.count >> 8), UInt8(tcp.count & 0xFF)]
    return referenceSum(pseudo + tcp) == 0xFFFF
}

/// A TCP super-packet as the kernel hands it over with TSO: one IP and TCP header for the whole
/// payload, the TCP checksum field holding only the pseudo-header's sum.
private func superPacket(v6: Bool, payload: [UInt8], flags: UInt8 = 0x18, sequence: UInt32 = 0xFFFF_F000) -> [UInt8] {
    var ip: [UInt8]
    if v6 {
        ip = [0x60, 0, 0, 0, 0, 0, 6, 64] + [UInt8](repeating: 0, count: 32)
        ip[8] = 0xFD; ip[23] = 1; ip[24] = 0xFD; ip[39] = 2
        let length = 20 + payload.count
        ip[4] = UInt8(truncatingIfNeeded: length >> 8); ip[5] = UInt8(truncatingIfNeeded: length)
    } else {
        ip = [0x45, 0, 0, 0, 0x12, 0x34, 0x40, 0, 64, 6, 0, 0, 10, 77, 0, 10, 10, 77, 0, 1]
        let length = 40 + payload.count
        ip[2] = UInt8(truncatingIfNeeded: length >> 8); ip[3] = UInt8(truncatingIfNeeded: length)
        let check = ~UInt16(referenceSum(ip))
        ip[10] = UInt8(check >> 8); ip[11] = UInt8(check & 0xFF)
    }
    var tcp: [UInt8] = [0x9C, 0x40, 0x13, 0x8C] + withUnsafeBytes(of: sequence.bigEndian) { Array($0) }
        + [0, 0, 0, 1, 0x50, flags, 0xFF, 0xFF, 0, 0, 0, 0]
    let addresses = v6 ? Array(ip[8..<40]) : Array(ip[12..<20])
    let pseudo = referenceSum(addresses + [0, 6, UInt8((20 + payload.count) >> 8 & 0xFF), UInt8((20 + payload.count) & 0xFF)])
    tcp[16] = UInt8(pseudo >> 8); tcp[17] = UInt8(pseudo & 0xFF)
    return ip + tcp + payload
}

private func header(_ type: VirtioNetHeader.Segmentation, size: Int, start: Int) -> VirtioNetHeader {
    var h = VirtioNetHeader()
    h.flags = VirtioNetHeader.needsChecksum
    h.gsoType = type.rawValue
    h.gsoSize = UInt16(size)
    h.checksumStart = UInt16(start)
    h.checksumOffset = 16
    return h
}

private func segments(_ packet: [UInt8], _ header: VirtioNetHeader, max: Int = 2016) throws(OffloadDrop) -> [[UInt8]] {
    let result: Result<Segmenter, OffloadDrop> = packet.withUnsafeBytes { raw in
        Result { () throws(OffloadDrop) in try Segmenter(raw, header: header, maxSegment: max) }
    }
    let segmenter = try result.get()
    var out: [[UInt8]] = []
    var buffer = [UInt8](repeating: 0, count: max)
    for i in 0..<segmenter.count {
        let n = packet.withUnsafeBytes { raw in buffer.withUnsafeMutableBytes { segmenter.segment(i, of: raw, into: $0) } }
        out.append(Array(buffer[0..<n]))
    }
    return out
}

@Test(arguments: [false, true])
func aSuperPacketIsCutIntoSegmentsTheWireCarries(v6: Bool) throws {
    let payload = (0..<10_001).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ 3) }
    let packet = superPacket(v6: v6, payload: payload, flags: 0x19)  // ACK, PSH, FIN
    let ipLength = v6 ? 40 : 20
    let parts = try segments(packet, header(v6 ? .tcpV6 : .tcpV4, size: 1380, start: ipLength))
    #expect(parts.count == 8)
    var joined: [UInt8] = []
    for (i, part) in parts.enumerated() {
        #expect(checksumsVerify(part), "segment \(i)")
        #expect(part.count <= ipLength + 20 + 1380)
        let length = v6 ? Int(part[4]) << 8 | Int(part[5]) : Int(part[2]) << 8 | Int(part[3])
        #expect(length == (v6 ? part.count - 40 : part.count), "segment \(i)'s length field")
        if !v6 { #expect(Int(part[4]) << 8 | Int(part[5]) == 0x1234 + i, "IPv4 identification") }
        let sequence = UInt32(part[ipLength + 4]) << 24 | UInt32(part[ipLength + 5]) << 16 | UInt32(part[ipLength + 6]) << 8 | UInt32(part[ipLength + 7])
        #expect(sequence == 0xFFFF_F000 &+ UInt32(i * 1380), "the sequence number wraps like TCP's")
        let flags = part[ipLength + 13]
        #expect(flags == (i == parts.count - 1 ? 0x19 : 0x10), "PSH and FIN only on the last")
        joined += part[(ipLength + 20)...]
    }
    #expect(joined == payload)
}

@Test func aPartialChecksumIsCompleted() throws {
    // One TCP segment, no segmentation, the checksum left partial as the kernel leaves it.
    let packet = superPacket(v6: false, payload: Array(repeating: 0xAB, count: 333))
    let parts = try segments(packet, header(.none, size: 0, start: 20))
    #expect(parts.count == 1 && parts[0].count == packet.count && checksumsVerify(parts[0]))
    #expect(!checksumsVerify(packet), "the partial one did not verify")
}

@Test(arguments: [
    ("a segment size of zero", 0, 20, 2016, OffloadDrop.impossibleSegmentSize),
    ("a segment bigger than a datagram", 4000, 20, 2016, .impossibleSegmentSize),
    ("a checksum start inside the IP header", 1380, 12, 2016, .badHeaders),
    ("a checksum start past the headers", 1380, 200, 2016, .badHeaders),
])
func impossibleOffloadMetadataDropsThePacketWhole(why: String, size: Int, start: Int, max: Int, drop: OffloadDrop) {
    let packet = superPacket(v6: false, payload: Array(repeating: 1, count: 5000))
    #expect(throws: drop, "\(why)") { try segments(packet, header(.tcpV4, size: size, start: start), max: max) }
}

@Test func segmentationOfWhatIsNotTCPOrNotAskedForIsRefused() {
    var udp = superPacket(v6: false, payload: Array(repeating: 1, count: 3000))
    udp[9] = 17
    #expect(throws: OffloadDrop.unsupportedSegmentation) { try segments(udp, header(.tcpV4, size: 1380, start: 20)) }
    let tcp = superPacket(v6: false, payload: Array(repeating: 1, count: 3000))
    #expect(throws: OffloadDrop.unsupportedSegmentation) { try segments(tcp, header(.udpL4, size: 1380, start: 20)) }
    #expect(throws: OffloadDrop.badHeaders, "an IPv6 type on an IPv4 packet") { try segments(tcp, header(.tcpV6, size: 1380, start: 40)) }
    #expect(throws: OffloadDrop.badHeaders, "truncated") { try segments(Array(tcp[0..<30]), header(.tcpV4, size: 1380, start: 20)) }
    var noCsumRoom = header(.none, size: 0, start: 20)
    noCsumRoom.checksumOffset = 9000
    #expect(throws: OffloadDrop.badHeaders, "a checksum field outside the packet") { try segments(tcp, noCsumRoom, max: 4000) }
    #expect(throws: OffloadDrop.impossibleSegmentSize, "one packet bigger than a datagram") { try segments(tcp, header(.none, size: 0, start: 20)) }
}

@Test func theVirtioHeaderReadsAsTheKernelWritesIt() {
    var h = VirtioNetHeader()
    h.flags = 1; h.gsoType = 4; h.gsoSize = 1380; h.checksumStart = 40; h.checksumOffset = 16
    var bytes = h.bytes
    bytes[1] |= 0x80  // ECN
    #expect(bytes.withUnsafeBytes { VirtioNetHeader($0) } == h)
    #expect([UInt8](repeating: 0, count: 9).withUnsafeBytes { VirtioNetHeader($0) } == nil)
}

/// Runs packets through a coalescer and returns what it writes, with the headers.
private func coalesce(_ packets: [[UInt8]]) -> [(packet: [UInt8], header: VirtioNetHeader)] {
    var coalescer = Coalescer()
    defer { coalescer.release() }
    var written: [(packet: [UInt8], header: VirtioNetHeader)] = []
    for packet in packets {
        packet.withUnsafeBytes { raw in coalescer.add(raw) { written.append((Array($0), $1)) } }
    }
    coalescer.flush { written.append((Array($0), $1)) }
    return written
}

@Test(arguments: [false, true])
func segmentsJoinedAndCutAgainAreTheSameSegments(v6: Bool) throws {
    let payload = (0..<20_000).map { UInt8(truncatingIfNeeded: $0 &* 13) }
    let ipLength = v6 ? 40 : 20
    let parts = try segments(superPacket(v6: v6, payload: payload, flags: 0x18), header(v6 ? .tcpV6 : .tcpV4, size: 1380, start: ipLength))
    let written = coalesce(parts)
    try #require(written.count == 1)
    let joined = written[0]
    #expect(joined.header.gsoType == (v6 ? 4 : 1) && joined.header.gsoSize == 1380 && joined.header.checksumStart == UInt16(ipLength))
    #expect(Array(joined.packet[(ipLength + 20)...]) == payload)
    // What the kernel would do with it: cut it again, at the same size.
    let again = try segments(joined.packet, joined.header)
    #expect(again == parts)
}

@Test func onlyTheNextSegmentOfTheSameFlowJoins() throws {
    let parts = try segments(superPacket(v6: false, payload: Array(repeating: 7, count: 1380 * 4), flags: 0x10),
                             header(.tcpV4, size: 1380, start: 20))
    // A gap: the third segment is missing, so the fourth starts a run of its own.
    #expect(coalesce([parts[0], parts[1], parts[3]]).map(\.header.gsoType) == [1, 0])
    // Another window on the second: not joined, order kept.
    var other = parts[1]
    other[20 + 14] ^= 1
    let split = coalesce([parts[0], other, parts[2]])
    #expect(split.count == 3 && split[1].packet == other)
    // A UDP packet between two runs is written between them.
    var udp = parts[0]
    udp[9] = 17
    let mixed = coalesce([parts[0], parts[1], udp, parts[2], parts[3]])
    #expect(mixed.count == 3 && mixed[1].packet == udp && mixed[0].header.gsoType == 1 && mixed[2].header.gsoType == 1)
    // A SYN or FIN never joins.
    var fin = parts[1]
    fin[20 + 13] = 0x11
    #expect(coalesce([parts[0], fin]).allSatisfy { $0.header.gsoType == 0 })
}

/// The vector sum equals RFC 1071's word-by-word definition for every length (odd ones too),
/// every alignment, and the all-ones bytes that carry most.
@Test func theChecksumIsRFC1071sForEveryLengthAndAlignment() {
    func reference(_ bytes: ArraySlice<UInt8>) -> UInt16 {
        var sum: UInt32 = 0
        var i = bytes.startIndex
        while i < bytes.endIndex {
            let high = UInt32(bytes[i]) << 8, low = i + 1 < bytes.endIndex ? UInt32(bytes[i + 1]) : 0
            sum += high | low
            sum = (sum & 0xFFFF) + (sum >> 16)
            i += 2
        }
        return UInt16(sum)
    }
    var rng = SeededRandom(seed: 1071)
    let random = (0..<2200).map { _ in UInt8(truncatingIfNeeded: rng.next()) }
    let ones = [UInt8](repeating: 0xFF, count: 2200)
    for bytes in [random, ones] {
        for start in 0..<9 {
            for length in Array(0..<300) + [1399, 1400, 1401, 2048, 2191] where start + length <= bytes.count {
                let slice = bytes[start..<(start + length)]
                let ours = Array(slice).withUnsafeBytes { Checksum.fold(Checksum.sum($0)) }
                // One's complement has two zeros: 0 and 0xFFFF are the same sum.
                let expected = reference(slice)
                #expect(ours == expected || Set([ours, expected]) == [0, 0xFFFF], "start \(start), length \(length)")
            }
        }
    }
}
