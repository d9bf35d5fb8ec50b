import Topology
public import Foundation
import Glibc
import Basics
public import Netlink

/// A throwaway network namespace for tests that need a real kernel, deleted (with every
/// device in it) on deinit, so a failing test leaves nothing behind.
public final class NamespaceLab {
    public static let isRoot = getuid() == 0
    public static let skipReason =
        "needs root to create network namespaces and TUN devices; run the suite as root (CI does)"
    nonisolated(unsafe) private static var counter = 0
    private static let lock = NSLock()

    public let name: String
    public let namespace: NetworkNamespace
    /// Made by this object, so deleted with it (not one adopted from elsewhere).
    private var owned = true

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

    /// A namespace someone else made (`ip netns add NAME`) and deletes.
    public init(adopting name: String) throws {
        self.name = name
        namespace = try NetworkNamespace(named: name)
        owned = false
    }

    deinit {
        guard owned else { return }
        _ = try? Self.ip(["netns", "del", name])
        try? FileManager.default.removeItem(atPath: "/etc/netns/\(name)")
    }

    /// Gives programs started with `ip netns exec` in this namespace their own /etc/hosts
    /// (`ip` bind-mounts /etc/netns/NAME/hosts over it). Written in place, so a program that is
    /// running already reads the new names on its next lookup.
    public func setHosts(_ text: String) throws { try setEtc("hosts", text) }

    /// The same for /etc/resolv.conf: which name servers programs in this namespace ask.
    public func setResolvConf(_ text: String) throws { try setEtc("resolv.conf", text) }

    /// The same for /etc/group: the groups programs in this namespace know.
    public func setGroups(_ text: String) throws { try setEtc("group", text) }

    private func setEtc(_ file: String, _ text: String) throws {
        let directory = "/etc/netns/\(name)"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        try text.write(toFile: directory + "/" + file, atomically: false, encoding: .utf8)
    }

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

    /// Runs `nft COMMAND` in this namespace (one command, its words split at blanks).
    public func nft(_ command: String) throws {
        let (status, output) = try Self.capture(Self.ipTool, ["netns", "exec", name, "nft"] + command.split(separator: " ").map(String.init))
        guard status == 0 else { throw Failure(description: "nft \(command): \(output)") }
    }

    /// `ss -tinmo` for the TCP sockets on `port` in this namespace: their queues, windows,
    /// memory and timers, for a stalled stream's failure message.
    public func socketState(port: UInt16) -> String {
        let filter = "( sport = :\(port) or dport = :\(port) )"
        guard let text = try? Self.capture(Self.ipTool, ["netns", "exec", name, "ss", "-tainmoH", filter]).output else { return "-" }
        return text.split(separator: "\n").map { $0.trimmingCharacters(in: .whitespaces) }.joined(separator: " | ")
    }

    /// The kernel's TCP counters in this namespace that say why segments were dropped or
    /// refused (PAWS, memory, checksums, windows), those not zero: what a stalled stream's
    /// failure message tells beside the sockets' own state.
    public func tcpDropCounters() -> String {
        var found: [String] = []
        for file in ["/proc/net/netstat", "/proc/net/snmp"] {
            guard let text = try? Self.capture(Self.ipTool, ["netns", "exec", name, "cat", file]).output else { continue }
            let lines = text.split(separator: "\n").map { $0.split(separator: " ") }
            for (names, values) in zip(lines, lines.dropFirst()) where names.first == values.first && names.count == values.count {
                for (key, value) in zip(names.dropFirst(), values.dropFirst()) where value != "0" {
                    let interesting = ["Drop", "PAWS", "Prune", "Collapse", "Csum", "Reject", "Challenge", "RcvQ", "ZeroWindow",
                                       "Backlog", "InErrs", "OFO", "DSACK"]
                    if interesting.contains(where: { key.contains($0) }) { found.append("\(names[0])\(key)=\(value)") }
                }
            }
        }
        return found.isEmpty ? "no drop counter above zero" : found.joined(separator: " ")
    }

    public struct Failure: Error, CustomStringConvertible {
        public var description: String
    }

    /// Where `ip` lives on this machine.
    public static let ipTool = URL(fileURLWithPath: FileManager.default.fileExists(atPath: "/usr/sbin/ip") ? "/usr/sbin/ip" : "/sbin/ip")

    /// Runs `executable` to completion; returns its exit status and what it printed on both streams.
    public static func capture(_ executable: URL, _ arguments: [String]) throws -> (status: Int32, output: String) {
        let process = Process()
        process.executableURL = executable
        process.arguments = arguments
        let output = Pipe()
        process.standardOutput = output
        process.standardError = output
        try process.run()
        let data = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return (process.terminationStatus, String(decoding: data, as: UTF8.self))
    }

    @discardableResult
    public static func ip(_ arguments: [String]) throws -> String {
        let (status, text) = try capture(ipTool, arguments)
        guard status == 0 else {
            throw Failure(description: "ip \(arguments.joined(separator: " ")): \(text)")
        }
        return text
    }
}

extension NamespaceLab {
    /// A laptop and a server: the laptop's `eth0` (10.20.0.57/24, fd00:20::57/64; default
    /// route metric 100) and `wifi0` (192.168.1.23/24; default metric 600) are veths whose
    /// peers `eth-l` (10.20.0.1, fd00:20::1) and `wifi-l` (192.168.1.1) sit in `server`, which
    /// also answers on 198.51.100.7 (on its loopback).
    public static func laptopAndServer() throws -> (laptop: NamespaceLab, server: NamespaceLab) {
        let laptop = try NamespaceLab()
        let server = try NamespaceLab()
        for (dev, peer, address, gateway, metric) in [("eth0", "eth-l", "10.20.0.57", "10.20.0.1", 100),
                                                      ("wifi0", "wifi-l", "192.168.1.23", "192.168.1.1", 600)] {
            try laptop.attach(to: server, device: dev, peer: peer, address: address, gateway: gateway, metric: metric)
        }
        try laptop.ip("address add fd00:20::57/64 dev eth0 nodad")
        try server.ip("address add fd00:20::1/64 dev eth-l nodad")
        try server.ip("address add 198.51.100.7/32 dev lo")
        return (laptop, server)
    }
}
