public import ControlWire
import Glibc
import Basics
import Synchronization
import Device

/// Serves a control socket on a thread of its own, so that no asker (one that sends garbage, a
/// huge line or nothing at all, or reads its answers slowly) ever holds up the agent: requests
/// are read with a deadline and a size limit, each valid one is handed to `handle` as a `Call`,
/// and whoever decides answers it with `reply` when it gets to it. Watchers get every
/// `publish`ed line until they hang up; one that falls too far behind is let go.
public final class ControlServer: Sendable {
    /// One request, for whoever decides: answered with `reply`, from any thread.
    public struct Call: Sendable {
        fileprivate let id: Int
        fileprivate let server: ControlServer
        public let command: ControlCommand
        /// The process that asked (`SO_PEERCRED`), as the kernel saw it connect.
        public let peer: PeerProcess
        /// The process the request names besides (`"pid"`), if any, and when it started as the
        /// asker saw it (`"started"`).
        public let target: Int32?
        public let targetStarted: UInt64?
        /// The profile the request names (`"profile"`), if any.
        public let profile: String?

        /// Answers with `line`; with `watch`, published lines follow on the same connection.
        public func reply(_ line: String, watch: Bool = false) { server.outgoing.post(.reply(id, line, watch: watch)) }
    }

    private enum Outgoing: Sendable {
        case reply(Int, String, watch: Bool)
        case publish(String)
        case stop
    }

    /// A request must arrive whole within this; an answer must come within `answerTimeout`.
    public static let requestTimeout: Duration = .seconds(2)
    public static let answerTimeout: Duration = .seconds(10)
    /// Connections served at once; more are told `busy`, but root never is (`room(for:among:)`).
    public static let maxConnections = 32

    /// The connection to close so that one from `uid` is served when every slot is taken: for
    /// root, the oldest of someone else's, a watcher first. A member of the agent's group who
    /// holds every slot with watchers must not keep root's `down` or `stop` from being heard.
    /// Nil for anyone else (they are told `busy`), or when root holds every slot.
    static func room(for uid: uid_t, among connections: [(id: Int, uid: uid_t, watching: Bool)]) -> Int? {
        guard uid == 0 else { return nil }
        let others = connections.filter { $0.uid != 0 }.sorted { $0.id < $1.id }
        return (others.first { $0.watching } ?? others.first)?.id
    }
    /// Bytes a watcher may leave unread before it is let go.
    public static let maxBacklog = 256 << 10

    private let socket: ControlSocket
    /// The group whose members may ask what `ControlCommand.forOperators` says (a reload may
    /// change it); nil: only root.
    private let operators: Mutex<UInt32?>
    private let outgoing: Mailbox<Outgoing>
    private let handle: @Sendable (Call) -> Void
    private let watchers = Atomic<Int>(0)
    /// The serving thread runs (started and not yet ended).
    private let serving = Atomic<Bool>(false)

    /// Whether anyone watches: a status for them is worth making only then.
    public var watched: Bool { watchers.load(ordering: .relaxed) > 0 }

    public init(socket: ControlSocket, operatorGroup: UInt32? = nil, handle: @escaping @Sendable (Call) -> Void) throws {
        self.socket = socket
        self.handle = handle
        operators = Mutex(operatorGroup)
        outgoing = try Mailbox()
    }

    /// The group whose members may turn the tunnel on and off from now on; nil: only root.
    public var operatorGroup: UInt32? {
        get { operators.withLock { $0 } }
        set { operators.withLock { $0 = newValue } }
    }

    /// Why `peer` may not ask `command`, or nil when it may: root (and the agent's own user) may
    /// ask anything, whoever reached the socket may ask what is open to readers, and a member of
    /// `operatorGroup` (its primary group or a supplementary one) what is for operators.
    static func refusal(of command: ControlCommand, by peer: PeerProcess, operatorGroup: UInt32?) -> ControlFailure? {
        if command.openToReaders || peer.uid == 0 || peer.uid == geteuid() { return nil }
        guard command.forOperators else {
            return ControlFailure(code: "not-permitted", message: "only root may ask '\(command.rawValue)'")
        }
        guard let group = operatorGroup else {
            return ControlFailure(code: "not-permitted", message: "only root may ask '\(command.rawValue)' of this agent (its configuration says 'operators: root')")
        }
        if peer.gid == group || peer.groups.contains(group) { return nil }
        return ControlFailure(code: "not-permitted", message: "only root and the operators' group may ask '\(command.rawValue)'")
    }

    public var path: String { socket.path }

    /// Starts the serving thread.
    public func start() throws {
        serving.store(true, ordering: .releasing)
        do {
            try OSThread.detach { [self] in
                var thread = ServingThread(server: self)
                thread.run()
                serving.store(false, ordering: .releasing)
            }
        } catch {
            serving.store(false, ordering: .releasing)
            throw error
        }
    }

    /// Sends `line` to every watcher.
    public func publish(_ line: String) { outgoing.post(.publish(line)) }

    /// Takes the socket's name away and ends every connection after a last try to send what is queued.
    /// Waits (at most a second) for the serving thread to hand what was published to the
    /// watchers: the process may end right after, and a watcher must hear `stopped`.
    public func stop() {
        socket.remove()
        outgoing.post(.stop)
        for _ in 0..<200 where serving.load(ordering: .acquiring) { usleep(5_000) }
    }

    private struct Connection {
        enum Phase { case reading, answering, watching, closing }
        let fd: Int32
        let uid: uid_t
        let peer: PeerProcess
        var phase = Phase.reading
        var deadline: Instant
        var input: [UInt8] = []
        var output: [UInt8] = []
    }

    /// The serving thread's state.
    private struct ServingThread {
        let server: ControlServer
        var connections: [Int: Connection] = [:]
        var nextID = 1
        var running = true

        mutating func run() {
            while running {
                let now = Instant.now()
                var fds = [pollfd(fd: server.outgoing.fileDescriptor, events: Int16(POLLIN), revents: 0)]
                if connections.count < ControlServer.maxConnections + 1 {
                    fds.append(pollfd(fd: server.socket.fileDescriptor, events: Int16(POLLIN), revents: 0))
                }
                let ids = Array(connections.keys)
                for id in ids {
                    let c = connections[id]!
                    var events: Int32 = 0
                    if c.phase == .reading || c.phase == .watching { events |= Int32(POLLIN) }
                    if !c.output.isEmpty { events |= Int32(POLLOUT) }
                    fds.append(pollfd(fd: c.fd, events: Int16(events), revents: 0))
                }
                let deadline = connections.values.filter { $0.phase == .reading || $0.phase == .answering }.map(\.deadline).min()
                let timeout = deadline.map { Int32(clamping: max(0, ($0 - now).nanoseconds / 1_000_000 + 1)) } ?? -1
                let ready = poll(&fds, nfds_t(fds.count), timeout)
                if ready < 0 && errno != EINTR { usleep(10_000) }
                for entry in fds where entry.revents != 0 {
                    if entry.fd == server.outgoing.fileDescriptor {
                        for item in server.outgoing.take() { deliver(item) }
                    } else if entry.fd == server.socket.fileDescriptor {
                        accept()
                    } else if let id = connections.first(where: { $0.value.fd == entry.fd })?.key {
                        serve(id, revents: entry.revents)
                    }
                }
                expire(now: Instant.now())
            }
            for id in Array(connections.keys) { close(id) }
        }

        mutating func deliver(_ item: Outgoing) {
            switch item {
            case .reply(let id, let line, let watch):
                guard var c = connections[id], c.phase == .answering else { return }
                c.output += Array((line + "\n").utf8)
                c.phase = watch ? .watching : .closing
                connections[id] = c
                if watch { server.watchers.add(1, ordering: .relaxed) }
                flush(id)
            case .publish(let line):
                let bytes = Array((line + "\n").utf8)
                for (id, var c) in connections where c.phase == .watching {
                    c.output += bytes
                    connections[id] = c
                    if c.output.count > ControlServer.maxBacklog { close(id) } else { flush(id) }
                }
            case .stop:
                for id in Array(connections.keys) { flush(id) }
                running = false
            }
        }

        mutating func accept() {
            for _ in 0..<16 {
                let fd = Glibc.accept(server.socket.fileDescriptor, nil, nil)
                guard fd >= 0 else { return }
                _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
                _ = fcntl(fd, F_SETFD, FD_CLOEXEC)  // (the agent starts no processes while it runs)
                guard let peer = Self.peer(fd) else {
                    Glibc.close(fd)
                    continue
                }
                let id = nextID
                nextID += 1
                connections[id] = Connection(fd: fd, uid: peer.uid, peer: peer, deadline: Instant.now() + ControlServer.requestTimeout)
                if connections.count > ControlServer.maxConnections {
                    let others = connections.filter { $0.key != id }.map { (id: $0.key, uid: $0.value.uid, watching: $0.value.phase == .watching) }
                    if let room = ControlServer.room(for: peer.uid, among: others) {
                        close(room)
                    } else {
                        fail(id, ControlFailure(code: "busy", message: "too many control connections at once; try again"))
                    }
                }
            }
        }

        /// The process at the other end (`SO_PEERCRED`), as the kernel saw it connect.
        static func peer(_ fd: Int32) -> PeerProcess? {
            // struct ucred (pid, uid, gid), declared by glibc only for _GNU_SOURCE; its layout is the kernel's ABI.
            var credentials: (pid: Int32, uid: UInt32, gid: UInt32) = (0, 0, 0)
            var length = socklen_t(MemoryLayout.size(ofValue: credentials))
            guard getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &credentials, &length) == 0, length == 12 else { return nil }
            return PeerProcess(pid: credentials.pid, uid: credentials.uid, gid: credentials.gid, groups: groups(fd))
        }

        /// The peer's supplementary groups as it connected (`SO_PEERGROUPS`, Linux 4.13); none
        /// when the kernel cannot say, which refuses what only they would allow.
        static func groups(_ fd: Int32) -> [gid_t] {
            var groups = [gid_t](repeating: 0, count: 64)
            for _ in 0..<2 {
                var length = socklen_t(groups.count * MemoryLayout<gid_t>.size)
                if getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, &groups, &length) == 0 {
                    return Array(groups.prefix(Int(length) / MemoryLayout<gid_t>.size))
                }
                // ERANGE: the length says how much room the list needs.
                guard errno == ERANGE, Int(length) / MemoryLayout<gid_t>.size > groups.count else { return [] }
                groups = [gid_t](repeating: 0, count: Int(length) / MemoryLayout<gid_t>.size)
            }
            return []
        }

        mutating func serve(_ id: Int, revents: Int16) {
            if revents & Int16(POLLNVAL | POLLERR) != 0 { return close(id) }
            if revents & Int16(POLLOUT) != 0 { flush(id) }
            guard var c = connections[id] else { return }
            if revents & Int16(POLLIN | POLLHUP) != 0 {
                var buffer = [UInt8](repeating: 0, count: 4096)
                let n = read(c.fd, &buffer, buffer.count)
                if n < 0, errno == EAGAIN || errno == EINTR { return }
                switch c.phase {
                case .reading:
                    if n > 0 { c.input += buffer[0..<n] }
                    connections[id] = c
                    if let newline = c.input.firstIndex(of: 0x0A) {
                        request(id, String(decoding: c.input[..<newline], as: UTF8.self))
                    } else if c.input.count > ControlProtocol.maxRequestBytes {
                        fail(id, ControlFailure(code: "too-large", message: "a request is at most \(ControlProtocol.maxRequestBytes) bytes"))
                    } else if n <= 0 {
                        // The asker finished writing without a newline: what it sent is the request.
                        if c.input.isEmpty { close(id) } else { request(id, String(decoding: c.input, as: UTF8.self)) }
                    }
                case .watching:
                    if n <= 0 { close(id) }  // a watcher that hangs up is done; anything it sends is ignored
                default:
                    if n <= 0 { close(id) }
                }
            }
        }

        mutating func request(_ id: Int, _ line: String) {
            guard var c = connections[id] else { return }
            switch ControlProtocol.command(in: line) {
            case .failure(let failure):
                fail(id, failure)
            case .success(let command):
                if let refusal = ControlServer.refusal(of: command, by: c.peer, operatorGroup: server.operatorGroup) {
                    return fail(id, refusal)
                }
                let target: Int32?
                switch ControlProtocol.target(in: line) {
                case .success(let pid): target = pid
                case .failure(let failure): return fail(id, failure)
                }
                let profile: String?
                switch ControlProtocol.profile(in: line) {
                case .success(let name): profile = name
                case .failure(let failure): return fail(id, failure)
                }
                c.phase = .answering
                c.deadline = Instant.now() + ControlServer.answerTimeout
                c.input = []
                connections[id] = c
                server.handle(Call(id: id, server: server, command: command, peer: c.peer, target: target,
                                   targetStarted: ControlProtocol.targetStarted(in: line), profile: profile))
            }
        }

        mutating func fail(_ id: Int, _ failure: ControlFailure) {
            guard var c = connections[id] else { return }
            c.output += Array((failure.line + "\n").utf8)
            c.phase = .closing
            connections[id] = c
            flush(id)
        }

        /// Writes what the connection has queued, as far as its socket takes it without waiting.
        mutating func flush(_ id: Int) {
            guard var c = connections[id] else { return }
            while !c.output.isEmpty {
                let n = c.output.withUnsafeBytes { send(c.fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
                if n < 0 {
                    if errno == EINTR { continue }
                    if errno == EAGAIN { break }
                    return close(id)
                }
                c.output.removeFirst(n)
            }
            connections[id] = c
            if c.output.isEmpty, c.phase == .closing { close(id) }
        }

        mutating func expire(now: Instant) {
            for (id, c) in connections where c.deadline <= now {
                switch c.phase {
                case .reading: fail(id, ControlFailure(code: "timeout", message: "no whole request line within \(ControlServer.requestTimeout.short)"))
                case .answering: fail(id, ControlFailure(code: "no-answer", message: "the agent did not answer in time"))
                default: break
                }
            }
        }

        mutating func close(_ id: Int) {
            guard let c = connections.removeValue(forKey: id) else { return }
            if c.phase == .watching { server.watchers.subtract(1, ordering: .relaxed) }
            Glibc.close(c.fd)
        }
    }
}
