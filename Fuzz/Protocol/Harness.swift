import Basics
import Device
import Tunnel

/// A gateway's core and a version 3 client's core with a live session between them, and every
/// message of a real handshake of each version and of the session as seeds. Each input is one
/// datagram for one of the two: its first byte says which core (bit 0), from which of three
/// sources (bits 1 and 2), and whether to give it a good mac1 first, as anyone who knows the
/// server's key can (bit 3); the rest is the datagram. Nothing may crash; no input may open a
/// packet, complete a handshake or give either side a session it did not have: the inputs
/// were never sent by either core in this run.
struct Harness {
    var server: ServerCore
    var client: ClientCore
    let mac1: Mac1
    var now = Instant(nanoseconds: 1_000_000_000)
    /// Real messages, each delivered once already (a copy is a replay).
    var seeds: [(selector: UInt8, datagram: [UInt8])] = []
    let sessionsAtStart: Int
    /// Inputs fed so far, each a millisecond on the cores' clock.
    private(set) var inputs = 0

    static let sources = [SocketAddress(.v4(0xC000_0201), port: 40_000), SocketAddress(.v4(0xC633_6401), port: 50_000),
                          SocketAddress(.v4(0xCB00_7101), port: 666)]

    init() throws {
        let serverKey = try PrivateKey.generate(), clientKey = try PrivateKey.generate()
        let hash = try PasswordHash.create(password: "correct horse battery", cost: .minimum)
        let users = try UserDatabase([
            User(publicKey: clientKey.publicKey, addresses: [IPAddress("10.9.0.2")!]),
            User(name: "carol", addresses: [IPAddress("10.9.0.7")!], passwordHash: hash),
        ])
        // Budgets that never refuse: the fuzzer is to reach what lies behind them.
        let open = ServerLimits.Rate(perSecond: 1e9, burst: 1e9)
        server = try ServerCore(privateKey: serverKey, users: users,
                                limits: ServerLimits(handshakesPerSource: open, handshakesPerNetwork: open, handshakes: open))
        client = try ClientCore(privateKey: clientKey, serverKey: serverKey.publicKey, version: 3)
        mac1 = Mac1(serverKey: serverKey.publicKey)
        let from = Self.sources[0]

        // Version 3, start to end.
        var parts = try client.initiation(now: now, wallClock: .now())
        seeds += parts.map { (0, $0) }
        _ = server.receive(&parts[0], from: from, now: now)
        guard case .reply(var response, _) = server.receive(&parts[1], from: from, now: now) else { throw HarnessError.setUp("no response") }
        seeds.append((1, response))
        guard case .send(var identity) = client.receive(&response, now: now) else { throw HarnessError.setUp("no identity") }
        seeds.append((0, identity[0]))
        guard case .handshake(let peer, var verdict, _) = server.receive(&identity[0], from: from, now: now) else {
            throw HarnessError.setUp("no verdict")
        }
        seeds.append((1, verdict))
        guard case .established(let done) = client.receive(&verdict, now: now) else { throw HarnessError.setUp("no session") }
        var confirmation = done.confirmation
        seeds.append((0, confirmation))
        _ = server.receive(&confirmation, from: from, now: now)

        // The session's packets both ways, a probe and a hint.
        var packet = [UInt8](repeating: 0, count: 20) + Array("fuzz".utf8)
        packet[0] = 0x45
        packet[3] = UInt8(packet.count)
        packet.replaceSubrange(12..<16, with: [10, 9, 0, 2])
        packet.replaceSubrange(16..<20, with: [10, 9, 0, 1])
        var up = DataPacket.frame(packet)
        try client.seal(&up, now: now)
        seeds.append((0, up))
        _ = server.receive(&up, from: from, now: now)
        var down = DataPacket.frame(packet)
        _ = try server.seal(&down, to: peer, now: now)
        seeds.append((1, down))
        _ = client.receive(&down, now: now)
        var probe = try client.probe(id: 9, now: now)
        seeds.append((0, probe))
        _ = server.receive(&probe, from: from, now: now)

        // Version 2, with a password: its initiation (and the cookie reply a password check asks for).
        var carol = try ClientCore(privateKey: PrivateKey.generate(), serverKey: serverKey.publicKey,
                                   credentials: Credentials(username: "carol", password: "correct horse battery"))
        var initiation = try carol.initiate(now: now, wallClock: .now())
        seeds.append((2, initiation))
        if case .cookie(let reply, _) = server.receive(&initiation, from: Self.sources[1], now: now) { seeds.append((3, reply)) }
        sessionsAtStart = server.sessionCount
    }

    /// One input.
    mutating func feed(_ input: UnsafeBufferPointer<UInt8>) {
        guard let selector = input.first else { return }
        var datagram = Array(input.dropFirst())
        let source = Self.sources[Int(selector >> 1 & 3) % Self.sources.count]
        if selector & 8 != 0, datagram.count >= 40 { mac1.stamp(&datagram) }
        now = now + .milliseconds(1)
        inputs += 1
        if selector & 1 == 0 {
            var event = server.receive(&datagram, from: source, now: now)
            if case .checkPassword(let check) = event { event = server.finish(check, verified: check.verify(), now: now) }
            switch event {
            case .packet, .handshake, .keepalive, .echo, .closed:
                preconditionFailure("the server took a datagram neither core sent: \(event)")
            default:
                break
            }
            precondition(server.sessionCount == sessionsAtStart, "a session appeared")
            if Int(now.nanoseconds / 1_000_000) % 1000 == 0 { server.tick(now: now) }
        } else {
            switch client.receive(&datagram, now: now) {
            case .packet, .established, .rejected, .probeEcho, .keepalive, .send, .cookie, .draining, .pathMTUAcknowledged:
                preconditionFailure("the client took a datagram neither core sent")
            default:
                break
            }
        }
    }

    enum HarnessError: Error { case setUp(String) }
}
