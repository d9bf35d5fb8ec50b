import Foundation
import Glibc
import NamespaceLab
import PathMonitor

// Plays every roaming scenario on Roam and on wireguard-go, in full-tunnel and split mode, with
// a probe through the tunnel every 20 ms, and prints one row per run; then the idle Roam
// client's wakeups over a minute and its memory. Needs root; run through bench/roaming.sh.
//
// Usage: RoamingBenchmark [--only roam|wireguard-go] [--mode full|split] [--scenario NAME]... [--idle SECONDS] [--logs]

var vpns = TunnelUnderTest.allCases
var modes: [LabRouting] = [.full, .split]
var scenarios = RoamingScenario.allCases
var idleSeconds = 60
var showLogs = false
var arguments = CommandLine.arguments.dropFirst()
var chosen: [RoamingScenario] = []
while let argument = arguments.popFirst() {
    if argument == "--logs" {
        showLogs = true
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
        say("usage: RoamingBenchmark [--only roam|wireguard-go] [--mode full|split] [--scenario NAME]... [--idle SECONDS] [--logs]")
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

say("scenario            mode   vpn           outage_ms  lost/sent  handshakes  attempts  cpu_ms  moved_ms  on")
/// Client CPU per run, to tell what the flap storm itself costs beside the probe stream's own.
var cpuOf: [String: Duration] = [:]
for mode in modes {
    for scenario in scenarios {
        for vpn in vpns {
            do {
                let o = try scenario.run(vpn: vpn, routing: mode, tcp: false)
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
                      + (o.attemptsWhileOffline.map { "  (attempts while offline: \($0))" } ?? ""))
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
if vpns.contains(.roam) {
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
}

/// One line on standard output at once, unbuffered, so a pipe shows each row as it is measured.
func say(_ line: String) { writeAll(line + "\n", to: 1) }

extension String {
    func leftPadded(_ width: Int) -> String { String(repeating: " ", count: max(0, width - count)) + self }
}
