import Glibc
import Basics
import Synchronization

/// The listening end of a control socket: a Unix stream socket in a runtime directory. Root may
/// ask anything; members of the `roam` group, when the system has one, may connect (socket 0660
/// and directory 0750, both of that group) to read the status and watch, and to ask what
/// `ControlServer` lets its operators ask; nobody else may connect.
public final class ControlSocket: Sendable {
    public static let defaultPath = "/run/roam/agent.sock"
    /// The group whose members may read status and watch.
    public static let readerGroup = "roam"
    public let path: String
    public let fileDescriptor: Int32

    public init(path: String, runtimeDirectories: String? = ControlSocket.serviceRuntimeDirectories) throws {
        let directory = path.parentDirectory
        let readers = Self.readerGroupID()
        if !directory.isEmpty {
            let made = mkdir(directory, readers == nil ? 0o700 : 0o750) == 0
            // Only a directory that is the agent's is opened to the group: one it just made, its
            // default one, or the runtime directory systemd made for its service. Never one that
            // merely holds the socket (`--control /run/agent.sock` leaves /run as it is).
            var info = stat()
            if let readers, Self.opensToReaders(directory, made: made, runtimeDirectories: runtimeDirectories),
               lstat(directory, &info) == 0, info.st_mode & S_IFMT == S_IFDIR, info.st_uid == geteuid() {
                _ = chown(directory, geteuid(), readers)
                _ = chmod(directory, 0o750)
            }
        }
        // A socket file that still answers belongs to a running agent: taking it over would
        // leave that agent unreachable. One that does not answer is left over from a crash.
        try Self.refuseIfRunning(path)
        unlink(path)
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
        guard fd >= 0 else { throw ControlError("cannot create the control socket: \(String(cString: strerror(errno)))") }
        var sa = try Self.address(path)
        // Never a moment with the socket open wider than it ends up.
        let previous = umask(readers == nil ? 0o177 : 0o117)
        let bound = withUnsafePointer(to: &sa) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) } }
        umask(previous)
        if bound == 0, let readers { _ = chown(path, geteuid(), readers) }
        guard bound == 0, listen(fd, 16) == 0 else {
            let reason = String(cString: strerror(errno))
            close(fd)
            throw ControlError("cannot listen on \(path): \(reason)")
        }
        self.path = path
        fileDescriptor = fd
    }

    deinit {
        close(fileDescriptor)
    }

    /// Takes the socket's name away, so nobody reaches a stopping agent (the descriptor stays
    /// open until the owner lets go of it).
    public func remove() { unlink(path) }

    /// Whether the socket's directory is the agent's own, which the readers' group may enter:
    /// made for it now, the default one, or one of the service's runtime directories
    /// (systemd's `RUNTIME_DIRECTORY`, colon-separated).
    static func opensToReaders(_ directory: String, made: Bool, runtimeDirectories: String?) -> Bool {
        made || directory == defaultPath.parentDirectory
            || (runtimeDirectories?.split(separator: ":").contains { $0.utf8.elementsEqual(directory.utf8) } ?? false)
    }

    /// The runtime directories systemd made for this service, as it passes them.
    public static var serviceRuntimeDirectories: String? { getenv("RUNTIME_DIRECTORY").map { String(cString: $0) } }

    /// The `roam` group's id, when the system has that group.
    public static func readerGroupID() -> UInt32? {
        var group = group()
        var result: UnsafeMutablePointer<group>?
        var buffer = [CChar](repeating: 0, count: 4096)
        guard getgrnam_r(readerGroup, &group, &buffer, buffer.count, &result) == 0, result != nil else { return nil }
        return group.gr_gid
    }

    /// Throws when an agent answers at `path` already.
    public static func refuseIfRunning(_ path: String) throws {
        if answers(path) {
            throw ControlError("an agent is running already (its control socket \(path) answers): "
                + "stop it first, or give this one another --control and tunnel name")
        }
    }

    /// Whether something listens at `path`. Non-blocking: a listener too busy to accept at once
    /// (`EAGAIN`, its backlog full) is still there.
    private static func answers(_ path: String) -> Bool {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        guard let connected = try? connect(fd, to: path) else { return false }
        return connected || errno == EAGAIN
    }

    /// Connects `fd` to the socket at `path`; false (with `errno` set) when that failed.
    public static func connect(_ fd: Int32, to path: String) throws -> Bool {
        var sa = try address(path)
        return withUnsafePointer(to: &sa) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        } == 0
    }

    private static func address(_ path: String) throws -> sockaddr_un {
        var sa = sockaddr_un()
        sa.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        guard bytes.count < MemoryLayout.size(ofValue: sa.sun_path) else { throw ControlError("the control socket path is too long: \(path)") }
        withUnsafeMutableBytes(of: &sa.sun_path) { raw in for (i, b) in bytes.enumerated() { raw[i] = b } }
        return sa
    }
}
