import Device
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
        var answer: [UInt8] = [0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 1, 0, 0]
        answer += packet[16..<20]  // from the packet's destination
        answer += packet[12..<16]  // to its source
        answer += [3, 4, 0, 0, 0, 0, UInt8(truncatingIfNeeded: mtu >> 8), UInt8(truncatingIfNeeded: mtu)]
        answer += packet[0..<min(packet.count, headerLength + 8)]
        answer.withUnsafeMutableBytes { out in
            let icmp = Checksum.sum(UnsafeRawBufferPointer(rebasing: out[20...]))
            out.storeBytes(of: (~Checksum.fold(icmp)).bigEndian, toByteOffset: 22, as: UInt16.self)
            Checksum.setLength(of: out, isV6: false, ipLength: 20, to: out.count)  // and the header's checksum
        }
        return answer
    }

    private static func answerIPv6(_ packet: UnsafeRawBufferPointer, mtu: Int) -> [UInt8]? {
        guard packet.count >= 40, packet[8] != 0xff, packet[8..<24].contains(where: { $0 != 0 }) else { return nil }
        // An ICMPv6 error (types below 128) directly after the header gets none.
        if packet[6] == 58, packet.count > 40, packet[40] < 128 { return nil }
        let mtu = max(mtu, 1280)  // hosts take nothing less for IPv6
        var answer: [UInt8] = [0x60, 0, 0, 0, 0, 0, 58, 64]
        answer += packet[24..<40]  // from the packet's destination
        answer += packet[8..<24]  // to its source
        answer += [2, 0, 0, 0, UInt8(truncatingIfNeeded: mtu >> 24), UInt8(truncatingIfNeeded: mtu >> 16),
                   UInt8(truncatingIfNeeded: mtu >> 8), UInt8(truncatingIfNeeded: mtu)]
        // As much of the packet as keeps the answer within IPv6's minimum MTU.
        answer += packet[0..<min(packet.count, 1280 - 48)]
        answer.withUnsafeMutableBytes { out in
            Checksum.setLength(of: out, isV6: true, ipLength: 40, to: out.count)
            let sum = Checksum.pseudoHeader(UnsafeRawBufferPointer(out), isV6: true, length: out.count - 40, next: 58)
                &+ Checksum.sum(UnsafeRawBufferPointer(rebasing: out[40...]))
            out.storeBytes(of: (~Checksum.fold(sum)).bigEndian, toByteOffset: 42, as: UInt16.self)
        }
        return answer
    }

    /// How often answers go to one client's senders, per queue of the server: as a router
    /// limits its ICMP errors (the sender's kernel acts on the first; the rest of a burst is
    /// dropped alike).
    static let rate = ServerLimits.Rate(perSecond: 100, burst: 10)
    /// Clients whose budgets a queue keeps at once.
    static let clientsKept = 4096
}
