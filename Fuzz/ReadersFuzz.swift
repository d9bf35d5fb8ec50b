import Basics
import ConfigReader
import PathMonitor
import Reconnector
import Replay

/// libFuzzer's entry: every input is a file a user might hand the agent. It is read as a scenario
/// (the YAML reader, the scenario grammar, the `config` section the client's `reconnect` section
/// shares), and a scenario that reads is replayed for a bounded stretch. Nothing may crash, hang
/// or take unbounded memory; errors are the expected outcome for most inputs.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOne(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let text = String(decoding: UnsafeBufferPointer(start: data, count: size), as: UTF8.self)
    guard var scenario = try? Scenario.parse(text, file: "fuzz.yaml") else { return 0 }
    // A replay runs as long as its timeline says: keep each input's share of the time small.
    scenario.until = min(scenario.until, Instant.zero + .seconds(600))
    scenario.timeline = scenario.timeline.filter { $0.at <= scenario.until }
    if let every = scenario.traffic, every < .milliseconds(10) { scenario.traffic = .milliseconds(10) }
    var replay = Replay(scenario)
    _ = try? replay.run()
    _ = Reconnector.Memory(text: text)
    return 0
}
