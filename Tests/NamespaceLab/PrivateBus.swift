import Foundation
import Glibc

/// A D-Bus daemon of the test's own, listening on a socket in a scratch directory, ended by
/// PID on deinit: the system bus is never touched.
public final class PrivateBus {
    public let directory: String
    public var socketPath: String { directory + "/bus.sock" }
    private let process = Process()

    /// The address clients take from `DBUS_SYSTEM_BUS_ADDRESS`.
    public var address: String { "unix:path=" + socketPath }

    public static let available = FileManager.default.isExecutableFile(atPath: "/usr/bin/dbus-daemon")

    public init() throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("roam-bus-\(getpid())-\(UUID().uuidString.prefix(8))").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        try """
            <!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
             "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
            <busconfig>
              <type>system</type>
              <listen>unix:path=\(socketPath)</listen>
              <auth>EXTERNAL</auth>
              <policy context="default">
                <allow user="*"/>
                <allow own="*"/>
                <allow send_type="method_call"/>
                <allow send_destination="*"/>
                <allow receive_sender="*"/>
                <allow receive_type="method_return"/>
                <allow receive_type="error"/>
                <allow receive_type="signal"/>
              </policy>
            </busconfig>
            """.write(toFile: directory + "/bus.conf", atomically: true, encoding: .utf8)
        process.executableURL = URL(fileURLWithPath: "/usr/bin/dbus-daemon")
        process.arguments = ["--config-file=\(directory)/bus.conf", "--nofork", "--nopidfile"]
        process.standardOutput = FileHandle.nullDevice
        try process.run()
        // The socket's file appears at bind(), a moment before the daemon listens: wait until a
        // connection is taken.
        let deadline = Date().addingTimeInterval(15)
        while !Self.accepts(socketPath) && Date() < deadline { usleep(10_000) }
        guard Self.accepts(socketPath) else {
            stop()
            throw CocoaError(.fileNoSuchFile, userInfo: [NSLocalizedDescriptionKey: "dbus-daemon did not listen at \(socketPath)"])
        }
    }

    private static func accepts(_ path: String) -> Bool {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else { return false }
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            for (i, byte) in bytes.enumerated() { raw[i] = byte }
        }
        return withUnsafePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) == 0
            }
        }
    }

    public func stop() {
        if process.isRunning {
            kill(process.processIdentifier, SIGTERM)
            let deadline = Date().addingTimeInterval(2)
            while process.isRunning && Date() < deadline { usleep(10_000) }
            if process.isRunning { kill(process.processIdentifier, SIGKILL) }
        }
        try? FileManager.default.removeItem(atPath: directory)
    }

    deinit { stop() }
}
