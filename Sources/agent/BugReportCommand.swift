import ArgumentParser
import Basics
import ConfigReader
import Control
import ControlWire
import Glibc
import Observability
import Settings

/// `agent bugreport`: one archive to attach to a problem report, with nothing secret in it.
struct BugReportCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "bugreport",
        abstract: "Write one archive for a problem report: versions, settings without secrets, status, the log, the network.",
        discussion: """
            Writes a tar archive (owner-only) holding: the agent's and the system's versions; each \
            configuration with every secret value and every comment taken out; what the running agent's \
            status says; the agent's log from the journal for the last hours (--since); the network as the \
            kernel has it (links, addresses, routes, policy rules), the firewall's ruleset, the resolvers, \
            and the state of Roam's systemd units. Key files, password files and the database's passfile are \
            never copied: what they hold is removed from every file of the archive wherever it appears, as \
            is the password of any URL. It changes nothing on the machine. Run it as root to include what \
            only root may read; it lists what it wrote, so you can look before you send it.
            """)

    @Option(name: .customLong("config"), help: "A configuration to include (repeat for several; default: every /etc/roam/*.yaml).")
    var configs: [String] = []

    @OptionGroup var options: ControlOptions

    @Option(help: "How many hours of the agent's log to include.")
    var since: Int = 6

    @Option(help: "Where to write the archive (default: roam-report-HOST-TIME.tar here). Never overwrites a file.")
    var out: String?

    func validate() throws {
        guard (1...720).contains(since) else { throw ValidationError("--since is a number of hours from 1 to 720") }
    }

    func run() throws {
        let now = time(nil)
        let stamp = Self.stamp(now)
        let path = out ?? "roam-report-\(SystemFiles.hostName() ?? "host")-\(stamp).tar"
        let configurations = configs.isEmpty
            ? (SystemFiles.names(in: "/etc/roam") ?? []).filter { $0.hasSuffix(".yaml") }.sorted().map { "/etc/roam/" + $0 }
            : configs
        // What the configurations' files hold is taken out of everything written.
        var secrets: [String] = []
        var files: [(name: String, text: String)] = []
        for config in configurations {
            let name = "config/" + Self.base(config)
            switch Self.configuration(config) {
            case .failure(let why):
                // Not copied: a file that is not a configuration (a key given by mistake) or that
                // does not read as one (its error could quote a secret) says only where it failed.
                files.append((name + ".not-included.txt", "\(config): not included: \(why)\n"))
            case .success(let (text, secretFiles, hashes)):
                for file in secretFiles {
                    guard let bytes = try? TrustedFile.read(file, as: .secret) else { continue }
                    secrets += ProblemReport.secretValues(inFile: String(decoding: bytes, as: UTF8.self))
                }
                secrets += hashes
                files.append((name, ProblemReport.redactConfiguration(text)))
            }
        }
        files.insert(("version.txt", Self.versions()), at: 0)
        files.append(("status.json", Self.status(at: options.control)))
        files.append(("journal.txt", Self.output(["journalctl", "--no-pager", "-o", "short-iso", "--since=-\(since)h",
                                                  "-u", "roam-client.service", "-u", "roam-server.service", "-u", "roam@*"])))
        files.append(("network.txt", [
            ["ip", "-d", "link"], ["ip", "address"], ["ip", "-4", "route", "show", "table", "all"],
            ["ip", "-6", "route", "show", "table", "all"], ["ip", "-4", "rule"], ["ip", "-6", "rule"],
        ].map(Self.output).joined(separator: "\n")))
        files.append(("firewall.txt", Self.output(["nft", "list", "ruleset"])))
        files.append(("resolvers.txt", "$ cat /etc/resolv.conf\n" + (SystemFiles.text("/etc/resolv.conf") ?? "(none)\n") + "\n"
            + Self.output(["resolvectl", "status", "--no-pager"])))
        files.append(("units.txt", Self.output(["systemctl", "--no-pager", "--full", "status", "roam-client.service",
                                                "roam-server.service", "roam@*.service"])))
        let listing = files.map(\.name)
        files.insert(("README.txt", Self.readme(stamp: stamp, listing: listing, configurations: configurations, since: since)), at: 0)

        var archive = TarArchive(modified: now)
        for (name, text) in files {
            let safe = ProblemReport.redactURLPasswords(ProblemReport.scrub(text, secrets: secrets))
            archive.add("roam-report-\(stamp)/" + name, Array(safe.utf8))
        }
        let bytes = archive.finished
        try Self.create(path, bytes)
        print("wrote \(path) (\(bytes.count / 1024) KB, owner-only):")
        for name in ["README.txt"] + listing { print("  \(name)") }
        print("secrets removed: key, password and passfile contents, password hashes, URL passwords, comments; "
            + "look inside with: tar -xOf \(path) | less")
    }

    /// A configuration's text, the secret files its settings name (keys, passwords, the proxy's
    /// password, the database's passfile, the TLS certificate's key) and its users' password
    /// hashes; or, for a file that is not read as a client's or a gateway's configuration (with
    /// the daemon's checks of owner and mode), where it failed, without its words.
    static func configuration(_ path: String) -> Result<(String, [String], [String]), BugReportSkip> {
        let kind: CheckCommand.Kind
        do { kind = try CheckCommand.kind(of: path) } catch { return .failure(BugReportSkip(error)) }
        do {
            // Read once, with the daemon's checks: the text copied is the text the reader accepted.
            let bytes = try TrustedFile.read(path, as: kind == .client ? .clientConfiguration : .serverConfiguration)
            let (reader, root) = try YAMLReader.parse(bytes, file: path)
            let text = String(decoding: bytes, as: UTF8.self)
            switch kind {
            case .client:
                let settings = try reader.client(root)
                let files = [settings.privateKeyFile] + [settings.passwordFile, settings.stream?.proxy?.passwordFile].compactMap { $0 }
                return .success((text, files, []))
            case .server:
                let settings = try reader.server(root)
                let files = [settings.privateKeyFile] + [settings.usersFrom?.passwordFile, settings.stream?.certificate?.key].compactMap { $0 }
                return .success((text, files, settings.users.users.compactMap { $0.passwordHash?.encoded }))
            }
        } catch {
            return .failure(BugReportSkip(error))
        }
    }

    static func base(_ path: String) -> String { String(path.split(separator: "/").last ?? Substring(path)) }

    static func stamp(_ t: time_t) -> String { utcText(Int64(t), "%Y%m%d-%H%M%SZ") }

    static func versions() -> String {
        var name = utsname()
        uname(&name)
        func field<T>(_ value: T) -> String {
            withUnsafeBytes(of: value) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
        }
        return "agent \(Release.version)\n"
            + "kernel \(field(name.sysname)) \(field(name.release)) \(field(name.version)) \(field(name.machine))\n\n"
            + (SystemFiles.text("/etc/os-release") ?? "(no /etc/os-release)\n")
    }

    static func status(at control: String) -> String {
        do {
            return try ControlClient.ask(.status, at: control).text + "\n"
        } catch {
            return "{\"error\": \(LogLine.quotedJSON("no answer from \(control): \(error)"))}\n"
        }
    }

    static func readme(stamp: String, listing: [String], configurations: [String], since: Int) -> String {
        """
        A problem report from Roam's agent (`agent bugreport`), made \(stamp).

        What it holds:
        \(listing.map { "  \($0)" }.joined(separator: "\n"))

        The configurations (\(configurations.isEmpty ? "none found" : configurations.joined(separator: ", "))) are copied
        without the value of any key that holds a secret (passwords, password hashes, tokens, inline keys), without
        comments, and without the password of any URL. The files they name (private keys, password files, the
        database's passfile) are not copied, and what they hold is removed from every file here wherever it
        appears. The journal covers the last \(since) hours of Roam's units.

        """
    }

    /// What `argv` printed (both streams), headed by the command; at most 4 MB, at most 10 s.
    static func output(_ argv: [String]) -> String {
        let head = "$ " + argv.joined(separator: " ") + "\n"
        guard let executable = PortalCommand.find(argv[0], path: CommandOutput.path) else { return head + "(\(argv[0]) is not installed)\n" }
        return head + CommandOutput.run(executable, argv, limit: 4 << 20, timeout: .seconds(10))
    }

    /// Writes `bytes` to a new file at `path`, owner-only; an existing file is never replaced.
    static func create(_ path: String, _ bytes: [UInt8]) throws {
        let fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw AgentError("cannot create \(path): \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        var written = 0
        while written < bytes.count {
            let n = bytes.withUnsafeBytes { write(fd, $0.baseAddress! + written, bytes.count - written) }
            if n < 0, errno == EINTR { continue }
            guard n > 0 else { throw AgentError("cannot write \(path): \(String(cString: strerror(errno)))") }
            written += n
        }
    }
}

/// Why a configuration is not in the report: where reading it failed, never its words (a
/// reader's message may quote the line, a secret with it).
struct BugReportSkip: Error, CustomStringConvertible {
    let description: String
    init(_ error: any Error) {
        if let error = error as? ConfigError {
            description = error.line > 0 ? "it does not read as a Roam configuration (line \(error.line))"
                : "it does not read as a Roam configuration (\(error.file): the file itself, its owner or mode)"
        } else {
            description = "it does not read as a Roam configuration"
        }
    }
}

/// A program run to completion with its output captured: both streams into one pipe, standard
/// input from /dev/null, ended (the process this started, by its PID) when it runs too long.
enum CommandOutput {
    /// Where the tools are looked for, whatever the caller's PATH (root's own, in a directory
    /// anyone may write to, must not find an `ip` there).
    static let path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    /// The programs' whole environment: that PATH and the C locale.
    static let environment = ["PATH=" + path, "LC_ALL=C"]

    static func run(_ executable: String, _ argv: [String], limit: Int, timeout: Duration) -> String {
        var pipeEnds: [Int32] = [0, 0]
        guard pipe(&pipeEnds) == 0 else { return "(cannot make a pipe: \(String(cString: strerror(errno))))\n" }
        // Neither end leaks into the program but as its output (dup2 gives it a copy without the flag).
        for end in pipeEnds { _ = fcntl(end, F_SETFD, FD_CLOEXEC) }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_adddup2(&actions, pipeEnds[1], 1)
        posix_spawn_file_actions_adddup2(&actions, pipeEnds[1], 2)
        var pid: pid_t = 0
        var cArguments = argv.map { strdup($0) } + [nil]
        var cEnvironment = environment.map { strdup($0) } + [nil]
        defer { for pointer in cArguments + cEnvironment { free(pointer) } }
        let spawned = posix_spawn(&pid, executable, &actions, nil, &cArguments, &cEnvironment)
        close(pipeEnds[1])
        defer { close(pipeEnds[0]) }
        guard spawned == 0 else { return "(cannot run \(argv[0]): \(String(cString: strerror(spawned))))\n" }
        var output: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65_536)
        let deadline = ContinuousClock.now + timeout
        var cut: String?
        while true {
            let left = deadline - .now
            guard left > .zero else { cut = "(stopped after \(timeout))"; break }
            var entry = pollfd(fd: pipeEnds[0], events: Int16(POLLIN), revents: 0)
            let ready = poll(&entry, 1, Int32(clamping: left.nanoseconds / 1_000_000 + 1))
            if ready < 0, errno == EINTR { continue }
            guard ready > 0 else { continue }
            let n = read(pipeEnds[0], &buffer, buffer.count)
            if n < 0, errno == EINTR { continue }
            guard n > 0 else { break }
            output += buffer[0..<min(n, max(0, limit - output.count))]
            if output.count >= limit { cut = "(cut at \(limit / 1024) KB)"; break }
        }
        // A program that closed its output but goes on is ended at the deadline too.
        var status: Int32 = 0
        while cut == nil {
            let reaped = waitpid(pid, &status, WNOHANG)
            if reaped == pid || (reaped < 0 && errno != EINTR) { break }
            if ContinuousClock.now >= deadline { cut = "(stopped after \(timeout))"; break }
            usleep(10_000)
        }
        if cut != nil {
            kill(pid, SIGKILL)
            while waitpid(pid, &status, 0) < 0, errno == EINTR {}
        }
        var text = String(decoding: output, as: UTF8.self)
        if !text.isEmpty, !text.hasSuffix("\n") { text += "\n" }
        if let cut { text += cut + "\n" }
        return text
    }
}
