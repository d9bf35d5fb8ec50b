import Topology
import Testing
@testable import Replay
import Reconnector
import Basics
import PathMonitor

/// Every file in the scenario library replays and meets its expectations.
@Test(arguments: Scenario.files())
func scenario(_ file: String) throws {
    let scenario = try Scenario.load(file)
    var replay = Replay(scenario)
    let report = try replay.run()
    #expect(report.violations == [], "invariants")
    #expect(report.failures == [], "expectations")
    // Something happened: a change of state, or an agent that ended as it started.
    #expect(!report.transitions.isEmpty || report.gaveUp != nil)
}

@Test func theLibraryHasScenarios() {
    #expect(Scenario.files().count >= 15)
}

/// Thousands of seeded random lives never break an invariant: no attempt while offline,
/// attempts within the budget, one handshake in flight, a logged reason for every change.
@Test(arguments: 0..<8)
func randomTimelinesKeepTheInvariants(batch: UInt64) throws {
    for seed in batch * 250..<(batch + 1) * 250 {
        var replay = Replay(Scenario.random(seed: seed, events: 120, spacing: .milliseconds(700)))
        let report = try replay.run()
        #expect(report.violations == [], "seed \(seed)")
        #expect(report.transitions.allSatisfy { !$0.reason.description.isEmpty })
        if !report.violations.isEmpty { break }
    }
}

/// The same lives with the stream transport on, on networks that start and stop blocking UDP
/// (or let only a proxy out, the client naming none) and middleboxes that reset streams: the
/// invariants hold whatever carries the session.
@Test(arguments: 0..<4)
func randomTimelinesWithTheStreamKeepTheInvariants(batch: UInt64) throws {
    var onStream = 0
    for seed in batch * 100..<(batch + 1) * 100 {
        var scenario = Scenario.random(seed: seed, events: 120, spacing: .milliseconds(700))
        scenario.config.stream = Config.StreamPolicy()
        var rng = SeededRandom(seed: seed ^ 0x5354_5245)
        let filters: [LinkFilter] = [.none, .udp, .udpButDNS, .allButProxy, .none]
        for i in 0..<30 {
            var spec = LinkSpec(name: ["eth0", "wifi0", "wwan0"][Int(rng.next() % 3)])
            spec.blocks = filters[Int(rng.next() % UInt64(filters.count))]
            if rng.next() % 4 == 0 { spec.streamResetAfter = .seconds(Int64(rng.next() % 20)) }
            let at = Instant.zero + .milliseconds(Int64(rng.next() % 84_000))
            scenario.timeline.append(TimedEvent(at: at, line: 1000 + i, event: .link(spec)))
        }
        var replay = Replay(scenario)
        let report = try replay.run()
        #expect(report.violations == [], "seed \(seed)")
        if !report.violations.isEmpty { break }
        if report.transitions.contains(where: { $0.to.path?.transport == .stream }) { onStream += 1 }
    }
    #expect(onStream > 10, "the stream carried the session in \(onStream) lives of 100")
}

/// The same lives with what an operator and the networks add: captive portals and logins, the
/// portal window opened and closed, applications excluded, the tunnel's routes, resolvers and
/// lockdown taken away (by someone who keeps fighting, or once), a lockdown that refuses windows
/// or exclusions, a laptop with no full tunnel's lockdown, and split routes the server's name
/// moves into: every refusal path and every answer, and the invariants hold.
@Test(arguments: 0..<4)
func randomTimelinesWithPortalsExclusionsAndRefusalsKeepTheInvariants(batch: UInt64) throws {
    var refused = 0
    var portals = 0
    for seed in batch * 100..<(batch + 1) * 100 {
        let scenario = portalsAndRefusals(seed: seed)
        var replay = Replay(scenario)
        let report = try replay.run()
        #expect(report.violations == [], "seed \(seed)")
        if !report.violations.isEmpty { break }
        refused += report.portalWindowsFailed + report.exclusionsRefused
        portals += report.transitions.filter { $0.to.name == "portal" }.isEmpty ? 0 : 1
    }
    // The lives reach what they are for.
    #expect(refused > 10, "refusals in 100 lives: \(refused)")
    #expect(portals > 10, "lives that met a portal: \(portals)")
}

/// A random life with portals, windows, exclusions, takings and refusals (see above).
func portalsAndRefusals(seed: UInt64) -> Scenario {
    var scenario = Scenario.random(seed: seed, events: 120, spacing: .milliseconds(700))
        var rng = SeededRandom(seed: seed ^ 0x504F_5254)
        func pick(_ n: Int) -> Int { Int(rng.next() % UInt64(n)) }
        scenario.exclusionAllowed = pick(3) != 0
        scenario.portalWindows = pick(4) != 0
        if pick(2) == 0 { scenario.lockdownRefuses.insert(.portalWindow) }
        if pick(2) == 0 { scenario.lockdownRefuses.insert(.exclusion) }
        // The server's next address (where `server: moved` takes its name) inside the split routes, at times.
        if pick(3) == 0 { scenario.splitRoutes = [Prefix("198.51.100.8/29")!] }
        let uplinks = ["eth0", "wifi0", "wwan0"]
        for i in 0..<30 {
            let at = Instant.zero + .milliseconds(Int64(pick(84_000)))
            let dev = uplinks[pick(3)]
            let event: ScenarioEvent = switch pick(8) {
            case 0: .portal(dev: dev, url: "http://portal.example/login")
            case 1: .login(dev)
            case 2, 3: .portalWindow(pick(3) != 0)
            case 4: .exclude
            case 5: .taken([.routing, .resolvers, .lockdown][pick(3)], by: pick(2) == 0 ? "NetworkManager" : nil,
                           fighting: pick(2) == 0 ? .seconds(Int64(1 + pick(20))) : nil)
            case 6: .operatorPause(pick(2) == 0)
            default: .server(.moved)
            }
            scenario.timeline.append(TimedEvent(at: at, line: 2000 + i, event: event))
        }
        scenario.timeline.sort { $0.at < $1.at }
        return scenario
}

@Test func anExpectationThatDoesNotHoldFails() throws {
    let text = """
        server: 198.51.100.7
        network:
          links: [{name: eth0, kind: ethernet}]
          addresses: [{dev: eth0, addr: 10.0.0.2/24}]
          routes: [{to: default, via: 10.0.0.1, dev: eth0, metric: 100}]
        expect:
          state: offline
          path: wifi0
          max-handshakes: 0
          sequence: [switching]
          never: [connected]
        """
    var replay = Replay(try Scenario.parse(text, file: "t.yaml"))
    let report = try replay.run()
    #expect(report.violations.isEmpty)
    #expect(report.failures.count == 5)
    #expect(report.failures.contains("final state: expected offline, got connected"))
}

/// `never` takes a reason as `sequence` does, and the replay's own CPU time can be bounded.
@Test func neverWithAReasonAndTheReplaysCPUTime() throws {
    let text = """
        server: 198.51.100.7
        network:
          links: [{name: eth0, kind: ethernet}]
          addresses: [{dev: eth0, addr: 10.0.0.2/24}]
          routes: [{to: default, via: 10.0.0.1, dev: eth0, metric: 100}]
        expect:
          never: ["connected:handshakeSucceeded", "connecting:serverAddress", offline]
          max-cpu: 1ns
        """
    var replay = Replay(try Scenario.parse(text, file: "t.yaml"))
    let report = try replay.run()
    #expect(report.failures.count == 2, "\(report.failures)")
    #expect(report.failures.contains { $0.contains("'connected:handshakeSucceeded' forbids") })
    #expect(report.failures.contains { $0.hasPrefix("replay CPU time") })
    #expect(report.cpuTime > .zero)
}

@Test(arguments: [
    ("server: nowhere", 1, "'server' needs an IP address"),
    ("server: [198.51.100.7, 198.51.100.7]", 1, "twice"),
    ("server: []", 1, "lists no address"),
    ("server: 198.51.100.7\nexpect: {never: [\"dancing:x\"]}", 2, "unknown state"),
    ("server: 198.51.100.7\nbogus: 1", 2, "unknown key 'bogus'"),
    ("server: 198.51.100.7\ntimeline:\n  - {at: 5s, sleep: true}\n  - {at: 4s, wake: true}", 4, "time goes backwards"),
    ("server: 198.51.100.7\ntimeline:\n  - {at: 5s, teleport: true}", 3, "unknown key 'teleport'"),
    ("server: 198.51.100.7\ntimeline:\n  - {at: 5s}", 3, "exactly one event"),
    ("server: 198.51.100.7\ntimeline:\n  - {at: soon, wake: true}", 3, "expected a duration"),
    ("server: 198.51.100.7\ntimeline:\n  - {at: 1s, wake: true}", 3, "without a 'sleep'"),
    ("server: 198.51.100.7\nnetwork:\n  addresses: [{dev: eth0, addr: 10.0.0.1}]", 3, "needs address/length"),
    ("server: 198.51.100.7\nexpect: {state: dancing}", 2, "unknown state"),
    ("server: 198.51.100.7\n  bad: [", 2, "not valid YAML"),
    ("", 1, "empty"),
    // Expansions are counted before anything is generated: no hang, no gigabytes.
    ("server: 1.2.3.4\ntimeline: [{at: 0, flap: {dev: eth0, every: 1ns, for: 1d}}]", 2, "a scenario may hold at most"),
    ("server: 1.2.3.4\ntimeline: [{at: 0, restart: {every: 1us, for: 1h}}]", 2, "a scenario may hold at most"),
    ("server: 1.2.3.4\ntraffic: 1ns\nuntil: 1d", 2, "packets"),
    ("server: 1.2.3.4\nnetwork:\n  links: [{name: eth0, loss: 130%}]", 3, "from 0% to 100%"),
    ("server: 1.2.3.4\nnetwork:\n  links: [{name: eth0, loss-up: -1}]", 3, "from 0% to 100%"),
    ("server: 1.2.3.4\ntimeline: [{at: 3s, clock-jump: -5s}]", 2, "the clock cannot go back 5s"),
    // Traffic in phases: each phase's packets count, and the one that crosses the bound is named.
    ("server: 1.2.3.4\ntraffic: 1s\ntimeline:\n  - {at: 10s, traffic: idle}\n  - {at: 20s, traffic: 1ns}\nuntil: 1d", 5, "packets"),
    ("server: 1.2.3.4\nserver-traffic: {every: 1us}\nuntil: 1d", 2, "packets"),
    ("server: 1.2.3.4\nserver-traffic: idle", 2, "'idle' is for the timeline"),
    ("server: 1.2.3.4\ntimeline:\n  - {at: 1s, traffic: often}", 3, "is idle, a duration"),
    ("server: 1.2.3.4\ntimeline:\n  - {at: 1s, server-traffic: {every: 1s, rate: 5}}", 3, "unknown key 'rate'"),
    ("server: 1.2.3.4\npersistent-keepalive: 500ms", 2, "1s to 1h"),
    ("server: 1.2.3.4\nnetwork:\n  links: [{name: eth0, loss-v6: 2}]", 3, "from 0% to 100%"),
])
func malformedFilesGiveLineNumberedErrors(text: String, line: Int, message: String) {
    #expect {
        try Scenario.parse(text, file: "bad.yaml")
    } throws: { error in
        guard let error = error as? ScenarioError else { return false }
        return error.line == line && error.message.contains(message)
    }
}

@Test func eventsNamingUnknownLinksFailWithTheirLine() throws {
    let text = "server: 198.51.100.7\ntimeline:\n  - {at: 1s, addr-add: {dev: ghost0, addr: 10.0.0.2/24}}"
    var replay = Replay(try Scenario.parse(text, file: "t.yaml"))
    #expect {
        try replay.run()
    } throws: { error in
        (error as? ReplayError).map { $0.line == 3 && $0.message.contains("ghost0") } ?? false
    }
}

@Test func replayIsDeterministic() throws {
    let scenario = Scenario.random(seed: 42, events: 300, spacing: .milliseconds(400))
    var a = Replay(scenario)
    var b = Replay(scenario)
    #expect(try a.run().transitions == b.run().transitions)
}

@Test func durationsParse() {
    #expect(ScenarioParser.parseDuration("250ms") == .milliseconds(250))
    #expect(ScenarioParser.parseDuration("1.5s") == .milliseconds(1500))
    #expect(ScenarioParser.parseDuration("1h30m") == .seconds(5400))
    #expect(ScenarioParser.parseDuration("0") == .zero)
    #expect(ScenarioParser.parseDuration("5") == nil)
    #expect(ScenarioParser.parseDuration("5 parsecs") == nil)
    #expect(ScenarioParser.parseDuration("") == nil)
}

/// The server sends what it starts to where it last heard the agent from: a NAT that forgot the
/// mapping loses it, a persistent keepalive keeps the mapping.
@Test func packetsTheServerStartsNeedTheMappingAKeepaliveKeeps() throws {
    func run(keepalive: String) throws -> ReplayReport {
        let text = """
            server: 198.51.100.7
            \(keepalive)
            server-traffic: 40s
            network:
              links: [{name: wwan0, kind: wwan, rtt: 80ms, nat-timeout: 30s}]
              addresses: [{dev: wwan0, addr: 10.64.0.9/30}]
              routes: [{to: default, via: 10.64.0.10, dev: wwan0}]
            until: 10m
            """
        var replay = Replay(try Scenario.parse(text, file: "t.yaml"))
        return try replay.run()
    }
    let without = try run(keepalive: "")
    #expect(without.fromServer == 15 && without.lostFromServer == 15, "\(without.fromServer) \(without.lostFromServer)")
    #expect(without.keepalives == 0)
    let with = try run(keepalive: "persistent-keepalive: 25s")
    // (The last one is still on its way when the replay ends.)
    #expect(with.fromServer == 14 && with.lostFromServer == 0, "\(with.fromServer) \(with.lostFromServer)")
    #expect((23...24).contains(with.keepalives), "\(with.keepalives)")
}

/// Loss of one address family: a path of the other family does not feel it.
@Test func lossOfOneFamilySparesTheOther() throws {
    func run(_ address: String, _ route: String) throws -> ReplayReport {
        let text = """
            server: \(address.contains(":") ? "2001:db8::7" : "198.51.100.7")
            traffic: 100ms
            network:
              links: [{name: wifi0, kind: wifi, loss-v6: 100%}]
              addresses: [{dev: wifi0, addr: \(address)}]
              routes: [{to: default, via: \(route), dev: wifi0}]
            until: 30s
            """
        var replay = Replay(try Scenario.parse(text, file: "t.yaml"))
        return try replay.run()
    }
    let v4 = try run("192.168.1.23/24", "192.168.1.1")
    #expect(v4.finalState.name == "connected" && v4.handshakes == 1)
    let v6 = try run("2001:db8:1::23/64", "fe80::1")
    #expect(v6.finalState.name != "connected" && v6.handshakes > 1)
}

/// What the operator reads of a flap storm is decided by the core's own flap damping: one
/// "flapping" for the storm beside a healthy Wi-Fi, none for a cable pulled once.
@Test func theOperatorHearsOfAFlapStormOnceAndOfOneLossNever() throws {
    var storm = Replay(try Scenario.load(Scenario.libraryPath + "/flap-storm-beside-healthy-wifi.yaml"))
    #expect(try storm.run().flapNotices == 1)
    var once = Replay(try Scenario.load(Scenario.libraryPath + "/ethernet-unplugged-wifi-up.yaml"))
    #expect(try once.run().flapNotices == 0)
}

