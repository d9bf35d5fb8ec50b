public import Topology
import Basics
/// Decodes rtnetlink messages (links, addresses, routes) into model changes.
///
/// Pure: bytes in, changes out, so recorded kernel messages replay through exactly the code
/// the live monitor runs. Nothing here trusts a length field: a truncated or malformed
/// message is counted and skipped, never fatal.
public struct NetlinkDecoder: Sendable {
    /// Messages of types the model does not use (neighbours, rules, ...), skipped.
    public private(set) var skipped = 0
    /// Messages that were truncated or inconsistent, skipped.
    public private(set) var malformed = 0
    /// Route lookups answer with clones; change notifications' clones are cache noise.
    public var acceptsClonedRoutes = false

    public init() {}

    /// What one buffer of netlink messages held.
    public struct Batch: Equatable, Sendable {
        public var changes: [NetworkChange] = []
        /// Policy rules added or removed, and routes removed, with who asked (see `RoutingNotice`).
        public var notices: [RoutingNotice] = []
        /// `NLMSG_DONE` ended a dump.
        public var done = false
        /// A negative errno from `NLMSG_ERROR` (0 is an acknowledgement), with the request's
        /// sequence and the kernel's own words for it (extended ack, `NLMSGERR_ATTR_MSG`).
        public var error: (code: Int32, sequence: UInt32, message: String?)?

        public static func == (a: Batch, b: Batch) -> Bool {
            a.changes == b.changes && a.notices == b.notices && a.done == b.done && a.error?.code == b.error?.code
                && a.error?.sequence == b.error?.sequence && a.error?.message == b.error?.message
        }
    }

    /// Decodes every message in `bytes` (one `recv` worth).
    public mutating func decode(_ bytes: some Collection<UInt8>) -> Batch {
        let buffer = Array(bytes)
        var batch = Batch()
        let (messages, complete) = Self.messages(buffer)
        if !complete { malformed += 1 }
        for message in messages {
            let body = message.body
            switch message.type {
            case NL.done:
                batch.done = true
            case NL.error:
                if let answer = Self.acknowledgement(buffer, message) { batch.error = answer } else { malformed += 1 }
            case NL.noop, NL.overrun:
                break
            case RTM.newLink, RTM.delLink:
                if let change = link(buffer, body, removed: message.type == RTM.delLink) { batch.changes.append(change) }
            case RTM.newAddr, RTM.delAddr:
                if let change = address(buffer, body, removed: message.type == RTM.delAddr) { batch.changes.append(change) }
            case RTM.newRoute, RTM.delRoute:
                if let change = route(buffer, body, removed: message.type == RTM.delRoute) {
                    batch.changes.append(change)
                    if case .routeRemoved(let key) = change {
                        batch.notices.append(RoutingNotice(subject: .route(key), removed: true, sender: message.port))
                    }
                }
            case RTM.newRule, RTM.delRule:
                if let rule = Self.rule(buffer, body) {
                    batch.notices.append(RoutingNotice(subject: .rule(rule), removed: message.type == RTM.delRule, sender: message.port))
                } else {
                    malformed += 1
                }
            default:
                skipped += 1
            }
        }
        return batch
    }

    /// A policy rule (`struct fib_rule_hdr` and its attributes) as `RoutingRule` says it; nil
    /// when malformed or of another family. Rules that match on more than a mark (a source, an
    /// interface) read as their mark-only part: they are never Roam's.
    static func rule(_ b: [UInt8], _ body: Range<Int>) -> RoutingRule? {
        guard body.count >= 12 else { return nil }
        let s = body.lowerBound
        let family: IPAddress.Family
        switch b[s] {
        case AF.inet: family = .v4
        case AF.inet6: family = .v6
        default: return nil
        }
        var rule = RoutingRule(family: family, priority: 0, table: UInt32(b[s + 4]), inverted: b.u32(s + 8) & 0x2 != 0)
        // src_len, tos, and an action other than FR_ACT_TO_TBL (dst_len goes with FRA_DST).
        if b[s + 2] != 0 || b[s + 3] != 0 || b[s + 7] != 1 { rule.matchesMore = true }
        let destinationLength = Int(b[s + 1])
        var mask: UInt32?
        let complete = attributes(b, s + 12..<body.upperBound) { type, value in
            switch type {
            case 1:  // FRA_DST
                if let address = IPAddress(bytes: b[value]), address.family == family, let prefix = Prefix(address, length: destinationLength) {
                    rule.destination = prefix.network
                } else {
                    rule.matchesMore = true
                }
            // What else a rule may select on: FRA_SRC, FRA_IIFNAME, FRA_GOTO, FRA_FLOW,
            // FRA_TUN_ID, FRA_SUPPRESS_IFGROUP, FRA_OIFNAME, FRA_L3MDEV, FRA_UID_RANGE, FRA_IP_PROTO,
            // FRA_SPORT_RANGE, FRA_DPORT_RANGE (the kernel sends each only when set).
            case 2, 3, 4, 11, 12, 13, 17, 19, 20, 22, 23, 24: rule.matchesMore = true
            default: break
            }
            guard value.count >= 4 else { return }
            switch type {
            case 6: rule.priority = b.u32(value.lowerBound)  // FRA_PRIORITY
            case 16: mask = b.u32(value.lowerBound)  // FRA_FWMASK
            case 10: rule.mark = b.u32(value.lowerBound)  // FRA_FWMARK
            case 14:  // FRA_SUPPRESS_PREFIXLEN
                let length = Int32(bitPattern: b.u32(value.lowerBound))
                rule.suppressPrefixLength = length >= 0 ? Int(length) : nil
            case 15: rule.table = b.u32(value.lowerBound)  // FRA_TABLE
            default: break
            }
        }
        if let mask, mask != .max, rule.mark != nil { rule.matchesMore = true }
        if destinationLength != 0, rule.destination == nil { rule.matchesMore = true }
        if rule.mark == 0 && mask == nil { rule.mark = nil }
        return complete ? rule : nil
    }

    // MARK: Messages

    /// One netlink message in a buffer: its header's fields and where it lies.
    package struct Message {
        package var type: UInt16
        package var flags: UInt16
        package var sequence: UInt32
        /// The netlink port of the socket the message is from or, in a notice, of the socket whose
        /// request caused it (0: the kernel's own doing).
        package var port: UInt32
        /// The whole message, header included.
        package var bytes: Range<Int>
        /// What follows the 16-byte header.
        package var body: Range<Int> { bytes.lowerBound + 16..<bytes.upperBound }
    }

    /// Splits one `recv` worth of bytes into its messages, for any netlink protocol.
    /// `complete` is false when the buffer ends in a message that is truncated or
    /// inconsistent: that message and anything after it are dropped.
    package static func messages(_ b: [UInt8]) -> (messages: [Message], complete: Bool) {
        var messages: [Message] = []
        var offset = 0
        while offset + 16 <= b.count {
            let length = Int(b.u32(offset))
            guard length >= 16, offset + length <= b.count else { return (messages, false) }
            messages.append(Message(type: b.u16(offset + 4), flags: b.u16(offset + 6), sequence: b.u32(offset + 8),
                                    port: b.u32(offset + 12), bytes: offset..<offset + length))
            offset += NL.align(length)
        }
        // Fewer than 4 bytes left is padding; more is the start of a message cut short.
        return (messages, b.count - offset < 4)
    }

    /// The kernel's answer in an `NLMSG_ERROR` message: 0 acknowledges request `sequence`, a
    /// negative errno refuses it; nil when the message is too short to say.
    static func acknowledgement(_ b: [UInt8], _ message: Message) -> (code: Int32, sequence: UInt32, message: String?)? {
        let body = message.body
        guard message.type == NL.error, body.count >= 4 else { return nil }
        return (Int32(bitPattern: b.u32(body.lowerBound)), message.sequence,
                extendedAckMessage(b, body, flags: message.flags))
    }

    /// The kernel's message in an extended acknowledgement: after the error code comes the
    /// request's header (and, unless `NLM_F_CAPPED`, its payload), then attributes.
    static func extendedAckMessage(_ b: [UInt8], _ body: Range<Int>, flags: UInt16) -> String? {
        let ackTLVs: UInt16 = 0x200, capped: UInt16 = 0x100
        guard flags & ackTLVs != 0, body.count >= 20 else { return nil }
        let request = Int(b.u32(body.lowerBound + 4))
        let start = body.lowerBound + 4 + (flags & capped != 0 ? 16 : NL.align(request))
        guard start <= body.upperBound else { return nil }
        var message: String?
        _ = attributes(b, start..<body.upperBound) { type, value in
            if type == 1 /* NLMSGERR_ATTR_MSG */ { message = b.cString(value) }
        }
        return message.flatMap { $0.isEmpty ? nil : $0 }
    }

    private mutating func link(_ b: [UInt8], _ body: Range<Int>, removed: Bool) -> NetworkChange? {
        guard body.count >= 16 else { malformed += 1; return nil }
        let arphrd = b.u16(body.lowerBound + 2)
        let index = Int32(bitPattern: b.u32(body.lowerBound + 4))
        let flags = b.u32(body.lowerBound + 8)
        guard index > 0 else { malformed += 1; return nil }
        // A bridge's notice about one of its ports (AF_BRIDGE) says nothing of the link's own
        // kind: read as a link, a container's veth would turn into an Ethernet card for a moment.
        if b[body.lowerBound] == 7 /* AF_BRIDGE */ { skipped += 1; return nil }
        if removed { return .linkRemoved(index: index) }
        var name: String?
        var mtu = 1500
        var infoKind: String?
        var master: Int32?
        // A TUN/TAP device's own attributes (IFLA_INFO_DATA of kind "tun").
        var tunType: UInt8?
        var tunVirtioHeader = false
        guard attributes(b, body.lowerBound + 16..<body.upperBound, { type, value in
            switch type {
            case IFLA.ifname: name = b.cString(value)
            case IFLA.master: if value.count >= 4 { master = Int32(bitPattern: b.u32(value.lowerBound)) }
            case IFLA.mtu: if value.count >= 4 { mtu = Int(b.u32(value.lowerBound)) }
            case IFLA.linkinfo:
                _ = attributes(b, value) { inner, v in
                    if inner == IFLA.infoKind { infoKind = b.cString(v) }
                    if inner == IFLA.infoData {
                        _ = attributes(b, v) { tun, w in
                            guard w.count >= 1 else { return }
                            if tun == IFLA.tunType { tunType = b[w.lowerBound] }
                            if tun == IFLA.tunVirtioHeader { tunVirtioHeader = b[w.lowerBound] != 0 }
                        }
                    }
                }
            default: break
            }
        }) else { malformed += 1; return nil }
        guard let name, !name.isEmpty else { malformed += 1; return nil }
        return .linkChanged(Link(index: index, name: name, kind: Self.kind(arphrd: arphrd, infoKind: infoKind),
                                 isUp: flags & IFF.up != 0, hasCarrier: flags & IFF.lowerUp != 0, mtu: mtu,
                                 isBridge: infoKind == "bridge", master: master.flatMap { $0 > 0 ? $0 : nil }, infoKind: infoKind,
                                 isVirtualMachinesTap: infoKind == "tun" && tunType == IFLA.tunTypeTap && tunVirtioHeader))
    }

    /// The kind netlink alone can tell; the live monitor refines ethernet into wifi or wwan from sysfs.
    static func kind(arphrd: UInt16, infoKind: String?) -> LinkKind {
        switch infoKind {
        case "tun", "wireguard", "ipip", "gre", "sit", "vti", "ip6tnl": return .tunnel
        case "veth", "bridge", "dummy", "macvlan", "ipvlan", "vxlan", "vrf", "ifb", "netkit": return .virtual
        default: break
        }
        switch arphrd {
        case ARPHRD.loopback: return .loopback
        case ARPHRD.ether: return .ethernet
        case ARPHRD.none, ARPHRD.ppp, ARPHRD.tunnel, ARPHRD.tunnel6, ARPHRD.sit, ARPHRD.ipgre: return .tunnel
        default: return .other
        }
    }

    private mutating func address(_ b: [UInt8], _ body: Range<Int>, removed: Bool) -> NetworkChange? {
        guard body.count >= 8 else { malformed += 1; return nil }
        let family = b[body.lowerBound]
        let prefixLength = Int(b[body.lowerBound + 1])
        var flags = UInt32(b[body.lowerBound + 2])
        let index = Int32(bitPattern: b.u32(body.lowerBound + 4))
        guard family == AF.inet || family == AF.inet6 else { skipped += 1; return nil }
        var local: IPAddress?
        var address: IPAddress?
        guard attributes(b, body.lowerBound + 8..<body.upperBound, { type, value in
            switch type {
            case IFA.address: address = IPAddress(bytes: b[value])
            case IFA.local: local = IPAddress(bytes: b[value])
            case IFA.flags: if value.count >= 4 { flags = b.u32(value.lowerBound) }
            default: break
            }
        }) else { malformed += 1; return nil }
        // IPv4 puts the interface's own address in IFA_LOCAL (IFA_ADDRESS is the peer on
        // point-to-point links); IPv6 has only IFA_ADDRESS.
        guard let ip = local ?? address, index > 0,
              ip.family == (family == AF.inet ? .v4 : .v6),
              let prefix = Prefix(ip, length: prefixLength)
        else { malformed += 1; return nil }
        let key = Address.Key(linkIndex: index, prefix: prefix)
        return removed ? .addressRemoved(key)
            : .addressAdded(Address(linkIndex: index, prefix: prefix, flags: AddressFlags(rawValue: flags)))
    }

    private mutating func route(_ b: [UInt8], _ body: Range<Int>, removed: Bool) -> NetworkChange? {
        guard body.count >= 12 else { malformed += 1; return nil }
        let s = body.lowerBound
        let family = b[s]
        let dstLength = Int(b[s + 1])
        var table = UInt32(b[s + 4])
        let rtnType = b[s + 7]
        let rtmFlags = b.u32(s + 8)
        guard family == AF.inet || family == AF.inet6 else { skipped += 1; return nil }
        // IPv6 route-cache clones are per-destination copies, not routes anyone configured.
        if rtmFlags & RTM.clonedFlag != 0 && !acceptsClonedRoutes { skipped += 1; return nil }
        let v6 = family == AF.inet6
        var destination: IPAddress?
        var gateway: IPAddress?
        var oif: Int32?
        var metric: UInt32 = 0
        var source: IPAddress?
        var hops: [NextHop] = []
        var ok = true
        guard attributes(b, s + 12..<body.upperBound, { type, value in
            switch type {
            case RTA.dst: destination = IPAddress(bytes: b[value])
            case RTA.gateway: gateway = IPAddress(bytes: b[value])
            case RTA.oif: if value.count >= 4 { oif = Int32(bitPattern: b.u32(value.lowerBound)) }
            case RTA.priority: if value.count >= 4 { metric = b.u32(value.lowerBound) }
            case RTA.prefsrc: source = IPAddress(bytes: b[value])
            case RTA.table: if value.count >= 4 { table = b.u32(value.lowerBound) }
            case RTA.multipath:
                guard let decoded = Self.nextHops(b, value) else { ok = false; return }
                hops = decoded
            default: break
            }
        }), ok else { malformed += 1; return nil }
        let zero: IPAddress = v6 ? .v6(0, 0) : .v4(0)
        guard let dst = Prefix(destination ?? zero, length: dstLength), dst.address.family == zero.family else {
            malformed += 1
            return nil
        }
        if hops.isEmpty, let oif { hops = [NextHop(gateway: gateway, linkIndex: oif)] }
        let type: RouteType = switch rtnType {
        case RTN.unicast: .unicast
        case RTN.blackhole, RTN.unreachable, RTN.prohibit, RTN.throwRoute: .reject
        default: .local
        }
        let route = Route(table: table, destination: dst, type: type, nextHops: hops, metric: metric,
                          preferredSource: source)
        return removed ? .routeRemoved(route.key) : .routeAdded(route)
    }

    /// `RTA_MULTIPATH`: a list of `rtnexthop` headers, each followed by its own attributes.
    private static func nextHops(_ b: [UInt8], _ range: Range<Int>) -> [NextHop]? {
        var hops: [NextHop] = []
        var offset = range.lowerBound
        while offset + 8 <= range.upperBound {
            let length = Int(b.u16(offset))
            guard length >= 8, offset + length <= range.upperBound else { return nil }
            let index = Int32(bitPattern: b.u32(offset + 4))
            var gateway: IPAddress?
            guard attributes(b, offset + 8..<offset + length, { type, value in
                if type == RTA.gateway { gateway = IPAddress(bytes: b[value]) }
            }) else { return nil }
            hops.append(NextHop(gateway: gateway, linkIndex: index))
            offset += NL.align(length)
        }
        return hops
    }

    /// Walks `rtattr`s in `range`; false when one overruns it.
    package static func attributes(_ b: [UInt8], _ range: Range<Int>, _ visit: (UInt16, Range<Int>) -> Void) -> Bool {
        var offset = range.lowerBound
        while offset + 4 <= range.upperBound {
            let length = Int(b.u16(offset))
            guard length >= 4, offset + length <= range.upperBound else { return false }
            visit(b.u16(offset + 2) & 0x3FFF, offset + 4..<offset + length)  // strip NLA_F_NESTED/BYTEORDER
            offset += NL.align(length)
        }
        return true
    }

    private func attributes(_ b: [UInt8], _ range: Range<Int>, _ visit: (UInt16, Range<Int>) -> Void) -> Bool {
        Self.attributes(b, range, visit)
    }
}

// Kernel ABI constants (linux/netlink.h, linux/rtnetlink.h, linux/if_link.h, linux/if_addr.h,
// linux/if_arp.h). They never change, and spelling them here keeps the decoder free of C.
package enum NL {
    package static let noop: UInt16 = 1, error: UInt16 = 2, done: UInt16 = 3, overrun: UInt16 = 4
    static func align(_ n: Int) -> Int { (n + 3) & ~3 }
}
package enum RTM {
    package static let newLink: UInt16 = 16, delLink: UInt16 = 17, getLink: UInt16 = 18
    package static let newAddr: UInt16 = 20, delAddr: UInt16 = 21, getAddr: UInt16 = 22
    package static let newRoute: UInt16 = 24, delRoute: UInt16 = 25, getRoute: UInt16 = 26
    package static let newNeighbour: UInt16 = 28, getNeighbour: UInt16 = 30
    package static let clonedFlag: UInt32 = 0x200
    package static let newRule: UInt16 = 32, delRule: UInt16 = 33, getRule: UInt16 = 34
}
package enum IFLA {
    package static let ifname: UInt16 = 3, mtu: UInt16 = 4, master: UInt16 = 10, linkinfo: UInt16 = 18, infoKind: UInt16 = 1, afSpec: UInt16 = 26
    /// IFLA_INFO_DATA, inside IFLA_LINKINFO; for a "tun" device IFLA_TUN_TYPE (1 TUN, 2 TAP) and
    /// IFLA_TUN_VNET_HDR inside that.
    package static let infoData: UInt16 = 2, tunType: UInt16 = 3, tunVirtioHeader: UInt16 = 5, tunTypeTap: UInt8 = 2
    /// IFLA_INET6_ADDR_GEN_MODE, inside IFLA_AF_SPEC / AF_INET6.
    package static let inet6AddressGenerationMode: UInt16 = 8
}
package enum IFA { package static let address: UInt16 = 1, local: UInt16 = 2, flags: UInt16 = 8 }
package enum RTA {
    package static let dst: UInt16 = 1, oif: UInt16 = 4, gateway: UInt16 = 5, priority: UInt16 = 6, prefsrc: UInt16 = 7
    package static let multipath: UInt16 = 9, table: UInt16 = 15
}
package enum RTN {
    package static let unicast: UInt8 = 1, blackhole: UInt8 = 6, unreachable: UInt8 = 7, prohibit: UInt8 = 8
    package static let throwRoute: UInt8 = 9
}
package enum IFF { package static let up: UInt32 = 0x1, lowerUp: UInt32 = 0x10000 }
package enum AF { package static let inet: UInt8 = 2, inet6: UInt8 = 10 }
package enum ARPHRD {
    package static let ether: UInt16 = 1, ppp: UInt16 = 512, tunnel: UInt16 = 768, tunnel6: UInt16 = 769
    package static let loopback: UInt16 = 772, sit: UInt16 = 776, ipgre: UInt16 = 778, none: UInt16 = 0xFFFE
}

extension [UInt8] {
    /// Host-order (little-endian on every Linux target Roam runs on) integers, as netlink sends them.
    package func u16(_ at: Int) -> UInt16 { UInt16(self[at]) | UInt16(self[at + 1]) << 8 }
    package func u32(_ at: Int) -> UInt32 {
        UInt32(self[at]) | UInt32(self[at + 1]) << 8 | UInt32(self[at + 2]) << 16 | UInt32(self[at + 3]) << 24
    }
    package func cString(_ range: Range<Int>) -> String {
        String(decoding: self[range].prefix { $0 != 0 }, as: UTF8.self)
    }
}
