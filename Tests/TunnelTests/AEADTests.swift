import Foundation
import Testing
import Basics
@testable import Tunnel

/// The data path's AEADs (BoringSSL's, through CBoring) against packets another implementation
/// sealed (`Tests/Fixtures/data-packets.py`: Python's `cryptography`, over OpenSSL), and the
/// start-up self-test that guards the linked BoringSSL.
struct AEADTests {
    struct Vector: Decodable {
        var suite: String
        var key: String
        var counter: UInt64
        var header: String
        var inner: String
        var datagram: String
    }

    static let vectors = loadFixture("data-packets.json", as: [Vector].self) ?? []

    @Test func theSelfTestPasses() {
        #expect(AEADKey.selfTest() == nil)
    }

    /// Each suite seals what the independent implementation sealed, byte for byte, and opens it;
    /// a flipped bit anywhere (header, ciphertext, tag) fails to open.
    @Test func packetsMatchAnIndependentImplementation() throws {
        try #require(Self.vectors.count == 8, "the fixture file is missing or changed")
        for vector in Self.vectors {
            let suite = try #require(CipherSuite.allCases.first { $0.description == vector.suite })
            let key = AEADKey(suite, key: hex(vector.key).withUnsafeBytes { SecretBytes(copying: $0) })
            let header = hex(vector.header)
            let expected = hex(vector.datagram)
            var datagram = header + hex(vector.inner) + [UInt8](repeating: 0, count: 16)
            let end = datagram.count - 16
            datagram.withUnsafeMutableBytes { buffer in
                key.seal(counter: vector.counter, ad: UnsafeRawBufferPointer(rebasing: buffer[..<16]),
                         text: UnsafeMutableRawBufferPointer(rebasing: buffer[16..<end]), tag: buffer.baseAddress! + end)
            }
            #expect(datagram == expected, "\(vector.suite) counter \(vector.counter)")
            func opens(_ bytes: [UInt8]) -> [UInt8]? {
                var copy = bytes
                let ok = copy.withUnsafeMutableBytes { buffer in
                    key.open(counter: vector.counter, ad: UnsafeRawBufferPointer(rebasing: buffer[..<16]),
                             text: UnsafeMutableRawBufferPointer(rebasing: buffer[16..<end]), tag: buffer.baseAddress! + end)
                }
                return ok ? Array(copy[16..<end]) : nil
            }
            #expect(opens(expected) == hex(vector.inner))
            for position in [0, 8, 15, 16, end - 1, end, expected.count - 1] where position < expected.count && (position < end || position >= 16) {
                var flipped = expected
                flipped[position] ^= 0x40
                #expect(opens(flipped) == nil, "\(vector.suite): a flip at \(position) opened")
            }
            #expect(key.open(counter: vector.counter + 1, ad: UnsafeRawBufferPointer(start: nil, count: 0),
                             text: UnsafeMutableRawBufferPointer(start: nil, count: 0), tag: [UInt8](repeating: 0, count: 16)) == false)
        }
    }

    /// A session seals with its suite and the other side opens it; a session of the other suite
    /// with the same keys does not.
    @Test(arguments: CipherSuite.allCases)
    func aSessionSealsWithItsSuite(_ suite: CipherSuite) throws {
        let a = SecretBytes { for i in 0..<32 { $0[i] = UInt8(i) } }
        let b = SecretBytes { for i in 0..<32 { $0[i] = UInt8(100 + i) } }
        let sender = TransportSession(localIndex: 1, remoteIndex: 2, keys: TransportKeys(send: a, receive: b), suite: suite, established: .zero)
        let receiver = TransportSession(localIndex: 2, remoteIndex: 1, keys: TransportKeys(send: b, receive: a), suite: suite, established: .zero)
        let other = TransportSession(localIndex: 2, remoteIndex: 1, keys: TransportKeys(send: b, receive: a),
                                     suite: suite == .aes256GCM ? .chacha20Poly1305 : .aes256GCM, established: .zero)
        #expect(sender.suite == suite)
        let packet = Array("an inner packet".utf8)
        let datagram = try sender.seal(message: packet, now: .zero, limits: SessionLimits())
        #expect(datagram[0] == 2, "version 2's sessions stamp their version")
        let three = TransportSession(localIndex: 1, remoteIndex: 2, keys: TransportKeys(send: a, receive: b), suite: suite, version: 3, established: .zero)
        #expect(try three.seal(message: packet, now: .zero, limits: SessionLimits())[0] == 3, "and version 3's theirs, authenticated with the packet")
        var copy = datagram
        let opened = copy.withUnsafeMutableBytes { receiver.open($0, now: .zero, limits: SessionLimits()) }
        guard case .success(let result) = opened else {
            Issue.record("did not open: \(opened)")
            return
        }
        #expect(Array(copy[result.range]) == packet)
        var again = datagram
        let wrong = again.withUnsafeMutableBytes { other.open($0, now: .zero, limits: SessionLimits()) }
        #expect(wrong.failureReason == .decryptFailed)
    }
}

extension Result {
    var failureReason: Failure? {
        if case .failure(let reason) = self { return reason }
        return nil
    }
}
