import Glibc
public import Basics
import Device

/// Looks up the server's name the way the C library would (the hosts file, then the name
/// servers of resolv.conf over UDP), but on sockets that carry the session's mark.
///
/// In full mode the mark is what lets these queries past the lockdown firewall and past the
/// tunnel's routes: glibc's resolver cannot mark its sockets, so its queries would be stopped
/// by the lockdown, or sent into a tunnel that is down and needs this very answer to come up.
/// Only the agent (CAP_NET_ADMIN sets a mark) can send DNS outside the tunnel this way.
public enum MarkedLookup {
    /// `avoiding`: the tunnel's own resolvers, which the system's configuration lists while the
    /// tunnel is up (resolv.conf saves the previous file, systemd-resolved's list has every link's).
    /// `device`: the queries go out over that interface alone (a name of that network's own).
    public static func addresses(of host: String, mark: UInt32?, avoiding: [IPAddress] = [], device: String? = nil,
                                 etc: String = "/etc") throws(ResolverError) -> [IPAddress] {
        let name = host.lowercased().hasSuffix(".") ? String(host.lowercased().dropLast()) : host.lowercased()
        let fromHosts = hostsFile(SystemFiles.text(etc + "/hosts") ?? "", name: name)
        if !fromHosts.isEmpty { return fromHosts }
        let configuration = ResolvConf(ResolvConfFile.systemText(at: etc + "/resolv.conf") ?? "",
                                       systemdUplinks: SystemFiles.text("/run/systemd/resolve/resolv.conf"), avoiding: avoiding)
        var temporary = false
        for candidate in configuration.candidates(for: name) {
            switch query(candidate, configuration, mark: mark, device: device) {
            case .addresses(let list): return list
            case .noSuchName, .noAddress: continue
            case .noAnswer: temporary = true
            }
        }
        throw ResolverError(host: host, code: temporary ? EAI_AGAIN : EAI_NONAME)
    }

    /// The addresses the hosts file gives `name`, in file order.
    public static func hostsFile(_ text: String, name: String) -> [IPAddress] {
        var found: [IPAddress] = []
        for line in text.split(whereSeparator: \.isNewline) {
            let fields = line.prefix { $0 != "#" }.split(whereSeparator: { $0 == " " || $0 == "\t" })
            guard fields.count >= 2, fields.dropFirst().contains(where: { $0.lowercased() == name }),
                  let address = IPAddress(String(fields[0].prefix { $0 != "%" })), !found.contains(address) else { continue }
            found.append(address)
        }
        return found
    }

    enum Outcome: Equatable {
        case addresses([IPAddress])
        case noSuchName
        /// The name exists with neither an IPv4 nor an IPv6 address.
        case noAddress
        /// No server answered in time (or each failed): worth asking again later.
        case noAnswer
    }

    /// Asks each name server in turn for A and AAAA records of `name`.
    private static func query(_ name: String, _ configuration: ResolvConf, mark: UInt32?, device: String?) -> Outcome {
        let queries = [DNSMessage.query(name, type: DNSMessage.a, id: UInt16.random(in: 0...UInt16.max)),
                       DNSMessage.query(name, type: DNSMessage.aaaa, id: UInt16.random(in: 0...UInt16.max))]
        for _ in 0..<configuration.attempts {
            for server in configuration.nameservers {
                guard let answers = ask(server, queries, timeout: configuration.timeout, mark: mark, device: device) else { continue }
                let addresses = answers.flatMap { $0.addresses }
                if !addresses.isEmpty { return .addresses(addresses) }
                if answers.contains(where: { $0.code == .noSuchName }) { return .noSuchName }
                if answers.allSatisfy({ $0.code == .ok }) { return .noAddress }
            }
        }
        return .noAnswer
    }

    /// Sends `queries` to `server` port 53 from a marked socket and waits up to `timeout` for
    /// an answer to each, from that server alone; nil when the socket cannot be made or nothing came.
    private static func ask(_ server: IPAddress, _ queries: [(id: UInt16, bytes: [UInt8])], timeout: Duration,
                            mark: UInt32?, device: String?) -> [DNSMessage.Answer]? {
        let peer = SocketAddress(server, port: 53)
        let any: IPAddress = server.family == .v4 ? .v4(0) : .v6(0, 0)
        guard let socket = try? UDPSocket(bindingTo: SocketAddress(any, port: 0), device: device, mark: mark) else { return nil }
        for query in queries { _ = try? query.bytes.withUnsafeBytes { try socket.send($0, to: peer) } }
        var answers: [UInt16: DNSMessage.Answer] = [:]
        let deadline = Instant.now() + timeout
        var buffer = [UInt8](repeating: 0, count: 1500)
        for _ in 0..<64 where answers.count < queries.count {
            let left = deadline - Instant.now()
            guard left > .zero else { break }
            guard let (length, from) = try? buffer.withUnsafeMutableBytes({ try socket.receive(into: $0, timeout: left) }),
                  from == peer,
                  let answer = DNSMessage.parse(buffer[0..<length]),
                  let query = queries.first(where: { $0.id == answer.id }) else { continue }
            answers[query.id] = answer
        }
        return answers.isEmpty ? nil : queries.compactMap { answers[$0.id] }  // A before AAAA
    }
}

/// The parts of resolv.conf(5) a look-up needs.
public struct ResolvConf: Equatable {
    public var nameservers: [IPAddress] = []
    public var search: [String] = []
    public var timeout: Duration = .seconds(5)
    public var attempts = 2
    public var ndots = 1

    /// Reads `text`; when it points at systemd-resolved's local stub (127.0.0.53), the uplinks'
    /// own servers come from `systemdUplinks` (/run/systemd/resolve/resolv.conf) instead: the
    /// stub itself sends its queries unmarked, so the lockdown would stop them. Servers in
    /// `avoiding` are left out.
    public init(_ text: String, systemdUplinks: String? = nil, avoiding: [IPAddress] = []) {
        for line in text.split(whereSeparator: \.isNewline) {
            let words = line.prefix { $0 != "#" && $0 != ";" }.split(whereSeparator: { $0 == " " || $0 == "\t" })
            guard let key = words.first else { continue }
            switch key {
            case "nameserver":
                if words.count > 1, let address = IPAddress(String(words[1].prefix { $0 != "%" })) {
                    nameservers.append(address)
                }
            case "search", "domain":
                search = words.dropFirst().map { $0.lowercased() }
            case "options":
                for option in words.dropFirst() {
                    let parts = option.split(separator: ":", maxSplits: 1)
                    guard parts.count == 2, let n = Int(parts[1]) else { continue }
                    switch parts[0] {
                    case "timeout": timeout = .seconds(min(max(n, 1), 30))
                    case "attempts": attempts = min(max(n, 1), 5)
                    case "ndots": ndots = min(max(n, 0), 15)
                    default: break
                    }
                }
            default:
                break
            }
        }
        if nameservers.contains(IPAddress("127.0.0.53")!), let uplinks = systemdUplinks {
            let real = ResolvConf(uplinks, avoiding: avoiding).nameservers
            if !real.isEmpty { nameservers = real }
        }
        nameservers.removeAll { avoiding.contains($0) }
        if nameservers.isEmpty { nameservers = [IPAddress("127.0.0.1")!] }  // what the C library does
        nameservers = Array(nameservers.prefix(3))  // MAXNS
    }

    /// The names to ask, in order: as given first when it has enough dots, else after the search list.
    public func candidates(for name: String) -> [String] {
        let searched = search.map { name + "." + $0 }
        return name.filter { $0 == "." }.count >= ndots ? [name] + searched : searched + [name]
    }
}

/// DNS messages (RFC 1035): a query for one name and type, and the addresses in an answer.
public enum DNSMessage {
    public static let a: UInt16 = 1, aaaa: UInt16 = 28

    public enum Code: Equatable { case ok, noSuchName, failed }

    public struct Answer: Equatable {
        public var id: UInt16
        public var code: Code
        public var addresses: [IPAddress]
    }

    /// A recursive query for `name`'s records of `type`.
    public static func query(_ name: String, type: UInt16, id: UInt16) -> (id: UInt16, bytes: [UInt8]) {
        var bytes: [UInt8] = [UInt8(id >> 8), UInt8(id & 0xff), 0x01 /* RD */, 0, 0, 1, 0, 0, 0, 0, 0, 0]
        for label in name.split(separator: ".") {
            let utf8 = Array(label.utf8.prefix(63))
            bytes.append(UInt8(utf8.count))
            bytes += utf8
        }
        bytes += [0, UInt8(type >> 8), UInt8(type & 0xff), 0, 1]
        return (id, bytes)
    }

    /// The answer's ID, result code and every A/AAAA record of its answer section; nil for
    /// anything that is not a well-formed answer.
    public static func parse(_ message: ArraySlice<UInt8>) -> Answer? {
        let b = Array(message)
        guard b.count >= 12, b[2] & 0x80 != 0 /* QR */ else { return nil }
        func u16(_ at: Int) -> Int { Int(b[at]) << 8 | Int(b[at + 1]) }
        let id = UInt16(u16(0))
        let code: Code = switch b[3] & 0x0f {
        case 0: .ok
        case 3: .noSuchName
        default: .failed
        }
        var offset = 12
        func skipName() -> Bool {
            for _ in 0..<128 {
                guard offset < b.count else { return false }
                let length = Int(b[offset])
                if length == 0 { offset += 1; return true }
                if length & 0xc0 == 0xc0 { offset += 2; return offset <= b.count }
                offset += 1 + length
            }
            return false
        }
        for _ in 0..<u16(4) {
            guard skipName(), offset + 4 <= b.count else { return nil }
            offset += 4
        }
        var addresses: [IPAddress] = []
        for _ in 0..<u16(6) {
            guard skipName(), offset + 10 <= b.count else { return nil }
            let type = UInt16(u16(offset)), klass = u16(offset + 2), length = u16(offset + 8)
            offset += 10
            guard offset + length <= b.count else { return nil }
            if klass == 1, (type == a && length == 4) || (type == aaaa && length == 16),
               let address = IPAddress(bytes: b[offset..<offset + length]), !addresses.contains(address) {
                addresses.append(address)
            }
            offset += length
        }
        return Answer(id: id, code: code, addresses: addresses)
    }
}
