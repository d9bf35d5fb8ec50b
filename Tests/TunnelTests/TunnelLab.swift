import Foundation
import Glibc
import NamespaceLab
import Basics
import Testing
import Tunnel
import Device

/// The tunnel tests' lab is the shared one, with a laptop-and-server topology added.
typealias TunnelLab = NamespaceLab

/// The fields of an IPv4 header a test looks at.
struct IPv4Header: Equatable {
    var version: Int
    var protocolNumber: UInt8
    var source: IPAddress
    var destination: IPAddress
    var payload: [UInt8]

    init?(_ packet: [UInt8]) {
        guard packet.count >= 20, packet[0] >> 4 == 4 else { return nil }
        let headerLength = Int(packet[0] & 0x0F) * 4
        guard packet.count >= headerLength else { return nil }
        version = 4
        protocolNumber = packet[9]
        source = IPAddress(bytes: packet[12..<16])!
        destination = IPAddress(bytes: packet[16..<20])!
        payload = Array(packet[headerLength...])
    }

    /// An IPv4 UDP packet (no UDP checksum, which IPv4 allows) with a correct header checksum.
    static func udp(from source: SocketAddress, to destination: SocketAddress, payload: [UInt8]) -> [UInt8] {
        let total = 28 + payload.count
        var packet: [UInt8] = [0x45, 0, UInt8(total >> 8), UInt8(total & 0xFF), 0, 0, 0x40, 0, 64, 17, 0, 0]
        packet += source.ip.bytes + destination.ip.bytes
        var sum: UInt32 = 0
        for i in stride(from: 0, to: 20, by: 2) { sum += UInt32(packet[i]) << 8 | UInt32(packet[i + 1]) }
        while sum > 0xFFFF { sum = (sum & 0xFFFF) + (sum >> 16) }
        let checksum = ~UInt16(sum)
        packet[10] = UInt8(checksum >> 8)
        packet[11] = UInt8(checksum & 0xFF)
        let udpLength = 8 + payload.count
        packet += [UInt8(source.port >> 8), UInt8(source.port & 0xFF), UInt8(destination.port >> 8), UInt8(destination.port & 0xFF),
                   UInt8(udpLength >> 8), UInt8(udpLength & 0xFF), 0, 0]
        return packet + payload
    }
}

extension TunDevice {
    /// The next IPv4 packet that `matches` within `limit`, skipping the rest (the kernel's own
    /// IPv6 router solicitations and MLD reports go into the TUN too).
    func nextIPv4(within limit: Duration = .seconds(2), where matches: (IPv4Header) -> Bool) throws -> IPv4Header? {
        let deadline = ContinuousClock.now + limit
        var buffer = [UInt8](repeating: 0, count: PacketBatch.slotSize)
        while deadline > .now {
            let left = deadline - .now
            guard let n = try buffer.withUnsafeMutableBytes({ try read(into: $0, timeout: left) }) else { return nil }
            if let header = IPv4Header(Array(buffer[..<n])), matches(header) { return header }
        }
        return nil
    }
}
