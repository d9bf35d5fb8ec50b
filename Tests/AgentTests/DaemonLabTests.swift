import Foundation
import Glibc
import NamespaceLab
import PathMonitor
import Testing
import Tunnel

/// The real `agent serve` and `agent up` processes in a laptop and a server namespace.
private final class DaemonLab {
    let laptop: NamespaceLab
    let server: NamespaceLab
    let directory: String
    private var processes: [Process] = []
    /// The `agent` binary, built beside the test bundle.
    static let agent = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().appendingPathComponent("agent")

    init(mode: String) throws {
        (laptop, server) = try NamespaceLab.laptopAndServer()
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("roam-daemon-\(getpid())-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let serverKey = try PrivateKey.generate()
        let clientKey = try PrivateKey.generate()
        try secret(serverKey.revealBase64(), "server.key")
        try secret(clientKey.revealBase64(), "client.key")
        try """
            listen-port: 51820
            private-key-file: \(directory)/server.key
            tunnel: {name: roam0, addresses: [10.77.0.1/24]}
            users:
              - {name: alice, public-key: \(clientKey.publicKey.base64), addresses: [10.77.0.2]}
            """.write(toFile: directory + "/server.yaml", atomically: true, encoding: .utf8)
        try """
            server: 198.51.100.7:51820
            server-key: \(serverKey.publicKey.base64)
            private-key-file: \(directory)/client.key
            mode: \(mode)
            \(mode == "split" ? "routes: [10.77.0.0/24]" : "")
            """.write(toFile: directory + "/client.yaml", atomically: true, encoding: .utf8)
    }

    deinit {
        for process in processes where process.isRunning { process.terminate() }
        for process in processes { process.waitUntilExit() }
        try? FileManager.default.removeItem(atPath: directory)
    }

    private func secret(_ text: String, _ name: String) throws {
        let path = directory + "/" + name
        try (text + "\n").write(toFile: path, atomically: false, encoding: .utf8)
        chmod(path, 0o600)
    }

    /// Starts the agent in `lab` with `arguments`; its log goes to `log` in the lab directory.
    @discardableResult
    func start(_ lab: NamespaceLab, _ arguments: [String], log: String) throws -> Process {
        let process = Process()
        process.executableURL = NamespaceLab.ipTool
        process.arguments = ["netns", "exec", lab.name, Self.agent.path] + arguments
        _ = FileManager.default.createFile(atPath: directory + "/" + log, contents: nil)
        process.standardError = FileHandle(forWritingAtPath: directory + "/" + log)
        process.standardOutput = FileHandle.nullDevice
        try process.run()
        processes.append(process)
        return process
    }

    /// Runs an agent command to completion (outside the namespaces: only the control socket is needed).
    func run(_ arguments: [String]) throws -> String {
        try NamespaceLab.capture(Self.agent, arguments).output
    }

    func log(_ name: String) -> String { (try? String(contentsOfFile: directory + "/" + name, encoding: .utf8)) ?? "" }

    /// Waits up to `seconds` for `name`'s log to contain `text`.
    func wait(for text: String, in name: String, seconds: Double = 5) -> Bool {
        for _ in 0..<Int(seconds * 50) {
            if log(name).contains(text) { return true }
            usleep(20_000)
        }
        return log(name).contains(text)
    }
}

@Suite(.enabled(if: NamespaceLab.isRoot, Comment(rawValue: NamespaceLab.skipReason)), .serialized)
struct DaemonLabTests {
    /// In split mode, and in full-tunnel mode, where the default route goes into the tunnel and
    /// other VPN clients lose their route to the server when an uplink goes.
    @Test(arguments: ["split", "full"])
    func theDaemonRoamsSleepsAndWakesWithTrafficFlowing(mode: String) throws {
        let lab = try DaemonLab(mode: mode)
        try lab.start(lab.server, ["serve", "--config", lab.directory + "/server.yaml"], log: "server.log")
        #expect(lab.wait(for: "serving", in: "server.log"))
        let control = lab.directory + "/agent.sock"
        let client = try lab.start(lab.laptop, ["up", "--config", lab.directory + "/client.yaml", "--control", control], log: "client.log")
        #expect(lab.wait(for: "tunnel up", in: "client.log"), "\(lab.log("client.log"))")

        // Datagrams every 20 ms through the tunnel while the laptop loses eth0.
        let sink = try UDPSocket(bindingTo: SocketAddress(IPAddress("10.77.0.1")!, port: 5006), namespace: lab.server.namespace)
        let source = try UDPSocket(bindingTo: SocketAddress(IPAddress("10.77.0.2")!, port: 0), namespace: lab.laptop.namespace)
        var buffer = [UInt8](repeating: 0, count: 64)
        var lastArrival = ContinuousClock.now
        var longestGap = Duration.zero
        var received = 0
        for tick in 0..<100 {  // 2 s
            if tick == 25 { try lab.laptop.ip("link set eth0 down") }
            _ = try [UInt8](repeating: 1, count: 16).withUnsafeBytes { try source.send($0, to: SocketAddress(IPAddress("10.77.0.1")!, port: 5006)) }
            while try buffer.withUnsafeMutableBytes({ try sink.receive(into: $0, timeout: .milliseconds(tick == 99 ? 200 : 20)) }) != nil {
                received += 1
                longestGap = max(longestGap, ContinuousClock.now - lastArrival)
                lastArrival = ContinuousClock.now
            }
        }
        let clientLog = lab.log("client.log")
        #expect(clientLog.contains("reason=pathLost(eth0) path=wifi0/192.168.1.23"), "\(clientLog)")
        #expect(received >= 95, "datagrams through the tunnel: \(received) of 100")
        #expect(longestGap < .milliseconds(200), "longest gap \(longestGap)")
        #expect(clientLog.components(separatedBy: "to=connecting").count == 2, "one handshake only, the first")

        // The operator's view and commands, over the control socket.
        let status = try lab.run(["status", "--json", "--control", control])
        #expect(status.contains("\"state\":\"connected\"") && status.contains("\"interface\":\"wifi0\""), "\(status)")
        #expect(status.contains("\"attempts\":2"), "the first handshake and one rebind: \(status)")
        _ = try lab.run(["reconnect", "--control", control])
        #expect(lab.wait(for: "reason=operatorRequest", in: "client.log"))

        // SIGHUP: the same tunnel with other tunables keeps the tunnel; a file with a mistake
        // changes nothing.
        let configuration = lab.directory + "/client.yaml"
        let original = try String(contentsOfFile: configuration, encoding: .utf8)
        try (original + "\nreconnect: {debounce: 80ms}\n").write(toFile: configuration, atomically: true, encoding: .utf8)
        kill(client.processIdentifier, SIGHUP)
        #expect(lab.wait(for: "msg=\"configuration reloaded\" tunnel=kept tunables=changed", in: "client.log"), "\(lab.log("client.log"))")
        try (original + "\nnot-a-key: 1\n").write(toFile: configuration, atomically: true, encoding: .utf8)
        kill(client.processIdentifier, SIGHUP)
        #expect(lab.wait(for: "configuration not reloaded", in: "client.log"))
        try original.write(toFile: configuration, atomically: true, encoding: .utf8)

        // Suspend and resume: the hook's signals.
        kill(client.processIdentifier, SIGTSTP)
        #expect(lab.wait(for: "to=sleeping", in: "client.log"))
        kill(client.processIdentifier, SIGCONT)
        #expect(lab.wait(for: "trigger=wake", in: "client.log"))

        // A clean stop takes the tunnel device with it.
        client.terminate()
        client.waitUntilExit()
        #expect(lab.wait(for: "msg=down", in: "client.log"))
        #expect((try? lab.laptop.ip("link show roam0")) == nil, "the TUN device is gone")
        #expect(try !lab.laptop.ip("rule show").contains("51820"), "and the full-tunnel rules with it")
        #expect(try lab.run(["status", "--control", control]).contains("the agent is not running"))
    }
}
