import Control
import ControlWire
import Observability
import ArgumentParser
import Basics
import Reconnector
import Replay
import Timeline

/// `agent replay`: runs scenario timelines through the real model and state machine.
struct ReplayCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "replay",
        abstract: "Replay scenario timelines on a virtual clock and check their expectations.",
        discussion: """
            Prints one operator log line per transition and a verdict per file. Exit status: 0 when \
            every file passes, 1 when an expectation or invariant fails, 2 when a file is malformed.

            With --timeline out.svg it also draws the replay of one scenario file (or of a --random \
            timeline) as an SVG picture: the session's states, the path in use, each uplink, the \
            outages, and marks for handshakes, attempts, backoffs, sleeps, portals and on-demand \
            decisions. A span longer than ten minutes gets a summary and panels zoomed on its busy \
            stretches.
            """)

    @Argument(help: "Scenario files or directories (default: the scenario library).")
    var files: [String] = []

    @Option(help: "Replay a generated random timeline with this seed instead of files.")
    var random: UInt64?

    @Option(help: "Events in a generated timeline.")
    var events = 120

    @Flag(help: "Print log lines as JSON objects.")
    var json = false

    @Flag(name: .shortAndLong, help: "Print only the verdicts, not the transitions.")
    var quiet = false

    @Option(help: ArgumentHelp("Also draw the replay of one scenario file as an SVG timeline, written to this file.",
                               valueName: "out.svg"))
    var timeline: String?

    func validate() throws {
        guard timeline != nil, random == nil else { return }
        guard files.count == 1, let file = files.first else {
            throw ValidationError("--timeline draws one replay: give one scenario file"
                + (files.isEmpty ? " (with none, the whole library would be replayed)" : ", not \(files.count)"))
        }
        if SystemFiles.isDirectory(file) {
            throw ValidationError("--timeline draws one replay: \(file) is a directory; give one scenario file in it")
        }
    }

    func run() throws {
        var paths: [String] = []
        for file in random != nil ? [] : files.isEmpty ? [Scenario.libraryPath] : files {
            if SystemFiles.isDirectory(file) {
                paths += Scenario.files(in: file)
            } else {
                paths.append(file)
            }
        }
        var malformed = 0
        var failed = 0
        var passed = 0
        let sources: [String?] = random != nil ? [nil] : paths
        for path in sources {
            do {
                let scenario = try path.map { file throws(ScenarioError) in try Scenario.load(file) }
                    ?? Scenario.random(seed: random ?? 0, events: events, spacing: .milliseconds(700))
                let path = path ?? scenario.file
                // The picture needs the trace: when the uplinks changed, when the machine slept.
                var replay = Replay(scenario, keepTrace: timeline != nil)
                if !quiet { print("== \(scenario.name) (\(path))") }
                let report = try replay.run { transition in
                    if !quiet { print("  " + (json ? transition.json : transition.logfmt)) }
                }
                let summary = "attempts=\(report.attempts) handshakes=\(report.handshakes) resends=\(report.resends) probes=\(report.probes) "
                    + "size_probes=\(report.sizeProbes) mtu=\(report.tunnelMTU) max_outage=\(report.maxOutage.short)"
                    + (report.restores + report.holds > 0 ? " restores=\(report.restores) holds=\(report.holds)" : "")
                    + " final=\(report.finalState.name)"
                    + (report.fromServer > 0 ? " from_server=\(report.fromServer) lost_from_server=\(report.lostFromServer)" : "")
                    + (report.keepalives > 0 ? " keepalives=\(report.keepalives)" : "")
                    + (report.gaveUp.map { " gave_up_at=\($0.at)" } ?? "")
                if report.passed {
                    passed += 1
                    print("PASS \(path) \(summary)")
                } else {
                    failed += 1
                    print("FAIL \(path) \(summary)")
                    for line in report.violations { print("  invariant broken: \(line)") }
                    for line in report.failures { print("  \(line)") }
                }
                if let timeline {
                    let svg = SVGTimeline.render(TimelineModel(report: report, scenario: scenario))
                    do {
                        try SystemFiles.write(svg, to: timeline)
                    } catch {
                        throw AgentError("the timeline is not saved to \(timeline): \(error)")
                    }
                    print("  timeline written to \(timeline)")
                }
            } catch let error as ScenarioError {
                malformed += 1
                printError("\(error)")
            } catch let error as ReplayError {
                malformed += 1
                printError("\(error)")
            }
        }
        print("\(passed) passed, \(failed) failed" + (malformed > 0 ? ", \(malformed) malformed" : ""))
        if malformed > 0 { throw ExitCode(2) }
        if failed > 0 { throw ExitCode(1) }
    }
}

func printError(_ message: String) {
    // Under systemd the journal reads standard error: the priority makes `journalctl -p err` show it.
    writeStandardError((OperatorLogHandler.standardErrorIsJournal() ? "<3>" : "") + "agent: " + message + "\n")
}
