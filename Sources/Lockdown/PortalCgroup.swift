import Basics
import Glibc

/// A portal window's cgroup that could not be made, found, joined or mounted, said in one line.
public struct CgroupError: Error, Equatable, Sendable, CustomStringConvertible {
    public var message: String
    public init(_ message: String) { self.message = message }
    public var description: String { message }
}

/// The cgroup2 file system the portal windows' cgroups live in: the system's, or (when none is
/// mounted, as inside `ip netns exec`, which gives a fresh /sys) one the agent mounts in its
/// runtime directory and unmounts at its end.
public struct CgroupFileSystem: Equatable, Sendable {
    /// Where it is mounted.
    var point: String
    /// The mount's root inside the hierarchy (`/` unless in a cgroup namespace).
    var root: String
    var mountedByUs: Bool

    public static func find(runtimeDirectory: String) throws(CgroupError) -> CgroupFileSystem {
        if let (point, root) = cgroup2Mount(in: SystemFiles.text("/proc/self/mountinfo") ?? "") {
            return CgroupFileSystem(point: point, root: root, mountedByUs: false)
        }
        let point = try newMountPoint(in: runtimeDirectory)
        // Only a directory of root's own, never a link someone planted: root mounts there.
        var info = stat()
        guard lstat(point, &info) == 0, (info.st_mode & S_IFMT) == S_IFDIR, info.st_uid == 0 else {
            throw CgroupError("\(point) is not a directory of root's own; not mounting the cgroup2 file system there")
        }
        guard mount("cgroup2", point, "cgroup2", UInt(MS_NOSUID | MS_NODEV | MS_NOEXEC), nil) == 0 else {
            let code = errno
            _ = rmdir(point)
            errno = code
            throw CgroupError("no cgroup2 file system is mounted and mounting one failed: \(String(cString: strerror(errno))); "
                + "a portal window needs cgroup v2 (Linux 4.5 or later)")
        }
        return CgroupFileSystem(point: point, root: "/", mountedByUs: true)
    }

    /// The mount points' names in the runtime directory: this prefix, the mounting agent's PID
    /// and a random number.
    static let pointPrefix = "cgroup2."

    /// A new, empty directory in `runtimeDirectory` to mount the cgroup2 file system on.
    static func newMountPoint(in runtimeDirectory: String) throws(CgroupError) -> String {
        // Root mounts only in a directory of root's own that nobody else may write to (a
        // directory someone else can change could have the point swapped for a link).
        var directory = stat()
        guard lstat(runtimeDirectory, &directory) == 0, (directory.st_mode & S_IFMT) == S_IFDIR, directory.st_uid == 0,
              directory.st_mode & 0o022 == 0
        else {
            throw CgroupError("\(runtimeDirectory) is not a directory of root's own that only root may write to; not mounting the cgroup2 file system there")
        }
        // A mount point of this process's own, never another's: another agent sharing the
        // runtime directory (another profile's, a holder's, one in another PID namespace)
        // removes only its own at its end, and removing a directory that is a mount point in
        // another mount namespace detaches that mount there (Linux 3.18+), which would take
        // that agent's cgroups out from under its lockdown. An agent that crashed leaves an
        // empty directory (gone with the runtime directory at the next boot).
        var random: UInt64 = 0
        withUnsafeMutableBytes(of: &random) { arc4random_buf($0.baseAddress!, $0.count) }
        let point = runtimeDirectory + "/" + pointPrefix + "\(getpid())." + String(random, radix: 16)
        guard mkdir(point, 0o700) == 0 else {
            throw CgroupError("cannot make \(point) to mount the cgroup2 file system: \(String(cString: strerror(errno)))")
        }
        return point
    }

    /// Whether libnftables finds the cgroup at `directory` (it resolves the path a rule names
    /// from /sys/fs/cgroup, in the process's own mount namespace).
    static func nftablesFinds(_ directory: String) -> Bool {
        var info = stat()
        return stat("/sys/fs/cgroup/" + nftablesPath(of: directory), &info) == 0 && (info.st_mode & S_IFMT) == S_IFDIR
    }

    /// The directory of the cgroup `path` (as /proc/PID/cgroup names it), when it lies under
    /// the mount's root.
    func directory(of path: String) -> String? {
        let inside: String?
        if root == "/" {
            inside = path
        } else if path == root {
            inside = "/"
        } else {
            inside = path.hasPrefix(root + "/") ? String(path.dropFirst(root.count)) : nil
        }
        return inside.map { (point == "/" ? "" : point) + ($0 == "/" ? "" : $0) }
    }

    /// The path nftables resolves for the cgroup at `directory`: relative to /sys/fs/cgroup,
    /// where libnftables looks.
    static func nftablesPath(of directory: String) -> String {
        let base = "/sys/fs/cgroup/"
        return directory.hasPrefix(base) ? String(directory.dropFirst(base.count)) : "../../.." + directory
    }

    /// At the agent's end: a file system it mounted goes.
    public func unmount() {
        guard mountedByUs else { return }
        _ = umount2(point, Int32(MNT_DETACH) | 0x8 /* UMOUNT_NOFOLLOW */)
        _ = rmdir(point)
    }

    /// The mount point and the root inside the hierarchy of the first cgroup2 file system in
    /// `mountinfo` (proc(5)'s /proc/self/mountinfo).
    static func cgroup2Mount(in mountinfo: String) -> (point: String, root: String)? {
        for line in mountinfo.split(whereSeparator: \.isNewline) {
            let fields = line.split(separator: " ")
            guard let dash = fields.firstIndex(of: "-"), dash + 1 < fields.count, fields.count > 4,
                  fields[dash + 1] == "cgroup2" else { continue }
            return (unescape(fields[4]), unescape(fields[3]))
        }
        return nil
    }

    /// mountinfo escapes spaces, tabs, newlines and backslashes as octal (`\040`).
    private static func unescape(_ field: Substring) -> String {
        var bytes: [UInt8] = []
        var utf8 = Array(field.utf8)[...]
        while let byte = utf8.popFirst() {
            if byte == UInt8(ascii: "\\"), utf8.count >= 3, let value = UInt8(String(decoding: utf8.prefix(3), as: UTF8.self), radix: 8) {
                bytes.append(value)
                utf8 = utf8.dropFirst(3)
            } else {
                bytes.append(byte)
            }
        }
        return String(decoding: bytes, as: UTF8.self)
    }
}

/// The cgroup of one portal window: `agent portal` is moved into it, and the browser it starts
/// inherits it, so the lockdown can tell that process tree's packets from everyone else's
/// (nftables' `socket cgroupv2`). Each window has a cgroup of its own, made when it opens and
/// removed when it closes, with its processes moved back where they came from: a browser left
/// running, or a socket made in an earlier window, never gets through a later one.
public struct PortalCgroup: Equatable, Sendable {
    /// Its directory in the cgroup2 file system.
    public var directory: String
    /// Its depth in the cgroup hierarchy (1: a child of the root).
    public var level: Int
    /// Where its processes go back to when it closes: the cgroup the first one came from.
    var returnTo: String?

    /// The path nftables resolves: relative to /sys/fs/cgroup, where libnftables looks.
    public var nftablesPath: String { CgroupFileSystem.nftablesPath(of: directory) }

    /// A new, empty cgroup for window `number` of this agent, beside the agent's own: in the
    /// cgroup it was started in (its systemd service's, delegated to it), the one place of the
    /// hierarchy it may write to without CAP_DAC_OVERRIDE (the root cgroup's directory is
    /// read-only even to root, and other services' are theirs).
    public static func make(in fs: CgroupFileSystem, number: Int) throws(CgroupError) -> PortalCgroup {
        try make(in: fs, name: "roam-portal.\(getpid()).\(number)", what: "the portal window's cgroup")
    }

    /// A new, empty cgroup called `name` beside the agent's own (see `make(in:number:)`);
    /// `what` names it in errors. One that is there already (a symbolic link planted in its
    /// place included) is refused, never adopted.
    public static func make(in fs: CgroupFileSystem, name: String, what: String) throws(CgroupError) -> PortalCgroup {
        guard let started = AgentCgroup.startedIn(), let parent = fs.directory(of: started) else {
            throw CgroupError("the agent's cgroup v2 is not known or not under the cgroup2 file system")
        }
        guard LockdownPolicy.canQuote(CgroupFileSystem.nftablesPath(of: parent)) else {
            throw CgroupError("the agent's cgroup \(parent) has a name the lockdown cannot match (a quote or a control character)")
        }
        let directory = (parent == "/" ? "" : parent) + "/" + name
        if mkdir(directory, 0o755) != 0 {
            throw CgroupError("cannot make \(what) \(directory): \(String(cString: strerror(errno)))")
        }
        return PortalCgroup(directory: directory, level: started.split(separator: "/").count + 1)
    }

    /// Moves process `pid` (and the children it starts from now on) into the cgroup, only while
    /// `verify` passes: the caller's check that it is still the process that asked, with the
    /// asker's every user and group id (no set-user-ID program it became since). `cgroup` is
    /// where it is now (as /proc/PID/cgroup names it); its processes go back there at the close.
    /// A `verify` that throws before the move refuses it with the error's words.
    /// With `shared` (a cgroup several users' processes join), the first one's cgroup is not
    /// where everyone goes back: `close(fs:origins:)` sends each to its own.
    public mutating func add(_ pid: Int32, from cgroup: String?, fs: CgroupFileSystem, shared: Bool = false,
                             verify: () throws -> Void) throws(CgroupError) {
        do {
            try verify()
        } catch {
            throw CgroupError("\(error)")
        }
        let origin = cgroup.flatMap { fs.directory(of: $0) }
        if returnTo == nil && !shared { returnTo = origin }
        try Self.move(pid, to: directory)
        // Checked again after the move: had the process ended and its id been reused within
        // these microseconds, the stranger goes back at once to where it was (to the root when
        // that is not known), and the join fails either way.
        if (try? verify()) == nil {
            if (try? Self.move(pid, to: origin ?? fs.point)) == nil { try? Self.move(pid, to: fs.point) }
            throw CgroupError("process \(pid) changed while it was moved into the portal window")
        }
    }

    /// Closes the cgroup: its processes go back where the first came from (the file system's
    /// root when that cgroup is gone), and it is removed.
    /// Returns the error when the cgroup could not be removed (a process stayed in it).
    @discardableResult
    public func close(fs: CgroupFileSystem) -> String? {
        close(fs: fs) { _ in returnTo }
    }

    /// Closes a cgroup several users' processes joined: each goes back to its own cgroup
    /// (`origins`, by pid, as /proc/PID/cgroup named it when it joined), a child started inside
    /// to where its nearest ancestor that joined came from when both are of one user, one whose
    /// ancestors are gone (its parent ended) or of another user (a set-user-ID program's) to
    /// where a process of its own user came from (`users`, by uid), never into another user's;
    /// only a process of none of them goes to the root.
    @discardableResult
    public func close(fs: CgroupFileSystem, origins: [Int32: String], users: [UInt32: String] = [:]) -> String? {
        close(fs: fs) { pid in
            let user = Self.user(of: pid)
            let inherited = Self.origin(of: pid, in: origins, parent: Self.parent) { user != nil && Self.user(of: $0) == user }
            return (inherited ?? user.flatMap { users[$0] }).flatMap { fs.directory(of: $0) }
        }
    }

    /// `origins[pid]`, else that of `pid`'s nearest ancestor in `origins` for which `same` holds
    /// (`parent` names each one's parent; init and the kernel's threads end the walk).
    static func origin(of pid: Int32, in origins: [Int32: String], parent: (Int32) -> Int32?,
                       same: (Int32) -> Bool = { _ in true }) -> String? {
        if let origin = origins[pid] { return origin }
        var current = pid
        for _ in 0..<64 {
            guard let next = parent(current), next > 1, next != current else { return nil }
            current = next
            if let origin = origins[current] { return same(current) ? origin : nil }
        }
        return nil
    }

    /// The parent of process `pid` (/proc/PID/stat's fourth field, read past the name, which
    /// may hold spaces and parentheses); nil when it is gone.
    static func parent(_ pid: Int32) -> Int32? {
        guard let stat = SystemFiles.text("/proc/\(pid)/stat"), let end = stat.lastIndex(of: ")") else { return nil }
        let fields = stat[stat.index(after: end)...].split(separator: " ")
        return fields.count > 1 ? Int32(fields[1]) : nil
    }

    /// The real user id of process `pid` (/proc/PID/status's Uid); nil when it is gone.
    public static func user(of pid: Int32) -> UInt32? {
        SystemFiles.processStatus(pid, "Uid")?.first.flatMap { UInt32($0) }
    }

    private func close(fs: CgroupFileSystem, destination: (Int32) -> String?) -> String? {
        for _ in 0..<8 {
            let pids = (SystemFiles.text(directory + "/cgroup.procs") ?? "").split(whereSeparator: \.isNewline).compactMap { Int32($0) }
            if pids.isEmpty { break }
            for pid in pids {
                if (try? Self.move(pid, to: destination(pid) ?? fs.point)) == nil { try? Self.move(pid, to: fs.point) }
            }
        }
        guard rmdir(directory) == 0 || errno == ENOENT else {
            let code = errno
            let left = (SystemFiles.text(directory + "/cgroup.procs") ?? "").split(whereSeparator: \.isNewline).joined(separator: ",")
            return "cannot remove \(directory): \(String(cString: strerror(code)))" + (left.isEmpty ? "" : "; processes \(left) still in it")
        }
        return nil
    }

    private static func move(_ pid: Int32, to directory: String) throws(CgroupError) {
        if let code = SystemFiles.overwrite("\(pid)\n", at: directory + "/cgroup.procs") {
            throw CgroupError("cannot move process \(pid) into \(directory): \(String(cString: strerror(code)))")
        }
    }
}

/// The agent's own leaf cgroup, below the one it was started in (its systemd service's, say):
/// the lockdown lets the session's exceptions through only for sockets made in it, so another
/// process that sets the session's mark (CAP_NET_RAW is enough since Linux 5.17) gains nothing.
/// A leaf below the agent's cgroup keeps cgroup v2's rule that only leaves hold processes (a
/// cgroup that holds the agent has no controllers for its children), and keeps the agent in its
/// service's tree, so systemd still stops and accounts for it. A restart in place (same pid)
/// finds itself in it already. Where the cgroup file system is read-only (systemd's
/// ProtectControlGroups), the agent's own cgroup (its service's, which holds nothing else) is
/// used as it is; never the root cgroup, which holds every process.
public struct AgentCgroup: Sendable {
    /// Its directory in the cgroup2 file system.
    public var directory: String
    /// Its depth in the cgroup hierarchy.
    public var level: Int
    /// Where the agent came from, where it goes back to at its end; nil when it stayed there.
    var parent: String?
    var fs: CgroupFileSystem

    /// What the lockdown matches.
    public var owner: LockdownPolicy.Owner { .cgroup(CgroupFileSystem.nftablesPath(of: directory), level: level) }

    /// Moves this process into a cgroup of its own (made when needed). Sockets made before keep
    /// the cgroup they were made in, so this comes before the agent opens any.
    public static func enter(runtimeDirectory: String) throws(CgroupError) -> AgentCgroup {
        let fs = try CgroupFileSystem.find(runtimeDirectory: runtimeDirectory)
        let own = leafName
        guard let current = current(), let here = fs.directory(of: current) else {
            throw CgroupError("this process's cgroup v2 is not known or not under the cgroup2 file system")
        }
        guard LockdownPolicy.canQuote(CgroupFileSystem.nftablesPath(of: here)) else {
            throw CgroupError("the agent's cgroup \(here) has a name the lockdown cannot match (a quote or a control character)")
        }
        let components = current.split(separator: "/")
        if components.last.map(String.init) == own {
            return AgentCgroup(directory: here, level: components.count, parent: String(here.dropLast(own.count + 1)), fs: fs)
        }
        let directory = (here == "/" ? "" : here) + "/" + own
        // Agents that ended without removing theirs (a crash): an empty cgroup goes, one in use
        // stays, and so does one whose agent lives (it may not have joined it yet).
        if let entries = opendir(here) {
            defer { closedir(entries) }
            while let entry = readdir(entries) {
                let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
                guard name.hasPrefix("roam-agent."), name != own, let pid = pid_t(name.dropFirst("roam-agent.".count)),
                      pid > 0, kill(pid, 0) != 0, errno == ESRCH else { continue }
                _ = rmdir((here == "/" ? "" : here) + "/" + name)
            }
        }
        let problem: String
        if mkdir(directory, 0o755) != 0 && errno != EEXIST {
            problem = "cannot make the agent's cgroup \(directory): \(String(cString: strerror(errno)))"
        } else if let code = SystemFiles.overwrite("0\n", at: directory + "/cgroup.procs") {
            _ = rmdir(directory)
            problem = "cannot move the agent into \(directory): \(String(cString: strerror(code)))"
        } else if !CgroupFileSystem.nftablesFinds(directory) {
            _ = SystemFiles.overwrite("0\n", at: here + "/cgroup.procs")
            _ = rmdir(directory)
            problem = "nftables cannot find the agent's cgroup \(directory) from /sys/fs/cgroup"
        } else {
            return AgentCgroup(directory: directory, level: components.count + 1, parent: here, fs: fs)
        }
        guard !components.isEmpty else { throw CgroupError(problem + "; the agent is in the root cgroup, which every process shares") }
        guard CgroupFileSystem.nftablesFinds(here) else { throw CgroupError(problem + "; nor can nftables find \(here)") }
        return AgentCgroup(directory: here, level: components.count, parent: nil, fs: fs,
                           fallback: problem + "; the lockdown matches the cgroup the agent was started in, and every process in it")
    }

    /// Whether libnftables still finds the cgroup (its directory or the file system it is
    /// mounted in may have been taken away since).
    public var isFoundByNftables: Bool { CgroupFileSystem.nftablesFinds(directory) }

    /// Why the agent uses the cgroup it was started in rather than a leaf of its own; nil when
    /// it has its own.
    public var fallback: String?

    /// This process's leaf cgroup's name.
    static var leafName: String { "roam-agent.\(getpid())" }

    /// This process's cgroup v2, as /proc/self/cgroup names it.
    static func current() -> String? {
        (SystemFiles.text("/proc/self/cgroup") ?? "").split(whereSeparator: \.isNewline)
            .first { $0.hasPrefix("0::/") }.map { String($0.dropFirst(3)) }
    }

    /// The cgroup this process was started in (its service's), as /proc/self/cgroup names it:
    /// the one above its leaf once it is in it.
    static func startedIn() -> String? {
        guard let current = current() else { return nil }
        guard current.hasSuffix("/" + leafName) else { return current }
        let above = String(current.dropLast(leafName.count + 1))
        return above.isEmpty ? "/" : above
    }

    /// At the agent's end: it goes back where it came from, the cgroup goes, and so does a file
    /// system it mounted.
    public func leave() {
        if let parent {
            _ = SystemFiles.overwrite("0\n", at: parent + "/cgroup.procs")
            _ = rmdir(directory)
        }
        fs.unmount()
    }
}
