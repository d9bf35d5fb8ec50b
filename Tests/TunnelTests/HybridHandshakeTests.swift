import Foundation
import Basics
import Testing
@testable import Tunnel

/// Version 3's handshake against an independent implementation written from docs/PROTOCOL.md
/// (`Tests/Fixtures/handshake-v3.py`: Python's `cryptography` and kyber-py), every random input
/// fixed: both sides reproduce every message byte for byte, the transport keys, and the data
/// packets sealed with the negotiated AES-256-GCM.
struct HybridHandshakeTests {
    struct Fixture: Decodable {
        var server_static, client_static, client_ephemeral, server_ephemeral, kem_seed, kem_entropy: String
        var client_index, server_index: UInt32
        var offer, choice, credentials, verdict: String
        var part_a, part_b, response, identity, verdict_message, handshake_hash, to_server, to_client: String
        var packets: [Packet]
        struct Packet: Decodable {
            var from: String
            var counter: UInt64
            var inner: String
            var datagram: String
        }
    }

    static let fixture = loadFixture("handshake-v3.json", as: Fixture.self)
    static func key(_ text: String) -> PrivateKey { PrivateKey(bytes: hex(text))! }
    static func le32(_ value: UInt32) -> [UInt8] { withUnsafeBytes(of: value.littleEndian, Array.init) }
    static func secret(_ s: SecretBytes) -> [UInt8] { s.withBytes { Array(UnsafeBufferPointer(start: $0, count: 32)) } }

    /// A message with mac1 stamped and a zero mac2, as the fixture's are.
    static func stamped(_ body: [UInt8], serverKey: PublicKey) -> [UInt8] {
        var message = body + [UInt8](repeating: 0, count: 32)
        Mac1(serverKey: serverKey).stamp(&message)
        return message
    }

    @Test func bothSidesReproduceAnIndependentTranscript() throws {
        let f = try #require(Self.fixture, "Tests/Fixtures/handshake-v3.json is missing")
        let serverStatic = Self.key(f.server_static)
        let clientStatic = Self.key(f.client_static)
        let serverKey = serverStatic.publicKey

        // The client's initiation, in its two datagrams.
        let kem = MLKEM.KeyPair(seed: hex(f.kem_seed))
        let (initiator, kemKey, rest) = try #require(HybridHandshake.Initiator.start(
            serverKey: serverKey, ephemeral: Self.key(f.client_ephemeral), kem: kem, offer: hex(f.offer)))
        let partA = Self.stamped([3, 1, 0, 0] + Self.le32(f.client_index) + kemKey, serverKey: serverKey)
        let partB = Self.stamped([3, 6, 0, 0] + Self.le32(f.client_index) + rest, serverKey: serverKey)
        #expect(partA == hex(f.part_a))
        #expect(partB == hex(f.part_b))

        // The server reads them and responds.
        let responder = try #require(HybridHandshake.Responder(
            kemKey: Array(partA[8..<(8 + MLKEM.publicKeyLength)]), ephemeralKey: Array(partB[8..<40]),
            sealedOffer: Array(partB[40..<(partB.count - 32)]), localStatic: serverStatic))
        #expect(responder.offer == hex(f.offer))
        let (awaiting, ephemeralKey, ciphertext, sealedChoice) = try #require(responder.respond(
            ephemeral: Self.key(f.server_ephemeral), choice: hex(f.choice), entropy: hex(f.kem_entropy)))
        let response = [3, 2, 0, 0] + Self.le32(f.server_index) + Self.le32(f.client_index) + ephemeralKey + ciphertext + sealedChoice
        #expect(response == hex(f.response))

        // The client reads the response and says who it is.
        let (identifying, choice) = try #require(initiator.read(
            response: Array(response[12..<44]), ciphertext: Array(response[44..<1132]), sealedChoice: Array(response[1132...])))
        #expect(choice == hex(f.choice))
        let (waiting, sealedKey, sealedPayload) = try #require(identifying.identify(as: clientStatic, payload: hex(f.credentials)))
        let identity = [3, 7, 0, 0] + Self.le32(f.server_index) + sealedKey + sealedPayload
        #expect(identity == hex(f.identity))

        // The server reads the identity and gives its verdict.
        let (identified, remoteStatic, payload) = try #require(awaiting.read(sealedKey: Array(identity[8..<56]), sealedPayload: Array(identity[56...])))
        #expect(remoteStatic == clientStatic.publicKey)
        #expect(payload.withBytes(Array.init) == hex(f.credentials))
        let server = identified.verdict(hex(f.verdict))
        let verdict = [3, 8, 0, 0] + Self.le32(f.server_index) + Self.le32(f.client_index) + server.sealed
        #expect(verdict == hex(f.verdict_message))
        #expect(server.hash == hex(f.handshake_hash))

        // The client reads the verdict: both hold the same keys, the fixture's.
        let client = try #require(waiting.read(verdict: Array(verdict[12...])))
        #expect(client.payload == hex(f.verdict))
        #expect(client.hash == server.hash)
        #expect(client.keys.send.matches(hex(f.to_server)) && server.keys.receive.matches(hex(f.to_server)))
        #expect(client.keys.receive.matches(hex(f.to_client)) && server.keys.send.matches(hex(f.to_client)))

        // Data on the chosen suite, AES-256-GCM, as the other implementation sealed it.
        for packet in f.packets {
            let keys = packet.from == "client" ? client.keys : server.keys
            let sealer = AEADKey(.aes256GCM, key: keys.send)
            var datagram = Array(hex(packet.datagram)[..<16]) + hex(packet.inner) + [UInt8](repeating: 0, count: 16)
            let end = datagram.count - 16
            datagram.withUnsafeMutableBytes { buffer in
                sealer.seal(counter: packet.counter, ad: UnsafeRawBufferPointer(rebasing: buffer[..<16]),
                            text: UnsafeMutableRawBufferPointer(rebasing: buffer[16..<end]), tag: buffer.baseAddress! + end)
            }
            #expect(datagram == hex(packet.datagram), "\(packet.from) \(packet.counter)")
        }
    }

    /// Every byte of every message matters: a flip anywhere in the initiation's parts, the
    /// response or the identity fails the handshake at the next authenticated step, never
    /// silently.
    @Test func aFlippedByteFailsTheHandshake() throws {
        let f = try #require(Self.fixture)
        let serverStatic = Self.key(f.server_static)
        let partA = hex(f.part_a), partB = hex(f.part_b), response = hex(f.response), identity = hex(f.identity)
        func serverReads(_ a: [UInt8], _ b: [UInt8]) -> HybridHandshake.Responder? {
            HybridHandshake.Responder(kemKey: Array(a[8..<1192]), ephemeralKey: Array(b[8..<40]), sealedOffer: Array(b[40..<(b.count - 32)]),
                                      localStatic: serverStatic)
        }
        for position in stride(from: 8, to: 1192, by: 97) {
            var a = partA
            a[position] ^= 1
            #expect(serverReads(a, partB) == nil, "a flip at \(position) of the KEM key went unnoticed")
        }
        for position in 8..<(partB.count - 32) {
            var b = partB
            b[position] ^= 1
            #expect(serverReads(partA, b) == nil, "a flip at \(position) of the second part went unnoticed")
        }
        let (initiator, _, _) = try #require(HybridHandshake.Initiator.start(
            serverKey: serverStatic.publicKey, ephemeral: Self.key(f.client_ephemeral), kem: MLKEM.KeyPair(seed: hex(f.kem_seed)),
            offer: hex(f.offer)))
        for position in stride(from: 12, to: response.count, by: 7) {
            var r = response
            r[position] ^= 1
            #expect(initiator.read(response: Array(r[12..<44]), ciphertext: Array(r[44..<1132]), sealedChoice: Array(r[1132...])) == nil,
                    "a flip at \(position) of the response went unnoticed")
        }
        let responder = try #require(serverReads(partA, partB))
        let (awaiting, _, _, _) = try #require(responder.respond(ephemeral: Self.key(f.server_ephemeral), choice: hex(f.choice),
                                                                  entropy: hex(f.kem_entropy)))
        for position in stride(from: 8, to: identity.count, by: 5) {
            var i = identity
            i[position] ^= 1
            #expect(awaiting.read(sealedKey: Array(i[8..<56]), sealedPayload: Array(i[56...])) == nil, "a flip at \(position) of the identity")
        }
        #expect(awaiting.read(sealedKey: Array(identity[8..<56]), sealedPayload: Array(identity[56...])) != nil, "the real one still reads")
    }
}

/// Garbage and mutants of every version 3 message (random bytes, truncations, extensions, byte
/// flips, parts swapped between messages) go through the parser and every handshake step
/// without a crash, and none of them is taken: only the unmodified messages complete.
@Test(arguments: [UInt64(3), 0xBADC0DE, 0x7E57_7E57])
func versionThreeGarbageAndMutantsAreRefused(seed: UInt64) throws {
    let f = try #require(HybridHandshakeTests.fixture)
    var random = SeededRandom(seed: seed)
    let serverStatic = HybridHandshakeTests.key(f.server_static)
    let originals = [f.part_a, f.part_b, f.response, f.identity, f.verdict_message].map(hex)
    let (initiator, _, _) = try #require(HybridHandshake.Initiator.start(
        serverKey: serverStatic.publicKey, ephemeral: HybridHandshakeTests.key(f.client_ephemeral),
        kem: MLKEM.KeyPair(seed: hex(f.kem_seed)), offer: hex(f.offer)))
    let responder = try #require(HybridHandshake.Responder(
        kemKey: Array(originals[0][8..<1192]), ephemeralKey: Array(originals[1][8..<40]),
        sealedOffer: Array(originals[1][40..<72]), localStatic: serverStatic))
    let (awaiting, _, _, _) = try #require(responder.respond(
        ephemeral: HybridHandshakeTests.key(f.server_ephemeral), choice: hex(f.choice), entropy: hex(f.kem_entropy)))
    var taken = 0
    for round in 0..<400 {
        var bytes: [UInt8]
        switch round % 4 {
        case 0: bytes = (0..<random.below(1400)).map { _ in random.byte() }
        case 1:
            bytes = originals[random.below(originals.count)]
            for _ in 0..<(1 + random.below(4)) { bytes[random.below(bytes.count)] ^= UInt8(1 + random.below(255)) }
        case 2: bytes = Array(originals[random.below(originals.count)].prefix(random.below(1300)))
        default: bytes = originals[random.below(originals.count)] + (0..<(1 + random.below(40))).map { _ in random.byte() }
        }
        if random.below(3) == 0 { bytes[0] = 3 }  // often past the version check
        _ = bytes.withUnsafeBytes { WireV3.kind(of: $0) }
        // Whatever the parser says, each step is given the mutant's bytes where its real message's go.
        if bytes.count >= 1192, bytes.count >= 72,
           HybridHandshake.Responder(kemKey: Array(bytes[8..<1192]), ephemeralKey: Array(bytes[8..<40]), sealedOffer: Array(bytes[40..<72]),
                                     localStatic: serverStatic) != nil { taken += 1 }
        if bytes.count >= 104, HybridHandshake.Responder(kemKey: Array(originals[0][8..<1192]), ephemeralKey: Array(bytes[8..<40]),
                                                         sealedOffer: Array(bytes[40..<72]), localStatic: serverStatic) != nil,
           bytes[8..<72] != originals[1][8..<72] { taken += 1 }
        if bytes.count >= 1164, bytes[12..<1164] != originals[2][12..<1164],
           initiator.read(response: Array(bytes[12..<44]), ciphertext: Array(bytes[44..<1132]), sealedChoice: Array(bytes[1132..<1164])) != nil {
            taken += 1
        }
        if bytes.count >= 72, bytes[8...] != originals[3][8...], awaiting.read(sealedKey: Array(bytes[8..<56]), sealedPayload: Array(bytes[56...])) != nil {
            taken += 1
        }
    }
    #expect(taken == 0, "a mutant was taken as a real message")
}

/// The client core speaking version 3 against the independent implementation's server side:
/// with the fixture's keys it frames both parts of the initiation as the fixture does, answers
/// the fixture's response with the fixture's identity byte for byte, takes the verdict, and its
/// first packet (the confirmation keepalive, on AES-256-GCM) is the fixture's.
@Test func theClientCoreSpeaksVersionThreeAsTheIndependentImplementationDoes() throws {
    let f = try #require(HybridHandshakeTests.fixture)
    let credentials = try #require(Credentials(username: "alice", password: "correct horse battery staple"))
    var client = try ClientCore(privateKey: HybridHandshakeTests.key(f.client_static),
                                serverKey: HybridHandshakeTests.key(f.server_static).publicKey, credentials: credentials, version: 3)
    #expect(client.version == 3)
    // The fixture offers both suites and prefers AES-256-GCM with AES in hardware, as this
    // client does on a machine that has it; elsewhere its offer (and so the fixture) differs.
    guard CipherSuite.aesInHardware else {
        print("skipping the byte-for-byte client check: no AES in hardware here, so the client's offer differs from the fixture's")
        return
    }
    let parts = try client.hybridInitiation(now: .zero, ephemeral: HybridHandshakeTests.key(f.client_ephemeral),
                                            kem: MLKEM.KeyPair(seed: hex(f.kem_seed)), index: f.client_index)
    #expect(parts == [hex(f.part_a), hex(f.part_b)])
    #expect(client.isHandshaking)

    var response = hex(f.response)
    guard case .send(let identity) = client.receive(&response, now: .zero + .milliseconds(5)) else {
        Issue.record("the response did not produce the identity")
        return
    }
    #expect(identity == [hex(f.identity)])
    // The same response again is not for a handshake at that stage any more.
    var again = hex(f.response)
    #expect(client.receive(&again, now: .zero + .milliseconds(6)) == .dropped(.unexpected))

    var verdict = hex(f.verdict_message)
    guard case .established(let completion) = client.receive(&verdict, now: .zero + .milliseconds(10)) else {
        Issue.record("the verdict did not establish the session")
        return
    }
    #expect(completion.addresses == [IPAddress("10.77.0.2")!])
    #expect(client.session == SessionProtocol(version: 3, cipher: .aes256GCM))
    #expect(completion.rtt == .milliseconds(10))
    let confirmation = try #require(f.packets.first { $0.from == "client" && $0.counter == 0 })
    #expect(completion.confirmation == hex(confirmation.datagram), "the first packet, sealed with AES-256-GCM as the fixture's")
    // And the server's packets open.
    let fromServer = try #require(f.packets.first { $0.from == "server" && $0.counter == 1 })
    var packet = hex(fromServer.datagram)
    guard case .packet(let range) = client.receive(&packet, now: .zero + .milliseconds(11)) else {
        Issue.record("the server's packet did not open")
        return
    }
    #expect(Array(packet[range]) == hex(fromServer.inner))
}

/// A version 3 client refuses a server's choice it did not offer (after the response
/// authenticated), and a version 2 datagram is not for it.
@Test func aVersionThreeClientKeepsToItsOffer() throws {
    let f = try #require(HybridHandshakeTests.fixture)
    let serverStatic = HybridHandshakeTests.key(f.server_static)
    var client = try ClientCore(privateKey: HybridHandshakeTests.key(f.client_static), serverKey: serverStatic.publicKey,
                                version: 3, cipher: .chacha20Poly1305)
    let parts = try client.initiation(now: .zero, wallClock: .now())
    #expect(parts.count == 2 && parts[0].count == WireV3.KEMKeyPart.length && parts[1].count == WireV3.RestPart.length)
    let responder = try #require(HybridHandshake.Responder(
        kemKey: Array(parts[0][8..<1192]), ephemeralKey: Array(parts[1][8..<40]), sealedOffer: Array(parts[1][40..<72]),
        localStatic: serverStatic))
    #expect(WireV3.Offer(decoding: responder.offer)?.suites == [.chacha20Poly1305], "a pinned client offers only its suite")
    // A server that picks AES-256-GCM anyway.
    let (_, ephemeralKey, ciphertext, sealedChoice) = try #require(responder.respond(
        ephemeral: .random(), choice: WireV3.Choice(suite: .aes256GCM).encoded()))
    let index = parts[0][4..<8]
    var response = WireV3.header(.response) + [1, 0, 0, 0] + Array(index) + ephemeralKey + ciphertext + sealedChoice
    #expect(client.receive(&response, now: .zero + .milliseconds(5)) == .rejected)
    #expect(!client.isHandshaking)
    var old = [UInt8](repeating: 0, count: 32)
    old[0] = 2
    old[1] = 3
    #expect(client.receive(&old, now: .zero + .milliseconds(6)) == .dropped(.unsupportedVersion))
}
