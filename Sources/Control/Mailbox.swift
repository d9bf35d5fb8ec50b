import ControlWire
import Glibc
import Synchronization

/// The only thing the client's other threads share with its deciding thread: they post events
/// (signals, the data plane's notices, lookups that finished) from anywhere, and a byte on a pipe
/// wakes the deciding thread's poll, which then takes them all, in order.
public final class Mailbox<Event: Sendable>: Sendable {
    private let queue = Mutex<[Event]>([])
    /// Readable when events wait: for the deciding thread's poll.
    public let fileDescriptor: Int32
    private let writeEnd: Int32

    public init() throws {
        var fds: [Int32] = [0, 0]
        guard pipe(&fds) == 0 else { throw ControlError("cannot create a pipe: \(String(cString: strerror(errno)))") }
        for fd in fds {
            _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
            _ = fcntl(fd, F_SETFD, FD_CLOEXEC)  // not inherited by a restart
        }
        fileDescriptor = fds[0]
        writeEnd = fds[1]
    }

    deinit {
        close(fileDescriptor)
        close(writeEnd)
    }

    /// Hands `event` to the deciding thread (from any thread, the signal thread included).
    public func post(_ event: Event) {
        queue.withLock { $0.append(event) }
        var byte: UInt8 = 1
        _ = write(writeEnd, &byte, 1)  // a full pipe already says "wake up"
    }

    /// Every event posted so far, oldest first.
    public func take() -> [Event] {
        var bytes = [UInt8](repeating: 0, count: 64)
        while read(fileDescriptor, &bytes, bytes.count) > 0 {}
        return queue.withLock { list in
            defer { list.removeAll() }
            return list
        }
    }
}
