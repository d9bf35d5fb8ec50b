import Glibc
import Basics
import Lockdown

/// The boot lockdown, held (`agent lockdown on --hold`): loaded before any interface is up, it
/// stays until an agent holds its own. Any root process may delete the lockdown's table (Debian's
/// nftables.service and firewalld begin with `flush ruleset`), so the holder keeps a guard no
/// other process may delete (`LockdownPolicy.bootGuardTable`, owned by it) and loads the table
/// again whenever it is gone. It ends, and its guard with it, once an agent's guard is loaded:
/// the agent's lockdown holds from then on. It sleeps in poll() until nftables changes.
struct LockdownHolder {
    static let defaultRuntime = "/run/roam"
    static let pidFile = "lockdown-holder.pid"

    let policy: LockdownPolicy
    let runtime: String

    func run() throws {
        let lockdown: Lockdown
        let watch: TableWatch
        do {
            lockdown = try Lockdown(guard: LockdownPolicy.bootGuardTable)
            try lockdown.apply(policy)
            watch = try TableWatch(ownCommits: lockdown.commits)
        } catch {
            throw AgentError("cannot load the lockdown firewall: \(error)")
        }
        if let unavailable = lockdown.guardUnavailable {
            // Nothing to hold it with: loaded and left, as without --hold.
            return printError("any root process can delete the lockdown on this kernel (no nftables table owners, Linux 5.12+): "
                              + "loaded, not held: \(unavailable.message)")
        }
        let pidPath = runtime + "/" + Self.pidFile
        try? SystemFiles.write("\(getpid())\n", to: pidPath)
        defer { unlink(pidPath) }
        SystemdNotifier().notify("READY=1")
        while true {
            do throws(LockdownError) {
                if try lockdown.isInstalled(LockdownPolicy.guardTable) { return }
                if try !lockdown.isInstalled() {
                    printError("the lockdown's table was deleted; loading it again")
                    lockdown.forget()
                    try lockdown.apply(policy)
                }
            } catch {
                // The guard holds meanwhile; the next change of nftables tries again.
                printError("\(error)")
            }
            var ready = pollfd(fd: watch.fileDescriptor, events: Int16(POLLIN), revents: 0)
            _ = poll(&ready, 1, -1)
            _ = watch.foreignChange(ownCommits: lockdown.commits)
        }
    }

    /// Ends a holder that `runtime` names, and waits (up to 2 s) for its guard to go.
    static func end(runtime: String) throws {
        guard let text = SystemFiles.text(runtime + "/" + pidFile), let pid = Int32(text), pid > 1 else { return }
        // Only a holder: a stale file's PID may be anyone's now.
        guard (SystemFiles.text("/proc/\(pid)/cmdline") ?? "").contains("--hold") else { return }
        kill(pid, SIGTERM)
        for _ in 0..<200 where kill(pid, 0) == 0 { usleep(10_000) }
    }
}
