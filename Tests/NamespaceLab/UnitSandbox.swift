import Foundation
import Glibc

/// What a systemd unit's `[Service]` sandboxing does to the agent, set up for a lab's agent the
/// way systemd would set it up (systemd is not PID 1 in the lab, so nothing can start a unit):
/// a shell inside `ip netns exec` (which gives a mount namespace and a fresh /sys) mounts the
/// cgroup2 file system at /sys/fs/cgroup, puts itself in a cgroup of its own (the service's),
/// applies what the unit says and then runs the agent with the unit's capabilities.
///
/// Followed, read from the unit's text: `ProtectSystem=strict` (every mount read-only but
/// /proc, /sys and /dev, and the `ReadWritePaths=` and `writable` ones), `ProtectKernelTunables=`
/// (/sys read-only, the cgroup file system apart, as systemd leaves it), `ProtectControlGroups=`
/// (the cgroup file system read-only), `ProtectProc=` and `ProcSubset=` (a /proc of its own with
/// `hidepid=` and `subset=pid`), `CapabilityBoundingSet=`, `AmbientCapabilities=` and
/// `NoNewPrivileges=`. The rest (PrivateTmp, DevicePolicy, the system call filter, ...) the agent
/// runs without here.
public final class UnitSandbox {
    /// The unit's `[Service]` settings, in order; a setting given twice appears twice.
    public let settings: [(key: String, value: String)]
    /// The service's cgroup, a child of the cgroup2 file system's root.
    public let serviceCgroup: String
    private let writable: [String]

    /// `writable` are paths the service may write besides its `ReadWritePaths=` (where the unit
    /// has systemd make its runtime directory, say).
    public init(unit text: String, writable: [String]) {
        var section = ""
        var settings: [(key: String, value: String)] = []
        for line in text.split(whereSeparator: \.isNewline).map({ $0.trimmingCharacters(in: .whitespaces) }) {
            if line.hasPrefix("[") {
                section = line
            } else if section == "[Service]", !line.hasPrefix("#"), let equals = line.firstIndex(of: "=") {
                settings.append((String(line[..<equals]), String(line[line.index(after: equals)...])))
            }
        }
        self.settings = settings
        self.writable = writable
        serviceCgroup = "roam-lab-service.\(getpid()).\(UInt32.random(in: 0...UInt32.max))"
    }

    /// The unit's value of `key` (the last one given), nil when it sets none.
    public func value(_ key: String) -> String? { settings.last { $0.key == key }?.value }

    private func isOn(_ key: String) -> Bool { ["yes", "true", "on", "1"].contains(value(key)?.lowercased() ?? "") }

    /// The command that runs a program (the arguments that follow it) in the sandbox, for
    /// `ip netns exec NAME` to run.
    public var command: [String] { ["/bin/sh", "-c", script, "unit-sandbox"] }

    /// The shell script that sets the sandbox up and then runs "$@" in it.
    public var script: String {
        var lines = ["set -e",
                     "mount -t cgroup2 cgroup2 /sys/fs/cgroup",
                     "mkdir /sys/fs/cgroup/\(serviceCgroup)",
                     "echo $$ > /sys/fs/cgroup/\(serviceCgroup)/cgroup.procs"]
        if value("ProtectSystem") == "strict" {
            // A writable path is a mount of its own, which the read-only pass leaves alone.
            let readWrite = settings.filter { $0.key == "ReadWritePaths" }
                .flatMap { $0.value.split(separator: " ").map(String.init) }
                .map { $0.hasPrefix("-") ? String($0.dropFirst()) : $0 }
                .filter { access($0, F_OK) == 0 } + writable
            lines += readWrite.map { "mount --bind \(quoted($0)) \(quoted($0))" }
            lines += ["keep='\(readWrite.joined(separator: "\n"))'",
                      "for point in $(cut -d' ' -f5 /proc/self/mountinfo); do",
                      "  case $point in /proc|/proc/*|/sys|/sys/*|/dev|/dev/*|*\\\\*) continue ;; esac",
                      "  if printf '%s\\n' \"$keep\" | grep -qxF \"$point\"; then continue; fi",
                      "  mount -o remount,bind,ro \"$point\" 2>/dev/null || true",
                      "done"]
        }
        if isOn("ProtectKernelTunables") { lines.append("mount -o remount,bind,ro /sys") }
        if isOn("ProtectControlGroups") {
            lines += ["mount --bind /sys/fs/cgroup /sys/fs/cgroup", "mount -o remount,bind,ro /sys/fs/cgroup"]
        }
        var procOptions: [String] = []
        switch value("ProtectProc") {
        case "invisible", "noaccess", "ptraceable": procOptions.append("hidepid=\(value("ProtectProc")!)")
        default: break
        }
        if value("ProcSubset") == "pid" { procOptions.append("subset=pid") }
        if !procOptions.isEmpty { lines.append("mount -t proc -o nosuid,nodev,noexec,\(procOptions.joined(separator: ",")) proc /proc") }
        var privileges: [String] = []
        if let bounding = value("CapabilityBoundingSet") { privileges.append("--bounding-set=" + capabilities(bounding)) }
        if let ambient = value("AmbientCapabilities") {
            privileges += ["--inh-caps=" + capabilities(ambient), "--ambient-caps=" + capabilities(ambient)]
        }
        if isOn("NoNewPrivileges") { privileges.append("--no-new-privs") }
        lines.append("exec /usr/bin/setpriv \(privileges.joined(separator: " ")) \"$@\"")
        return lines.joined(separator: "\n")
    }

    /// `CAP_NET_ADMIN CAP_NET_RAW` as setpriv takes it: `-all,+net_admin,+net_raw`.
    private func capabilities(_ list: String) -> String {
        (["-all"] + list.split(separator: " ").map { "+" + $0.lowercased().replacingOccurrences(of: "cap_", with: "") })
            .joined(separator: ",")
    }

    private func quoted(_ path: String) -> String { "'" + path.replacingOccurrences(of: "'", with: "'\\''") + "'" }

    /// Removes the service's cgroup (and what the agent left in it) once the processes in it
    /// have ended, waiting up to `seconds` for them.
    public func remove(seconds: Double = 5) {
        guard let root = Self.cgroup2Root() else { return }
        let directory = root + "/" + serviceCgroup
        _ = labWait(seconds: seconds) {
            let children = (try? FileManager.default.contentsOfDirectory(atPath: directory))?
                .filter { (try? FileManager.default.attributesOfItem(atPath: directory + "/" + $0)[.type] as? FileAttributeType) == .typeDirectory } ?? []
            for child in children { rmdir(directory + "/" + child) }
            return rmdir(directory) == 0 || errno == ENOENT
        }
    }

    /// Where this process sees the cgroup2 file system's root.
    static func cgroup2Root() -> String? {
        let mountinfo = (try? String(contentsOfFile: "/proc/self/mountinfo", encoding: .utf8)) ?? ""
        for line in mountinfo.split(separator: "\n") {
            let fields = line.split(separator: " ")
            if let dash = fields.firstIndex(of: "-"), dash + 1 < fields.count, fields[dash + 1] == "cgroup2", fields[3] == "/" {
                return String(fields[4])
            }
        }
        return nil
    }
}
