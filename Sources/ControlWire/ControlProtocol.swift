/// The control socket's messages, version 1 (docs/CONTROL.md): one JSON object per line each
/// way. A request names a command; every answer says `version` and `ok`, with the command's
/// fields or an `error` with a code; a watch then streams `event` lines.
public enum ControlProtocol {
    public static let version: Int64 = 1
    /// The longest request line accepted; a longer one is refused unread.
    public static let maxRequestBytes = 4096
}

/// What an operator may ask a running agent.
public enum ControlCommand: String, CaseIterable, Sendable {
    /// The state, path, server, counters and last transition.
    case status
    /// The status, then every change as it happens, until the asker hangs up.
    case watch
    /// Drop the session and handshake afresh (bypasses the reconnect budget).
    case reconnect
    /// Treat the machine as about to suspend.
    case sleep
    /// Treat the machine as resumed.
    case wake
    /// End the session and stay down, the tunnel device and the lockdown kept (a paused VPN).
    case down
    /// Connect again after `down`.
    case up
    /// End the session and stop, opening the machine again: the lockdown and the tunnel's
    /// resolvers go. The only way a running client opens the machine; a signal never does.
    case stop
    /// (A server) tell every session to move to another server, then stop.
    case drain
    /// Behind a captive portal: let the asking process, and the processes it starts, reach the
    /// network directly for a while to log in (`agent portal --run`).
    case portalOpen = "portal-open"
    /// Close the portal window (its process ended).
    case portalClose = "portal-close"
    /// Keep the asking process (or the one the request's `pid` names, which must run as the
    /// asker), and the processes it starts, outside the tunnel (`agent exclude`; needs
    /// `exclusion: allow`).
    case exclude
    /// Run another installed profile (the request's `profile`, `/etc/roam/NAME.yaml` beside the
    /// configuration the agent runs) in place of this one: checked first, then the agent starts
    /// afresh in place with it, the lockdown kept throughout.
    case useProfile = "use-profile"

    /// Whether members of the `roam` group may ask it too: reading status, watching, logging in
    /// to a portal, keeping their own applications outside the tunnel where the configuration
    /// allows it. Everything else changes the agent, and only root may ask.
    public var openToReaders: Bool {
        self == .status || self == .watch || self == .portalOpen || self == .portalClose || self == .exclude
    }

    /// Whether the operators' group (the `roam` group, unless the configuration says
    /// `operators: root`) may ask it too: turning the tunnel on and off, reconnecting it and
    /// choosing which installed profile it runs. What is installed, the lockdown and the agent's
    /// life stay root's.
    public var forOperators: Bool {
        self == .up || self == .down || self == .reconnect || self == .useProfile
    }
}

/// A request the agent refuses, with a code a program can act on.
public struct ControlFailure: Error, Equatable, Sendable {
    /// `bad-request`, `unsupported-version`, `unknown-command`, `too-large`, `timeout`,
    /// `not-permitted`, `not-here` (a command for the other role), `busy`, `no-answer`.
    public var code: String
    public var message: String

    public init(code: String, message: String) {
        self.code = code
        self.message = message
    }

    public var line: String {
        JSON.object([("version", .int(ControlProtocol.version)), ("ok", .bool(false)),
                     ("error", .object([("code", .string(code)), ("message", .string(message))]))]).text
    }
}

extension ControlProtocol {
    /// The command a request line asks for: `{"version":1,"command":"status"}`, or, for people
    /// typing at the socket, the bare command word.
    public static func command(in line: String) -> Result<ControlCommand, ControlFailure> {
        let text = line.trimmed
        let known = ControlCommand.allCases.map(\.rawValue).joined(separator: ", ")
        guard text.first == "{" else {
            guard let command = ControlCommand(rawValue: text) else {
                return .failure(ControlFailure(code: "unknown-command", message: "unknown command; the commands are: \(known)"))
            }
            return .success(command)
        }
        let request: JSON
        do {
            request = try JSON.parse(text)
        } catch {
            return .failure(ControlFailure(code: "bad-request", message: "not JSON: \(error)"))
        }
        if let version = request["version"] {
            guard version.int == ControlProtocol.version else {
                return .failure(ControlFailure(code: "unsupported-version", message: "this agent speaks version \(ControlProtocol.version)"))
            }
        }
        guard let name = request["command"]?.string else {
            return .failure(ControlFailure(code: "bad-request", message: "a request is {\"version\":1,\"command\":NAME}"))
        }
        guard let command = ControlCommand(rawValue: name) else {
            return .failure(ControlFailure(code: "unknown-command", message: "unknown command \"\(name)\"; the commands are: \(known)"))
        }
        return .success(command)
    }

    /// The request line for `command`, about process `pid` when given, which started at `started`
    /// (/proc/PID/stat's start time, as the asker read it: the agent moves no other process that
    /// came to have the id since), or naming `profile`.
    public static func request(_ command: ControlCommand, pid: Int32? = nil, started: UInt64? = nil, profile: String? = nil) -> String {
        JSON.object([("version", .int(version)), ("command", .string(command.rawValue))]
            + (pid.map { [("pid", .int(Int64($0)))] } ?? []) + (started.map { [("started", .int(Int64(clamping: $0)))] } ?? [])
            + (profile.map { [("profile", .string($0))] } ?? [])).text
    }

    /// The profile a request names (`"profile"`): nil when it names none; one that cannot be a
    /// profile's name is refused, never made into a path.
    public static func profile(in line: String) -> Result<String?, ControlFailure> {
        guard line.trimmed.first == "{", let request = try? JSON.parse(line.trimmed), let value = request["profile"] else { return .success(nil) }
        guard let name = value.string, Profiles.isName(name) else {
            return .failure(ControlFailure(code: "bad-request", message: "\"profile\" is a profile's name: letters, digits, '-' and '_'"))
        }
        return .success(name)
    }

    /// When the process a request names started, as the asker read it; nil when not said.
    public static func targetStarted(in line: String) -> UInt64? {
        guard line.trimmed.first == "{", let request = try? JSON.parse(line.trimmed), let started = request["started"]?.int,
              started >= 0 else { return nil }
        return UInt64(started)
    }

    /// The process a request names (`"pid"`): nil when it names none; a `pid` that cannot be a
    /// process is refused, never taken as the asker's own.
    public static func target(in line: String) -> Result<Int32?, ControlFailure> {
        guard line.trimmed.first == "{", let request = try? JSON.parse(line.trimmed), let value = request["pid"] else { return .success(nil) }
        guard let pid = value.int, pid > 1, pid <= Int64(Int32.max) else {
            return .failure(ControlFailure(code: "bad-request", message: "\"pid\" is a process id: a number above 1"))
        }
        return .success(Int32(pid))
    }

    /// A successful answer: `{"version":1,"ok":true,...fields}`.
    public static func answer(_ fields: [(String, JSON)]) -> String {
        JSON.object([("version", .int(version)), ("ok", .bool(true))] + fields).text
    }

    /// One line of a watch: `{"version":1,"event":KIND,...fields}`.
    public static func event(_ kind: String, _ fields: [(String, JSON)]) -> String {
        JSON.object([("version", .int(version)), ("event", .string(kind))] + fields).text
    }
}

extension JSON {
    /// A counter as a number (clamped, should one ever pass Int64's range).
    public static func count<T: BinaryInteger>(_ n: T) -> JSON { .int(Int64(clamping: n)) }
}

extension Duration {
    /// Milliseconds as a number, to the microsecond.
    public var milliseconds: JSON {
        let (seconds, attoseconds) = components
        return .double((Double(seconds) * 1000 + Double(attoseconds / 1_000_000_000_000) / 1000))
    }
}
