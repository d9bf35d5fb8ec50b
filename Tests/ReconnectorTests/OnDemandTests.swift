import Topology
import ConfigReader
import Basics
import PathMonitor
import Testing
@testable import Reconnector

private let office = OnDemandRule(name: "office", match: .init(gatewayMACs: ["52:54:00:12:34:56"]), action: .disconnect,
                                  liftsLockdown: true)
private let lab = OnDemandRule(name: "lab", match: .init(interfaceKinds: [.ethernet], subnets: [Prefix("10.20.0.0/16")!]),
                               action: .disconnect)
private let home = OnDemandRule(name: "home", match: .init(ssids: ["Home"]), action: .ignore)
private let corp = OnDemandRule(name: "corp", match: .init(dnsDomains: ["corp.example"]), action: .disconnect)
private let probe = OnDemandRule.Probe(url: "http://intranet.corp.example/health", expect: .status(204))
private let intranet = OnDemandRule(name: "intranet", match: .init(probe: probe), action: .disconnect)
private let rules = OnDemandRules([office, lab, home, corp, intranet])

private func facts(_ path: Path, ssid: Fact<String> = .absent, mac: Fact<String> = .absent,
                   domains: Fact<[String]> = .absent, probes: [OnDemandRule.Probe: ProbeResult] = [probe: .unexpected]) -> NetworkFacts {
    NetworkFacts(path: path, ssid: ssid, gatewayMAC: mac, dnsDomains: domains, probes: probes)
}

extension OnDemandDecision {
    var summary: String {
        switch self {
        case .decided(let v): "\(v.rule):\(v.action.rawValue)"
        case .waiting(let rule, let wanted, _): "wait:\(rule):" + wanted.map(\.description).joined(separator: ",")
        }
    }
}

@Test(arguments: [
    // The office's gateway, on any uplink: disconnect.
    (facts(wifi0, mac: .known("52:54:00:12:34:56")), "office:disconnect"),
    // Not yet known: the rules wait rather than decide past it.
    (facts(wifi0, mac: .pending), "wait:office:gateway-mac"),
    // Another gateway: on to the next rules; a wired uplink in the lab's subnet.
    (facts(eth0, mac: .known("aa:bb:cc:dd:ee:ff")), "lab:disconnect"),
    // The lab's subnet over Wi-Fi is not the lab rule's.
    (facts(Path(linkIndex: 2, interface: "wifi0", kind: .wifi, source: IPAddress("10.20.3.4")!, gateway: nil, metric: 600,
                prefixLength: 0, mtu: 1500)), "default:connect"),
    (facts(wifi0, ssid: .known("Home")), "home:ignore"),
    (facts(wifi0, ssid: .known("Homework")), "default:connect"),
    // A search domain within the zone matches; a look-alike does not.
    (facts(wifi0, domains: .known(["eu.corp.example"])), "corp:disconnect"),
    (facts(wifi0, domains: .known(["notcorp.example"])), "default:connect"),
    (facts(wifi0, domains: .known(["CORP.EXAMPLE."])), "corp:disconnect"),
    // The probe answered as expected only on the trusted network; unanswered, the rules wait.
    (facts(wifi0, probes: [probe: .expected(proof: nil)]), "intranet:disconnect"),
    (facts(wifi0, probes: [:]), "wait:intranet:probe http://intranet.corp.example/health"),
    (facts(wifi0), "default:connect"),
] as [(NetworkFacts, String)])
func rulesDecideInOrder(_ facts: NetworkFacts, _ expected: String) {
    #expect(rules.evaluate(facts).summary == expected)
}

/// A network's name, search domain or interface is what its bytes are: text that is only
/// canonically equivalent (a precomposed `é` and `e` with a combining acute), or that Unicode
/// lowercases into a rule's (the Kelvin sign into `k`), is another network.
@Test func namesFromTheNetworkMatchByteForByte() {
    let cafe = OnDemandRules([OnDemandRule(name: "cafe", match: .init(ssids: ["Caf\u{E9}"]), action: .disconnect)])
    #expect(cafe.evaluate(facts(wifi0, ssid: .known("Caf\u{E9}"))).summary == "cafe:disconnect")
    #expect(cafe.evaluate(facts(wifi0, ssid: .known("Cafe\u{301}"))).summary == "default:connect")
    let zone = OnDemandRules([OnDemandRule(name: "kit", match: .init(dnsDomains: ["kit.example"]), action: .disconnect)])
    #expect(zone.evaluate(facts(wifi0, domains: .known(["KIT.example"]))).summary == "kit:disconnect")
    #expect(zone.evaluate(facts(wifi0, domains: .known(["\u{212A}it.example"]))).summary == "default:connect")
    #expect(zone.evaluate(facts(wifi0, domains: .known(["eu.kit.example\u{301}"]))).summary == "default:connect")
    #expect(!OnDemandRules.name("e\u{301}th0", matches: "\u{E9}th0") && OnDemandRules.name("\u{E9}th0", matches: "\u{E9}t*"))
}

@Test func aPendingFactDoesNotHoldARuleThatFailsOtherwise() {
    let both = OnDemandRule(name: "both", match: .init(interfaceKinds: [.ethernet], gatewayMACs: ["52:54:00:12:34:56"]),
                            action: .disconnect)
    let r = OnDemandRules([both])
    #expect(r.evaluate(facts(wifi0, mac: .pending)).summary == "default:connect")
    #expect(r.evaluate(facts(eth0, mac: .pending)).summary == "wait:both:gateway-mac")
}

@Test func interfaceNamesMatchExactlyOrByPrefix() {
    #expect(OnDemandRules.name("wlp2s0", matches: "wl*"))
    #expect(!OnDemandRules.name("eth0", matches: "wl*"))
    #expect(OnDemandRules.name("eth0", matches: "eth0") && !OnDemandRules.name("eth01", matches: "eth0"))
}

// MARK: Contradictions at load

private func load(_ text: String) throws(ConfigError) -> OnDemandRules {
    let reader = YAMLReader(file: "client.yaml")
    let root = try reader.document(text)
    guard case .mapping(let entries) = root.value, let node = entries.first?.value else {
        throw ConfigError(file: "client.yaml", line: 0, message: "no on-demand")
    }
    return try reader.onDemandRules(node)
}

@Test func aWellFormedListLoads() throws {
    let r = try load("""
        on-demand:
          - name: office
            match:
              gateway-mac: "52:54:00:12:34:56"
              subnet: 10.20.0.0/16
              probe: {url: "https://10.20.0.1/roam", expect: 204, pin: "sha256//BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc="}
            action: disconnect
            lockdown: lift
          - match: {interface-kind: [wifi, wwan], ssid: Home}
            action: ignore
          - match: {dns-domain: corp.example, probe: {url: "http://intranet.corp.example/", expect: 204}}
            action: disconnect
          - action: connect
        """)
    #expect(r.rules.map(\.name) == ["office", "rule 2", "rule 3", "rule 4"])
    #expect(r.rules[0].liftsLockdown && r.rules[0].line == 2)
    #expect(r.rules[0].match.probe?.pin == KeyPin(hash: Array(repeating: 7, count: 32)))
    #expect(r.rules[0].match.probe?.pin?.description == "sha256//BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=")
    #expect(r.rules[0].match.subnets == [Prefix("10.20.0.0/16")!])
    #expect(r.rules[1].match.interfaceKinds == [.wifi, .wwan])
    #expect(r.rules[2].match.probe == OnDemandRule.Probe(url: "http://intranet.corp.example/", expect: .status(204)))
    // A pinned probe's server must have seen the laptop itself unless the rule says otherwise.
    #expect(r.rules[0].match.probe?.direct == true)
    let natted = try load("""
        on-demand:
          - match:
              probe: {url: "https://10.20.0.1/roam", expect: 204, pin: "sha256//BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=", direct: false}
            action: disconnect
            lockdown: lift
        """)
    #expect(natted.rules[0].match.probe?.direct == false)
}

@Test(arguments: [
    // A rule after one that matches everything can never match.
    ("on-demand:\n  - action: connect\n  - match: {ssid: Home}\n    action: disconnect\n", 3, "can never match"),
    // The same network twice, with opposite actions.
    ("on-demand:\n  - match: {ssid: Office}\n    action: disconnect\n  - match: {ssid: Office}\n    action: connect\n",
     4, "says 'disconnect' where this one says 'connect'"),
    // A narrower rule after a wider one: every /24 inside the /16, and Wi-Fi among Wi-Fi or Ethernet.
    ("on-demand:\n  - match: {subnet: 10.20.0.0/16}\n    action: disconnect\n  - match: {subnet: 10.20.3.0/24}\n    action: connect\n",
     4, "can never match"),
    ("on-demand:\n  - match: {interface-kind: [wifi, ethernet]}\n    action: ignore\n"
        + "  - match: {interface-kind: wifi, ssid: Cafe}\n    action: connect\n", 4, "can never match"),
    ("on-demand:\n  - match: {dns-domain: corp.example}\n    action: ignore\n  - match: {dns-domain: eu.corp.example}\n    action: connect\n",
     4, "can never match"),
    ("on-demand:\n  - match: {interface: \"wl*\"}\n    action: ignore\n  - match: {interface: wlan0}\n    action: connect\n",
     4, "can never match"),
    // Lifting the lockdown only goes with disconnect.
    ("on-demand:\n  - match: {ssid: Home}\n    action: connect\n    lockdown: lift\n", 4, "goes with 'action: disconnect' only"),
    ("on-demand:\n  - match: {ssid: Home}\n    action: disconnect\n    lockdown: open\n", 4, "can only be 'lift'"),
    ("on-demand:\n  - match: {ssid: Home}\n    action: drop\n", 3, "is connect, disconnect or ignore"),
    ("on-demand:\n  - match: {ssid: Home}\n", 2, "action"),
    ("on-demand:\n  - match: {gateway-mac: 52-54-00}\n    action: disconnect\n", 2, "hardware address"),
    ("on-demand:\n  - match: {interface-kind: bluetooth}\n    action: disconnect\n", 2, "'interface-kind' is"),
    ("on-demand:\n  - match: {dns-domain: \"bad domain\"}\n    action: disconnect\n", 2, "domain name"),
    ("on-demand:\n  - match: {probe: {url: \"ftp://x.example/\", expect: 204}}\n    action: disconnect\n", 2, "is an http:// URL"),
    // A lift takes proof: a pinned https:// probe; what the network says of itself is none.
    ("on-demand:\n  - match: {gateway-mac: \"52:54:00:12:34:56\"}\n    action: disconnect\n    lockdown: lift\n", 4,
     "'lockdown: lift' needs proof the network cannot forge"),
    ("on-demand:\n  - match: {ssid: Office, subnet: 10.20.0.0/16, dns-domain: corp.example}\n    action: disconnect\n    lockdown: lift\n",
     4, "needs proof"),
    ("on-demand:\n  - match: {probe: {url: \"http://10.20.0.1/\", expect: 204}}\n    action: disconnect\n    lockdown: lift\n",
     4, "needs proof"),
    // A pin is a SHA-256 in base64 after sha256//, and goes with https:// only; https:// needs one.
    ("on-demand:\n  - match:\n      probe: {url: \"https://x.example/\", expect: 204,\n        pin: \"BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=\"}\n"
        + "    action: disconnect\n", 4, "'pin' is sha256// and the base64"),
    ("on-demand:\n  - match:\n      probe: {url: \"https://x.example/\", expect: 204,\n        pin: \"sha256//BwcHBwcHBwcHBwcHBwcHBwcHBwc=\"}\n"
        + "    action: disconnect\n", 4, "32 bytes"),
    ("on-demand:\n  - match:\n      probe: {url: \"https://x.example/\", expect: 204,\n        pin: \"sha256//not base64 at all, not even close at all=\"}\n"
        + "    action: disconnect\n", 4, "'pin' is"),
    ("on-demand:\n  - match:\n      probe:\n        url: \"http://x.example/\"\n        expect: 204\n"
        + "        pin: \"sha256//BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=\"\n    action: disconnect\n", 4, "a 'pin' needs an https:// url"),
    ("on-demand:\n  - match: {probe: {url: \"https://x.example/\", expect: 204}}\n    action: disconnect\n", 2, "needs the 'pin'"),
    // A lift whose probe's server must see the laptop itself needs the network's subnet, where
    // the network's answers to that address come back to the laptop and not to a relay.
    ("on-demand:\n  - match:\n      probe: {url: \"https://x.example/\", expect: 204,\n        pin: \"sha256//BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=\"}\n"
        + "    action: disconnect\n    lockdown: lift\n", 6, "needs the trusted network's 'subnet'"),
    // Only a pinned probe's server can say where it saw the laptop.
    ("on-demand:\n  - match: {probe: {url: \"http://x.example/\", expect: 204,\n      direct: false}}\n    action: disconnect\n", 3,
     "'direct' is for a pinned https:// probe"),
    ("on-demand:\n  - match: {ssid: \"\(String(repeating: "x", count: 33))\"}\n    action: disconnect\n", 2, "1 to 32 bytes"),
    ("on-demand:\n  - match: {colour: blue}\n    action: disconnect\n", 2, "colour"),
    ("on-demand:\n  - name: a\n    match: {ssid: A}\n    action: connect\n  - name: a\n    match: {ssid: B}\n    action: connect\n",
     5, "two rules are named 'a'"),
] as [(String, Int, String)])
func contradictionsAndMistakesAreLineNumberedErrors(_ text: String, line: Int, message: String) {
    #expect {
        _ = try load(text)
    } throws: { error in
        guard let error = error as? ConfigError else { return false }
        return error.line == line && error.message.contains(message)
    }
}

@Test func overlappingNetworksAreNoConflict() throws {
    // Neither covers the other (an office SSID, a subnet): both may match, the first wins.
    let r = try load("on-demand:\n  - match: {ssid: Office}\n    action: disconnect\n  - match: {subnet: 10.0.0.0/8}\n    action: connect\n")
    #expect(r.rules.count == 2 && r.conflicts.isEmpty)
    // Their intersection after them can never match.
    var three = r
    three.rules.append(OnDemandRule(name: "both", line: 6, match: .init(ssids: ["Office"], subnets: [Prefix("10.0.0.0/8")!]),
                                    action: .ignore))
    #expect(three.conflicts.map(\.line) == [6])
}

// MARK: The core

private func verdict(_ rule: OnDemandRule, on path: Path) -> Input {
    .onDemand(.decided(OnDemandVerdict(action: rule.action, rule: rule.name, liftsLockdown: rule.liftsLockdown,
                                       path: path.id, interface: path.interface)))
}

@Test func aTrustedNetworkAtStartIsNeverTried() {
    var r = Reconnector()
    let decided = r.handle(verdict(lab, on: eth0), now: at(0))
    #expect(r.state == .disconnected(rule: "lab", lifted: nil))
    #expect(!decided.contains(.disconnect) && !decided.contains(.liftLockdown(interface: "eth0")))
    let paths = r.handle(.paths([eth0]), now: at(1))
    #expect(paths.handshakes.isEmpty && paths.binds == 0 && r.nextDeadline == nil)
}

@Test func disconnectEndsTheSessionWithAGoodbyeAndLiftsOnlyWhenTold() {
    var r = connected([eth0])
    let out = r.handle(verdict(lab, on: eth0), now: at(100))
    #expect(out.contains(.disconnect) && !out.contains(.liftLockdown(interface: "eth0")))
    #expect(out.reasons == ["onDemand(lab on eth0: disconnect)"])
    #expect(r.nextDeadline == nil)

    var s = connected([eth0])
    let lifted = s.handle(verdict(office, on: eth0), now: at(100))
    #expect(lifted.contains(.disconnect) && lifted.contains(.liftLockdown(interface: "eth0")))
    #expect(s.state == .disconnected(rule: "office", lifted: eth0.id))
    // Nothing is tried while the rule holds: no traffic, timer, reconnect or wake brings an attempt.
    for input in [Input.dataSent, .reconnectRequested, .wake(sleptFor: .seconds(1)), .serverMoved, .timerFired(.retry)] {
        let o = s.handle(input, now: at(200))
        #expect(o.handshakes.isEmpty && o.probes.isEmpty && o.binds == 0)
    }
}

@Test func leavingTheTrustedNetworkPutsTheLockdownBackAtOnce() {
    var r = connected([eth0, wifi0])
    _ = r.handle(verdict(office, on: eth0), now: at(100))
    // The cable is pulled: Wi-Fi is the best path now, and nothing is decided about it yet.
    let left = r.handle(.paths([wifi0]), now: at(200))
    #expect(left == [.restoreLockdown] + [left.last!] && left.reasons == ["lockdownRestored(left the network)"])
    #expect(r.state == .disconnected(rule: "office", lifted: nil))
    // The rules say connect on the hotel's Wi-Fi: a handshake at once.
    let connect = r.handle(.onDemand(.decided(OnDemandVerdict(action: .connect, rule: "default", path: wifi0.id,
                                                              interface: "wifi0"))), now: at(210))
    #expect(connect.handshakes == ["wifi0"] && !connect.contains(.restoreLockdown))
}

@Test func rulesThatWaitPutALiftedLockdownBack() {
    var r = connected([eth0])
    _ = r.handle(verdict(office, on: eth0), now: at(100))
    let wait = r.handle(.onDemand(.waiting(rule: "office", for: [.gatewayMAC], path: eth0.id)), now: at(200))
    #expect(wait.first == .restoreLockdown && r.state == .disconnected(rule: "office", lifted: nil))
    // Decided again: lifted again.
    let again = r.handle(verdict(office, on: eth0), now: at(300))
    #expect(again == [.liftLockdown(interface: "eth0")] + [again.last!])
    #expect(r.state == .disconnected(rule: "office", lifted: eth0.id))
}

@Test func ignoreKeepsWhatIsButNotALift() {
    var r = connected([wifi0])
    let keep = r.handle(verdict(home, on: wifi0), now: at(100))
    #expect(keep.transitions.isEmpty && r.state == .connected(wifi0))

    var s = connected([eth0])
    _ = s.handle(verdict(office, on: eth0), now: at(100))
    let ignore = s.handle(verdict(home, on: eth0), now: at(200))
    #expect(ignore.first == .restoreLockdown && ignore.handshakes.isEmpty)
    #expect(s.state == .disconnected(rule: "office", lifted: nil))
}

@Test func theOperatorOutranksTheRulesUntilUp() {
    var r = connected([eth0])
    _ = r.handle(verdict(office, on: eth0), now: at(100))
    let down = r.handle(.pause, now: at(200))
    #expect(down.first == .restoreLockdown && r.state == .paused)
    // Up again on the trusted network: as the rules said, lifted again.
    let up = r.handle(.resume, now: at(300))
    #expect(up.handshakes.isEmpty && up.contains(.liftLockdown(interface: "eth0")) && r.state == .disconnected(rule: "office", lifted: eth0.id))
    // A verdict while down is kept for when it comes up.
    _ = r.handle(.pause, now: at(400))
    let connect = r.handle(.onDemand(.decided(OnDemandVerdict(action: .connect, rule: "default", path: eth0.id,
                                                              interface: "eth0"))), now: at(500))
    #expect(connect.handshakes.isEmpty && r.state == .paused)
    #expect(r.handle(.resume, now: at(600)).handshakes == ["eth0"])
}

@Test func connectFromDisconnectedIsBudgeted() {
    var config = Config()
    config.ac.burst = 1
    var r = Reconnector(config: config)
    _ = r.handle(verdict(lab, on: eth0), now: at(0))
    _ = r.handle(.paths([eth0]), now: at(0))
    let connect = Input.onDemand(.decided(OnDemandVerdict(action: .connect, rule: "default", path: eth0.id, interface: "eth0")))
    #expect(r.handle(connect, now: at(10)).handshakes == ["eth0"])
    _ = r.handle(verdict(lab, on: eth0), now: at(20))
    // The rules flipping back and forth cannot buy handshakes past the budget.
    let again = r.handle(connect, now: at(30))
    #expect(again.handshakes.isEmpty && r.state.name == "backing-off")
}

@Test func rulesThatWaitHoldTheFirstAttemptAndIgnoreThenConnects() {
    var r = Reconnector()
    let wait = r.handle(.onDemand(.waiting(rule: "office", for: [.gatewayMAC], path: wifi0.id)), now: at(0))
    #expect(wait.reasons == ["onDemandWaits(office for gateway-mac)"])
    #expect(r.handle(.paths([wifi0]), now: at(1)).handshakes.isEmpty)
    // Home's `ignore` after the wait: nothing was kept down by a rule, so the tunnel comes up.
    #expect(r.handle(verdict(home, on: wifi0), now: at(100)).handshakes == ["wifi0"])
}

@Test func aLiftDoesNotOutliveASleepAndAWakeOnTheTrustedNetworkStaysDown() {
    var r = connected([eth0])
    _ = r.handle(verdict(office, on: eth0), now: at(100))
    let sleep = r.handle(.sleep, now: at(200))
    #expect(sleep.first == .restoreLockdown && r.state == .disconnected(rule: "office", lifted: nil))
    #expect(r.handle(.wake(sleptFor: .seconds(60)), now: at(60_200)).handshakes.isEmpty)
}

@Test func aWakeWhileTheRulesLookHoldsAttempts() {
    var r = connected([wifi0])
    _ = r.handle(.sleep, now: at(100))
    _ = r.handle(.onDemand(.waiting(rule: "office", for: [.gatewayMAC], path: eth0.id)), now: at(200))
    _ = r.handle(.paths([eth0]), now: at(200))
    let wake = r.handle(.wake(sleptFor: .seconds(10)), now: at(10_200))
    #expect(wake.handshakes.isEmpty && wake.probes.isEmpty && r.state == .disconnected(rule: "office", lifted: nil, forRules: true))
}

@Test func aDecisionAfterAWaitIsATransitionNamingItsRule() {
    var r = Reconnector()
    _ = r.handle(.onDemand(.waiting(rule: "office", for: [.gatewayMAC], path: eth0.id)), now: at(0))
    _ = r.handle(.paths([eth0]), now: at(1))
    // Another rule decides, without a lift: the state changes only in its rule, and says so.
    let decided = r.handle(verdict(lab, on: eth0), now: at(100))
    #expect(decided.reasons == ["onDemand(lab on eth0: disconnect)"] && r.state == .disconnected(rule: "lab", lifted: nil))
    // Held by the rule now, not for the rules to look: `ignore` keeps the tunnel down.
    #expect(r.handle(verdict(home, on: eth0), now: at(200)).handshakes.isEmpty)
    // The same decision again is nothing new.
    #expect(r.handle(verdict(lab, on: eth0), now: at(300)).transitions.isEmpty)
}

// MARK: Proof

private let officePin = KeyPin("sha256//BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=")!
private let impostorPin = KeyPin(hash: Array(repeating: 9, count: 32))!
private let pinnedProbe = OnDemandRule.Probe(url: "https://10.20.0.1/roam", expect: .status(204), pin: officePin)
private let provenOffice = OnDemandRule(name: "office", match: .init(gatewayMACs: ["52:54:00:12:34:56"], probe: pinnedProbe),
                                        action: .disconnect, liftsLockdown: true)

private func lifts(_ rules: OnDemandRules, _ facts: NetworkFacts) -> Bool? {
    guard case .decided(let verdict) = rules.evaluate(facts) else { return nil }
    return verdict.liftsLockdown
}

/// A rule that says it lifts but matches on what the network says of itself (made in code: the
/// reader refuses it) decides, and keeps the lockdown: the hardware address is anyone's to answer.
@Test func aLiftWithoutProofNeverHappens() {
    let rules = OnDemandRules([office])
    guard case .decided(let verdict) = rules.evaluate(facts(eth0, mac: .known("52:54:00:12:34:56"))) else {
        Issue.record("the rule decides")
        return
    }
    #expect(verdict.rule == "office" && verdict.action == .disconnect && !verdict.liftsLockdown)
    #expect(!office.match.isProven && provenOffice.match.isProven)
}

/// The pinned probe holds only with the pinned key shown over this very path: a plain answer,
/// another key, a proof made over another uplink, and no answer are no proof.
@Test(arguments: [
    (ProbeResult.expected(proof: directProof(officePin, on: eth0.id)), "office:disconnect", true as Bool?),
    (.expected(proof: nil), "default:connect", false),
    (.expected(proof: directProof(impostorPin, on: eth0.id)), "default:connect", false),
    (.expected(proof: directProof(officePin, on: wifi0.id)), "default:connect", false),
    (.unexpected, "default:connect", false),
] as [(ProbeResult, String, Bool?)])
func aPinnedProbeHoldsOnlyWithItsKeyOnThisPath(_ answer: ProbeResult, _ expected: String, _ lifted: Bool?) {
    let rules = OnDemandRules([provenOffice])
    let f = facts(eth0, mac: .known("52:54:00:12:34:56"), probes: [pinnedProbe: answer])
    #expect(rules.evaluate(f).summary == expected)
    #expect(lifts(rules, f) == lifted)
}

@Test func pinsReadOnlyTheirOwnForm() {
    #expect(officePin.description == "sha256//BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=")
    #expect(KeyPin(officePin.description) == officePin && KeyPin(impostorPin.description) == impostorPin)
    for text in ["BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=", "sha1//BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=",
                 "sha256//BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc", "sha256//BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwd=",
                 "sha256//BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBw-=", "sha256//" + String(repeating: "A", count: 44)] {
        #expect(KeyPin(text) == nil, "\(text)")
    }
}

/// What a probe server that saw the laptop itself gives: the key, the path, and the address and
/// port it saw, which are the ones the connection left from.
func directProof(_ pin: KeyPin, on path: Path.ID) -> KeyProof {
    let here = SocketEndpoint(.v4(0x0a14_0039), port: 40_000)
    return KeyProof(pin: pin, path: path, local: here, seen: here)
}

/// A pinned probe's server that saw the connection come from someone else (a relay), or did not
/// say, proves nothing unless the rule allows a NAT between; the same key over the same path.
@Test func aProofFromAServerThatSawARelayDoesNotHold() {
    let here = SocketEndpoint(.v4(0x0a14_0039), port: 40_000)
    let relay = SocketEndpoint(.v4(0xcb00_7109), port: 41_000)
    for (proof, direct, holds) in [
        (KeyProof(pin: officePin, path: eth0.id, local: here, seen: here), true, true),
        (KeyProof(pin: officePin, path: eth0.id, local: here, seen: relay), true, false),
        (KeyProof(pin: officePin, path: eth0.id, local: here, seen: SocketEndpoint(here.address, port: 40_001)), true, false),
        (KeyProof(pin: officePin, path: eth0.id, local: here, seen: nil), true, false),
        (KeyProof(pin: officePin, path: eth0.id, local: nil, seen: nil), true, false),
        (KeyProof(pin: officePin, path: eth0.id, local: here, seen: relay), false, true),
        (KeyProof(pin: officePin, path: eth0.id, local: here, seen: nil), false, true),
    ] {
        var probe = pinnedProbe
        probe.direct = direct
        let rules = OnDemandRules([OnDemandRule(name: "office", match: .init(probe: probe), action: .disconnect, liftsLockdown: true)])
        let f = facts(eth0, probes: [probe: .expected(proof: proof)])
        #expect((rules.evaluate(f).summary == "office:disconnect") == holds, "\(proof) direct: \(direct)")
        #expect(lifts(rules, f) == (holds ? true : false), "\(proof) direct: \(direct)")
    }
}

/// What servers write for a peer: IPv4, IPv6 with brackets or without (nginx), a dual-stack
/// listener's IPv4-mapped address; anything else is nothing.
@Test func aSeenAddressIsReadAsServersWriteIt() {
    #expect(SocketEndpoint(parsing: "192.0.2.5:41234") == SocketEndpoint(IPAddress("192.0.2.5")!, port: 41234))
    #expect(SocketEndpoint(parsing: " [2001:db8::5]:41234 ") == SocketEndpoint(IPAddress("2001:db8::5")!, port: 41234))
    #expect(SocketEndpoint(parsing: "2001:db8::5:41234") == SocketEndpoint(IPAddress("2001:db8::5")!, port: 41234))
    #expect(SocketEndpoint(parsing: "::ffff:192.0.2.5:41234") == SocketEndpoint(IPAddress("192.0.2.5")!, port: 41234))
    #expect(SocketEndpoint(parsing: "[::ffff:192.0.2.5]:80")?.description == "192.0.2.5:80")
    for bad in ["", "192.0.2.5", "192.0.2.5:0", "192.0.2.5:65536", "host.example:443", "[2001:db8::5]", "192.0.2.5:+80", "192.0.2.5: 80x", "192.0.2.5\u{0}junk:80", "[fe80::1%eth0]:80", "0x7f.1:80"] {
        #expect(SocketEndpoint(parsing: bad) == nil, "\(bad)")
    }
}
