import Basics

/// Operator log lines for transitions: logfmt for people and grep, JSON lines for machines.
extension Transition {
    /// `t=12.300 from=connected to=probing trigger=timer:liveness reason="livenessTimeout(1s)" ...`
    public var logfmt: String { LogLine.logfmt([("t", at.description)] + fields) }

    /// The same fields as one JSON object.
    public var json: String { LogLine.json([("t", at.description)] + fields, numbers: ["t", "attempt", "coalesced"]) }

    /// What an operator reads about a transition, in the order of every log line: from, to,
    /// trigger, reason, path, candidate, attempt, the next retry (how long after the
    /// transition), coalesced inputs.
    public var fields: [(String, String)] {
        var out: [(String, String)] = [
            ("from", from.name), ("to", to.name), ("trigger", trigger), ("reason", reason.description),
            ("path", to.path.map { "\($0.interface)/\($0.source)" + ($0.transport == .stream ? "/tls" : "") } ?? "none"),
        ]
        if case .switching(_, let candidate, _) = to { out.append(("candidate", candidate.name)) }
        if let server { out.append(("server", server)) }
        out.append(("attempt", String(attempt)))
        if let nextRetry { out.append(("next_retry", "in " + (nextRetry - at).short)) }
        out.append(("coalesced", String(coalesced)))
        return out
    }
}

/// The two line formats every operator log line of the agent uses.
public enum LogLine {
    /// `key=value key="value with spaces"`.
    public static func logfmt(_ fields: [(String, String)]) -> String {
        fields.map { key, value in
            let needsQuotes = value.isEmpty || value.contains { $0 == " " || $0 == "\"" || $0 == "=" || $0 == "\n" }
            return "\(key)=" + (needsQuotes ? quoted(value) : value)
        }.joined(separator: " ")
    }

    /// One JSON object; keys in `numbers` are written unquoted.
    public static func json(_ fields: [(String, String)], numbers: Set<String> = ["t"]) -> String {
        "{" + fields.map { key, value in
            quoted(key) + ":" + (numbers.contains(key) ? value : quoted(value))
        }.joined(separator: ",") + "}"
    }

    /// `s` as a JSON string literal, quotes included.
    public static func quotedJSON(_ s: String) -> String { quoted(s) }

    static func quoted(_ s: String) -> String {
        var out = "\""
        for c in s.unicodeScalars {
            switch c {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            default:
                if c.value < 0x20 { out += "\\u" + String(String(c.value + 0x10000, radix: 16).dropFirst()) } else {
                    out.unicodeScalars.append(c)
                }
            }
        }
        return out + "\""
    }
}
