import Glibc
import PathMonitor

/// The cgroup (v2) of a portal window: `agent portal` is moved into it, and the browser it
/// starts inherits it, so the lockdown can tell that process tree's packets from everyone
/// else's (nftables' `socket cgroupv2`). Only root can move a process into it or out of it.
struct PortalCgroup: Equatable {
    /// Its directory in the cgroup2 file system.
    var directory: String
    /// Its depth in the cgroup hierarchy (1: a child of the root).
    var level: Int
    /// A cgroup2 file system the agent mounted itself (none was mounted), to unmount at the end.
    var mountedByUs: String?

    static let name = "roam-portal"

    /// The path nftables resolves: relative to /sys/fs/cgroup, where libnftables looks.
    var nftablesPath: String {
        let base = "/sys/fs/cgroup/"
        return directory.hasPrefix(base) ? String(directory.dropFirst(base.count)) : "../../.." + directory
    }

    /// Finds the cgroup2 file system (mounting one under `runtimeDirectory` if there is none,
    /// as inside `ip netns exec`, which gives a fresh /sys) and makes the window's cgroup in it.
    static func prepare(runtimeDirectory: String) throws(AgentError) -> PortalCgroup {
        var mounted: String?
        var found = cgroup2Mount(in: SystemFiles.text("/proc/self/mountinfo") ?? "")
        if found == nil {
            let point = runtimeDirectory + "/cgroup2"
            if mkdir(point, 0o700) != 0 && errno != EEXIST {
                throw AgentError("cannot make \(point) to mount the cgroup2 file system: \(String(cString: strerror(errno)))")
            }
            guard mount("cgroup2", point, "cgroup2", UInt(MS_NOSUID | MS_NODEV | MS_NOEXEC), nil) == 0 else {
                throw AgentError("no cgroup2 file system is mounted and mounting one failed: \(String(cString: strerror(errno))); "
                    + "a portal window needs cgroup v2 (Linux 4.5 or later)")
            }
            mounted = point
            found = (point, "/")
        }
        guard let (point, root) = found else { throw AgentError("no cgroup2 file system") }
        let directory = (point == "/" ? "" : point) + "/" + name
        if mkdir(directory, 0o755) != 0 && errno != EEXIST {
            throw AgentError("cannot make the portal window's cgroup \(directory): \(String(cString: strerror(errno)))")
        }
        let depth = root.split(separator: "/").count
        return PortalCgroup(directory: directory, level: depth + 1, mountedByUs: mounted)
    }

    /// Moves process `pid` (and the children it starts from now on) into the cgroup.
    func add(_ pid: Int32) throws(AgentError) {
        let fd = open(directory + "/cgroup.procs", O_WRONLY | O_CLOEXEC)
        guard fd >= 0 else { throw AgentError("cannot open \(directory)/cgroup.procs: \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        let text = Array("\(pid)\n".utf8)
        guard write(fd, text, text.count) == text.count else {
            throw AgentError("cannot move process \(pid) into \(directory): \(String(cString: strerror(errno)))")
        }
    }

    /// At the agent's stop: the cgroup goes if no process is left in it (a browser still
    /// running keeps it; the next window uses it again), and a file system mounted for it.
    func remove() {
        _ = rmdir(directory)
        if let point = mountedByUs {
            _ = umount2(point, Int32(MNT_DETACH))
            _ = rmdir(point)
        }
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
