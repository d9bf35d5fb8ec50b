public import ControlWire
import Basics
import Glibc

/// The process at the other end of a control connection, as the kernel saw it connect
/// (`SO_PEERCRED`), with what /proc said of it then.
public struct PeerProcess: Equatable, Sendable {
    public var pid: Int32
    public var uid: UInt32
    public var gid: UInt32
    /// Its supplementary groups when it connected (`SO_PEERGROUPS`).
    public var groups: [UInt32]
    /// When it started (/proc/PID/stat's 22nd field): a reused id shows another start time.
    public var started: UInt64?
    /// Its cgroup (/proc/PID/cgroup's v2 line).
    public var cgroup: String?

    public init(pid: Int32, uid: UInt32, gid: UInt32, groups: [UInt32] = []) {
        self.pid = pid
        self.uid = uid
        self.gid = gid
        self.groups = groups
        started = Self.startTime(pid)
        cgroup = (SystemFiles.text("/proc/\(pid)/cgroup") ?? "").split(whereSeparator: \.isNewline)
            .first { $0.hasPrefix("0::") }.map { String($0.dropFirst(3)) }
    }

    /// Throws unless the process is still the one that connected, with the asker's ids.
    public func verify() throws(ControlError) {
        guard pid > 1, pid != getpid() else { throw ControlError("process \(pid) cannot be moved into another cgroup") }
        guard let now = Self.startTime(pid), now == started else {
            throw ControlError("process \(pid) is gone (or is another process now)")
        }
        guard uid == 0 || Self.idsAll(pid, uid: uid, gid: gid) else {
            throw ControlError("process \(pid) runs with other user or group ids than the one that asked")
        }
    }

    /// Whether /proc/PID/status's real, effective, saved and file-system user and group ids
    /// are all `uid` and `gid`.
    public static func idsAll(_ pid: Int32, uid: UInt32, gid: UInt32) -> Bool {
        idsAll(in: SystemFiles.text("/proc/\(pid)/status") ?? "", uid: uid, gid: gid)
    }

    public static func idsAll(in status: String, uid: UInt32, gid: UInt32) -> Bool {
        var seen = 0
        for line in status.split(whereSeparator: \.isNewline) {
            let fields = line.split(whereSeparator: { $0 == "\t" || $0 == " " })
            guard let key = fields.first, key == "Uid:" || key == "Gid:" else { continue }
            let want = key == "Uid:" ? uid : gid
            let ids = fields.dropFirst().compactMap { UInt32($0) }
            guard ids.count == 4, ids.allSatisfy({ $0 == want }) else { return false }
            seen += 1
        }
        return seen == 2
    }

    /// /proc/PID/stat's start time (field 22, after the command name in parentheses).
    public static func startTime(_ pid: Int32) -> UInt64? {
        guard let text = SystemFiles.text("/proc/\(pid)/stat"), let close = text.lastIndex(of: ")") else { return nil }
        let fields = text[text.index(after: close)...].split(separator: " ")
        return fields.count > 19 ? UInt64(fields[19]) : nil
    }
}
