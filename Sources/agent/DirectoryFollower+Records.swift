import Basics
import CShims
import Directory
import Glibc
import Logging
import Settings
import Synchronization
import Tunnel

/// What a following gateway keeps beyond its users: its session records in the directory, and
/// the snapshot a restart without the database serves.
extension DirectoryFollower {
    /// Renews this gateway's session records; a database that refuses (no grant) is said once.
    func record(_ link: inout Link, _ subscription: UserDirectory.Subscription, _ records: [SessionRecord]) {
        link.nextRecord = Instant.now() + Self.recordEvery
        do {
            try subscription.record(records, gateway: source.gateway, now: Instant.now(), wallClock: Self.wallClock())
            if link.recordProblem != nil { log.notice("session records renewed again") }
            link.recordProblem = nil
        } catch where error.kind == .refused {
            if link.recordProblem != error.message {
                log.warning("session records not written; the users are followed all the same", metadata: ["error": "\(error)"])
            }
            link.recordProblem = error.message
        } catch {
            lost(&link, error)
        }
    }

    /// The Unix time now, in seconds.
    static func wallClock() -> Double {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        return Double(now.tv_sec) + Double(now.tv_nsec) / 1e9
    }

    /// Writes the snapshot; when it cannot be written (a full disk), tries again in 10 s.
    func saveSnapshot(_ link: inout Link) {
        link.unsaved = nil
        do {
            try UserSnapshot.write(link.copy.rows, to: source.snapshot)
            CShims_trim_memory()
            state.withLock {
                $0.snapshotWritten = Instant.now()
                $0.snapshotError = nil
            }
        } catch {
            link.unsaved = Instant.now() + Self.snapshotRetry
            let first = state.withLock { figures in
                defer { figures.snapshotError = "\(error)" }
                return figures.snapshotError == nil
            }
            if first {
                log.warning("users snapshot not written; a restart without the database would serve an older one",
                            metadata: ["error": "\(error)", "retry_in": "\(Self.snapshotRetry.short)"])
            }
        }
    }

    /// How old the file at `path` is, in words.
    static func age(of path: String) -> String {
        var info = stat()
        guard stat(path, &info) == 0 else { return "unknown" }
        return "\(max(0, Int(time(nil)) - Int(info.st_mtim.tv_sec)))s ago"
    }
}
