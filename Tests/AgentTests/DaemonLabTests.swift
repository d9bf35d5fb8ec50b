import Foundation
import Glibc
import NamespaceLab
import Basics
import Testing
import Tunnel
import Device

@Suite(.enabled(if: NamespaceLab.isRoot, Comment(rawValue: NamespaceLab.skipReason)), .serialized)
struct DaemonLabTests {
    /// In split mode, and in full-tunnel mode, where the default route goes into the tunnel and
    /// other VPN clients lose their route to the server when an uplink goes.
    @Test(arguments: ["split", "full"])
    func theDaemonRoamsSleepsAndWakesWithTrafficFlowing(mode: String) throws {
        let lab = try RoamingLab(vpn: .roam, routing: LabRouting(rawValue: mode)!)
        try lab.startServer()
        try lab.startClient()
        let client = try #require(lab.client)

        // Datagrams every 20 ms through the tunnel, echoed back, while the laptop loses eth0.
        let probes = try ProbeStream(from: SocketAddress(lab.clientInner, port: 0), in: lab.laptop,
                                     to: SocketAddress(lab.serverInner, port: 5006), in: lab.server)
        defer { probes.stop() }
        let start = LabClock.now
        usleep(500_000)
        try lab.laptop.ip("link set eth0 down")
        usleep(1_500_000)
        let end = LabClock.now
        let (lost, sent) = probes.lost(from: start, to: end - .milliseconds(200))
        let longestGap = probes.outage(from: start, to: end)
        let clientLog = lab.log("client.log")
        #expect(clientLog.contains("reason=pathLost(eth0) path=wifi0/192.168.1.23"), "\(clientLog)")
        #expect(sent >= 80 && lost * 20 <= sent, "datagrams through the tunnel: \(sent - lost) of \(sent) came back")
        #expect(longestGap < .milliseconds(200), "longest gap \(longestGap)")
        #expect(clientLog.components(separatedBy: "to=connecting").count == 2, "one handshake only, the first")

        // A second agent on the same control socket is refused and leaves the first one alone.
        let second = try lab.runAgent(["up", "--config", lab.directory + "/client.yaml", "--control", lab.controlSocket])
        #expect(second.status == 1 && second.output.contains("an agent is running already"), "\(second.output)")
        // Another profile on its own socket: the lockdown (and in full mode the default route) is the first one's.
        let third = try lab.runAgent(["up", "--config", lab.directory + "/client.yaml", "--control", lab.directory + "/other.sock"])
        #expect(third.status == 1 && third.output.contains("is held by the agent running \(lab.directory)/client.yaml"), "\(third.output)")
        #expect(try lab.laptop.ip("link show roam0").contains("roam0"), "and the first one's tunnel is untouched")

        // The operator's view and commands, over the control socket.
        let status = lab.status()
        #expect(status["state"] == "connected" && status["path.interface"] == "wifi0", "\(status)")
        #expect(status["lockdown.enabled"] == "1" && status["lockdown.blocked.out"] != nil, "\(status)")
        #expect(status["attempts"] == "2", "the first handshake and one rebind: \(status)")
        #expect(status["rtt_ms"].flatMap(Double.init).map { $0 > 0 } == true, "a number of milliseconds: \(status)")
        // A watcher hears every change as it happens, typed.
        let watchLog = lab.directory + "/watch.log"
        _ = FileManager.default.createFile(atPath: watchLog, contents: nil)
        let watcher = Process()
        watcher.executableURL = RoamingLab.builtAgent
        watcher.arguments = ["status", "--watch", "--json", "--control", lab.controlSocket]
        watcher.standardOutput = try FileHandle(forWritingTo: URL(fileURLWithPath: watchLog))
        try watcher.run()
        defer { if watcher.isRunning { watcher.terminate() } }
        #expect(lab.waitFor(seconds: 5) { lab.log("watch.log").contains("\"event\":\"status\"") }, "\(lab.log("watch.log"))")

        _ = try lab.control("reconnect")
        #expect(lab.wait(for: "reason=operatorRequest", in: "client.log"))

        // Down: the session ends with a goodbye, the tunnel device stays, nothing is tried until up.
        let goodbyes = { lab.log("server.log").components(separatedBy: "msg=\"session closed by the client\" user=alice").count - 1 }
        #expect(try lab.control("down").contains("down"))
        #expect(lab.wait(for: "to=paused", in: "client.log"))
        #expect(lab.waitFor(seconds: 5) { goodbyes() == 1 }, "the server heard goodbye: \(lab.log("server.log"))")
        #expect(lab.status()["state"] == "paused")
        #expect((try? lab.laptop.ip("link show roam0")) != nil, "the TUN device stays while down")
        try lab.laptop.ip("link set eth0 up")
        usleep(1_000_000)
        #expect(lab.status()["state"] == "paused", "a new uplink does not bring it up")
        #expect(try lab.control("up").contains("connecting"))
        #expect(lab.waitFor(seconds: 5) { lab.status()["state"] == "connected" }, "\(lab.log("client.log"))")
        #expect(lab.waitFor(seconds: 5) {
            let stream = lab.log("watch.log")
            return stream.contains("\"to\":\"paused\"") && stream.contains("\"trigger\":\"operator-up\"")
        }, "\(lab.log("watch.log"))")
        let lines = lab.log("watch.log").split(separator: "\n")
        #expect(lines.allSatisfy { $0.hasPrefix("{\"version\":1,\"event\":") }, "every line a versioned event")

        // SIGHUP: the same tunnel with other tunables keeps the tunnel; a file with a mistake
        // changes nothing.
        let configuration = lab.directory + "/client.yaml"
        let original = try String(contentsOfFile: configuration, encoding: .utf8)
        try (original + "\nreconnect: {debounce: 80ms}\n").write(toFile: configuration, atomically: true, encoding: .utf8)
        kill(client.processIdentifier, SIGHUP)
        #expect(lab.wait(for: "msg=\"configuration reloaded\" tunables=reconnect tunnel=kept", in: "client.log"), "\(lab.log("client.log"))")
        try (original + "\nnot-a-key: 1\n").write(toFile: configuration, atomically: true, encoding: .utf8)
        kill(client.processIdentifier, SIGHUP)
        #expect(lab.wait(for: "configuration not reloaded", in: "client.log"))
        // A change to the tunnel starts the agent afresh in the same process: it comes back up
        // with the lockdown and its guard, which nothing of the agent before holds any more.
        try (original + "\ntcp: 443\n").write(toFile: configuration, atomically: true, encoding: .utf8)
        kill(client.processIdentifier, SIGHUP)
        #expect(lab.wait(for: "the tunnel itself changed; restarting", in: "client.log"))
        #expect(lab.waitFor(seconds: 20) {
            lab.log("client.log").components(separatedBy: "restarting").last?.contains("from=connecting to=connected") == true
        }, "connected again after the restart: \(lab.log("client.log"))")
        let guarded = lab.nftTables()
        #expect(guarded.contains("table inet roam\n") && guarded.contains("table inet roam_guard"), "\(guarded)")
        try original.write(toFile: configuration, atomically: true, encoding: .utf8)

        // Suspend and resume: the hook's signals.
        kill(client.processIdentifier, SIGTSTP)
        #expect(lab.wait(for: "to=sleeping", in: "client.log"), "\(lab.log("client.log"))")
        kill(client.processIdentifier, SIGCONT)
        #expect(lab.wait(for: "trigger=wake", in: "client.log"))

        // The operator's stop takes the tunnel device with it, and opens the machine.
        let said = try lab.stopClient()
        #expect(said.contains("stopping: the lockdown and the tunnel's resolvers go"), "\(said)")
        #expect(lab.wait(for: "msg=down", in: "client.log"))
        // (The third: the agent before the restart closed its session too.)
        #expect(lab.waitFor(seconds: 5) { goodbyes() == 3 }, "the client said goodbye: \(lab.log("server.log")) CLIENT \(lab.log("client.log"))")
        // The watcher hears that the agent stopped, and ends.
        #expect(lab.waitFor(seconds: 5) { !watcher.isRunning } && lab.log("watch.log").contains("\"event\":\"stopped\""))
        #expect((try? lab.laptop.ip("link show roam0")) == nil, "the TUN device is gone")
        #expect(try !lab.laptop.ip("rule show").contains("51820"), "and the full-tunnel rules with it")
        let tables = try NamespaceLab.capture(NamespaceLab.ipTool, ["netns", "exec", lab.laptop.name, "nft", "list", "tables"]).output
        #expect(!tables.contains("table inet roam"), "an operator's stop takes the lockdown away: \(tables)")
        #expect(try lab.control("status").contains("the agent is not running"))
    }

    /// A server named by host: its name moves to another address of the server (the old one
    /// goes away) with nothing changing on the laptop. Attempts that fail make the agent ask the
    /// name again, and the session follows to the new address without a handshake.
    @Test func followsTheServersNameToANewAddress() throws {
        let lab = try RoamingLab(vpn: .roam, routing: .full)
        try lab.server.ip("address add 198.51.100.8/32 dev lo")
        try lab.laptop.setHosts("198.51.100.7 vpn.roam.test\n")
        try nameTheServer(in: lab)
        try lab.startServer()
        try lab.startClient()
        #expect(lab.log("client.log").contains("server=198.51.100.7:51820"))
        let probes = try ProbeStream(from: SocketAddress(lab.clientInner, port: 0), in: lab.laptop,
                                     to: SocketAddress(lab.serverInner, port: 5007), in: lab.server)
        defer { probes.stop() }
        usleep(300_000)

        try lab.laptop.setHosts("198.51.100.8 vpn.roam.test\n")
        try lab.server.ip("address del 198.51.100.7/32 dev lo")
        let moved = LabClock.now
        #expect(lab.wait(for: "msg=\"server address changed\" from=198.51.100.7:51820 to=198.51.100.8:51820 server=vpn.roam.test",
                         in: "client.log", seconds: 10), "\(lab.log("client.log"))")
        usleep(1_000_000)
        let end = LabClock.now
        let (lost, sent) = probes.lost(from: end - .milliseconds(800), to: end - .milliseconds(200))
        #expect(sent > 20 && lost == 0, "traffic flows to the new address: \(sent - lost) of \(sent)")
        #expect(probes.outage(from: moved, to: end) < .seconds(8), "outage \(probes.outage(from: moved, to: end))")
        #expect(lab.log("client.log").components(separatedBy: "to=connecting").count == 2, "one handshake only, the first")
    }

    /// Connected and idle on a stable path, the daemon sleeps: no timer, no probe, no spin, also
    /// once the start-up's wait for the server has run out.
    @Test func anIdleTunnelCostsNoCPU() throws {
        let lab = try RoamingLab(vpn: .roam, routing: .full)
        try lab.startServer()
        try lab.startClient(["--wait-for-server", "1s"])
        usleep(1_200_000)
        let (cpu, wakeups) = (lab.clientCPU(), lab.clientWakeups())
        usleep(2_000_000)
        #expect(lab.clientCPU() - cpu < .milliseconds(50), "CPU while idle: \(lab.clientCPU() - cpu)")
        #expect(lab.clientWakeups() - wakeups <= 2, "wakeups while idle: \(lab.clientWakeups() - wakeups)")
        let status = lab.status()
        #expect(status["state"] == "connected")
        // What the desktop shows besides: the profile it runs, and no Wi-Fi name on a cable.
        #expect(status["profile.name"] == "client" && status["profile.file"] == lab.directory + "/client.yaml", "\(status)")
        #expect(status["ssid"] == "none" && status["profiles"] != nil, "\(status)")
    }

    /// At boot the server's name may not resolve yet (no name server reachable): the agent
    /// asks again until it does, then comes up, with nothing set up meanwhile.
    @Test func waitsForTheServersNameToResolve() throws {
        let lab = try RoamingLab(vpn: .roam, routing: .full)
        try lab.laptop.setHosts("127.0.0.1 localhost\n")
        try lab.laptop.setResolvConf("nameserver 127.0.0.1\noptions attempts:1 timeout:1\n")  // nobody answers there
        try nameTheServer(in: lab)
        try lab.startServer()
        try lab.startClient(waitForTunnel: false)
        #expect(lab.wait(for: "cannot resolve the server's name yet; asking again", in: "client.log"), "\(lab.log("client.log"))")
        #expect((try? lab.laptop.ip("link show roam0")) == nil, "nothing is set up while the name does not resolve")
        try lab.laptop.setHosts("127.0.0.1 localhost\n198.51.100.7 vpn.roam.test\n")
        #expect(lab.wait(for: "msg=\"tunnel up\"", in: "client.log", seconds: 10), "\(lab.log("client.log"))")
    }

    /// The client's configuration names the server `vpn.roam.test` instead of its address.
    private func nameTheServer(in lab: RoamingLab) throws {
        let configuration = lab.directory + "/client.yaml"
        try (try String(contentsOfFile: configuration, encoding: .utf8)
            .replacingOccurrences(of: "server: 198.51.100.7:", with: "server: vpn.roam.test:"))
            .write(toFile: configuration, atomically: true, encoding: .utf8)
    }
}

@Suite(.enabled(if: NamespaceLab.isRoot, Comment(rawValue: NamespaceLab.skipReason)), .serialized)
struct ServerReloadLabTests {
    /// SIGHUP to `agent serve`: users listed as before keep their sessions with no probe lost;
    /// a user taken off the list loses theirs; a file with a mistake changes nothing.
    @Test func theServerReloadsItsUsersAndKeepsTheSessionsOfThoseWhoRemain() throws {
        let lab = try RoamingLab(vpn: .roam, routing: .split)
        let bob = try PrivateKey.generate().publicKey.base64
        try lab.addServerUsers("  - {name: bob, public-key: \(bob), addresses: [10.77.0.3]}")
        try lab.startServer()
        try lab.startClient()
        let server = try #require(lab.serverPID)
        let probes = try ProbeStream(from: SocketAddress(lab.clientInner, port: 0), in: lab.laptop,
                                     to: SocketAddress(lab.serverInner, port: 5006), in: lab.server)
        defer { probes.stop() }
        let path = lab.directory + "/server.yaml"
        let original = try String(contentsOfFile: path, encoding: .utf8)

        // Bob goes and Carol comes, listed before Alice: Alice's session stays.
        let start = LabClock.now
        let carol = try PrivateKey.generate().publicKey.base64
        let withoutBob = original.replacingOccurrences(of: "  - {name: bob, public-key: \(bob), addresses: [10.77.0.3]}", with: "")
            .replacingOccurrences(of: "users:\n", with: "users:\n  - {name: carol, public-key: \(carol), addresses: [10.77.0.4]}\n")
        try withoutBob.write(toFile: path, atomically: false, encoding: .utf8)
        kill(server, SIGHUP)
        #expect(lab.wait(for: "msg=\"users reloaded\" before=2 sessions_ended=0 users=2", in: "server.log"), "\(lab.log("server.log"))")
        usleep(1_000_000)
        let (lost, sent) = probes.lost(from: start, to: LabClock.now - .milliseconds(200))
        #expect(sent >= 30 && lost == 0, "\(lost) of \(sent) probes lost across the reload")
        #expect(lab.log("client.log").components(separatedBy: "to=connecting").count == 2, "no new handshake: \(lab.log("client.log"))")

        // A mistake: nothing changes.
        try (withoutBob + "\nusers-typo: 1\n").write(toFile: path, atomically: false, encoding: .utf8)
        kill(server, SIGHUP)
        #expect(lab.wait(for: "users not reloaded", in: "server.log"), "\(lab.log("server.log"))")

        // Alice goes: her session ends, and the server refuses her next handshake.
        let aliceLine = withoutBob.split(separator: "\n").first { $0.contains("name: alice") }.map(String.init) ?? ""
        try withoutBob.replacingOccurrences(of: aliceLine, with: "").write(toFile: path, atomically: false, encoding: .utf8)
        kill(server, SIGHUP)
        #expect(lab.wait(for: "msg=\"users reloaded\" before=2 sessions_ended=1 users=1", in: "server.log"), "\(lab.log("server.log"))")
        #expect(lab.wait(for: "the server rejected", in: "client.log", seconds: 10), "\(lab.log("client.log"))")
    }
}
