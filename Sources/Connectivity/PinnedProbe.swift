public import Topology
public import Basics
import PathMonitor
public import Reconnector
import SystemDNS
import Device

/// An on-demand rule's pinned probe: one HTTPS request over one uplink, outside the tunnel,
/// that counts only when the server's certificate carries the pinned key and the server
/// answers as the rule expects over that session. No certificate authority is asked: the
/// pin says which key, and only the holder of its private key completes the handshake.
public struct PinnedProbe: Sendable {
    public var url: CheckURL
    public var expect: HTTPExpectation
    public var pin: KeyPin
    /// The server must say where it saw the connection come from, and that must be where it
    /// left (`OnDemandRule.Probe.direct`).
    public var direct: Bool

    /// The header in which the server says, inside the session, which address and port it saw
    /// the connection come from (`address:port`, IPv6 in brackets or not).
    public static let seenHeader = "roam-seen"

    /// What an answer says in its `Roam-Seen` headers, in a head that ended with its blank line
    /// (one cut short says nothing); more than one is two answers to one question.
    static func seenHeaders(in answer: [UInt8]) -> [String] {
        guard let response = HTTPResponse(answer), response.headComplete else { return [] }
        return response.headers.filter { $0.name == seenHeader }.map(\.value)
    }

    /// nil unless `probe` is a pinned `https://` one.
    public init?(_ probe: OnDemandRule.Probe) {
        guard let pin = probe.pin, let url = CheckURL(probe.url), url.isHTTPS else { return nil }
        self.url = url
        self.expect = probe.expect
        self.pin = pin
        self.direct = probe.direct
    }

    /// Why a probe proved nothing, for the log.
    public struct Failure: Error, CustomStringConvertible, Equatable {
        public var description: String
    }

    /// Makes the probe over `path`: the name looked up (on marked sockets, in full mode), one
    /// connection from the path's address, bound to its interface and carrying `mark`, a TLS
    /// handshake with the name as SNI, the key checked, one request. Connection, handshake and
    /// answer share `PortalCheck.timeout`. The proof names the key the server showed and the
    /// path, for the core to compare.
    public func run(via path: Path, mark: UInt32?, avoiding: [IPAddress]) -> Result<KeyProof, Failure> {
        let deadline = ContinuousClock.now + PortalCheck.timeout
        func failed(_ why: String) -> Result<KeyProof, Failure> { .failure(Failure(description: why)) }
        let addresses: [IPAddress]
        if let literal = IPAddress(url.host) {
            addresses = [literal]
        } else {
            do {
                addresses = try Resolver.addresses(of: url.host, mark: mark, avoiding: avoiding)
            } catch {
                return failed("cannot look up \(url.host): \(error)")
            }
        }
        guard let address = addresses.first(where: { $0.family == path.source.family }) else {
            return failed("\(url.host) has no \(path.source.family == .v4 ? "IPv4" : "IPv6") address")
        }
        let shown: KeyPin
        let answer: [UInt8]
        let local: SocketEndpoint?
        do {
            let connection: TCPConnection
            do {
                connection = try TCPConnection.connect(to: SocketAddress(address, port: url.port), from: path.source,
                                                       device: path.interface, mark: mark, deadline: deadline)
            } catch {
                return failed("\(error)")
            }
            local = connection.local.map { SocketEndpoint($0.ip, port: $0.port) }
            let session = try TLSSession(over: connection, serverName: IPAddress(url.host) == nil ? url.host : nil)
            try session.handshake(deadline: deadline)
            guard let key = KeyPin(hash: try session.serverKeyHash()) else { return failed("the server's key did not hash") }
            shown = key
            // Nothing is asked of a server that is not the pinned one.
            guard shown == pin else { return failed("\(url.host) showed the key \(shown), not the pinned \(pin)") }
            try session.write(Array(url.request.utf8), deadline: deadline)
            answer = try session.read(limit: PortalCheck.answerLimit, deadline: deadline)
        } catch {
            return failed("\(url.host): \(error)")
        }
        if answer.isEmpty { return failed("no answer from \(url.host) in \(PortalCheck.timeout.short)") }
        switch PortalCheck(url: url, expect: expect).judge(answer) {
        case .online:
            // Said once, or not at all: two answers to one question are none.
            let saids = Self.seenHeaders(in: answer)
            let said = saids.count == 1 ? saids[0] : nil
            let proof = KeyProof(pin: shown, path: path.id, local: local, seen: said.flatMap { SocketEndpoint(parsing: $0) })
            guard direct, !proof.isDirect else { return .success(proof) }
            // The rule asks for a server that saw this laptop itself: a network that relays the
            // connection to the real server (or translates it) reaches the key, not the office.
            guard let said else {
                return failed("\(url.host) did not say where it saw the connection come from (one '\(Self.seenHeader)' header, "
                    + "\(saids.count) given)")
            }
            return failed("\(url.host) saw the connection come from \(proof.seen.map(\.description) ?? "'\(said)'"), "
                + "not from \(local.map(\.description) ?? "this laptop"): something between relays or translates it")
        case .portal: return failed("\(url.host) answered, but not as the rule expects")
        case .unknown(let why): return failed(why)
        }
    }
}
