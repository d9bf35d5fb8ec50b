import Foundation
import Glibc
import NamespaceLab
import Reconnector
import Basics
import Tunnel
import Device

// Plays every roaming scenario on Roam and on wireguard-go, in full-tunnel and split mode, with
// a probe through the tunnel every 20 ms, and prints one row per run; then the idle Roam
// client's wakeups over a minute and its memory; then, for Roam, a gateway failover and a drain
// between two gateways. Needs root; run through bench/roaming.sh.
//
// Usage: RoamingBenchmark [--only roam|wireguard-go] [--mode full|split] [--scenario NAME]... [--idle SECONDS] [--logs] [--tcp] [--leaks]
//                         [--gateways-only] [--tcp]

var vpns = TunnelUnderTest.allCases
var modes: [LabRouting] = [.full, .split]
var scenarios = RoamingScenario.allCases
var idleSeconds = 60
var showLogs = false
var arguments = CommandLine.arguments.dropFirst()
var chosen: [RoamingScenario] = []
var gatewaysOnly = false
var withTCP = false
var withLeaks = false
while let argument = arguments.popFirst() {
    if argument == "--logs" {
        showLogs = true
        continue
    }
    if argument == "--tcp" {
        // A checked TCP stream through the tunnel in every scenario, as the tests run them.
        withTCP = true
        continue
    }
    if argument == "--leaks" {
        // The boot lockdown, applications sending outside the tunnel and a tap judging every
        // packet on the uplinks, as the tests run them.
        withLeaks = true
        continue
    }
    if argument == "--gateways-only" {
        gatewaysOnly = true
        continue
    }
    let value = arguments.popFirst() ?? ""
    switch argument {
    case "--only": vpns = TunnelUnderTest(rawValue: value).map { [$0] } ?? vpns
    case "--mode": modes = LabRouting(rawValue: value).map { [$0] } ?? modes
    case "--scenario":
        guard let s = RoamingScenario(rawValue: value) else {
            say("unknown scenario \(value); known: \(RoamingScenario.allCases.map(\.rawValue).joined(separator: ", "))")
            exit(2)
        }
        chosen.append(s)
    case "--idle": idleSeconds = Int(value) ?? idleSeconds
    default:
        say("usage: RoamingBenchmark [--only roam|wireguard-go] [--mode full|split] [--scenario NAME]... [--idle SECONDS] [--logs] [--tcp] [--leaks]")
        exit(2)
    }
}
if !chosen.isEmpty { scenarios = chosen }
guard NamespaceLab.isRoot else {
    say("RoamingBenchmark: \(NamespaceLab.skipReason)")
    exit(2)
}

func ms(_ d: Duration?) -> String {
    guard let d else { return "-" }
    return String(format: "%.0f", Double(d.nanoseconds) / 1e6)
}

if gatewaysOnly { scenarios = []; modes = [] }
if !scenarios.isEmpty {
    say("scenario            mode   vpn           outage_ms  lost/sent  handshakes  attempts  cpu_ms  moved_ms  on")
}
/// Client CPU per run, to tell what the flap storm itself costs beside the probe stream's own.
var cpuOf: [String: Duration] = [:]
for mode in modes {
    for scenario in scenarios {
        for vpn in vpns where vpn == .roam || !scenario.needsStream {
            do {
                // Behind an MTU black hole small probes pass: what tells is a TCP stream's big segments.
                let o = try scenario.run(vpn: vpn, routing: mode, tcp: withTCP || scenario == .mtuBlackHole,
                                          leaks: withLeaks && vpn == .roam)
                cpuOf["\(scenario.rawValue) \(mode.rawValue) \(vpn.rawValue)"] = o.cpu
                let row = [
                    scenario.rawValue.padding(toLength: 19, withPad: " ", startingAt: 0),
                    mode.rawValue.padding(toLength: 6, withPad: " ", startingAt: 0),
                    vpn.rawValue.padding(toLength: 13, withPad: " ", startingAt: 0),
                    ms(o.outage).leftPadded(9), "\(o.lostProbes)/\(o.sentProbes)".leftPadded(10),
                    "\(o.handshakes)".leftPadded(11), (o.attempts.map(String.init) ?? "-").leftPadded(9),
                    ms(o.cpu).leftPadded(7), ms(o.moved).leftPadded(9), " " + (o.interface ?? "-"),
                ]
                say(row.joined(separator: " ")
                      + (o.attemptsWhileOffline.map { "  (attempts while offline: \($0))" } ?? "")
                      + (o.adapted.map { "  (tunnel MTU \(o.tunnelMTU.map(String.init) ?? "-") after \(ms($0)) ms)" } ?? "")
                      + (o.tcp.map { "  (TCP up: \($0.received >> 20) of \($0.sent >> 20) MB\($0.intact && $0.failure == nil ? "" : ", broken: \($0.failure ?? "reordered")"))" } ?? "")
                      + (o.download.map { "  (TCP down: \($0.received >> 20) of \($0.sent >> 20) MB\($0.intact && $0.failure == nil ? "" : ", broken: \($0.failure ?? "reordered")"))" } ?? ""))
                if showLogs && vpn == .roam {
                    say(o.clientLog.split(separator: "\n").map { "    " + $0 }.joined(separator: "\n"))
                }
            } catch {
                say("\(scenario) \(mode) \(vpn): failed: \(error)")
            }
        }
    }
}

// The flap storm's CPU includes the probe stream's (50 echoes a second, each a wakeup of the
// client's threads on both ways); the steady run is that stream alone for the same 20 s.
for mode in modes {
    for vpn in vpns where vpn == .roam {  // wireguard-go loses half the stream in the storm: no baseline
        let key = "\(mode.rawValue) \(vpn.rawValue)"
        guard let storm = cpuOf["flap-storm " + key], let steady = cpuOf["steady " + key] else { continue }
        say("flap-storm \(key): client CPU \(ms(storm)) ms, the probe stream alone (steady) \(ms(steady)) ms: "
              + "\(ms(storm - steady)) ms for the storm itself")
    }
}

// Idle: a settled lab, no traffic, a stable path.
if vpns.contains(.roam) && !gatewaysOnly {
    for mode in modes {
        do {
            let lab = try RoamingLab(vpn: .roam, routing: mode)
            try lab.startServer()
            try lab.startClient()
            sleep(5)
            let before = lab.clientWakeups()
            let cpu = lab.clientCPU()
            sleep(UInt32(idleSeconds))
            let wakeups = lab.clientWakeups() - before
            let memory = lab.clientMemory()
            say("idle \(mode): \(wakeups) voluntary context switches in \(idleSeconds) s "
                  + "(\(String(format: "%.1f", Double(wakeups) * 60 / Double(idleSeconds)))/min), CPU \(ms(lab.clientCPU() - cpu)) ms, "
                  + "RSS \(memory.rss) kB (anonymous \(memory.anonymous) kB)")
        } catch {
            say("idle \(mode): failed: \(error)")
        }
    }
    // Idle on a network that drops UDP: the session on the stream, UDP re-tested on its schedule.
    do {
        let lab = try RoamingLab(vpn: .roam, routing: .full)
        try lab.configure("server", "tcp: 443")
        try lab.configure("client", "tcp: 443")
        for side in ["eth-l", "wifi-l"] {
            _ = try NamespaceLab.capture(NamespaceLab.ipTool, ["netns", "exec", lab.server.name, "nft", "add", "table", "inet", "block"])
            _ = try NamespaceLab.capture(NamespaceLab.ipTool, ["netns", "exec", lab.server.name, "nft", "add", "chain", "inet", "block", "in",
                                                               "{", "type", "filter", "hook", "prerouting", "priority", "-300", ";", "}"])
            _ = try NamespaceLab.capture(NamespaceLab.ipTool, ["netns", "exec", lab.server.name, "nft", "add", "rule", "inet", "block", "in",
                                                               "iifname", side, "udp", "dport", "\(lab.port)", "drop"])
        }
        try lab.startServer()
        try lab.startClient()
        sleep(5)
        let before = lab.clientWakeups()
        let cpu = lab.clientCPU()
        let retestsBefore = lab.log("client.log").components(separatedBy: "udpRetest(").count
        sleep(UInt32(idleSeconds))
        let wakeups = lab.clientWakeups() - before
        let retests = lab.log("client.log").components(separatedBy: "udpRetest(").count - retestsBefore
        // The schedule: the first re-test after `udp-retest`, each unanswered one doubling the wait
        // up to `udp-retest-cap` (defaults, mains power).
        var config = Config()
        config.stream = Config.StreamPolicy()
        var at = Duration.zero
        var perHour = 0
        while true {
            at += config.udpRetest(after: perHour, on: .ac)
            guard at <= .seconds(3600) else { break }
            perHour += 1
        }
        say("idle on the stream (UDP dropped): \(wakeups) voluntary context switches in \(idleSeconds) s "
              + "(\(String(format: "%.1f", Double(wakeups) * 60 / Double(idleSeconds)))/min), CPU \(ms(lab.clientCPU() - cpu)) ms, "
              + "\(retests) UDP re-tests in the window; the schedule makes \(perHour) in the first hour, then 6 an hour "
              + "(on \(lab.status()["path.transport"] ?? "-"))")
    } catch {
        say("idle on the stream: failed: \(error)")
    }
}

// Several gateways: two `agent serve` on one host, a client in split mode listing both, a probe
// every 20 ms. Failover: the gateway in use loses power (SIGKILL). Drain: it is stopped with a
// drain period (SIGTERM). wireguard-go has one endpoint per peer: nothing to fail over to.
if vpns.contains(.roam) && (chosen.isEmpty || gatewaysOnly) {
    say("gateways            kill     outage_ms  lost/sent  handshakes  moved_after_ms  old_gateway_gone_ms")
    for (name, signal) in [("failover", SIGKILL), ("drain", SIGTERM)] {
        do {
            let lab = try GatewayLab(clients: 1, gateways: 2, drainPeriod: signal == SIGTERM ? "10s" : "0")
            try lab.start()
            let probes = try ProbeStream(from: SocketAddress(lab.inner(0), port: 0), in: lab.laptops[0],
                                         to: SocketAddress(GatewayLab.serverInner, port: 5006), in: lab.server)
            usleep(1_000_000)
            let at = LabClock.now
            lab.signalGateway(0, signal)
            let marker = signal == SIGTERM ? "handedOver(gw0 -> gw1" : "serverUnreachable(gw0)"
            let moved = labWait(seconds: 10) {
                let log = lab.log("client0.log")
                return log.contains(marker) && log.split(separator: "\n").last { $0.contains("msg=transition") }?.contains("to=connected") == true
            }
            let movedAfter = LabClock.now - at
            _ = labWait(seconds: 12) { !lab.gatewayRuns(0) }
            let goneAfter = LabClock.now - at
            usleep(1_500_000)
            let end = LabClock.now - .milliseconds(300)
            let (lost, sent) = probes.lost(from: at, to: end)
            let outage = probes.outage(from: at, to: end)
            probes.stop()
            let handshakes = lab.log("client0.log").components(separatedBy: "msg=\"handshake").count - 1
            say([name.padding(toLength: 19, withPad: " ", startingAt: 0), (signal == SIGTERM ? "TERM" : "KILL").padding(toLength: 7, withPad: " ", startingAt: 0),
                 ms(outage).leftPadded(10), "\(lost)/\(sent)".leftPadded(10), "\(handshakes)".leftPadded(11),
                 (moved ? ms(movedAfter) : "never").leftPadded(15), ms(goneAfter).leftPadded(20)].joined(separator: " "))
            if showLogs { say(lab.log("client0.log").split(separator: "\n").map { "    " + $0 }.joined(separator: "\n")) }
        } catch {
            say("gateways \(name): failed: \(error)")
        }
    }
    say("wireguard-go: one endpoint per peer, no list of servers: no failover or drain to measure")
}

/// One line on standard output at once, unbuffered, so a pipe shows each row as it is measured.
func say(_ line: String) { writeAll(line + "\n", to: 1) }

extension String {
    func leftPadded(_ width: Int) -> String { String(repeating: " ", count: max(0, width - count)) + self }
}
