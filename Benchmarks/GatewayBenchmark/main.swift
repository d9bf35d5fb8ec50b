import Foundation
import Glibc
import NamespaceLab
import Basics

// Several clients through one gateway at once: N real `agent up` processes (default 4), each in
// a namespace of its own, run one iperf3 TCP stream each through one `agent serve`, upload then
// download, for `--seconds` each; then the same through Debian's wireguard-go (a server with one
// peer per client, on the same namespaces), and over the raw veths (the ceiling). Prints the
// aggregate and each client's rate, and the VPN server's CPU. Needs root, iperf3 and
// wireguard-go; run through bench/gateway.sh.
//
// Usage: GatewayBenchmark [--clients 4] [--seconds 10] [--txqueuelen N (the server TUN's, to try another)]

var clients = 4
var seconds = 10
var txQueue: Int?
var arguments = CommandLine.arguments.dropFirst()
while let argument = arguments.popFirst() {
    let value = arguments.popFirst() ?? ""
    switch argument {
    case "--clients": clients = Int(value) ?? clients
    case "--seconds": seconds = Int(value) ?? seconds
    case "--txqueuelen": txQueue = Int(value)
    default:
        say("usage: GatewayBenchmark [--clients 4] [--seconds 10]")
        exit(2)
    }
}
guard NamespaceLab.isRoot else {
    say("GatewayBenchmark: \(NamespaceLab.skipReason)")
    exit(2)
}

func say(_ line: String) { FileHandle.standardError.write(Data((line + "\n").utf8)) }

struct Failure: Error, CustomStringConvertible {
    var description: String
}

/// Starts `iperf3 ARGUMENTS` in `lab`; its output goes to `path`.
func iperf(in lab: NamespaceLab, _ arguments: [String], output path: String) throws -> Process {
    let process = Process()
    process.executableURL = NamespaceLab.ipTool
    process.arguments = ["netns", "exec", lab.name, "iperf3"] + arguments
    _ = FileManager.default.createFile(atPath: path, contents: nil)
    let handle = FileHandle(forWritingAtPath: path)
    process.standardOutput = handle
    process.standardError = handle
    try process.run()
    return process
}

/// Runs a command to its end; throws with its output when it fails.
@discardableResult
func shell(_ command: String) throws -> String {
    let (status, output) = try NamespaceLab.capture(URL(fileURLWithPath: "/bin/sh"), ["-c", command])
    guard status == 0 else { throw Failure(description: "\(command): \(output)") }
    return output.trimmingCharacters(in: .whitespacesAndNewlines)
}

/// wireguard-go on the same namespaces: a server interface with one peer per client, a client
/// interface in each laptop (10.88.0.1 and 10.88.0.(10+N), port 51821). Returns the server's
/// process, and every process started, to end.
func startWireGuard(_ lab: GatewayLab) throws -> (server: Process, all: [Process]) {
    let tag = getpid() % 100_000
    var all: [Process] = []
    func run(in ns: NamespaceLab, _ name: String) throws -> Process {
        let process = Process()
        process.executableURL = NamespaceLab.ipTool
        process.arguments = ["netns", "exec", ns.name, "/usr/bin/wireguard-go", "-f", name]
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        all.append(process)
        for _ in 0..<500 where access("/run/wireguard/\(name).sock", F_OK) != 0 { usleep(10_000) }
        return process
    }
    func key(_ name: String) throws -> (file: String, publicKey: String) {
        let file = lab.directory + "/\(name).key"
        try shell("umask 077; wg genkey > \(file)")
        return (file, try shell("wg pubkey < \(file)"))
    }
    let serverName = "wgs\(tag)"
    let server = try run(in: lab.server, serverName)
    let serverKey = try key(serverName)
    try shell("ip netns exec \(lab.server.name) wg set \(serverName) listen-port 51821 private-key \(serverKey.file)")
    try shell("ip -n \(lab.server.name) address add 10.88.0.1/24 dev \(serverName); ip -n \(lab.server.name) link set \(serverName) up")
    for (n, laptop) in lab.laptops.enumerated() {
        let name = "wgl\(tag)x\(n)"
        _ = try run(in: laptop, name)
        let clientKey = try key(name)
        try shell("ip netns exec \(lab.server.name) wg set \(serverName) peer \(clientKey.publicKey) allowed-ips 10.88.0.\(10 + n)/32")
        try shell("ip netns exec \(laptop.name) wg set \(name) private-key \(clientKey.file) peer \(serverKey.publicKey) endpoint 198.51.100.7:51821 allowed-ips 10.88.0.0/24")
        try shell("ip -n \(laptop.name) address add 10.88.0.\(10 + n)/24 dev \(name); ip -n \(laptop.name) link set \(name) up")
    }
    return (server, all)
}

/// Bits per second an iperf3 --json client report received.
func received(_ path: String) -> Double? {
    guard let data = FileManager.default.contents(atPath: path),
          let json = try? JSONSerialization.jsonObject(with: data) as? [String: Any],
          let end = json["end"] as? [String: Any], let sum = end["sum_received"] as? [String: Any]
    else { return nil }
    return sum["bits_per_second"] as? Double
}

/// One stream per client at once toward `target(n)`; returns each client's Mbit/s and the
/// server agent's CPU share over the run.
func run(_ lab: GatewayLab, seconds: Int, reverse: Bool, target: (Int) -> String, serverPID: Int32?) throws -> ([Double], Double, Int) {
    let droppedBefore = tunDropped(lab)
    let cpuBefore = serverPID.map(RoamingLab.cpu(of:)) ?? .zero
    let start = LabClock.now
    var processes: [Process] = []
    for (n, laptop) in lab.laptops.enumerated() {
        processes.append(try iperf(in: laptop, ["-c", target(n), "-p", "\(5201 + n)", "-t", "\(seconds)", "--json"] + (reverse ? ["-R"] : []),
                                   output: lab.directory + "/iperf\(n).json"))
    }
    for process in processes { process.waitUntilExit() }
    let elapsed = LabClock.now - start
    let cpu = (serverPID.map(RoamingLab.cpu(of:)) ?? .zero) - cpuBefore
    let rates = (0..<lab.laptops.count).map { (received(lab.directory + "/iperf\($0).json") ?? 0) / 1e6 }
    return (rates, Double(cpu.nanoseconds) / Double(elapsed.nanoseconds) * 100, tunDropped(lab) - droppedBefore)
}

/// Packets the server's TUN device dropped on the way to the agent (its transmit queue was full).
func tunDropped(_ lab: GatewayLab) -> Int {
    let text = (try? NamespaceLab.capture(NamespaceLab.ipTool, ["netns", "exec", lab.server.name, "cat", "/sys/class/net/roam0/statistics/tx_dropped"]).output) ?? ""
    return Int(text.trimmingCharacters(in: .whitespacesAndNewlines)) ?? 0
}

let lab = try GatewayLab(clients: clients)
var servers: [Process] = []
for n in 0..<clients {
    servers.append(try iperf(in: lab.server, ["-s", "-p", "\(5201 + n)"], output: lab.directory + "/iperf-server\(n).log"))
}
defer { for s in servers { s.terminate() } }
try lab.start()
if let txQueue { try lab.server.ip("link set roam0 txqueuelen \(txQueue)") }
usleep(300_000)
let pid = lab.serverPID

say("\(clients) clients, one TCP stream each, \(seconds) s per direction, \(ProcessInfo.processInfo.activeProcessorCount) cores shared by everything")
let wireguard = try startWireGuard(lab)
defer {
    for process in wireguard.all where process.isRunning { process.terminate() }
    for process in wireguard.all { process.waitUntilExit() }
}
say("path          direction  aggregate_Mbit/s  per_client_Mbit/s           server_cpu_%  tun_tx_dropped")
let paths: [(String, (Int) -> String, Int32?)] = [
    ("roam", { _ in "10.77.0.1" }, pid),
    ("wireguard-go", { _ in "10.88.0.1" }, wireguard.server.processIdentifier),
    ("raw", { n in "10.60.\(n).1" }, nil),
]
for (name, target, serverPID) in paths {
    for reverse in [false, true] {
        let (rates, cpu, dropped) = try run(lab, seconds: seconds, reverse: reverse, target: target, serverPID: serverPID)
        let each = rates.map { String(format: "%.0f", $0) }.joined(separator: " ")
        say(name.padding(toLength: 14, withPad: " ", startingAt: 0) + (reverse ? "down" : "up").padding(toLength: 11, withPad: " ", startingAt: 0)
            + String(format: "%16.0f  ", rates.reduce(0, +)) + each.padding(toLength: 28, withPad: " ", startingAt: 0)
            + (serverPID == nil ? "-" : String(format: "%-14.0f", cpu) + (name == "roam" ? "\(dropped)" : "-")))
    }
}
