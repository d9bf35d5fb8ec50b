/// The answer a router gives a packet too big for the next link, written by the server for a
/// client whose path carries less than the server's tunnel does: ICMP "fragmentation needed"
/// (RFC 1191) for IPv4 with don't-fragment set, ICMPv6 "packet too big" (RFC 4443) for IPv6.
/// The sender's kernel lowers its path MTU to the destination, and TCP re-cuts what it has in
/// flight, so a connection opened before the client moved onto a smaller path carries on.
///
/// The answer comes from the packet's destination (the client's inner address, so it needs no
/// address of the server's own) to its source, quoting the packet's start, as a router does.
public enum PacketTooBig {
    /// Whether a router would answer `packet` rather than fragment it: IPv6, or IPv4 with
    /// don't-fragment set. Other IPv4 packets are sent whole, as before a notice.
    public static func mayNotBeFragmented(_ packet: UnsafeRawBufferPointer) -> Bool {
        guard let first = packet.first else { return false }
        return first >> 4 == 6 || (first >> 4 == 4 && packet.count >= 20 && packet[6] & 0x40 != 0)
    }

    /// The ICMP answer to `packet` for a link of `mtu` bytes; nil when the packet is not one to
    /// answer: not IPv4 or IPv6, an IPv4 packet that may be fragmented or is a later fragment,
    /// one from an address that is nobody's (unspecified, loopback, multicast), or an ICMP
    /// error itself (never answered, so two routers cannot feed each other).
    public static func answer(to packet: UnsafeRawBufferPointer, mtu: Int) -> [UInt8]? {
        guard let first = packet.first else { return nil }
        switch first >> 4 {
        case 4: return answerIPv4(packet, mtu: mtu)
        case 6: return answerIPv6(packet, mtu: mtu)
        default: return nil
        }
    }

    private static func answerIPv4(_ packet: UnsafeRawBufferPointer, mtu: Int) -> [UInt8]? {
        let headerLength = Int(packet[0] & 0x0f) * 4
        guard headerLength >= 20, packet.count >= headerLength, packet[6] & 0x40 != 0,
              packet[6] & 0x1f == 0, packet[7] == 0,  // the first fragment (or none)
              packet[12] != 0, packet[12] != 127, packet[12] < 224 else { return nil }
        // An ICMP error (types 3, 4, 5, 11, 12) gets none; the rest of ICMP (echo) does.
        if packet[9] == 1, packet.count > headerLength, [3, 4, 5, 11, 12].contains(packet[headerLength]) { return nil }
        let quoted = Array(packet[0..<min(packet.count, headerLength + 8)])
        var icmp: [UInt8] = [3, 4, 0, 0, 0, 0, UInt8(truncatingIfNeeded: mtu >> 8), UInt8(truncatingIfNeeded: mtu)] + quoted
        store(checksum(icmp[...]), in: &icmp, at: 2)
        let total = 20 + icmp.count
        var header: [UInt8] = [0x45, 0, UInt8(total >> 8), UInt8(total & 0xff), 0, 0, 0x40, 0, 64, 1, 0, 0]
        header += packet[16..<20]  // from the packet's destination
        header += packet[12..<16]  // to its source
        store(checksum(header[...]), in: &header, at: 10)
        return header + icmp
    }

    private static func answerIPv6(_ packet: UnsafeRawBufferPointer, mtu: Int) -> [UInt8]? {
        guard packet.count >= 40, packet[8] != 0xff, packet[8..<24].contains(where: { $0 != 0 }) else { return nil }
        // An ICMPv6 error (types below 128) directly after the header gets none.
        if packet[6] == 58, packet.count > 40, packet[40] < 128 { return nil }
        // As much of the packet as keeps the answer within IPv6's minimum MTU.
        let quoted = Array(packet[0..<min(packet.count, 1280 - 48)])
        let length = 8 + quoted.count
        let mtu = max(mtu, 1280)  // hosts take nothing less for IPv6
        var icmp: [UInt8] = [2, 0, 0, 0, UInt8(truncatingIfNeeded: mtu >> 24), UInt8(truncatingIfNeeded: mtu >> 16),
                             UInt8(truncatingIfNeeded: mtu >> 8), UInt8(truncatingIfNeeded: mtu)] + quoted
        let source = Array(packet[24..<40]), destination = Array(packet[8..<24])
        let pseudo = source + destination + [0, 0, UInt8(length >> 8), UInt8(length & 0xff), 0, 0, 0, 58]
        store(checksum((pseudo + icmp)[...]), in: &icmp, at: 2)
        let header: [UInt8] = [0x60, 0, 0, 0, UInt8(length >> 8), UInt8(length & 0xff), 58, 64] + source + destination
        return header + icmp
    }

    /// The Internet checksum (RFC 1071) of `bytes`.
    static func checksum(_ bytes: ArraySlice<UInt8>) -> UInt16 {
        var sum: UInt32 = 0
        var i = bytes.startIndex
        while i + 1 < bytes.endIndex {
            sum += UInt32(bytes[i]) << 8 | UInt32(bytes[i + 1])
            i += 2
        }
        if i < bytes.endIndex { sum += UInt32(bytes[i]) << 8 }
        while sum >> 16 != 0 { sum = (sum & 0xffff) + (sum >> 16) }
        return ~UInt16(sum)
    }

    private static func store(_ value: UInt16, in bytes: inout [UInt8], at offset: Int) {
        bytes[offset] = UInt8(value >> 8)
        bytes[offset + 1] = UInt8(value & 0xff)
    }
}
