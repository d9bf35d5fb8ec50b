public import Foundation
import Glibc

/// A throwaway PostgreSQL server from Debian's `postgresql` package: its own data directory and
/// Unix socket under /tmp, no TCP listener, started as the `postgres` user and stopped (by its
/// data directory's postmaster) and removed on `stop()` or deinit.
public final class LabPostgres {
    public let directory: String
    public var data: String { directory + "/data" }
    /// Where its socket is: libpq's `host` for it.
    public var socketDirectory: String { directory + "/run" }
    private var running = false

    /// The server's programs, from the newest installed major version.
    public static let binaries: String? = {
        let root = "/usr/lib/postgresql"
        let versions = ((try? FileManager.default.contentsOfDirectory(atPath: root)) ?? []).compactMap(Int.init).sorted()
        return versions.last.map { "\(root)/\($0)/bin" }.flatMap { FileManager.default.isExecutableFile(atPath: $0 + "/pg_ctl") ? $0 : nil }
    }()
    public static var available: Bool { binaries != nil && getpwnam("postgres") != nil }
    public static let skipReason = "needs Debian's postgresql package (scripts/setup installs it) and root"

    /// libpq's connection string for database `database` as `user`.
    public func conninfo(_ database: String = "roam", user: String = "postgres") -> String {
        "host=\(socketDirectory) dbname=\(database) user=\(user) connect_timeout=5"
    }

    /// libpq's URL for database `database` as `user`, through the socket.
    public func url(_ database: String = "roam", user: String = "postgres") -> String {
        "postgresql://\(user)@/\(database)?host=\(socketDirectory)"
    }

    /// Starts it with `hba` as its client authentication (trust for the postgres superuser on the
    /// socket, always first), and makes database `roam`.
    public init(hba: String = "") throws {
        guard let bin = Self.binaries, let account = getpwnam("postgres") else { throw NamespaceLab.Failure(description: Self.skipReason) }
        var template = Array("/tmp/roam-pg.XXXXXX".utf8CString)
        guard let made = mkdtemp(&template) else { throw NamespaceLab.Failure(description: "mkdtemp: \(errno)") }
        directory = String(cString: made)
        let (uid, gid) = (account.pointee.pw_uid, account.pointee.pw_gid)
        for path in [directory, socketDirectory] {
            mkdir(path, 0o700)
            chown(path, uid, gid)
        }
        try run(bin + "/initdb", ["-D", data, "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8"])
        try ("local all postgres trust\n" + hba).write(toFile: data + "/pg_hba.conf", atomically: false, encoding: .utf8)
        try startServer(bin)
        try run(bin + "/createdb", ["-h", socketDirectory, "-U", "postgres", "roam"])
    }

    deinit { stop() }

    /// Runs `sql` in database `roam` as the superuser; throws with psql's words when it fails.
    @discardableResult
    public func psql(_ sql: String, database: String = "roam") throws -> String {
        try run("/usr/bin/psql", ["-h", socketDirectory, "-U", "postgres", "-d", database, "-v", "ON_ERROR_STOP=1", "-qAt", "-c", sql])
    }

    /// Starts psql running `sql` in database `roam` and returns at once (to hold a lock while
    /// the test goes on); the caller waits for it.
    public func psqlInBackground(_ sql: String) throws -> Process {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/psql")
        process.arguments = ["-h", socketDirectory, "-U", "postgres", "-d", "roam", "-v", "ON_ERROR_STOP=1", "-qAt", "-c", sql]
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        return process
    }

    /// Runs the file `path` (a migration) in database `roam`.
    public func psql(file path: String) throws {
        try run("/usr/bin/psql", ["-h", socketDirectory, "-U", "postgres", "-d", "roam", "-v", "ON_ERROR_STOP=1", "-q", "-f", path])
    }

    /// Stops the server (fast: its sessions end) without removing its data; `start()` brings it back.
    public func pause() throws {
        guard running, let bin = Self.binaries else { return }
        try run(bin + "/pg_ctl", ["-D", data, "-w", "-m", "fast", "stop"])
        running = false
    }

    public func start() throws {
        guard !running, let bin = Self.binaries else { return }
        try startServer(bin)
    }

    /// Stops it and removes its directory.
    public func stop() {
        if running, let bin = Self.binaries { _ = try? run(bin + "/pg_ctl", ["-D", data, "-w", "-m", "immediate", "stop"]) }
        running = false
        try? FileManager.default.removeItem(atPath: directory)
    }

    /// pg_ctl leaves the server running in the background, holding whatever it inherited: it is
    /// spawned here with nothing but /dev/null and the log, and waited for by its id.
    private func startServer(_ bin: String) throws {
        let argv = ["/usr/sbin/runuser", "-u", "postgres", "--", bin + "/pg_ctl", "-D", data, "-w", "-t", "30", "-l",
                    directory + "/server.log", "-o",
                    "-k \(socketDirectory) -c listen_addresses='' -c fsync=off -c unix_socket_permissions=0777", "start"]
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        for fd in Int32(0)...2 { posix_spawn_file_actions_addopen(&actions, fd, "/dev/null", fd == 0 ? O_RDONLY : O_WRONLY, 0) }
        var pid: pid_t = 0
        var arguments = argv.map { strdup($0) } + [nil]
        defer { for pointer in arguments { free(pointer) } }
        let spawned = posix_spawn(&pid, argv[0], &actions, nil, &arguments, environ)
        guard spawned == 0 else { throw NamespaceLab.Failure(description: "cannot run pg_ctl: \(spawned)") }
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
        let log = (try? String(contentsOfFile: directory + "/server.log", encoding: .utf8)) ?? ""
        guard status == 0 else { throw NamespaceLab.Failure(description: "pg_ctl start (status \(status)): \(log.suffix(2000))") }
        running = true
    }

    /// Runs `program` as the postgres user (initdb and the server refuse root), bounded in time.
    @discardableResult
    private func run(_ program: String, _ arguments: [String]) throws -> String {
        let (status, output) = try NamespaceLab.capture(URL(fileURLWithPath: "/usr/sbin/runuser"), ["-u", "postgres", "--", program] + arguments)
        guard status == 0 else { throw NamespaceLab.Failure(description: "\(program) \(arguments.joined(separator: " ")): \(output)") }
        return output
    }
}
