import CShims
import Glibc
import Basics
import Reconnector

/// sd_notify(3) without libsystemd: datagrams to the socket systemd names in $NOTIFY_SOCKET,
/// so a `Type=notify` unit learns when the tunnel is really up and what it is doing.
struct SystemdNotifier {
    private let address: sockaddr_un?
    private let length: socklen_t

    /// Reads $NOTIFY_SOCKET (unset: every call does nothing).
    init(socketPath: String? = environment("NOTIFY_SOCKET")) {
        guard let path = socketPath, !path.isEmpty, path.utf8.count < 108 else {
            address = nil
            length = 0
            return
        }
        var sa = sockaddr_un()
        sa.sun_family = sa_family_t(AF_UNIX)
        var bytes = Array(path.utf8)
        if bytes.first == UInt8(ascii: "@") { bytes[0] = 0 }  // an abstract socket
        withUnsafeMutableBytes(of: &sa.sun_path) { raw in
            for (i, b) in bytes.enumerated() { raw[i] = b }
        }
        address = sa
        length = socklen_t(MemoryLayout<sa_family_t>.size + bytes.count)
    }

    var isActive: Bool { address != nil }

    /// How often to send WATCHDOG=1: half of WatchdogSec, when the unit sets one for this process.
    static func watchdogInterval(usec: String? = environment("WATCHDOG_USEC"),
                                 pid: String? = environment("WATCHDOG_PID")) -> Duration? {
        guard let usec, let micros = Int64(usec), micros > 0 else { return nil }
        if let pid, Int32(pid) != getpid() { return nil }
        return .microseconds(micros / 2)
    }

    /// Sends `READY=1`, `STATUS=...` and the like; failures are ignored, as sd_notify's are.
    func notify(_ state: String) {
        guard var sa = address else { return }
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return }
        defer { close(fd) }
        let bytes = Array(state.utf8)
        _ = withUnsafePointer(to: &sa) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { sendto(fd, bytes, bytes.count, 0, $0, length) }
        }
    }
}

/// The value of an environment variable, or nil when it is not set.
func environment(_ name: String) -> String? { getenv(name).map { String(cString: $0) } }

/// What the client tells systemd: READY=1 once, WATCHDOG=1 pings when the unit asks for them
/// (WatchdogSec=), EXTEND_TIMEOUT_USEC= while it is still trying to start, STATUS= at each
/// transition, STOPPING=1 at the end. When to ping and to ask for time is the core's
/// (`Heartbeats`): this only says it.
struct ServiceReporter {
    private let systemd: SystemdNotifier
    private var readySent = false

    init(systemd: SystemdNotifier = SystemdNotifier()) {
        self.systemd = systemd
    }

    func pingWatchdog() { systemd.notify("WATCHDOG=1") }

    /// Asks for `more` time to start; a time-out is a SIGTERM, which keeps the lockdown anyway.
    func extendStart(by more: Duration) {
        systemd.notify("EXTEND_TIMEOUT_USEC=\(more.nanoseconds / 1000)")
    }

    /// READY=1, once: when the tunnel is up, or when there is no network to bring it up on (then
    /// STATUS= tells the rest), so a boot never waits on the agent.
    mutating func ready() {
        guard !readySent else { return }
        readySent = true
        systemd.notify("READY=1")
    }

    func transition(_ transition: Transition) {
        systemd.notify("STATUS=\(transition.to.name)" + (transition.to.path.map { " on \($0.interface)" } ?? "") + ": \(transition.reason)")
    }

    func stopping() { systemd.notify("STOPPING=1") }

    /// Whether a SIGTERM may be systemd's stop without the unit's ExecStop having run: systemd
    /// runs ExecStop only for a unit that is running, so a `systemctl stop` while the start is
    /// still waiting (before READY=1) comes as the signal alone.
    var stopSkipsExecStop: Bool { systemd.isActive && !readySent }
}
