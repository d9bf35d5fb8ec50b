import Topology
import Control
import ControlWire
import SystemDNS
import ArgumentParser
import Glibc
import Synchronization
import Basics
import PathMonitor
import Reconnector
import Netlink

/// `agent monitor`: the path monitor alone, printing what the tunnel's path does and why.
struct MonitorCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "monitor",
        abstract: "Watch the kernel's routing state and print the path to the server as it changes.",
        discussion: """
            One line per event: the initial paths, every change that moves the path (with the kernel \
            message that did), overrun resyncs, and whether the kernel's own route lookup agrees with \
            the model. --verbose also prints the changes that were ignored, and why.
            """)

    @OptionGroup var watch: WatchOptions

    @Option(help: "The tunnel's own interface, never a path.")
    var tunnel: String = "roam0"

    @Option(help: "Socket mark the tunnel's UDP socket will carry, for the kernel route lookup.")
    var mark: UInt32 = 0

    @Flag(help: "Print JSON objects instead of logfmt.")
    var json = false

    @Flag(name: .shortAndLong, help: "Also print changes that did not move the path.")
    var verbose = false

    func run() throws {
        let endpoint = try resolve(watch.server)
        let namespace = try watch.namespace()

        let start = ContinuousClock.now
        let out = LineWriter(json: json, start: start)
        let monitor: LiveMonitor
        do {
            monitor = try LiveMonitor(endpoint: endpoint, tunnelInterface: tunnel, namespace: namespace)
        } catch {
            throw AgentError("cannot watch the kernel's routes: \(error) (the monitor needs a Linux kernel with rtnetlink)")
        }
        out.write(["event": "start", "server": "\(endpoint)", "power": PowerSupply.current().rawValue,
                   "paths": describe(monitor.paths)])
        let clocks = SuspendDetector.clocks()
        var suspends = SuspendDetector(monotonic: clocks.monotonic, boottime: clocks.boottime)
        var disagreement: String?
        func crossCheck() {
            let kernel = try? monitor.kernelRoute(mark: mark)
            let hop = kernel?.nextHops.first
            let modelBest = monitor.paths.first
            let agrees = hop?.linkIndex == modelBest?.linkIndex
                && (kernel?.preferredSource == nil || kernel?.preferredSource == modelBest?.source)
            let kernelText = hop.map { h in
                (monitor.tracker.model.links[h.linkIndex]?.name ?? "if\(h.linkIndex)")
                    + (kernel?.preferredSource.map { "/\($0)" } ?? "")
            } ?? "unreachable"
            if agrees {
                disagreement = nil
            } else if disagreement != kernelText {
                disagreement = kernelText
                out.write(["event": "disagree", "kernel": kernelText,
                           "model": modelBest.map { "\($0.interface)/\($0.source)" } ?? "none"])
            }
        }
        crossCheck()
        // Stopped by a signal (Ctrl-C, `timeout`, a service manager), it still says so and
        // loses no line: stdout is line-buffered (see `Agent.main`).
        StopRequest.install()
        let deadline = watch.seconds.map { start + .milliseconds(Int64($0 * 1000)) }
        while !StopRequest.isSet, deadline.map({ ContinuousClock.now < $0 }) ?? true {
            let wait = deadline.map { $0 - ContinuousClock.now } ?? .seconds(3600)
            let events = monitor.next(timeout: max(wait, .milliseconds(1)))
            let now = SuspendDetector.clocks()
            if let slept = suspends.check(monotonic: now.monotonic, boottime: now.boottime) {
                out.write(["event": "resumed", "slept": slept.short, "power": PowerSupply.current().rawValue])
            }
            for event in events {
                switch event {
                case .paths(let paths, let after, _):
                    out.write(["event": "paths", "best": paths.first.map { "\($0.interface)/\($0.source)" } ?? "none",
                               "paths": describe(paths), "after": after])
                    crossCheck()
                case .ignored(let change, let why, _):
                    if verbose { out.write(["event": "ignored", "change": change, "why": why]) }
                case .resynced(let changes, let paths):
                    out.write(["event": "resync", "changes": "\(changes.count)", "paths": describe(paths ?? monitor.paths),
                               "resyncs": "\(monitor.resyncs)"])
                    crossCheck()
                case .reopened(let error):
                    out.write(["event": "reopened", "error": "\(error)"])
                case .routing(let notices):
                    if verbose {
                        for notice in notices {
                            out.write(["event": notice.removed ? "removed" : "added", "what": "\(notice.subject)", "by": "\(notice.sender)"])
                        }
                    }
                }
            }
        }
        let d = monitor.decoder
        out.write(["event": "stop", "resyncs": "\(monitor.resyncs)", "skipped": "\(d.skipped)", "malformed": "\(d.malformed)"])
    }

    private func describe(_ paths: [Path]) -> String {
        paths.isEmpty ? "none" : paths.map(\.description).joined(separator: "; ")
    }
}

/// SIGINT or SIGTERM asking a command that runs until stopped (`monitor`, `record`) to end the
/// way it ends on its own: the last line written, the recording saved.
enum StopRequest {
    private static let flag = Atomic<Bool>(false)

    /// Whether a stop was asked for.
    static var isSet: Bool { flag.load(ordering: .relaxed) }

    /// Sets the handlers, and lets the signals through even when the process was started with
    /// them blocked (a parent's mask is inherited). The flag is made here, not first in a
    /// handler: a handler must not run a lazy initialiser (one did, and the process spun).
    static func install() {
        _ = flag.load(ordering: .relaxed)
        signal(SIGINT) { _ in StopRequest.flag.store(true, ordering: .relaxed) }
        signal(SIGTERM) { _ in StopRequest.flag.store(true, ordering: .relaxed) }
        var set = sigset_t()
        sigemptyset(&set)
        sigaddset(&set, SIGINT)
        sigaddset(&set, SIGTERM)
        pthread_sigmask(SIG_UNBLOCK, &set, nil)
    }
}

/// What the path-watching commands share: which server, which namespace, for how long.
struct WatchOptions: ParsableArguments {
    @Option(help: "The server endpoint whose path is watched (address or host, optional port).")
    var server: String = "198.51.100.7:51820"

    @Option(help: "Watch this network namespace (from `ip netns`) instead of the agent's own.")
    var netns: String?

    @Option(help: "Stop after this many seconds (default: run until interrupted).")
    var seconds: Double?

    func validate() throws {
        if let seconds, seconds <= 0 { throw ValidationError("'--seconds' must be more than zero") }
    }

    func namespace() throws -> NetworkNamespace? {
        do {
            return try netns.map { name throws(NetlinkError) in try NetworkNamespace(named: name) }
        } catch {
            throw AgentError("\(error) (list namespaces with `ip netns`)")
        }
    }
}

/// Resolves `--server` text to an address: literal addresses as they are, hosts through the resolver.
func resolve(_ text: String) throws -> IPAddress {
    guard let endpoint = Endpoint(text) else {
        throw ValidationError("'--server' needs host[:port], got \"\(text)\"")
    }
    do { return try Resolver.addresses(of: endpoint.host)[0] } catch { throw AgentError("\(error)") }
}

/// Writes one event per line, logfmt or JSON, with seconds since start, flushed at once.
struct LineWriter {
    var json: Bool
    var start: ContinuousClock.Instant

    func write(_ fields: KeyValuePairs<String, String>) {
        let t = Instant(nanoseconds: (ContinuousClock.now - start).nanoseconds).description
        let all = [("t", t)] + fields.map { ($0.key, $0.value) }
        let line = (json ? LogLine.json(all) : LogLine.logfmt(all)) + "\n"
        print(line, terminator: "")
    }
}
