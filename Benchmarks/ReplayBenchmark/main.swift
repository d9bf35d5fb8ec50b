// Measures the decision core: a generated 24-hour timeline with one event per second,
// replayed through the agent's whole core (its network model, the server's addresses and the
// Reconnector).
//
// Usage: swift run -c release ReplayBenchmark [hours] [seed]
import Topology
import Foundation
import Basics
import PathMonitor
import Reconnector
import Replay

let arguments = CommandLine.arguments.dropFirst()
let hours = arguments.first.flatMap(Int.init) ?? 24
let seed = arguments.dropFirst().first.flatMap(UInt64.init) ?? 1
let events = hours * 3600

func timed<T>(_ body: () throws -> T) rethrows -> (T, seconds: Double) {
    let start = ContinuousClock.now
    let value = try body()
    let elapsed = ContinuousClock.now - start
    return (value, Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18)
}

let scenario = Scenario.random(seed: seed, events: events, spacing: .seconds(1), clockJumps: false,
                               name: "\(hours)h")
print("timeline: \(hours) h, \(scenario.timeline.count) timeline events, seed \(seed)")

// 1. The whole replay: world simulation, application traffic every 500 ms, invariant checks.
var replay = Replay(scenario, keepTrace: true)
let (report, full) = try timed { try replay.run() }
let fed = report.inputs
print(String(format: "full replay:  %.3f s wall, %d events (%d network changes), %.0f facts/s, %d transitions, %d violations",
             full, report.inputs, report.networkChanges, Double(fed) / full, report.transitions.count,
             report.violations.count))
for violation in report.violations.prefix(5) { print("  violation: \(violation)") }

// 2. The core alone: the same events through the agent's whole core (its network model too), nothing else.
let trace = report.trace
var sink = 0
var best = Double.infinity
for _ in 0..<5 {
    let (_, t) = timed {
        var model = NetworkModel(tunnelInterface: scenario.tunnelInterface)
        for event in scenario.network {
            if case .change(let change) = event.event { model.apply(change) }
        }
        var core = AgentCore(Reconnector(config: scenario.config, power: scenario.power, seed: scenario.seed,
                                         servers: scenario.gateways),
                             startupWait: scenario.waitForServer, model: model,
                             servers: scenario.gateways.map { _ in ServerBook.Entry(named: true, addresses: scenario.serverAddresses) })
        for (at, event) in trace { sink &+= core.handle(event, now: at).count }
    }
    best = min(best, t)
}
print(String(format: "core only:    %.3f s wall (best of 5) for %d facts: %.2f M facts/s (%d effects)",
             best, trace.count, Double(trace.count) / best / 1e6, sink / 5))
