import Topology
import CShims
import Glibc
import Synchronization
public import Basics
public import Netlink

/// A layer-3 TUN interface (`IFF_TUN | IFF_NO_PI`: each read or write is one bare IP packet),
/// configured once when opened: MTU, up, inner addresses. A reconnect never touches it; only
/// its MTU follows the path the session is on (path MTU discovery).
///
/// The one owner of its `/dev/net/tun` descriptor. The device is not persistent, so closing the
/// descriptor (deinit) deletes the interface and every route through it, on a clean exit and
/// on a crash alike; policy rules are the only state that outlives it (`TunnelRoutes`).
/// The descriptor is non-blocking; reads wait through `poll`.
public final class TunDevice: Sendable {
    /// The interface name, e.g. `roam0`.
    public let name: String
    /// The kernel's interface index, for routes through it.
    public let index: Int32
    /// The MTU as last set.
    public var mtu: Int { currentMTU.withLock { $0 } }
    private let currentMTU: Mutex<Int>
    /// The lowest MTU the device takes: IPv6's minimum with an IPv6 address, else IPv4's.
    public let minimumMTU: Int
    private let namespace: NetworkNamespace?
    /// The inner addresses, with their subnets: those asked for, less IPv6 ones on a host
    /// where IPv6 is disabled.
    public let addresses: [Prefix]
    /// The descriptor of the first queue, for `pollReadable`.
    public var fileDescriptor: Int32 { queues[0] }
    /// One descriptor per queue: the kernel hands each flow's packets to one of them, so as many
    /// threads as queues read (and write) the device without waiting for each other.
    public let queues: [Int32]
    /// What the kernel hands over: whole segments, or super-packets for the agent to cut.
    public let offload: OffloadState
    /// Whether every read and write starts with a `virtio_net_hdr` (`IFF_VNET_HDR`): read through
    /// a `TunReader` then.
    public let hasVirtioHeader: Bool

    /// Offloads as the device got them.
    public enum OffloadState: Equatable, Sendable, CustomStringConvertible {
        /// Not asked for: one packet per read, checksums done by the kernel.
        case off
        /// TCP segmentation for IPv4 and IPv6 and checksums left to the agent: a read may be a
        /// 64 KB super-packet, cut by `Segmenter`.
        case tso
        /// Asked for, and refused by this kernel: one packet per read.
        case unavailable(String)

        public var description: String {
            switch self {
            case .off: "off"
            case .tso: "tso"
            case .unavailable(let why): "unavailable (\(why))"
            }
        }
    }
    /// Creates interface `name` (it must not exist yet), sets its MTU, brings it up and adds
    /// `addresses`. With `namespace`, the interface lives there. With more than one queue, the
    /// device is multi-queue (`IFF_MULTI_QUEUE`).
    public init(name: String, mtu: Int, addresses: [Prefix], namespace: NetworkNamespace? = nil,
                offload: Bool = false, queues queueCount: Int = 1) throws(DeviceError) {
        let operation = "create TUN interface '\(name)'"
        try checkInterfaceName(name, operation)
        let minimum = addresses.contains { $0.address.family == .v6 } ? 1280 : 576
        guard (minimum...65535).contains(mtu) else {
            throw DeviceError("\(operation) with MTU \(mtu)", EINVAL,
                              help: "the MTU must be \(minimum) to 65535\(minimum == 1280 ? " with an IPv6 address" : "")")
        }
        var added: [Prefix] = []
        guard (1...Self.maxQueues).contains(queueCount) else {
            throw DeviceError("\(operation) with \(queueCount) queues", EINVAL, help: "a device has 1 to \(Self.maxQueues) queues")
        }
        let (fds, netlink, opened) = try inNamespace(namespace) { () throws(DeviceError) -> ([Int32], NetlinkSocket, Opened) in
            let (fd, opened) = try Self.open(name, offload: offload, multiqueue: queueCount > 1)
            if minimum < 1280 { Self.disableIPv6(on: name) }
            var fds = [fd]
            do throws(DeviceError) {
                for _ in 1..<queueCount { fds.append(try Self.attachQueue(name, like: opened)) }
                return (fds, try Self.netlink { () throws(NetlinkError) in try NetlinkSocket() }, opened)
            } catch {
                for fd in fds { Glibc.close(fd) }
                throw error
            }
        }
        do throws(DeviceError) {
            // The device exists from TUNSETIFF on; the kernel names it exactly as asked.
            guard let link = try Self.netlink({ () throws(NetlinkError) in try netlink.link(named: name) }) else {
                throw DeviceError("\(operation): look up its index", ENODEV)
            }
            try Self.netlink { () throws(NetlinkError) in
                try netlink.setLink(link.index, mtu: mtu)
                do throws(NetlinkError) {
                    try netlink.disableIPv6LinkLocal(link.index)
                } catch where error.code == EAFNOSUPPORT || error.code == EOPNOTSUPP {
                    // No IPv6 in this kernel: nothing to keep quiet.
                }
                try netlink.setLink(link.index, up: true)
                for prefix in addresses {
                    do throws(NetlinkError) {
                        try netlink.write(Address(linkIndex: link.index, prefix: prefix))
                        added.append(prefix)
                    } catch where prefix.address.family == .v6 && (error.code == EACCES || error.code == EAFNOSUPPORT) {
                        // IPv6 is disabled on this host: the tunnel carries IPv4 only, and the
                        // routing plan makes IPv6 unreachable.
                    }
                }
            }
            index = link.index
        } catch {
            for fd in fds { Glibc.close(fd) }  // deletes the half-configured interface
            throw error
        }
        self.name = name
        currentMTU = Mutex(mtu)
        minimumMTU = minimum
        self.namespace = namespace
        self.addresses = added
        queues = fds
        self.offload = opened.offload
        hasVirtioHeader = opened.hasVirtioHeader
    }

    /// Sets the device's MTU (`RTM_NEWLINK`): the kernel makes local sockets' packets fit it at
    /// once, and new TCP connections announce a segment size to match.
    public func setMTU(_ mtu: Int) throws(DeviceError) {
        let operation = "set the MTU of '\(name)' to \(mtu)"
        guard (minimumMTU...65535).contains(mtu) else {
            throw DeviceError(operation, EINVAL, help: "the MTU must be \(minimumMTU) to 65535 on this device")
        }
        try inNamespace(namespace) { () throws(DeviceError) in
            try Self.netlink { () throws(NetlinkError) in try NetlinkSocket().setLink(index, mtu: mtu) }
        }
        currentMTU.withLock { $0 = mtu }
    }

    /// Takes IPv6 off a device with no IPv6 address (`disable_ipv6`, in the calling thread's
    /// namespace): no IPv6 packet has anything to do there, and its MTU may then go below 1,280
    /// (IPv6's minimum) without the kernel taking its IPv6 state away and back as it moves. Best
    /// effort: a host without IPv6 has no such setting, and a device left with it works alike.
    private static func disableIPv6(on name: String) {
        let fd = Glibc.open("/proc/sys/net/ipv6/conf/\(name)/disable_ipv6", O_WRONLY | O_CLOEXEC)
        guard fd >= 0 else { return }
        defer { Glibc.close(fd) }
        _ = Glibc.write(fd, "1", 1)
    }

    /// What opening the device gave: its offloads, and whether reads and writes carry a header.
    private typealias Opened = (offload: OffloadState, hasVirtioHeader: Bool)

    /// Queues a device may have: the kernel's limit is 256; a thread each beyond a few dozen buys nothing.
    public static let maxQueues = 64

    deinit { for fd in queues { close(fd) } }

    /// Checks that TUN devices can be made here (the driver is loaded and its device node is
    /// there), so a daemon can refuse to start before it touches anything.
    public static func checkDriver() throws(DeviceError) {
        Glibc.close(try openDriver())
    }

    private static func openDriver() throws(DeviceError) -> Int32 {
        let path = "/dev/net/tun"
        do {
            return try kernel("open \(path)") { Glibc.open(path, O_RDWR | O_CLOEXEC | O_NONBLOCK) }
        } catch where error.code == ENOENT || error.code == ENODEV || error.code == ENXIO {
            throw DeviceError(error.operation, error.code,
                              help: "load the TUN driver ('modprobe tun'); in a container, pass the device in (--device /dev/net/tun)")
        }
    }

    /// Opens /dev/net/tun and attaches a new TUN interface `name` to it; with `offload`, with a
    /// virtio header and TCP segmentation if the kernel has them.
    private static func open(_ name: String, offload: Bool, multiqueue: Bool) throws(DeviceError) -> (Int32, Opened) {
        let fd = try openDriver()
        var state = OffloadState.off
        let queues: Int32 = multiqueue ? 1 : 0
        do {
            if offload {
                if CShims_tun_set_iff(fd, name, 1, queues, 1) == 0 {
                    let tso = CSHIMS_TUN_F_CSUM | CSHIMS_TUN_F_TSO4 | CSHIMS_TUN_F_TSO6 | CSHIMS_TUN_F_TSO_ECN
                    if CShims_tun_set_offload(fd, tso) == 0 { return (fd, (.tso, true)) }
                    // A header with nothing offloaded: every read one finished packet.
                    let why = String(cString: strerror(errno))
                    _ = CShims_tun_set_offload(fd, 0)
                    return (fd, (.unavailable("TUNSETOFFLOAD: \(why)"), true))
                }
                // EBUSY (the name is taken) is reported by the plain attempt below.
                if errno != EBUSY { state = .unavailable("no virtio header") }
            }
            try kernel("create TUN interface '\(name)'") { CShims_tun_set_iff(fd, name, 0, queues, 1) }
        } catch where error.code == EBUSY {
            Glibc.close(fd)
            throw DeviceError(error.operation, error.code,
                              help: "an interface named '\(name)' exists already: choose another name or delete it ('ip link del \(name)')")
        } catch {
            Glibc.close(fd)
            throw error
        }
        return (fd, (state, false))
    }

    /// Opens one more queue of the multi-queue device `name`, with the flags its first one has
    /// (the kernel applies a queue's flags to the whole device).
    private static func attachQueue(_ name: String, like first: Opened) throws(DeviceError) -> Int32 {
        let fd = try openDriver()
        do {
            try kernel("attach a queue to TUN interface '\(name)'") {
                CShims_tun_set_iff(fd, name, first.hasVirtioHeader ? 1 : 0, 1, 0)
            }
        } catch {
            Glibc.close(fd)
            throw error
        }
        return fd
    }

    /// Runs netlink requests, reporting a refusal as a `DeviceError`.
    private static func netlink<T>(_ body: () throws(NetlinkError) -> T) throws(DeviceError) -> T {
        do { return try body() } catch { throw DeviceError(error) }
    }

    // MARK: Packets

    /// Reads one packet into `buffer` and returns its length, or nil when none came within
    /// `timeout` (zero: do not wait; nil: wait as long as it takes). A packet longer than
    /// `buffer` is cut short.
    public func read(into buffer: UnsafeMutableRawBufferPointer, timeout: Duration? = .zero, queue: Int = 0) throws(DeviceError) -> Int? {
        precondition(!hasVirtioHeader, "a device with a virtio header is read through a TunReader")
        let fd = queues[queue]
        return try waitingForInput(on: fd, timeout: timeout) { () throws(DeviceError) in
            try nonBlocking("read from \(name)") { Glibc.read(fd, buffer.baseAddress, buffer.count) }
        }
    }

    /// Fills `batch` with the packets waiting now, without waiting, and returns how many.
    public func read(into batch: PacketBatch) throws(DeviceError) -> Int {
        precondition(!hasVirtioHeader, "a device with a virtio header is read through a TunReader")
        batch.removeAll()
        while !batch.isFull {
            var failure: DeviceError?
            let appended = batch.append { slot in
                do throws(DeviceError) {
                    return try nonBlocking("read from \(name)") { Glibc.read(fileDescriptor, slot.baseAddress, slot.count) }
                } catch {
                    failure = error
                    return nil
                }
            }
            if let failure { throw failure }
            if !appended { break }
        }
        return batch.count
    }

    /// Writes one IP packet, delivering it to the host's stack as if it arrived on this
    /// interface; false when the kernel had no room for it (dropped). A packet that is not IP
    /// throws `EINVAL`.
    @discardableResult
    public func write(_ packet: UnsafeRawBufferPointer) throws(DeviceError) -> Bool {
        // A header of zeros, on a device that has one: one packet, its checksums complete (the
        // peer's kernel made them).
        try write(packet, header: VirtioNetHeader())
    }

    /// Writes one packet with its virtio header (a super-packet for the kernel to take whole);
    /// on a device without one, the header must be empty and is left out. Any queue takes any
    /// packet; a thread of its own per queue writes without waiting for the others.
    @discardableResult
    public func write(_ packet: UnsafeRawBufferPointer, header: VirtioNetHeader, queue: Int = 0) throws(DeviceError) -> Bool {
        let fd = queues[queue]
        guard hasVirtioHeader else {
            return try nonBlocking("write to \(name)") { Glibc.write(fd, packet.baseAddress, packet.count) } != nil
        }
        // Header and iovecs on the stack: this runs for every packet out of the tunnel.
        let written = withUnsafeTemporaryAllocation(byteCount: VirtioNetHeader.length, alignment: 8) { head in
            header.write(to: head)
            return withUnsafeTemporaryAllocation(of: iovec.self, capacity: 2) { vectors in
                vectors[0] = iovec(iov_base: head.baseAddress, iov_len: head.count)
                vectors[1] = iovec(iov_base: UnsafeMutableRawPointer(mutating: packet.baseAddress), iov_len: packet.count)
                return Result { () throws(DeviceError) in
                    try nonBlocking("write to \(name)") { Glibc.writev(fd, vectors.baseAddress, 2) } != nil
                }
            }
        }
        return try written.get()
    }

    /// Writes the packets of `batch` in order and returns how many the kernel took. An error
    /// throws after the packets before it were written; the rest are not.
    @discardableResult
    public func write(_ batch: PacketBatch) throws(DeviceError) -> Int {
        var written = 0
        for i in 0..<batch.count {
            if try write(batch.packet(at: i)) { written += 1 }
        }
        return written
    }
}

/// Reads a TUN device one finished IP packet at a time, whatever the device hands over: with a
/// virtio header, a TCP super-packet is read once and cut into its segments over the following
/// calls, and a partial checksum is completed. Metadata that cannot be right drops the packet
/// whole, counted; nothing is written half. One per reading thread.
public struct TunReader {
    public let device: TunDevice
    /// The queue read.
    public let queue: Int
    /// Packets dropped for their offload metadata, by cause, since the counts were last reset.
    public private(set) var dropped: [OffloadDrop: Int] = [:]
    /// Super-packets cut into segments, since the counts were last reset.
    public private(set) var superPackets = 0
    private var scratch: UnsafeMutableRawBufferPointer
    private var pending: (segmenter: Segmenter, next: Int, length: Int)?

    public init(_ device: TunDevice, queue: Int = 0) {
        self.device = device
        self.queue = queue
        scratch = device.hasVirtioHeader
            ? .allocate(byteCount: VirtioNetHeader.length + 65_536, alignment: 16)
            : UnsafeMutableRawBufferPointer(start: nil, count: 0)
    }

    /// Zeroes `dropped` and `superPackets`, once they are counted elsewhere.
    package mutating func resetCounts() {
        if !dropped.isEmpty { dropped.removeAll(keepingCapacity: true) }
        superPackets = 0
    }

    /// Frees the scratch buffer; the reader is not used after.
    public mutating func release() {
        scratch.deallocate()
        scratch = UnsafeMutableRawBufferPointer(start: nil, count: 0)
    }

    /// Writes the next packet into `buffer` and returns its length; nil when the device has
    /// nothing waiting.
    public mutating func read(into buffer: UnsafeMutableRawBufferPointer) throws(DeviceError) -> Int? {
        guard device.hasVirtioHeader else { return try device.read(into: buffer, timeout: .zero, queue: queue) }
        while true {
            if let (segmenter, next, length) = pending {
                let packet = UnsafeRawBufferPointer(rebasing: UnsafeRawBufferPointer(scratch)[VirtioNetHeader.length..<length])
                let written = segmenter.segment(next, of: packet, into: buffer)
                pending = next + 1 < segmenter.count ? (segmenter, next + 1, length) : nil
                return written
            }
            let fd = device.queues[queue]
            let scratch = self.scratch
            guard let length = try nonBlocking("read from \(device.name)", { Glibc.read(fd, scratch.baseAddress, scratch.count) })
            else { return nil }
            let bytes = UnsafeRawBufferPointer(scratch)
            guard let header = VirtioNetHeader(bytes), length > VirtioNetHeader.length else {
                dropped[.badHeaders, default: 0] += 1
                continue
            }
            let packet = UnsafeRawBufferPointer(rebasing: bytes[VirtioNetHeader.length..<length])
            do throws(OffloadDrop) {
                let segmenter = try Segmenter(packet, header: header, maxSegment: buffer.count)
                if segmenter.count > 1 { superPackets += 1 }
                pending = (segmenter, 0, length)
            } catch {
                dropped[error, default: 0] += 1
            }
        }
    }
}
