import Foundation
import Glibc

/// Waits up to `seconds` for `condition`, looking every 10 ms; true when it held.
public func labWait(seconds: Double, _ condition: () -> Bool) -> Bool {
    let deadline = LabClock.now + .milliseconds(Int64(seconds * 1000))
    while LabClock.now < deadline {
        if condition() { return true }
        usleep(10_000)
    }
    return condition()
}

/// Writes `text` and a newline to `path`, created owner-only (as the agent demands of keys and
/// of a server configuration) before anything is in it.
public func writeSecret(_ text: String, to path: String) throws {
    _ = FileManager.default.createFile(atPath: path, contents: nil, attributes: [.posixPermissions: 0o600])
    try (text + "\n").write(toFile: path, atomically: false, encoding: .utf8)
}

/// Starts `executable ARGUMENTS` inside `lab` (`ip netns exec`, which runs it in its own place,
/// so the process is the program's; `inside` runs it in turn and must do the same, as `exec`),
/// its output appended to the file at `log`.
func startInside(_ lab: NamespaceLab, _ executable: URL, _ arguments: [String], log: String,
                 environment: [String: String]? = nil, inside: [String] = []) throws -> Process {
    let process = Process()
    process.executableURL = NamespaceLab.ipTool
    process.arguments = ["netns", "exec", lab.name] + inside + [executable.path] + arguments
    if let environment { process.environment = environment }
    if !FileManager.default.fileExists(atPath: log) { _ = FileManager.default.createFile(atPath: log, contents: nil) }
    let handle = FileHandle(forWritingAtPath: log)
    handle?.seekToEndOfFile()
    process.standardError = handle
    process.standardOutput = handle
    try process.run()
    return process
}

/// Ends the processes a lab started: TERM, and KILL for any still running 5 s later.
func endAll(_ processes: [Process]) {
    for process in processes where process.isRunning { process.terminate() }
    for process in processes {
        let deadline = Date().addingTimeInterval(5)
        while process.isRunning && Date() < deadline { usleep(10_000) }
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
    }
}

extension NamespaceLab {
    /// Wires this namespace to `server` with a veth: `device` here with `address`/24, `peer` in
    /// `server` with `gateway`/24, both up; with `defaultRoute`, this namespace's default route
    /// goes via `gateway` (at `metric`, when given).
    public func attach(to server: NamespaceLab, device: String, peer: String, address: String, gateway: String,
                       defaultRoute: Bool = true, metric: Int? = nil) throws {
        try ip("link add \(device) type veth peer name \(peer) netns \(server.name)")
        try ip("address add \(address)/24 dev \(device)")
        try ip("link set \(device) up")
        try server.ip("address add \(gateway)/24 dev \(peer)")
        try server.ip("link set \(peer) up")
        if defaultRoute { try ip("route add default via \(gateway) dev \(device)" + (metric.map { " metric \($0)" } ?? "")) }
    }
}
