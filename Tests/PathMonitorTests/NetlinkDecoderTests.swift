import Topology
import Foundation
import Testing
import Basics
@testable import PathMonitor
import Netlink

/// Raw kernel buffers captured by `agent record` (the recorded scenarios double as fixtures).
private func captured(_ name: String) throws -> [[UInt8]] {
    let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    let text = try String(contentsOf: root.appendingPathComponent("Scenarios/\(name)"), encoding: .utf8)
    return text.split(whereSeparator: { !$0.isHexDigit }).filter { $0.count >= 64 && $0.count % 2 == 0 }.map { run in
        var bytes: [UInt8] = []
        var i = run.startIndex
        while i < run.endIndex {
            let j = run.index(i, offsetBy: 2)
            bytes.append(UInt8(run[i..<j], radix: 16)!)
            i = j
        }
        return bytes
    }
}

private func decodeAll(_ buffers: [[UInt8]]) -> (NetlinkDecoder, [NetworkChange]) {
    var decoder = NetlinkDecoder()
    let changes = buffers.flatMap { decoder.decode($0).changes }
    return (decoder, changes)
}

@Test func realDumpDecodesLinksAddressesAndRoutes() throws {
    let (decoder, changes) = decodeAll(try captured("recorded-ethernet-cable-pulled.yaml"))
    #expect(decoder.malformed == 0)
    var model = NetworkModel()
    for change in changes { model.apply(change) }
    #expect(model.link(named: "lo")?.kind == .loopback)
    #expect(model.link(named: "eth0")?.kind == .virtual)
    #expect(model.addresses.values.contains { $0.ip == IPAddress("10.20.0.57") && $0.prefix.length == 24 })
    #expect(model.addresses.values.contains { $0.ip.isLinkLocal }, "IPv6 link-local addresses are decoded too")
    #expect(model.routes.values.contains { $0.destination.length == 0 && $0.metric == 600 && $0.nextHops.first?.gateway == IPAddress("192.168.1.1") })
    #expect(model.routes.values.contains { $0.table == 255 && $0.type == .local })
    // The recorded change: eth0's peer went down, so eth0 lost carrier but kept its routes.
    #expect(model.link(named: "eth0")?.hasCarrier == false)
    #expect(model.link(named: "eth0")?.isUp == true)
    #expect(model.paths(to: IPAddress("198.51.100.7")!).map(\.interface) == ["wifi0"])
}

@Test func realMultipathIPv6AndDeletionsDecode() throws {
    let (decoder, changes) = decodeAll(try captured("recorded-multipath-and-ipv6.yaml"))
    #expect(decoder.malformed == 0)
    let multipath = changes.compactMap { if case .routeAdded(let r) = $0, r.nextHops.count == 2 { r } else { nil } }
    #expect(multipath.first?.destination == Prefix("198.51.100.0/24"))
    #expect(Set(multipath.first?.nextHops.compactMap(\.gateway) ?? []) == [IPAddress("10.20.0.1")!, IPAddress("192.168.1.1")!])
    #expect(changes.contains { if case .routeRemoved(let k) = $0 { k.destination == Prefix("198.51.100.0/24") } else { false } })
    #expect(changes.contains { if case .routeAdded(let r) = $0 { r.type == .reject && r.destination == Prefix("203.0.113.0/24") } else { false } })
    #expect(changes.contains { if case .addressAdded(let a) = $0 { a.ip == IPAddress("2001:db8:1::57") } else { false } })
    #expect(changes.contains { if case .addressRemoved(let k) = $0 { k.prefix.address == IPAddress("2001:db8:1::57") } else { false } })
    #expect(changes.contains { if case .routeAdded(let r) = $0 { r.destination == .any(.v6) && r.metric == 100 } else { false } })
}

@Test func truncatedMessagesAreCountedNeverFatal() throws {
    let buffers = try captured("recorded-ethernet-plugged-in.yaml")
    var total = 0
    for buffer in buffers.prefix(8) {
        for cut in stride(from: 0, to: buffer.count, by: 7) {
            var decoder = NetlinkDecoder()
            _ = decoder.decode(buffer.prefix(cut))
            total += decoder.malformed
        }
    }
    #expect(total > 0)
}

@Test func malformedAttributesAreCounted() {
    // An RTM_NEWADDR whose attribute claims more bytes than the message has.
    var message: [UInt8] = [0, 0, 0, 0, 20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    message += [2, 24, 0, 0, 3, 0, 0, 0]  // ifaddrmsg: AF_INET /24 ifindex 3
    message += [64, 0, 2, 0, 10, 0, 0, 1]  // IFA_LOCAL, length 64: too long
    message[0] = UInt8(message.count)
    var decoder = NetlinkDecoder()
    let batch = decoder.decode(message)
    #expect(batch.changes.isEmpty)
    #expect(decoder.malformed == 1)
    // The same with a sane length decodes.
    message[16 + 8] = 8
    var sane = NetlinkDecoder()
    #expect(sane.decode(message).changes == [.addressAdded(Address(linkIndex: 3, prefix: Prefix("10.0.0.1/24")!))])
}

@Test func unknownMessageTypesAreSkippedAndCounted() {
    let neighbour: [UInt8] = [28, 0, 0, 0, 28, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0] + [UInt8](repeating: 0, count: 12)
    var decoder = NetlinkDecoder()
    #expect(decoder.decode(neighbour).changes.isEmpty)
    #expect(decoder.skipped == 1 && decoder.malformed == 0)
}

/// Random and mutated kernel bytes: the decoder must never crash, and what it accepts must
/// still be something the model can apply.
@Test func fuzzedBytesNeverCrashTheDecoder() throws {
    let corpus = try captured("recorded-multipath-and-ipv6.yaml") + captured("recorded-dhcp-new-address.yaml")
    var state: UInt64 = 0x5EED
    func random() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        return z ^ (z >> 31)
    }
    var decoder = NetlinkDecoder()
    var model = NetworkModel()
    for round in 0..<20_000 {
        var bytes = corpus[round % corpus.count]
        switch random() % 4 {
        case 0:  // flip bytes
            for _ in 0..<(1 + random() % 8) { bytes[Int(random() % UInt64(bytes.count))] = UInt8(truncatingIfNeeded: random()) }
        case 1:  // truncate
            bytes = Array(bytes.prefix(Int(random() % UInt64(bytes.count + 1))))
        case 2:  // pure noise
            bytes = (0..<Int(random() % 600)).map { _ in UInt8(truncatingIfNeeded: random()) }
        default:  // splice two buffers
            let other = corpus[Int(random() % UInt64(corpus.count))]
            bytes = Array(bytes.prefix(Int(random() % UInt64(bytes.count + 1)))) + other
        }
        for change in decoder.decode(bytes).changes { model.apply(change) }
        _ = model.paths(to: IPAddress("198.51.100.7")!)
    }
    #expect(decoder.malformed > 1000)
}
