import Foundation
import Glibc
import NamespaceLab
import Basics
import Synchronization
import Testing
@testable import Control
@testable import ControlWire
@testable import agent

/// The control socket's messages and its server: typed answers, and askers that misbehave
/// (garbage, a huge line, nothing at all, a watcher that never reads) get an error or are let go
/// while everyone else is answered at once. In-process, on a socket in a temporary directory.
struct ControlTests {
    /// Every slot taken: root makes room by closing someone else's connection (a watcher first,
    /// the oldest), so a group member who holds every slot cannot keep root's `down` out; anyone
    /// else is told busy, and so is root when root holds every slot.
    @Test func rootIsNeverToldBusy() {
        let member: uid_t = 1000
        let full = (1...32).map { (id: $0, uid: member, watching: $0 != 1) }
        #expect(ControlServer.room(for: 0, among: full) == 2, "the oldest watcher goes")
        #expect(ControlServer.room(for: member, among: full) == nil)
        #expect(ControlServer.room(for: 0, among: full.map { ($0.id, $0.uid, false) }) == 1)
        #expect(ControlServer.room(for: 0, among: (1...32).map { (id: $0, uid: 0, watching: true) }) == nil)
        let mixed = [(id: 5, uid: uid_t(0), watching: true), (id: 7, uid: member, watching: false), (id: 9, uid: member, watching: true)]
        #expect(ControlServer.room(for: 0, among: mixed) == 9)
    }

    /// `--control` may name a socket in any directory; only the agent's own is opened to the
    /// readers' group, never the one that merely holds it (`/run`, `/tmp`, `/root`).
    @Test func onlyTheAgentsOwnDirectoryOpensToReaders() throws {
        #expect(ControlSocket.opensToReaders("/run/roam", made: false, runtimeDirectories: nil))
        #expect(!ControlSocket.opensToReaders("/run", made: false, runtimeDirectories: nil))
        #expect(!ControlSocket.opensToReaders("/root", made: false, runtimeDirectories: "/run/roam-server"))
        #expect(ControlSocket.opensToReaders("/run/roam-server", made: false, runtimeDirectories: "/run/roam:/run/roam-server"))
        #expect(!ControlSocket.opensToReaders("/run/roam-serv", made: false, runtimeDirectories: "/run/roam-server"))
        #expect(ControlSocket.opensToReaders("/tmp/x", made: true, runtimeDirectories: nil))

        // A directory that was there before keeps its owner and mode.
        let directory = NSTemporaryDirectory() + "roam-control-\(getpid())"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: false)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        chmod(directory, 0o755)
        var before = stat()
        stat(directory, &before)
        _ = try ControlSocket(path: directory + "/agent.sock", runtimeDirectories: nil)
        var after = stat()
        stat(directory, &after)
        #expect(after.st_mode == before.st_mode && after.st_gid == before.st_gid, "the directory was changed")
    }

    @Test func jsonRoundTripsWhatTheAgentWrites() throws {
        let value = JSON.object([
            ("version", .int(1)), ("ok", .bool(true)), ("rtt_ms", .double(1.25)), ("none", .null),
            ("text", .string("a \"quoted\" line\nwith\ttabs and é and 🛰")), ("list", .array([.int(-3), .double(2.0), .string("")])),
            ("nested", .object([("deep", .object([]))])),
        ])
        #expect(try JSON.parse(value.text) == value)
        #expect(!value.text.contains("\n"), "one line")
        #expect(try JSON.parse(#" { "a" : [ 1 , 2.5e3, true, false, null ], "b":"\u00e9\ud83d\udef0" } "#)
            == .object([("a", .array([.int(1), .double(2500), .bool(true), .bool(false), .null])), ("b", .string("é🛰"))]))
    }

    static let malformed = ["", "{", "{\"a\":}", "[1,]", "{\"a\" 1}", "\"\\x\"", "\"\\ud800\"", "tru", "1 2", "{\"a\":1}}", "\"\u{01}\"", "01x",
                            String(repeating: "[", count: 40) + String(repeating: "]", count: 40)]

    @Test(arguments: malformed)
    func malformedJSONIsAnErrorNeverACrash(_ text: String) {
        #expect(throws: JSON.ParseError.self) { try JSON.parse(text) }
    }

    /// The process an `exclude` request names: none, a process id, or a refusal, never the
    /// asker taken in place of a `pid` that cannot be one.
    @Test func aRequestsProcessIsAnIdOrARefusal() {
        #expect(ControlProtocol.target(in: ControlProtocol.request(.exclude)) == .success(nil))
        #expect(ControlProtocol.target(in: ControlProtocol.request(.exclude, pid: 4242)) == .success(4242))
        #expect(ControlProtocol.target(in: "exclude") == .success(nil))
        for pid in ["1", "0", "-5", "\"4242\"", "4294967296", "12.5", "null"] {
            guard case .failure(let failure) = ControlProtocol.target(in: "{\"command\":\"exclude\",\"pid\":\(pid)}") else {
                Issue.record("pid \(pid) was taken")
                continue
            }
            #expect(failure.code == "bad-request")
        }
    }

    @Test func requestsAreJSONOrABareWord() throws {
        #expect(ControlProtocol.command(in: #"{"version":1,"command":"status"}"#) == .success(.status))
        #expect(ControlProtocol.command(in: #"{"command":"watch"}"#) == .success(.watch))
        #expect(ControlProtocol.command(in: "down\r") == .success(.down))
        #expect(ControlProtocol.command(in: ControlProtocol.request(.drain)) == .success(.drain))
        for (line, code) in [(#"{"version":2,"command":"status"}"#, "unsupported-version"), (#"{"version":1}"#, "bad-request"),
                             (#"{"version":1,"command":"reboot"}"#, "unknown-command"), ("{garbage", "bad-request"),
                             ("status please", "unknown-command"), (#"{"version":"1","command":"status"}"#, "unsupported-version")] {
            guard case .failure(let failure) = ControlProtocol.command(in: line) else {
                Issue.record("\(line) was accepted")
                continue
            }
            #expect(failure.code == code, "\(line): \(failure)")
            #expect(try JSON.parse(failure.line)["ok"] == .bool(false))
        }
    }

    /// A server whose handler answers status at once and counts the calls.
    final class Harness: Sendable {
        let directory: String
        let server: ControlServer
        let counter = Counter()
        var calls: Int { counter.value.load(ordering: .relaxed) }

        final class Counter: Sendable { let value = Atomic<Int>(0) }

        init(operatorGroup: gid_t? = nil) throws {
            var template = Array("/tmp/roam-control.XXXXXX".utf8CString)
            let made = template.withUnsafeMutableBufferPointer { mkdtemp($0.baseAddress!) }
            directory = String(cString: try #require(made))
            let counter = self.counter
            server = try ControlServer(socket: try ControlSocket(path: directory + "/agent.sock"), operatorGroup: operatorGroup) { call in
                counter.value.add(1, ordering: .relaxed)
                switch call.command {
                case .status: call.reply(ControlProtocol.answer([("status", .object([("state", .string("connected"))]))]))
                case .watch: call.reply(ControlProtocol.event("status", [("status", .object([]))]), watch: true)
                default: call.reply(ControlFailure(code: "not-here", message: "not in this test").line)
                }
            }
            try server.start()
        }

        var path: String { directory + "/agent.sock" }

        /// Runs the built agent's `arguments` against the socket as `nobody`, with primary group
        /// `gid` and supplementary `groups`, the socket reachable by them as by the `roam` group's
        /// members.
        func ask(_ arguments: [String], groups: [gid_t], gid: gid_t = 65534) throws -> (Int32, String) {
            chmod(directory, 0o755)
            chmod(path, 0o666)
            let groupOption = groups.isEmpty ? "--clear-groups" : "--groups=" + groups.map(String.init).joined(separator: ",")
            return try NamespaceLab.capture(URL(fileURLWithPath: "/usr/bin/setpriv"),
                                            ["--reuid=65534", "--regid=\(gid)", groupOption, RoamingLab.builtAgent.path]
                                                + arguments + ["--control", path])
        }

        deinit {
            server.stop()
            usleep(50_000)
            unlink(path)
            rmdir(directory)
        }

        /// A raw connection.
        func connect() throws -> Int32 {
            let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
            try #require(fd >= 0)
            try #require(try ControlSocket.connect(fd, to: path))
            var timeout = timeval(tv_sec: 5, tv_usec: 0)
            setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
            return fd
        }

        /// Everything the agent sends on `fd` until it closes the connection (or 5 s pass).
        func drain(_ fd: Int32) -> String {
            var out: [UInt8] = []
            var buffer = [UInt8](repeating: 0, count: 4096)
            for _ in 0..<1000 {
                let n = read(fd, &buffer, buffer.count)
                if n <= 0 { break }
                out += buffer[0..<n]
            }
            return String(decoding: out, as: UTF8.self)
        }
    }

    @Test func statusIsATypedVersionedAnswer() throws {
        let harness = try Harness()
        let answer = try ControlClient.ask(.status, at: harness.path)
        #expect(answer["version"] == .int(1) && answer["ok"] == .bool(true))
        #expect(answer["status"]?["state"]?.string == "connected")
        #expect(throws: ControlError.self) { try ControlClient.ask(.reconnect, at: harness.path) }
    }

    /// Another user's processes hold every slot with `agent status --watch`, as a member of the
    /// readers' group can: root is still answered, while that user's next connection is told busy.
    @Test(.enabled(if: geteuid() == 0, "only root can run watchers as another user"))
    func anotherUsersWatchersCannotKeepRootOut() throws {
        let harness = try Harness()
        // The test's directory and socket let anyone connect, as the group's would let its members.
        chmod(harness.directory, 0o711)
        chmod(harness.path, 0o666)
        let nobody = "65534"
        var watchers: [Process] = []
        defer {
            for watcher in watchers where watcher.isRunning { kill(watcher.processIdentifier, SIGKILL) }
            for watcher in watchers { watcher.waitUntilExit() }
        }
        for _ in 0..<40 {
            let watcher = Process()
            watcher.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
            watcher.arguments = ["--reuid=" + nobody, "--regid=" + nobody, "--clear-groups", "--",
                                 RoamingLab.builtAgent.path, "status", "--watch", "--control", harness.path]
            watcher.standardOutput = FileHandle.nullDevice
            watcher.standardError = FileHandle.nullDevice
            try watcher.run()
            watchers.append(watcher)
        }
        // Every slot is taken once 32 watches have been answered (the rest are told busy).
        for _ in 0..<200 where harness.calls < 32 { usleep(50_000) }
        try #require(harness.calls >= 32, "the watchers took \(harness.calls) slots")
        usleep(200_000)

        let busy = Process()
        busy.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
        busy.arguments = ["--reuid=" + nobody, "--regid=" + nobody, "--clear-groups", "--",
                          RoamingLab.builtAgent.path, "status", "--json", "--control", harness.path]
        let output = Pipe()
        busy.standardOutput = output
        busy.standardError = output
        try busy.run()
        busy.waitUntilExit()
        let said = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        #expect(busy.terminationStatus != 0 && said.contains("too many control connections"), "another user's next asker: \(said)")
        // Root makes room: a watcher goes.
        let answer = try ControlClient.ask(.status, at: harness.path)
        #expect(answer["ok"] == .bool(true), "root was answered \(answer.text)")
    }

    @Test func garbageHugeAndSilentAskersGetAnErrorAndHoldUpNobody() throws {
        let harness = try Harness()
        // One says nothing, one sends garbage, one a line longer than the limit.
        let silent = try harness.connect()
        defer { close(silent) }
        let garbage = try harness.connect()
        defer { close(garbage) }
        let junk: [UInt8] = [0x00, 0xFF, 0xC3] + Array("garbage\n".utf8)
        _ = write(garbage, junk, junk.count)
        let huge = try harness.connect()
        defer { close(huge) }
        let block = [UInt8](repeating: 0x41, count: 64 << 10)
        _ = write(huge, block, block.count)

        // Meanwhile everyone else is answered at once.
        let start = Instant.now()
        for _ in 0..<20 { #expect(try ControlClient.ask(.status, at: harness.path)["ok"] == .bool(true)) }
        #expect(Instant.now() - start < .seconds(1), "answered while the silent asker waits")

        #expect(harness.drain(garbage).contains("\"code\":\"unknown-command\""))
        #expect(harness.drain(huge).contains("\"code\":\"too-large\""))
        let waited = Instant.now()
        #expect(harness.drain(silent).contains("\"code\":\"timeout\""))
        #expect(Instant.now() - waited < ControlServer.requestTimeout + .seconds(1))
        #expect(harness.calls == 20, "no bad request reached the handler")
    }

    @Test func watchersGetEveryPublishedLineAndOneThatNeverReadsIsLetGo() throws {
        let harness = try Harness()
        let reader = try harness.connect()
        defer { close(reader) }
        let idle = try harness.connect()
        defer { close(idle) }
        let request = Array((ControlProtocol.request(.watch) + "\n").utf8)
        _ = write(reader, request, request.count)
        _ = write(idle, request, request.count)
        for _ in 0..<100 where !harness.server.watched { usleep(10_000) }
        usleep(50_000)
        let line = ControlProtocol.event("transition", [("n", .string(String(repeating: "x", count: 1000)))])
        // More than the backlog allows, in steps the reading watcher keeps up with: the watcher
        // that never reads is let go, the one reading gets every line.
        var got = 0
        var buffer = [UInt8](repeating: 0, count: 1 << 16)
        for step in 1...12 {
            for _ in 0..<50 { harness.server.publish(line) }
            let deadline = Instant.now() + .seconds(10)
            while got < 1 + step * 50, Instant.now() < deadline {
                let n = read(reader, &buffer, buffer.count)
                guard n > 0 else { break }
                got += buffer[0..<n].filter { $0 == 0x0A }.count
            }
        }
        #expect(got == 601, "the status line and every published one")
        // The idle watcher's connection was closed by the agent: what it can read ends.
        let text = harness.drain(idle)
        #expect(text.count < ControlServer.maxBacklog + 300_000 && text.hasPrefix("{\"version\":1,\"event\":\"status\""))
        #expect(harness.server.watched, "the reader still watches")
    }

    /// Who asks is what the kernel says (`SO_PEERCRED`): another user who can reach the socket may
    /// read the status but change nothing. Needs root to run the built agent as `nobody`.
    @Test(.enabled(if: NamespaceLab.isRoot, Comment(rawValue: NamespaceLab.skipReason)))
    func onlyRootChangesAnythingWhoeverReachesTheSocket() throws {
        let harness = try Harness(operatorGroup: Self.operators)
        let (readStatus, read) = try harness.ask(["status"], groups: [])
        #expect(readStatus == 0 && read.contains("state=connected"), "\(read)")
        for command in ["down", "up", "reconnect", "sleep", "wake"] {
            let (status, output) = try harness.ask([command], groups: [])
            #expect(status == 1 && output.contains("only root"), "\(command): \(output)")
        }
        #expect(harness.calls == 1, "only the status reached the agent")
        // Root reaches the handler (which, in this test, has nothing to do for it).
        #expect(throws: ControlError.self) { try ControlClient.ask(.down, at: harness.path) }
        #expect(harness.calls == 2)
    }

    /// A gid no account has, standing for the `roam` group: the kernel passes a process's groups
    /// as numbers.
    static let operators: gid_t = 47_113

    /// Members of the operators' group (a supplementary group, as `usermod -aG roam` makes them) may
    /// turn the tunnel on and off and reconnect, nothing else that changes the agent; with
    /// `operators: root` (no operators' group) they may not, and a reload can take it away.
    @Test(.enabled(if: NamespaceLab.isRoot, Comment(rawValue: NamespaceLab.skipReason)))
    func theOperatorsGroupConnectsDisconnectsAndReconnects() throws {
        let harness = try Harness(operatorGroup: Self.operators)
        for command in ["down", "up", "reconnect"] {
            let (_, output) = try harness.ask([command], groups: [Self.operators])
            #expect(output.contains("not in this test"), "\(command) reached the agent: \(output)")
        }
        #expect(harness.calls == 3)
        for command in ["sleep", "wake", "stop"] {
            let (status, output) = try harness.ask([command], groups: [Self.operators])
            #expect(status == 1 && output.contains("only root may ask '\(command)'"), "\(command): \(output)")
        }
        // Its primary group counts too.
        let (_, primary) = try harness.ask(["down"], groups: [], gid: Self.operators)
        #expect(primary.contains("not in this test"), "\(primary)")
        #expect(harness.calls == 4)
        // Turned off (`operators: root`, applied as a reload does): refused, and said why.
        harness.server.operatorGroup = nil
        let (status, output) = try harness.ask(["down"], groups: [Self.operators])
        #expect(status == 1 && output.contains("'operators: root'"), "\(output)")
        #expect(harness.calls == 4)
    }

    /// `use-profile` names a profile, never a path: anything else is refused before it is asked.
    @Test func aProfileIsNamedNeverAPath() {
        let line = ControlProtocol.request(.useProfile, profile: "home")
        #expect(line == #"{"version":1,"command":"use-profile","profile":"home"}"#)
        #expect(ControlProtocol.command(in: line) == .success(.useProfile))
        #expect(ControlProtocol.profile(in: line) == .success("home"))
        #expect(ControlProtocol.profile(in: #"{"command":"status"}"#) == .success(nil))
        for bad in [#""../../tmp/x""#, #""home.yaml""#, "7", #""""#] {
            guard case .failure(let failure) = ControlProtocol.profile(in: #"{"command":"use-profile","profile":\#(bad)}"#) else {
                Issue.record("\(bad) was taken as a profile")
                continue
            }
            #expect(failure.code == "bad-request")
        }
    }

    /// The restart after `use-profile` runs the agent's own command line with the chosen file.
    @Test func theRestartRunsTheChosenProfile() {
        let given = ["/usr/bin/agent", "up", "--config", "/etc/roam/work.yaml", "--control", "/run/roam/work.sock"]
        #expect(UpCommand.arguments(given, config: "/etc/roam/home.yaml")
            == ["/usr/bin/agent", "up", "--config", "/etc/roam/home.yaml", "--control", "/run/roam/work.sock"])
        #expect(UpCommand.arguments(["agent", "up", "--config=/etc/roam/work.yaml"], config: "/etc/roam/home.yaml")
            == ["agent", "up", "--config=/etc/roam/home.yaml"])
        #expect(UpCommand.arguments(given, config: nil) == given)
    }

    /// The decision alone, for every command: readers' commands for all, operators' commands for
    /// the group, the rest for root.
    @Test func whoMayAskWhat() {
        let member = PeerProcess(pid: 1, uid: 1000, gid: 1000, groups: [27, Self.operators])
        let other = PeerProcess(pid: 1, uid: 1001, gid: 1001, groups: [27])
        let root = PeerProcess(pid: 1, uid: 0, gid: 0, groups: [])
        for command in ControlCommand.allCases {
            #expect(ControlServer.refusal(of: command, by: root, operatorGroup: Self.operators) == nil)
            let memberMay = command.openToReaders || [.up, .down, .reconnect, .useProfile].contains(command)
            #expect((ControlServer.refusal(of: command, by: member, operatorGroup: Self.operators) == nil) == memberMay, "\(command)")
            #expect((ControlServer.refusal(of: command, by: member, operatorGroup: nil) == nil) == command.openToReaders, "\(command)")
            #expect((ControlServer.refusal(of: command, by: other, operatorGroup: Self.operators) == nil) == command.openToReaders, "\(command)")
        }
    }
}
