import CShims
import Glibc
public import PathMonitor

/// A layer-3 TUN interface (`IFF_TUN | IFF_NO_PI`: each read or write is one bare IP packet),
/// configured once when opened: MTU, up, inner addresses. A reconnect never touches it.
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
    public let mtu: Int
    /// The inner addresses, with their subnets: those asked for, less IPv6 ones on a host
    /// where IPv6 is disabled.
    public let addresses: [Prefix]
    /// The descriptor, for `pollReadable`.
    public let fileDescriptor: Int32

    /// Creates interface `name` (it must not exist yet), sets its MTU, brings it up and adds
    /// `addresses`. With `namespace`, the interface lives there.
    public init(name: String, mtu: Int, addresses: [Prefix], namespace: NetworkNamespace? = nil) throws(DeviceError) {
        let operation = "create TUN interface '\(name)'"
        try checkInterfaceName(name, operation)
        let minimum = addresses.contains { $0.address.family == .v6 } ? 1280 : 576
        guard (minimum...65535).contains(mtu) else {
            throw DeviceError("\(operation) with MTU \(mtu)", EINVAL,
                              help: "the MTU must be \(minimum) to 65535\(minimum == 1280 ? " with an IPv6 address" : "")")
        }
        var added: [Prefix] = []
        let (fd, netlink) = try inNamespace(namespace) { () throws(DeviceError) -> (Int32, NetlinkSocket) in
            let fd = try Self.open(name)
            do throws(NetlinkError) {
                return (fd, try NetlinkSocket())
            } catch {
                Glibc.close(fd)
                throw DeviceError(error)
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
            Glibc.close(fd)  // deletes the half-configured interface
            throw error
        }
        self.name = name
        self.mtu = mtu
        self.addresses = added
        fileDescriptor = fd
    }

    deinit { close(fileDescriptor) }

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

    /// Opens /dev/net/tun and attaches a new TUN interface `name` to it.
    private static func open(_ name: String) throws(DeviceError) -> Int32 {
        let fd = try openDriver()
        do {
            try kernel("create TUN interface '\(name)'") { CShims_tun_set_iff(fd, name) }
        } catch where error.code == EBUSY {
            Glibc.close(fd)
            throw DeviceError(error.operation, error.code,
                              help: "an interface named '\(name)' exists already: choose another name or delete it ('ip link del \(name)')")
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
    public func read(into buffer: UnsafeMutableRawBufferPointer, timeout: Duration? = .zero) throws(DeviceError) -> Int? {
        try waitingForInput(on: fileDescriptor, timeout: timeout) { () throws(DeviceError) in
            try nonBlocking("read from \(name)") { Glibc.read(fileDescriptor, buffer.baseAddress, buffer.count) }
        }
    }

    /// Fills `batch` with the packets waiting now, without waiting, and returns how many.
    public func read(into batch: PacketBatch) throws(DeviceError) -> Int {
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
        try nonBlocking("write to \(name)") { Glibc.write(fileDescriptor, packet.baseAddress, packet.count) } != nil
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
