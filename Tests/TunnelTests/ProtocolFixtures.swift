import Foundation
import Basics
import Testing
@testable import Tunnel
import Device

/// Keys, users and a connected pair of cores, shared by the protocol tests.
struct ProtocolFixture {
    static let clientAddress = SocketAddress(.v4(0xC000_0201), port: 40_000)  // 192.0.2.1
    static let roamedAddress = SocketAddress(.v4(0xC633_6401), port: 50_000)  // 198.51.100.1
    static let attackerAddress = SocketAddress(.v4(0xCB00_7101), port: 666)  // 203.0.113.1
    static let innerV4 = IPAddress("10.9.0.2")!
    static let innerV6 = IPAddress("fd00::2")!
    static let wall = TAI64N(unixNanoseconds: 1_700_000_000_000_000_000)

    let serverKey: PrivateKey
    let clientKey: PrivateKey
    var server: ServerCore
    var client: ClientCore
    var now = Instant(nanoseconds: 1_000_000_000)

    /// A server whose only user is the client's key (plus `extraUsers`), and that client.
    init(
        users extraUsers: [User] = [], credentials: Credentials? = nil, keyUser: Bool = true, dns: DNSSettings = .none,
        limits: ServerLimits = ServerLimits(), sessionLimits: SessionLimits = SessionLimits(), acceptedSources: [Prefix]? = nil,
        version: UInt8 = 2, cipher: CipherSuite? = nil, protocols: ProtocolPolicy = ProtocolPolicy()
    ) throws {
        serverKey = try PrivateKey.generate()
        clientKey = try PrivateKey.generate()
        var users = extraUsers
        if keyUser { users.insert(User(publicKey: clientKey.publicKey, addresses: [Self.innerV4, Self.innerV6]), at: 0) }
        server = try ServerCore(privateKey: serverKey, users: UserDatabase(users), dns: dns, limits: limits, sessionLimits: sessionLimits,
                                protocols: protocols)
        client = try ClientCore(
            privateKey: clientKey, serverKey: serverKey.publicKey, credentials: credentials, limits: sessionLimits,
            acceptedSources: acceptedSources, version: version, cipher: cipher)
    }

    /// What a handshake run to its end (`handshake`) came to at both ends.
    struct Outcome {
        /// The server's event for the last datagram it took.
        var server: ServerEvent
        /// The client's event for the last datagram it took; nil when the server sent nothing back.
        var client: ClientEvent?
        /// Datagrams each way, for counting and tampering.
        var sent: [[UInt8]] = []
        var received: [[UInt8]] = []
    }

    /// Runs a handshake of the fixture's client (either version) from `source` until it ends
    /// or nothing is left to send, as the drivers do: cookie replies answered, password checks
    /// run at once, version 3's identity sent. `tamper` may change each datagram to the server.
    mutating func handshake(from source: SocketAddress = clientAddress, wall: TAI64N = wall,
                            tamper: (inout [UInt8]) -> Void = { _ in }) throws -> Outcome {
        var outgoing = try client.initiation(now: now, wallClock: wall)
        var outcome = Outcome(server: .held)
        for _ in 0..<6 {
            var replies: [[UInt8]] = []
            for var datagram in outgoing {
                tamper(&datagram)
                outcome.sent.append(datagram)
                var event = server.receive(&datagram, from: source, now: now)
                if case .checkPassword(let check) = event { event = server.finish(check, verified: check.verify(), now: now) }
                outcome.server = event
                switch event {
                case .cookie(let reply, _), .reply(let reply, _), .handshake(_, let reply, _), .rejected(_, let reply, _):
                    replies.append(reply)
                default:
                    break
                }
            }
            outgoing = []
            for var reply in replies {
                outcome.received.append(reply)
                let event = client.receive(&reply, now: now)
                outcome.client = event
                switch event {
                case .send(let datagrams): outgoing += datagrams
                case .cookie(let resend): outgoing.append(resend)
                default: return outcome
                }
            }
            if outgoing.isEmpty { return outcome }
        }
        return outcome
    }

    /// Runs a handshake from `from`, delivers the confirmation, and returns the peer.
    @discardableResult
    mutating func connect(from source: SocketAddress = clientAddress, wall: TAI64N = wall) throws -> PeerID {
        var initiation = try client.initiate(now: now, wallClock: wall)
        guard case .handshake(let peer, var response, let to) = deliver(&initiation, from: source) else {
            Issue.record("handshake not accepted: \(server.drops)")
            throw FixtureError.failed
        }
        #expect(to == source)
        guard case .established(let done) = client.receive(&response, now: now) else {
            Issue.record("response not accepted: \(client.drops)")
            throw FixtureError.failed
        }
        var confirmation = done.confirmation
        #expect(server.receive(&confirmation, from: source, now: now) == .keepalive(from: peer))
        return peer
    }

    /// Delivers a datagram to the server, running any password check at once, as a driver
    /// would on a worker thread.
    mutating func deliver(_ datagram: inout [UInt8], from source: SocketAddress = clientAddress) -> ServerEvent {
        var sender = client
        defer { client = sender }
        return deliver(&datagram, from: source, by: &sender)
    }

    /// `deliver` for an initiation from another client core than the fixture's.
    mutating func deliver(_ datagram: inout [UInt8], from source: SocketAddress = clientAddress, by sender: inout ClientCore) -> ServerEvent {
        let event = send(&datagram, from: source, by: &sender)
        guard case .checkPassword(let check) = event else { return event }
        return server.finish(check, verified: check.verify(), now: now)
    }

    /// Delivers a datagram to the server and answers a cookie reply as a client does (the core
    /// stamps mac2 and the driver sends the same initiation again); password checks are left
    /// for the caller. `datagram` ends as what was sent last (with mac2 after a cookie).
    mutating func send(_ datagram: inout [UInt8], from source: SocketAddress = clientAddress) -> ServerEvent {
        var sender = client
        defer { client = sender }
        return send(&datagram, from: source, by: &sender)
    }

    /// `send` for an initiation from another client core than the fixture's.
    mutating func send(_ datagram: inout [UInt8], from source: SocketAddress = clientAddress, by sender: inout ClientCore) -> ServerEvent {
        var event = server.receive(&datagram, from: source, now: now)
        for _ in 0..<2 {
            guard case .cookie(var reply, let to) = event else { return event }
            #expect(to == source)
            guard case .cookie(let resend) = sender.receive(&reply, now: now) else { return event }
            datagram = resend
            event = server.receive(&datagram, from: source, now: now)
        }
        return event
    }

    /// An IPv4 packet from `source` to `destination` with `payload`.
    static func ipv4(from source: IPAddress = innerV4, to destination: IPAddress = IPAddress("10.9.0.1")!, payload: [UInt8] = [1, 2, 3]) -> [UInt8] {
        var packet = [UInt8](repeating: 0, count: 20) + payload
        packet[0] = 0x45
        packet[2] = UInt8(packet.count >> 8)
        packet[3] = UInt8(packet.count & 0xFF)
        packet[9] = 17
        packet.replaceSubrange(12..<16, with: source.bytes)
        packet.replaceSubrange(16..<20, with: destination.bytes)
        return packet
    }

    /// A datagram from the client carrying `packet`.
    mutating func clientDatagram(_ packet: [UInt8] = ipv4()) throws -> [UInt8] {
        var framed = DataPacket.frame(packet)
        try client.seal(&framed, now: now)
        return framed
    }

    /// A datagram from the server to `peer` carrying `packet`.
    mutating func serverDatagram(_ packet: [UInt8], to peer: PeerID) throws -> [UInt8] {
        var framed = DataPacket.frame(packet)
        _ = try server.seal(&framed, to: peer, now: now)
        return framed
    }

    enum FixtureError: Error { case failed }
}

/// Bytes from hex text.
func hex(_ text: String) -> [UInt8] { KnownAnswer.hex(text) }

/// A JSON file of Tests/Fixtures (vectors another implementation computed), decoded; nil when
/// it is missing or does not decode, which the tests that need it then report.
func loadFixture<T: Decodable>(_ name: String, as type: T.Type) -> T? {
    let file = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures/" + name)
    return try? JSONDecoder().decode(T.self, from: Data(contentsOf: file))
}
