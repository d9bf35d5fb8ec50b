import Topology
import ArgumentParser
import Glibc
import Basics
import PathMonitor
import Reconnector
import Synchronization

/// `agent record`: writes the kernel's routing messages into a scenario file.
struct RecordCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "record",
        abstract: "Record the kernel's rtnetlink messages into a scenario file that `agent replay` replays.",
        discussion: """
            Writes the initial dump and every later message as received (hex), each with its \
            CLOCK_MONOTONIC and CLOCK_BOOTTIME time. A suspend shows as a gap between the two clocks \
            and is written as a clock jump. Stops after --seconds, or on Ctrl-C or SIGTERM. Add an \
            'expect:' block by hand to make the recording a test.
            """)

    @Option(help: "The scenario file to write.")
    var out: String

    @OptionGroup var watch: WatchOptions

    @Option(help: "Name written into the scenario.")
    var name: String = "recorded"

    @Option(help: "Application traffic interval written into the scenario, e.g. 100ms.")
    var traffic: String = "100ms"

    func validate() throws {
        guard let endpoint = Endpoint(watch.server), endpoint.address != nil else {
            throw ValidationError("'--server' needs an IP address with an optional port for a recording, got \"\(watch.server)\"")
        }
    }

    func run() throws {
        guard let endpoint = Endpoint(watch.server), let address = endpoint.address else { throw ExitCode(2) }
        let namespace = try watch.namespace()
        var dump: [String] = []
        var timeline: [String] = []
        let start = SuspendDetector.clocks()
        var suspends = SuspendDetector(monotonic: start.monotonic, boottime: start.boottime)
        let monitor = try LiveMonitor(endpoint: address, namespace: namespace) { bytes, isDump in
            if isDump {
                dump.append(bytes.hexString)
                return
            }
            let now = SuspendDetector.clocks()
            if let slept = suspends.check(monotonic: now.monotonic, boottime: now.boottime) {
                timeline.append("  - {at: \(Self.seconds(now.boottime - start.boottime - slept)), clock-jump: \(Self.seconds(slept))}")
            }
            timeline.append("  - {at: \(Self.seconds(now.boottime - start.boottime)), monotonic: \(Self.decimal(now.monotonic)), "
                + "boottime: \(Self.decimal(now.boottime)), netlink: \(bytes.hexString)}")
        }
        // Stopped by a signal, the recording is written, not lost.
        StopRequest.install()
        let deadline = watch.seconds.map { ContinuousClock.now + .milliseconds(Int64($0 * 1000)) }
        var events = 0
        while !StopRequest.isSet, deadline.map({ ContinuousClock.now < $0 }) ?? true {
            events += monitor.next(timeout: .milliseconds(200)).count
        }
        var kinds: [String] = []
        for link in monitor.tracker.model.links.values.sorted(by: { $0.index < $1.index })
        where link.kind == .wifi || link.kind == .wwan {
            kinds.append("\(link.name): \(link.kind.rawValue)")
        }
        let host = SystemFiles.hostName() ?? ""
        let date = utcText(Int64(time(nil)), "%Y-%m-%d %H:%M:%S +0000")
        var text = """
            # Recorded by `agent record` on \(host)\(watch.netns.map { " in namespace \($0)" } ?? ""), \(date).
            name: "\(name.flatMap { $0 == "\\" || $0 == "\"" ? ["\\", $0] : [$0] }.map(String.init).joined())"
            about: >
              Raw rtnetlink messages from a live kernel, replayed through the same decoder.
            server: "\(endpoint)"
            traffic: \(traffic)

            """
        if !kinds.isEmpty { text += "link-kinds: {\(kinds.joined(separator: ", "))}\n" }
        text += "network:\n  netlink:\n" + dump.map { "    - \($0)\n" }.joined()
        text += "timeline:\n" + (timeline.isEmpty ? "  []\n" : timeline.joined(separator: "\n") + "\n")
        do {
            try SystemFiles.write(text, to: out)
        } catch {
            throw AgentError("the recording is not saved to \(out): \(error)")
        }
        writeStandardError("agent: recorded \(dump.count) dump buffers and \(timeline.count) timeline entries (\(events) changes) to \(out)\n")
    }

    private static func seconds(_ value: Duration) -> String {
        max(value, .zero).seconds(decimals: 3) + "s"
    }

    private static func decimal(_ value: Duration) -> String { value.seconds(decimals: 6) }
}

extension Collection<UInt8> {
    var hexString: String {
        let digits = Array("0123456789abcdef".utf8)
        var out = [UInt8]()
        out.reserveCapacity(count * 2)
        for b in self {
            out.append(digits[Int(b >> 4)])
            out.append(digits[Int(b & 0xF)])
        }
        return String(decoding: out, as: UTF8.self)
    }
}
