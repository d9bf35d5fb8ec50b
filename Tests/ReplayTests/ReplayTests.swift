import Testing
@testable import Replay
import Reconnector

/// Every file in the scenario library replays and meets its expectations.
@Test(arguments: Scenario.files())
func scenario(_ file: String) throws {
    let scenario = try Scenario.load(file)
    var replay = Replay(scenario)
    let report = try replay.run()
    #expect(report.violations == [], "invariants")
    #expect(report.failures == [], "expectations")
    #expect(!report.transitions.isEmpty)
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
