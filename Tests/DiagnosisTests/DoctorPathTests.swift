import Basics
import Diagnosis
import Testing

// MARK: Captive portal

@Test func aPortalIsAProblemNamedWithItsLoginPageAndTheInternetIsFine() throws {
    var facts = healthy()
    facts.portal = .checked(url: "http://check.example/", via: "eth0 (10.20.0.57)", .portal(login: "http://10.0.0.1:8080/login"))
    let portal = try #require(finding(.portal, facts))
    #expect(portal.severity == .problem)
    #expect(portal.evidence == ["http://check.example/ from eth0 (10.20.0.57) was sent to http://10.0.0.1:8080/login"])
    #expect(portal.fix?.contains("agent portal") == true)
    #expect(Doctor.exitStatus(Doctor.findings(facts)) == 1)

    facts.agent = .notRunning(socket: "/run/roam/agent.sock")
    #expect(finding(.portal, facts)?.fix?.contains("log in at http://10.0.0.1:8080/login") == true, "no agent: the page itself")

    facts = healthy()
    facts.portal = .checked(url: "http://check.example/", via: "eth0 (10.20.0.57)", .online)
    #expect(finding(.portal, facts)?.severity == .ok)
    facts.portal = .checked(url: "http://check.example/", via: "eth0 (10.20.0.57)", .unknown("no answer in 5 s"))
    #expect(finding(.portal, facts)?.severity == .warning)
    facts.portal = .notChecked("turned off")
    #expect(finding(.portal, facts)?.severity == .ok)
    facts.portal = nil
    #expect(finding(.portal, facts) == nil)
}

/// Behind a running agent's lockdown the doctor's check cannot pass: the agent's own check
/// speaks instead.
@Test func theAgentsPortalIsReportedWhenTheDoctorCannotCheck() throws {
    var facts = healthy()
    facts.portal = .notChecked("the lockdown lets only the running agent's own sockets out")
    facts.agent = .running(AgentStatus(state: "portal", portal: "http://10.0.0.1:8080/login"))
    let portal = try #require(finding(.portal, facts))
    #expect(portal.severity == .problem && portal.evidence.joined().contains("http://10.0.0.1:8080/login"), "\(portal)")
}

// MARK: Path MTU

private func mtuFacts(uplinkMTU: Int = 1500) -> PathMTUFacts {
    PathMTUFacts(configured: 1420, uplink: "eth0", uplinkMTU: uplinkMTU, overhead: 60)
}

private func connected(mtu: AgentMTU?, over transport: String = "udp") -> AgentFact {
    .running(AgentStatus(state: "connected", path: "eth0 from 10.20.0.57 over \(transport)", mtu: mtu))
}

@Test func aPathThatCarriesTheTunnelsMTUIsFine() throws {
    var facts = healthy()
    facts.pathMTU = mtuFacts()
    facts.agent = connected(mtu: AgentMTU(tunnel: 1420, configured: 1420, floor: 1280, searching: false))
    let mtu = try #require(finding(.mtu, facts))
    #expect(mtu.severity == .ok)
    #expect(mtu.evidence == ["eth0's MTU is 1500; a full tunnel packet (1420 inside) is 1480 on it",
                             "the agent's padded probes: tunnel MTU 1420 (configured 1420, minimum 1280)"])
    facts.pathMTU = nil
    #expect(finding(.mtu, facts) == nil, "no route, nothing to say")
}

@Test func aSmallerPathIsWarnedOfWithTheSizeToSet() throws {
    var facts = healthy()
    facts.pathMTU = mtuFacts()
    // What the agent's probes found beyond the first hop.
    facts.agent = connected(mtu: AgentMTU(tunnel: 1336, configured: 1420, floor: 1280, searching: false))
    let found = try #require(finding(.mtu, facts))
    #expect(found.severity == .warning && found.title.contains("at most 1336"), "\(found)")
    #expect(found.fix?.contains("'tunnel: {mtu: 1336}'") == true)
    // Over the stream TCP cuts the packets: the MTU the agent reports says nothing of the path.
    facts.agent = connected(mtu: AgentMTU(tunnel: 1336, configured: 1420, floor: 1280, searching: false), over: "stream")
    #expect(finding(.mtu, facts)?.severity == .ok)
    // The first hop alone, without an agent: a PPPoE line.
    facts.agent = .notRunning(socket: "/run/roam/agent.sock")
    facts.pathMTU = mtuFacts(uplinkMTU: 1492)
    #expect(finding(.mtu, facts)?.title.contains("at most 1432") == false)
    #expect(finding(.mtu, facts)?.severity == .ok, "1492 carries 1420 + 60")
    facts.pathMTU = mtuFacts(uplinkMTU: 1400)
    #expect(finding(.mtu, facts)?.severity == .warning)
    #expect(finding(.mtu, facts)?.title.contains("at most 1340") == true)
    facts.pathMTU = mtuFacts(uplinkMTU: 1200)
    #expect(finding(.mtu, facts)?.severity == .problem, "1140 inside is below any tunnel's minimum")
}
