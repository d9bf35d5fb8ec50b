/// The resolvers and search domains a server gives its clients for as long as the tunnel is up,
/// so that their names are asked through the tunnel and never of the local network. Valid by
/// construction: both the server's configuration and a received response go through `init`.
public struct DNSSettings: Hashable, Sendable, CustomStringConvertible {
    /// At most this many resolvers (glibc reads three; systemd-resolved takes more).
    public static let maxResolvers = 8
    /// At most this many search domains.
    public static let maxSearchDomains = 8
    /// The bytes a handshake response has for the settings: its 256-byte payload less the fixed
    /// 22 (docs/PROTOCOL.md; the data plane's tests hold the two together).
    public static let maxEncodedLength = 234

    public let resolvers: [IPAddress]
    /// Domains tried after a short name, in order (lower case, no trailing dot).
    public let searchDomains: [String]

    /// No resolvers and no domains: the server pushes nothing.
    public static let none = DNSSettings(checked: [], [])

    public init(resolvers: [IPAddress], searchDomains: [String]) throws(DNSSettingsError) {
        guard resolvers.count <= Self.maxResolvers else { throw .tooManyResolvers(resolvers.count) }
        guard searchDomains.count <= Self.maxSearchDomains else { throw .tooManySearchDomains(searchDomains.count) }
        guard Set(resolvers).count == resolvers.count else { throw .repeated }
        // None of these is reached through the tunnel: this machine, the link, everyone, or an
        // IPv4 address in IPv6 clothing that would dodge the rest of the checks.
        if let bad = resolvers.first(where: { $0.isUnspecified || $0.isMulticast || $0.isLinkLocal || $0.isLoopback || $0.isV4Mapped }) {
            throw .badResolver(bad.description)
        }
        var domains: [String] = []
        for domain in searchDomains {
            guard let normal = Self.normalDomain(domain) else { throw .badDomain(domain) }
            domains.append(normal)
        }
        guard Set(domains).count == domains.count else { throw .repeated }
        let settings = DNSSettings(checked: resolvers, domains)
        let length = settings.encodedLength
        guard length <= Self.maxEncodedLength else { throw .tooLong(length) }
        self = settings
    }

    private init(checked resolvers: [IPAddress], _ domains: [String]) {
        self.resolvers = resolvers
        searchDomains = domains
    }

    public var isEmpty: Bool { resolvers.isEmpty && searchDomains.isEmpty }

    public var description: String {
        guard !isEmpty else { return "none" }
        let servers = resolvers.map(\.description).joined(separator: ",")
        return searchDomains.isEmpty ? servers : "\(servers) search \(searchDomains.joined(separator: ","))"
    }

    /// `domain` in lower case without a trailing dot, when it is a host name of two labels or more
    /// (RFC 1123 labels of letters, digits, hyphens and, for names like `_tcp`, underscores); else
    /// nil. Nothing that could break a line of resolv.conf or a D-Bus string gets through, and no
    /// single label: as a routing domain `com` would claim every name under it.
    /// What the settings take in a handshake response: a type and a length byte before each
    /// resolver's address and each domain.
    public var encodedLength: Int {
        resolvers.reduce(0) { $0 + 2 + $1.bytes.count } + searchDomains.reduce(0) { $0 + 2 + $1.utf8.count }
    }

    static func normalDomain(_ domain: String) -> String? {
        var name = domain.lowercased()
        if name.hasSuffix(".") { name.removeLast() }
        guard (1...253).contains(name.utf8.count) else { return nil }
        let labels = name.split(separator: ".", omittingEmptySubsequences: false)
        guard labels.count >= 2 else { return nil }
        for label in labels {
            guard (1...63).contains(label.utf8.count), label.first != "-", label.last != "-",
                  label.utf8.allSatisfy({ ($0 >= 0x61 && $0 <= 0x7a) || ($0 >= 0x30 && $0 <= 0x39) || $0 == 0x2d || $0 == 0x5f })
            else { return nil }
        }
        return name
    }
}

/// Why a list of resolvers and domains cannot be used.
public enum DNSSettingsError: Error, Equatable, Sendable, CustomStringConvertible {
    case tooManyResolvers(Int)
    case tooManySearchDomains(Int)
    case badResolver(String)
    case badDomain(String)
    case repeated
    case tooLong(Int)
    /// A response's options overran the payload or held a value of the wrong size.
    case malformed

    public var description: String {
        switch self {
        case .tooManyResolvers(let n): "\(n) resolvers; at most \(DNSSettings.maxResolvers)"
        case .tooManySearchDomains(let n): "\(n) search domains; at most \(DNSSettings.maxSearchDomains)"
        case .badResolver(let address): "\(address) cannot be a resolver"
        case .badDomain(let domain):
            "\"\(String(domain.unicodeScalars.prefix(64).map { $0.isASCII && $0.value >= 0x20 ? Character($0) : "?" }))\" is not a domain name"
        case .repeated: "a resolver or domain is listed twice"
        case .tooLong(let n): "the list takes \(n) bytes; a handshake response has room for \(DNSSettings.maxEncodedLength)"
        case .malformed: "the server's list is malformed"
        }
    }
}
