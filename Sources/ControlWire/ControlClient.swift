import Glibc
import Basics
import Synchronization

/// The asking end: sends one request line and reads the answer, or a watch's lines.
public enum ControlClient {
    /// Sends `command` to the agent at `path` and returns its answer; an answer that is an
    /// error becomes an `ControlError` with its message.
    public static func ask(_ command: ControlCommand, at path: String, pid: Int32? = nil, started: UInt64? = nil,
                           profile: String? = nil) throws -> JSON {
        let fd = try connect(path)
        defer { close(fd) }
        var timeout = timeval(tv_sec: 10, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        // An agent with no room answers and closes at once, maybe before the request is
        // written: its answer says why, better than the failed write would.
        let unsent = send(command, pid: pid, started: started, profile: profile, on: fd)
        var reader = LineReader(fd: fd)
        guard let line = reader.next() else { throw unsent ?? ControlError("the agent at \(path) gave no answer") }
        return try answer(line)
    }

    /// Streams a watch: `each` gets the status and then every event; returns when the agent
    /// stops or `each` returns false.
    public static func watch(at path: String, _ each: (JSON) throws -> Bool) throws {
        let fd = try connect(path)
        defer { close(fd) }
        let unsent = send(.watch, on: fd)
        var reader = LineReader(fd: fd)
        var answered = false
        while let line = reader.next() {
            answered = true
            guard try each(try answer(line)) else { return }
        }
        if !answered, let unsent { throw unsent }
    }

    /// The parsed line; an error answer is thrown.
    private static func answer(_ line: String) throws -> JSON {
        let message: JSON
        do { message = try JSON.parse(line) } catch { throw ControlError("the agent's answer is not JSON: \(line)") }
        if message["ok"]?.bool == false {
            throw ControlError(message["error"]?["message"]?.string ?? "the agent refused: \(line)")
        }
        return message
    }

    /// Sends the request; nil when it went, else why not. Never SIGPIPE: an agent that closed
    /// the connection is an error to report, not a reason to die without a word.
    private static func send(_ command: ControlCommand, pid: Int32? = nil, started: UInt64? = nil, profile: String? = nil,
                             on fd: Int32) -> ControlError? {
        let bytes = Array((ControlProtocol.request(command, pid: pid, started: started, profile: profile) + "\n").utf8)
        let sent = bytes.withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        return sent == bytes.count ? nil : ControlError("cannot send to the agent: \(String(cString: strerror(errno)))")
    }

    private static func connect(_ path: String) throws -> Int32 {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw ControlError("cannot create a socket: \(String(cString: strerror(errno)))") }
        guard try ControlSocket.connect(fd, to: path) else {
            let error = errno
            close(fd)
            if error == ENOENT || error == ECONNREFUSED {
                throw ControlError("the agent is not running (no control socket at \(path)); start it with `agent up --config FILE`")
            }
            throw ControlError("cannot reach the agent at \(path): \(String(cString: strerror(error)))"
                + (error == EACCES ? " (the control socket is root's and the '\(ControlSocket.readerGroup)' group's)" : ""))
        }
        return fd
    }

    /// Lines from a socket, at most 1 MiB each.
    private struct LineReader {
        let fd: Int32
        var buffer: [UInt8] = []

        mutating func next() -> String? {
            var chunk = [UInt8](repeating: 0, count: 16 << 10)
            while true {
                if let newline = buffer.firstIndex(of: 0x0A) {
                    let line = String(decoding: buffer[..<newline], as: UTF8.self)
                    buffer.removeSubrange(...newline)
                    return line
                }
                guard buffer.count < 1 << 20 else { return nil }
                let n = read(fd, &chunk, chunk.count)
                if n < 0, errno == EINTR { continue }
                guard n > 0 else {
                    defer { buffer = [] }
                    return buffer.isEmpty ? nil : String(decoding: buffer, as: UTF8.self)
                }
                buffer += chunk[0..<n]
            }
        }
    }
}
