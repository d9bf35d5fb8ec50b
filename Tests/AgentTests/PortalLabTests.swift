import Foundation
import Glibc
import NamespaceLab
import Basics
import Testing
import Tunnel

/// A hotel's captive portal in the lab: the router drops the Wi-Fi's UDP and redirects its
/// plain HTTP to a login page until someone POSTs to it.
@Suite(.enabled(if: NamespaceLab.isRoot, Comment(rawValue: NamespaceLab.skipReason)), .serialized)
struct PortalLabTests {
    /// The laptop on the portal's Wi-Fi only, the lockdown on, with the check pointed at the
    /// lab's "internet".
    private func portalLab() throws -> (RoamingLab, LabPortal) {
        let lab = try RoamingLab(vpn: .roam, routing: .full)
        try lab.laptop.ip("link set eth0 down")
        let portal = try LabPortal(router: lab.server, uplink: "wifi-l", routerAddress: IPAddress("192.168.1.1")!)
        try lab.configure("client", """
            portal: {url: "http://\(portal.check)/check", expect: "\(LabPortal.expected)"}
            reconnect: {handshake-timeout: 2s}
            """)
        try lab.startServer()
        return (lab, portal)
    }

    /// The agent finds the portal within seconds and then spends nothing; `agent portal --run
    /// curl` logs in through the window while a tap on the router shows that nothing else
    /// left the laptop; the tunnel is up within a second of the portal opening.
    @Test func aPortalIsFoundAndLoggedInThroughTheWindowAlone() throws {
        let (lab, portal) = try portalLab()
        defer { portal.stop() }
        try lab.loadBootLockdown()  // as at boot: the machine is closed before the agent starts
        let tap = try lab.leakTap(web: [portal.login, portal.check])
        let bait = try lab.leakBait()
        defer { bait.stop() }
        let started = LabClock.now
        try lab.startClient(waitForTunnel: false)

        #expect(lab.waitFor(seconds: 15) { lab.status()["state"] == "portal" }, "\(lab.log("client.log"))")
        let found = LabClock.now - started
        let status = lab.status()
        #expect(status["portal.url"] == "http://\(portal.login)/login", "\(status)")
        #expect(lab.log("client.log").contains("to=portal"), "the transition is logged")

        // Behind the portal: no attempt, no token spent, for as long as it stays closed.
        let attempts = lab.attempts()
        let budget = status["budget_left"]
        usleep(4_000_000)
        #expect(lab.attempts() == attempts && lab.status()["budget_left"].map { Int($0)! >= Int(budget ?? "0")! } == true,
                "\(lab.status())")

        // A command that does not exist opens nothing.
        let missing = try lab.runAgent(["portal", "--run", "no-such-browser", "--control", lab.controlSocket])
        #expect(missing.status != 0 && missing.output.contains("cannot run 'no-such-browser'"), "\(missing.output)")
        #expect(lab.status()["portal.window_ms"] == nil)

        // Logging in: curl runs in the window and POSTs the login form.
        let login = try lab.runAgent(["portal", "--control", lab.controlSocket, "--run", "curl", "-sS", "--max-time", "5",
                                      "-d", "user=guest", "http://\(portal.login)/login"], seconds: 15)
        #expect(login.status == 0 && login.output.contains("Welcome") && login.output.contains("portal window open"), "status \(login.status): \(login.output)\n\(lab.log("client.log"))")
        let opened = try #require(portal.opened)
        #expect(lab.waitFor(seconds: 5) { lab.status()["state"] == "connected" })
        let upAfter = LabClock.now - opened
        let ping = try NamespaceLab.capture(NamespaceLab.ipTool, ["netns", "exec", lab.laptop.name, "ping", "-c", "1", "-W", "2",
                                                                  lab.serverInner.description])
        #expect(ping.status == 0, "traffic flows through the tunnel: \(ping.output)")
        #expect(lab.status()["portal.window_ms"] == nil && !lab.log("client.log").contains("cannot open the portal window"))
        print("captive portal: found in \(found.short), tunnel up \(upAfter.short) after the portal opened; "
            + "\(tap.leaks().count) packets left outside the tunnel and the window of \(tap.packetsSeen) judged")
        #expect(upAfter <= .seconds(1), "\(lab.log("client.log"))")
        #expect(tap.leaks().isEmpty && tap.packetsSeen > 0, "leaks: \(tap.leaks())")
        // The portal saw the agent's checks (redirected) and curl's POST, nothing else.
        #expect(portal.requestLines.allSatisfy { $0.hasPrefix("GET /check ") || $0.hasPrefix("POST /login ") }, "\(portal.requestLines)")
    }

    /// A machine whose look-ups go through a local resolver (systemd-resolved's stub here,
    /// which would ask the tunnel's resolvers): the window's program gets the network's own
    /// resolver instead, so it finds the login page by its name.
    @Test func theWindowsProgramResolvesNamesWithTheNetworksResolver() throws {
        let (lab, portal) = try portalLab()
        defer { portal.stop() }
        try lab.laptop.setResolvConf("nameserver 127.0.0.53\noptions edns0 trust-ad\nsearch hotel.example\n")
        let resolver = try LabResolver(at: IPAddress("192.168.1.1")!, in: lab.server,
                                       names: ["login.hotel.example": IPAddress("192.168.1.1")!])
        defer { resolver.stop() }
        try lab.startClient(waitForTunnel: false)
        #expect(lab.waitFor(seconds: 15) { lab.status()["state"] == "portal" }, "\(lab.log("client.log"))")

        let login = try lab.runAgent(["portal", "--control", lab.controlSocket, "--run", "curl", "-sS", "--max-time", "5",
                                      "-d", "user=guest", "http://login.hotel.example:\(portal.login.port)/login"], seconds: 15)
        #expect(login.status == 0 && login.output.contains("Welcome"), "status \(login.status): \(login.output)")
        #expect(login.output.contains("resolves names with the network's resolvers: 192.168.1.1"), "\(login.output)")
        #expect(resolver.queries.contains("login.hotel.example"), "\(resolver.queries)")
        #expect(lab.waitFor(seconds: 5) { lab.status()["state"] == "connected" }, "\(lab.log("client.log"))")
        // Only the window's program was given the network's resolver: the laptop's file is as it was.
        #expect((try? String(contentsOfFile: lab.laptopResolvConfPath, encoding: .utf8)).map { !$0.contains("portal window") } == true)
    }

    /// The same for a user in the `roam` group (not root): the program gets a user namespace
    /// that maps the user to themselves, and the network's resolver in it.
    @Test func aGroupMembersProgramResolvesWithTheNetworksResolverToo() throws {
        let (lab, portal) = try portalLab()
        defer { portal.stop() }
        let groups = (try? String(contentsOfFile: "/etc/group", encoding: .utf8)) ?? ""
        try lab.laptop.setGroups(groups + "roam:x:4242:\n")
        try lab.laptop.setResolvConf("nameserver 127.0.0.53\n")
        let resolver = try LabResolver(at: IPAddress("192.168.1.1")!, in: lab.server,
                                       names: ["login.hotel.example": IPAddress("192.168.1.1")!])
        defer { resolver.stop() }
        try lab.startClient(waitForTunnel: false)
        #expect(lab.waitFor(seconds: 15) { lab.status()["state"] == "portal" }, "\(lab.log("client.log"))")
        chmod(lab.directory, 0o755)

        let member = ["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--groups=4242", "--inh-caps=-all", "--bounding-set=-all"]
        let login = try lab.runAgent(["portal", "--control", lab.controlSocket, "--run", "curl", "-sS", "--max-time", "5",
                                      "-d", "user=guest", "http://login.hotel.example:\(portal.login.port)/login"],
                                     inside: member, seconds: 15)
        #expect(login.status == 0 && login.output.contains("Welcome"), "status \(login.status): \(login.output)")
        #expect(login.output.contains("resolves names with the network's resolvers: 192.168.1.1"), "\(login.output)")
        #expect(lab.log("client.log").contains("uid=65534"), "the window is the member's: \(lab.log("client.log"))")
        #expect(lab.waitFor(seconds: 5) { lab.status()["state"] == "connected" }, "\(lab.log("client.log"))")
    }

    /// The shipped units' sandboxing, set up from the unit's own text as systemd would
    /// (`UnitSandbox`): the agent makes the window's cgroup and reads the asking process in
    /// /proc (root's, with every capability: under the units only root reaches the control
    /// socket), and curl logs in through the window while a tap on the router shows that
    /// nothing else left the laptop.
    @Test(arguments: ["roam-client.service", "roam@.service"])
    func aWindowOpensUnderTheUnitsSandbox(_ unit: String) throws {
        let (lab, portal) = try portalLab()
        defer { portal.stop() }
        let text = try String(contentsOfFile: PackageTests.repository.appendingPathComponent("contrib/" + unit).path, encoding: .utf8)
        let sandbox = UnitSandbox(unit: text, writable: [lab.directory])
        defer {
            if let client = lab.client, client.isRunning {
                client.terminate()
                _ = lab.waitFor(seconds: 5) { !client.isRunning }
            }
            sandbox.remove()
        }
        try lab.loadBootLockdown()
        let tap = try lab.leakTap(web: [portal.login, portal.check])
        let bait = try lab.leakBait()
        defer { bait.stop() }
        try lab.startClient(waitForTunnel: false, inside: sandbox.command)
        #expect(lab.waitFor(seconds: 15) { lab.status()["state"] == "portal" }, "\(lab.log("client.log"))")

        // The agent runs as the unit has it: in the service's cgroup, with its capabilities only.
        let pid = try #require(lab.clientPID)
        let cgroup = (try? String(contentsOfFile: "/proc/\(pid)/cgroup", encoding: .utf8)) ?? ""
        #expect(cgroup.contains("0::/\(sandbox.serviceCgroup)"), "\(cgroup)")
        let status = (try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)) ?? ""
        // The unit's capabilities, as the kernel numbers them (linux/capability.h), and no other.
        let numbers = ["CAP_CHOWN": 0, "CAP_NET_ADMIN": 12, "CAP_NET_RAW": 13]
        let named = (sandbox.value("CapabilityBoundingSet") ?? "").split(separator: " ").map(String.init)
        let mask = named.reduce(UInt64(0)) { $0 | (numbers[$1].map { UInt64(1) << $0 } ?? 0) }
        #expect(named.allSatisfy { numbers[$0] != nil } && mask & (1 << 12) != 0, "the unit's capabilities: \(named)")
        #expect(status.contains("CapBnd:\t" + String(repeating: "0", count: 16 - String(mask, radix: 16).count) + String(mask, radix: 16)),
                "\(named.joined(separator: " ")) only: \(status)")
        let mounts = (try? String(contentsOfFile: "/proc/\(pid)/mountinfo", encoding: .utf8)) ?? ""
        if let hidden = sandbox.value("ProtectProc"), hidden != "default" {
            #expect(mounts.contains("hidepid=\(hidden)"), "\(mounts)")
        }

        let login = try lab.runAgent(["portal", "--control", lab.controlSocket, "--run", "curl", "-sS", "--max-time", "5",
                                      "-d", "user=guest", "http://\(portal.login)/login"], seconds: 15)
        #expect(login.status == 0 && login.output.contains("Welcome"), "\(unit): status \(login.status): \(login.output)\n\(lab.log("client.log"))")
        #expect(lab.waitFor(seconds: 5) { lab.status()["state"] == "connected" }, "\(lab.log("client.log"))")
        #expect(tap.leaks().isEmpty && tap.packetsSeen > 0, "leaks: \(tap.leaks())")
    }

    /// A reload that moves the connectivity check to another port: the lockdown lets the agent's
    /// marked check through to the new port, and no longer to the old one.
    @Test func aReloadMovesTheChecksPortInTheLockdown() throws {
        let lab = try RoamingLab(vpn: .roam, routing: .full)
        try lab.configure("client", "portal: {url: \"http://198.51.100.80/check\", expect: 204}")
        try lab.startServer()
        try lab.startClient()
        func checkPorts() -> String? {
            let table = try? NamespaceLab.capture(NamespaceLab.ipTool, ["netns", "exec", lab.laptop.name, "nft", "list", "table", "inet", "roam"])
            // nftables lists a one-port set as the port alone.
            return table?.output.split(separator: "\n").first { $0.contains("meta mark") && $0.contains(" tcp dport ") }
                .map { $0.split(separator: " ").drop { $0 != "dport" }.dropFirst().prefix { $0 != "accept" }.joined(separator: " ") }
        }
        #expect(checkPorts() == "80", "\(checkPorts() ?? "no check rule")")

        try lab.editConfiguration("client") {
            $0.replacingOccurrences(of: "http://198.51.100.80/check", with: "http://198.51.100.80:8081/check")
        }
        kill(try #require(lab.clientPID), SIGHUP)
        #expect(lab.wait(for: "configuration reloaded", in: "client.log"), "\(lab.log("client.log"))")
        #expect(lab.waitFor(seconds: 3) { checkPorts() == "8081" }, "\(checkPorts() ?? "no check rule")")
        #expect(lab.status()["state"] == "connected", "the tunnel stays")
    }

    /// Without a portal, a server that does not answer is a plain outage: the check passes,
    /// the agent says so and keeps backing off; `agent portal` refuses to open anything.
    @Test func aSilentServerBehindAWorkingNetworkIsNoPortal() throws {
        let (lab, portal) = try portalLab()
        portal.open()
        defer { portal.stop() }
        lab.stopServer()
        try lab.startClient(waitForTunnel: false)
        #expect(lab.wait(for: "connectivity check passed: the network reaches the internet, the server does not answer",
                         in: "client.log", seconds: 15), "\(lab.log("client.log"))")
        #expect(lab.status()["state"] == "backing-off" || lab.status()["state"] == "connecting", "\(lab.status())")
        let refused = try lab.runAgent(["portal", "--run", "true", "--control", lab.controlSocket])
        #expect(refused.status != 0 && refused.output.contains("no captive portal found"), "\(refused.output)")
        #expect(!lab.log("client.log").contains("to=portal"))
    }
}
