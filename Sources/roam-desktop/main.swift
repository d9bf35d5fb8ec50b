import ControlWire
import DesktopShell
import Glibc

/// `roam-desktop [--hidden] [--socket PATH] [--profiles DIR] [--browser PROGRAM]`: the desktop app, one per
/// session. It talks to the agent only through the control socket and holds no secrets.
struct DesktopOptions: Sendable {
    /// The agent's control socket (`ROAM_CONTROL_SOCKET`, else the client's default).
    var socket = ControlSocket.defaultPath
    /// Where the profiles are (`ROAM_PROFILES`, else /etc/roam).
    var profiles = Profiles.directory
    /// The program `agent portal --run` opens the login page with.
    var browser = "xdg-open"
    /// The agent's executable, for `agent portal` (`ROAM_AGENT`, else `agent` in PATH).
    var agent = "agent"
    /// Start in the background (the session's autostart): the tray and the notifications, no
    /// window until one is asked for.
    var hidden = false

    static let usage = """
        usage: roam-desktop [--hidden] [--socket PATH] [--profiles DIR] [--browser PROGRAM]
          --hidden            start in the background: the tray icon and notifications, no window until
                              it is opened (from the tray, a notification or starting roam-desktop again)
          --socket PATH       the agent's control socket (default: $ROAM_CONTROL_SOCKET, else \(ControlSocket.defaultPath))
          --profiles DIR      where the profiles are (default: $ROAM_PROFILES, else /etc/roam)
          --browser PROGRAM   what opens a captive portal's login page (default: xdg-open)
        "Log in" runs `agent portal --run PROGRAM URL` ($ROAM_AGENT names another agent executable).
        """

    /// The options from the environment and the arguments; a mistake is said with the usage.
    init(arguments: [String], environment: (String) -> String?) throws(UsageError) {
        if let socket = environment("ROAM_CONTROL_SOCKET"), !socket.isEmpty { self.socket = socket }
        if let profiles = environment("ROAM_PROFILES"), !profiles.isEmpty { self.profiles = profiles }
        if let agent = environment("ROAM_AGENT"), !agent.isEmpty { self.agent = agent }
        var rest = arguments[...]
        while let argument = rest.popFirst() {
            switch argument {
            case "--socket", "--profiles", "--browser":
                guard let value = rest.popFirst(), !value.isEmpty else { throw UsageError("\(argument) needs a value") }
                switch argument {
                case "--socket": socket = value
                case "--profiles": profiles = value
                default: browser = value
                }
            case "--hidden": hidden = true
            case "-h", "--help": throw UsageError(nil)
            default: throw UsageError("unknown argument '\(argument)'")
            }
        }
    }

    struct UsageError: Error {
        /// What was wrong; nil when help was asked for.
        var problem: String?
        init(_ problem: String?) { self.problem = problem }
    }
}

let options: DesktopOptions
do {
    options = try DesktopOptions(arguments: Array(CommandLine.arguments.dropFirst())) { name in
        getenv(name).map { String(cString: $0) }
    }
} catch {
    if let problem = error.problem {
        let text = Array("roam-desktop: \(problem)\n\(DesktopOptions.usage)\n".utf8)
        _ = text.withUnsafeBytes { write(STDERR_FILENO, $0.baseAddress, $0.count) }
        exit(2)
    }
    print(DesktopOptions.usage)
    exit(0)
}

let app = DesktopApp(options: options)

/// The app behind a callback's context; GTK calls back on the main thread only.
private func desktopApp(_ context: UnsafeMutableRawPointer?) -> DesktopApp? {
    context.map { Unmanaged<DesktopApp>.fromOpaque($0).takeUnretainedValue() }
}

let callbacks = RoamShellCallbacks(
    context: Unmanaged.passUnretained(app).toOpaque(),
    activate: { context in MainActor.assumeIsolated { desktopApp(context)?.activate() } },
    switch_toggled: { context, on in MainActor.assumeIsolated { desktopApp(context)?.switchToggled(on: on) } },
    log_in: { context in MainActor.assumeIsolated { desktopApp(context)?.logIn() } },
    deliver: { context, item in
        guard let item else { return }
        let delivery = Unmanaged<Box<Delivery>>.fromOpaque(item).takeRetainedValue().value
        MainActor.assumeIsolated { desktopApp(context)?.deliver(delivery) }
    },
    notification_action: { context, key in
        let key = key.map { String(cString: $0) } ?? ""
        MainActor.assumeIsolated { desktopApp(context)?.notificationAction(key) }
    },
    menu_chosen: { context, index in MainActor.assumeIsolated { desktopApp(context)?.menuChosen(Int(index)) } },
    import_chosen: { context, path in
        guard let path else { return }
        let chosen = String(cString: path)
        MainActor.assumeIsolated { desktopApp(context)?.importChosen(chosen) }
    },
    command_finished: { context, tag, status, output in
        let said = output.map { String(cString: $0) } ?? ""
        MainActor.assumeIsolated { desktopApp(context)?.commandFinished(tag: Int(tag), status: status, output: said) }
    },
    profile_chosen: { context, index in MainActor.assumeIsolated { desktopApp(context)?.profileChosen(Int(index)) } })
exit(roam_shell_run("org.roam.Desktop", callbacks))
