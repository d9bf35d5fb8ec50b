public import ConfigReader
import Glibc
import Tunnel

/// The files that decide who gets in and where the tunnel goes (keys, passwords, the
/// configurations), read only when nobody but root or the agent's own user can have written
/// them, and, for those holding secrets, nobody else can read them.
///
/// Each file is opened once, checked on that descriptor (fstat) and read from it: a check by
/// path followed by an open by path can be raced by a rename or a link in between.
public enum TrustedFile {
    public enum Kind: Equatable, Sendable {
        /// A private key or a password: owner-only, and opened only as itself, never through a
        /// symbolic link (which could lead the agent to any file root can read).
        case secret
        /// The server's configuration: it holds the users' Argon2id hashes, which whoever reads
        /// them can guess at offline; the same rules as a secret.
        case serverConfiguration
        /// The client's configuration: it holds no secret, so others may read it, but nobody else
        /// may change it: it names the server, its key and what goes through the tunnel.
        case clientConfiguration
        /// A gateway's copy of the fleet's users (`users-from`): hashes again, so a secret's rules;
        /// big enough for a few hundred thousand users.
        case userSnapshot

        /// Bigger than this is not such a file: refused, rather than read in part.
        var limit: Int {
            switch self {
            case .secret: 64 << 10
            case .serverConfiguration, .clientConfiguration: 16 << 20
            case .userSnapshot: 512 << 20
            }
        }

        var tooBig: String {
            "is larger than \(limit >= 1 << 20 ? "\(limit >> 20) MiB" : "\(limit >> 10) KiB"), too big for \(noun)"
        }

        /// How an error names the file.
        var noun: String {
            switch self {
            case .secret: return "a key or password file"
            case .serverConfiguration: return "the server configuration"
            case .clientConfiguration: return "the client configuration"
            case .userSnapshot: return "the users snapshot"
            }
        }
    }

    /// What fstat says of an open file, as far as the checks go.
    struct Status: Equatable {
        var isRegular: Bool
        /// The permission bits (`st_mode & 0o7777`).
        var permissions: UInt32
        var owner: UInt32
        var size: Int
    }

    /// The file's bytes, or an error that says what is wrong with it and how to fix it.
    public static func read(_ path: String, as kind: Kind) throws(ConfigError) -> [UInt8] {
        if let problem = directoryProblem(of: path, user: UInt32(geteuid())) {
            throw ConfigError(file: path, line: 0, message: problem)
        }
        // O_NONBLOCK: a FIFO planted at the path must not hang the open; it is refused below.
        let flags = O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK | (kind == .clientConfiguration ? 0 : O_NOFOLLOW)
        var fd: Int32
        repeat { fd = open(path, flags) } while fd < 0 && errno == EINTR
        guard fd >= 0 else {
            let code = errno
            if code == ELOOP, let target = linkTarget(path) {
                throw ConfigError(file: path, line: 0, message: "is a symbolic link (to \(target)); \(kind.noun) is opened only "
                    + "as itself, never through a link: name the real file \(kind == .secret ? "in the configuration" : "with --config")")
            }
            throw ConfigError(file: path, line: 0,
                              message: "cannot read the file: \(String(cString: strerror(code))) (does it exist, and may this user read it?)")
        }
        defer { close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0 else {
            throw ConfigError(file: path, line: 0, message: "cannot read the file: \(String(cString: strerror(errno)))")
        }
        let status = Status(isRegular: info.st_mode & S_IFMT == S_IFREG, permissions: UInt32(info.st_mode & 0o7777),
                            owner: UInt32(info.st_uid), size: Int(info.st_size))
        if let problem = problem(status, kind: kind, path: path, user: UInt32(geteuid())) {
            throw ConfigError(file: path, line: 0, message: problem)
        }
        // Sized from fstat, so a key is read into one buffer, not copied about as it grows.
        var bytes = [UInt8]()
        bytes.reserveCapacity(min(status.size, kind.limit) + 1)
        var chunk = [UInt8](repeating: 0, count: 4096)
        defer { Sodium.wipe(&chunk) }
        // Past the limit by a byte: a file that grew since fstat is refused, not read in part.
        while bytes.count <= kind.limit {
            let n = chunk.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            if n < 0 && errno == EINTR { continue }
            guard n >= 0 else {
                Sodium.wipe(&bytes)
                throw ConfigError(file: path, line: 0, message: "cannot read the file: \(String(cString: strerror(errno)))")
            }
            if n == 0 { break }
            bytes += chunk[..<n]
        }
        guard bytes.count <= kind.limit else {
            Sodium.wipe(&bytes)
            throw ConfigError(file: path, line: 0, message: kind.tooBig)
        }
        return bytes
    }

    /// Why the directories that hold `path` make it untrustworthy, as sshd's StrictModes judges
    /// them: whoever may write in one of them (itself or any directory above it, links resolved)
    /// can put another file in the place of this one. Each must belong to root or `user`, and
    /// not be writable by group or others unless it is sticky (as /tmp is: there nobody can move
    /// another's entry). Nil when they are fine.
    static func directoryProblem(of path: String, user: UInt32) -> String? {
        let parent = path.contains("/") ? String(path[..<path.lastIndex(of: "/")!]) : "."
        guard let real = realpath(parent.isEmpty ? "/" : parent, nil) else { return nil }  // the open will say what is wrong
        var directory = String(cString: real)
        free(real)
        while true {
            var info = stat()
            if stat(directory, &info) == 0,
               let problem = directoryProblem(directory, Status(isRegular: false, permissions: UInt32(info.st_mode & 0o7777),
                                                               owner: UInt32(info.st_uid), size: 0), user: user) {
                return problem
            }
            guard directory != "/", let slash = directory.lastIndex(of: "/") else { return nil }
            directory = slash == directory.startIndex ? "/" : String(directory[..<slash])
        }
    }

    /// Why a directory with `status` on the way to a trusted file is not safe; nil when it is.
    static func directoryProblem(_ directory: String, _ status: Status, user: UInt32) -> String? {
        if status.owner != 0 && status.owner != user {
            return "is in \(directory), owned by \(name(of: status.owner)), who could put another file in its place; "
                + "keep it in a directory owned by root\(user == 0 ? "" : " or \(name(of: user))")"
        }
        let sticky: UInt32 = 0o1000
        if status.permissions & 0o022 != 0 && status.permissions & sticky == 0 {
            return "is in \(directory), which group or others may write to (mode \(String(status.permissions & 0o777, radix: 8))), "
                + "so they could put another file in its place (run: chmod go-w \(directory))"
        }
        return nil
    }

    /// Why a file with `status` must not be used as `kind` by a process running as `user`; nil
    /// when it may.
    static func problem(_ status: Status, kind: Kind, path: String, user: UInt32) -> String? {
        guard status.isRegular else { return "is not a regular file; \(kind.noun) must be one" }
        if status.owner != 0 && status.owner != user {
            let who = user == 0 ? "root" : "root or \(name(of: user)), the user running the agent,"
            return "is owned by \(name(of: status.owner)), who could have changed it; only \(who) may own \(kind.noun) "
                + "(run: chown \(user == 0 ? "root" : name(ofUser: user)) \(path))"
        }
        let mode = String(status.permissions & 0o777, radix: 8)
        switch kind {
        case .secret where status.permissions & 0o077 != 0:
            return "mode is \(mode); a secret file must be 0600 (run: chmod 600 \(path))"
        case .serverConfiguration where status.permissions & 0o077 != 0, .userSnapshot where status.permissions & 0o077 != 0:
            return "mode is \(mode); \(kind.noun) holds the users' password hashes and must be 0600 "
                + "(run: chmod 600 \(path))"
        case .clientConfiguration where status.permissions & 0o022 != 0:
            return "mode is \(mode); the client configuration decides where the tunnel goes and must not be writable "
                + "by group or others (run: chmod go-w \(path))"
        default:
            break
        }
        guard status.size <= kind.limit else { return kind.tooBig }
        return nil
    }

    /// `uid 65534 (nobody)`, or just `uid 1234` for a user the system does not know.
    static func name(of uid: UInt32) -> String {
        let user = name(ofUser: uid)
        return user == "\(uid)" ? "uid \(uid)" : "uid \(uid) (\(user))"
    }

    /// The user's login name, or the number when there is none.
    private static func name(ofUser uid: UInt32) -> String {
        var entry = passwd()
        var found: UnsafeMutablePointer<passwd>?
        var buffer = [CChar](repeating: 0, count: 4096)
        guard getpwuid_r(uid_t(uid), &entry, &buffer, buffer.count, &found) == 0, found != nil, let name = entry.pw_name else {
            return "\(uid)"
        }
        return String(cString: name)
    }

    /// Where the link at `path` points; nil when it is not a link.
    private static func linkTarget(_ path: String) -> String? {
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        let length = readlink(path, &buffer, buffer.count - 1)
        guard length >= 0 else { return nil }
        return String(decoding: buffer[0..<length].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}

extension YAMLReader {
    /// The configuration at `path`, read after the checks `kind` calls for.
    public static func load(_ path: String, as kind: TrustedFile.Kind) throws(ConfigError) -> (YAMLReader, Node) {
        try parse(try TrustedFile.read(path, as: kind), file: path)
    }
}
