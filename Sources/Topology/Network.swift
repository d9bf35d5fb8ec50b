public import Basics
/// What kind of uplink a link is; it decides nothing about routing, only what operators read
/// and which budget a later policy may apply.
public enum LinkKind: String, Hashable, Sendable, CaseIterable {
    case wifi, ethernet, wwan, loopback, virtual, tunnel, other
}

/// A network interface as the kernel reports it.
public struct Link: Hashable, Sendable {
    /// Kernel interface index.
    public var index: Int32
    /// Interface name, e.g. `wlan0`.
    public var name: String
    public var kind: LinkKind
    /// Administratively up (`IFF_UP`).
    public var isUp: Bool
    /// The lower layer passes packets (`IFF_LOWER_UP`: cable in, Wi-Fi associated).
    public var hasCarrier: Bool
    public var mtu: Int
    /// A bridge (`IFLA_INFO_KIND` "bridge"): Docker's docker0, libvirt's virbr0, or a LAN's br0.
    public var isBridge: Bool
    /// The bridge (or bond) this link is a port of (`IFLA_MASTER`).
    public var master: Int32?
    /// The driver's kind (`IFLA_INFO_KIND`: "veth", "tun" for a TUN or TAP device, "bridge",
    /// "vxlan"...); nil for a physical device.
    public var infoKind: String?
    /// A TAP device opened with a virtio header (`IFLA_TUN_TYPE` TAP, `IFLA_TUN_VNET_HDR`): how
    /// QEMU opens a virtual machine's NIC (libvirt's vnet0...). A VPN's TAP that brings another
    /// site's LAN in (OpenVPN, tinc, n2n, ZeroTier) opens none.
    public var isVirtualMachinesTap: Bool

    public init(index: Int32, name: String, kind: LinkKind = .other, isUp: Bool = true, hasCarrier: Bool = true,
                mtu: Int = 1500, isBridge: Bool = false, master: Int32? = nil, infoKind: String? = nil,
                isVirtualMachinesTap: Bool = false) {
        self.index = index
        self.name = name
        self.kind = kind
        self.isUp = isUp
        self.hasCarrier = hasCarrier
        self.mtu = mtu
        self.isBridge = isBridge
        self.master = master
        self.infoKind = infoKind
        self.isVirtualMachinesTap = isVirtualMachinesTap
    }

    /// Packets can leave through this link.
    public var isUsable: Bool { isUp && hasCarrier && kind != .loopback }
}

/// Per-address flags from `IFA_F_*` that matter for choosing a source address.
public struct AddressFlags: OptionSet, Hashable, Sendable {
    public let rawValue: UInt32
    public init(rawValue: UInt32) { self.rawValue = rawValue }
    /// `IFA_F_SECONDARY`: a second IPv4 address in an already covered subnet.
    public static let secondary = AddressFlags(rawValue: 0x01)
    /// `IFA_F_TEMPORARY`: an RFC 8981 privacy address that rotates. The kernel gives it the
    /// same bit as `secondary`; which one it means depends on the family.
    public static let temporary = AddressFlags(rawValue: 0x01)
    /// `IFA_F_DADFAILED`: duplicate address detection failed; unusable.
    public static let dadFailed = AddressFlags(rawValue: 0x08)
    /// `IFA_F_DEPRECATED`: preferred lifetime over; still works, but new flows should avoid it.
    public static let deprecated = AddressFlags(rawValue: 0x20)
    /// `IFA_F_TENTATIVE`: duplicate address detection still running; unusable.
    public static let tentative = AddressFlags(rawValue: 0x40)
    /// `IFA_F_PERMANENT`: configured by hand or DHCP rather than autoconfigured.
    public static let permanent = AddressFlags(rawValue: 0x80)
}

/// An address assigned to a link.
public struct Address: Hashable, Sendable {
    public var linkIndex: Int32
    /// The address and its subnet's prefix length.
    public var prefix: Prefix
    public var flags: AddressFlags

    public init(linkIndex: Int32, prefix: Prefix, flags: AddressFlags = []) {
        self.linkIndex = linkIndex
        self.prefix = prefix
        self.flags = flags
    }

    public var ip: IPAddress { prefix.address }

    /// Identity as the kernel keys it: link, address, prefix length.
    public var key: Key { Key(linkIndex: linkIndex, prefix: prefix) }
    public struct Key: Hashable, Sendable {
        public var linkIndex: Int32
        public var prefix: Prefix
        public init(linkIndex: Int32, prefix: Prefix) {
            self.linkIndex = linkIndex
            self.prefix = prefix
        }
    }

    /// The kernel may send from this address now.
    public var isUsable: Bool { !flags.contains(.tentative) && !flags.contains(.dadFailed) && !ip.isLinkLocal }
}

/// What the kernel does with packets that match a route.
public enum RouteType: String, Hashable, Sendable {
    /// Forward to a next hop (`RTN_UNICAST`).
    case unicast
    /// `RTN_LOCAL`, `RTN_BROADCAST` and friends: addresses of this host, never an uplink.
    case local
    /// `RTN_BLACKHOLE`, `RTN_UNREACHABLE`, `RTN_PROHIBIT`: packets are dropped.
    case reject
}

/// One way out of a route: multipath routes have several.
public struct NextHop: Hashable, Sendable {
    public var gateway: IPAddress?
    public var linkIndex: Int32
    public init(gateway: IPAddress? = nil, linkIndex: Int32) {
        self.gateway = gateway
        self.linkIndex = linkIndex
    }
}

/// A route in one of the kernel's tables.
public struct Route: Hashable, Sendable {
    /// The main table, where `ip route` puts routes by default.
    public static let mainTable: UInt32 = 254

    public var table: UInt32
    public var destination: Prefix
    public var type: RouteType
    public var nextHops: [NextHop]
    /// `RTA_PRIORITY`: lower wins among routes of the same prefix length.
    public var metric: UInt32
    /// `RTA_PREFSRC`: the source address the kernel would pick, if the route names one.
    public var preferredSource: IPAddress?

    public init(table: UInt32 = Route.mainTable, destination: Prefix, type: RouteType = .unicast,
                nextHops: [NextHop], metric: UInt32 = 0, preferredSource: IPAddress? = nil) {
        self.table = table
        self.destination = destination
        self.type = type
        self.nextHops = nextHops
        self.metric = metric
        self.preferredSource = preferredSource
    }

    /// Identity as the kernel keys it: a new route with the same key replaces the old one.
    /// IPv6 keeps same-prefix, same-metric routes through different links apart (one message
    /// per next hop), IPv4 does not, so the link is part of the key for IPv6 only.
    public var key: Key {
        Key(table: table, destination: destination, metric: metric,
            linkIndex: destination.address.family == .v6 ? nextHops.first?.linkIndex : nil)
    }
    public struct Key: Hashable, Sendable {
        public var table: UInt32
        public var destination: Prefix
        public var metric: UInt32
        public var linkIndex: Int32?
        public init(table: UInt32, destination: Prefix, metric: UInt32, linkIndex: Int32? = nil) {
            self.table = table
            self.destination = destination
            self.metric = metric
            self.linkIndex = linkIndex
        }
    }
}

/// One decoded change from the kernel (or from a scenario file, which speaks the same language).
public enum NetworkChange: Hashable, Sendable {
    /// A link appeared or changed (`RTM_NEWLINK`).
    case linkChanged(Link)
    /// A link was deleted (`RTM_DELLINK`).
    case linkRemoved(index: Int32)
    /// An address was added or its flags changed (`RTM_NEWADDR`).
    case addressAdded(Address)
    /// An address was removed (`RTM_DELADDR`).
    case addressRemoved(Address.Key)
    /// A route was added or replaced (`RTM_NEWROUTE`).
    case routeAdded(Route)
    /// A route was removed (`RTM_DELROUTE`).
    case routeRemoved(Route.Key)

    /// Whether it may change a link's usable addresses (a route never does).
    public var movesAddresses: Bool {
        switch self {
        case .linkChanged, .linkRemoved, .addressAdded, .addressRemoved: true
        case .routeAdded, .routeRemoved: false
        }
    }

    /// The destination of a changed route; nil for a link or an address.
    public var routeDestination: Prefix? {
        switch self {
        case .routeAdded(let route): route.destination
        case .routeRemoved(let key): key.destination
        case .linkChanged, .linkRemoved, .addressAdded, .addressRemoved: nil
        }
    }
}

/// A policy rule added or removed, or a route removed, and who asked for it: what the agent
/// needs to notice that someone else took its routing away, and to say who.
public struct RoutingNotice: Hashable, Sendable {
    public enum Subject: Hashable, Sendable {
        case rule(RoutingRule)
        case route(Route.Key)
    }
    public var subject: Subject
    public var removed: Bool
    /// The netlink port of the socket whose request caused it: for most programs the process id
    /// of the first socket they open (`ip`, NetworkManager, systemd-networkd); 0 for the
    /// kernel's own doing (a link going down takes its routes).
    public var sender: UInt32

    public init(subject: Subject, removed: Bool, sender: UInt32) {
        self.subject = subject
        self.removed = removed
        self.sender = sender
    }
}

/// A policy routing rule (`ip rule`): which routing table a packet consults, chosen by its mark.
public struct RoutingRule: Hashable, Sendable, CustomStringConvertible {
    public var family: IPAddress.Family
    /// Rules run in ascending priority; the main table's own rule is 32766.
    public var priority: UInt32
    /// The table to look up.
    public var table: UInt32
    /// Matches packets carrying exactly this mark (`SO_MARK`); nil matches every packet.
    public var mark: UInt32?
    /// `not`: matches the packets the rest of the rule does not (`FIB_RULE_INVERT`).
    public var inverted: Bool
    /// Ignores the table's answer when its prefix is this long or shorter: 0 skips default routes.
    public var suppressPrefixLength: Int?
    /// Matches only packets to this subnet (`to`, `FRA_DST`); nil matches every destination.
    public var destination: Prefix?
    /// Read from the kernel: the rule also matches on something this type does not say (a source
    /// or destination, an interface, a mark mask other than every bit, ...) or does something
    /// other than look a table up. Such a rule is never one the agent wrote, however alike.
    public var matchesMore = false

    public init(family: IPAddress.Family, priority: UInt32, table: UInt32, mark: UInt32? = nil,
                inverted: Bool = false, suppressPrefixLength: Int? = nil, destination: Prefix? = nil) {
        // A /0 selects nothing: the kernel reads it back as no destination.
        self.destination = destination.flatMap { $0.length == 0 ? nil : $0.network }
        self.family = family
        self.priority = priority
        self.table = table
        self.mark = mark
        self.inverted = inverted
        self.suppressPrefixLength = suppressPrefixLength
    }

    /// As `ip rule` prints it, with the family in front.
    public var description: String {
        var text = "\(family) \(priority): \(inverted ? "not " : "")"
        if let mark { text += "fwmark 0x\(String(mark, radix: 16)) " } else { text += "from all " }
        if let destination { text += "to \(destination) " }
        text += "lookup \(table == Route.mainTable ? "main" : String(table))"
        if let suppressPrefixLength { text += " suppress_prefixlength \(suppressPrefixLength)" }
        return text
    }
}
