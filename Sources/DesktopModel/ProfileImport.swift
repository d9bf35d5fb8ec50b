import ControlWire

/// Importing a profile from a file the user chose: checked first as the user (`agent
/// install-profile NAME --check`, the installation's own check, writing nothing), then installed
/// as root through polkit (`pkexec /usr/libexec/roam/install-profile NAME`). Both get the file's
/// bytes on standard input; their arguments are only the name. A profile carries no secret: it
/// names its key file, which must be on the machine already (the check says where when it is not).
public enum ProfileImport {
    /// The program the polkit action `org.roam.install-profile` lets pkexec run as root: the
    /// agent's install-profile and nothing else (contrib/desktop/install-profile).
    public static let helper = "/usr/libexec/roam/install-profile"

    /// What comes after a step.
    public enum Step: Equatable, Sendable {
        /// The check, as the user.
        case check
        /// The installation through pkexec.
        case install
    }

    /// The profile a chosen file becomes: the file's name without `.yaml` or `.yml`, which must
    /// be one a profile can have; else why not, for the screen.
    public static func name(ofFile path: String) throws(ImportRefusal) -> String {
        let file = path.split(separator: "/").last.map(String.init) ?? path
        var name = file
        for suffix in [".yaml", ".yml"] where name.hasSuffix(suffix) {
            name = String(name.dropLast(suffix.count))
            break
        }
        guard name != file else {
            throw ImportRefusal("“\(file)” is not a profile: a profile is a NAME.yaml file")
        }
        guard Profiles.isName(name) else {
            throw ImportRefusal("“\(file)” cannot be installed under that name: rename it to letters, digits, "
                + "- and _ (at most 32, starting with a letter or digit), as it becomes /etc/roam/NAME.yaml "
                + "and the service roam@NAME")
        }
        return name
    }

    /// The command line of `step` for profile `name`; the profile goes on standard input.
    public static func arguments(_ step: Step, name: String, agent: String) -> [String] {
        switch step {
        case .check: [agent, "install-profile", name, "--check"]
        case .install: ["pkexec", helper, name]
        }
    }

    /// What the screen says after `step` ended with `exitStatus` (-1: it could not be started)
    /// and said `output`. A check that passed is `installing`: the installation comes next.
    public static func status(after step: Step, name: String, exitStatus: Int32, output: String) -> ImportStatus {
        let said = output.split(separator: "\n").map { line in
            line.hasPrefix("agent: ") ? String(line.dropFirst("agent: ".count)) : String(line)
        }.filter { !$0.isEmpty && !$0.hasPrefix("note: ") }
        switch (step, exitStatus) {
        case (.check, 0):
            return .installing(name)
        case (.install, 0):
            return .installed("Installed \(name). Start it with: systemctl start roam@\(name)")
        case (.install, 126):
            // pkexec's: the password dialog was dismissed.
            return .refused("Not installed: no administrator's password was given")
        case (_, -1):
            return .refused("Cannot \(step == .check ? "check" : "install") the profile: \(said.last ?? "the program did not start")")
        default:
            // The agent's error is its last line (`work.yaml:4: ...`, or what to do).
            return .refused("Not installed: \(said.last ?? "the \(step == .check ? "check" : "installation") failed (status \(exitStatus))")")
        }
    }
}

/// Why a chosen file cannot be imported.
public struct ImportRefusal: Error, Equatable, Sendable {
    public var message: String
    public init(_ message: String) { self.message = message }
}

/// Where an import stands, as the Welcome screen says it.
public enum ImportStatus: Equatable, Sendable {
    /// The chosen profile is being checked.
    case checking(String)
    /// The check passed; the installation waits for an administrator's password.
    case installing(String)
    /// The profile is installed; what to do next.
    case installed(String)
    /// The import stopped: why (a mistake with its line, a name, a refusal).
    case refused(String)

    public var text: String {
        switch self {
        case .checking(let name): "Checking the profile \(name)…"
        case .installing(let name): "Installing \(name): an administrator's password may be asked for…"
        case .installed(let message), .refused(let message): message
        }
    }

    /// Whether it says something went wrong.
    public var isError: Bool {
        if case .refused = self { true } else { false }
    }

    /// Whether a step is under way (the import button waits).
    public var isBusy: Bool {
        switch self {
        case .checking, .installing: true
        case .installed, .refused: false
        }
    }
}
