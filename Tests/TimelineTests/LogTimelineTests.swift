import Testing
import Basics
import Reconnector
import Replay
@testable import Timeline

/// A scenario's transitions, written as the daemon logs them (`ts=... level=info msg=transition`
/// and the transition's fields), read back into a picture.
private func loggedReplay(_ name: String, at base: Double = 1_796_169_000) throws -> (ReplayReport, [TimelineModel.LoggedLine]) {
    let scenario = try Scenario.load(Scenario.libraryPath + "/" + name)
    var replay = Replay(scenario)
    let report = try replay.run()
    let lines = report.transitions.map { t in
        "<6>ts=\(base + Double(t.at.nanoseconds) / 1e9) level=info msg=transition " + LogLine.logfmt(t.fields)
    }
    return (report, lines.compactMap { TimelineModel.parse($0[...]) })
}

@Test func aLogLineIsReadWithItsQuotedValuesAndTheJournalsPriority() throws {
    let line = try #require(TimelineModel.parse(#"<4>ts=1796169000.250 level=warning msg="taken away by someone else" what=routing missing="rule \"v4\" 32765""#))
    #expect(line.time == 1_796_169_000.25 && line.message == "taken away by someone else")
    #expect(line.fields["what"] == "routing" && line.fields["missing"] == #"rule "v4" 32765"#)
    #expect(TimelineModel.parse("not a log line") == nil)
    #expect(TimelineModel.parse("level=info msg=transition from=a to=b") == nil, "no time")
}

@Test func aLoggedTransitionsPictureHasTheReplaysStatesPathsAndOutages() throws {
    let (report, lines) = try loggedReplay("ethernet-unplugged-wifi-up.yaml")
    #expect(lines.count == report.transitions.count)
    let model = TimelineModel(log: lines, source: "a test")
    let session = try #require(model.lanes.first { $0.kind == .session })
    // One band per transition, in the state it went to, from the log's first line on.
    #expect(session.bands.map(\.label) == report.transitions.map(\.to.name))
    let paths = try #require(model.lanes.first { $0.kind == .path })
    #expect(paths.bands.contains { $0.label == "eth0" } && paths.bands.last?.label == "wifi0")
    #expect(model.marks.filter { $0.kind == .handshake }.count
        == report.transitions.filter { if case .handshakeSucceeded = $0.reason { true } else { false } }.count)
    #expect(model.marks.contains { $0.kind == .attempt })
    let svg = SVGTimeline.render(model)
    #expect(svg.contains("What the agent did") && svg.contains("state-connected"))
}

@Test func aTunnelThatStopsWorkingIsAnOutageUntilItIsConnectedAgain() throws {
    // The name moves into the split routes: the session backs off until the end, after 60 s connected.
    let (_, lines) = try loggedReplay("server-name-moves-into-the-split-routes.yaml")
    let model = TimelineModel(log: lines, source: "a test", to: 1_796_169_000 + 180)
    let outages = try #require(model.lanes.first { $0.kind == .outage }).bands
    #expect(outages.count == 1)
    let outage = try #require(outages.first)
    #expect(outage.from > .zero + .seconds(60) && outage.from < .zero + .seconds(64) && outage.to == .zero + .seconds(180))
    // A stretch that ends connected again is an outage that ends there.
    let (_, healed) = try loggedReplay("server-moved.yaml")
    #expect(TimelineModel(log: healed, source: "a test").lanes.first { $0.kind == .outage }?.bands.allSatisfy { $0.to < .zero + .seconds(62) } == true)
}
