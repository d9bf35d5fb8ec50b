import Basics
import Testing
@testable import Tunnel

/// The resolvers and search domains a server pushes in its handshake response.
@Suite struct ProtocolDNSTests {
    static let corporate = try! DNSSettings(resolvers: [IPAddress("10.9.0.1")!, IPAddress("fd00::1")!],
                                            searchDomains: ["corp.example", "Lab.Corp.Example."])

    /// One handshake, returning the response's length and what the client made of it.
    static func handshake(_ f: inout ProtocolFixture) throws -> (initiation: Int, response: Int, completion: HandshakeCompletion) {
        var initiation = try f.client.initiate(now: f.now, wallClock: ProtocolFixture.wall)
        guard case .handshake(_, var response, _) = f.deliver(&initiation) else { throw ProtocolFixture.FixtureError.failed }
        let length = response.count
        guard case .established(let done) = f.client.receive(&response, now: f.now) else { throw ProtocolFixture.FixtureError.failed }
        return (initiation.count, length, done)
    }

    @Test func theServersResolversReachTheClientInsideTheResponse() throws {
        var f = try ProtocolFixture(dns: Self.corporate)
        let (initiation, response, done) = try Self.handshake(&f)
        #expect(done.dns == .success(Self.corporate))
        #expect(Self.corporate.searchDomains == ["corp.example", "lab.corp.example"])
        #expect(initiation == 392, "clients pad so the longest response still fits")
        #expect(response > Response.minLength && response <= initiation, "a response never amplifies")
    }

    @Test func aServerWithoutResolversSendsTheFixedResponseAndItsFeatures() throws {
        var f = try ProtocolFixture()
        let (_, response, done) = try Self.handshake(&f)
        #expect(done.dns == .success(.none))
        #expect(done.sizedEchoes, "the server says it echoes padded probes")
        #expect(response == Response.minLength + 3, "the fixed part and the 3-byte features option")
    }

    @Test func aUsersOwnResolversReplaceTheServers() throws {
        let own = try DNSSettings(resolvers: [IPAddress("10.9.8.7")!], searchDomains: [])
        let credentials = Credentials(username: "bob", password: "correct horse")!
        let hash = try PasswordHash.create(password: "correct horse", cost: .minimum)
        var f = try ProtocolFixture(users: [User(name: "bob", addresses: [IPAddress("10.9.0.3")!], passwordHash: hash, dns: own)],
                                    credentials: credentials, keyUser: false, dns: Self.corporate)
        #expect(try Self.handshake(&f).completion.dns == .success(own), "also after the password check")
    }

    @Test func optionsGoOnlyWhereTheInitiationLeftRoom() {
        let payload = ResponsePayload(accepted: true, addresses: [ProtocolFixture.innerV4], dns: Self.corporate)
        let options = Self.corporate.encoded().count
        #expect(payload.encoded(limit: Response.minLength + options).count == ResponsePayload.length + options)
        #expect(payload.encoded(limit: Response.minLength + options - 1).count == ResponsePayload.length,
                "an old client's 184-byte initiation gets the fixed response")
    }

    /// The settings are checked where they are made, below the data plane; the room they are
    /// checked against is the response's, and their length is what the wire takes.
    @Test func theSettingsFitTheRoomAResponseHas() throws {
        #expect(DNSSettings.maxEncodedLength == Response.maxLength - Response.minLength)
        #expect(Self.corporate.encodedLength == Self.corporate.encoded().count)
        let long = try DNSSettings(resolvers: (1...8).map { IPAddress.v6(0xfd00_0000_0000_0000, UInt64($0)) },
                                   searchDomains: ["a.example"])
        #expect(long.encodedLength == long.encoded().count && long.encodedLength == 8 * 18 + 11)
    }

    @Test func optionsARevisionDoesNotKnowAreSkipped() {
        let base = ResponsePayload(accepted: true, addresses: []).encoded()
        let decoded = ResponsePayload(decoding: base + [9, 3, 1, 2, 3] + [1, 4, 10, 0, 0, 53] + [0, 0, 0])
        #expect(decoded?.dns == Result.success(try! DNSSettings(resolvers: [IPAddress("10.0.0.53")!], searchDomains: [])))
    }

    /// A bad list never costs the session: the fixed part decodes, the list is refused with a reason.
    @Test(arguments: [
        ([1, 5, 1, 2, 3, 4, 5], DNSSettingsError.malformed),
        ([1, 4, 10, 0], .malformed),
        ([2], .malformed),
        ([2, 3] + Array("a b".utf8), .badDomain("a b")),
        ([2, 3] + Array("a\nb".utf8), .badDomain("a\nb")),
        ([1, 4, 0, 0, 0, 0], .badResolver("0.0.0.0")),
        ([1, 4, 10, 0, 0, 1, 1, 4, 10, 0, 0, 1], .repeated),
        ((1...9).flatMap { [1, 4, 10, 0, 0, UInt8($0)] }, .tooManyResolvers(9)),
    ] as [([UInt8], DNSSettingsError)])
    func aBadListIsRefusedAndTheSessionStands(options: [UInt8], error: DNSSettingsError) {
        let decoded = ResponsePayload(decoding: ResponsePayload(accepted: true, addresses: [ProtocolFixture.innerV4]).encoded() + options)
        #expect(decoded?.accepted == true && decoded?.addresses == [ProtocolFixture.innerV4])
        #expect(decoded?.dns == .failure(error))
    }

    @Test func aListMustBeUsableAndFitTheResponse() throws {
        #expect(throws: DNSSettingsError.badDomain("-corp.example")) { try DNSSettings(resolvers: [], searchDomains: ["-corp.example"]) }
        #expect(throws: DNSSettingsError.badDomain("a..b")) { try DNSSettings(resolvers: [], searchDomains: ["a..b"]) }
        #expect(throws: DNSSettingsError.badDomain(String(repeating: "x", count: 64))) {
            try DNSSettings(resolvers: [], searchDomains: [String(repeating: "x", count: 64)])
        }
        #expect(throws: DNSSettingsError.badResolver("ff02::1")) { try DNSSettings(resolvers: [IPAddress("ff02::1")!], searchDomains: []) }
        #expect(throws: DNSSettingsError.badResolver("fe80::1")) { try DNSSettings(resolvers: [IPAddress("fe80::1")!], searchDomains: []) }
        // Neither is reached through the tunnel: this machine, or IPv4 sent as such.
        for text in ["127.0.0.53", "::1", "::ffff:192.168.1.1"] {
            #expect(throws: DNSSettingsError.badResolver(IPAddress(text)!.description)) { try DNSSettings(resolvers: [IPAddress(text)!], searchDomains: []) }
        }
        // A single label would claim a whole top-level domain as a routing domain.
        #expect(throws: DNSSettingsError.badDomain("com")) { try DNSSettings(resolvers: [], searchDomains: ["com"]) }
        #expect(throws: DNSSettingsError.repeated) { try DNSSettings(resolvers: [], searchDomains: ["a.example", "A.example."]) }
        let long = (0..<5).map { "\($0)" + String(repeating: "d", count: 60) + ".example" }
        #expect(throws: DNSSettingsError.tooLong(5 * 71)) { try DNSSettings(resolvers: [], searchDomains: long) }
        #expect(try DNSSettings(resolvers: [], searchDomains: ["_ldap._tcp.corp.example"]).searchDomains == ["_ldap._tcp.corp.example"])
    }
}
