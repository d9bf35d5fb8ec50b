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
        if case .switching(_, let candidate, _, _) = to { out.append(("candidate", candidate.name)) }
        if let server { out.append(("server", server)) }
        out.append(("attempt", String(attempt)))
        if let nextRetry { out.append(("next_retry", "in " + (nextRetry - at).short)) }
        out.append(("coalesced", String(coalesced)))
        return out
    }
}
