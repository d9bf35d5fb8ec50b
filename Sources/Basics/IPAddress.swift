import Glibc

/// An IPv4 or IPv6 address, stored by value.
public enum IPAddress: Hashable, Sendable, Comparable, CustomStringConvertible {
    /// An IPv4 address in host byte order.
    case v4(UInt32)
    /// An IPv6 address as two big-endian halves in host byte order.
    case v6(UInt64, UInt64)

    /// The address family.
    public var family: Family { if case .v4 = self { .v4 } else { .v6 } }

    /// Address families the model knows.
    public enum Family: String, Hashable, Sendable, Comparable {
        case v4, v6
        public static func < (a: Family, b: Family) -> Bool { a == .v4 && b == .v6 }
        /// Bits in an address of this family.
        public var bitWidth: Int { self == .v4 ? 32 : 128 }
    }

    /// Parses dotted-quad IPv4 or RFC 4291 IPv6 text; nil when `text` is neither.
    public init?(_ text: String) {
        var v4 = in_addr()
        if inet_pton(AF_INET, text, &v4) == 1 {
            self = .v4(UInt32(bigEndian: v4.s_addr))
            return
        }
        var v6 = in6_addr()
        guard inet_pton(AF_INET6, text, &v6) == 1 else { return nil }
        self = withUnsafeBytes(of: &v6) { IPAddress(v6Bytes: $0) }
    }

    /// Builds an address from 4 or 16 network-order bytes; nil for any other length.
    public init?(bytes: some Collection<UInt8>) {
        let array = Array(bytes)
        switch array.count {
        case 4:
            self = .v4(array.reduce(0) { $0 << 8 | UInt32($1) })
        case 16:
            self = array.withUnsafeBytes { IPAddress(v6Bytes: $0) }
        default:
            return nil
        }
    }

    private init(v6Bytes raw: UnsafeRawBufferPointer) {
        var high: UInt64 = 0
        var low: UInt64 = 0
        for i in 0..<8 { high = high << 8 | UInt64(raw[i]) }
        for i in 8..<16 { low = low << 8 | UInt64(raw[i]) }
        self = .v6(high, low)
    }

    /// The address in network byte order.
    public var bytes: [UInt8] {
        switch self {
        case .v4(let a):
            return (0..<4).map { UInt8(truncatingIfNeeded: a >> (24 - 8 * $0)) }
        case .v6(let high, let low):
            return (0..<8).map { UInt8(truncatingIfNeeded: high >> (56 - 8 * $0)) }
                + (0..<8).map { UInt8(truncatingIfNeeded: low >> (56 - 8 * $0)) }
        }
    }

    /// True for fe80::/10, which cannot reach a server off the link.
    public var isLinkLocal: Bool {
        if case .v6(let high, _) = self { return high >> 54 == 0x3FA }
        if case .v4(let a) = self { return a >> 16 == 0xA9FE }
        return false
    }

    /// True for 127.0.0.0/8 and ::1: this machine.
    public var isLoopback: Bool {
        switch self {
        case .v4(let a): a >> 24 == 127
        case .v6(let high, let low): high == 0 && low == 1
        }
    }

    /// True for ::ffff:0:0/96, an IPv4 address written as IPv6 (and sent as IPv4).
    public var isV4Mapped: Bool {
        if case .v6(let high, let low) = self { return high == 0 && low >> 32 == 0xFFFF }
        return false
    }

    /// True for 0.0.0.0 and ::, which name no host.
    public var isUnspecified: Bool { self == .v4(0) || self == .v6(0, 0) }

    /// One other host a session or a stream can be sent to over an uplink: not this machine, no
    /// link-local, multicast or broadcast address, none that names no host, and no IPv4 address
    /// written as IPv6 (a socket of one family cannot send to it).
    public var isRemoteUnicast: Bool {
        !isUnspecified && !isLoopback && !isMulticast && !isLinkLocal && !isV4Mapped && self != .v4(0xFFFF_FFFF)
    }

    /// True for 224.0.0.0/4 and ff00::/8.
    public var isMulticast: Bool {
        switch self {
        case .v4(let a): a >> 28 == 0xE
        case .v6(let high, _): high >> 56 == 0xFF
        }
    }

    public var description: String {
        var bytes = self.bytes
        var buffer = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN))
        let family = self.family == .v4 ? AF_INET : AF_INET6
        guard inet_ntop(family, &bytes, &buffer, socklen_t(buffer.count)) != nil else { return "?" }
        return String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    public static func < (a: IPAddress, b: IPAddress) -> Bool {
        switch (a, b) {
        case (.v4(let x), .v4(let y)): x < y
        case (.v6(let xh, let xl), .v6(let yh, let yl)): (xh, xl) < (yh, yl)
        case (.v4, .v6): true
        case (.v6, .v4): false
        }
    }
}

/// An address with a prefix length: a subnet, a route destination, or an interface address.
public struct Prefix: Hashable, Sendable, CustomStringConvertible {
    /// The address as given (host bits are kept, as the kernel keeps them for interface addresses).
    public var address: IPAddress
    /// Leading bits that count.
    public var length: Int

    /// A prefix; nil when `length` does not fit the family.
    public init?(_ address: IPAddress, length: Int) {
        guard (0...address.family.bitWidth).contains(length) else { return nil }
        self.address = address
        self.length = length
    }

    /// Parses `a.b.c.d/n`, `x::y/n`, a bare address (a host prefix), or `default` for `family`.
    public init?(_ text: String, defaultFamily family: IPAddress.Family = .v4) {
        if text == "default" {
            self.init(family == .v4 ? .v4(0) : .v6(0, 0), length: 0)
            return
        }
        let parts = text.split(separator: "/", maxSplits: 1, omittingEmptySubsequences: false)
        guard let address = IPAddress(String(parts[0])) else { return nil }
        if parts.count == 1 {
            self.init(address, length: address.family.bitWidth)
        } else {
            guard let n = Int(parts[1]) else { return nil }
            self.init(address, length: n)
        }
    }

    /// The default route's destination for `family`.
    public static func any(_ family: IPAddress.Family) -> Prefix {
        Prefix(family == .v4 ? .v4(0) : .v6(0, 0), length: 0)!
    }

    /// The subnet itself: the address with its host bits cleared (`192.168.1.23/24` -> `192.168.1.0/24`).
    public var network: Prefix {
        var copy = self
        switch address {
        case .v4(let a):
            copy.address = .v4(length == 0 ? 0 : a & UInt32.max << (32 - length))
        case .v6(let high, let low):
            let h = length == 0 ? 0 : length >= 64 ? high : high & UInt64.max << (64 - length)
            let l = length <= 64 ? 0 : length == 128 ? low : low & UInt64.max << (128 - length)
            copy.address = .v6(h, l)
        }
        return copy
    }

    /// This subnet without `other`: itself when they do not meet, nothing when `other` holds it,
    /// else the subnets beside `other`'s ancestors down to it (a /8 without a /10: the /9 and
    /// the /10 beside it), largest first.
    public func subtracting(_ other: Prefix) -> [Prefix] {
        let me = network
        let cut = other.network
        guard me.address.family == cut.address.family else { return [me] }
        if cut.contains(me) { return [] }
        guard me.contains(cut) else { return [me] }
        return ((me.length + 1)...cut.length).map { length in
            let ancestor = Prefix(cut.address, length: length)!.network
            let bit = length - 1
            let sibling: IPAddress = switch ancestor.address {
            case .v4(let a): .v4(a ^ (1 << (31 - bit)))
            case .v6(let high, let low): bit < 64 ? .v6(high ^ (1 << (63 - bit)), low) : .v6(high, low ^ (1 << (127 - bit)))
            }
            return Prefix(sibling, length: length)!
        }
    }

    /// `prefixes` without any part of `removed`, as subnets.
    public static func excluding(_ removed: [Prefix], from prefixes: [Prefix]) -> [Prefix] {
        var left = prefixes.map(\.network)
        for cut in removed { left = left.flatMap { $0.subtracting(cut) } }
        return left
    }

    /// True when all of `other` lies inside this prefix (of the same family, no shorter).
    public func contains(_ other: Prefix) -> Bool {
        length <= other.length && contains(other.address)
    }

    /// True when `other` lies inside this prefix.
    public func contains(_ other: IPAddress) -> Bool {
        switch (address, other) {
        case (.v4(let net), .v4(let a)):
            guard length > 0 else { return true }
            let mask = UInt32.max << (32 - length)
            return net & mask == a & mask
        case (.v6(let nh, let nl), .v6(let ah, let al)):
            if length == 0 { return true }
            if length <= 64 {
                let mask = UInt64.max << (64 - length)
                return nh & mask == ah & mask
            }
            let mask = length == 128 ? UInt64.max : UInt64.max << (128 - length)
            return nh == ah && nl & mask == al & mask
        default:
            return false
        }
    }

    public var description: String {
        length == 0 ? "default" : "\(address)/\(length)"
    }
}

/// A server endpoint as operators write it: `198.51.100.7:51820`, `[2001:db8::7]:51820`, a bare
/// address, or `host.example:51820` (the host resolved elsewhere).
public struct Endpoint: Hashable, Sendable, CustomStringConvertible {
    public var host: String
    public var port: UInt16?
    /// The host as an address, when it is one.
    public var address: IPAddress? { IPAddress(host) }

    /// Parses endpoint text; nil when the port is not a number in 1...65535 or the host is empty.
    public init?(_ text: String) {
        var host = Substring(text)
        var port: UInt16?
        if host.hasPrefix("[") {
            guard let close = host.firstIndex(of: "]") else { return nil }
            let rest = host[host.index(after: close)...]
            host = host[host.index(after: host.startIndex)..<close]
            if !rest.isEmpty {
                guard rest.hasPrefix(":"), let p = UInt16(rest.dropFirst()), p > 0 else { return nil }
                port = p
            }
        } else if host.filter({ $0 == ":" }).count == 1, let colon = host.firstIndex(of: ":") {
            guard let p = UInt16(host[host.index(after: colon)...]), p > 0 else { return nil }
            port = p
            host = host[..<colon]
        }
        guard !host.isEmpty else { return nil }
        self.host = String(host)
        self.port = port
    }

    public var description: String {
        let h = host.contains(":") ? "[\(host)]" : host
        return port.map { "\(h):\($0)" } ?? h
    }
}
