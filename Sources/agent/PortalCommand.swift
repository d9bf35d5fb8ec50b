import Connectivity
import Control
import ControlWire
import ArgumentParser
import Glibc
import Basics

/// `agent portal --run CMD [ARGS...]`: logging in to a captive portal without opening the lockdown.
struct PortalCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "portal", abstract: "Log in to a captive portal: run a browser that may reach the network directly for a while.",
        discussion: """
            Behind a captive portal (`agent status` says state=portal, with the portal's URL) the tunnel \
            cannot come up until someone logs in, and the lockdown stops the login page too. This opens a \
            portal window: COMMAND, and every process it starts, may reach the network through the portal's \
            uplink (DNS to the network's own resolvers, HTTP and HTTPS) for at most the configured time \
            (portal: {window: 5m}); every other process stays locked down. The window closes when the \
            connectivity check passes (the tunnel then comes up at once), when its time is up, when the \
            network changes, or when COMMAND ends. Root and members of the 'roam' group may open one.

            Example: agent portal --run firefox --new-window http://neverssl.com
            """)
    @OptionGroup var options: ControlOptions
    @Option(name: .customLong("run"), parsing: .unconditional, help: ArgumentHelp("The program to log in with (a browser).", valueName: "COMMAND"))
    var command: String?
    @Argument(parsing: .captureForPassthrough, help: "Its arguments.")
    var arguments: [String] = []

    func validate() throws {
        // The arguments take everything after the options, a request for help included.
        if command == nil, let first = arguments.first, ["-h", "--help", "help"].contains(first) {
            throw CleanExit.helpRequest(Self.self)
        }
    }

    func run() throws {
        guard let command, !command.isEmpty else {
            throw AgentError("agent portal needs --run COMMAND: the browser (or curl) to log in with, e.g. agent portal --run firefox")
        }
        // Before any window opens: a command that cannot start leaves nothing open.
        guard let executable = Self.find(command) else {
            throw AgentError("cannot run '\(command)': no such program" + (command.contains("/") ? "" : " in PATH"))
        }
        let answer = try ControlClient.ask(.portalOpen, at: options.control)
        let url = answer["url"]?.string ?? "?"
        let window = Duration.seconds(Int(((answer["for_ms"]?.double ?? 0) / 1000).rounded()))
        printError("portal window open for \(window.short) on \(answer["interface"]?.string ?? "?"): log in at \(url)")
        let resolvers = (answer["resolvers"]?.array ?? []).compactMap { $0.string.flatMap(IPAddress.init) }
        if let plan = PortalResolution.plan(resolvers: resolvers, resolvConf: SystemFiles.text("/etc/resolv.conf") ?? "",
                                            nsswitch: SystemFiles.text("/etc/nsswitch.conf")) {
            do {
                try PortalResolution.isolate(resolvConf: plan.resolvConf, nsswitch: plan.nsswitch)
                printError("\(command) resolves names with the network's resolvers: \(resolvers.map(\.description).joined(separator: ", "))")
            } catch {
                printError("warning: \(error.message); \(command)'s look-ups go where the portal holds them back: "
                    + "open the login page by its address")
            }
        }
        let status: Int32
        do {
            status = try Self.spawnAndWait(executable, [command] + arguments)
        } catch {
            _ = try? ControlClient.ask(.portalClose, at: options.control)
            throw error
        }
        // The window may have closed already (the portal opened); closing it again is harmless.
        _ = try? ControlClient.ask(.portalClose, at: options.control)
        if status != 0 { throw ExitCode(status) }
    }

    /// The program's path: as given when it names a path, else the first executable of that
    /// name in PATH.
    static func find(_ command: String, path: String? = getenv("PATH").map { String(cString: $0) }) -> String? {
        if command.contains("/") { return access(command, X_OK) == 0 && !isDirectory(command) ? command : nil }
        for directory in (path ?? "/usr/local/bin:/usr/bin:/bin").split(separator: ":") where !directory.isEmpty {
            let candidate = "\(directory)/\(command)"
            if access(candidate, X_OK) == 0 && !isDirectory(candidate) { return candidate }
        }
        return nil
    }

    private static func isDirectory(_ path: String) -> Bool {
        var info = stat()
        return stat(path, &info) == 0 && (info.st_mode & S_IFMT) == S_IFDIR
    }

    /// Starts the program (it inherits this process's cgroup, the window's) and waits for it;
    /// an interrupt goes to it, and this process closes the window after it ends.
    private static func spawnAndWait(_ executable: String, _ argv: [String]) throws -> Int32 {
        var pid: pid_t = 0
        var cArguments = argv.map { strdup($0) } + [nil]
        defer { for pointer in cArguments { free(pointer) } }
        let result = posix_spawn(&pid, executable, nil, nil, &cArguments, environ)
        guard result == 0 else { throw AgentError("cannot run '\(argv[0])': \(String(cString: strerror(result)))") }
        signal(SIGINT, SIG_IGN)
        signal(SIGTERM, SIG_IGN)
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 {
            guard errno == EINTR else { return 1 }
        }
        if status & 0x7f == 0 { return (status >> 8) & 0xff }  // exited
        return 128 + (status & 0x7f)  // killed by a signal, as a shell reports it
    }
}
