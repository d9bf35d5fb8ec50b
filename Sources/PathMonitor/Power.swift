public import Topology
import Basics
import CShims
import Glibc


/// Where the power comes from, read from sysfs the way upower does: any online mains (or USB
/// power delivery) supply means AC; batteries with no such supply mean battery; a machine with
/// no supplies listed (a desktop, a VM) is on AC.
public enum PowerSupply {
    public static func current(root: String = "/sys/class/power_supply") -> PowerSource {
        let supplies = SystemFiles.names(in: root) ?? []
        var sawBattery = false
        for name in supplies where !name.hasPrefix(".") {
            let type = SystemFiles.text(root + "/" + name + "/type")
            switch type {
            case "Mains", "USB", "USB_PD", "USB_C":
                if SystemFiles.text(root + "/" + name + "/online") == "1" { return .ac }
            case "Battery":
                // Peripheral batteries (a mouse) say scope=Device; only the system's own counts.
                if SystemFiles.text(root + "/" + name + "/scope") != "Device" { sawBattery = true }
            default:
                break
            }
        }
        return sawBattery ? .battery : .ac
    }
}

/// Notices a suspend that nobody announced: CLOCK_BOOTTIME keeps counting while the machine
/// sleeps and CLOCK_MONOTONIC does not, so their difference grows by the time slept.
public struct SuspendDetector {
    /// Gaps smaller than this are clock noise, not a suspend.
    var threshold: Duration = .seconds(1)
    private var gap: Duration

    public init(monotonic: Duration, boottime: Duration) { gap = boottime - monotonic }

    /// How long the machine slept since the last check, if it did.
    public mutating func check(monotonic: Duration, boottime: Duration) -> Duration? {
        let now = boottime - monotonic
        defer { gap = now }
        let slept = now - gap
        return slept >= threshold ? slept : nil
    }

    /// Both clocks now.
    public static func clocks() -> (monotonic: Duration, boottime: Duration) {
        func read(_ id: clockid_t) -> Duration {
            var ts = timespec()
            clock_gettime(id, &ts)
            return .seconds(ts.tv_sec) + .nanoseconds(ts.tv_nsec)
        }
        return (read(CLOCK_MONOTONIC), read(CLOCK_BOOTTIME))
    }
}

/// Kernel uevents (NETLINK_KOBJECT_UEVENT) for power supplies: the daemon hears a charger
/// plugged in or pulled the moment it happens, with no polling. The kernel sends these only to
/// the initial network namespace; elsewhere the socket stays silent and power is read on wake.
public final class PowerEvents {
    public let fileDescriptor: Int32

    public init?() {
        let fd = socket(AF_NETLINK, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue),
                        15 /* NETLINK_KOBJECT_UEVENT */)
        guard fd >= 0 else { return nil }
        var address = sockaddr_nl()
        address.nl_family = sa_family_t(AF_NETLINK)
        address.nl_groups = 1  // the kernel's own uevents (udev's come on group 2)
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_nl>.size)) }
        }
        guard bound == 0 else {
            close(fd)
            return nil
        }
        fileDescriptor = fd
    }

    deinit { close(fileDescriptor) }

    /// Reads what is queued; true when any of it concerned a power supply.
    public func drain() -> Bool {
        var buffer = [UInt8](repeating: 0, count: 8192)
        var concerned = false
        for _ in 0..<64 {
            let n = recv(fileDescriptor, &buffer, buffer.count, 0)
            if n <= 0 { break }
            if Self.isPowerSupplyEvent(buffer[0..<n]) { concerned = true }
        }
        return concerned
    }

    /// A uevent is `ACTION@DEVPATH` then NUL-separated `KEY=VALUE` pairs.
    static func isPowerSupplyEvent(_ message: some Collection<UInt8>) -> Bool {
        message.split(separator: 0).contains { field in field.elementsEqual("SUBSYSTEM=power_supply".utf8) }
    }
}
