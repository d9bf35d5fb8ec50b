public import Topology
public import Basics
package import CMnl
import Glibc

/// A failed kernel call, with the operation and errno, readable by an operator.
public struct NetlinkError: Error, CustomStringConvertible, Equatable, Sendable {
    public var operation: String
    public var code: Int32
    /// The kernel's own reason, when it gave one (extended ack): errnos are shared by many
    /// causes, e.g. EACCES both for "not root" and "IPv6 is disabled on nexthop device".
    public var message: String?
    public init(_ operation: String, _ code: Int32, message: String? = nil) {
        self.operation = operation
        self.code = code
        self.message = message
    }
    /// The kernel dropped messages because the receive buffer was full: the model must resync.
    public var isOverrun: Bool { code == ENOBUFS }
    public var description: String {
        "\(operation): " + (message.map { "\($0) (\(String(cString: strerror(code))), errno \(code))" }
            ?? "\(String(cString: strerror(code))) (errno \(code))")
    }
}

/// The change groups a monitor subscribes to.
public struct NetlinkGroups: OptionSet, Sendable {
    public let rawValue: UInt32
    public init(rawValue: UInt32) { self.rawValue = rawValue }
    public static let link = NetlinkGroups(rawValue: 0x1)  // RTMGRP_LINK
    public static let ipv4Address = NetlinkGroups(rawValue: 0x10)  // RTMGRP_IPV4_IFADDR
    public static let ipv4Route = NetlinkGroups(rawValue: 0x40)  // RTMGRP_IPV4_ROUTE
    public static let ipv6Address = NetlinkGroups(rawValue: 0x100)  // RTMGRP_IPV6_IFADDR
    public static let ipv6Route = NetlinkGroups(rawValue: 0x400)  // RTMGRP_IPV6_ROUTE
    public static let neighbour = NetlinkGroups(rawValue: 0x4)  // RTMGRP_NEIGH
    public static let ipv4Rule = NetlinkGroups(rawValue: 0x80)  // RTMGRP_IPV4_RULE
    public static let ipv6Rule = NetlinkGroups(rawValue: 0x40000)  // 1 << (RTNLGRP_IPV6_RULE - 1)
    /// Everything the path model needs.
    public static let paths: NetlinkGroups = [.link, .ipv4Address, .ipv4Route, .ipv6Address, .ipv6Route]
    /// Policy rules added and removed, both families.
    public static let rules: NetlinkGroups = [.ipv4Rule, .ipv6Rule]
}

/// A netlink socket through libmnl (`NETLINK_ROUTE`, or `NETLINK_GENERIC` for Wi-Fi); the one
/// owner of the C socket, closed in deinit.
public final class NetlinkSocket {
    private let socket: OpaquePointer
    private var sequence: UInt32
    /// Receive buffer: big enough for any single message the kernel sends in a dump.
    private var buffer = [UInt8](repeating: 0, count: 64 * 1024)

    /// Opens a `NETLINK_ROUTE` socket subscribed to `groups` (none for a request-only socket). A
    /// non-zero `receiveBuffer` sets SO_RCVBUF(FORCE): the headroom before a burst overruns it.
    public convenience init(groups: NetlinkGroups = [], receiveBuffer: Int = 0) throws(NetlinkError) {
        try self.init(protocol: NETLINK_ROUTE, groups: groups, receiveBuffer: receiveBuffer)
    }

    /// Opens a request-only socket, or one subscribed to `groups`, of netlink `protocol`.
    package init(protocol: Int32, groups: NetlinkGroups = [], receiveBuffer: Int = 0) throws(NetlinkError) {
        guard let socket = mnl_socket_open(`protocol`) else { throw NetlinkError("open netlink socket", errno) }
        self.socket = socket
        sequence = UInt32(truncatingIfNeeded: time(nil))
        guard mnl_socket_bind(socket, groups.rawValue, pid_t(MNL_SOCKET_AUTOPID)) >= 0 else {
            let code = errno
            mnl_socket_close(socket)
            throw NetlinkError("bind netlink socket", code)
        }
        if receiveBuffer > 0 { try setReceiveBuffer(receiveBuffer) }
        // Ask for the kernel's reason with every refusal, without the echoed request.
        var on: Int32 = 1
        _ = setsockopt(mnl_socket_get_fd(socket), 270 /* SOL_NETLINK */, 11 /* NETLINK_EXT_ACK */, &on, 4)
        _ = setsockopt(mnl_socket_get_fd(socket), 270 /* SOL_NETLINK */, 10 /* NETLINK_CAP_ACK */, &on, 4)
    }

    deinit { mnl_socket_close(socket) }

    /// The file descriptor, for poll.
    public var fileDescriptor: Int32 { mnl_socket_get_fd(socket) }

    /// Sets the receive buffer; root may exceed net.core.rmem_max (SO_RCVBUFFORCE).
    public func setReceiveBuffer(_ bytes: Int) throws(NetlinkError) {
        var size = Int32(clamping: bytes)
        let fd = fileDescriptor
        if setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &size, socklen_t(MemoryLayout<Int32>.size)) < 0,
           setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, socklen_t(MemoryLayout<Int32>.size)) < 0
        {
            throw NetlinkError("set netlink receive buffer", errno)
        }
    }

    /// Waits for the next buffer of messages; `timeout` nil waits forever. An expired timeout,
    /// or a wait a signal handler interrupted (so a command can see a stop request), returns an
    /// empty array. A full receive queue throws an overrun error.
    public func receive(timeout: Duration? = nil) throws(NetlinkError) -> ArraySlice<UInt8> {
        if let timeout {
            var fds = pollfd(fd: fileDescriptor, events: Int16(POLLIN), revents: 0)
            let ms = Int32(clamping: timeout.components.seconds * 1000 + timeout.components.attoseconds / 1_000_000_000_000_000)
            let ready = poll(&fds, 1, ms)
            if ready == 0 || (ready < 0 && errno == EINTR) { return [] }
            if ready < 0 { throw NetlinkError("poll netlink socket", errno) }
        }
        while true {
            let n = buffer.withUnsafeMutableBytes { mnl_socket_recvfrom(socket, $0.baseAddress, $0.count) }
            if n >= 0 { return buffer[0..<n] }
            if errno != EINTR { throw NetlinkError("receive from netlink", errno) }
        }
    }

    /// Hands each message queued now to `visit` (whole, header included), without waiting and
    /// reading at most `limit` buffers; returns whether the queue overran since the last read
    /// (notices were lost).
    package func takeQueued(limit: Int = 64, _ visit: (ArraySlice<UInt8>) -> Void) -> Bool {
        for _ in 0..<limit {
            let buffer: [UInt8]
            do {
                let bytes = try receive(timeout: .zero)
                if bytes.isEmpty { break }
                buffer = Array(bytes)
            } catch {
                return error.isOverrun
            }
            for message in NetlinkDecoder.messages(buffer).messages { visit(buffer[message.bytes]) }
        }
        return false
    }

    /// Sends one request built by `build` and returns its sequence number.
    @discardableResult
    package func request(type: UInt16, flags: UInt16, header: [UInt8], build: (UnsafeMutablePointer<nlmsghdr>) -> Void = { _ in })
        throws(NetlinkError) -> UInt32
    {
        sequence &+= 1
        var message = [UInt8](repeating: 0, count: 512)
        let length = message.withUnsafeMutableBytes { raw -> Int in
            let nlh = mnl_nlmsg_put_header(raw.baseAddress)!
            nlh.pointee.nlmsg_type = type
            nlh.pointee.nlmsg_flags = UInt16(NLM_F_REQUEST) | flags
            nlh.pointee.nlmsg_seq = sequence
            let extra = mnl_nlmsg_put_extra_header(nlh, header.count)!
            header.withUnsafeBytes { extra.copyMemory(from: $0.baseAddress!, byteCount: header.count) }
            build(nlh)
            return Int(nlh.pointee.nlmsg_len)
        }
        while true {
            let sent = message.withUnsafeBytes { mnl_socket_sendto(socket, $0.baseAddress, length) }
            if sent >= 0 { return sequence }
            if errno != EINTR { throw NetlinkError("send netlink request", errno) }
        }
    }

    /// Dumps links, then addresses, then routes (IPv4 and IPv6): the kernel's whole state,
    /// as changes that build a model from nothing. `raw` sees every buffer, for a recording.
    public func dump(decoder: inout NetlinkDecoder, raw: (ArraySlice<UInt8>) -> Void = { _ in })
        throws(NetlinkError) -> [NetworkChange]
    {
        var changes: [NetworkChange] = []
        let requests: [(UInt16, [UInt8], String)] = [
            (RTM.getLink, [UInt8](repeating: 0, count: 16), "dump links"),
            (RTM.getAddr, [UInt8](repeating: 0, count: 8), "dump addresses"),
            (RTM.getRoute, [UInt8](repeating: 0, count: 12), "dump routes"),
        ]
        for (type, header, what) in requests {
            let seq = try request(type: type, flags: UInt16(NLM_F_DUMP), header: header)
            // Bounded: a dump ends with NLMSG_DONE; a socket that never says so is an error.
            var done = false
            // Bounded in count, and in time by the receive timeout.
            for _ in 0..<1_000_000 where !done {
                let bytes = try receive(timeout: .seconds(5))
                if bytes.isEmpty { throw NetlinkError(what, ETIMEDOUT) }
                raw(bytes)
                let batch = decoder.decode(bytes)
                if let error = batch.error, error.sequence == seq, error.code != 0 {
                    throw NetlinkError(what, -error.code, message: error.message)
                }
                changes += batch.changes
                done = batch.done
            }
        }
        return changes
    }

    /// Every policy rule of both families, as `RoutingRule`s.
    public func rules() throws(NetlinkError) -> [RoutingRule] {
        let what = "dump rules"
        let seq = try request(type: RTM.getRule, flags: UInt16(NLM_F_DUMP), header: [UInt8](repeating: 0, count: 12))
        var rules: [RoutingRule] = []
        // Bounded in count, and in time by the receive timeout.
        for _ in 0..<100_000 {
            let bytes = try receive(timeout: .seconds(5))
            if bytes.isEmpty { throw NetlinkError(what, ETIMEDOUT) }
            let buffer = Array(bytes)
            for message in NetlinkDecoder.messages(buffer).messages where message.sequence == seq {
                switch message.type {
                case NL.done: return rules
                case NL.error:
                    if let answer = NetlinkDecoder.acknowledgement(buffer, message), answer.code != 0 {
                        throw NetlinkError(what, -answer.code, message: answer.message)
                    }
                case RTM.newRule: if let rule = NetlinkDecoder.rule(buffer, message.body) { rules.append(rule) }
                default: break
                }
            }
        }
        throw NetlinkError(what, ETIMEDOUT)
    }

    /// Adds (or replaces) `route` in the kernel, or deletes it, and waits for the kernel's answer.
    /// Multipath routes are not written this way; the agent only installs single-hop routes
    /// and, as `.reject`, unreachable routes (no next hop).
    public func write(_ route: Route, delete: Bool = false) throws(NetlinkError) {
        let hop = route.nextHops.first
        guard hop != nil || route.type == .reject else { throw NetlinkError("write route \(route.destination)", EINVAL) }
        let family = route.destination.address.family
        var header = [UInt8](repeating: 0, count: 12)
        header[0] = family == .v4 ? AF.inet : AF.inet6
        header[1] = UInt8(route.destination.length)
        header[4] = route.table < 256 ? UInt8(route.table) : 252  // RT_TABLE_COMPAT; RTA_TABLE has the rest
        header[5] = 4  // RTPROT_STATIC
        let linkScope = hop.map { $0.gateway == nil } ?? false
        header[6] = delete ? 255 /* RT_SCOPE_NOWHERE: any */ : (linkScope ? 253 /* LINK */ : 0 /* UNIVERSE */)
        header[7] = route.type == .reject ? RTN.unreachable : RTN.unicast
        let destination = route.destination.address.bytes
        let gateway = hop?.gateway?.bytes
        let what = "\(delete ? "delete" : "add") \(route.type == .reject ? "unreachable " : "")route \(route.destination)"
        let flags = delete ? 0 : UInt16(NLM_F_CREATE | NLM_F_REPLACE)
        let seq = try request(type: delete ? RTM.delRoute : RTM.newRoute, flags: flags | UInt16(NLM_F_ACK), header: header) { nlh in
            if route.destination.length > 0 {
                destination.withUnsafeBytes { mnl_attr_put(nlh, RTA.dst, destination.count, $0.baseAddress) }
            }
            if let gateway { gateway.withUnsafeBytes { mnl_attr_put(nlh, RTA.gateway, gateway.count, $0.baseAddress) } }
            if let hop { mnl_attr_put_u32(nlh, RTA.oif, UInt32(bitPattern: hop.linkIndex)) }
            mnl_attr_put_u32(nlh, RTA.priority, route.metric)
            mnl_attr_put_u32(nlh, RTA.table, route.table)
        }
        try awaitAcknowledgement(seq, what)
    }

    /// Reads until the kernel acknowledges request `seq`; throws its error if it refused.
    private func awaitAcknowledgement(_ seq: UInt32, _ what: String) throws(NetlinkError) {
        try answers(to: seq, what)
    }

    /// Reads the kernel's answers to request `seq`, in any netlink protocol, handing each
    /// message to `visit`, until a dump's `NLMSG_DONE` or the acknowledgement (a request that is
    /// not a dump must ask for one, `NLM_F_ACK`). Throws the kernel's refusal as `what`'s error.
    package func answers(to seq: UInt32, _ what: String,
                 visit: (_ buffer: [UInt8], _ message: NetlinkDecoder.Message) -> Void = { _, _ in })
        throws(NetlinkError)
    {
        // Bounded in count, and in time by the receive timeout.
        for _ in 0..<1_000_000 {
            let bytes = try receive(timeout: .seconds(2))
            if bytes.isEmpty { throw NetlinkError(what, ETIMEDOUT) }
            let buffer = Array(bytes)
            for message in NetlinkDecoder.messages(buffer).messages where message.sequence == seq {
                switch message.type {
                case NL.done:
                    return
                case NL.error:
                    guard let answer = NetlinkDecoder.acknowledgement(buffer, message) else {
                        throw NetlinkError(what, EPROTO)
                    }
                    if answer.code != 0 { throw NetlinkError(what, -answer.code, message: answer.message) }
                    return
                default:
                    visit(buffer, message)
                }
            }
        }
        throw NetlinkError(what, ETIMEDOUT)
    }

    /// Asks the kernel which route it would use to reach `destination` with socket mark
    /// `mark`, honouring policy rules: the answer to compare the model against.
    public func lookupRoute(to destination: IPAddress, mark: UInt32 = 0,
                            decoder: NetlinkDecoder = NetlinkDecoder()) throws(NetlinkError) -> Route? {
        var header = [UInt8](repeating: 0, count: 12)
        header[0] = destination.family == .v4 ? AF.inet : AF.inet6
        header[1] = UInt8(destination.family.bitWidth)
        let bytes = destination.bytes
        let seq = try request(type: RTM.getRoute, flags: 0, header: header) { nlh in
            bytes.withUnsafeBytes { mnl_attr_put(nlh, RTA.dst, bytes.count, $0.baseAddress) }
            if mark != 0 { mnl_attr_put_u32(nlh, 16 /* RTA_MARK */, mark) }
        }
        // The kernel marks a lookup's answer RTM_F_CLONED; a monitor's decoder skips those.
        var decoder = decoder
        decoder.acceptsClonedRoutes = true
        for _ in 0..<100 {
            let bytes = try receive(timeout: .seconds(2))
            if bytes.isEmpty { throw NetlinkError("look up route to \(destination)", ETIMEDOUT) }
            let batch = decoder.decode(bytes)
            if let error = batch.error, error.sequence == seq {
                if error.code == 0 { continue }
                if -error.code == ENETUNREACH || -error.code == EHOSTUNREACH { return nil }
                throw NetlinkError("look up route to \(destination)", -error.code, message: error.message)
            }
            for change in batch.changes { if case .routeAdded(let route) = change { return route } }
        }
        return nil
    }
}

// MARK: Configuring a link, its addresses and policy rules


extension NetlinkSocket {
    /// The link named `name`, or nil when the kernel has none by that name.
    public func link(named name: String) throws(NetlinkError) -> Link? {
        let what = "look up link '\(name)'"
        // IFNAMSIZ - 1; the kernel would refuse a longer name with a less helpful error.
        guard (1...15).contains(name.utf8.count) else { throw NetlinkError(what, EINVAL) }
        let seq = try request(type: RTM.getLink, flags: 0, header: [UInt8](repeating: 0, count: 16)) { nlh in
            mnl_attr_put_strz(nlh, IFLA.ifname, name)
        }
        var decoder = NetlinkDecoder()
        for _ in 0..<100 {
            let bytes = try receive(timeout: .seconds(2))
            if bytes.isEmpty { break }
            let batch = decoder.decode(bytes)
            if let error = batch.error, error.sequence == seq, error.code != 0 {
                if -error.code == ENODEV { return nil }
                throw NetlinkError(what, -error.code)
            }
            for change in batch.changes { if case .linkChanged(let link) = change, link.name == name { return link } }
        }
        throw NetlinkError(what, ETIMEDOUT)
    }

    /// Sets link `index` up or down and/or its MTU (`RTM_NEWLINK` with `ifi_change`), and waits
    /// for the kernel's answer.
    public func setLink(_ index: Int32, up: Bool? = nil, mtu: Int? = nil) throws(NetlinkError) {
        let what = "set link \(index)\(up.map { $0 ? " up" : " down" } ?? "")\(mtu.map { " mtu \($0)" } ?? "")"
        guard let mtuValue = UInt32(exactly: mtu ?? 0) else { throw NetlinkError(what, EINVAL) }
        var header = [UInt8](repeating: 0, count: 16)
        header.store(UInt32(bitPattern: index), at: 4)
        header.store(up == true ? IFF.up : 0, at: 8)  // ifi_flags
        header.store(up == nil ? 0 : IFF.up, at: 12)  // ifi_change: only the bits to change
        let seq = try request(type: RTM.newLink, flags: UInt16(NLM_F_ACK), header: header) { nlh in
            if mtu != nil { mnl_attr_put_u32(nlh, IFLA.mtu, mtuValue) }
        }
        try awaitAcknowledgement(seq, what)
    }

    /// Tells the kernel not to give link `index` an IPv6 link-local address of its own
    /// (`IFLA_INET6_ADDR_GEN_MODE` = `IN6_ADDR_GEN_MODE_NONE`). Set before the link comes up, it
    /// keeps a tunnel quiet: with no link-local address the kernel sends no router solicitations
    /// and no MLD reports into it, which would otherwise wake the tunnel and cross the network
    /// for nothing. Inner IPv6 addresses still work. A kernel without IPv6 refuses with
    /// `EAFNOSUPPORT`, which the caller may ignore.
    public func disableIPv6LinkLocal(_ index: Int32) throws(NetlinkError) {
        let what = "set link \(index) IPv6 address generation none"
        var header = [UInt8](repeating: 0, count: 16)
        header.store(UInt32(bitPattern: index), at: 4)
        let seq = try request(type: RTM.newLink, flags: UInt16(NLM_F_ACK), header: header) { nlh in
            let spec = mnl_attr_nest_start(nlh, IFLA.afSpec)
            let inet6 = mnl_attr_nest_start(nlh, UInt16(AF.inet6))
            mnl_attr_put_u8(nlh, IFLA.inet6AddressGenerationMode, 1)  // IN6_ADDR_GEN_MODE_NONE
            mnl_attr_nest_end(nlh, inet6)
            mnl_attr_nest_end(nlh, spec)
        }
        try awaitAcknowledgement(seq, what)
    }

    /// Adds (or replaces) `address` on its link, or deletes it, and waits for the kernel's
    /// answer. IPv6 addresses skip duplicate address detection (`IFA_F_NODAD`): a tunnel's
    /// inner address is assigned, not discovered, and must be usable at once.
    public func write(_ address: Address, delete: Bool = false) throws(NetlinkError) {
        let family = address.ip.family
        let noDAD: UInt8 = family == .v6 ? 0x02 : 0  // IFA_F_NODAD
        var header = [UInt8](repeating: 0, count: 8)
        header[0] = family == .v4 ? AF.inet : AF.inet6
        header[1] = UInt8(address.prefix.length)
        header[2] = noDAD
        header.store(UInt32(bitPattern: address.linkIndex), at: 4)
        let bytes = address.ip.bytes
        let what = "\(delete ? "delete" : "add") address \(address.prefix) on link \(address.linkIndex)"
        let flags = delete ? 0 : UInt16(NLM_F_CREATE | NLM_F_REPLACE)
        let seq = try request(type: delete ? RTM.delAddr : RTM.newAddr, flags: flags | UInt16(NLM_F_ACK), header: header) { nlh in
            bytes.withUnsafeBytes {
                mnl_attr_put(nlh, IFA.local, bytes.count, $0.baseAddress)
                mnl_attr_put(nlh, IFA.address, bytes.count, $0.baseAddress)
            }
            if noDAD != 0 { mnl_attr_put_u32(nlh, IFA.flags, UInt32(noDAD)) }
        }
        try awaitAcknowledgement(seq, what)
    }

    /// Adds `rule`, or deletes it, and waits for the kernel's answer. Adding a rule that exists
    /// already fails with `EEXIST` rather than stacking a duplicate.
    public func write(_ rule: RoutingRule, delete: Bool = false) throws(NetlinkError) {
        let what = "\(delete ? "delete" : "add") rule \(rule)"
        var header = [UInt8](repeating: 0, count: 12)  // struct fib_rule_hdr
        header[0] = rule.family == .v4 ? AF.inet : AF.inet6
        if let destination = rule.destination {
            guard destination.address.family == rule.family else { throw NetlinkError(what, EINVAL) }
            header[1] = UInt8(destination.length)  // dst_len
        }
        header[4] = rule.table < 256 ? UInt8(rule.table) : 0  // RT_TABLE_UNSPEC; FRA_TABLE has it
        header[7] = 1  // FR_ACT_TO_TBL
        header.store(rule.inverted ? 0x2 : 0, at: 8)  // FIB_RULE_INVERT
        let suppress: UInt32?
        if let length = rule.suppressPrefixLength {
            guard (0...rule.family.bitWidth).contains(length) else { throw NetlinkError(what, EINVAL) }
            suppress = UInt32(length)
        } else {
            suppress = nil
        }
        let flags = delete ? 0 : UInt16(NLM_F_CREATE | NLM_F_EXCL)
        let seq = try request(type: delete ? FRA.delRule : FRA.newRule, flags: flags | UInt16(NLM_F_ACK), header: header) { nlh in
            mnl_attr_put_u32(nlh, FRA.priority, rule.priority)
            mnl_attr_put_u32(nlh, FRA.table, rule.table)
            if let mark = rule.mark {
                mnl_attr_put_u32(nlh, FRA.fwmark, mark)
                mnl_attr_put_u32(nlh, FRA.fwmask, .max)
            }
            if let suppress { mnl_attr_put_u32(nlh, FRA.suppressPrefixLength, suppress) }
            if let destination = rule.destination {
                let bytes = destination.address.bytes
                bytes.withUnsafeBytes { mnl_attr_put(nlh, FRA.destination, bytes.count, $0.baseAddress) }
            }
        }
        try awaitAcknowledgement(seq, what)
    }
}

// linux/fib_rules.h: rule messages and their attributes.
private enum FRA {
    static let newRule: UInt16 = 32, delRule: UInt16 = 33
    static let destination: UInt16 = 1, priority: UInt16 = 6, fwmark: UInt16 = 10, suppressPrefixLength: UInt16 = 14
    static let table: UInt16 = 15, fwmask: UInt16 = 16
}

extension [UInt8] {
    /// Stores `value` in host order (little-endian on every Linux target Roam runs on) at `offset`.
    package mutating func store(_ value: UInt32, at offset: Int) {
        for i in 0..<4 { self[offset + i] = UInt8(truncatingIfNeeded: value >> (8 * i)) }
    }
}
