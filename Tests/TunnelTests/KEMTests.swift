import Foundation
import Testing
@testable import Tunnel

/// ML-KEM-768 (BoringSSL's, through CBoring) against an independent implementation
/// (`Tests/Fixtures/mlkem.py`: kyber-py, pure Python from FIPS 203).
struct KEMTests {
    struct Vector: Decodable {
        var seed: String
        var `public`: String
        var entropy: String
        var ciphertext: String
        var shared: String
        var tampered: String
        var rejected: String
    }

    static let vectors = loadFixture("mlkem.json", as: [Vector].self) ?? []

    /// Key generation from a seed, encapsulation with given entropy and decapsulation, including
    /// a tampered ciphertext's implicit rejection, all as the other implementation computes them.
    @Test func itMatchesAnIndependentImplementation() throws {
        try #require(Self.vectors.count == 3, "the fixture file is missing or changed")
        for vector in Self.vectors {
            let pair = MLKEM.KeyPair(seed: hex(vector.seed))
            #expect(pair.publicKey == hex(vector.public))
            let sealed = try #require(MLKEM.encapsulate(to: pair.publicKey, entropy: hex(vector.entropy)))
            #expect(sealed.ciphertext == hex(vector.ciphertext))
            #expect(sealed.shared.matches(hex(vector.shared)))
            #expect(!sealed.shared.matches(hex(vector.rejected)) && !sealed.shared.matches(Array(hex(vector.shared).dropLast())))
            let opened = try #require(pair.decapsulate(hex(vector.ciphertext)))
            #expect(opened.matches(hex(vector.shared)))
            let rejected = try #require(pair.decapsulate(hex(vector.tampered)))
            #expect(rejected.matches(hex(vector.rejected)))
        }
    }

    /// Random pairs agree with each other; bad input is refused, never a crash.
    @Test func badInputIsRefused() throws {
        let pair = MLKEM.KeyPair()
        let other = MLKEM.KeyPair()
        #expect(pair.publicKey != other.publicKey)
        let sealed = try #require(MLKEM.encapsulate(to: pair.publicKey))
        let a = try #require(pair.decapsulate(sealed.ciphertext))
        #expect(a.matches(HybridHandshakeTests.secret(sealed.shared)))
        #expect(MLKEM.encapsulate(to: Array(pair.publicKey.dropLast())) == nil, "a short key")
        #expect(MLKEM.encapsulate(to: [UInt8](repeating: 0xff, count: MLKEM.publicKeyLength)) == nil, "coefficients out of range")
        #expect(pair.decapsulate(Array(sealed.ciphertext.dropLast())) == nil, "a short ciphertext")
    }
}
