import Topology
import CShims
import Glibc
import Synchronization
public import Basics
public import Netlink

/// A non-blocking UDP socket for one path, the one owner of its descriptor (closed in deinit).
///
/// Bound to a source address (port 0: the kernel picks one), and optionally to an interface
/// (`SO_BINDTODEVICE`), so its packets leave through that uplink whatever the routing table
/// prefers and fail rather than wander off when the uplink is gone; optionally marked
/// (`SO_MARK`) so full-tunnel rules let its packets past the tunnel.
public final class UDPSocket: Sendable {
    /// The bound address, with the port the kernel picked.
    public let local: SocketAddress
    /// The interface the socket is bound to, if any.
    public let device: String?
    public let mark: UInt32?
    /// The descriptor, for `pollReadable`.
    public let fileDescriptor: Int32
    /// Whether sends of several datagrams in one message (UDP_SEGMENT) work here: on until the
    /// kernel or the route refuses one, then off for good and counted in `segmentationRefusals`.
    private let segmentation = Atomic<Bool>(true)
    public var sendsSegmented: Bool { segmentation.load(ordering: .relaxed) }
    /// Whether the kernel joins runs of received datagrams (UDP_GRO): read them with a buffer of
    /// 64 KB and `receiveJoined`, or a batch with 64 KB slots, and cut them at the segment size.
    public let joinsReceived: Bool

    /// Opens a socket bound to `local`. With `namespace`, the socket lives there. With
    /// `reportsDestination`, every datagram received in a batch says which address it was sent
    /// to (`PacketBatch.local(at:)`): a server bound to every address answers from that one.
    /// With `sharesPort`, further sockets with it may bind the same address (`SO_REUSEPORT`), and
    /// the kernel spreads senders over them (see `listening(on:count:)`).
    public init(bindingTo local: SocketAddress, device: String? = nil, mark: UInt32? = nil,
                namespace: NetworkNamespace? = nil, reportsDestination: Bool = false, joinsReceived: Bool = false,
                sharesPort: Bool = false) throws(DeviceError) {
        let what = "UDP socket on \(local)\(device.map { " via \($0)" } ?? "")"
        var joins = false
        if let device { try checkInterfaceName(device, "bind \(what)") }
        let v4 = local.ip.family == .v4
        let fd = try inNamespace(namespace) { () throws(DeviceError) in
            try kernel("open \(what)") { socket(v4 ? AF_INET : AF_INET6, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0) }
        }
        do throws(DeviceError) {
            if !v4 { try Self.set(fd, Int32(IPPROTO_IPV6), IPV6_V6ONLY, 1, "set IPV6_V6ONLY on \(what)") }
            if reportsDestination {
                try kernel("ask for the destination of datagrams on \(what)") { CShims_enable_pktinfo(fd, v4 ? AF_INET : AF_INET6) }
            }
            try pin(fd, device: device, mark: mark, what)
            if sharesPort { try Self.set(fd, SOL_SOCKET, SO_REUSEPORT, 1, "share the port of \(what)") }
            // Runs of datagrams from one sender come as one buffer (a kernel without it: one each).
            joins = joinsReceived && CShims_enable_udp_gro(fd) == 0
            // A tunnel's socket carries bursts of a whole TCP window; the 208 KiB default drops a
            // tenth of them under load (measured). Root may exceed net.core.[rw]mem_max.
            for (force, plain) in [(SO_RCVBUFFORCE, SO_RCVBUF), (SO_SNDBUFFORCE, SO_SNDBUF)] {
                var size = Self.bufferSize
                let length = socklen_t(MemoryLayout<Int32>.size)
                if setsockopt(fd, SOL_SOCKET, force, &size, length) != 0 { _ = setsockopt(fd, SOL_SOCKET, plain, &size, length) }
            }
            var storage = sockaddr_in6()
            let length = local.write(to: &storage)
            do {
                try kernel("bind \(what)") { withUnsafePointer(to: &storage) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) } } }
            } catch where error.code == EADDRNOTAVAIL {
                throw DeviceError(error.operation, error.code, help: "\(local.ip) is not an address of this host (any more)")
            } catch where error.code == EADDRINUSE {
                throw DeviceError(error.operation, error.code, help: "another socket holds port \(local.port); choose another or stop it")
            }
            var boundLength = socklen_t(MemoryLayout<sockaddr_in6>.size)
            try kernel("read the address of \(what)") {
                withUnsafeMutablePointer(to: &storage) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &boundLength) } }
            }
            self.local = SocketAddress(reading: &storage, length: boundLength) ?? local
        } catch {
            close(fd)
            throw error
        }
        self.device = device
        self.mark = mark
        fileDescriptor = fd
        self.joinsReceived = joins
    }

    deinit { close(fileDescriptor) }

    /// `count` sockets bound to one address, for as many threads: the kernel hands each sender's
    /// datagrams (by address and port) to one of them. The port must be free when they bind: a
    /// server already listening there is an error, not a silent half of the traffic.
    public static func listening(
        on local: SocketAddress, count: Int, namespace: NetworkNamespace? = nil, reportsDestination: Bool = false,
        joinsReceived: Bool = false
    ) throws(DeviceError) -> [UDPSocket] {
        let open = { (address: SocketAddress, shares: Bool) throws(DeviceError) in
            try UDPSocket(bindingTo: address, namespace: namespace, reportsDestination: reportsDestination,
                          joinsReceived: joinsReceived, sharesPort: shares)
        }
        guard count > 1 else { return [try open(local, false)] }
        // A socket that does not share the port binds only where no other socket is.
        if local.port != 0 { _ = try UDPSocket(bindingTo: local, namespace: namespace) }
        let first = try open(local, true)
        var sockets = [first]
        for _ in 1..<count { sockets.append(try open(first.local, true)) }
        return sockets
    }

    /// Receive and send buffer size asked for: 4 MiB.
    static let bufferSize: Int32 = 4 << 20

    private static func set(_ fd: Int32, _ level: Int32, _ option: Int32, _ value: Int32, _ what: String) throws(DeviceError) {
        var value = value
        try kernel(what) { setsockopt(fd, level, option, &value, socklen_t(MemoryLayout<Int32>.size)) }
    }

    // MARK: One packet

    /// Sends one datagram to `peer`; false when the socket buffer is full (dropped).
    @discardableResult
    public func send(_ packet: UnsafeRawBufferPointer, to peer: SocketAddress) throws(DeviceError) -> Bool {
        var storage = sockaddr_in6()
        let length = peer.write(to: &storage)
        return try nonBlocking("send to \(peer) from \(local)") {
            withUnsafePointer(to: &storage) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    sendto(fileDescriptor, packet.baseAddress, packet.count, 0, $0, length)
                }
            }
        } != nil
    }

    /// Sends one datagram to `peer` from the address `source` (one of this host's; nil: the one
    /// the kernel's route picks); false when the socket buffer is full (dropped).
    @discardableResult
    public func send(_ packet: UnsafeRawBufferPointer, to peer: SocketAddress, from source: IPAddress?) throws(DeviceError) -> Bool {
        guard let source else { return try send(packet, to: peer) }
        var storage = sockaddr_in6()
        let nameLength = peer.write(to: &storage)
        var vector = iovec(iov_base: UnsafeMutableRawPointer(mutating: packet.baseAddress), iov_len: packet.count)
        return try nonBlocking("send to \(peer) from \(source)") {
            withUnsafeMutablePointer(to: &storage) { name in
                withUnsafeMutablePointer(to: &vector) { vector in
                    withUnsafeTemporaryAllocation(byteCount: Int(CSHIMS_OFFLOAD_SPACE), alignment: 16) { control in
                        var message = msghdr()
                        message.msg_name = UnsafeMutableRawPointer(name)
                        message.msg_namelen = nameLength
                        message.msg_iov = vector
                        message.msg_iovlen = 1
                        source.withNetworkBytes { family, address in
                            CShims_write_pktinfo(&message, control.baseAddress, family, address)
                        }
                        return sendmsg(fileDescriptor, &message, 0)
                    }
                }
            }
        } != nil
    }

    /// Receives one datagram into `buffer` (cut short if longer), or nil when none came within
    /// `timeout` (zero: do not wait; nil: wait as long as it takes).
    public func receive(into buffer: UnsafeMutableRawBufferPointer, timeout: Duration? = .zero)
        throws(DeviceError) -> (length: Int, peer: SocketAddress)?
    {
        try waitingForInput(on: fileDescriptor, timeout: timeout) { () throws(DeviceError) -> (length: Int, peer: SocketAddress)? in
            var storage = sockaddr_in6()
            var length = socklen_t(MemoryLayout<sockaddr_in6>.size)
            let received = try nonBlocking("receive on \(local)") {
                withUnsafeMutablePointer(to: &storage) {
                    $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                        recvfrom(fileDescriptor, buffer.baseAddress, buffer.count, 0, $0, &length)
                    }
                }
            }
            guard let received, let peer = SocketAddress(reading: &storage, length: length) else { return nil }
            return (received, peer)
        }
    }

    /// Receives into `buffer` what the kernel has: one datagram, or a run of datagrams from one
    /// sender joined (UDP_GRO), each `segment` bytes but the last; nil when nothing came within
    /// `timeout`. `buffer` should have 64 KB: a joined run longer than it is cut short.
    public func receiveJoined(into buffer: UnsafeMutableRawBufferPointer, timeout: Duration? = .zero)
        throws(DeviceError) -> (length: Int, peer: SocketAddress, segment: Int)?
    {
        try waitingForInput(on: fileDescriptor, timeout: timeout) { () throws(DeviceError) -> (length: Int, peer: SocketAddress, segment: Int)? in
            var storage = sockaddr_in6()
            var vector = iovec(iov_base: buffer.baseAddress, iov_len: buffer.count)
            var segment: Int32 = 0
            var nameLength: socklen_t = 0
            let received = try nonBlocking("receive on \(local)") {
                withUnsafeMutablePointer(to: &storage) { name in
                    withUnsafeMutablePointer(to: &vector) { vector in
                        withUnsafeTemporaryAllocation(byteCount: Int(CSHIMS_OFFLOAD_SPACE), alignment: 16) { control in
                            var message = msghdr()
                            message.msg_name = UnsafeMutableRawPointer(name)
                            message.msg_namelen = socklen_t(MemoryLayout<sockaddr_in6>.size)
                            message.msg_iov = vector
                            message.msg_iovlen = 1
                            message.msg_control = control.baseAddress
                            message.msg_controllen = Int(CSHIMS_OFFLOAD_SPACE)
                            let n = recvmsg(fileDescriptor, &message, 0)
                            if n >= 0 {
                                segment = CShims_read_gro_size(&message)
                                nameLength = message.msg_namelen
                            }
                            return n
                        }
                    }
                }
            }
            guard let received, let peer = SocketAddress(reading: &storage, length: nameLength) else { return nil }
            return (received, peer, segment > 0 && Int(segment) < received ? Int(segment) : received)
        }
    }

    // MARK: Batches

    /// Sends the packets of `batch` to their peers with `sendmmsg` and returns how many the
    /// kernel took: fewer than `batch.count` when the socket buffer filled (the rest are
    /// dropped, as a congested link drops them). An error throws after the packets before
    /// it were sent; the rest are not.
    @discardableResult
    public func send(_ batch: PacketBatch) throws(DeviceError) -> Int {
        try send(batch, from: 0)
    }

    /// Sends the packets of `batch` like `send(_:)`, with runs of equal-size datagrams for one
    /// peer going as one message each that the kernel cuts (UDP segmentation offload): one trip
    /// through the stack for up to 64 datagrams. A kernel or route that refuses it turns it off
    /// for this socket, and the batch goes datagram by datagram.
    @discardableResult
    public func sendSegmented(_ batch: PacketBatch) throws(DeviceError) -> Int {
        guard segmentation.load(ordering: .relaxed), batch.count > 1 else { return try send(batch) }
        let runs = batch.prepareRuns()
        guard runs < batch.count else { return try send(batch) }
        var sentRuns = 0
        var sent = 0
        while sentRuns < runs {
            let result = CShims_sendmmsg(fileDescriptor, batch.runs + sentRuns, UInt32(runs - sentRuns), 0)
            if result > 0 {
                for k in sentRuns..<(sentRuns + Int(result)) { sent += batch.runLengths[k] }
                sentRuns += Int(result)
                continue
            }
            let code = errno
            if code == EINTR { continue }
            if code == EAGAIN || code == EWOULDBLOCK || code == ENOBUFS { break }
            if [EIO, EINVAL, ENOPROTOOPT, EOPNOTSUPP].contains(code) {
                // No segmentation on this path (a device without checksum offload, an old
                // kernel): datagram by datagram from here on.
                segmentation.store(false, ordering: .relaxed)
                return try sent + send(batch, from: (0..<sentRuns).reduce(0) { $0 + batch.runLengths[$1] })
            }
            throw DeviceError("send \(batch.count - sent) datagrams from \(local)", code)
        }
        return sent
    }

    /// `send(_:)` from slot `first` on; returns how many of those the kernel took.
    private func send(_ batch: PacketBatch, from first: Int) throws(DeviceError) -> Int {
        var sent = first
        while sent < batch.count {
            let more = try nonBlocking("send \(batch.count - sent) datagrams from \(local)") {
                CShims_sendmmsg(fileDescriptor, batch.messages + sent, UInt32(batch.count - sent), 0)
            }
            guard let more, more > 0 else { break }
            sent += Int(more)
        }
        return sent - first
    }

    /// Fills `batch` with the datagrams waiting, with `recvmmsg`, and returns how many; waits
    /// for the first up to `timeout` (zero: do not wait; nil: as long as it takes). A datagram
    /// longer than a slot is cut short.
    @discardableResult
    public func receive(into batch: PacketBatch, timeout: Duration? = .zero) throws(DeviceError) -> Int {
        batch.prepareToReceive()
        let received = try waitingForInput(on: fileDescriptor, timeout: timeout) { () throws(DeviceError) -> Int32? in
            try nonBlocking("receive datagrams on \(local)") {
                CShims_recvmmsg(fileDescriptor, batch.messages, UInt32(batch.capacity), Int32(MSG_DONTWAIT), nil)
            }
        }
        batch.received(Int(received ?? 0))
        return batch.count
    }
}
