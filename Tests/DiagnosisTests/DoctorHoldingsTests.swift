import Basics
import Diagnosis
import Testing

private func managing(_ resolvers: [String], via manager: String = "resolv.conf", upkeep: [AgentUpkeep] = []) -> AgentFact {
    .running(AgentStatus(state: "connected", dns: AgentDNS(manager: manager, resolvers: resolvers), upkeep: upkeep))
}

// MARK: Resolvers

@Test func resolvConfNamingTheTunnelsResolversIsFineAndAnyOtherIsAProblem() throws {
    var facts = healthy()
    facts.agent = managing(["10.77.0.1"])
    facts.systemResolvers = SystemResolvers(file: "/etc/resolv.conf", nameservers: .success(["10.77.0.1"]))
    #expect(finding(.resolvers, facts)?.severity == .ok)

    facts.systemResolvers = SystemResolvers(file: "/etc/resolv.conf", nameservers: .success(["10.20.0.1"]))
    let rewritten = try #require(finding(.resolvers, facts))
    #expect(rewritten.severity == .problem)
    #expect(rewritten.evidence == ["the agent applied 10.77.0.1 through resolv.conf", "/etc/resolv.conf names 10.20.0.1"])
    #expect(rewritten.fix?.contains("rewrote /etc/resolv.conf") == true)

    facts.systemResolvers = SystemResolvers(file: "/etc/resolv.conf", nameservers: .failure(DoctorError("cannot read /etc/resolv.conf")))
    #expect(finding(.resolvers, facts)?.severity == .warning)
}

@Test func resolversAreJudgedOnlyWhileTheAgentAppliesThem() {
    var facts = healthy()
    facts.systemResolvers = nil
    #expect(finding(.resolvers, facts) == nil, "the agent's status has no dns: DNS left alone")
    facts.agent = managing([])
    #expect(finding(.resolvers, facts) == nil, "nothing applied yet")
    facts.agent = .running(AgentStatus(state: "connected", dns: AgentDNS(manager: "resolv.conf", resolvers: [], problem: "the server sent none")))
    #expect(finding(.resolvers, facts)?.severity == .warning)
    facts.agent = managing(["10.77.0.1"], via: "systemd-resolved")
    #expect(finding(.resolvers, facts)?.severity == .ok)
}

// MARK: Fights

@Test func aFightTheAgentHoldsOffIsWarnedOfWithWhoTookItAway() throws {
    var facts = healthy()
    facts.agent = managing(["10.77.0.1"], upkeep: [AgentUpkeep(holding: "routing", restores: 0),
                                                   AgentUpkeep(holding: "resolvers", restores: 0),
                                                   AgentUpkeep(holding: "lockdown", restores: 0)])
    #expect(finding(.upkeep, facts)?.severity == .ok)
    #expect(finding(.upkeep, facts)?.evidence == [])

    facts.agent = managing(["10.77.0.1"], upkeep: [AgentUpkeep(holding: "routing", restores: 2, lastRemovedBy: "ip (pid 42)"),
                                                   AgentUpkeep(holding: "lockdown", restores: 0)])
    let restored = try #require(finding(.upkeep, facts))
    #expect(restored.severity == .ok && restored.title.contains("put back"))
    #expect(restored.evidence == ["routing: put back 2 times since the agent started, last removed by ip (pid 42)"])

    facts.agent = managing(["10.77.0.1"], upkeep: [AgentUpkeep(holding: "routing", restores: 5, missing: "rule 32765",
                                                               lastRemovedBy: "NetworkManager (pid 7)", heldOff: true)])
    let fight = try #require(finding(.upkeep, facts))
    #expect(fight.severity == .warning && fight.title.contains("routing"), "\(fight)")
    #expect(fight.evidence.first?.contains("NetworkManager (pid 7)") == true && fight.evidence.first?.contains("holds off") == true)
    #expect(fight.fix?.contains("NetworkManager-roam.conf") == true)

    facts.agent = .notRunning(socket: "/run/roam/agent.sock")
    #expect(finding(.upkeep, facts) == nil)
}
