import Connectivity
import Control
import ControlWire
import ArgumentParser
import Glibc
import Basics

/// `agent exclude -- COMMAND [ARGS...]` and `agent exclude --pid PID`: applications kept outside
/// the tunnel on purpose.
struct ExcludeCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "exclude", abstract: "Run a program outside the tunnel, or move a running one there.",
        discussion: """
            COMMAND, and every process it starts, reaches the network directly through the current \
            uplink, in clear, with the network's own resolvers; every other process stays in the \
            tunnel and the lockdown. For a game, a bank that refuses VPN addresses, a backup to a \
            NAS over the internet. --pid moves a running process (and what it starts from then on) \
            instead: your own, or anyone's as root. The agent allows it only with 'exclusion: allow' \
            in its configuration (full mode, lockdown on); root and members of the 'roam' group may \
            ask. The processes stay outside the tunnel until they end or the agent stops; \
            `agent status` lists them.

            Example: agent exclude -- steam
            """)
    @OptionGroup var options: ControlOptions
    @Option(help: ArgumentHelp("A running process to move outside the tunnel.", valueName: "PID"))
    var pid: Int32?
    @Argument(parsing: .captureForPassthrough, help: ArgumentHelp("The program to run outside the tunnel, and its arguments.", valueName: "COMMAND"))
    var command: [String] = []

    func validate() throws {
        if pid == nil, let first = command.first, ["-h", "--help", "help"].contains(first) { throw CleanExit.helpRequest(Self.self) }
        guard (pid == nil) != command.filter({ $0 != "--" }).isEmpty else {
            throw ValidationError("give either --pid PID or -- COMMAND [ARGS...]")
        }
        if let pid, pid <= 1 { throw ValidationError("--pid names a process: a number above 1") }
    }

    func run() throws {
        if let pid {
            // The process as it is now: should it end and its id be taken meanwhile, the agent
            // moves nobody.
            guard let started = PeerProcess.startTime(pid) else { throw AgentError("there is no process \(pid)") }
            let answer = try ControlClient.ask(.exclude, at: options.control, pid: pid, started: started)
            print(answer["message"]?.string ?? "process \(pid) is outside the tunnel")
            return
        }
        let argv = command.first == "--" ? Array(command.dropFirst()) : command
        guard let name = argv.first, !name.isEmpty else { throw AgentError("agent exclude needs a COMMAND to run") }
        // Before this process leaves the tunnel: a command that cannot start leaves nothing behind.
        guard let executable = PortalCommand.find(name) else {
            throw AgentError("cannot run '\(name)': no such program" + (name.contains("/") ? "" : " in PATH"))
        }
        let answer = try ControlClient.ask(.exclude, at: options.control)
        let resolvers = (answer["resolvers"]?.array ?? []).compactMap { $0.string.flatMap(IPAddress.init) }
        // Its look-ups go to the network's resolvers: the lockdown sends them there whatever
        // resolv.conf names, but a local stub (systemd-resolved's) would ask through the tunnel.
        if let plan = PortalResolution.plan(resolvers: resolvers, resolvConf: SystemFiles.text("/etc/resolv.conf") ?? "",
                                            nsswitch: SystemFiles.text("/etc/nsswitch.conf")) {
            do {
                try PortalResolution.isolate(resolvConf: plan.resolvConf, nsswitch: plan.nsswitch)
            } catch {
                printError("warning: \(error.message); \(name)'s look-ups may go through the tunnel")
            }
        }
        var arguments = argv.map { strdup($0) } + [nil]
        execv(executable, &arguments)
        let code = errno
        for pointer in arguments { free(pointer) }
        throw AgentError("cannot run '\(name)': \(String(cString: strerror(code)))")
    }
}
