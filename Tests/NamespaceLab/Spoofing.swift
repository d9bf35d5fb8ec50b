import Topology
import Foundation
import Glibc
public import Basics
public import Device
import Netlink

/// What a hostile host on the LAN does: packets with whatever addresses it likes, written whole
/// (IPv4 header included) through a raw socket, and a watch on what comes back to it.
extension NamespaceLab {
    /// Sends `packet` (an IPv4 packet, header included) from this namespace towards `destination`:
    /// its route decides the way out and the neighbour it goes to (the laptop's uplink, say),
    /// whatever the header claims the packet's addresses are.
    public func sendForged(_ packet: [UInt8], to destination: IPAddress) throws {
        let fd = try namespace.run { () throws(NetlinkError) -> Int32 in
            let fd = socket(AF_INET, Int32(SOCK_RAW.rawValue), Int32(IPPROTO_RAW))
            guard fd >= 0 else { throw NetlinkError("raw socket", errno) }
            return fd
        }
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        let bytes = destination.bytes
        address.sin_addr.s_addr = UInt32(bytes[0]) | UInt32(bytes[1]) << 8 | UInt32(bytes[2]) << 16 | UInt32(bytes[3]) << 24
        let sent = packet.withUnsafeBytes { buffer in
            withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    sendto(fd, buffer.baseAddress, buffer.count, 0, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
                }
            }
        }
        guard sent == packet.count else { throw NetlinkError("send a forged packet", errno) }
    }

    /// An IPv4 TCP segment with no payload and correct checksums: `flags` as in the header
    /// (0x12 is SYN/ACK).
    public static func tcpSegment(from source: SocketAddress, to destination: SocketAddress, flags: UInt8,
                                  sequence: UInt32 = 0x1000_0000, acknowledgement: UInt32 = 0x2000_0000) -> [UInt8] {
        var tcp = [UInt8](repeating: 0, count: 20)
        tcp[0] = UInt8(source.port >> 8); tcp[1] = UInt8(source.port & 0xff)
        tcp[2] = UInt8(destination.port >> 8); tcp[3] = UInt8(destination.port & 0xff)
        for i in 0..<4 {
            tcp[4 + i] = UInt8(truncatingIfNeeded: sequence >> (24 - 8 * i))
            tcp[8 + i] = UInt8(truncatingIfNeeded: acknowledgement >> (24 - 8 * i))
        }
        tcp[12] = 5 << 4
        tcp[13] = flags
        tcp[14] = 0xff; tcp[15] = 0xff  // window
        let pseudo = source.ip.bytes + destination.ip.bytes + [0, 6, 0, UInt8(tcp.count)]
        let check = checksum(pseudo + tcp)
        tcp[16] = UInt8(check >> 8); tcp[17] = UInt8(check & 0xff)
        return ipv4Header(from: source.ip, to: destination.ip, protocol: 6, payload: tcp.count) + tcp
    }

    /// An IPv4 UDP datagram with `payload` (no UDP checksum, which IPv4 allows).
    public static func udpDatagram(from source: SocketAddress, to destination: SocketAddress, payload: [UInt8]) -> [UInt8] {
        let length = 8 + payload.count
        let udp: [UInt8] = [UInt8(source.port >> 8), UInt8(source.port & 0xff), UInt8(destination.port >> 8),
                            UInt8(destination.port & 0xff), UInt8(length >> 8), UInt8(length & 0xff), 0, 0]
        return ipv4Header(from: source.ip, to: destination.ip, protocol: 17, payload: length) + udp + payload
    }

    /// An ICMP "port unreachable" from `source` about `original` (an IPv4 packet this machine
    /// supposedly sent): its header and first 8 bytes, as a router or host quotes them.
    public static func portUnreachable(from source: IPAddress, to destination: IPAddress, about original: [UInt8]) -> [UInt8] {
        var icmp: [UInt8] = [3, 3, 0, 0, 0, 0, 0, 0] + original.prefix(28)
        let check = checksum(icmp)
        icmp[2] = UInt8(check >> 8); icmp[3] = UInt8(check & 0xff)
        return ipv4Header(from: source, to: destination, protocol: 1, payload: icmp.count) + icmp
    }

    private static func ipv4Header(from source: IPAddress, to destination: IPAddress, protocol number: UInt8, payload: Int) -> [UInt8] {
        let total = 20 + payload
        var header: [UInt8] = [0x45, 0, UInt8(total >> 8), UInt8(total & 0xff), 0x12, 0x34, 0x40, 0, 64, number, 0, 0]
        header += source.bytes + destination.bytes
        let check = checksum(header)
        header[10] = UInt8(check >> 8); header[11] = UInt8(check & 0xff)
        return header
    }

    /// The Internet checksum (RFC 1071).
    private static func checksum(_ bytes: [UInt8]) -> UInt16 {
        var sum: UInt32 = 0
        var i = 0
        while i + 1 < bytes.count {
            sum += UInt32(bytes[i]) << 8 | UInt32(bytes[i + 1])
            i += 2
        }
        if i < bytes.count { sum += UInt32(bytes[i]) << 8 }
        while sum >> 16 != 0 { sum = (sum & 0xffff) + (sum >> 16) }
        return ~UInt16(sum)
    }
}

/// Every IPv4 or IPv6 packet that arrives in a namespace, on any interface, described in one
/// line (`tcp 10.77.0.2:22222 -> 10.20.0.1:40000 flags 0x14`), for a test to look for.
public final class PacketWatch: @unchecked Sendable {  // every mutable field is read and written under `lock`
    private let lock = NSLock()
    private var lines: [String] = []
    private var capture: PacketCapture?

    public init(in lab: NamespaceLab) throws {
        capture = try PacketCapture(ethertype: 0x0003 /* ETH_P_ALL */, in: lab, snapshot: 256) { [weak self] packet, _, from in
            let bytes = Array(packet)
            guard let self, let parsed = LeakTap.Parsed(bytes, ethertype: UInt16(bigEndian: from.networkProtocol)) else { return }
            var line = parsed.description
            if parsed.protocolNumber == 6, bytes[0] >> 4 == 4 {
                let offset = Int(bytes[0] & 0x0f) * 4 + 13
                if offset < bytes.count { line += " flags 0x" + String(bytes[offset], radix: 16) }
            }
            self.lock.withLock { self.lines.append(line) }
        }
    }

    /// What arrived so far.
    public var seen: [String] { lock.withLock { lines } }
}
