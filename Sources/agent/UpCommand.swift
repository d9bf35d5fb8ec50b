import Control
import ControlWire
import Lockdown
import SystemDNS
import Logging
import ArgumentParser
import ConfigReader
import Glibc
import Basics
import Tunnel
import Settings

/// `agent up`: bring the tunnel up over the current path and keep it until stopped.
struct UpCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "up",
        abstract: "Keep the tunnel up: follow the path to the server through roams, suspends and restarts.",
        discussion: """
            With --config, starts the agent. Without it, asks the running agent to connect again after \
            `agent down`. \
            The session's UDP socket is bound to the current path's interface and source address and \
            moves when the path does; the TUN device is configured once, after the first handshake, and \
            stays. SIGTSTP means the machine is about to suspend, SIGCONT that it resumed; SIGHUP reads the \
            configuration again (tunables apply at once, other changes restart the agent); SIGTERM or \
            SIGINT tell the server goodbye and take the tunnel down, and leave the lockdown firewall \
            loaded, as a restart in place, a give-up or a crash does: only `agent stop` (or `agent \
            lockdown off`) opens the machine. While it runs, the agent also holds the lockdown's rules in \
            a table no other process may delete (nftables table inet roam_guard, Linux 5.12+).
            """)

    @OptionGroup var daemon: DaemonOptions
    @OptionGroup var control: ControlOptions

    @Option(help: ArgumentHelp(
        "Before the tunnel first comes up, give up (exit 1) after this long without an answer on a usable path; 0 waits for ever.",
        discussion: "Time without any network does not count. Once the tunnel is up, the agent never gives up by itself."))
    var waitForServer = "30s"

    func validate() throws {
        guard YAMLReader.parseDuration(waitForServer) != nil else {
            throw ValidationError("'--wait-for-server' is a duration such as 30s or 2m, or 0")
        }
    }

    /// What the daemon hears from systemd, the sleep hook and the operator.
    static let signals = [SIGINT, SIGTERM, SIGTSTP, SIGCONT, SIGHUP]

    func run() throws {
        guard let configPath = daemon.config else {
            // The running agent, taken down by `agent down`, connects again.
            let answer = try ControlClient.ask(.up, at: control.control)
            return print(answer["message"]?.string ?? answer.text)
        }
        // Before any thread starts (a restart in place comes with none blocked).
        blockSignals(Self.signals)
        // What the process was given, kept across a restart in place; what it opens is not.
        let inherited = openDescriptors()
        let log = daemon.log
        // Before any key or password is read: a crash must not write them into a core file.
        if !ProcessHardening.forbidCoreDumps() { log.warning("cannot make the process non-dumpable; a core dump could hold keys") }
        if let problem = CipherSelfTest.run() { throw AgentError("the data path's cipher failed its self-test: \(problem)") }
        // A mistake in the file is said first, whoever runs it.
        let (reader, root) = try YAMLReader.load(configPath, as: .clientConfiguration)
        let settings = try reader.client(root)
        try Preflight.requireNetworkAdmin(for: "up")
        try Preflight.requireTunDriver()
        let key = try loadPrivateKey(settings.privateKeyFile)
        let credentials = try Self.credentials(settings)
        // One agent at a time may hold the full tunnel or the lockdown (profiles side by side).
        try ControlSocket.refuseIfRunning(control.control)
        let runtime = control.control.parentDirectory
        var claim: MachineClaim?
        if settings.lockdown || settings.mode.socketMark != nil {
            claim = try MachineClaim.take(in: runtime, holder: configPath,
                                          wants: settings.mode.socketMark != nil ? "the full tunnel" : "the lockdown")
        }
        defer { withExtendedLifetime(claim) {} }
        // The lockdown comes first: from here on nothing leaves outside the tunnel, whatever
        // happens to this process. A machine where it cannot be loaded is not started open.
        var firewall: Firewall?
        var policy = settings.lockdownPolicy
        var agentCgroup: AgentCgroup?
        if settings.lockdown, settings.mode.socketMark != nil {
            // The session's exceptions are for this process's sockets only, not for anyone who
            // sets the mark; so it moves to a cgroup of its own before it opens any.
            do throws(CgroupError) {
                agentCgroup = try AgentCgroup.enter(runtimeDirectory: runtime)
            } catch {
                log.warning("the lockdown lets through any socket with the session's mark: the agent has no cgroup of its own",
                            metadata: ["error": "\(error.message)"])
            }
            if let fallback = agentCgroup?.fallback {
                log.warning("the lockdown lets through sockets of every process in the agent's service", metadata: ["reason": "\(fallback)"])
            }
            policy.owner = agentCgroup?.owner ?? .anyMarked
        }
        defer { agentCgroup?.leave() }
        if settings.lockdown {
            do {
                firewall = try Firewall(policy, guarded: true)
            } catch {
                // The agent's cgroup taken away between joining it and loading (its directory or
                // the file system it is mounted in): joined again, and loaded once more.
                guard let vanished = agentCgroup, !vanished.isFoundByNftables else {
                    throw AgentError("cannot load the lockdown firewall: \(error) (or set 'lockdown: off')")
                }
                log.warning("the agent's cgroup went away before the lockdown was loaded; joining one again",
                            metadata: ["cgroup": "\(vanished.directory)"])
                vanished.leave()
                do throws(CgroupError) {
                    agentCgroup = try AgentCgroup.enter(runtimeDirectory: runtime)
                } catch {
                    agentCgroup = nil
                    log.warning("the lockdown lets through any socket with the session's mark: the agent has no cgroup of its own",
                                metadata: ["error": "\(error.message)"])
                }
                if let fallback = agentCgroup?.fallback {
                    log.warning("the lockdown lets through sockets of every process in the agent's service", metadata: ["reason": "\(fallback)"])
                }
                policy.owner = agentCgroup?.owner ?? .anyMarked
                do {
                    firewall = try Firewall(policy, guarded: true)
                } catch {
                    throw AgentError("cannot load the lockdown firewall: \(error) (or set 'lockdown: off')")
                }
            }
            if let unavailable = firewall?.guardUnavailable {
                log.warning("any root process can delete the lockdown on this kernel (no nftables table owners, Linux 5.12+): the machine is open until the agent loads it again",
                            metadata: ["error": "\(unavailable.message)"])
            }
        } else if !MachineClaim.isHeld(in: runtime) {
            // A lockdown left by an agent that died, not one another profile holds now.
            try? Firewall.removeLeftover()
        }
        // The first server's name is waited for; the others get one look-up each now and
        // another when the agent turns to them.
        var servers: [ResolvedServer] = []
        for (i, entry) in settings.servers.enumerated() {
            let addresses: [IPAddress]
            if i == 0 {
                addresses = try resolveAtStart(entry.endpoint.host, mark: settings.mode.socketMark, log: log)
            } else {
                addresses = ResolvedServer.lookUp(entry, mark: settings.mode.socketMark, log: log)
            }
            servers.append(ResolvedServer(entry: entry, addresses: addresses))
        }

        let wait = YAMLReader.parseDuration(waitForServer).flatMap { $0 > .zero ? $0 : nil }
        let session = try ClientDaemon(settings: settings, configPath: configPath, key: key, credentials: credentials,
                                       servers: servers, log: log,
                                       control: try ControlSocket(path: control.control), waitForServer: wait, firewall: firewall)
        let mailbox = session.mailbox
        try forwardSignals(Self.signals) { signal in mailbox.post(.signal(signal)) }
        log.info("starting", metadata: ["server": "\(session.server)", "mode": "\(settings.mode.socketMark == nil ? "split" : "full")"])
        session.run()
        log.info("down")
        if let failure = session.failure { throw AgentError(failure) }
        if session.restartRequested {
            try restart(keeping: inherited, arguments: Self.arguments(CommandLine.arguments, config: session.nextConfigPath))
        }
    }
}

/// The server's addresses. A name that gets no answer yet (no network at boot, no name server
/// reachable) is asked again, 1 s doubling to 30 s apart, for as long as it takes: nothing is set
/// up yet, and systemd hears READY so a boot does not wait. A name that does not exist is an error.
private func resolveAtStart(_ host: String, mark: UInt32?, log: Logger) throws -> [IPAddress] {
    var delay = Duration.seconds(1)
    var told = false
    while true {
        let addresses: [IPAddress]
        do throws(ResolverError) {
            addresses = try Resolver.addresses(of: host, mark: mark)
        } catch where error.isTemporary {
            log.warning("cannot resolve the server's name yet; asking again", metadata: ["server": "\(host)", "error": "\(error)", "next_in": "\(delay.short)"])
            if !told {
                SystemdNotifier().notify("READY=1\nSTATUS=waiting to resolve \(host)")
                told = true
            }
            sleepFeedingWatchdog(delay)
            delay = min(delay * 2, .seconds(30))
            continue
        } catch {
            throw AgentError("\(error): check 'server' in the configuration")
        }
        return addresses
    }
}

/// Sleeps for `duration`, sending WATCHDOG=1 at least every half of the unit's WatchdogSec
/// meanwhile: a wait for the network at boot is no hang.
private func sleepFeedingWatchdog(_ duration: Duration) {
    let watchdog = SystemdNotifier.watchdogInterval()
    var remaining = duration
    while remaining > .zero {
        let step = min(remaining, watchdog ?? remaining)
        let (seconds, attoseconds) = step.components
        var request = timespec(tv_sec: Int(seconds), tv_nsec: Int(attoseconds / 1_000_000_000))
        var left = timespec()
        while nanosleep(&request, &left) == -1 && errno == EINTR { request = left }
        remaining -= step
        if watchdog != nil { SystemdNotifier().notify("WATCHDOG=1") }
    }
}

/// The process's open descriptors (the listing's own is closed by the time they are checked:
/// only those still open count).
private func openDescriptors() -> Set<Int32> {
    Set((SystemFiles.names(in: "/proc/self/fd") ?? []).compactMap { Int32($0) }.filter { fcntl($0, F_GETFD) != -1 })
}

/// Starts this agent afresh in the same process (same PID, as systemd expects), with
/// `arguments` (its own, or another profile's configuration), read from the start. Signals are unblocked first.
/// Nothing it opened goes across (a socket kept would keep what it holds, the lockdown's guard
/// table among them, owned by that socket, which the new agent could not change); what it was
/// given (`inherited`: a parent's, systemd's) does.
private func restart(keeping inherited: Set<Int32>, arguments: [String]) throws -> Never {
    var none = sigset_t()
    sigfillset(&none)
    pthread_sigmask(SIG_UNBLOCK, &none, nil)
    for fd in openDescriptors() where fd > 2 && !inherited.contains(fd) {
        _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
    }
    var argv = arguments.map { strdup($0) } + [nil]
    execv("/proc/self/exe", &argv)
    throw AgentError("cannot restart the agent: \(String(cString: strerror(errno)))")
}

extension UpCommand {
    /// The agent's command line with `config` (when given) as its `--config`, in whichever form
    /// it was given (`--config FILE`, `--config=FILE`).
    static func arguments(_ arguments: [String], config: String?) -> [String] {
        guard let config else { return arguments }
        var result: [String] = []
        var rest = arguments[...]
        while let argument = rest.popFirst() {
            if argument == "--config", rest.first != nil {
                result += [argument, config]
                rest = rest.dropFirst()
            } else if argument.hasPrefix("--config=") {
                result.append("--config=" + config)
            } else {
                result.append(argument)
            }
        }
        return result
    }

    /// The username and password the configuration names, read into the secret arena; nil
    /// without `username`.
    static func credentials(_ settings: ClientSettings) throws -> Credentials? {
        guard let username = settings.username, let file = settings.passwordFile else { return nil }
        // Bytes straight into the secret arena: a Swift string of the password could not be wiped.
        var bytes = try TrustedFile.read(file, as: .secret)
        guard let credentials = Credentials(username: username, passwordFile: &bytes) else {
            throw AgentError("the username or the password in \(file) is empty or longer than \(Credentials.maxLength) bytes")
        }
        return credentials
    }
}
