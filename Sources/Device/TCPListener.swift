import Topology
import Glibc
public import Basics
public import Netlink

/// A listening TCP socket on a local address, for the small answers the daemons give over
/// HTTP (metrics); the one owner of its descriptor.
public final class TCPListener: Sendable {
    public let fileDescriptor: Int32
    /// The address it listens on, with the port the kernel chose when asked for port 0.
    public let local: SocketAddress

    /// `namespace`: the network namespace the socket lives in (this thread's when nil).
    public init(bindingTo local: SocketAddress, backlog: Int32 = 16, namespace: NetworkNamespace? = nil) throws(DeviceError) {
        let what = "TCP socket on \(local)"
        let v4 = local.ip.family == .v4
        let fd = try inNamespace(namespace) { () throws(DeviceError) in
            try kernel("open \(what)") {
                socket(v4 ? AF_INET : AF_INET6, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
            }
        }
        do throws(DeviceError) {
            var one: Int32 = 1
            let size = socklen_t(MemoryLayout<Int32>.size)
            try kernel("reuse the address of \(what)") { setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, size) }
            if !v4 { try kernel("set IPV6_V6ONLY on \(what)") { setsockopt(fd, Int32(IPPROTO_IPV6), IPV6_V6ONLY, &one, size) } }
            var storage = sockaddr_in6()
            let length = local.write(to: &storage)
            do {
                try kernel("bind \(what)") { withUnsafePointer(to: &storage) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) } } }
            } catch where error.code == EADDRNOTAVAIL {
                throw DeviceError(error.operation, error.code, help: "\(local.ip) is not an address of this host")
            } catch where error.code == EADDRINUSE {
                throw DeviceError(error.operation, error.code, help: "another program listens on \(local)")
            }
            try kernel("listen on \(what)") { listen(fd, backlog) }
            var bound = sockaddr_in6()
            var boundLength = socklen_t(MemoryLayout<sockaddr_in6>.size)
            try kernel("read the address of \(what)") {
                withUnsafeMutablePointer(to: &bound) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &boundLength) } }
            }
            self.local = SocketAddress(reading: &bound, length: boundLength) ?? local
        } catch {
            close(fd)
            throw error
        }
        fileDescriptor = fd
    }

    deinit { close(fileDescriptor) }

    /// The next connection, waiting for one at most `timeout` (nil: as long as it takes); nil
    /// when none came.
    public func accept(timeout: Duration?) throws(DeviceError) -> TCPConnection? {
        try waitingForInput(on: fileDescriptor, timeout: timeout) { () throws(DeviceError) -> TCPConnection? in
            var peer = sockaddr_in6()
            var length = socklen_t(MemoryLayout<sockaddr_in6>.size)
            let fd = try nonBlocking("accept on TCP socket \(local)") {
                withUnsafeMutablePointer(to: &peer) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.accept(fileDescriptor, $0, &length) } }
            }
            guard let fd else { return nil }
            // Accepted sockets inherit neither flag.
            _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
            _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
            return TCPConnection(fileDescriptor: fd, peer: SocketAddress(reading: &peer, length: length))
        }
    }
}

/// One accepted TCP connection, non-blocking, read and written against deadlines; the one
/// owner of its descriptor.
public final class TCPConnection: Sendable {
    public let fileDescriptor: Int32
    public let peer: SocketAddress?

    init(fileDescriptor: Int32, peer: SocketAddress?) {
        self.fileDescriptor = fileDescriptor
        self.peer = peer
    }

    deinit { close(fileDescriptor) }

    /// The address and port this end of the connection has.
    public var local: SocketAddress? {
        var storage = sockaddr_in6()
        var length = socklen_t(MemoryLayout<sockaddr_in6>.size)
        let got = withUnsafeMutablePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fileDescriptor, $0, &length) }
        }
        return got == 0 ? SocketAddress(reading: &storage, length: length) : nil
    }

    /// Connects to `peer` from `source` (any address of its family when nil), through `device`
    /// only (`SO_BINDTODEVICE`) and with `mark` (`SO_MARK`) when given, waiting until `deadline`.
    public static func connect(to peer: SocketAddress, from source: IPAddress? = nil, device: String? = nil, mark: UInt32? = nil,
                               namespace: NetworkNamespace? = nil, deadline: ContinuousClock.Instant) throws(DeviceError) -> TCPConnection {
        let what = "TCP connection to \(peer)\(device.map { " via \($0)" } ?? "")"
        if let device { try checkInterfaceName(device, "open \(what)") }
        let v4 = peer.ip.family == .v4
        let fd = try inNamespace(namespace) { () throws(DeviceError) in
            try kernel("open \(what)") {
                socket(v4 ? AF_INET : AF_INET6, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
            }
        }
        let connection = TCPConnection(fileDescriptor: fd, peer: peer)
        try pin(fd, device: device, mark: mark, what)
        var storage = sockaddr_in6()
        if let source, source.family == peer.ip.family {
            let length = SocketAddress(source, port: 0).write(to: &storage)
            try kernel("bind \(what) to \(source)") {
                withUnsafePointer(to: &storage) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) } }
            }
        }
        let length = peer.write(to: &storage)
        let started = withUnsafePointer(to: &storage) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, length) } }
        if started != 0 && errno != EINPROGRESS { throw DeviceError("connect \(what)", errno) }
        if started != 0 {
            let left = deadline - .now
            guard left > .zero, try !pollReady([(fd, .writable)], timeout: left).isEmpty else {
                throw DeviceError("connect \(what)", ETIMEDOUT)
            }
            var failure: Int32 = 0
            var size = socklen_t(MemoryLayout<Int32>.size)
            try kernel("read the outcome of \(what)") { getsockopt(fd, SOL_SOCKET, SO_ERROR, &failure, &size) }
            if failure != 0 { throw DeviceError("connect \(what)", failure) }
        }
        return connection
    }

    /// What has arrived, at most `limit` bytes, without waiting: nil when nothing has, empty when
    /// the peer closed.
    public func read(upTo limit: Int) throws(DeviceError) -> [UInt8]? {
        var bytes = [UInt8](repeating: 0, count: limit)
        let n = try nonBlocking("read from \(peer?.description ?? "a TCP peer")") {
            bytes.withUnsafeMutableBytes { Glibc.read(fileDescriptor, $0.baseAddress, $0.count) }
        }
        guard let n else { return nil }
        bytes.removeLast(limit - n)
        return bytes
    }

    /// Writes as much of `bytes` as there is room for now, without waiting; how many went.
    public func write(someOf bytes: ArraySlice<UInt8>) throws(DeviceError) -> Int {
        try nonBlocking("write to \(peer?.description ?? "a TCP peer")") {
            bytes.withUnsafeBytes { send(fileDescriptor, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        } ?? 0
    }

    /// Bytes until `terminator` has arrived (never, when empty), the peer closes, `limit` bytes are in, or
    /// `deadline` passes (what came so far, then).
    public func read(until terminator: [UInt8], limit: Int, deadline: ContinuousClock.Instant) throws(DeviceError) -> [UInt8] {
        var received: [UInt8] = []
        // (What follows the terminator in the same read, a request's body, is returned too.)
        while received.count < limit, terminator.isEmpty || received.firstRange(of: terminator) == nil {
            let left = deadline - .now
            guard left > .zero else { break }
            let chunk = try waitingForInput(on: fileDescriptor, timeout: left) { () throws(DeviceError) -> [UInt8]? in
                try read(upTo: min(1024, limit - received.count))
            }
            guard let chunk, !chunk.isEmpty else { break }
            received += chunk
        }
        return received
    }

    /// Writes all of `bytes`, waiting for room until `deadline`; false when it passed first.
    public func write(_ bytes: [UInt8], deadline: ContinuousClock.Instant) throws(DeviceError) -> Bool {
        var offset = 0
        while offset < bytes.count {
            let n = try write(someOf: bytes[offset...])
            offset += n
            if n > 0 { continue }
            let left = deadline - .now
            guard left > .zero else { return false }
            _ = try pollReady([(fileDescriptor, .writable)], timeout: left)
        }
        return true
    }
}
