import Foundation
import Glibc
import NamespaceLab
import Basics
import Device
import Control
import ControlWire
import Testing

/// Applications kept outside the tunnel on purpose (`agent exclude`, `exclusion: allow`): an
/// excluded program reaches a host on the network directly and resolves with the network's
/// resolver, while every other process is refused outside the tunnel; only root and the roam
/// group may ask, a member only for their own processes; off unless configured.
@Suite(.enabled(if: NamespaceLab.isRoot, Comment(rawValue: NamespaceLab.skipReason)), .serialized)
struct ExclusionLabTests {
    static let outside = SocketAddress(IPAddress("10.20.0.1")!, port: 9998)

    /// Runs `script` with bash in the laptop's namespace, as a process outside any exclusion.
    static func bash(_ lab: RoamingLab, _ script: String) throws -> (status: Int32, output: String) {
        try NamespaceLab.capture(NamespaceLab.ipTool, ["netns", "exec", lab.laptop.name, "bash", "-c", script])
    }

    @Test func anExcludedProgramReachesTheNetworkDirectlyAndNobodyElseDoes() throws {
        let lab = try RoamingLab(vpn: .roam, routing: .full)
        try DNSLabTests.append("exclusion: allow\n", to: lab.directory + "/client.yaml")
        try DNSLabTests.append("dns: {servers: [10.77.0.1]}\n", to: lab.directory + "/server.yaml")
        try lab.laptop.setResolvConf("nameserver 10.20.0.1\n")
        let groups = (try? String(contentsOfFile: "/etc/group", encoding: .utf8)) ?? ""
        try lab.laptop.setGroups(groups + "roam:x:4242:\n")
        let lanResolver = try LabResolver(at: IPAddress("10.20.0.1")!, in: lab.server, names: ["nas.home.example": IPAddress("10.20.9.9")!])
        defer { lanResolver.stop() }
        let listener = try UDPSocket(bindingTo: Self.outside, namespace: lab.server.namespace)
        try lab.startServer()
        try lab.startClient()
        #expect(lab.wait(for: "msg=dns", in: "client.log"), "\(lab.log("client.log"))")

        // Everyone else: refused outside the tunnel.
        _ = try Self.bash(lab, "echo inside > /dev/udp/10.20.0.1/9998")
        #expect(try listener.receive(timeout: .milliseconds(300)) == nil, "a process that is not excluded reached the network directly")

        // An excluded program: to the network directly, and its names from the network's resolver.
        let excluded = try lab.runAgent(["exclude", "--control", lab.controlSocket, "--", "bash", "-c",
                                         "echo outside > /dev/udp/10.20.0.1/9998; getent ahostsv4 nas.home.example"])
        #expect(excluded.status == 0 && excluded.output.contains("10.20.9.9"), "status \(excluded.status): \(excluded.output)")
        let got = try listener.receive(timeout: .seconds(2))
        #expect(got.map { String(decoding: $0.bytes, as: UTF8.self) } == "outside\n" && got?.peer.ip == IPAddress("10.20.0.57"),
                "\(String(describing: got))")
        #expect(lanResolver.queries.contains("nas.home.example"), "the excluded program asked the network's resolver")
        #expect(lab.log("client.log").contains("msg=\"kept outside the tunnel\""), "\(lab.log("client.log"))")

        // A running process moved by its id, listed in status; a member of the roam group may not
        // move root's.
        let sleeper = Process()
        sleeper.executableURL = NamespaceLab.ipTool
        sleeper.arguments = ["netns", "exec", lab.laptop.name, "sleep", "30"]
        try sleeper.run()
        defer { if sleeper.isRunning { kill(sleeper.processIdentifier, SIGKILL) } }
        var sleepPID: Int32?
        _ = lab.waitFor(seconds: 3) {
            // `ip netns exec` execs sleep in place: the process started is the sleeper.
            sleepPID = (try? String(contentsOfFile: "/proc/\(sleeper.processIdentifier)/comm", encoding: .utf8))?.hasPrefix("sleep") == true
                ? sleeper.processIdentifier : nil
            return sleepPID != nil
        }
        let pid = try #require(sleepPID)
        chmod(lab.directory, 0o755)
        let member = ["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--groups=4242", "--inh-caps=-all", "--bounding-set=-all"]
        let refused = try lab.runAgent(["exclude", "--control", lab.controlSocket, "--pid", "\(pid)"], inside: member)
        #expect(refused.status != 0 && refused.output.contains("other user or group ids"), "\(refused.output)")
        let stranger = ["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all"]
        let unprivileged = try lab.runAgent(["exclude", "--control", lab.controlSocket, "--pid", "\(pid)"], inside: stranger)
        #expect(unprivileged.status != 0, "someone outside the roam group: \(unprivileged.output)")
        #expect(!lab.status()["excluded"].map { $0.contains("\(pid)") }.isTrue, "\(lab.status())")
        // A request that names the process by its id and another start time (the one named ended,
        // and another took its id) moves nobody.
        do {
            _ = try ControlClient.ask(.exclude, at: lab.controlSocket, pid: pid, started: 1)
            Issue.record("a process with another start time was moved")
        } catch {
            #expect("\(error)".contains("is not the one named"), "\(error)")
        }
        let moved = try lab.runAgent(["exclude", "--control", lab.controlSocket, "--pid", "\(pid)"])
        #expect(moved.status == 0, "\(moved.output)")
        let status = lab.status()
        #expect(status["excluded"]?.contains("\(pid)") == true && status["excluded"]?.contains("sleep") == true, "\(status)")
        #expect(status["state"] == "connected", "\(status)")
    }

    /// An excluded process starts a child, then the agent stops: both go back to the cgroup the
    /// process came from (its user's slice, where logout and resource limits still reach them),
    /// neither to the root cgroup.
    @Test func anExcludedProcessAndItsChildGoBackWhereTheyCameFromWhenTheAgentStops() throws {
        let lab = try RoamingLab(vpn: .roam, routing: .full)
        try DNSLabTests.append("exclusion: allow\n", to: lab.directory + "/client.yaml")
        try lab.startServer()
        try lab.startClient()
        let shell = Process()
        shell.executableURL = NamespaceLab.ipTool
        shell.arguments = ["netns", "exec", lab.laptop.name, "bash", "-c", "read go; sleep 30 & echo $!; read done"]
        let input = Pipe(), output = Pipe()
        shell.standardInput = input
        shell.standardOutput = output
        try shell.run()
        defer { if shell.isRunning { kill(shell.processIdentifier, SIGKILL) } }
        let pid = shell.processIdentifier
        func cgroup(_ pid: Int32) -> String { (try? String(contentsOfFile: "/proc/\(pid)/cgroup", encoding: .utf8)) ?? "gone" }
        #expect(lab.waitFor(seconds: 3) { (try? String(contentsOfFile: "/proc/\(pid)/comm", encoding: .utf8))?.hasPrefix("bash") == true })
        // The shell starts in a cgroup of its own, as a user's session scope would be (not the
        // root cgroup, where a process sent "nowhere" would land too).
        let mountPoint = "/tmp/roam-cgroup-test.\(getpid())"
        mkdir(mountPoint, 0o700)
        try #require(mount("none", mountPoint, "cgroup2", 0, nil) == 0, "cannot mount cgroup2: \(String(cString: strerror(errno)))")
        let scope = mountPoint + "/roam-test-session.\(getpid())"
        mkdir(scope, 0o755)
        defer {
            for task in ((try? String(contentsOfFile: scope + "/cgroup.procs", encoding: .utf8)) ?? "").split(separator: "\n") {
                try? (String(task) + "\n").write(toFile: mountPoint + "/cgroup.procs", atomically: false, encoding: .utf8)
            }
            rmdir(scope)
            umount(mountPoint)
            rmdir(mountPoint)
        }
        try "\(pid)\n".write(toFile: scope + "/cgroup.procs", atomically: false, encoding: .utf8)
        let origin = cgroup(pid)
        #expect(origin.contains("roam-test-session"), "\(origin)")
        let moved = try lab.runAgent(["exclude", "--control", lab.controlSocket, "--pid", "\(pid)"])
        #expect(moved.status == 0 && cgroup(pid).contains("roam-excluded"), "\(moved.output) \(cgroup(pid))")
        input.fileHandleForWriting.write(Data("go\n".utf8))
        var line = Data()
        _ = lab.waitFor(seconds: 3) {
            line += output.fileHandleForReading.availableData
            return line.contains(UInt8(ascii: "\n"))
        }
        let child = try #require(Int32(String(decoding: line, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)))
        defer { kill(child, SIGKILL) }
        #expect(cgroup(child).contains("roam-excluded"), "the child started inside: \(cgroup(child))")
        _ = try lab.stopClient()
        #expect(cgroup(pid) == origin, "the excluded process: \(cgroup(pid)), came from \(origin)")
        #expect(cgroup(child) == origin, "its child: \(cgroup(child)), its parent came from \(origin)")
        input.fileHandleForWriting.write(Data("done\n".utf8))
    }

    @Test func exclusionIsOffUnlessConfigured() throws {
        let lab = try RoamingLab(vpn: .roam, routing: .full)
        try lab.startServer()
        try lab.startClient()
        let refused = try lab.runAgent(["exclude", "--control", lab.controlSocket, "--", "true"])
        #expect(refused.status != 0 && refused.output.contains("'exclusion: allow'"), "\(refused.output)")
        #expect(lab.status()["excluded"] == "", "\(lab.status())")
    }
}

private extension Optional where Wrapped == Bool {
    var isTrue: Bool { self == true }
}
