import ArgumentParser
import Directory
import ConfigReader
import Glibc
import Settings

/// `agent check`: a configuration checked as `agent up` or `agent serve` would read it, with
/// no privilege and nothing started.
struct CheckCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "check",
        abstract: "Check a client or server configuration without starting anything.",
        discussion: """
            Reads the file with the checks the daemon makes (owner and mode, then every key and value), and the \
            key and password files it names. Exit status: 0 when the daemon would accept it, 2 with \
            'file:line: message' when not. Needs no privilege; a file only root may read is reported as not \
            checked when run as another user.
            """)

    @Option(help: "The configuration file.")
    var config: String

    @Option(help: "client or server; by default told from the file's keys ('users' or 'listen-port': a server).")
    var kind: Kind?

    enum Kind: String, ExpressibleByArgument, CaseIterable {
        case client, server
    }

    func run() throws {
        // Read with the client's rules first to tell the kind; a server's file is then read
        // again with its own, stricter ones.
        let kind = try self.kind ?? Self.kind(of: config)
        var notes: [String] = []
        switch kind {
        case .client:
            let (reader, root) = try YAMLReader.load(config, as: .clientConfiguration)
            let (settings, more) = try Self.client(reader, root)
            notes += more
            print("\(config): \(Self.describe(settings))")
        case .server:
            let (reader, root) = try YAMLReader.load(config, as: .serverConfiguration)
            let settings = try reader.server(root)
            notes += try Self.secret(settings.privateKeyFile) { _ = try loadPrivateKey($0) }
            guard let source = settings.usersFrom else {
                print("\(config): a server configuration, \(settings.users.users.count) users, port \(settings.listenPort), "
                    + "\(settings.workers) workers")
                break
            }
            if let file = source.passwordFile { notes += try Self.secret(file) { _ = try TrustedFile.read($0, as: .secret) } }
            if let problem = UserDirectory.transportProblem(source.url) { notes.append(problem) }
            // The directory as the gateway would read it now; a database that cannot be reached is a
            // note (the gateway would start from its snapshot), a schema it cannot read an error.
            var users = "users from the directory"
            do {
                let load = try UserDirectory.read(source.url, passwordFile: source.passwordFile, tunnel: settings.tunnel.addresses)
                users = "\(load.users.count) users from the directory"
                for (name, why) in load.refused.prefix(10) { notes.append("user \(name) refused: \(why)") }
                if load.refused.count > 10 { notes.append("\(load.refused.count - 10) more users refused") }
            } catch where error.kind == .schema {
                throw AgentError("users-from: \(error)")
            } catch {
                notes.append("the user directory cannot be read now (\(error)); the gateway would start from its snapshot, "
                    + "\(source.snapshot), if it has one")
            }
            print("\(config): a server configuration, \(users), port \(settings.listenPort), \(settings.workers) workers")
        }
        for note in notes { print("note: \(note)") }
    }

    /// A client's file has 'server' or 'servers'; a server's 'users' or 'listen-port'.
    static func kind(of path: String) throws -> Kind {
        let (_, root) = try YAMLReader.load(path, as: .clientConfiguration)
        guard case .mapping(let entries) = root.value else { return .client }
        let keys = entries.compactMap { entry -> String? in
            if case .scalar(let key) = entry.key.value { return key }
            return nil
        }
        return keys.contains("users") || keys.contains("listen-port") ? .server : .client
    }

    /// Checks a key or password file the configuration names; unreadable for want of privilege
    /// is a note, not a failure (the daemon reads it as root).
    /// A client configuration read as `agent up` reads it, with the key and password files it
    /// names; notes for those this user may not read.
    static func client(_ reader: YAMLReader, _ root: Node) throws -> (ClientSettings, notes: [String]) {
        let settings = try reader.client(root)
        var notes = try Self.secret(settings.privateKeyFile) { _ = try loadPrivateKey($0) }
        if let file = settings.passwordFile { notes += try Self.secret(file) { _ = try readSecretFile($0) } }
        return (settings, notes)
    }

    /// A client configuration in a few words.
    static func describe(_ settings: ClientSettings) -> String {
        let servers = settings.servers.count
        return "a client configuration, \(servers) server\(servers == 1 ? "" : "s"), \(settings.tunnel.name), lockdown \(settings.lockdown ? "on" : "off")"
    }

    private static func secret(_ path: String, _ read: (String) throws -> Void) throws -> [String] {
        if geteuid() != 0, access(path, R_OK) != 0, errno == EACCES {
            return ["\(path) is not readable as uid \(geteuid()): not checked (the daemon reads it as root)"]
        }
        try read(path)
        return []
    }
}
