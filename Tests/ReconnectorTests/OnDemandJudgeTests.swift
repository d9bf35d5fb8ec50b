import Topology
import Basics
import PathMonitor
import Reconnector
import Testing

private let wired = Path(linkIndex: 3, interface: "eth0", kind: .ethernet, source: IPAddress("10.20.0.57")!,
                         gateway: IPAddress("10.20.0.1"), metric: 100, prefixLength: 0, mtu: 1500)
private let probe = OnDemandRule.Probe(url: "http://intranet.corp.example/health", expect: .status(204))
private let intranet = OnDemandRule(name: "intranet", match: .init(probe: probe), action: .disconnect)
private let office = OnDemandRule(name: "office", match: .init(gatewayMACs: ["52:54:00:0f:f1:ce"]), action: .disconnect,
                                  liftsLockdown: true)
private let home = OnDemandRule(name: "home", match: .init(ssids: ["home"]), action: .disconnect)
private let corp = OnDemandRule(name: "corp", match: .init(dnsDomains: ["corp.example"]), action: .disconnect)

private func ms(_ ms: Int64) -> Instant { .zero + .milliseconds(ms) }

/// Judges `best` at `now`, returning the decision (when it changed) and what was asked.
private func judge(_ judge: inout OnDemandJudge, _ best: Path? = wired, at now: Instant) -> (OnDemandDecision?, [FactRequest]) {
    var asks: [FactRequest] = []
    let decision = judge.judge(best, in: NetworkModel(), now: now, &asks)
    return (decision, asks)
}

private func disconnect(_ rule: OnDemandRule) -> OnDemandDecision {
    .decided(OnDemandVerdict(action: .disconnect, rule: rule.name, liftsLockdown: rule.liftsLockdown && rule.match.isProven, path: wired.id,
                             interface: "eth0"))
}

private let connect = OnDemandDecision.decided(OnDemandVerdict(action: .connect, rule: "default", path: wired.id, interface: "eth0"))

@Test func aProbeAnswerCountsOnlyForTheNetworkItWasMadeOn() {
    var j = OnDemandJudge(rules: OnDemandRules([intranet]))
    let (first, asks) = judge(&j, at: ms(0))
    #expect(first == .waiting(rule: "intranet", for: [.probe(probe)], path: wired.id))
    #expect(asks == [.probe(probe, via: wired, generation: j.generation)])
    let old = j.generation

    // The network went and came back before the answer: the answer is the old network's.
    j.forgetNetwork()
    let (_, again) = judge(&j, at: ms(10))
    #expect(again == [.probe(probe, via: wired, generation: j.generation)] && j.generation != old,
            "a fresh probe for the network as it is now")
    let learnt1 = j.learn(.probeAnswered(probe, generation: old, .expected(proof: nil)), now: ms(20))
    #expect(!learnt1)
    #expect(judge(&j, at: ms(20)).0 == nil && j.decision == .waiting(rule: "intranet", for: [.probe(probe)], path: wired.id))

    let learnt2 = j.learn(.probeAnswered(probe, generation: j.generation, .expected(proof: nil)), now: ms(30))
    #expect(learnt2)
    let (decided, none) = judge(&j, at: ms(30))
    #expect(decided == disconnect(intranet))
    #expect(none.isEmpty, "no probe while its answer stands")
}

/// The first read of the neighbour table is answered at once; with no entry yet, the kernel
/// resolves it and the rules wait, looking again every step, and give up after the wait.
@Test func aMissingGatewayEntryIsWaitedForThenAbsent() {
    var j = OnDemandJudge(rules: OnDemandRules([office]))
    let (none, asks) = judge(&j, at: ms(0))
    #expect(none == nil && j.awaitsAnswers, "nothing said before the table is read")
    #expect(asks == [.gateway(wired.gateway!, linkIndex: 3, resolve: true)])
    let learnt3 = j.learn(.gateway(linkIndex: 3, wired.gateway!, mac: nil), now: ms(1))
    #expect(learnt3)
    #expect(!j.awaitsAnswers)
    #expect(judge(&j, at: ms(1)).0 == .waiting(rule: "office", for: [.gatewayMAC], path: wired.id))
    #expect(j.nextDeadline == ms(100))
    var looks = 0
    var now: Int64 = 100
    while let due = j.nextDeadline, looks < 100 {
        now = Int64(due.nanoseconds / 1_000_000)
        var asked: [FactRequest] = []
        j.timerFired(now: due, &asked)
        looks += asked.count
        #expect(asked.allSatisfy { $0 == .gateway(wired.gateway!, linkIndex: 3, resolve: false) })
        if j.nextDeadline == nil { break }
    }
    #expect(now == 2000 && looks == 19, "a look every 100 ms until 2 s: \(looks) looks, gave up at \(now) ms")
    #expect(judge(&j, at: ms(now)).0 == connect)
}

@Test func aGatewayEntryDecidesAndAnotherHardwareAddressIsAnotherNetwork() {
    var j = OnDemandJudge(rules: OnDemandRules([office, intranet]))
    _ = judge(&j, at: ms(0))
    let learnt4 = j.learn(.gateway(linkIndex: 3, wired.gateway!, mac: "52:54:00:0f:f1:ce"), now: ms(1))
    #expect(learnt4)
    #expect(judge(&j, at: ms(1)).0 == disconnect(office))
    let learnt5 = j.learn(.gateway(linkIndex: 9, wired.gateway!, mac: "aa:aa:aa:aa:aa:aa"), now: ms(2))
    #expect(!learnt5, "another link's")
    let learnt6 = j.learn(.gateway(linkIndex: 3, wired.gateway!, mac: nil), now: ms(2))
    #expect(!learnt6, "an entry forgotten says nothing")
    let generation = j.generation
    let learnt7 = j.learn(.gateway(linkIndex: 3, wired.gateway!, mac: "a4:91:b1:00:ca:fe"), now: ms(3))
    #expect(learnt7)
    #expect(j.generation != generation, "what was learnt of the office no longer counts")
    let (decision, asks) = judge(&j, at: ms(3))
    #expect(decision == .waiting(rule: "intranet", for: [.probe(probe)], path: wired.id))
    #expect(asks == [.probe(probe, via: wired, generation: j.generation)])
}

/// Joining another Wi-Fi network on the same lease is another network.
@Test func anotherWiFiNetworkOnTheSamePathIsJudgedAfresh() {
    var j = OnDemandJudge(rules: OnDemandRules([home]))
    let (_, asks) = judge(&j, at: ms(0))
    #expect(asks == [.wifi(linkIndex: 3)])
    let learnt8 = j.learn(.wifi(linkIndex: 3, .known("home")), now: ms(1))
    #expect(learnt8)
    #expect(judge(&j, at: ms(1)).0 == disconnect(home))
    let learnt9 = j.learn(.wifi(linkIndex: 3, .known("home")), now: ms(2))
    #expect(!learnt9, "the same network again is no news")
    let learnt10 = j.learn(.wifi(linkIndex: 3, .known("café")), now: ms(3))
    #expect(learnt10)
    let (decision, none) = judge(&j, at: ms(3))
    #expect(decision == connect)
    #expect(none.isEmpty, "the notice said it already")
}

/// On a new network, resolv.conf still names the last one's domains until its DHCP client
/// writes it: the rules wait for a change, for a while.
@Test func searchDomainsLeftByTheLastNetworkAreNotTrusted() {
    var j = OnDemandJudge(rules: OnDemandRules([corp]))
    _ = judge(&j, at: ms(0))
    let learnt11 = j.learn(.searchDomains(["corp.example"], beforeBoot: false), now: ms(0))
    #expect(learnt11)
    #expect(judge(&j, at: ms(0)).0 == disconnect(corp))

    let wifi = Path(linkIndex: 2, interface: "wifi0", kind: .wifi, source: IPAddress("192.168.1.23")!,
                    gateway: IPAddress("192.168.1.1"), metric: 600, prefixLength: 0, mtu: 1500)
    let (none, asks) = judge(&j, wifi, at: ms(1000))
    #expect(none == nil && asks == [.searchDomains])
    let learnt12 = j.learn(.searchDomains(["corp.example"], beforeBoot: false), now: ms(1000))
    #expect(learnt12)
    #expect(judge(&j, wifi, at: ms(1000)).0 == .waiting(rule: "corp", for: [.dnsDomains], path: wifi.id))
    #expect(j.nextDeadline == ms(3000))
    var asked: [FactRequest] = []
    j.timerFired(now: ms(3000), &asked)
    let (decided, _) = judge(&j, wifi, at: ms(3000))
    #expect(decided == .decided(OnDemandVerdict(action: .connect, rule: "default", path: wifi.id, interface: "wifi0")),
            "the same list after the wait: none that tells this network from the last")
    #expect(j.nextDeadline == nil)
}

/// A read the runner never answers holds the rules only for a while.
@Test func anUnansweredReadCountsAsAbsent() {
    var j = OnDemandJudge(rules: OnDemandRules([home]))
    _ = judge(&j, at: ms(0))
    #expect(j.awaitsAnswers && j.nextDeadline == ms(1000))
    var asked: [FactRequest] = []
    j.timerFired(now: ms(1000), &asked)
    #expect(!j.awaitsAnswers)
    #expect(judge(&j, at: ms(1000)).0 == connect)
}

private let officePin = KeyPin(hash: Array(repeating: 7, count: 32))!
private let pinned = OnDemandRule.Probe(url: "https://10.20.0.1/roam", expect: .status(204), pin: officePin)
private let provenOffice = OnDemandRule(name: "office", match: .init(probe: pinned), action: .disconnect, liftsLockdown: true)
private let wireless = Path(linkIndex: 2, interface: "wifi0", kind: .wifi, source: IPAddress("192.168.1.23")!,
                            gateway: IPAddress("192.168.1.1"), metric: 600, prefixLength: 0, mtu: 1500)

/// The proof is rechecked while the network stays: the server showing its key again keeps the
/// lift, without a word to the machine; failing once (its key gone, a time-out) closes it.
@Test func aProofLostOnRecheckClosesTheLockdown() {
    var j = OnDemandJudge(rules: OnDemandRules([provenOffice]))
    let (waiting, asks) = judge(&j, at: ms(0))
    #expect(waiting == .waiting(rule: "office", for: [.probe(pinned)], path: wired.id))
    #expect(asks == [.probe(pinned, via: wired, generation: j.generation)])
    let proof = ProbeResult.expected(proof: directProof(officePin, on: wired.id))
    _ = j.learn(.probeAnswered(pinned, generation: j.generation, proof), now: ms(30))
    let (lifted, _) = judge(&j, at: ms(30))
    #expect(lifted == disconnect(provenOffice))
    if case .decided(let verdict)? = lifted { #expect(verdict.liftsLockdown) }

    // A minute on: asked again, the old answer standing meanwhile.
    #expect(j.nextDeadline == ms(30) + OnDemandJudge.proofRecheck)
    var again: [FactRequest] = []
    j.timerFired(now: j.nextDeadline!, &again)
    #expect(again == [.probe(pinned, via: wired, generation: j.generation)])
    #expect(judge(&j, at: ms(60_030)).0 == nil, "nothing changes while the recheck is out")
    _ = j.learn(.probeAnswered(pinned, generation: j.generation, proof), now: ms(60_040))
    #expect(judge(&j, at: ms(60_040)).0 == nil, "shown again: the lift holds")

    var third: [FactRequest] = []
    j.timerFired(now: j.nextDeadline!, &third)
    #expect(third.count == 1)
    _ = j.learn(.probeAnswered(pinned, generation: j.generation, .unexpected), now: ms(120_100))
    #expect(judge(&j, at: ms(120_100)).0 == connect, "the proof is gone: the lockdown closes, the tunnel comes up")
}

/// A proof counts for the path it was made over: the same key shown over Wi-Fi proves nothing
/// about the cable, even when it arrives while the cable's probe is out.
@Test func aProofOnAnotherInterfaceDoesNotCount() {
    var j = OnDemandJudge(rules: OnDemandRules([provenOffice]))
    _ = judge(&j, at: ms(0))
    let elsewhere = ProbeResult.expected(proof: directProof(officePin, on: wireless.id))
    let learnt = j.learn(.probeAnswered(pinned, generation: j.generation, elsewhere), now: ms(10))
    #expect(learnt)
    #expect(judge(&j, at: ms(10)).0 == connect)

    // On Wi-Fi itself the network is another: judged afresh, and the proof made there counts.
    let (wait, asks) = judge(&j, wireless, at: ms(20))
    #expect(wait == .waiting(rule: "office", for: [.probe(pinned)], path: wireless.id))
    #expect(asks == [.probe(pinned, via: wireless, generation: j.generation)])
    _ = j.learn(.probeAnswered(pinned, generation: j.generation, elsewhere), now: ms(30))
    guard case .decided(let verdict)? = judge(&j, wireless, at: ms(30)).0 else { Issue.record("decided"); return }
    #expect(verdict.liftsLockdown && verdict.interface == "wifi0")
}
