import Basics
import Testing
@testable import Tunnel
import Device

/// Floods from senders that really receive at their addresses: a routed IPv6 prefix (256 /64s
/// of one /56) and many IPv4 /24s, each answering every cookie reply. They are held to their
/// networks' budgets and the server's, and the peers with a session keep rekeying in a lane of
/// their own that no flood can spend.
@Suite struct ProtocolFloodTests {
    /// Senders that answer cookie replies, as a determined flooder with real addresses does: each
    /// source keeps the initiation it proved and sends it again and again (a stranger's key, so
    /// each one admitted costs the server its Diffie-Hellman and a refusal).
    struct Flooder {
        let sources: [SocketAddress]
        private var cores: [ClientCore]
        private var initiations: [[UInt8]]
        /// Initiations of each network that got past the cheap checks.
        private(set) var admitted: [IPAddress: Int] = [:]
        private(set) var sent = 0

        init(sources: [SocketAddress], server: PublicKey) throws {
            self.sources = sources
            cores = try sources.map { _ in try ClientCore(privateKey: .generate(), serverKey: server) }
            initiations = []
            for i in cores.indices { initiations.append(try cores[i].initiate(now: Instant(nanoseconds: 1), wallClock: ProtocolFixture.wall)) }
        }

        /// Sends source `i`'s initiation; takes the cookie of a cookie reply for the next one.
        mutating func send(_ i: Int, to server: inout ServerCore, now: Instant) {
            sent += 1
            var datagram = initiations[i]
            switch server.receive(&datagram, from: sources[i], now: now) {
            case .cookie(var reply, _):
                if case .cookie(let resend) = cores[i].receive(&reply, now: now) { initiations[i] = resend }
            case .rejected, .handshake:
                admitted[Self.network(sources[i].ip), default: 0] += 1
            default: break
            }
        }

        static func network(_ address: IPAddress) -> IPAddress {
            switch address {
            case .v4(let a): .v4(a & 0xFFFF_FF00)
            case .v6(let high, _): .v6(high & 0xFFFF_FFFF_FFFF_0000, 0)
            }
        }
    }

    /// A key user's client and where it sends from.
    struct Peer {
        var core: ClientCore
        let source: SocketAddress
        var rekeys = 0
        var completed = 0
    }

    /// Handshakes `peer` from its address, answering a cookie reply as a client does, and
    /// confirms the session; true when it completed.
    static func handshake(_ peer: inout Peer, with server: inout ServerCore, now: Instant, wall: TAI64N) throws -> Bool {
        var datagram = try peer.core.initiate(now: now, wallClock: wall)
        var event = server.receive(&datagram, from: peer.source, now: now)
        if case .cookie(var reply, _) = event, case .cookie(var resend) = peer.core.receive(&reply, now: now) {
            event = server.receive(&resend, from: peer.source, now: now)
        }
        guard case .handshake(let id, var response, _) = event, case .established(let done) = peer.core.receive(&response, now: now)
        else { return false }
        var confirmation = done.confirmation
        return server.receive(&confirmation, from: peer.source, now: now) == .keepalive(from: id)
    }

    /// 256 /64s of 2001:db8:56::/56 and 200 IPv4 /24s flood at 6,000 proven initiations a second
    /// for 3 s; four peers with sessions rekey every half second throughout. Every rekey
    /// completes, although the flood used up the server-wide budget of everyone without a
    /// session, and the /56 never got more than its /48's budget; a newcomer from a quiet network
    /// (a first login) gets in every time, from the part of the budget kept for quiet networks.
    @Test func aFloodFromRealAddressesCannotSpendThePeersLane() throws {
        let keys = try (0..<4).map { _ in try PrivateKey.generate() }
        let users = keys.enumerated().map { i, key in User(publicKey: key.publicKey, addresses: [.v4(0x0A09_0100 + UInt32(i))]) }
        var f = try ProtocolFixture(users: users, keyUser: false)
        var peers = try keys.enumerated().map { i, key in
            Peer(core: try ClientCore(privateKey: key, serverKey: f.serverKey.publicKey),
                 source: SocketAddress(.v4(0xC000_0210 + UInt32(i)), port: 40_000))  // 192.0.2.16...
        }
        var wall = ProtocolFixture.wall
        for i in peers.indices { #expect(try Self.handshake(&peers[i], with: &f.server, now: f.now, wall: wall), "peer \(i) connects") }
        let v6 = (0..<256).map { SocketAddress(.v6(0x2001_0db8_0056_0000 | UInt64($0), 0x1), port: 5000) }
        let v4 = (0..<200).map { SocketAddress(.v4(0x6440_0002 | UInt32($0) << 8), port: 5000) }  // 100.64.N.2
        var flood = try Flooder(sources: v6 + v4, server: f.serverKey.publicKey)
        var newcomer = try ClientCore(privateKey: .generate(), serverKey: f.serverKey.publicKey)
        var (newcomerRefused, newcomerTries) = (0, 0)
        let start = f.now
        for step in 0..<3000 {  // a millisecond each
            f.now = start + .milliseconds(step)
            for n in 0..<6 { flood.send((step * 6 + n) % flood.sources.count, to: &f.server, now: f.now) }
            if step % 500 == 250 {
                wall = wall.successor
                for i in peers.indices {
                    peers[i].rekeys += 1
                    if try Self.handshake(&peers[i], with: &f.server, now: f.now, wall: wall) { peers[i].completed += 1 }
                }
                var initiation = try newcomer.initiate(now: f.now, wallClock: wall)
                newcomerTries += 1
                if case .dropped = f.send(&initiation, from: SocketAddress(.v4(0xCB00_7150), port: 4000), by: &newcomer) {
                    newcomerRefused += 1
                }
            }
        }
        for (i, peer) in peers.enumerated() {
            #expect(peer.rekeys == 6 && peer.completed == peer.rekeys, "peer \(i): \(peer.completed) of \(peer.rekeys) rekeys")
        }
        #expect(flood.sent == 18_000)
        #expect(f.server.drops[.serverLimited] > 1000, "the flood used up the budget of everyone without a session: \(f.server.drops)")
        #expect(newcomerTries == 6 && newcomerRefused == 0, "a newcomer from a quiet network was refused \(newcomerRefused) of \(newcomerTries) times")
        let prefix = Flooder.network(v6[0].ip)
        let fromPrefix = flood.admitted[prefix] ?? 0
        // The /48's burst and 3 s of its rate, whatever the number of /64s.
        #expect(fromPrefix > 0 && fromPrefix <= 50 + 3 * 20, "the /56 got \(fromPrefix) handshakes")
        #expect(flood.admitted.values.allSatisfy { $0 <= 50 + 3 * 20 })
        // The flood's initiations never reached the lane: only the rekeys did.
        #expect(f.server.admissions.peer <= 4 * 6, "\(f.server.admissions)")
        #expect(f.server.admissions.peer > 0, "the rekeys used their lane while the flood held the rest")
    }

    /// A sender at a peer's address and port without its key (another program on that host)
    /// proves the address, so it is admitted to the peer's lane; once its initiation is read, it
    /// is not the peer, and pays the budgets everyone else pays. The peer still rekeys in its lane.
    @Test func thePeersLaneIsTheKeyHoldersOnly() throws {
        var f = try ProtocolFixture(limits: ServerLimits(handshakesPerSource: .init(perSecond: 1, burst: 2)))
        try f.connect()
        var other = try ClientCore(privateKey: .generate(), serverKey: f.serverKey.publicKey)
        var outcomes: [String] = []
        for _ in 0..<4 {
            var initiation = try other.initiate(now: f.now, wallClock: ProtocolFixture.wall)
            switch f.send(&initiation, from: ProtocolFixture.clientAddress, by: &other) {
            case .rejected(.unknownUser, _, _): outcomes.append("refused")
            case .dropped(let reason): outcomes.append("\(reason)")
            case let event: outcomes.append("\(event)")
            }
        }
        // The source's burst of 2 (one spent by the peer's own handshake), then its limit.
        #expect(outcomes == ["refused", "rate-limited", "rate-limited", "rate-limited"], "\(outcomes)")
        #expect(f.server.admissions.peer == 0, "\(f.server.admissions)")
        f.now = f.now + .milliseconds(100)
        try f.connect()
        #expect(f.server.admissions.peer == 1, "past the spent source budget, in the lane: \(f.server.admissions)")
    }

    /// Checks that cannot succeed (a name nobody has, a key the user does not pin) never spend an
    /// account's Argon2id budget, however many there are; a wrong password spends it only once
    /// the sender's own budgets allowed the check.
    @Test func onlyChecksThatCouldSucceedSpendAnAccountsBudget() throws {
        let hash = try PasswordHash.create(password: "right", cost: .minimum)
        let carolKey = try PrivateKey.generate()
        let users = [
            User(name: "alice", addresses: [IPAddress("10.9.0.5")!], passwordHash: hash),
            User(name: "carol", publicKey: carolKey.publicKey, addresses: [IPAddress("10.9.0.7")!], passwordHash: hash),
        ]
        let limits = ServerLimits(passwordChecks: .init(perSecond: 1000, burst: 1000))
        var f = try ProtocolFixture(users: users, keyUser: false, limits: limits)
        var source = 0
        func attempt(_ name: String, _ password: String, key: PrivateKey? = nil, from address: SocketAddress? = nil) throws -> String {
            source += 1
            var client = try ClientCore(privateKey: key ?? .generate(), serverKey: f.serverKey.publicKey,
                                        credentials: Credentials(username: name, password: password))
            var initiation = try client.initiate(now: f.now, wallClock: TAI64N(unixNanoseconds: 1_800_000_000_000_000_000 + UInt64(source)))
            // Each from a /24 of its own unless told: only the account's budget can refuse.
            let from = address ?? SocketAddress(.v4(0x0B00_0001 | UInt32(source) << 8), port: 4000)
            switch f.deliver(&initiation, from: from, by: &client) {
            case .handshake: return "in"
            case .rejected(let reason, _, _): return "\(reason)"
            case .dropped(let reason): return "\(reason)"
            case let event: return "\(event)"
            }
        }
        // Carol pins a key: guesses with any other key are decoys, and alice's name and made-up
        // ones are claims of their own.
        let decoys = try (0..<20).map { _ in try attempt("carol", "guess") }
        #expect(decoys == Array(repeating: "wrong-key", count: 4) + Array(repeating: "account-limited", count: 16), "\(decoys)")
        #expect(try attempt("carol", "right", key: carolKey) == "in", "the decoys spent nothing of carol's")
        for i in 0..<20 { #expect(try attempt("zed\(i)", "guess") == "unknown-user") }
        // A made-up name has a budget of its own, spent as an account's would be: alike to a prober.
        let zed = (0..<6).map { _ in (try? attempt("zed", "guess")) ?? "" }
        #expect(zed == ["unknown-user", "unknown-user", "unknown-user", "unknown-user", "account-limited", "account-limited"], "\(zed)")
        // From one source past its budget, wrong passwords for alice are refused before her account is looked at.
        let attacker = SocketAddress(.v4(0xCB00_7101), port: 666)
        let fromOne = try (0..<10).map { _ in try attempt("alice", "guess", from: attacker) }
        #expect(fromOne.filter { $0 == "bad-password" }.count == 2 && fromOne.filter { $0 == "rate-limited" }.count == 8, "\(fromOne)")
        #expect(try attempt("alice", "right") == "in", "alice's budget had 2 of 4 spent")
    }

    /// The decoy Argon2id costs what the claimed user's own check costs; a name nobody has costs
    /// one of the costs in use, the same each time, spread over the costs as the users are.
    @Test func theDecoyCostsWhatTheClaimedUsersCheckCosts() throws {
        let cheap = try PasswordHash.create(password: "a", cost: .minimum)
        let dearer = try PasswordHash.create(password: "b", cost: PasswordCost(operations: 2, memory: 16 << 10))
        #expect(cheap.parameters != dearer.parameters)
        let decoys = DecoyHashes(costOf: [cheap, dearer, dearer])
        #expect(decoys.matching(cheap).parameters == cheap.parameters)
        #expect(decoys.matching(dearer).parameters == dearer.parameters)
        #expect(!decoys.matching(dearer).verify("b"), "no password matches a decoy")
        var counts: [String: Int] = [:]
        for i in 0..<300 {
            let claim = Array("user\(i)".utf8)
            let parameters = decoys.forUnknown(claim).parameters ?? ""
            #expect(decoys.forUnknown(claim).parameters == parameters, "the same claim, the same cost")
            counts[parameters, default: 0] += 1
        }
        #expect(Set(counts.keys) == [cheap.parameters!, dearer.parameters!])
        // A third of the users have the cheap cost: so have about a third of the made-up names.
        #expect((60...140).contains(counts[cheap.parameters!] ?? 0), "\(counts)")

        // Through the server: a key the user does not pin, and a name nobody has.
        let carolKey = try PrivateKey.generate()
        let users = [
            User(name: "alice", addresses: [IPAddress("10.9.0.5")!], passwordHash: cheap),
            User(name: "carol", publicKey: carolKey.publicKey, addresses: [IPAddress("10.9.0.7")!], passwordHash: dearer),
        ]
        var f = try ProtocolFixture(users: users, keyUser: false, limits: ServerLimits(passwordChecks: .init(perSecond: 1000, burst: 1000)))
        func check(_ name: String, from i: UInt32) throws -> PasswordHash? {
            var client = try ClientCore(privateKey: .generate(), serverKey: f.serverKey.publicKey,
                                        credentials: Credentials(username: name, password: "guess"))
            var initiation = try client.initiate(now: f.now, wallClock: ProtocolFixture.wall)
            guard case .checkPassword(let check) = f.send(&initiation, from: SocketAddress(.v4(0x0B00_0001 | i << 8), port: 1), by: &client)
            else { return nil }
            return check.hash
        }
        #expect(try check("carol", from: 1)?.parameters == dearer.parameters, "carol's wrong key costs carol's check")
        #expect(try check("alice", from: 2)?.parameters == cheap.parameters)
        let unknown = try (3..<25).compactMap { try check("nobody\($0)", from: $0)?.parameters }
        #expect(unknown.count == 22 && Set(unknown) == [cheap.parameters!, dearer.parameters!], "\(unknown)")
    }
}
