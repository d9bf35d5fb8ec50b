import Basics
import Testing
@testable import SystemDNS

/// The server's name looked up past the lockdown: the pure parts.
struct MarkedLookupTests {
    @Test func theHostsFileComesFirstInFileOrder() {
        let hosts = """
            127.0.0.1 localhost
            # 198.51.100.9 vpn.roam.test
            198.51.100.7\tvpn.roam.test vpn   # the gateway
            2001:db8::7 VPN.roam.test
            198.51.100.7 vpn.roam.test
            """
        #expect(MarkedLookup.hostsFile(hosts, name: "vpn.roam.test") == [IPAddress("198.51.100.7")!, IPAddress("2001:db8::7")!])
        #expect(MarkedLookup.hostsFile(hosts, name: "other.test").isEmpty)
    }

    @Test func resolvConfGivesServersOptionsAndTheSearchList() {
        let conf = ResolvConf("nameserver 10.20.0.1\nnameserver fe80::1%eth0\nsearch corp.example\noptions timeout:1 attempts:3 ndots:2\n")
        #expect(conf.nameservers == [IPAddress("10.20.0.1")!, IPAddress("fe80::1")!])
        #expect(conf.timeout == .seconds(1) && conf.attempts == 3)
        #expect(conf.candidates(for: "vpn") == ["vpn.corp.example", "vpn"])
        #expect(conf.candidates(for: "vpn.roam.test") == ["vpn.roam.test", "vpn.roam.test.corp.example"])
        // systemd-resolved's stub sends unmarked queries: ask the uplinks' servers it lists.
        let stub = ResolvConf("nameserver 127.0.0.53\noptions edns0\n", systemdUplinks: "nameserver 192.168.1.1\n")
        #expect(stub.nameservers == [IPAddress("192.168.1.1")!])
        #expect(ResolvConf("").nameservers == [IPAddress("127.0.0.1")!], "none listed: the C library's default")
    }

    @Test func answersGiveTheirAddressesAndCodes() {
        let query = DNSMessage.query("vpn.roam.test", type: DNSMessage.a, id: 0x1234)
        #expect(query.bytes.prefix(4) == [0x12, 0x34, 0x01, 0x00])
        // The answer: the question echoed, a CNAME (compressed name) and an A record.
        var answer = query.bytes
        answer[2] = 0x81; answer[3] = 0x80  // QR RD RA, NOERROR
        answer[7] = 2  // two answers
        answer += [0xc0, 0x0c, 0, 5, 0, 1, 0, 0, 0, 60, 0, 2, 0xc0, 0x0c]
        answer += [0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 198, 51, 100, 7]
        #expect(DNSMessage.parse(answer[...]) == DNSMessage.Answer(id: 0x1234, code: .ok, addresses: [IPAddress("198.51.100.7")!]))
        var missing = query.bytes
        missing[2] = 0x81; missing[3] = 0x83  // NXDOMAIN
        #expect(DNSMessage.parse(missing[...])?.code == .noSuchName)
        #expect(DNSMessage.parse(query.bytes[...]) == nil, "a query is no answer")
        #expect(DNSMessage.parse(answer.dropLast(3)) == nil, "a truncated record is refused")
    }

    /// Garbage and mutants of a real answer (seeded, so a failure repeats): never a crash, and
    /// whatever is accepted is read from the bytes: an answer (QR set) with their id, and no more
    /// addresses than records of 16 bytes or more could hold.
    @Test(arguments: [1, 2, 3] as [UInt64])
    func garbageAndMutantsNeverCrashTheParserNorInventAddresses(seed: UInt64) {
        var random = SeededRandom(seed: seed)
        var answer = DNSMessage.query("vpn.roam.test", type: DNSMessage.a, id: 0x4242).bytes
        answer[2] = 0x81; answer[3] = 0x80
        answer[7] = 1
        answer += [0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 198, 51, 100, 7]
        #expect(DNSMessage.parse(answer[...])?.addresses == [IPAddress("198.51.100.7")!], "the unmutated answer parses")
        var accepted = 0
        for round in 0..<4000 {
            var bytes: [UInt8]
            if round % 2 == 0 {
                bytes = (0..<Int.random(in: 0..<80, using: &random)).map { _ in UInt8.random(in: 0...255, using: &random) }
            } else {
                bytes = answer
                for _ in 0..<Int.random(in: 1...4, using: &random) {
                    bytes[Int.random(in: 0..<bytes.count, using: &random)] = UInt8.random(in: 0...255, using: &random)
                }
                bytes.removeLast(Int.random(in: 0...3, using: &random))
            }
            guard let parsed = DNSMessage.parse(bytes[...]) else { continue }
            accepted += 1
            #expect(bytes.count >= 12 && bytes[2] & 0x80 != 0, "only an answer is accepted: \(bytes)")
            #expect(parsed.id == UInt16(bytes[0]) << 8 | UInt16(bytes[1]), "the id is the message's: \(bytes)")
            #expect(parsed.addresses.count <= (bytes.count - 12) / 16, "\(parsed.addresses.count) addresses from \(bytes.count) bytes")
        }
        #expect(accepted > 0, "some mutants of a good answer still parse")
    }
}
