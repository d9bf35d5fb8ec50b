import Topology
import Foundation
import Glibc
import Synchronization
public import Basics
import Tunnel
public import Device
import Netlink

/// Everything the laptop sends onto its uplinks, as the router sees it (an AF_PACKET socket for
/// every protocol on the router's side of `eth0` and `wifi0`), judged against what may leave a
/// machine whose VPN is always on. What may not is a leak, described for the test's message.
public final class LeakTap: @unchecked Sendable {  // every mutable field is read and written under `lock`
    /// What may leave the laptop outside the tunnel.
    public enum Rule: Sendable {
        /// Full tunnel: the session's UDP to `server`, DHCP, ARP and the ICMPv6 an uplink needs;
        /// and TCP to `web` (a captive portal's login page, the connectivity check).
        case full(servers: [IPAddress], port: UInt16, web: [SocketAddress] = [])
        /// Split tunnel: anything but packets for these prefixes.
        case split([Prefix])
    }

    private let lock = NSLock()
    private var found: [(at: LabInstant, wall: Double, what: String)] = []
    private var seen = 0
    private var capture: PacketCapture?

    /// Taps `interfaces` (by name) in `lab`, the router's side of the laptop's uplinks.
    public init(_ interfaces: [String], in lab: NamespaceLab, rule: Rule) throws {
        var names: [Int32: String] = [:]
        for name in interfaces {
            if let index = (try? lab.ip("-o link show \(name)")).flatMap({ Int32($0.prefix { $0 != ":" }) }) { names[index] = name }
        }
        let tapped = names
        capture = try PacketCapture(ethertype: 0x0003 /* ETH_P_ALL */, in: lab, snapshot: 2048) { [weak self] packet, _, from in
            guard let self, let interface = tapped[from.interface] else { return }
            let verdict = Self.judge(Array(packet), protocol: UInt16(bigEndian: from.networkProtocol), rule: rule)
            let at = LabClock.now
            let wall = Date().timeIntervalSince1970
            // Where it was seen: the router's side of the uplink, coming from the laptop or
            // (PACKET_OUTGOING) going to it; and its place among all the packets the tap saw.
            let direction = from.packetType == 4 ? "to the laptop" : "from the laptop"
            self.lock.withLock {
                self.seen += 1
                if let leak = verdict { self.found.append((at, wall, "\(leak) on \(interface) \(direction), packet #\(self.seen)")) }
            }
        }
    }

    /// The leaks seen so far (in `from...`, when given), one line each with when it was seen
    /// (wall-clock seconds, as the agent's log has them), at most `limit`.
    public func leaks(since from: LabInstant? = nil, limit: Int = 20) -> [String] {
        lock.withLock {
            found.filter { from == nil || $0.at >= from! }.prefix(limit).map { "\($0.what) at ts=\(String(format: "%.3f", $0.wall))" }
        }
    }

    /// Packets seen, leaks or not: a tap that saw nothing proves nothing.
    public var packetsSeen: Int { lock.withLock { seen } }

    /// nil when `packet` (layer 3, of ethertype `protocol`) may leave; else what it is.
    static func judge(_ packet: [UInt8], protocol ethertype: UInt16, rule: Rule) -> String? {
        guard let p = Parsed(packet, ethertype: ethertype) else {
            return ethertype == 0x0806 ? nil : "ethertype 0x\(String(ethertype, radix: 16)), \(packet.count) bytes"
        }
        switch rule {
        case .split(let prefixes):
            return prefixes.contains { $0.contains(p.destination) } ? p.description : nil
        case .full(let servers, let port, let web):
            if p.protocolNumber == 17, servers.contains(p.destination), p.destinationPort == port { return nil }
            if p.protocolNumber == 6, let to = p.destinationPort, web.contains(SocketAddress(p.destination, port: to)) { return nil }
            if p.protocolNumber == 17, p.sourcePort == 68, p.destinationPort == 67 { return nil }  // DHCPv4
            if p.protocolNumber == 17, p.sourcePort == 546, p.destinationPort == 547 { return nil }  // DHCPv6
            if p.protocolNumber == 58, let type = p.icmpType, [131, 133, 135, 136, 143].contains(type) { return nil }
            return p.description
        }
    }

    /// The fields of an IPv4 or IPv6 packet the judgement needs.
    struct Parsed: CustomStringConvertible {
        var source: IPAddress
        var destination: IPAddress
        var protocolNumber: UInt8
        var sourcePort: UInt16?
        var destinationPort: UInt16?
        var icmpType: UInt8?

        init?(_ b: [UInt8], ethertype: UInt16) {
            var transport: Int
            if ethertype == 0x0800, b.count >= 20, b[0] >> 4 == 4 {
                transport = Int(b[0] & 0x0f) * 4
                protocolNumber = b[9]
                source = IPAddress(bytes: b[12..<16])!
                destination = IPAddress(bytes: b[16..<20])!
            } else if ethertype == 0x86dd, b.count >= 40, b[0] >> 4 == 6 {
                transport = 40
                protocolNumber = b[6]
                source = IPAddress(bytes: b[8..<24])!
                destination = IPAddress(bytes: b[24..<40])!
                if protocolNumber == 0, b.count >= 48 {  // hop-by-hop options (MLD's router alert)
                    protocolNumber = b[40]
                    transport += (Int(b[41]) + 1) * 8
                }
            } else {
                return nil
            }
            if (protocolNumber == 6 || protocolNumber == 17), transport + 4 <= b.count {
                sourcePort = UInt16(b[transport]) << 8 | UInt16(b[transport + 1])
                destinationPort = UInt16(b[transport + 2]) << 8 | UInt16(b[transport + 3])
            }
            if (protocolNumber == 1 || protocolNumber == 58), transport < b.count { icmpType = b[transport] }
        }

        var description: String {
            let name = [1: "icmp", 6: "tcp", 17: "udp", 58: "icmpv6"][Int(protocolNumber)] ?? "proto \(protocolNumber)"
            let ports = sourcePort.map { ":\($0)" } ?? ""
            let to = destinationPort.map { ":\($0)" } ?? (icmpType.map { " type \($0)" } ?? "")
            return "\(name) \(source)\(ports) -> \(destination)\(to)"
        }
    }
}

/// What applications on the laptop keep trying while a test runs: a datagram to a host on the
/// internet, a name look-up to the LAN's resolver, a TCP connection to a web server, and IPv6
/// to the LAN and beyond, every `interval`. With the tunnel down, each is a leak waiting to happen.
public final class LeakBait: @unchecked Sendable {  // immutable but for `running`, an atomic
    private let running = Atomic<Bool>(true)
    private let done = DispatchGroup()
    public let targets: [SocketAddress]

    /// Datagrams to every target, and a TCP connection attempt to those on port 80 (IPv4).
    public init(from lab: NamespaceLab, targets: [SocketAddress], interval: Duration = .milliseconds(50)) throws {
        self.targets = targets
        let v4 = try UDPSocket(bindingTo: SocketAddress(.v4(0), port: 0), namespace: lab.namespace)
        let v6 = try? UDPSocket(bindingTo: SocketAddress(.v6(0, 0), port: 0), namespace: lab.namespace)  // IPv6 may be off
        let namespace = lab.namespace
        done.enter()
        Thread { [self] in
            let payload = [UInt8](repeating: 0x42, count: 64)
            while running.load(ordering: .relaxed) {
                for target in targets {
                    if target.port == 80, target.ip.family == .v4 {
                        // A TCP connection attempt, abandoned at once.
                        if let tcp = try? namespace.run({ () throws(NetlinkError) -> Int32 in
                            socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
                        }), tcp >= 0 {
                            var sa = TCPStream.sockaddr(target)
                            _ = withUnsafePointer(to: &sa) {
                                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(tcp, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
                            }
                            usleep(2_000)
                            close(tcp)
                        }
                    } else {
                        _ = try? (target.ip.family == .v4 ? v4 : v6)?.send(payload, to: target)
                    }
                }
                usleep(UInt32(interval.components.seconds * 1_000_000 + interval.components.attoseconds / 1_000_000_000_000))
            }
            done.leave()
        }.start()
    }

    public func stop() {
        running.store(false, ordering: .relaxed)
        _ = done.wait(timeout: .now() + 2)
    }

    deinit { stop() }
}

/// A name server for the lab: answers A queries for the names it knows, NXDOMAIN for the rest,
/// and counts what it was asked, on a thread of its own until `stop()`.
public final class LabResolver: @unchecked Sendable {  // every mutable field is read and written under `lock`
    private let running = Atomic<Bool>(true)
    private let done = DispatchGroup()
    private let lock = NSLock()
    private var asked: [String] = []
    private var names: [String: IPAddress]

    public init(at address: IPAddress, in lab: NamespaceLab, names: [String: IPAddress]) throws {
        self.names = names
        let socket = try UDPSocket(bindingTo: SocketAddress(address, port: 53), namespace: lab.namespace)
        done.enter()
        Thread { [self] in
            while running.load(ordering: .relaxed) {
                guard let (query, peer) = (try? socket.receive(timeout: .milliseconds(100))) ?? nil,
                      let (name, type, end) = Self.question(query) else { continue }
                let known = lock.withLock {
                    asked.append(name)
                    return self.names[name]
                }
                _ = try? socket.send(Self.answer(query, end: end, address: type == 1 ? known : nil, known: known != nil), to: peer)
            }
            done.leave()
        }.start()
    }

    /// Makes every later answer for `name` be `address`.
    public func answer(_ name: String, with address: IPAddress) { lock.withLock { names[name] = address } }

    /// The names asked so far, in order.
    public var queries: [String] { lock.withLock { asked } }

    public func stop() {
        running.store(false, ordering: .relaxed)
        _ = done.wait(timeout: .now() + 2)
    }

    deinit { stop() }

    /// The question's name (lower case), type, and where the question ends.
    static func question(_ query: [UInt8]) -> (String, UInt16, Int)? {
        guard query.count > 12, query[2] & 0x80 == 0 else { return nil }
        var labels: [String] = []
        var at = 12
        while at < query.count, query[at] != 0 {
            let length = Int(query[at])
            guard length < 64, at + 1 + length < query.count else { return nil }
            labels.append(String(decoding: query[(at + 1)..<(at + 1 + length)], as: UTF8.self).lowercased())
            at += 1 + length
        }
        guard at + 5 <= query.count else { return nil }
        let type = UInt16(query[at + 1]) << 8 | UInt16(query[at + 2])
        return (labels.joined(separator: "."), type, at + 5)
    }

    /// The query turned into an answer: one A record, none, or NXDOMAIN for an unknown name.
    static func answer(_ query: [UInt8], end: Int, address: IPAddress?, known: Bool) -> [UInt8] {
        var reply = Array(query[0..<end])
        reply[2] = 0x81  // QR, RD
        reply[3] = known ? 0x80 : 0x83  // RA; NXDOMAIN when unknown
        reply[6] = 0; reply[7] = address == nil ? 0 : 1
        reply[8] = 0; reply[9] = 0; reply[10] = 0; reply[11] = 0
        if let address {
            reply += [0xC0, 0x0C, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4] + address.bytes
        }
        return reply
    }
}
