import Control
import ControlWire
import Logging
import Lockdown
import Basics
import SystemDNS
import Glibc

/// Applications kept outside the tunnel on purpose (`agent exclude`, with `exclusion: allow`):
/// one cgroup, made on the first request and kept until the agent ends, let through the lockdown
/// to the network directly with the network's own resolvers.
extension SessionEffects {
    /// Makes the cgroup and lets it through the lockdown; whether it could (why not is logged).
    func openExclusion(runtimeDirectory: String) -> Bool {
        guard let firewall else {
            log.error("cannot keep applications outside the tunnel", metadata: ["error": "no lockdown"])
            return false
        }
        let cgroup: PortalCgroup
        do throws(CgroupError) {
            let found = if let cgroups { cgroups } else { try CgroupFileSystem.find(runtimeDirectory: runtimeDirectory) }
            cgroups = found
            cgroup = try PortalCgroup.make(in: found, name: "roam-excluded.\(getpid())", what: "the excluded applications' cgroup")
        } catch {
            log.error("cannot keep applications outside the tunnel", metadata: ["error": "\(error.message)"])
            return false
        }
        let exclusion = LockdownPolicy.Exclusion(cgroup: cgroup.nftablesPath, level: cgroup.level, resolvers: networkResolvers())
        do {
            try firewall.exclusion(exclusion)
        } catch {
            log.error("cannot keep applications outside the tunnel", metadata: ["error": "\(error)"])
            if let cgroups { _ = cgroup.close(fs: cgroups) }
            return false
        }
        exclusionCgroup = cgroup
        log.warning("applications may be kept outside the tunnel from now on: their traffic leaves in clear",
                    metadata: ["cgroup": "\(cgroup.directory)", "resolvers": "\(exclusion.resolvers.map(\.description).joined(separator: ","))"])
        return true
    }

    /// Moves `peer`, or the process `target` it named (which must run with the asker's ids, unless
    /// the asker is root), into the excluded applications' cgroup; returns the process moved.
    func exclude(_ peer: PeerProcess, target: Int32?, started: UInt64? = nil) throws(AgentError) -> PeerProcess {
        guard var cgroup = exclusionCgroup, let cgroups else { throw AgentError("no exclusion is open") }
        let process = target.map { PeerProcess(pid: $0, uid: peer.uid, gid: peer.gid) } ?? peer
        guard process.started != nil else { throw AgentError("there is no process \(process.pid)") }
        if let started, process.started != started {
            throw AgentError("process \(process.pid) is not the one named: it ended and another has its id")
        }
        // A thread's id would move its whole process: only a process's own id is taken.
        guard target == nil || Self.threadGroup(of: process.pid) == process.pid else {
            throw AgentError("\(process.pid) is a thread, not a process: give its process's id")
        }
        do throws(CgroupError) {
            try cgroup.add(process.pid, from: process.cgroup, fs: cgroups, shared: true) { try process.verify() }
        } catch {
            throw AgentError(error.message)
        }
        exclusionCgroup = cgroup
        if let origin = process.cgroup {
            exclusionOrigins[process.pid] = origin
            // By the process's own user (root may move another user's), read from the kernel.
            if let user = PortalCgroup.user(of: process.pid) { exclusionUsers[user] = origin }
        }
        return process
    }

    /// /proc/PID/status's Tgid: the process a thread id belongs to.
    static func threadGroup(of pid: Int32) -> Int32? {
        SystemFiles.processStatus(pid, "Tgid")?.first.flatMap { Int32($0) }
    }

    /// The processes outside the tunnel now, with their names.
    var excludedProcesses: [(pid: Int32, name: String)] {
        guard let directory = exclusionCgroup?.directory else { return [] }
        return (SystemFiles.text(directory + "/cgroup.procs") ?? "").split(whereSeparator: \.isNewline).compactMap { Int32($0) }
            .map { ($0, SystemFiles.text("/proc/\($0)/comm") ?? "?") }
    }

    /// The network changed: the excluded applications' look-ups follow its resolvers.
    func exclusionNetworkChanged() {
        guard let firewall, let cgroup = exclusionCgroup else { return }
        let exclusion = LockdownPolicy.Exclusion(cgroup: cgroup.nftablesPath, level: cgroup.level, resolvers: networkResolvers())
        do {
            try firewall.exclusion(exclusion)
        } catch {
            log.error("cannot follow the network's resolvers for the excluded applications", metadata: ["error": "\(error)"])
        }
    }

    /// The agent ends: the excluded processes go back where they came from, the cgroup goes,
    /// and the lockdown's opening for it (an agent that starts next loads its table whole).
    func closeExclusion() {
        guard let cgroup = exclusionCgroup, let cgroups else { return }
        try? firewall?.exclusion(nil)
        if let error = cgroup.close(fs: cgroups, origins: exclusionOrigins, users: exclusionUsers) {
            log.error("the excluded applications' cgroup stays", metadata: ["error": "\(error)"])
        }
        exclusionOrigins = [:]
        exclusionUsers = [:]
        exclusionCgroup = nil
    }

    /// The network's own resolvers: those the system names besides the tunnel's (resolv.conf
    /// as it was before the agent wrote it, or systemd-resolved's uplinks).
    func networkResolvers() -> [IPAddress] {
        ResolvConf(ResolvConfFile.systemText(at: "/etc/resolv.conf") ?? "",
                   systemdUplinks: SystemFiles.text("/run/systemd/resolve/resolv.conf"),
                   avoiding: dns?.applied?.resolvers ?? []).nameservers.filter { !$0.isLoopback }
    }
}
