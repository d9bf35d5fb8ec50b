import Basics
import CShims
import Control
import ControlWire
import Directory
import Glibc
import Logging
import Observability
import Settings
import Synchronization
import Device
import Tunnel

/// A gateway's users from the fleet's directory (`users-from`): read at start (from the
/// database, or from the snapshot when the database cannot be reached), then followed on a
/// thread of its own: each committed change is read and applied as SIGHUP applies a file
/// (users listed as before keep their sessions; a disabled, deleted or changed user's end).
/// Fail static: whatever goes wrong with the database, the last users read keep being served
/// and the gateway connects again with backoff; only a reply it can read replaces them.
final class DirectoryFollower: Sendable {
    let source: UserSource
    /// The tunnel's prefixes: every user's addresses must lie inside them.
    private let tunnel: [Prefix]
    let log: Logger
    /// The gateway stops: no more session records.
    private let stopping = Atomic<Bool>(false)
    /// The following thread's own state (nobody else takes this lock).
    private let link: Mutex<Link>
    let state: Mutex<DirectoryFigures>
    /// SIGHUP: everything is read again.
    private let rereadAsked = Atomic<Bool>(false)
    private let wakeup: Wakeup

    struct Link {
        var copy: DirectoryCopy
        var subscription: UserDirectory.Subscription?
        var backoff = Backoff()
        /// The wait before the next attempt to connect, drawn when the last one failed.
        var nextWait: Duration = .zero
        /// The refused rows last said, so each is logged when it appears, not at every change.
        var refused: [String: String] = [:]
        /// The snapshot is behind since then.
        var unsaved: Instant?
        /// When this gateway's session records are renewed next.
        var nextRecord = Instant.now()
        /// Why the last renewal failed while the database answered (a role without the grant).
        var recordProblem: String?
    }

    /// Changes naming more users than this are read as a whole directory.
    static let wholeReadAbove = 2_000
    /// The snapshot is written once changes have been quiet this long (a burst is written once).
    static let snapshotQuiet: Duration = .seconds(1)
    /// How long after a failed snapshot write it is tried again.
    static let snapshotRetry: Duration = .seconds(10)
    /// How often this gateway's session records are renewed (roam_fleet leaves out rows a minute old).
    static let recordEvery: Duration = .seconds(10)

    /// Reads the users at start: from the database when it answers (and the snapshot is written),
    /// else from the snapshot. Throws when the database speaks a schema version this agent does
    /// not read, or when it cannot be read and there is no snapshot.
    init(_ source: UserSource, tunnel: [Prefix], log: Logger) throws {
        self.source = source
        self.tunnel = tunnel
        self.log = log
        wakeup = try Wakeup()
        if let problem = UserDirectory.transportProblem(source.url) { log.warning("users-from: \(problem)") }
        let started = Instant.now()
        var figures = DirectoryFigures()
        var link: Link
        do {
            let subscription = try UserDirectory.Subscription(source.url, passwordFile: source.passwordFile)
            link = Link(copy: try subscription.all(tunnel: tunnel), subscription: subscription)
            figures.reachable = true
            figures.origin = "database"
            log.info("user directory read", metadata: ["rows": "\(link.copy.count)", "took": "\((Instant.now() - started).short)"])
            link.unsaved = Instant.now() - Self.snapshotQuiet
        } catch where error.kind == .schema {
            throw AgentError("users-from: \(error)")
        } catch {
            let copy: DirectoryCopy
            do {
                copy = try UserSnapshot.copy(try TrustedFile.read(source.snapshot, as: .userSnapshot), tunnel: tunnel)
            } catch let problem {
                throw AgentError("users-from: \(error); and no snapshot to start from: \(problem)")
            }
            link = Link(copy: copy, subscription: nil)
            figures.origin = "snapshot"
            figures.error = "\(error)"
            log.warning("user directory unreachable; serving the snapshot", metadata: [
                "error": "\(error)", "snapshot": "\(source.snapshot)", "rows": "\(copy.count)",
                "written": "\(Self.age(of: source.snapshot))",
            ])
        }
        let load = link.copy.load()
        CShims_trim_memory()
        figures.users = load.users.count
        figures.refused = load.refused.count
        link.refused = Self.noteRefused(load, since: [:], log: log)
        if link.subscription == nil { link.nextWait = link.backoff.wait() }
        users = load.users
        self.link = Mutex(link)
        state = Mutex(figures)
    }

    /// The users read at start.
    let users: [User]

    /// What status and metrics show.
    var figures: DirectoryFigures { state.withLock { $0 } }

    /// SIGHUP: the whole directory is read again (the changes are followed anyway; this is for an
    /// operator who wants to be sure).
    func rereadAll() {
        rereadAsked.store(true, ordering: .relaxed)
        wakeup.signal()
    }

    /// Follows the directory on a thread of its own, handing every new set of users to `apply`,
    /// which returns how many sessions ended, and renewing the session records `records` gives.
    func follow(_ apply: @escaping @Sendable (UserDatabase) -> Int, records: @escaping @Sendable () -> [SessionRecord]) throws {
        try OSThread.detach { [self] in link.withLock { link in run(&link, apply, records) } }
    }

    /// The gateway stops: its session records go (on a connection of its own, when the database
    /// answered last; bounded by libpq's connect timeout), and no more are written.
    func stop() {
        stopping.store(true, ordering: .relaxed)
        guard figures.reachable else { return }
        do {
            try UserDirectory.forgetSessions(source.url, passwordFile: source.passwordFile, gateway: source.gateway)
        } catch {
            log.warning("session records not removed; roam_fleet leaves them out after a minute", metadata: ["error": "\(error)"])
        }
    }

    private func run(_ link: inout Link, _ apply: (UserDatabase) -> Int, _ records: () -> [SessionRecord]) {
        while true {
            guard let subscription = link.subscription else {
                _ = waitReadable(nil, for: link.nextWait)
                connect(&link, apply)
                continue
            }
            do {
                // Every query reads the announcements that came before its answer into libpq's
                // queue, where the socket no longer shows them: taken before waiting, every time.
                let names = try subscription.changed()
                if !names.isEmpty {
                    if names.count > Self.wholeReadAbove {
                        readAll(&link, subscription, apply, why: "\(names.count) users changed")
                    } else {
                        let started = Instant.now()
                        let rows = try subscription.rows(named: names)
                        // An announcement of rows as they were (anyone may NOTIFY) changes nothing.
                        if link.copy.update(names, rows: rows) { applyCopy(&link, apply, names: names, started: started) }
                    }
                    continue
                }
            } catch {
                lost(&link, error)
                continue
            }
            let now = Instant.now()
            let recordIn = stopping.load(ordering: .relaxed) ? Duration.seconds(3600) : link.nextRecord - now
            if recordIn <= .zero {
                record(&link, subscription, records())
                continue
            }
            let quietFor = link.unsaved.map { Self.snapshotQuiet - (now - $0) }
            if let quietFor, quietFor <= .zero {
                saveSnapshot(&link)
                continue
            }
            let (_, woken) = waitReadable(subscription.fileDescriptor, for: min(quietFor ?? .seconds(3600), recordIn))
            if woken, rereadAsked.exchange(false, ordering: .relaxed) {
                readAll(&link, subscription, apply, why: "SIGHUP")
            }
        }
    }

    /// Connects again after a loss: listens first, then reads everything, so a change made while
    /// the gateway was away arrives either way.
    private func connect(_ link: inout Link, _ apply: (UserDatabase) -> Int) {
        rereadAsked.store(false, ordering: .relaxed)
        do {
            let subscription = try UserDirectory.Subscription(source.url, passwordFile: source.passwordFile)
            let started = Instant.now()
            link.copy = try subscription.all(tunnel: tunnel)
            link.subscription = subscription
            link.backoff.reset()
            let down = state.withLock { figures in
                defer {
                    figures.reachable = true
                    figures.origin = "database"
                    figures.error = nil
                    figures.reconnects += 1
                    figures.since = Instant.now()
                }
                return Instant.now() - figures.since
            }
            log.notice("user directory reachable again", metadata: ["after": "\(down.short)"])
            applyCopy(&link, apply, names: nil, started: started)
        } catch {
            link.nextWait = link.backoff.wait()
            state.withLock { $0.error = "\(error)" }
            log.info("user directory still unreachable", metadata: ["error": "\(error)", "retry_in": "\(link.nextWait.short)"])
        }
    }

    private func readAll(_ link: inout Link, _ subscription: UserDirectory.Subscription, _ apply: (UserDatabase) -> Int, why: String) {
        let started = Instant.now()
        do {
            link.copy = try subscription.all(tunnel: tunnel)
            log.info("user directory read", metadata: ["rows": "\(link.copy.count)", "why": "\(why)"])
            applyCopy(&link, apply, names: nil, started: started)
        } catch {
            lost(&link, error)
        }
    }

    /// The database went away (or answered what cannot be read): the users served stay.
    func lost(_ link: inout Link, _ error: any Error) {
        link.subscription = nil
        link.nextWait = link.backoff.wait()
        state.withLock {
            $0.reachable = false
            $0.error = "\(error)"
            $0.since = Instant.now()
        }
        log.warning("user directory unreachable; serving the last users read", metadata: [
            "error": "\(error)", "retry_in": "\(link.nextWait.short)"])
    }

    /// Serves the copy's users now.
    private func applyCopy(_ link: inout Link, _ apply: (UserDatabase) -> Int, names: [String]?, started: Instant) {
        let load = link.copy.load()
        let database: UserDatabase
        do {
            database = try UserDatabase(load.users)
        } catch {
            // Not expected: the copy refuses what the database would. The users served stay.
            return log.error("users not changed; the running ones stay", metadata: ["error": "\(error)"])
        }
        let ended = apply(database)
        link.refused = Self.noteRefused(load, since: link.refused, log: log)
        link.unsaved = link.unsaved ?? Instant.now()
        let changed = state.withLock { figures in
            figures.users = load.users.count
            figures.refused = load.refused.count
            figures.changes += 1
            figures.lastChange = Instant.now()
            return figures.changes
        }
        var metadata: Logger.Metadata = ["users": "\(load.users.count)", "sessions_ended": "\(ended)",
                                         "took": "\((Instant.now() - started).short)", "change": "\(changed)"]
        if let names {
            metadata["names"] = "\(names.prefix(8).joined(separator: ","))\(names.count > 8 ? ",+\(names.count - 8)" : "")"
        }
        log.notice("users changed", metadata: metadata)
        // A read of many rows leaves freed memory in malloc's arenas: given back, not kept.
        CShims_trim_memory()
    }

    /// Logs each refused row not refused before (name, why); returns the refused rows now.
    @discardableResult
    private static func noteRefused(_ load: UserDirectory.Load, since before: [String: String], log: Logger) -> [String: String] {
        var now: [String: String] = [:]
        for (name, why) in load.refused where now[name] == nil {
            now[name] = why
            if before[name] != why { log.warning("user refused", metadata: ["user": "\(name)", "why": "\(why)"]) }
        }
        return now
    }

    /// Waits until `fd` is readable, the wake-up pipe is, or `timeout` (nil: none) passes.
    private func waitReadable(_ fd: Int32?, for timeout: Duration?) -> (ready: Bool, woken: Bool) {
        var fds = [pollfd(fd: wakeup.readEnd, events: Int16(POLLIN), revents: 0)]
        if let fd { fds.append(pollfd(fd: fd, events: Int16(POLLIN), revents: 0)) }
        let milliseconds = timeout.map { Int32(clamping: max(0, $0.nanoseconds / 1_000_000 + 1)) } ?? -1
        guard poll(&fds, nfds_t(fds.count), milliseconds) > 0 else { return (false, false) }
        let woken = fds[0].revents != 0
        if woken { wakeup.drain() }
        return (fds.count > 1 && fds[1].revents != 0, woken)
    }
}
