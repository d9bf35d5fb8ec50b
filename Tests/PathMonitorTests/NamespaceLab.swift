import Foundation
import Glibc
import Testing
@testable import PathMonitor

/// A throwaway network namespace for tests that need a real kernel. Deleted on deinit, so a
/// failing test leaves nothing behind.
final class NamespaceLab {
    static let isRoot = getuid() == 0
    static let skipReason: Comment = "needs root to create network namespaces; run the suite as root (CI does)"
    nonisolated(unsafe) private static var counter = 0
    private static let lock = NSLock()

    let name: String
    let namespace: NetworkNamespace

    init() throws {
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

    /// A laptop: eth0 (10.20.0.57/24, default metric 100) and wifi0 (192.168.1.23/24, metric
    /// 600), each a veth whose peer stays in the namespace to give it carrier.
    func laptop() throws {
        for (dev, address, gateway, metric) in [("eth0", "10.20.0.57/24", "10.20.0.1", 100),
                                                ("wifi0", "192.168.1.23/24", "192.168.1.1", 600)] {
            try ip("link add \(dev) type veth peer name \(dev)-peer")
            try ip("link set \(dev)-peer up")
            try ip("link set \(dev) up")
            try ip("address add \(address) dev \(dev)")
            try ip("route add default via \(gateway) dev \(dev) metric \(metric)")
        }
    }

    /// Runs `ip -n NAME <arguments>`.
    func ip(_ arguments: String) throws {
        try Self.ip(["-n", name] + arguments.split(separator: " ").map(String.init))
    }

    /// Runs `ip -n NAME -batch FILE` with these lines.
    func batch(_ lines: [String]) throws {
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("\(name)-batch.txt")
        try lines.joined(separator: "\n").appending("\n").write(to: file, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(at: file) }
        try Self.ip(["-n", name, "-batch", file.path])
    }

    struct Failure: Error, CustomStringConvertible {
        var description: String
    }

    @discardableResult
    static func ip(_ arguments: [String]) throws -> String {
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

extension LiveMonitor {
    /// Collects events until `done` says so or `limit` passes; bounded in time and count.
    func events(within limit: Duration = .seconds(3), until done: ([MonitorEvent]) -> Bool) -> [MonitorEvent] {
        var seen: [MonitorEvent] = []
        let deadline = ContinuousClock.now + limit
        for _ in 0..<10_000 {
            let left = deadline - ContinuousClock.now
            guard left > .zero, !done(seen) else { break }
            seen += next(timeout: left)
        }
        return seen
    }
}

extension MonitorEvent {
    var paths: [Path]? {
        switch self {
        case .paths(let p, _): p
        case .resynced(_, let p): p
        default: nil
        }
    }
}
