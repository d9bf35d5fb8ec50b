import Basics

/// The settings as a handshake response carries them: options after the fixed payload.
extension DNSSettings {
    /// Options that follow the response's fixed payload: type (1), length (1), value.
    enum Option {
        /// The rest of the payload is padding.
        static let end: UInt8 = 0
        /// A resolver's address: 4 or 16 bytes.
        static let resolver: UInt8 = 1
        /// A search domain: 1 to 253 bytes of ASCII.
        static let searchDomain: UInt8 = 2
    }

    func encoded() -> [UInt8] {
        var bytes: [UInt8] = []
        for resolver in resolvers { bytes += [Option.resolver, UInt8(resolver.bytes.count)] + resolver.bytes }
        for domain in searchDomains { bytes += [Option.searchDomain, UInt8(domain.utf8.count)] + Array(domain.utf8) }
        return bytes
    }

    /// A response's options, each type and value, up to the end marker; nil when one overruns
    /// the payload.
    static func options(_ bytes: ArraySlice<UInt8>) -> [(type: UInt8, value: ArraySlice<UInt8>)]? {
        var found: [(type: UInt8, value: ArraySlice<UInt8>)] = []
        var at = bytes.startIndex
        while at < bytes.endIndex, bytes[at] != Option.end {
            guard at + 1 < bytes.endIndex else { return nil }
            let start = at + 2, length = Int(bytes[at + 1])
            guard start + length <= bytes.endIndex else { return nil }
            found.append((bytes[at], bytes[start..<start + length]))
            at = start + length
        }
        return found
    }

    /// The settings in a response's options; options of types this version does not know are
    /// skipped, so a later server can say more.
    static func decode(_ bytes: ArraySlice<UInt8>) -> Result<DNSSettings, DNSSettingsError> {
        guard let options = options(bytes) else { return .failure(.malformed) }
        var resolvers: [IPAddress] = []
        var domains: [String] = []
        for (type, value) in options {
            switch type {
            case Option.resolver:
                guard value.count == 4 || value.count == 16, let address = IPAddress(bytes: value) else { return .failure(.malformed) }
                resolvers.append(address)
            case Option.searchDomain:
                domains.append(String(decoding: value, as: UTF8.self))
            default:
                break
            }
        }
        return Result { () throws(DNSSettingsError) in try DNSSettings(resolvers: resolvers, searchDomains: domains) }
    }
}

