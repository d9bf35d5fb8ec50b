import Foundation
import Glibc
import NamespaceLab
import Testing

/// `agent doctor --json` run for real inside the lab's laptop namespace, against a real `agent
/// serve` gateway in the server namespace (which is also the laptop's router: what it drops,
/// the network drops).
@Suite(.enabled(if: NamespaceLab.isRoot, Comment(rawValue: NamespaceLab.skipReason)), .serialized)
struct DoctorLabTests {
    /// One finding as the JSON has it.
    struct Seen {
        var check: String, severity: String, title: String, evidence: [String]
    }

    /// Runs the doctor in the laptop and returns its exit status, its findings and its output.
    /// A test that sets no `portal:` has the connectivity check off: its default URL is a name,
    /// and nothing in the lab answers its look-up, which would cost each run the resolver's
    /// timeouts (the portal's own test sets the check's URL).
    func doctor(_ lab: RoamingLab, _ extra: [String] = []) throws -> (status: Int32, findings: [Seen], output: String) {
        let client = (try? String(contentsOfFile: lab.directory + "/client.yaml", encoding: .utf8)) ?? ""
        if !client.contains("portal:") { try lab.configure("client", "portal: {check: off}") }
        let (status, output) = try lab.runAgent(["doctor", "--config", lab.directory + "/client.yaml", "--control", lab.controlSocket, "--json"] + extra,
                                                seconds: 30)
        let object = try #require(try JSONSerialization.jsonObject(with: Data(output.utf8)) as? [String: Any], "\(output)")
        let findings = (object["findings"] as? [[String: Any]] ?? []).map {
            Seen(check: $0["check"] as? String ?? "", severity: $0["severity"] as? String ?? "", title: $0["title"] as? String ?? "",
                 evidence: $0["evidence"] as? [String] ?? [])
        }
        print("doctor lab: exit \(status)\n" + findings.map { "\($0.severity) \($0.check): \($0.title) \($0.evidence)" }.joined(separator: "\n"))
        return (status, findings, output)
    }

    /// With protocol 2 a handshake the gateway accepts would take a rekey's place in the running
    /// agent's session and move its timestamps, and a goodbye would end it: with an agent
    /// running (split mode, nothing holds the doctor's packets back) the doctor sends none, and
    /// the session goes on with its one handshake.
    @Test func withProtocolTwoARunningAgentsSessionIsLeftAlone() throws {
        let lab = try RoamingLab(vpn: .roam, routing: .split)
        try lab.configure("client", "protocol: 2")
        try lab.startServer()
        try lab.startClient()
        #expect(labWait(seconds: 10) { lab.status()["state"] == "connected" })
        let handshakes = { lab.log("server.log").components(separatedBy: "msg=handshake ").count - 1 }
        #expect(handshakes() == 1)
        let (_, findings, _) = try doctor(lab)
        let udp = try #require(findings.first { $0.check == "udp" })
        #expect(udp.evidence.joined().contains("protocol 2") || udp.title.contains("protocol 2"), "\(udp)")
        usleep(1_500_000)
        #expect(handshakes() == 1, "the doctor made no session on the gateway: \(lab.log("server.log"))")
        #expect(lab.status()["state"] == "connected", "the running agent's session was left alone")
        #expect(!lab.log("server.log").contains("closed by the client"), "no goodbye ended a session")
    }

    @Test func theGatewayAnswersOverUDPAndARunningAgentIsSeenConnected() throws {
        let lab = try RoamingLab(vpn: .roam, routing: .full)
        try lab.startServer()
        let before = lab.nftTables()
        let (status, findings, _) = try doctor(lab)
        let udp = try #require(findings.first { $0.check == "udp" })
        #expect(udp.severity == "ok", "\(udp)")
        #expect(udp.evidence.first?.contains("handshake response (version 3)") == true, "\(udp)")
        #expect(findings.first { $0.check == "route" }?.severity == "ok")
        #expect(findings.first { $0.check == "route" }?.title.contains("eth0") == true)
        #expect(findings.first { $0.check == "agent" }?.severity == "problem", "no agent runs yet")
        #expect(status == 1)
        #expect(lab.nftTables() == before, "the doctor loaded nothing")
        #expect(!lab.log("server.log").contains("msg=handshake "), "no session was made: version 3 stops at the response")

        try lab.startClient()
        let (_, running, _) = try doctor(lab)
        #expect(running.first { $0.check == "agent" }?.severity == "ok", "\(running)")
        #expect(running.first { $0.check == "lockdown" }?.severity == "ok", "\(running)")
        #expect(running.first { $0.check == "udp" }?.severity == "warning",
                "the lockdown lets only the agent's own sockets out, and the doctor says so: \(running)")
        #expect(lab.status()["state"] == "connected", "the running agent's session was left alone")
    }

    @Test func udpDroppedOnTheWayIsAProblemAndTLSStillWorks() throws {
        let lab = try RoamingLab(vpn: .roam, routing: .full)
        try lab.configure("server", "tcp: 443")
        try lab.configure("client", "tcp: 443")
        try lab.startServer()
        try lab.server.nft("add table inet block")
        try lab.server.nft("add chain inet block in { type filter hook prerouting priority -300 ; }")
        try lab.server.nft("add rule inet block in udp dport \(lab.port) counter drop")
        let (status, findings, _) = try doctor(lab)
        let udp = try #require(findings.first { $0.check == "udp" })
        let stream = try #require(findings.first { $0.check == "stream" })
        #expect(udp.severity == "problem", "\(udp)")
        #expect(stream.severity == "ok", "\(stream)")
        #expect(stream.evidence.contains { $0.contains("handshake response") }, "the gateway answered inside TLS: \(stream)")
        #expect(status == 1)
    }

    @Test func noRouteToTheGatewayIsAProblem() throws {
        let lab = try RoamingLab(vpn: .roam, routing: .full)
        try lab.startServer()
        try lab.laptop.ip("route del default dev eth0")
        try lab.laptop.ip("route del default dev wifi0")
        let (status, findings, _) = try doctor(lab)
        let route = try #require(findings.first { $0.check == "route" })
        #expect(route.severity == "problem", "\(route)")
        #expect(route.evidence.contains("no default route"), "\(route)")
        #expect(findings.first { $0.check == "udp" }?.severity == "warning", "not tried without a route")
        #expect(status == 1)
    }

    /// The boot lockdown loaded and no agent to take it over: nothing leaves the machine, and
    /// the doctor says so (a warning, with the fix); once it is taken away, nothing to say.
    @Test func aLockdownLeftWithNoAgentIsWarnedOfAndGoneIsFine() throws {
        let lab = try RoamingLab(vpn: .roam, routing: .full)
        try lab.startServer()
        try lab.loadBootLockdown()
        let (_, loaded, _) = try doctor(lab)
        let held = try #require(loaded.first { $0.check == "lockdown" })
        #expect(held.severity == "warning" && held.title.contains("no agent runs"), "\(held)")
        let off = try lab.runAgent(["lockdown", "off", "--runtime", lab.directory])
        #expect(off.status == 0, "\(off.output)")
        let (_, open, _) = try doctor(lab)
        let gone = try #require(open.first { $0.check == "lockdown" })
        #expect(gone.severity == "ok" && gone.title.contains("not loaded"), "\(gone)")
    }

    /// Another VPN's policy rule before the full tunnel's (Tailscale's `lookup 52`): what that
    /// table routes skips the tunnel, and the doctor names the rule; without it, nothing to say.
    @Test func anotherVPNsRuleBeforeRoamsIsWarnedOf() throws {
        let lab = try RoamingLab(vpn: .roam, routing: .full)
        try lab.startServer()
        try lab.laptop.ip("rule add priority 5270 lookup 52")
        let (_, with, _) = try doctor(lab)
        let rule = try #require(with.first { $0.check == "rules" })
        #expect(rule.severity == "warning" && rule.evidence.joined().contains("52"), "\(rule)")
        try lab.laptop.ip("rule del priority 5270 lookup 52")
        let (_, without, _) = try doctor(lab)
        #expect(without.first { $0.check == "rules" }?.severity == "ok", "\(without)")
    }
}
