import ArgumentParser
import ConfigReader
import ControlWire
import Glibc
import Basics
import Settings

/// `agent install-profile NAME`: a client profile read from standard input, checked as `agent
/// check` checks it, installed as /etc/roam/NAME.yaml (root's, 0600). The desktop app's import
/// runs it through pkexec; the profile names its key file, so no secret is ever an argument.
struct InstallProfileCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "install-profile",
        abstract: "Install a client profile, read from standard input, as /etc/roam/NAME.yaml.",
        discussion: """
            The profile is checked as 'agent check' checks a client configuration, as root: every key and value, \
            and the key and password files it names, which must be installed already (root's, 0600). A profile \
            with a mistake is refused with 'NAME.yaml:LINE: message' (exit status 2) and nothing is written. \
            The file is written whole or not at all, owned by root and 0600; an installed profile is replaced \
            only with --replace. Start it with 'systemctl start roam@NAME'. A key or password file the profile \
            names that is not on the machine is refused with where it must be: a profile carries no secret. \
            --check checks the profile the same way and writes nothing (the desktop app's import, before it asks \
            for an administrator).
            """)

    @Argument(help: "The profile's name: letters, digits, '-' and '_', at most 32, starting with a letter or digit.")
    var name: String

    @Option(help: "Where the profiles are.")
    var directory = Profiles.directory

    @Flag(help: "Replace an installed profile of that name.")
    var replace = false

    @Flag(help: "Only check the profile, as its installation would, writing nothing; needs no privilege (a key file only root may read is then not checked).")
    var check = false

    func validate() throws {
        guard Profiles.isName(name) else {
            throw ValidationError("'\(name)' cannot be a profile's name: letters, digits, '-' and '_', at most 32, "
                + "starting with a letter or digit (it becomes the file NAME.yaml and the service roam@NAME)")
        }
    }

    func run() throws {
        guard check || geteuid() == 0 else {
            throw AgentError("install-profile writes \(directory), which is root's: run it as root (the desktop app asks through pkexec)")
        }
        let bytes = try Self.readInput(limit: Profiles.maxBytes)
        guard let text = String(validating: bytes, as: UTF8.self) else { throw AgentError("the profile is not UTF-8 text") }
        let file = name + ".yaml"
        let reader = YAMLReader(file: file)
        let root = try reader.document(text)
        try Self.requireInstalled(secretsOf: try reader.client(root), file: file)
        let (settings, notes) = try CheckCommand.client(reader, root)
        if check {
            for note in notes { print("note: \(note)") }
            return print("\(file): \(CheckCommand.describe(settings))")
        }
        guard notes.isEmpty else { throw AgentError(notes.joined(separator: "; ")) }
        if mkdir(directory, 0o700) != 0, errno != EEXIST {
            throw AgentError("cannot make \(directory): \(String(cString: strerror(errno)))")
        }
        let path = Profiles.file(of: name, in: directory)
        if !replace, access(path, F_OK) == 0 {
            throw AgentError("\(path) is installed already: --replace replaces it")
        }
        try Self.install(bytes, at: path)
        print("installed \(path): \(CheckCommand.describe(settings)); start it with: systemctl start roam@\(name)")
    }

    /// A profile names its key (and password) file and carries neither: one that is not on the
    /// machine is refused saying where it must be, before anything else of it is read.
    static func requireInstalled(secretsOf settings: ClientSettings, file: String) throws {
        for (what, path) in [("key", settings.privateKeyFile), ("password", settings.passwordFile)] {
            guard let path, access(path, F_OK) != 0, errno == ENOENT else { continue }
            throw AgentError("\(file) names its \(what) file \(path), which is not installed: the profile carries no secret. "
                + "Have an administrator install it there first, root's and 0600 (install -m 0600 FILE \(path)), "
                + "then install the profile")
        }
    }

    /// Standard input, whole; more than `limit` bytes is refused.
    static func readInput(limit: Int) throws -> [UInt8] {
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 16 << 10)
        while true {
            let n = read(STDIN_FILENO, &buffer, buffer.count)
            if n < 0, errno == EINTR { continue }
            guard n >= 0 else { throw AgentError("cannot read the profile from standard input: \(String(cString: strerror(errno)))") }
            if n == 0 { return bytes }
            bytes += buffer[0..<n]
            guard bytes.count <= limit else { throw AgentError("the profile is larger than \(limit >> 10) KiB: not a configuration") }
        }
    }

    /// Writes `bytes` as `path`, root's and 0600, whole or not at all: a file of its own beside
    /// it, made with that owner and mode before anything is in it, then renamed over.
    static func install(_ bytes: [UInt8], at path: String) throws {
        let temporary = path.parentDirectory + "/.\(path.split(separator: "/").last ?? "profile").\(getpid())"
        unlink(temporary)
        let fd = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw AgentError("cannot write \(temporary): \(String(cString: strerror(errno)))") }
        var done = false
        defer {
            close(fd)
            if !done { unlink(temporary) }
        }
        guard fchown(fd, 0, 0) == 0, fchmod(fd, 0o600) == 0 else {
            throw AgentError("cannot make \(temporary) root's and 0600: \(String(cString: strerror(errno)))")
        }
        var written = 0
        while written < bytes.count {
            let n = bytes[written...].withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
            if n < 0, errno == EINTR { continue }
            guard n > 0 else { throw AgentError("cannot write \(temporary): \(String(cString: strerror(errno)))") }
            written += n
        }
        guard fsync(fd) == 0, rename(temporary, path) == 0 else {
            throw AgentError("cannot install \(path): \(String(cString: strerror(errno)))")
        }
        done = true
    }
}
