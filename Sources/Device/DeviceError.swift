import Topology
import Glibc
import Basics
public import Netlink

/// A failed system call or kernel request at the tunnel's edge (TUN device, UDP socket,
/// routes and rules): the operation, the errno, and what an operator can do about it.
public struct DeviceError: Error, Equatable, Sendable, CustomStringConvertible {
    /// What was being done, e.g. `open /dev/net/tun`.
    public var operation: String
    /// The errno; `EINVAL` also for input refused before it reached the kernel.
    public var code: Int32
    /// What to do about it, when that is known.
    public var help: String?
    /// The kernel's own reason, when it gave one (netlink's extended ack).
    public var kernelMessage: String?

    /// An error; without `help`, errors every operation shares (no privilege) still get one,
    /// unless the kernel said what it really was.
    public init(_ operation: String, _ code: Int32, help: String? = nil, kernelMessage: String? = nil) {
        self.operation = operation
        self.code = code
        self.kernelMessage = kernelMessage
        let noPrivilege = (code == EPERM || code == EACCES) && kernelMessage == nil
        self.help = help ?? (noPrivilege ? "run the agent as root or give it CAP_NET_ADMIN" : nil)
    }

    /// A refused netlink request (link, address, route or rule).
    public init(_ error: NetlinkError) { self.init(error.operation, error.code, kernelMessage: error.message) }

    /// One line: `open /dev/net/tun: No such file or directory (errno 2); run 'modprobe tun'...`.
    public var description: String {
        "\(operation): " + (kernelMessage.map { "\($0) (" } ?? "") + String(cString: strerror(code))
            + (kernelMessage == nil ? " (errno \(code))" : ", errno \(code))") + (help.map { "; \($0)" } ?? "")
    }
}

/// Runs a system call again while a signal interrupts it (`EINTR`). Returns nil when a
/// non-blocking descriptor has nothing to give or no room (`EAGAIN`); any other failure
/// throws with the operation and errno. Every kernel call in the data plane goes through here.
@inline(__always)
func nonBlocking<T: BinaryInteger>(_ operation: @autoclosure () -> String, _ call: () -> T) throws(DeviceError) -> T? {
    while true {
        let result = call()
        if result >= 0 { return result }
        let code = errno
        if code == EAGAIN || code == EWOULDBLOCK { return nil }
        if code != EINTR { throw DeviceError(operation(), code) }
    }
}

/// `nonBlocking` for calls that never block: `EAGAIN` is a failure like any other.
@inline(__always)
@discardableResult
func kernel<T: BinaryInteger>(_ operation: @autoclosure () -> String, _ call: () -> T) throws(DeviceError) -> T {
    guard let result = try nonBlocking(operation(), call) else { throw DeviceError(operation(), EAGAIN) }
    return result
}

/// Runs `body` inside `namespace`, or here when it is nil: descriptors it opens stay there.
func inNamespace<T>(_ namespace: NetworkNamespace?, _ body: () throws(DeviceError) -> T) throws(DeviceError) -> T {
    guard let namespace else { return try body() }
    let result: Result<T, DeviceError>
    do {
        result = try namespace.run { () throws(NetlinkError) -> Result<T, DeviceError> in
            do throws(DeviceError) { return .success(try body()) } catch { return .failure(error) }
        }
    } catch {
        throw DeviceError(error)
    }
    return try result.get()
}

/// A valid interface name is 1 to 15 bytes (`IFNAMSIZ` - 1) of no '/', ':', '%' or white space.
func checkInterfaceName(_ name: String, _ operation: @autoclosure () -> String) throws(DeviceError) {
    let valid = (1...15).contains(name.utf8.count) && name != "." && name != ".."
        && !name.contains { $0 == "/" || $0 == ":" || $0 == "%" || $0.isWhitespace }
    guard valid else {
        throw DeviceError(operation(), EINVAL, help: "an interface name is 1 to 15 characters without '/', ':', '%' or spaces")
    }
}

/// Ties socket `fd` to one uplink: only through `device` (`SO_BINDTODEVICE`), and with `mark`
/// (`SO_MARK`: the routes and the lockdown know the agent's own traffic by it), each when given.
func pin(_ fd: Int32, device: String?, mark: UInt32?, _ what: String) throws(DeviceError) {
    if let device {
        do {
            try kernel("bind \(what)") { setsockopt(fd, SOL_SOCKET, SO_BINDTODEVICE, device, socklen_t(device.utf8.count)) }
        } catch where error.code == ENODEV {
            throw DeviceError(error.operation, error.code, help: "there is no interface named '\(device)'")
        }
    }
    if var mark = mark.map({ Int32(bitPattern: $0) }) {
        try kernel("set mark on \(what)") { setsockopt(fd, SOL_SOCKET, SO_MARK, &mark, socklen_t(MemoryLayout<Int32>.size)) }
    }
}

/// What a descriptor is waited for.
public enum Readiness: Sendable {
    /// Input to read (an error or a hang-up counts: the next read reports it).
    case readable
    /// Room to write (an error or a hang-up counts: the next write reports it).
    case writable
}

/// Waits until one of `descriptors` is ready for what it is waited for and returns those that
/// are; empty when `timeout` passed first. A nil `timeout` waits as long as it takes, zero only
/// looks.
public func pollReady(_ descriptors: [(fd: Int32, for: Readiness)], timeout: Duration?) throws(DeviceError) -> [Int32] {
    var fds = descriptors.map { pollfd(fd: $0.fd, events: Int16($0.for == .readable ? POLLIN : POLLOUT), revents: 0) }
    let deadline = timeout.map { ContinuousClock.now + $0 }
    // Recomputed on every retry, so signals cannot stretch the wait.
    let ready = try kernel("poll \(descriptors.map(\.fd))") {
        poll(&fds, nfds_t(fds.count), deadline.map { milliseconds(until: $0) } ?? -1)
    }
    guard ready > 0 else { return [] }
    if let closed = fds.first(where: { $0.revents & Int16(POLLNVAL) != 0 }) {
        throw DeviceError("poll descriptor \(closed.fd)", EBADF)
    }
    return fds.filter { $0.revents != 0 }.map(\.fd)
}

/// `pollReady` for input only.
public func pollReadable(_ descriptors: [Int32], timeout: Duration?) throws(DeviceError) -> [Int32] {
    try pollReady(descriptors.map { ($0, .readable) }, timeout: timeout)
}

/// Milliseconds left until `deadline` for poll: rounded up, so a short wait never spins.
private func milliseconds(until deadline: ContinuousClock.Instant) -> Int32 {
    let left = deadline - ContinuousClock.now
    guard left > .zero else { return 0 }
    let (seconds, attoseconds) = left.components
    return Int32(clamping: seconds * 1000 + (attoseconds + 999_999_999_999_999) / 1_000_000_000_000_000)
}

/// Tries `once` (a non-blocking read or receive), and while it finds nothing, waits for
/// `descriptor` to become readable until `timeout` passes (nil: no limit, zero: no wait).
func waitingForInput<T>(on descriptor: Int32, timeout: Duration?, _ once: () throws(DeviceError) -> T?)
    throws(DeviceError) -> T?
{
    if let result = try once() { return result }
    guard timeout != .zero else { return nil }
    let deadline = timeout.map { ContinuousClock.now + $0 }
    while true {
        let left = deadline.map { $0 - ContinuousClock.now }
        if let left, left <= .zero { return nil }
        _ = try pollReadable([descriptor], timeout: left)
        if let result = try once() { return result }
    }
}
