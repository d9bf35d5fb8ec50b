// Measures the live path monitor against a real kernel, in a network namespace of its own:
// change-to-event latency, dump and resync with 10,000 routes, and the idle `agent monitor`
// process's memory and wake-ups. Needs root.
//
// Usage: MonitorBenchmark [changes] [routes]
import Topology
import Foundation
import Glibc
import Basics
import PathMonitor
import Netlink

let arguments = CommandLine.arguments.dropFirst()
let changes = arguments.first.flatMap(Int.init) ?? 1000
let routeCount = arguments.dropFirst().first.flatMap(Int.init) ?? 10_000
guard getuid() == 0 else {
    print("MonitorBenchmark needs root to create a network namespace")
    exit(2)
}

func ip(_ args: [String]) {
    let p = Process()
    p.executableURL = URL(fileURLWithPath: FileManager.default.fileExists(atPath: "/usr/sbin/ip") ? "/usr/sbin/ip" : "/sbin/ip")
    p.arguments = args
    do { try p.run() } catch { print("cannot run ip: \(error)"); exit(1) }
    p.waitUntilExit()
}

let ns = "roam-bench-\(getpid())"
ip(["netns", "add", ns])
defer { ip(["netns", "del", ns]) }
ip(["-n", ns, "link", "set", "lo", "up"])
for (dev, address, gateway, metric) in [("eth0", "10.20.0.57/24", "10.20.0.1", "100"), ("wifi0", "192.168.1.23/24", "192.168.1.1", "600")] {
    ip(["-n", ns, "link", "add", dev, "type", "veth", "peer", "name", "\(dev)-peer"])
    ip(["-n", ns, "link", "set", "\(dev)-peer", "up"])
    ip(["-n", ns, "link", "set", dev, "up"])
    ip(["-n", ns, "address", "add", address, "dev", dev])
    ip(["-n", ns, "route", "add", "default", "via", gateway, "dev", dev, "metric", metric])
}

func ms(_ d: Duration) -> Double { Double(d.components.seconds) * 1000 + Double(d.components.attoseconds) / 1e15 }
func percentile(_ sorted: [Double], _ p: Double) -> Double { sorted[min(sorted.count - 1, Int(Double(sorted.count) * p))] }

let server = IPAddress("198.51.100.7")!
do {
    let namespace = try NetworkNamespace(named: ns)
    let monitor = try LiveMonitor(endpoint: server, namespace: namespace)
    let writer = try namespace.run { () throws(NetlinkError) in try NetlinkSocket() }
    guard let wifi = monitor.tracker.model.link(named: "wifi0") else { print("lab setup failed"); exit(1) }

    // 1. Latency: a host route to the server through wifi0 comes and goes; each change moves
    //    the path. Measured from just before the request to the path event.
    let host = Route(destination: Prefix("198.51.100.7/32")!, nextHops: [NextHop(gateway: IPAddress("192.168.1.1"), linkIndex: wifi.index)])
    var latencies: [Double] = []
    for i in 0..<changes {
        let start = ContinuousClock.now
        try writer.write(host, delete: i % 2 == 1)
        var moved = false
        for _ in 0..<100 where !moved {
            moved = monitor.next(timeout: .seconds(1)).contains { if case .paths = $0 { true } else { false } }
        }
        guard moved else { print("no path event for change \(i)"); exit(1) }
        latencies.append(ms(ContinuousClock.now - start))
    }
    latencies.sort()
    print(String(format: "change -> path event over %d changes: p50 %.3f ms, p99 %.3f ms, max %.3f ms",
                 changes, percentile(latencies, 0.5), percentile(latencies, 0.99), latencies.last ?? 0))

    // 2. Dump and resync with many routes.
    let batch = FileManager.default.temporaryDirectory.appendingPathComponent("\(ns).batch")
    try (0..<routeCount).map { "route add 10.\(100 + $0 / 250 / 250).\($0 / 250 % 250).\($0 % 250)/32 via 10.20.0.1 dev eth0" }
        .joined(separator: "\n").appending("\n").write(to: batch, atomically: true, encoding: .utf8)
    ip(["-n", ns, "-batch", batch.path])
    try? FileManager.default.removeItem(at: batch)
    var dumpBest = Double.infinity
    var routesSeen = 0
    for _ in 0..<5 {
        let start = ContinuousClock.now
        let fresh = try LiveMonitor(endpoint: server, namespace: namespace)
        dumpBest = min(dumpBest, ms(ContinuousClock.now - start))
        routesSeen = fresh.tracker.model.routes.count
    }
    print(String(format: "dump + model build with %d routes in the model: %.1f ms (best of 5)", routesSeen, dumpBest))
    var resyncBest = Double.infinity
    for _ in 0..<5 {
        let start = ContinuousClock.now
        _ = monitor.resync()
        resyncBest = min(resyncBest, ms(ContinuousClock.now - start))
    }
    print(String(format: "resync (dump + reconcile) with %d routes: %.1f ms (best of 5)", monitor.tracker.model.routes.count, resyncBest))
} catch {
    print("benchmark failed: \(error)")
    exit(1)
}

// 3. The real `agent monitor` process, idle on a stable network: memory and wake-ups.
let agent = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().appendingPathComponent("agent")
let process = Process()
process.executableURL = agent
process.arguments = ["monitor", "--netns", ns, "--seconds", "8"]
process.standardOutput = FileHandle.nullDevice
do { try process.run() } catch { print("cannot start \(agent.path): \(error)"); exit(1) }
func status(_ key: String) -> Int {
    let text = (try? String(contentsOfFile: "/proc/\(process.processIdentifier)/status", encoding: .utf8)) ?? ""
    let line = text.split(separator: "\n").first { $0.hasPrefix(key + ":") } ?? ""
    return Int(line.split(whereSeparator: { $0 == " " || $0 == "\t" }).dropFirst().first ?? "") ?? -1
}
Thread.sleep(forTimeInterval: 2)
let switchesBefore = status("voluntary_ctxt_switches")
Thread.sleep(forTimeInterval: 5)
let switchesAfter = status("voluntary_ctxt_switches")
let rss = status("VmRSS")
let anonymous = status("RssAnon")
process.waitUntilExit()
print("agent monitor idle: RSS \(rss) kB, of which private (RssAnon) \(anonymous) kB and the rest shared library pages; "
    + "\(switchesAfter - switchesBefore) voluntary context switches in 5 s")
