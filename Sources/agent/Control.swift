import ArgumentParser
import Glibc
import PathMonitor
import Reconnector

/// What an operator may ask the running client, over its control socket.
enum ControlRequest: String, CaseIterable {
    /// The state, path, counters and last transition, as logfmt lines.
    case status
    /// The same as one JSON object.
    case statusJSON = "status-json"
    /// Drop the session and handshake afresh (bypasses the reconnect budget).
    case reconnect
    /// Treat the machine as about to suspend.
    case sleep
    /// Treat the machine as resumed.
    case wake
    /// (A server) tell every session to move to another server, then stop.
    case drain
}

/// The client's control socket: a Unix stream socket only root may use (0600 in a 0700
/// directory). One request line in, one answer out, then the connection closes.
final class ControlSocket: @unchecked Sendable {  // served by one thread only: the client's deciding one or the server's control one
    static let defaultPath = "/run/roam/agent.sock"
    let path: String
    let fileDescriptor: Int32

    init(path: String) throws {
        let directory = path.parentDirectory
        if !directory.isEmpty { mkdir(directory, 0o700) }
        // A socket file that still answers belongs to a running agent: taking it over would
        // leave that agent unreachable. One that does not answer is left over from a crash.
        if Self.answers(path) {
            throw AgentError("an agent is running already (its control socket \(path) answers): "
                + "stop it first, or give this one another --control and tunnel name")
        }
        unlink(path)
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
        guard fd >= 0 else { throw AgentError("cannot create the control socket: \(String(cString: strerror(errno)))") }
        var sa = try Self.address(path)
        let previous = umask(0o177)
        let bound = withUnsafePointer(to: &sa) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) } }
        umask(previous)
        guard bound == 0, listen(fd, 8) == 0 else {
            let reason = String(cString: strerror(errno))
            close(fd)
            throw AgentError("cannot listen on \(path): \(reason)")
        }
        self.path = path
        fileDescriptor = fd
    }

    deinit {
        close(fileDescriptor)
        remove()
    }

    /// Takes the socket's name away, so nobody reaches a stopping agent (the descriptor stays
    /// open until the owner lets go of it).
    func remove() { unlink(path) }

    /// Answers every waiting connection with `answer(request)`; bounded, never blocks long.
    func serve(_ answer: (ControlRequest?) -> String) {
        for _ in 0..<16 {
            let client = accept(fileDescriptor, nil, nil)
            guard client >= 0 else { return }
            var timeout = timeval(tv_sec: 1, tv_usec: 0)
            setsockopt(client, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
            setsockopt(client, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
            var buffer = [UInt8](repeating: 0, count: 256)
            let n = read(client, &buffer, buffer.count)
            let line = n > 0 ? String(decoding: buffer[0..<n], as: UTF8.self).trimmed : ""
            let reply = Array((answer(ControlRequest(rawValue: line)) + "\n").utf8)
            // The asker may be gone already: no SIGPIPE for that.
            _ = send(client, reply, reply.count, Int32(MSG_NOSIGNAL))
            close(client)
        }
    }

    /// Sends `request` to the agent listening at `path` and returns its answer.
    static func ask(_ request: ControlRequest, at path: String) throws -> String {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw AgentError("cannot create a socket: \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        guard try connect(fd, to: path) else {
            if errno == ENOENT || errno == ECONNREFUSED {
                throw AgentError("the agent is not running (no control socket at \(path)); start it with `agent up --config FILE`")
            }
            throw AgentError("cannot reach the agent at \(path): \(String(cString: strerror(errno)))"
                + (errno == EACCES ? " (the control socket is root's)" : ""))
        }
        var timeout = timeval(tv_sec: 5, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        let bytes = Array((request.rawValue + "\n").utf8)
        _ = write(fd, bytes, bytes.count)
        var answer = [UInt8]()
        var buffer = [UInt8](repeating: 0, count: 4096)
        for _ in 0..<256 {
            let n = read(fd, &buffer, buffer.count)
            if n <= 0 { break }
            answer += buffer[0..<n]
        }
        return String(decoding: answer, as: UTF8.self).trimmed
    }

    /// Whether something listens at `path`. Non-blocking: a listener too busy to accept at once
    /// (`EAGAIN`, its backlog full) is still there.
    private static func answers(_ path: String) -> Bool {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        guard let connected = try? connect(fd, to: path) else { return false }
        return connected || errno == EAGAIN
    }

    /// Connects `fd` to the socket at `path`; false (with `errno` set) when that failed.
    private static func connect(_ fd: Int32, to path: String) throws -> Bool {
        var sa = try address(path)
        return withUnsafePointer(to: &sa) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        } == 0
    }

    private static func address(_ path: String) throws -> sockaddr_un {
        var sa = sockaddr_un()
        sa.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        guard bytes.count < MemoryLayout.size(ofValue: sa.sun_path) else { throw AgentError("the control socket path is too long: \(path)") }
        withUnsafeMutableBytes(of: &sa.sun_path) { raw in for (i, b) in bytes.enumerated() { raw[i] = b } }
        return sa
    }
}

/// What the control commands share: where the agent's control socket is.
struct ControlOptions: ParsableArguments {
    @Option(help: "The agent's control socket.")
    var control: String = ControlSocket.defaultPath
}

/// `agent status`.
struct StatusCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "status", abstract: "Show the running client's state, path, counters and last transition.")
    @OptionGroup var options: ControlOptions
    @Flag(help: "Print one JSON object.")
    var json = false
    func run() throws { print(try ControlSocket.ask(json ? .statusJSON : .status, at: options.control)) }
}

/// Sends one request to the running client and prints its answer.
private func ask(_ request: ControlRequest, _ options: ControlOptions) throws {
    print(try ControlSocket.ask(request, at: options.control))
}

/// `agent reconnect`.
struct ReconnectCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "reconnect", abstract: "Ask the running client for a fresh handshake on the best path.")
    @OptionGroup var options: ControlOptions
    func run() throws { try ask(.reconnect, options) }
}

/// `agent sleep`.
struct SleepCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "sleep", abstract: "Tell the running client the machine is about to suspend (as SIGTSTP does).")
    @OptionGroup var options: ControlOptions
    func run() throws { try ask(.sleep, options) }
}

/// `agent wake`.
struct WakeCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "wake", abstract: "Tell the running client the machine resumed (as SIGCONT does).")
    @OptionGroup var options: ControlOptions
    func run() throws { try ask(.wake, options) }
}
