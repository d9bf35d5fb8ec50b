import ArgumentParser
import Basics
import Glibc
import Timeline

/// `agent timeline`: a picture of what the running agent did, from its log.
struct TimelineCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "timeline",
        abstract: "Draw what the agent did over the last hours, from its log, as an SVG picture.",
        discussion: """
            Reads the agent's log lines (from the journal of Roam's client units, or from --log FILE, '-' for \
            standard input, for an agent run by hand) and draws the session's states as bands, the path in use, \
            the outages (from leaving a working tunnel to the next connected, not while asleep, paused or on a \
            trusted network), and marks for attempts, handshakes, backoffs, sleeps and wakes, portal and \
            on-demand decisions, streams opened or failed, and what others took away. A long span gets a \
            summary and zoomed panels on its busy stretches, as `agent replay --timeline` does. Reads the \
            logfmt lines the agent writes by default (not --log-format json).
            """)

    @Argument(help: "Where to write the picture (an SVG file).")
    var out: String

    @Option(help: "How far back to draw: 30m, 2h, 1d (at most 7 days).")
    var since: String = "1h"

    @Option(help: ArgumentHelp("Read the agent's log from this file ('-': standard input) instead of the journal.", valueName: "file"))
    var log: String?

    func run() throws {
        guard let span = Self.span(since) else { throw ValidationError("--since is a number and m, h or d, at most 7 days: 30m, 2h, 1d") }
        let now = Double(time(nil))
        let text: String
        let source: String
        switch log {
        case "-"?:
            var bytes: [UInt8] = []
            var buffer = [UInt8](repeating: 0, count: 65_536)
            while bytes.count < 64 << 20 {
                let n = read(0, &buffer, buffer.count)
                if n < 0, errno == EINTR { continue }
                guard n > 0 else { break }
                bytes += buffer[0..<n]
            }
            (text, source) = (String(decoding: bytes, as: UTF8.self), "standard input")
        case let file?:
            guard let bytes = SystemFiles.bytes(file, limit: 64 << 20) else { throw AgentError("cannot read \(file)") }
            (text, source) = (String(decoding: bytes, as: UTF8.self), file)
        case nil:
            guard let journalctl = PortalCommand.find("journalctl", path: CommandOutput.path) else {
                throw AgentError("no journalctl here: give the agent's log with --log FILE")
            }
            text = CommandOutput.run(journalctl, ["journalctl", "--no-pager", "-o", "cat", "--since=-\(span / 60)min",
                                                  "-u", "roam-client.service", "-u", "roam@*"], limit: 64 << 20, timeout: .seconds(30))
            source = "the journal"
        }
        // At most a million lines: a log that long is many days of a busy agent.
        let lines = text.split(whereSeparator: \.isNewline).prefix(1_000_000).compactMap(TimelineModel.parse)
        // A saved log is drawn whole; the journal from --since ago to now.
        let from = log == nil ? now - Double(span) : nil
        let transitions = lines.filter { $0.message == "transition" }.count
        guard transitions > 0 else {
            throw AgentError("no transition in \(source)\(log == nil ? " over the last \(since)" : ""): nothing to draw")
        }
        let model = TimelineModel(log: lines, source: source, from: from, to: log == nil ? now : nil)
        do {
            // Owner-only: the picture holds what the journal keeps from other users (addresses, networks).
            try SystemFiles.write(SVGTimeline.render(model), to: out, mode: 0o600)
        } catch {
            throw AgentError("the timeline is not saved to \(out): \(error)")
        }
        print("\(out): \(transitions) transitions, \(model.lanes.first { $0.kind == .outage }?.bands.count ?? 0) outages")
    }

    /// Seconds in `30m`, `2h`, `1d`; nil for anything else, or more than 7 days.
    static func span(_ text: String) -> Int? {
        guard let unit = text.last, let number = Int(text.dropLast()), number > 0, number <= 7 * 86_400 else { return nil }
        let seconds: Int
        switch unit {
        case "m": seconds = number * 60
        case "h": seconds = number * 3600
        case "d": seconds = number * 86_400
        default: return nil
        }
        return seconds <= 7 * 86_400 ? seconds : nil
    }
}
