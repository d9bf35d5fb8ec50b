import Foundation
import Glibc

/// Debian's own systemd-resolved running in a lab namespace, on a D-Bus daemon of the test's
/// own and in a mount namespace of its own (its /run and, if the host lacks it, a passwd with
/// its `systemd-resolve` user), so neither the host's resolver nor its system bus is touched.
/// Ended by PID on `stop()` or deinit.
public final class LabResolved {
    public let bus: PrivateBus
    private let process = Process()
    private let lab: NamespaceLab
    private let binaries: String

    /// The unpacked package `scripts/setup` fetches (installing it would take over the host's
    /// resolv.conf), else an installed one.
    public static let root: String? = {
        let unpacked = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent(".build/lab/systemd-resolved").path
        return [unpacked, ""].first { FileManager.default.isExecutableFile(atPath: $0 + "/lib/systemd/systemd-resolved") }
    }()

    public static let skipReason = "needs systemd-resolved (scripts/setup unpacks Debian's into .build/lab) and dbus-daemon"
    public static var available: Bool { root != nil && PrivateBus.available }

    /// The bus's address, for `DBUS_SYSTEM_BUS_ADDRESS`.
    public var address: String { bus.address }
    public var log: String { (try? String(contentsOfFile: bus.directory + "/resolved.log", encoding: .utf8)) ?? "" }

    public init(in lab: NamespaceLab) throws {
        guard let root = Self.root else { throw NamespaceLab.Failure(description: Self.skipReason) }
        self.lab = lab
        binaries = root
        bus = try PrivateBus()
        var mounts = "mount -t tmpfs -o mode=0755 tmpfs /run && mkdir -p /run/systemd"
        // Without the user, resolved (which drops to it) runs as nobody under that name: the bus
        // daemon must know the uid that connects, or it drops the connection.
        if getpwnam("systemd-resolve") == nil, let nobody = getpwnam("nobody") {
            let (uid, gid) = (nobody.pointee.pw_uid, nobody.pointee.pw_gid)
            for (file, line) in [("passwd", "systemd-resolve:x:\(uid):\(gid):resolved:/:/usr/sbin/nologin"), ("group", "systemd-resolve:x:\(gid):")] {
                let copy = bus.directory + "/" + file
                try (try String(contentsOfFile: "/etc/" + file, encoding: .utf8) + line + "\n").write(toFile: copy, atomically: true, encoding: .utf8)
                mounts += " && mount --bind \(copy) /etc/\(file)"
            }
        }
        let logPath = bus.directory + "/resolved.log"
        _ = FileManager.default.createFile(atPath: logPath, contents: nil)
        process.executableURL = NamespaceLab.ipTool
        // ip, unshare and sh each exec the next: the PID is resolved's.
        process.arguments = ["netns", "exec", lab.name, "unshare", "--mount", "--propagation", "private", "sh", "-c",
                             "\(mounts) && exec \(root)/lib/systemd/systemd-resolved"]
        process.environment = ["DBUS_SYSTEM_BUS_ADDRESS": bus.address, "SYSTEMD_LOG_LEVEL": "debug", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"]
        let handle = FileHandle(forWritingAtPath: logPath)
        process.standardOutput = handle
        process.standardError = handle
        try process.run()
        let deadline = Date().addingTimeInterval(10)
        while process.isRunning && !log.contains("Successfully acquired requested service name") && Date() < deadline { usleep(20_000) }
        guard process.isRunning, log.contains("Successfully acquired requested service name") else {
            let said = log.prefix(4000)
            stop()
            throw NamespaceLab.Failure(description: "systemd-resolved did not come up: \(said)")
        }
    }

    /// Runs `resolvectl ARGUMENTS` in the lab against this resolved (as NetworkManager would set
    /// an uplink's resolvers, or an operator would look) and returns what it printed.
    @discardableResult
    public func resolvectl(_ arguments: [String]) throws -> String {
        let process = Process()
        process.executableURL = NamespaceLab.ipTool
        process.arguments = ["netns", "exec", lab.name, binaries + "/usr/bin/resolvectl", "--no-pager"] + arguments
        process.environment = ["DBUS_SYSTEM_BUS_ADDRESS": bus.address, "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"]
        let pipe = Pipe()
        process.standardOutput = pipe
        process.standardError = pipe
        try process.run()
        let output = String(decoding: pipe.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        guard process.terminationStatus == 0 else {
            throw NamespaceLab.Failure(description: "resolvectl \(arguments.joined(separator: " ")): \(output)")
        }
        return output
    }

    public func stop() {
        if process.isRunning {
            kill(process.processIdentifier, SIGTERM)
            let deadline = Date().addingTimeInterval(3)
            while process.isRunning && Date() < deadline { usleep(10_000) }
            if process.isRunning { kill(process.processIdentifier, SIGKILL) }
        }
        bus.stop()
    }

    deinit { stop() }
}
