import Foundation
import NamespaceLab
import PathMonitor
import Tunnel
import Testing

/// A gateway with several users at once: four real `agent up` processes, each in a namespace of
/// its own, through one `agent serve`, every one with a probe stream and a checked TCP stream.
@Suite(.enabled(if: NamespaceLab.isRoot, Comment(rawValue: NamespaceLab.skipReason)), .serialized)
struct GatewayLabTests {
    @Test func fourClientsThroughOneServerAtOnce() throws {
        let lab = try GatewayLab(clients: 4)
        try lab.start()
        var probes: [ProbeStream] = []
        var streams: [TCPStream] = []
        for (n, laptop) in lab.laptops.enumerated() {
            probes.append(try ProbeStream(from: SocketAddress(lab.inner(n), port: 0), in: laptop,
                                          to: SocketAddress(GatewayLab.serverInner, port: UInt16(5006 + n)), in: lab.server))
            streams.append(try TCPStream(to: SocketAddress(GatewayLab.serverInner, port: UInt16(5100 + n)), listenerIn: lab.server,
                                         from: laptop, bytesPerSecond: 4 << 20))
        }
        defer { for p in probes { p.stop() } }
        let start = LabClock.now
        usleep(3_000_000)
        let end = LabClock.now - .milliseconds(500)  // the last probes' echoes are on their way
        let context = "server log:\n\(lab.log("server.log"))"
        for n in 0..<4 {
            let (lost, sent) = probes[n].lost(from: start, to: end)
            #expect(sent > 100 && lost == 0, "client \(n): \(lost) of \(sent) probes lost\n\(context)")
            let tcp = streams[n].finish()
            #expect(tcp.failure == nil && tcp.intact && tcp.sent > 0 && tcp.received == tcp.sent,
                    "client \(n): \(tcp.received) of \(tcp.sent) bytes, intact \(tcp.intact), \(tcp.failure ?? "")\n\(context)")
        }
        let handshakes = lab.log("server.log").components(separatedBy: "msg=\"handshake from").count - 1
        #expect(handshakes == 4, "one handshake per client: \(handshakes)\n\(context)")
    }
}
