import Foundation
import Glibc
import Reconnector

/// Where the power comes from, read from sysfs the way upower does: any online mains (or USB
/// power delivery) supply means AC; batteries with no such supply mean battery; a machine with
/// no supplies listed (a desktop, a VM) is on AC.
enum PowerSupply {
    static func current(root: String = "/sys/class/power_supply") -> PowerSource {
        let supplies = (try? FileManager.default.contentsOfDirectory(atPath: root)) ?? []
        var sawBattery = false
        for name in supplies where !name.hasPrefix(".") {
            let type = read(root + "/" + name + "/type")
            switch type {
            case "Mains", "USB", "USB_PD", "USB_C":
                if read(root + "/" + name + "/online") == "1" { return .ac }
            case "Battery":
                // Peripheral batteries (a mouse) say scope=Device; only the system's own counts.
                if read(root + "/" + name + "/scope") != "Device" { sawBattery = true }
            default:
                break
            }
        }
        return sawBattery ? .battery : .ac
    }

    private static func read(_ path: String) -> String? {
        guard let data = FileManager.default.contents(atPath: path) else { return nil }
        return String(decoding: data, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
    }
}

/// Notices a suspend that nobody announced: CLOCK_BOOTTIME keeps counting while the machine
/// sleeps and CLOCK_MONOTONIC does not, so their difference grows by the time slept.
struct SuspendDetector {
    /// Gaps smaller than this are clock noise, not a suspend.
    var threshold: Duration = .seconds(1)
    private var gap: Duration

    init(monotonic: Duration, boottime: Duration) { gap = boottime - monotonic }

    /// How long the machine slept since the last check, if it did.
    mutating func check(monotonic: Duration, boottime: Duration) -> Duration? {
        let now = boottime - monotonic
        defer { gap = now }
        let slept = now - gap
        return slept >= threshold ? slept : nil
    }

    /// Both clocks now.
    static func clocks() -> (monotonic: Duration, boottime: Duration) {
        func read(_ id: clockid_t) -> Duration {
            var ts = timespec()
            clock_gettime(id, &ts)
            return .seconds(ts.tv_sec) + .nanoseconds(ts.tv_nsec)
        }
        return (read(CLOCK_MONOTONIC), read(CLOCK_BOOTTIME))
    }
}
