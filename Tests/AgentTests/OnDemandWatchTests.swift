import Logging
import PathMonitor
import Reconnector
import Testing
@testable import agent

private let wired = Path(linkIndex: 3, interface: "eth0", kind: .ethernet, source: IPAddress("10.20.0.57")!,
                         gateway: IPAddress("10.20.0.1"), metric: 100, prefixLength: 0, mtu: 1500)
private let probe = OnDemandRule.Probe(url: "http://intranet.corp.example/health", expect: .status(204))
private let intranet = OnDemandRule(name: "intranet", match: .init(probe: probe), action: .disconnect)

/// The watcher's bookkeeping of probes, on a rule that needs no kernel notices.
@Test func aProbeAnswerCountsOnlyForTheNetworkItWasMadeOn() {
    let watch = OnDemandWatch(rules: OnDemandRules([intranet]), log: Logger(label: "test"))
    var started: [UInt64] = []
    func decide() -> OnDemandDecision? {
        watch.decide(for: wired, model: NetworkModel(), tunnelSearch: []) { _, _, generation in started.append(generation) }
    }
    #expect(decide() == .waiting(rule: "intranet", for: [.probe(probe)], path: wired.id))
    #expect(started.count == 1)
    let first = started[0]

    // The network went and came back before the answer: the answer is the old network's.
    watch.forgetNetwork()
    _ = decide()
    #expect(started.count == 2 && started[1] != first, "a fresh probe for the network as it is now")
    watch.probeAnswered(probe, generation: first, true)
    #expect(decide() == nil && watch.decision == .waiting(rule: "intranet", for: [.probe(probe)], path: wired.id))

    watch.probeAnswered(probe, generation: started[1], true)
    #expect(decide() == .decided(OnDemandVerdict(action: .disconnect, rule: "intranet", path: wired.id, interface: "eth0")))
    #expect(started.count == 2, "no probe while its answer stands")
}
