import Foundation
import NamespaceLab
import Testing

/// Every roaming situation, on real `agent serve` and `agent up` processes in namespaces, in
/// full-tunnel mode (the default route into the tunnel) and in split mode, with a TCP stream
/// through the tunnel that must arrive whole and a tunnel device that must stay as it was.
/// The bounds are generous on purpose; bench/roaming.sh measures the tight numbers.
@Suite(.enabled(if: NamespaceLab.isRoot, Comment(rawValue: NamespaceLab.skipReason)), .serialized)
struct RoamingLabTests {
    static let agent = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().appendingPathComponent("agent")

    @Test(arguments: RoamingScenario.allCases, LabRouting.allCases)
    func roam(_ scenario: RoamingScenario, _ routing: LabRouting) throws {
        let o = try scenario.run(vpn: .roam, routing: routing, agent: Self.agent, tcp: true)
        let context = Comment(rawValue: "\(scenario) \(routing): outage \(o.outage), lost \(o.lostProbes)/\(o.sentProbes), "
            + "handshakes \(o.handshakes), attempts \(o.attempts.map(String.init) ?? "-"), on \(o.interface ?? "-")\n"
            + "client log:\n\(o.clientLog)")
        let tcp = try #require(o.tcp)
        #expect(tcp.failure == nil && tcp.intact && tcp.received == tcp.sent && tcp.sent > 0,
                "TCP stream: \(tcp.received) of \(tcp.sent) bytes, intact \(tcp.intact), \(tcp.failure ?? "")", context)
        #expect(o.tunnelUntouched, "the tunnel device, its addresses and routes are as they were", context)
        switch scenario {
        case .uplinkLoss:
            #expect(o.interface == "wifi0", context)
            #expect(o.outage < .milliseconds(500) && o.handshakes == 0, context)
        case .betterPath:
            #expect(o.interface == "eth0", context)
            #expect(o.moved.map { $0 < .seconds(1) } ?? false, "moved \(o.moved.map { "\($0)" } ?? "never")", context)
            #expect(o.outage < .milliseconds(500) && o.handshakes == 0, context)
        case .addressChange:
            #expect(o.interface == "eth0", context)
            #expect(o.outage < .seconds(1) && o.handshakes == 0, context)
        case .silentBlackhole:
            #expect(o.interface == "wifi0", context)
            #expect(o.outage < .seconds(4), context)
        case .flapStorm:
            #expect(o.interface == "wifi0", "still on wifi0 while eth0's hold-down lasts", context)
            #expect((o.attempts ?? 99) <= 3 && o.outage < .seconds(1) && o.handshakes == 0, context)
        case .suspendResume:
            #expect(o.interface == "wifi0", context)
            #expect(o.outage < .seconds(1) && o.handshakes == 0, context)
        case .serverRestart:
            #expect(o.outage < .seconds(1) && o.handshakes == 1, context)
        case .bothUplinksDown:
            #expect(o.interface == "wifi0", context)
            #expect(o.attemptsWhileOffline == 0, "no attempts while offline", context)
            #expect(o.outage < .seconds(2), "back after wifi0 returned", context)
        }
    }
}
