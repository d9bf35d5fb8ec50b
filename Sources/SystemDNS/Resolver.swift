import Glibc
public import Basics

/// The system's resolver (getaddrinfo: /etc/hosts, DNS, whatever nsswitch says), for a server
/// named by host. It may wait for the network, so the daemon calls it off its deciding thread.
public enum Resolver {
    /// Every address of `host`, in the resolver's order of preference (RFC 6724: addresses this
    /// machine can reach first), never none; a literal address is itself, with no lookup.
    /// With `mark` (full mode), the look-up goes out on marked sockets (`MarkedLookup`), past
    /// the lockdown and the tunnel's routes.
    /// `avoiding` names the tunnel's own resolvers, which cannot answer while it is down.
    /// `device`: the queries go out over that interface alone (`MarkedLookup`, marked or not).
    public static func addresses(of host: String, mark: UInt32? = nil, avoiding: [IPAddress] = [],
                                 device: String? = nil) throws(ResolverError) -> [IPAddress] {
        if let address = IPAddress(host) { return [address] }
        if mark != nil || device != nil { return try MarkedLookup.addresses(of: host, mark: mark, avoiding: avoiding, device: device) }
        var hints = addrinfo()
        hints.ai_socktype = Int32(SOCK_DGRAM.rawValue)
        var result: UnsafeMutablePointer<addrinfo>?
        let status = getaddrinfo(host, nil, &hints, &result)
        guard status == 0, let first = result else { throw ResolverError(host: host, code: status) }
        defer { freeaddrinfo(result) }
        var addresses: [IPAddress] = []
        var node: UnsafeMutablePointer<addrinfo>? = first
        for _ in 0..<256 {
            guard let info = node else { break }
            node = info.pointee.ai_next
            guard let sa = info.pointee.ai_addr else { continue }
            var address: IPAddress?
            if info.pointee.ai_family == AF_INET {
                let a = sa.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { $0.pointee.sin_addr.s_addr }
                address = .v4(UInt32(bigEndian: a))
            } else if info.pointee.ai_family == AF_INET6 {
                var a = sa.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { $0.pointee.sin6_addr }
                address = withUnsafeBytes(of: &a) { IPAddress(bytes: Array($0)) }
            }
            if let address, !addresses.contains(address) { addresses.append(address) }
        }
        guard !addresses.isEmpty else { throw ResolverError(host: host, code: nil) }
        return addresses
    }
}

/// Why a name gave no address.
public struct ResolverError: Error, CustomStringConvertible {
    public var host: String
    /// getaddrinfo's answer (EAI_...); nil when it answered with no IPv4 or IPv6 address.
    public var code: Int32?

    /// No answer yet (no network, no reachable name server): worth asking again later, unlike
    /// a name that does not exist.
    public var isTemporary: Bool { code == EAI_AGAIN }

    public var description: String {
        "cannot resolve \(host): " + (code.map { String(cString: gai_strerror($0)) } ?? "it has no IPv4 or IPv6 address")
    }
}
