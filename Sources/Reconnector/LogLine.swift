/// Operator log lines for transitions: logfmt for people and grep, JSON lines for machines.
extension Transition {
    /// `t=12.300 from=connected to=probing trigger=timer:liveness reason="livenessTimeout(1s)" ...`
    public var logfmt: String {
        fields.map { key, value in
            let needsQuotes = value.contains(" ") || value.contains("\"") || value.contains("=") || value.isEmpty
            return "\(key)=" + (needsQuotes ? Self.quoted(value) : value)
        }.joined(separator: " ")
    }

    /// The same fields as one JSON object.
    public var json: String {
        "{" + fields.map { key, value in
            let number = key == "t" || key == "attempt" || key == "coalesced"
            return Self.quoted(key) + ":" + (number ? value : Self.quoted(value))
        }.joined(separator: ",") + "}"
    }

    private var fields: [(String, String)] {
        var out: [(String, String)] = [
            ("t", at.description), ("from", from.name), ("to", to.name), ("trigger", trigger),
            ("reason", reason.description),
        ]
        if let path = to.path { out.append(("path", "\(path.interface)/\(path.source)")) }
        if case .switching(_, let candidate, _) = to { out.append(("candidate", candidate.interface)) }
        out.append(("attempt", String(attempt)))
        if let nextRetry { out.append(("next_retry", nextRetry.description)) }
        out.append(("coalesced", String(coalesced)))
        return out
    }

    private static func quoted(_ s: String) -> String {
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
