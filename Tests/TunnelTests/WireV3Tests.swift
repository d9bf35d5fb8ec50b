import Testing
@testable import Tunnel

/// Version 3's messages on the wire: their lengths and kinds, the offer, the choice and the
/// credentials, and how the server picks a cipher.
struct WireV3Tests {
    /// The fixture's messages (an independent implementation's) have the lengths and kinds the
    /// parser expects, and a byte more or less, or another version, is refused.
    @Test func theIndependentMessagesParse() throws {
        let f = try #require(HybridHandshakeTests.fixture)
        for (text, kind) in [(f.part_a, WireV3.Kind.kemKey), (f.part_b, .initiationRest), (f.response, .response),
                            (f.identity, .identity), (f.verdict_message, .verdict)] {
            let bytes = hex(text)
            #expect(bytes.withUnsafeBytes { WireV3.kind(of: $0) } == .success(kind), "\(kind)")
            if kind.lengths.count == 1 {
                #expect((bytes + [0]).withUnsafeBytes { WireV3.kind(of: $0) } == .failure(.malformed), "one byte more: \(kind)")
            }
            if bytes.count == kind.lengths.lowerBound {
                #expect(Array(bytes.dropLast()).withUnsafeBytes { WireV3.kind(of: $0) } == .failure(.malformed), "one byte less: \(kind)")
            }
            var other = bytes
            other[0] = 2
            #expect(other.withUnsafeBytes { WireV3.kind(of: $0) } == .failure(.unsupportedVersion))
            other = bytes
            other[3] = 1
            #expect(other.withUnsafeBytes { WireV3.kind(of: $0) } == .failure(.malformed))
        }
        #expect(WireV3.KEMKeyPart.length == 1224 && WireV3.RestPart.length == 104 && WireV3.ResponseV3.length == 1164)
        #expect(WireV3.Identity.minLength == 328 && WireV3.Identity.maxLength == 584)
        // Credentials come in whole 64-byte blocks: an identity of another length is malformed.
        let identity = hex(f.identity)
        #expect((identity + [UInt8](repeating: 0, count: 64)).withUnsafeBytes { WireV3.kind(of: $0) } == .success(.identity))
        #expect((identity + [UInt8](repeating: 0, count: 32)).withUnsafeBytes { WireV3.kind(of: $0) } == .failure(.malformed))
        #expect(WireV3.Verdict.minLength == 50 && WireV3.Verdict.maxLength == 284)
        // Every handshake datagram fits a 1,280-byte IPv6 path (40 bytes of IPv6, 8 of UDP).
        for length in [WireV3.KEMKeyPart.length, WireV3.RestPart.length, WireV3.ResponseV3.length, WireV3.Identity.maxLength,
                       WireV3.Verdict.maxLength] {
            #expect(length + 48 <= 1280)
        }
        // Never more out than in: the response against the two parts, the verdict against the identity.
        #expect(WireV3.ResponseV3.length <= WireV3.KEMKeyPart.length + WireV3.RestPart.length)
        #expect(WireV3.Verdict.maxLength <= WireV3.Identity.minLength)
        #expect(WireV3.Offer(decoding: hex(f.offer)) == WireV3.Offer(suites: [.chacha20Poly1305, .aes256GCM], preferred: .aes256GCM, aesHardware: true))
        #expect(WireV3.Choice(decoding: hex(f.choice)) == WireV3.Choice(suite: .aes256GCM))
    }

    @Test func offersAndChoicesRoundTripAndBadOnesAreRefused() {
        let offer = WireV3.Offer(suites: [.chacha20Poly1305], preferred: .chacha20Poly1305, aesHardware: false)
        #expect(WireV3.Offer(decoding: offer.encoded()) == offer)
        #expect(WireV3.Offer(decoding: [0] + [UInt8](repeating: 0, count: 15)) == nil, "no suite")
        #expect(WireV3.Offer(decoding: [1, 2] + [UInt8](repeating: 0, count: 14)) == nil, "prefers one it does not offer")
        #expect(WireV3.Offer(decoding: [0b1001, 1] + [UInt8](repeating: 0, count: 14))?.suites == [.chacha20Poly1305], "a later suite bit is ignored")
        #expect(WireV3.Offer(decoding: [1, 1]) == nil, "short")
        #expect(WireV3.Choice(decoding: WireV3.Choice(suite: nil).encoded()) == WireV3.Choice(suite: nil))
        #expect(WireV3.Choice(decoding: [9] + [UInt8](repeating: 0, count: 15)) == nil)
    }

    /// The server pins when told to (and refuses a client that cannot), else AES-256-GCM only
    /// when both sides have AES in hardware.
    @Test(arguments: [
        // offered, client AES, server AES, pinned, chosen
        ([CipherSuite.chacha20Poly1305, .aes256GCM], true, true, CipherSuite?.none, CipherSuite?.some(.aes256GCM)),
        ([.chacha20Poly1305, .aes256GCM], false, true, nil, .chacha20Poly1305),
        ([.chacha20Poly1305, .aes256GCM], true, false, nil, .chacha20Poly1305),
        ([.aes256GCM], false, false, nil, .aes256GCM),
        ([.chacha20Poly1305], true, true, nil, .chacha20Poly1305),
        ([.chacha20Poly1305, .aes256GCM], false, false, .aes256GCM, .aes256GCM),
        ([.chacha20Poly1305], true, true, .aes256GCM, nil),
    ] as [([CipherSuite], Bool, Bool, CipherSuite?, CipherSuite?)])
    func theServerChoosesAsDocumented(_ offered: [CipherSuite], _ clientAES: Bool, _ serverAES: Bool, _ pinned: CipherSuite?, _ chosen: CipherSuite?) {
        let offer = WireV3.Offer(suites: Set(offered), preferred: offered[0], aesHardware: clientAES)
        #expect(WireV3.choose(offer, pinned: pinned, serverHasAES: serverAES) == chosen)
    }

    @Test func credentialsRoundTripAndOverrunsAreRefused() throws {
        var secret = Array("correct horse".utf8)
        let password = try #require(SecretBuffer(taking: &secret))
        let encoded = WireV3.Credentials.encoded(username: Array("alice".utf8), password: password)
        #expect(encoded.count == 256)
        var copy = encoded
        let buffer = try #require(SecretBuffer(taking: &copy))
        let decoded = try #require(WireV3.Credentials.decode(buffer))
        #expect(decoded.username == Array("alice".utf8))
        #expect(decoded.password?.withBytes(Array.init) == Array("correct horse".utf8))
        #expect(WireV3.Credentials.encoded(username: [UInt8](repeating: 65, count: 255), password: nil).count == 320)
        var overrun: [UInt8] = [200, 100] + [UInt8](repeating: 0, count: 254)
        let overrunBuffer = try #require(SecretBuffer(taking: &overrun))
        #expect(WireV3.Credentials.decode(overrunBuffer) == nil)
        var none = [UInt8](repeating: 0, count: 256)
        let noneBuffer = try #require(SecretBuffer(taking: &none))
        let empty = try #require(WireV3.Credentials.decode(noneBuffer))
        #expect(empty.username == nil && empty.password == nil)
    }
}
