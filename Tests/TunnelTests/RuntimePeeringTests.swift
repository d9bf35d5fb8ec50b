import Topology
import Basics
import PathMonitor
import Testing
@testable import Tunnel
import Device

private let loopback = SocketAddress(IPAddress("127.0.0.1")!, port: 0)

/// Through a handover, each datagram is opened by the session its server holds: the prepared
/// one first, then the retired one until its time is up, when its drops join the client's.
@Test func eachDatagramIsOpenedByTheSessionItsServerHolds() throws {
    var old = try ProtocolFixture(), next = try ProtocolFixture()
    let (oldPeer, nextPeer) = (try old.connect(), try next.connect())
    let oldServer = SocketAddress(IPAddress("198.51.100.2")!, port: 51820)
    let nextServer = SocketAddress(IPAddress("198.51.100.3")!, port: 51820)
    var peering = Peering(session: ServerSession(core: old.client, server: oldServer), socket: try UDPSocket(bindingTo: loopback))
    let reply = ProtocolFixture.ipv4(from: IPAddress("10.9.0.1")!, to: ProtocolFixture.innerV4)
    func open(_ datagram: [UInt8], from server: SocketAddress, at now: Instant) -> (opened: Bool, by: Peering.Role) {
        var datagram = datagram
        let (event, role) = datagram.withUnsafeMutableBytes { peering.receive($0, from: server, now: now) }
        guard case .packet = event else { return (false, role) }
        return (true, role)
    }

    let (early, late, inFlight) = (try next.serverDatagram(reply, to: nextPeer), try old.serverDatagram(reply, to: oldPeer),
                                   try old.serverDatagram(reply, to: oldPeer))
    let moved = try next.serverDatagram(reply, to: nextPeer)

    peering.standby = ServerSession(core: next.client, server: nextServer)
    #expect(open(early, from: nextServer, at: next.now) == (true, .standby))
    #expect(open(late, from: oldServer, at: old.now) == (true, .current))

    let left = peering.completeHandover(retiredUntil: old.now + .seconds(5))
    #expect(left?.generation == 1 && left?.old.server == oldServer && peering.generation == 2)
    #expect(peering.standby == nil && peering.completeHandover(retiredUntil: old.now) == nil, "nothing more prepared")
    #expect(open(inFlight, from: oldServer, at: old.now + .seconds(4)) == (true, .retired))
    #expect(open(late, from: oldServer, at: old.now + .seconds(4)) == (false, .retired), "a replay")
    #expect(open(moved, from: nextServer, at: next.now) == (true, .current))
    #expect(peering.drops.total == 0, "the retired session's drops join when its keys go")

    #expect(open(late, from: oldServer, at: old.now + .seconds(5)) == (false, .current))
    #expect(peering.drops.total == 2, "the retired session's replay and the current one's unknown index")

    peering.use(ServerSession(core: old.client, server: oldServer))
    #expect(peering.generation == 3)
}

/// A socket probed on a path being tried is polled beside the current one, once, until the
/// session moves there or the path is forgotten.
@Test func aProbedPathIsPolledUntilTheSessionMovesThereOrItIsForgotten() throws {
    let f = try ProtocolFixture()
    let (current, tried) = (try UDPSocket(bindingTo: loopback), try UDPSocket(bindingTo: loopback))
    var peering = Peering(session: ServerSession(core: f.client, server: ProtocolFixture.clientAddress), socket: current)
    #expect(peering.probing(via: nil) == nil && peering.probing(via: current) == nil && peering.candidates.isEmpty)
    #expect(peering.probing(via: tried)?.joined == true && peering.probing(via: tried)?.joined == false)
    #expect(peering.candidates.count == 1)
    peering.forget(candidate: tried)
    #expect(peering.candidates.isEmpty)
    _ = peering.probing(via: tried)
    peering.rebind(to: tried)
    #expect(peering.socket === tried && peering.candidates.isEmpty)
}
