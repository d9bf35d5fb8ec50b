import Topology
import Glibc
import NamespaceLab
import Testing
import Basics
@testable import PathMonitor
import Netlink

// Neighbour dumps captured on Linux 6.18.44 (`uname -r`: 6.18.44-fc-v669), in namespace a of
// two namespaces joined by a veth, after one ping each way:
//   ip netns add a; ip netns add b; ip -n a link set lo up; ip -n b link set lo up
//   ip -n a link add veth0 type veth peer name veth1 netns b
//   ip -n a link set veth0 address 02:00:5e:10:00:0a; ip -n b link set veth1 address 02:00:5e:10:00:0b
//   ip -n a address add 192.0.2.1/24 dev veth0; ip -n b address add 192.0.2.2/24 dev veth1
//   ip -n a address add 2001:db8::1/64 dev veth0 nodad; ip -n b address add 2001:db8::2/64 dev veth1 nodad
//   ip -n a link set veth0 up; ip -n b link set veth1 up
//   ip netns exec a ping -c1 192.0.2.2; ip netns exec a ping -c1 2001:db8::2
// then RTM_GETNEIGH with NLM_F_REQUEST|NLM_F_DUMP and a zeroed ndmsg but for its family, once
// for AF_INET and once for AF_INET6: each is the first buffer the kernel sent back, as received.

/// AF_INET: 192.0.2.2 on link 2, REACHABLE at 02:00:5e:10:00:0b; then NLMSG_DONE.
private let ipv4Dump = bytes(hex: """
    4c0000001c000200010000002f10000002000000020000000200000108000100c00002020a00020002005e10000b
    00000800040004000000140003000f0000000f0000000f000000010000001400000003000200010000002f100000
    00000000
    """)

/// AF_INET6: the multicast entries ff02::16, ff02::1:ff10:a and ff02::1:ff00:2 (NOARP, at
/// 33:33:...), and 2001:db8::2 REACHABLE at 02:00:5e:10:00:0b; then NLMSG_DONE.
private let ipv6Dump = bytes(hex: """
    580000001c00020001000000581000000a000000020000004000000514000100ff020000000000000000000000000016
    0a0002003333000000160000080004000000000014000300f1170000810000008100000000000000580000001c000200
    01000000581000000a00000002000000020000011400010020010db80000000000000000000000020a00020002005e10
    000b00000800040004000000140003001c0000001c0000001c00000001000000580000001c0002000100000058100000
    0a000000020000004000000514000100ff0200000000000000000001ff10000a0a0002003333ff10000a000008000400
    000000001400030095170000250000002500000000000000580000001c00020001000000581000000a00000002000000
    4000000514000100ff0200000000000000000001ff0000020a0002003333ff0000020000080004000000000014000300
    8c1700001c0000001c000000000000001400000003000200010000005810000000000000
    """)

/// Each message of a captured buffer, as the dump's reader hands them to the decoder.
private func neighbours(in buffer: [UInt8]) -> [Neighbour] {
    NetlinkDecoder.messages(buffer).messages.compactMap { NetlinkDecoder.neighbour(buffer[$0.bytes]) }
}

private let peer = HardwareAddress("02:00:5e:10:00:0b")!

@Test func realIPv4DumpDecodes() {
    let (messages, complete) = NetlinkDecoder.messages(ipv4Dump)
    #expect(complete && messages.map { $0.type } == [RTM.newNeighbour, NL.done])
    let expected = Neighbour(linkIndex: 2, address: IPAddress("192.0.2.2")!, hardwareAddress: peer, state: .reachable)
    #expect(neighbours(in: ipv4Dump) == [expected])
    #expect(expected.usableHardwareAddress == peer)
}

@Test func realIPv6DumpDecodesHostAndMulticastEntries() {
    let found = neighbours(in: ipv6Dump)
    #expect(found.map { $0.address.description } == ["ff02::16", "2001:db8::2", "ff02::1:ff10:a", "ff02::1:ff00:2"])
    #expect(found.allSatisfy { $0.linkIndex == 2 && $0.usableHardwareAddress != nil })
    let host = found.first { $0.address == IPAddress("2001:db8::2") }
    #expect(host?.state == .reachable && host?.hardwareAddress == peer)
    let multicast = found.filter(\.address.isMulticast)
    #expect(multicast.allSatisfy { $0.state == .noARP && $0.hardwareAddress?.bytes.prefix(2) == [0x33, 0x33] })
}

@Test func truncatedNeighbourMessagesDecodeToNothing() {
    let message = Array(ipv4Dump.prefix(76))
    #expect(NetlinkDecoder.neighbour(message) != nil)
    for cut in 0..<message.count { #expect(NetlinkDecoder.neighbour(message.prefix(cut)) == nil, "cut at \(cut)") }
    // The header saying more than there is, or an attribute running past the message.
    var overlong = message
    overlong[0] = 80
    #expect(NetlinkDecoder.neighbour(overlong) == nil)
    var overrun = message
    overrun[28] = 60  // NDA_DST's length
    #expect(NetlinkDecoder.neighbour(overrun) == nil)
    // Cut anywhere, a buffer splits into whole messages only, and never crashes the reader.
    for cut in 0...ipv6Dump.count { _ = neighbours(in: Array(ipv6Dump.prefix(cut))) }
}

@Test func otherMessagesAndFamiliesAreNotNeighbours() {
    let message = Array(ipv4Dump.prefix(76))
    func changed(_ offset: Int, _ value: UInt8) -> [UInt8] {
        var copy = message
        copy[offset] = value
        return copy
    }
    #expect(NetlinkDecoder.neighbour(changed(4, 29)) == nil, "RTM_DELNEIGH")
    #expect(NetlinkDecoder.neighbour(changed(16, 7)) == nil, "AF_BRIDGE: a bridge's forwarding entry")
    #expect(NetlinkDecoder.neighbour(changed(16, 10)) == nil, "AF_INET6 with a 4-byte address")
    #expect(NetlinkDecoder.neighbour(changed(20, 0)) == nil, "no link")
    #expect(NetlinkDecoder.neighbour(changed(30, 5)) == nil, "no NDA_DST")
    // An incomplete entry, without NDA_LLADDR: the neighbour has no address to use.
    var incomplete = changed(24, 0x01)  // NUD_INCOMPLETE
    incomplete[38] = 9  // NDA_LLADDR's type becomes one the decoder skips
    let entry = NetlinkDecoder.neighbour(incomplete)
    #expect(entry?.state == .incomplete && entry?.hardwareAddress == nil && entry?.usableHardwareAddress == nil)
}

@Test func hardwareAddressesParseAndPrint() {
    let address = HardwareAddress("02:00:5E:10:00:0B")
    #expect(address?.description == "02:00:5e:10:00:0b")
    #expect(HardwareAddress("02-00-5e-10-00-0b") == address)
    #expect(HardwareAddress(bytes: [2, 0, 0x5E, 0x10, 0, 0x0B]) == address)
    #expect(HardwareAddress("80:00:02:08:fe:80:00:00:00:00:00:00:00:02:c9:03:00:0a:bc:de")?.bytes.count == 20)
    for text in ["", ":", "02:00:5e:10:00:", "02:00:5e:10:00:0g", "2:00:5e:10:00:0b", "02:00-5e:10:00:0b", "02::5e",
                 "0200.5e10.000b", " 02:00:5e:10:00:0b", "+2:00:5e:10:00:0b", "٠٢:00:5e:10:00:0b",
                 Array(repeating: "aa", count: 33).joined(separator: ":")] {
        #expect(HardwareAddress(text) == nil, "\(text)")
    }
    #expect(HardwareAddress(bytes: []) == nil)
}

@Test func validStatesAreTheOnesTheKernelSendsTo() {
    let valid: [NeighbourState] = [.reachable, .stale, .delay, .probe, .noARP, .permanent]
    let invalid: [NeighbourState] = [[], .incomplete, .failed]
    #expect(valid.allSatisfy { $0.isValid })
    #expect(!invalid.contains { $0.isValid })
}

// MARK: In a namespace

/// True when this kernel runs IPv6 (it may be disabled at boot).
private let hasIPv6 = access("/proc/net/if_inet6", F_OK) == 0

@Suite(.enabled(if: NamespaceLab.isRoot, Comment(rawValue: NamespaceLab.skipReason)), .serialized)
struct NeighbourResolutionTests {
    /// A laptop whose eth0 (10.20.0.57/24, fd00:20::57/64) faces a router's eth-r (10.20.0.1,
    /// fd00:20::1) at `routerAddress`; nothing has gone between them yet. Both namespaces go
    /// when the labs do, whatever the test did.
    private struct Setup {
        let laptop: NamespaceLab
        let router: NamespaceLab
        let socket: NetlinkSocket
        let eth0: Int32
    }

    private let routerAddress = HardwareAddress("02:00:5e:10:00:01")!

    private func setUp() throws -> Setup {
        let laptop = try NamespaceLab()
        let router = try NamespaceLab()
        try laptop.attach(to: router, device: "eth0", peer: "eth-r", address: "10.20.0.57", gateway: "10.20.0.1",
                          defaultRoute: false)
        try router.ip("link set eth-r address \(routerAddress)")
        if hasIPv6 {
            // The kernel solicits from a link-local address that passed duplicate address
            // detection, and sends nothing until one has (ndisc_send_ns): give eth0 one now.
            try laptop.ip("address add fe80::57/64 dev eth0 nodad")
            try laptop.ip("address add fd00:20::57/64 dev eth0 nodad")
            try router.ip("address add fd00:20::1/64 dev eth-r nodad")
        }
        let socket = try laptop.namespace.run { () throws(NetlinkError) in try NetlinkSocket() }
        let eth0 = try #require(try socket.link(named: "eth0")).index
        return Setup(laptop: laptop, router: router, socket: socket, eth0: eth0)
    }

    /// `resolve`, then the kernel's entry once it holds an address to use: 50 looks, 20 ms apart.
    private func resolved(_ address: IPAddress, in setup: Setup) throws -> Neighbour? {
        #expect(try setup.socket.neighbour(of: address, linkIndex: setup.eth0) == nil, "contacted before the test")
        try setup.socket.resolve(address, linkIndex: setup.eth0)
        var entry: Neighbour?
        for _ in 0..<50 {
            entry = try setup.socket.neighbour(of: address, linkIndex: setup.eth0)
            if entry?.usableHardwareAddress != nil { break }
            usleep(20_000)
        }
        return entry
    }

    @Test func resolveLearnsTheGatewaysAddressOverARP() throws {
        let setup = try setUp()
        let entry = try resolved(IPAddress("10.20.0.1")!, in: setup)
        #expect(entry?.usableHardwareAddress == routerAddress)
        #expect(entry?.state == .reachable)
        #expect(try setup.socket.neighbours(family: .v4).contains { $0.address == IPAddress("10.20.0.1") })
    }

    @Test(.enabled(if: hasIPv6, "IPv6 is disabled on this kernel"))
    func resolveLearnsTheGatewaysAddressOverNeighbourDiscovery() throws {
        let setup = try setUp()
        let entry = try resolved(IPAddress("fd00:20::1")!, in: setup)
        #expect(entry?.usableHardwareAddress == routerAddress)
        #expect(entry?.state == .reachable)
    }

    @Test func aPermanentEntryIsLeftAsTheAdministratorMadeIt() throws {
        let setup = try setUp()
        try setup.laptop.ip("neigh add 10.20.0.9 lladdr 02:00:5e:10:00:09 dev eth0 nud permanent")
        try setup.socket.resolve(IPAddress("10.20.0.9")!, linkIndex: setup.eth0)
        let entry = try setup.socket.neighbour(of: IPAddress("10.20.0.9")!, linkIndex: setup.eth0)
        #expect(entry?.state == .permanent && entry?.hardwareAddress == HardwareAddress("02:00:5e:10:00:09"))
    }

    @Test func refusalsAreErrors() throws {
        let setup = try setUp()
        #expect(try setup.socket.neighbour(of: IPAddress("10.20.0.77")!, linkIndex: setup.eth0) == nil)
        let error = #expect(throws: NetlinkError.self) { try setup.socket.resolve(IPAddress("10.20.0.1")!, linkIndex: 9999) }
        #expect(error?.code == ENODEV)
    }

    /// The notices: an entry learned over ARP arrives as it becomes usable, a forgotten one is no
    /// notice, and a changed address arrives as the new one.
    @Test func theNeighbourTablesNoticesFollowTheGateway() throws {
        let setup = try setUp()
        let events = try setup.laptop.namespace.run { () throws(NetlinkError) in try NeighbourEvents() }
        let gateway = IPAddress("10.20.0.1")!
        func notices(until done: ([NeighbourEvents.Notice]) -> Bool) -> [NeighbourEvents.Notice] {
            var all: [NeighbourEvents.Notice] = []
            for _ in 0..<50 where !done(all) {
                all += events.take()
                if !done(all) { usleep(20_000) }
            }
            return all
        }
        func learned(_ address: HardwareAddress) -> ([NeighbourEvents.Notice]) -> Bool {
            { $0.contains { if case .entry(let e) = $0 { e.address == gateway && e.usableHardwareAddress == address } else { false } } }
        }

        try setup.socket.resolve(gateway, linkIndex: setup.eth0)
        #expect(learned(routerAddress)(notices(until: learned(routerAddress))))

        try setup.laptop.ip("neigh flush dev eth0")
        usleep(100_000)
        #expect(!events.take().contains { if case .entry(let e) = $0 { e.usableHardwareAddress != nil } else { false } },
                "a flush is no notice of an address")

        let other = HardwareAddress("02:00:5e:10:00:02")!
        try setup.router.ip("link set eth-r address \(other)")
        try setup.socket.resolve(gateway, linkIndex: setup.eth0)
        #expect(learned(other)(notices(until: learned(other))), "the router's new address")
    }
}
