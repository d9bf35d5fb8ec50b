import ArgumentParser
import Glibc
import Basics
import Settings
import Tunnel

/// `agent keygen`: a new private key, straight into a file only its owner can read.
struct KeygenCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "keygen",
        abstract: "Create a private key in a new 0600 file and print its public key.",
        discussion: "The private key is never printed; give the public key to the other side (`agent pubkey` prints it again).")

    @Option(help: "The private key file to create; an existing file is never overwritten.")
    var out: String

    func run() throws {
        let key = try PrivateKey.generate()
        let fd = open(out, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            throw AgentError("cannot create \(out): \(String(cString: strerror(errno)))"
                + (errno == EEXIST ? " (it exists; keys are never overwritten)" : ""))
        }
        defer { close(fd) }
        var text = Array((key.revealBase64() + "\n").utf8)
        defer { Sodium.wipe(&text) }
        guard fchmod(fd, 0o600) == 0, write(fd, text, text.count) == text.count, fsync(fd) == 0 else {
            let reason = String(cString: strerror(errno))
            unlink(out)
            throw AgentError("cannot write \(out): \(reason)")
        }
        print(key.publicKey.base64)
    }
}

/// `agent pubkey`: the public key of a private key file.
struct PubkeyCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "pubkey", abstract: "Print the public key of a private key file (which must be 0600).")

    @Argument(help: "The private key file.")
    var file: String

    func run() throws {
        print(try loadPrivateKey(file).publicKey.base64)
    }
}

/// `agent passwd`: an Argon2id hash for a server's user entry; the password comes on stdin.
struct PasswdCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "passwd",
        abstract: "Read a password from standard input and print its Argon2id hash for the server's users.",
        discussion: """
            On a terminal it asks twice without echo. The password is never taken from the command line. It needs \
            at least \(minimumLength) characters (shorter ones fall to online guessing even at the server's rate \
            limits) and at most \(Credentials.maxLength) bytes of UTF-8.
            """)

    func run() throws {
        let password: String
        if isatty(STDIN_FILENO) == 1 {
            let first = try readHidden(prompt: "Password: ")
            guard try readHidden(prompt: "Again: ") == first else { throw AgentError("the passwords differ") }
            password = first
        } else {
            guard let line = readLine(strippingNewline: true) else { throw AgentError("no password on standard input") }
            password = line
        }
        if let problem = Self.problem(with: password) { throw AgentError(problem) }
        print(try PasswordHash.create(password: password).encoded)
    }

    /// Fewer characters than this fall to online guessing even at the server's rate limits.
    static let minimumLength = 12

    /// Why `password` cannot be a user's password; nil when it can.
    static func problem(with password: String) -> String? {
        if password.count < minimumLength {
            return "the password has \(password.count) character\(password.count == 1 ? "" : "s"); it needs at least \(minimumLength): "
                + "shorter ones fall to online guessing even at the server's rate limits"
        }
        if password.utf8.count > Credentials.maxLength {
            return "the password has \(password.utf8.count) bytes of UTF-8; a handshake carries at most \(Credentials.maxLength)"
        }
        return nil
    }

    private func readHidden(prompt: String) throws -> String {
        writeStandardError(prompt)
        var saved = termios()
        tcgetattr(STDIN_FILENO, &saved)
        var quiet = saved
        quiet.c_lflag &= ~tcflag_t(ECHO)
        tcsetattr(STDIN_FILENO, TCSANOW, &quiet)
        defer {
            tcsetattr(STDIN_FILENO, TCSANOW, &saved)
            writeStandardError("\n")
        }
        guard let line = readLine(strippingNewline: true) else { throw AgentError("no password given") }
        return line
    }
}
