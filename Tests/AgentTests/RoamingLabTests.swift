import Foundation
import NamespaceLab
import Testing

/// Every roaming situation, on real `agent serve` and `agent up` processes in namespaces, in
/// full-tunnel mode (the default route into the tunnel) and in split mode, with a TCP stream
/// through the tunnel that must arrive whole and a tunnel device that must stay as it was.
/// The bounds are generous on purpose; bench/roaming.sh measures the tight numbers.
@Suite(.enabled(if: NamespaceLab.isRoot, Comment(rawValue: NamespaceLab.skipReason)), .serialized)
struct RoamingLabTests {

    /// Every scenario but the benchmark's baseline, where nothing happens.
    static let scenarios = RoamingScenario.allCases.filter { $0 != .steady }

    @Test(arguments: scenarios, LabRouting.allCases)
    func roam(_ scenario: RoamingScenario, _ routing: LabRouting) throws {
        let o = try scenario.run(vpn: .roam, routing: routing, tcp: true, leaks: true)
        let context = "\(scenario) \(routing): outage \(o.outage), lost \(o.lostProbes)/\(o.sentProbes), "
            + "handshakes \(o.handshakes), attempts \(o.attempts.map(String.init) ?? "-"), on \(o.interface ?? "-")\n"
            + "client log:\n\(o.clientLog)"
        func check(_ ok: Bool, _ what: String = "", sourceLocation: SourceLocation = #_sourceLocation) {
            #expect(ok, Comment(rawValue: what + "\n" + context), sourceLocation: sourceLocation)
        }
        // Nothing left outside the tunnel, from before the client started to the end.
        print("leak check: \(scenario) \(routing): \(o.leaks?.count ?? -1) packets left outside the tunnel of \(o.packetsJudged) judged")
        check(o.leaks == [] && o.packetsJudged > 0, "leaks: \(o.leaks ?? [])")
        let tcp = try #require(o.tcp)
        check(tcp.failure == nil && tcp.intact && tcp.received == tcp.sent && tcp.sent > 0,
              "TCP stream: \(tcp.received) of \(tcp.sent) bytes, intact \(tcp.intact), \(tcp.failure ?? "")")
        check(o.tunnelUntouched, "the tunnel device, its addresses and routes are as they were")
        switch scenario {
        case .steady:
            break
        case .uplinkLoss:
            check(o.interface == "wifi0")
            check(o.outage < .milliseconds(500) && o.handshakes == 0)
        case .betterPath:
            check(o.interface == "eth0")
            check(o.moved.map { $0 < .seconds(1) } ?? false, "moved \(o.moved.map { "\($0)" } ?? "never")")
            check(o.outage < .milliseconds(500) && o.handshakes == 0)
        case .addressChange:
            check(o.interface == "eth0")
            check(o.outage < .seconds(1) && o.handshakes == 0)
        case .addressRefused:
            // Refused for 400 ms: bound again after 250 ms and 500 ms more, with the session's keys.
            check(o.interface == "eth0")
            check(o.outage < .milliseconds(1500) && o.handshakes == 0)
            check(o.clientLog.contains("bindFailed(eth0 10.20.0.58"), "the core heard of the refused bind")
        case .silentBlackhole:
            check(o.interface == "wifi0")
            check(o.outage < .seconds(4))
        case .flapStorm:
            check(o.interface == "wifi0", "still on wifi0 while eth0's hold-down lasts")
            check((o.attempts ?? 99) <= 3 && o.outage < .seconds(1) && o.handshakes == 0)
        case .suspendResume:
            check(o.interface == "wifi0")
            check(o.outage < .seconds(1) && o.handshakes == 0)
        case .serverRestart:
            check(o.outage < .seconds(1) && o.handshakes == 1)
        case .lossyUplink:
            // A path that loses one datagram in five works: no handshake storm, no outage to speak of.
            check(o.handshakes == 0, "no handshake for loss")
            check((o.attempts ?? 99) <= 10 && o.outage < .seconds(2))
        case .udpBlockedLanding:
            check(o.interface == "wifi0" && o.transport == "stream", "on wifi0 over the stream: \(o.transport ?? "-")")
            check(o.outage < .seconds(3), "benchmark target 1 s")
        case .udpReturns:
            check(o.interface == "wifi0" && o.transport == "udp", "back on UDP: \(o.transport ?? "-")")
            check(o.moved.map { $0 < .seconds(35) } ?? false, "moved \(o.moved.map { "\($0)" } ?? "never")")
            check(o.lostProbes == 0 && o.handshakes == 0, "nothing lost, no handshake for the move")
        case .mtuBlackHole:
            // Behind a router whose links carry 1280 bytes and that sends no ICMP, a tunnel without
            // IPv6 inside finds 1220 (1280 on the wire) with padded probes, on the same path, in
            // seconds; the TCP stream opened before the move (checked above) carries on through it.
            print("mtu black hole: \(routing): tunnel MTU \(o.tunnelMTU.map(String.init) ?? "-") after \(o.adapted.map { "\($0)" } ?? "never"), "
                  + "TCP \(tcp.received >> 20) of \(tcp.sent >> 20) MB")
            check(o.interface == "eth0" && o.handshakes == 0)
            check(o.tunnelMTU.map { (1212...1220).contains($0) } ?? false, "tunnel MTU \(o.tunnelMTU.map(String.init) ?? "-")")
            check(o.adapted.map { $0 < .seconds(3) } ?? false, "adapted after \(o.adapted.map { "\($0)" } ?? "never")")
            check(tcp.sent >= 15 << 20, "the stream kept its pace: \(tcp.sent) bytes in 20 s")
            // The other way too: the server hears what the client's path carries and answers its
            // own bigger packets as a router would, so the server's TCP re-cuts them.
            let down = try #require(o.download)
            print("mtu black hole: \(routing): TCP down \(down.received >> 20) of \(down.sent >> 20) MB")
            check(down.failure == nil && down.intact && down.received == down.sent && down.sent >= 15 << 20,
                  "TCP download: \(down.received) of \(down.sent) bytes, intact \(down.intact), \(down.failure ?? "")")
        case .bothUplinksDown:
            check(o.interface == "wifi0")
            check(o.attemptsWhileOffline == 0, "no attempts while offline")
            check(o.outage < .seconds(2), "back after wifi0 returned")
        }
    }
}
