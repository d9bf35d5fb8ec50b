import Basics
import Glibc
import Testing
@testable import SystemDNS
import Tunnel

/// Reads a body of `a(sb)` after a link index: the domains and their routing-only flags.
private func domains(_ body: [UInt8]) throws -> (link: Int32, [(String, Bool)]) {
    var reader = DBusReader(body)
    let link = Int32(bitPattern: try reader.uint32())
    let length = Int(try reader.uint32())
    reader.align(8)
    let end = reader.offset + length
    var found: [(String, Bool)] = []
    while reader.offset < end, found.count < 100 {
        reader.align(8)
        found.append((try reader.string(), try reader.bool()))
    }
    return (link, found)
}

/// Reads a body of `a(iay)` after a link index: each resolver's family and bytes.
private func servers(_ body: [UInt8]) throws -> (link: Int32, [(Int32, [UInt8])]) {
    var reader = DBusReader(body)
    let link = Int32(bitPattern: try reader.uint32())
    let length = Int(try reader.uint32())
    reader.align(8)
    let end = reader.offset + length
    var found: [(Int32, [UInt8])] = []
    while reader.offset < end, found.count < 100 {
        reader.align(8)
        let family = Int32(bitPattern: try reader.uint32())
        let count = Int(try reader.uint32())
        var bytes: [UInt8] = []
        for _ in 0..<count { bytes.append(try reader.byte()) }
        found.append((family, bytes))
    }
    return (link, found)
}

/// The tunnel's resolvers as resolved gets them: in full mode every name goes to them (the
/// routing-only `~.` and the default route), in split mode only the search domains' names, and
/// never multicast names on the tunnel.
@Test(arguments: [true, false])
func settingsBecomeResolvedsLinkCalls(routeAll: Bool) throws {
    let settings = try DNSSettings(resolvers: [IPAddress("10.77.0.1")!, IPAddress("fd00:77::1")!],
                                   searchDomains: ["corp.example", "eu.corp.example"])
    let calls = Resolved.calls(link: 42, settings, routeAll: routeAll)
    #expect(calls.map(\.member) == ["SetLinkDNS", "SetLinkDomains", "SetLinkDefaultRoute", "SetLinkLLMNR", "SetLinkMulticastDNS"])
    #expect(calls.map(\.signature) == ["ia(iay)", "ia(sb)", "ib", "is", "is"])

    let (dnsLink, resolvers) = try servers(calls[0].body.bytes)
    #expect(dnsLink == 42)
    #expect(resolvers.map(\.0) == [AF_INET, AF_INET6])
    #expect(resolvers.map(\.1) == [[10, 77, 0, 1], IPAddress("fd00:77::1")!.bytes])

    let (domainLink, given) = try domains(calls[1].body.bytes)
    #expect(domainLink == 42)
    let expected: [(String, Bool)] = [("corp.example", false), ("eu.corp.example", false)] + (routeAll ? [(".", true)] : [])
    #expect(given.map(\.0) == expected.map(\.0) && given.map(\.1) == expected.map(\.1))

    var route = DBusReader(calls[2].body.bytes)
    #expect(Int32(bitPattern: try route.uint32()) == 42)
    #expect(try route.bool() == routeAll)
    for call in calls[3...] {
        var off = DBusReader(call.body.bytes)
        #expect(Int32(bitPattern: try off.uint32()) == 42)
        #expect(try off.string() == "no")
    }
}
