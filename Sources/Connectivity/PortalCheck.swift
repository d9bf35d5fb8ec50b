public import Topology
public import Basics
import PathMonitor
public import Reconnector
import SystemDNS
import Tunnel
import Device

/// The connectivity check: one plain HTTP request over one uplink, outside the tunnel, whose
/// answer tells a network that reaches the internet from a captive portal (which redirects it
/// or answers something else) and from one that answers nothing at all.
///
/// It never follows a redirect: the first one is the portal's login page, so a portal that
/// redirects without end costs one request.
public struct PortalCheck: Equatable, Sendable {
    /// Where the request goes: plain HTTP, so a portal can intercept it.
    public var url: CheckURL
    /// What a network that reaches the internet answers.
    public var expect: HTTPExpectation

    public init(url: CheckURL, expect: HTTPExpectation) {
        self.url = url
        self.expect = expect
    }

    /// NetworkManager's check, which Debian and most Linux desktops already make.
    public static let standard = PortalCheck(url: CheckURL("http://nmcheck.gnome.org/check_network_status.txt")!,
                                      expect: .body("NetworkManager is online"))

    /// How long a check may take, connection, request and answer together.
    static let timeout: Duration = .seconds(5)
    /// The most of an answer that is read; a portal's page beyond it is not needed.
    static let answerLimit = 16_384

    /// Makes the check over `path`: the name looked up (on marked sockets, in full mode), then
    /// one connection from the path's address, bound to its interface and carrying `mark`.
    public func run(via path: Path, mark: UInt32?, avoiding: [IPAddress]) -> Connectivity {
        let deadline = ContinuousClock.now + Self.timeout
        let addresses: [IPAddress]
        do {
            addresses = try Resolver.addresses(of: url.host, mark: mark, avoiding: avoiding)
        } catch {
            return .unknown("cannot look up \(url.host): \(error)")
        }
        guard let address = addresses.first(where: { $0.family == path.source.family }) else {
            return .unknown("\(url.host) has no \(path.source.family == .v4 ? "IPv4" : "IPv6") address")
        }
        let answer: [UInt8]
        do {
            let connection = try TCPConnection.connect(to: SocketAddress(address, port: url.port), from: path.source,
                                                       device: path.interface, mark: mark, deadline: deadline)
            guard try connection.write(Array(url.request.utf8), deadline: deadline) else {
                return .unknown("no room to send the request to \(url.host) in \(Self.timeout.short)")
            }
            answer = try connection.read(until: [], limit: Self.answerLimit, deadline: deadline)
        } catch {
            return .unknown("\(error)")
        }
        if answer.isEmpty { return .unknown("no answer from \(url.host) in \(Self.timeout.short)") }
        return judge(answer)
    }

    /// What an answer means (pure: the parser's tests feed it answers real portals give).
    func judge(_ answer: [UInt8]) -> Connectivity {
        guard let response = HTTPResponse(answer) else {
            return .unknown("the answer from \(url.host) is not HTTP (\(answer.count) bytes)")
        }
        switch response.status {
        case 300...399:
            // The portal's login page, absolute or relative to the check's host; a Location
            // that is not a usable URL still means a portal, shown as the check's own URL.
            let location = response.header("location").flatMap { url.resolve($0) }
            return .portal(url: location ?? url.text)
        case 500...599 where response.status != 511:
            return .unknown("\(url.host) answered \(response.status)")
        default:
            switch expect {
            case .status(let code) where response.status == code: return .online
            case .body(let text) where response.status == 200 && response.body.starts(with: Array(text.utf8)): return .online
            default: return .portal(url: url.text)
            }
        }
    }
}

/// An `http://` URL, the only kind a portal can intercept, or an `https://` one (a pinned
/// on-demand probe's).
public struct CheckURL: Equatable, Sendable {
    public var host: String
    public var port: UInt16
    /// `https://`: the request goes over TLS.
    public var isHTTPS: Bool
    /// The path and query, starting with `/`.
    var target: String
    /// As written.
    public var text: String

    public init?(_ text: String) {
        let https = text.hasPrefix("https://")
        guard text.count <= 2048, https || text.hasPrefix("http://"), text.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7f }) else { return nil }
        let rest = text.dropFirst(https ? "https://".count : "http://".count)
        let authority = rest.prefix { $0 != "/" && $0 != "?" && $0 != "#" }
        var target = String(rest.dropFirst(authority.count).prefix { $0 != "#" })
        if target.isEmpty || target.hasPrefix("?") { target = "/" + target }
        guard !authority.contains("@"), let endpoint = Endpoint(String(authority)), !endpoint.host.isEmpty else { return nil }
        host = endpoint.host
        isHTTPS = https
        port = endpoint.port ?? (https ? 443 : 80)
        self.target = target
        self.text = text
    }

    /// The request: HTTP/1.1 (portals rewrite by Host), no keep-alive, nothing cached.
    var request: String {
        let hostHeader = host.contains(":") ? "[\(host)]" : host
        return "GET \(target) HTTP/1.1\r\nHost: \(hostHeader)\(port == (isHTTPS ? 443 : 80) ? "" : ":\(port)")\r\n"
            + "User-Agent: roam-connectivity-check\r\nAccept: */*\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n"
    }

    /// A Location header as a URL to show: absolute http or https, or a path on this host;
    /// nil for anything else (garbage, control characters, other schemes, too long).
    func resolve(_ location: String) -> String? {
        guard !location.isEmpty, location.count <= 2048, location.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7f }) else { return nil }
        if location.hasPrefix("http://") || location.hasPrefix("https://") { return location }
        guard location.hasPrefix("/"), !location.hasPrefix("//") else { return nil }
        let authority = host.contains(":") ? "[\(host)]" : host
        return "http://\(authority)\(port == 80 ? "" : ":\(port)")\(location)"
    }
}

/// The parts of an HTTP/1.x answer the check reads.
struct HTTPResponse {
    var status: Int
    var headers: [(name: String, value: String)]
    var body: [UInt8]
    /// The head ended with its blank line (an answer cut short may end in the middle of a
    /// header, or have its body read as headers).
    var headComplete: Bool

    init?(_ bytes: [UInt8]) {
        let separator: [UInt8] = [13, 10, 13, 10]
        let end = bytes.firstRange(of: separator)
        let head = end.map { bytes[..<$0.lowerBound] } ?? bytes[...]
        guard let text = String(validating: head, as: UTF8.self) ?? String(validating: head, as: Unicode.ASCII.self) else { return nil }
        var lines = text.split(separator: "\r\n", omittingEmptySubsequences: false).map(String.init)
        guard !lines.isEmpty else { return nil }
        let statusLine = lines.removeFirst().split(separator: " ", maxSplits: 2, omittingEmptySubsequences: true)
        guard statusLine.count >= 2, statusLine[0].hasPrefix("HTTP/1."), statusLine[1].count == 3,
              let status = Int(statusLine[1]), (100...599).contains(status) else { return nil }
        self.status = status
        headers = lines.compactMap { line in
            guard let colon = line.firstIndex(of: ":") else { return nil }
            return (line[..<colon].lowercased(), line[line.index(after: colon)...].trimmingSpaces)
        }
        body = end.map { Array(bytes[$0.upperBound...]) } ?? []
        headComplete = end != nil
    }

    func header(_ name: String) -> String? { headers.first { $0.name == name }?.value }
}

extension Substring {
    fileprivate var trimmingSpaces: String {
        String(drop { $0 == " " || $0 == "\t" }.reversed().drop { $0 == " " || $0 == "\t" }.reversed())
    }
}
