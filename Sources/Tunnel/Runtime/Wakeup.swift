import Glibc
public import Device

/// A pipe a loop polls beside its socket, so another thread can wake it at once (a rebind, a
/// stop) without the loop waking up on a timer.
public final class Wakeup: Sendable {
    public let readEnd: Int32
    private let writeEnd: Int32

    public init() throws(DeviceError) {
        var fds: [Int32] = [0, 0]
        guard pipe(&fds) == 0 else { throw DeviceError("create wake-up pipe", errno) }
        for fd in fds {
            _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
            _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
        }
        readEnd = fds[0]
        writeEnd = fds[1]
    }

    deinit {
        close(readEnd)
        close(writeEnd)
    }

    public func signal() {
        var byte: UInt8 = 1
        _ = write(writeEnd, &byte, 1)
    }

    public func drain() {
        var bytes = [UInt8](repeating: 0, count: 64)
        while read(readEnd, &bytes, bytes.count) > 0 {}
    }
}
