import Glibc
import Basics
import Tunnel
import Device

/// What a daemon checks before it touches anything, so a machine that cannot run it gets one
/// line saying why and what to do, and nothing is left half made.
enum Preflight {
    /// The TUN device, its addresses, routes and policy rules need CAP_NET_ADMIN.
    static func requireNetworkAdmin(for command: String) throws {
        guard hasNetworkAdmin(processStatus: SystemFiles.text("/proc/self/status") ?? "") else {
            throw AgentError("agent \(command) needs root (or CAP_NET_ADMIN) for the tunnel device and its routes: "
                + "run it with sudo, or as its systemd service")
        }
    }

    /// Whether `CapEff` in a `/proc/PID/status` text holds CAP_NET_ADMIN (capability 12).
    static func hasNetworkAdmin(processStatus: String) -> Bool {
        for line in processStatus.split(separator: "\n") where line.hasPrefix("CapEff:") {
            guard let mask = UInt64(String(line.dropFirst("CapEff:".count)).trimmed, radix: 16) else { return false }
            return mask & (1 << 12) != 0
        }
        return false
    }

    /// The TUN driver is loaded and its device node is there.
    static func requireTunDriver() throws {
        do { try TunDevice.checkDriver() } catch { throw AgentError("\(error)") }
    }
}
