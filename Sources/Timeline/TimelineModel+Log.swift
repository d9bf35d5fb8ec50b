import Basics

/// A running agent's picture, from what it logged: each `msg=transition` line (the states, the
/// path, the attempts, handshakes, backoffs, portal and on-demand decisions), and the lines
/// that say a stream opened or failed, something was taken away, or an interface flapped.
/// Lines of the logfmt format the agent writes (`ts=... level=... msg=...`), as the journal
/// keeps them; anything else is skipped.
extension TimelineModel {
    /// One line's fields, when it is one of the agent's logfmt lines with a time.
    public struct LoggedLine: Sendable, Equatable {
        /// Wall-clock seconds since 1970.
        public var time: Double
        public var message: String
        public var fields: [String: String]
    }

    /// The agent's logfmt line's fields (`key=value`, `key="quoted \" value"`); nil for a line
    /// that is not one (no `ts`, no `msg`). A journal's priority prefix (`<6>`) is skipped.
    public static func parse(_ line: Substring) -> LoggedLine? {
        var rest = line
        if rest.first == "<", let close = rest.firstIndex(of: ">"), rest.distance(from: rest.startIndex, to: close) <= 3 {
            rest = rest[rest.index(after: close)...]
        }
        var fields: [String: String] = [:]
        while let start = rest.firstIndex(where: { $0 != " " }) {
            rest = rest[start...]
            guard let equals = rest.firstIndex(of: "="), !rest[..<equals].contains(" ") else { return nil }
            let key = String(rest[..<equals])
            rest = rest[rest.index(after: equals)...]
            var value = ""
            if rest.first == "\"" {
                rest = rest.dropFirst()
                var escaped = false
                while let c = rest.first {
                    rest = rest.dropFirst()
                    if escaped {
                        value.append(c == "n" ? "\n" : c)
                        escaped = false
                    } else if c == "\\" {
                        escaped = true
                    } else if c == "\"" {
                        break
                    } else {
                        value.append(c)
                    }
                }
            } else {
                let end = rest.firstIndex(of: " ") ?? rest.endIndex
                value = String(rest[..<end])
                rest = rest[end...]
            }
            fields[key] = value
        }
        // A time from 2001 to 2286 (the agent writes the wall clock's seconds): anything else,
        // `nan` or `inf` included, is not one of its lines.
        guard let ts = fields["ts"].flatMap(Double.init), ts >= 1e9, ts < 1e10, let message = fields["msg"] else { return nil }
        // Names the picture shows are short words; a line with others is not the agent's.
        for key in ["to", "from"] where fields[key].map({ $0.count > 24 || !$0.allSatisfy { $0.isLetter || $0 == "-" } }) ?? false {
            return nil
        }
        if let path = fields["path"], path.count > 80 { return nil }
        return LoggedLine(time: ts, message: message, fields: fields)
    }

    /// The picture of what `lines` tell, from the first line's time (or `from`, when given) to
    /// `to` (a little after the last line's when nil); `source` names where they came from.
    public init(log lines: [LoggedLine], source: String, from: Double? = nil, to: Double? = nil) {
        let sorted = lines.sorted { $0.time < $1.time }
        let origin = from ?? sorted.first?.time ?? 0
        // A saved log ends a little after its last line, so that its last state shows.
        let logged = sorted.last?.time ?? origin
        let last = max(to ?? logged + max(1, (logged - origin) / 20), origin)
        func at(_ time: Double) -> Instant { Instant(nanoseconds: Int64(((max(time, origin) - origin) * 1e9).rounded())) }
        let end = at(last)

        var states: [Band] = []
        var paths: [Band] = []
        var outages: [Band] = []
        var marks: [Mark] = []
        var state: String?
        var path: String?
        var since = Instant.zero
        var why = "before the log's first transition"
        var down: Instant?
        var names: Set<String> = []
        var interfaces: Set<String> = []
        let carrying: Set<String> = ["connected", "probing", "switching"]
        // States in which no tunnel is expected (asleep, paused by the operator, on a trusted network).
        let quiet: Set<String> = ["sleeping", "paused", "disconnected", "offline"]
        func close(_ until: Instant) {
            guard let current = state, until > since || states.isEmpty else { return }
            states.append(Band(from: since, to: until, paint: .state(current), label: current,
                               detail: "\(current) from \(since)s to \(until)s (\((until - since).short)): \(why)"))
            guard let path, path != "none" else { return }
            let name = String(path.split(separator: "/").first ?? Substring(path))
            let paint = Paint.path(name, carrying: carrying.contains(current))
            if var previous = paths.last, previous.paint == paint, previous.to == since {
                previous.to = until
                paths[paths.count - 1] = previous
            } else {
                paths.append(Band(from: since, to: until, paint: paint, label: name,
                                  detail: "\(carrying.contains(current) ? "on" : "heading for") \(path) from \(since)s"))
            }
        }
        let wall = { (time: Double) in "\(Self.utc(time)) UTC" }
        for line in sorted {
            let t = at(line.time)
            let f = line.fields
            switch line.message {
            case "transition":
                guard var to = f["to"] else { continue }
                // A few dozen names at most: past them, a log that makes up names gets one band colour.
                if !names.contains(to) { if names.count < 32 { names.insert(to) } else { to = "other" } }
                close(t)
                let reason = f["reason"] ?? ""
                // An outage runs from leaving a working tunnel (not for a quiet state) to the next connected.
                if down == nil, let from = f["from"], carrying.contains(from), !carrying.contains(to), !quiet.contains(to) { down = t }
                if let began = down, to == "connected" || quiet.contains(to) {
                    if to == "connected" {
                        outages.append(Band(from: began, to: t, paint: .outage, label: "outage " + (t - began).short,
                                            detail: "no working tunnel from \(wall(line.time - Double((t - began).nanoseconds) / 1e9)) for \((t - began).short)"))
                    }
                    down = nil
                }
                state = to
                path = f["path"].map { path in
                    let interface = String(path.split(separator: "/").first ?? Substring(path))
                    guard !interfaces.contains(interface) else { return path }
                    guard interfaces.count < 32 else { return "other" }
                    interfaces.insert(interface)
                    return path
                }
                since = t
                why = "\(f["trigger"] ?? "-"): \(reason)"
                if let mark = Self.mark(reason: reason, to: to, attempt: f["attempt"]) {
                    marks.append(Mark(at: t, kind: mark.kind, label: mark.label,
                                      detail: "\(wall(line.time)): \(f["from"] ?? "-") to \(to), \(why), path \(f["path"] ?? "none")"))
                }
            case let message where Self.worldLabels[message] != nil:
                let what = f["what"] ?? f["interface"] ?? f["path"] ?? ""
                let rest = f.filter { !["ts", "level", "msg"].contains($0.key) }.sorted { $0.key < $1.key }
                marks.append(Mark(at: t, kind: .world, label: Self.worldLabels[message]! + (what.isEmpty ? "" : " " + what),
                                  detail: "\(wall(line.time)): \(message) " + rest.map { "\($0.key)=\($0.value)" }.joined(separator: " ")))
            default:
                continue
            }
        }
        close(max(end, since))
        if let began = down, end > began {
            outages.append(Band(from: began, to: end, paint: .outage, label: "outage " + (end - began).short,
                                detail: "no working tunnel for \((end - began).short), to the end of the log"))
        }
        let transitions = sorted.filter { $0.message == "transition" }.count
        self.init(
            title: "What the agent did",
            subtitle: "\(source) · from \(wall(origin)) for \((end - .zero).short) · \(transitions) transitions · "
                + "\(marks.filter { $0.kind == .handshake }.count) handshakes · \(outages.count) outages",
            start: .zero, end: end,
            lanes: [Lane(kind: .session, name: "session", bands: states), Lane(kind: .path, name: "path", bands: paths),
                    Lane(kind: .outage, name: "outage", bands: outages)],
            marks: marks)
    }

    /// The other lines worth a mark, and their short labels.
    static let worldLabels: [String: String] = [
        "stream opened": "stream opened", "stream failed": "stream failed", "taken away by someone else": "taken",
        "put back": "put back", "interface flapping": "flapping",
        "the server's name gives no address this machine can use now; keeping its address": "name unusable",
    ]

    /// The mark a logged transition's reason calls for (as `mark(_:)` for a replay's).
    static func mark(reason: String, to: String, attempt: String?) -> (kind: Mark.Kind, label: String)? {
        func argument() -> String {
            guard let open = reason.firstIndex(of: "("), reason.last == ")" else { return "" }
            return String(reason[reason.index(after: open)..<reason.index(before: reason.endIndex)])
        }
        if reason.hasPrefix("handshakeSucceeded") { return (.handshake, "handshake " + argument().replacing("rtt ", with: "")) }
        if reason.hasPrefix("handshakeTimeout") { return (.handshakeFailed, "handshake timeout") }
        if reason.hasPrefix("rejected") { return (.handshakeFailed, "rejected") }
        if reason.hasPrefix("sessionUnknown") { return (.handshakeFailed, "session lost") }
        if reason.hasPrefix("backoff") { return (.backoff, "backoff " + argument()) }
        if reason.hasPrefix("budgetExhausted") { return (.backoff, "no token " + argument()) }
        if reason.hasPrefix("portalWindowOpened") { return (.portal, "window " + argument()) }
        if reason.hasPrefix("portalWindowClosed") { return (.portal, "window closed") }
        if reason.hasPrefix("onDemand") { return (.onDemand, argument().isEmpty ? "on-demand" : argument()) }
        if reason.hasPrefix("sleep") || to == "sleeping" { return (.sleep, "sleep") }
        if reason.hasPrefix("wake") { return (.wake, "wake") }
        guard to == "connecting" else { return nil }
        return (.attempt, "attempt \(attempt ?? "?")")
    }

    /// `2026-12-01 23:58:35` for wall-clock seconds, in UTC.
    static func utc(_ seconds: Double) -> String { utcText(Int64(seconds.rounded(.down)), "%Y-%m-%d %H:%M:%S") }
}
