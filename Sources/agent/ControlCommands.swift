import Control
import ControlWire
import ArgumentParser
import Glibc
import Reconnector
import Basics

/// What the control commands share: where the agent's control socket is.
struct ControlOptions: ParsableArguments {
    @Option(help: "The agent's control socket.")
    var control: String = ControlSocket.defaultPath
}

/// `agent status`.
struct StatusCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "status", abstract: "Show the running agent's state, path, server, counters and last transition.",
        discussion: """
            Root and members of the 'roam' group may read the status. --json prints the control socket's \
            answer as it came (docs/CONTROL.md); --watch prints the status and then every change as it \
            happens, one line each, until the agent stops or the command is interrupted.
            """)
    @OptionGroup var options: ControlOptions
    @Flag(help: "Print JSON, one object per line.")
    var json = false
    @Flag(help: "Keep printing every state change as it happens.")
    var watch = false

    func run() throws {
        guard watch else {
            let answer = try ControlClient.ask(.status, at: options.control)
            return print(json ? answer.text : StatusText.lines(answer["status"] ?? .null).joined(separator: "\n"))
        }
        // Each line goes out as it is printed (standard output is line-buffered), so an
        // interrupt loses nothing.
        try ControlClient.watch(at: options.control) { message in
            print(json ? message.text : StatusText.event(message))
            return true
        }
    }
}

/// The status as text for people and grep: one `key=value` per line, nested fields as
/// `path.interface=eth0`.
enum StatusText {
    static func lines(_ value: JSON) -> [String] { fields(value).map { LogLine.logfmt([$0]) } }

    /// Every scalar field, nested ones under dotted keys, in order.
    static func fields(_ value: JSON, prefix: String = "") -> [(String, String)] {
        guard case .object(let members) = value else { return [(prefix, scalar(value))] }
        return members.flatMap { key, value in fields(value, prefix: prefix.isEmpty ? key : prefix + "." + key) }
    }

    /// One line per watch event: its kind, the transition's fields, then the state.
    static func event(_ message: JSON) -> String {
        var line: [(String, String)] = [("event", message["event"]?.string ?? "?")]
        if let transition = message["transition"]?.fields {
            line += transition.compactMap { key, value in
                if case .object = value { return value["interface"].map { (key, scalar($0)) } }
                return (key, scalar(value))
            }
        } else if let status = message["status"] {
            let shown = ["state", "server.name", "path.interface", "path.source", "rtt_ms"]
            line += fields(status).filter { shown.contains($0.0) }
        }
        if let why = message["why"]?.string { line.append(("why", why)) }
        return LogLine.logfmt(line)
    }

    private static func scalar(_ value: JSON) -> String {
        switch value {
        case .null: "none"
        case .bool(let b): b ? "true" : "false"
        case .int(let n): String(n)
        case .double(let d): d == d.rounded() ? String(Int64(d)) : String(format3(d))
        case .string(let s): s
        case .array(let items): items.map(scalar).joined(separator: ",")
        case .object: value.text
        }
    }

    /// Up to three decimals, trailing zeros cut.
    private static func format3(_ d: Double) -> String {
        var text = String(Int64((d * 1000).rounded()))
        let negative = text.hasPrefix("-")
        if negative { text.removeFirst() }
        while text.count < 4 { text = "0" + text }
        var out = String(text.dropLast(3)) + "." + String(text.suffix(3))
        while out.hasSuffix("0") { out.removeLast() }
        if out.hasSuffix(".") { out.removeLast() }
        return (negative ? "-" : "") + out
    }
}

/// Sends one command to the running agent and prints what it said.
private func ask(_ command: ControlCommand, _ options: ControlOptions) throws {
    let answer = try ControlClient.ask(command, at: options.control)
    print(answer["message"]?.string ?? answer.text)
}

/// `agent reconnect`.
struct ReconnectCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "reconnect", abstract: "Ask the running client for a fresh handshake on the best path.")
    @OptionGroup var options: ControlOptions
    func run() throws { try ask(.reconnect, options) }
}

/// `agent sleep`.
struct SleepCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "sleep", abstract: "Tell the running client the machine is about to suspend (as SIGTSTP does).")
    @OptionGroup var options: ControlOptions
    func run() throws { try ask(.sleep, options) }
}

/// `agent wake`.
struct WakeCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "wake", abstract: "Tell the running client the machine resumed (as SIGCONT does).")
    @OptionGroup var options: ControlOptions
    func run() throws { try ask(.wake, options) }
}

/// `agent down`.
struct DownCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "down", abstract: "Disconnect the running client without stopping it; `agent up` connects again.",
        discussion: """
            The session ends with a goodbye to the server and nothing is tried until `agent up`. The tunnel \
            device stays, and so does the lockdown: with it on, the machine's traffic is stopped while the \
            tunnel is down, as with a paused always-on VPN. To stop the agent and open the machine again, \
            stop its service (systemctl stop roam).
            """)
    @OptionGroup var options: ControlOptions
    func run() throws { try ask(.down, options) }
}

/// `agent use-profile NAME`.
struct UseProfileCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "use-profile", abstract: "Ask the running client to run another installed profile in place of its own.",
        discussion: """
            The profile is /etc/roam/NAME.yaml (beside the configuration the agent runs). The agent checks it as a \
            start would and, when it passes, starts afresh in place with it, the lockdown kept throughout; a \
            profile with a mistake changes nothing. Root and the operators' group may ask. The choice lasts \
            until the agent's service starts again, which runs its own profile.
            """)
    @Argument(help: "The profile's name.")
    var name: String
    @OptionGroup var options: ControlOptions

    func validate() throws {
        guard Profiles.isName(name) else { throw ValidationError("'\(name)' cannot be a profile's name: letters, digits, '-' and '_'") }
    }

    func run() throws {
        let answer = try ControlClient.ask(.useProfile, at: options.control, profile: name)
        print(answer["message"]?.string ?? answer.text)
    }
}
