import Foundation
import Glibc
public import PathMonitor
public import Testing

/// A throwaway network namespace for tests that need a real kernel, deleted (with every
/// device in it) on deinit, so a failing test leaves nothing behind.
public final class NamespaceLab {
    public static let isRoot = getuid() == 0
    public static let skipReason: Comment =
        "needs root to create network namespaces and TUN devices; run the suite as root (CI does)"
    nonisolated(unsafe) private static var counter = 0
    private static let lock = NSLock()

    public let name: String
    public let namespace: NetworkNamespace

    public init() throws {
        Self.lock.lock()
        Self.counter += 1
        name = "roamtest-\(getpid())-\(Self.counter)"
        Self.lock.unlock()
        try Self.ip(["netns", "add", name])
        do {
            namespace = try NetworkNamespace(named: name)
            try ip("link set lo up")
        } catch {
            _ = try? Self.ip(["netns", "del", name])
            throw error
        }
    }

    deinit { _ = try? Self.ip(["netns", "del", name]) }

    /// Runs `ip -n NAME <arguments>` and returns what it printed.
    @discardableResult
    public func ip(_ arguments: String) throws -> String {
        try Self.ip(["-n", name] + arguments.split(separator: " ").map(String.init))
    }

    /// Runs `ip -n NAME -batch FILE` with these lines.
    public func batch(_ lines: [String]) throws {
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("\(name)-batch.txt")
        try lines.joined(separator: "\n").appending("\n").write(to: file, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(at: file) }
        try Self.ip(["-n", name, "-batch", file.path])
    }

    public struct Failure: Error, CustomStringConvertible {
        public var description: String
    }

    @discardableResult
    public static func ip(_ arguments: [String]) throws -> String {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: FileManager.default.fileExists(atPath: "/usr/sbin/ip") ? "/usr/sbin/ip" : "/sbin/ip")
        process.arguments = arguments
        let output = Pipe()
        process.standardOutput = output
        process.standardError = output
        try process.run()
        let data = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        let text = String(decoding: data, as: UTF8.self)
        guard process.terminationStatus == 0 else {
            throw Failure(description: "ip \(arguments.joined(separator: " ")): \(text)")
        }
        return text
    }
}
