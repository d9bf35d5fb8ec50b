import Topology
import Basics
import Device
import Diagnosis
import Netlink
import PathMonitor
import Testing

/// A laptop on its wired network with the agent connected: every finding ok.
func healthy() -> DoctorFacts {
    let eth0 = Path(linkIndex: 2, interface: "eth0", kind: .ethernet, source: IPAddress("10.20.0.57")!, gateway: IPAddress("10.20.0.1")!,
                    metric: 100, prefixLength: 0, mtu: 1500)
    let server = ServerFacts(
        name: "fra1", host: "vpn.example", port: 51820, lookup: .resolved([IPAddress("198.51.100.7")!], took: .milliseconds(12)),
        routes: [AddressRoutes(address: IPAddress("198.51.100.7")!, paths: [eth0])],
        udp: .answered(.response(version: 3), from: "198.51.100.7:51820", rtt: .milliseconds(3), via: "eth0 (10.20.0.57)"))
    return DoctorFacts(
        clock: WallClock(unixSeconds: 1_767_225_600, text: "2026-01-01T00:00:00Z"),
        agent: .running(AgentStatus(state: "connected", server: "fra1", path: "eth0 from 10.20.0.57 over udp", reason: "handshake")),
        servers: [server],
        lockdown: LockdownFacts(configured: true, tables: .success(LoadedTables(lockdown: true, guarded: true, boot: false))),
        rules: .success([]), mode: .full(FullTunnel()),
        uplinks: [Uplink(name: "eth0", isUp: true, hasCarrier: true, addresses: [IPAddress("10.20.0.57")!])],
        defaultRoutes: ["default via 10.20.0.1 dev eth0 metric 100"])
}

func finding(_ check: Finding.Check, _ facts: DoctorFacts) -> Finding? {
    Doctor.findings(facts).first { $0.check == check }
}

@Test func aHealthyMachineHasNoProblemAndExitsZero() {
    let findings = Doctor.findings(healthy())
    #expect(findings.allSatisfy { $0.severity == .ok }, "\(findings.filter { $0.severity != .ok })")
    #expect(Set(findings.map(\.check)) == [.agent, .clock, .lookup, .route, .udp, .lockdown, .rules])
    #expect(Doctor.exitStatus(findings) == 0)
}

// MARK: Route

@Test func aRouteNamesTheUplinkAndSourceTheKernelTakes() throws {
    let route = try #require(finding(.route, healthy()))
    #expect(route.severity == .ok)
    #expect(route.title.contains("eth0"))
    #expect(route.evidence == ["to 198.51.100.7: eth0 from 10.20.0.57 via 10.20.0.1 metric 100 (the kernel's choice)"])
}

@Test func noPathToAnyAddressIsAProblemThatSaysWhatIsMissing() throws {
    var facts = healthy()
    facts.servers[0].routes[0].paths = []
    facts.servers[0].udp = .notTried("no route to send over")
    facts.defaultRoutes = []
    let route = try #require(finding(.route, facts))
    #expect(route.severity == .problem)
    #expect(route.evidence.contains("no default route"))
    #expect(route.evidence.contains("eth0: up, 10.20.0.57"))
    #expect(route.fix?.contains("no default route") == true || route.fix?.contains("gave no default route") == true)
    #expect(Doctor.exitStatus(Doctor.findings(facts)) == 1)

    facts.uplinks = [Uplink(name: "eth0", isUp: true, hasCarrier: false, addresses: [])]
    #expect(finding(.route, facts)?.fix?.contains("plug in the cable") == true)
    facts.uplinks = [Uplink(name: "eth0", isUp: true, hasCarrier: true, addresses: [])]
    #expect(finding(.route, facts)?.fix?.contains("DHCP did not answer") == true)
}

@Test func aNameWithoutAddressesGetsNoRouteFinding() {
    var facts = healthy()
    facts.servers[0].lookup = .failed("cannot resolve vpn.example: Name or service not known", temporary: false, took: .milliseconds(5))
    facts.servers[0].routes = []
    #expect(finding(.route, facts) == nil)
}

// MARK: Look-up

@Test func aLookUpIsOkQuickWarnedSlowAndAProblemWhenItFails() throws {
    var facts = healthy()
    #expect(finding(.lookup, facts)?.evidence == ["vpn.example is 198.51.100.7 (in 12 ms)"])
    facts.servers[0].lookup = .resolved([IPAddress("198.51.100.7")!], took: .milliseconds(2500))
    #expect(finding(.lookup, facts)?.severity == .warning)
    facts.servers[0].lookup = .failed("cannot resolve vpn.example: Name or service not known", temporary: false, took: .milliseconds(5))
    let missing = try #require(finding(.lookup, facts))
    #expect(missing.severity == .problem && missing.title.contains("does not exist") && missing.fix?.contains("'server'") == true)
    facts.servers[0].lookup = .failed("cannot resolve vpn.example: Temporary failure", temporary: true, took: .seconds(5))
    #expect(finding(.lookup, facts)?.title.contains("no answer") == true)
    facts.servers[0].lookup = .literal
    #expect(finding(.lookup, facts) == nil)
}

// MARK: UDP and TLS

@Test func anyAuthenticAnswerProvesTheGatewayIsThere() {
    var facts = healthy()
    for answer in [Answer.response(version: 2), .response(version: 3), .cookieReply, .sessionUnknown] {
        facts.servers[0].udp = .answered(answer, from: "198.51.100.7:51820", rtt: .milliseconds(2), via: "eth0 (10.20.0.57)")
        #expect(finding(.udp, facts)?.severity == .ok, "\(answer)")
    }
    facts.servers[0].udp = .answered(.rejected, from: "198.51.100.7:51820", rtt: .milliseconds(2), via: "eth0 (10.20.0.57)")
    #expect(finding(.udp, facts)?.severity == .problem)
    #expect(finding(.udp, facts)?.fix?.contains("public key") == true)
    facts.servers[0].udp = .answered(.unexpected(bytes: 40), from: "198.51.100.7:51820", rtt: .milliseconds(2), via: "eth0 (10.20.0.57)")
    #expect(finding(.udp, facts)?.severity == .problem)
    #expect(finding(.udp, facts)?.title.contains("Something else") == true)
}

@Test func silenceIsAProblemUnlessTheLockdownStoppedTheProbe() throws {
    var facts = healthy()
    facts.servers[0].udp = .silent(tries: 3, wait: .milliseconds(1500), via: "eth0 (10.20.0.57)", stoppedByLockdown: 0)
    let silent = try #require(finding(.udp, facts))
    #expect(silent.severity == .problem)
    #expect(silent.evidence == ["3 handshake initiations to vpn.example port 51820 from eth0 (10.20.0.57), none answered within 1.5 s each"])
    #expect(silent.fix?.contains("tcp:") == true, "no stream configured: it is suggested")

    facts.servers[0].udp = .silent(tries: 3, wait: .milliseconds(1500), via: "eth0 (10.20.0.57)", stoppedByLockdown: 3)
    #expect(finding(.udp, facts)?.severity == .warning)
    #expect(finding(.udp, facts)?.evidence.last?.hasPrefix("the lockdown stopped 3 packets meanwhile") == true)

    // The lockdown's drop refuses the send itself.
    facts.servers[0].udp = .failed("Operation not permitted", via: "eth0 (10.20.0.57)", stoppedByLockdown: 1)
    #expect(finding(.udp, facts)?.severity == .warning)
    facts.servers[0].udp = .failed("Operation not permitted", via: "eth0 (10.20.0.57)")
    #expect(finding(.udp, facts)?.severity == .problem)
}

@Test func udpBlockedWithTLSWorkingIsAFindingOfItsOwn() throws {
    var facts = healthy()
    facts.servers[0].streamPort = 443
    facts.servers[0].udp = .silent(tries: 3, wait: .milliseconds(1500), via: "eth0 (10.20.0.57)", stoppedByLockdown: 0)
    facts.servers[0].stream = .answered(.tls(suite: "TLS_AES_128_GCM_SHA256", gateway: .response(version: 3)),
                                        from: "198.51.100.7:443", rtt: .milliseconds(8), via: "eth0 (10.20.0.57)")
    let findings = Doctor.findings(facts)
    let udp = try #require(findings.first { $0.check == .udp })
    let stream = try #require(findings.first { $0.check == .stream })
    #expect(udp.severity == .problem && udp.fix?.contains("TLS gets through") == true)
    #expect(stream.severity == .ok && stream.title.contains("tcp: 443"))

    facts.servers[0].stream = .answered(.tls(suite: nil, gateway: nil), from: "198.51.100.7:443", rtt: .milliseconds(8), via: "eth0 (10.20.0.57)")
    #expect(finding(.stream, facts)?.severity == .problem, "TLS up without the gateway inside: an interceptor")
    #expect(finding(.udp, facts)?.fix?.contains("TLS gets through") == false)
    facts.servers[0].stream = .failed("connection refused", via: "eth0 (10.20.0.57)")
    #expect(finding(.stream, facts)?.severity == .problem)
    facts.servers[0].stream = nil
    #expect(finding(.stream, facts) == nil)
}

// MARK: Lockdown

@Test func theLockdownIsJudgedByTheConfigurationAndTheAgent() {
    func judge(configured: Bool, running: Bool, lockdown: Bool, guarded: Bool, boot: Bool = false) -> Finding.Severity? {
        var facts = healthy()
        if !running { facts.agent = .notRunning(socket: "/run/roam/agent.sock") }
        facts.lockdown = LockdownFacts(configured: configured, tables: .success(LoadedTables(lockdown: lockdown, guarded: guarded, boot: boot)))
        return finding(.lockdown, facts)?.severity
    }
    #expect(judge(configured: true, running: true, lockdown: true, guarded: true) == .ok)
    #expect(judge(configured: true, running: true, lockdown: false, guarded: true) == .problem)
    #expect(judge(configured: true, running: true, lockdown: true, guarded: false) == .warning)
    #expect(judge(configured: true, running: false, lockdown: false, guarded: false) == .ok, "after agent stop")
    #expect(judge(configured: true, running: false, lockdown: true, guarded: false) == .warning, "left by an agent that died")
    #expect(judge(configured: true, running: false, lockdown: false, guarded: false, boot: true) == .warning)
    #expect(judge(configured: false, running: true, lockdown: false, guarded: false) == .ok)
    #expect(judge(configured: false, running: false, lockdown: true, guarded: false) == .warning)

    var facts = healthy()
    facts.lockdown.tables = .failure(DoctorError("nftables cannot be read without root"))
    #expect(finding(.lockdown, facts)?.severity == .warning)
}

// MARK: Rules

@Test func anotherVPNsRuleBeforeRoamsIsWarnedOf() throws {
    var facts = healthy()
    let tailscale = RoutingRule(family: .v4, priority: 5270, table: 52)
    facts.rules = .success([tailscale, RoutingRule(family: .v4, priority: 32766, table: Route.mainTable)])
    let rules = try #require(finding(.rules, facts))
    #expect(rules.severity == .warning)
    #expect(rules.evidence == ["rule \(tailscale)"])
    // After Roam's, or the kernel's own tables: nothing to say.
    facts.rules = .success([RoutingRule(family: .v4, priority: 40000, table: 52), RoutingRule(family: .v4, priority: 0, table: 255)])
    #expect(finding(.rules, facts)?.severity == .ok)
    // Split mode has no rules for others to come before.
    facts.rules = .success([tailscale])
    facts.mode = .split([Prefix("10.77.0.0/24")!])
    #expect(finding(.rules, facts) == nil)
}

// MARK: Clock and agent

/// The lab cannot set a namespace's wall clock (a time namespace offsets only the monotonic and
/// boot clocks, and setting the real one would move the whole machine's): the clock's finding
/// is tested on the fact, either side of the line.
@Test func aClockBefore2024IsAProblem() {
    var facts = healthy()
    facts.clock = WallClock(unixSeconds: 1_704_067_199, text: "2023-12-31T23:59:59Z")
    #expect(finding(.clock, facts)?.severity == .problem)
    #expect(finding(.clock, facts)?.title.contains("2023-12-31") == true)
    facts.clock = WallClock(unixSeconds: 1_704_067_200, text: "2024-01-01T00:00:00Z")
    #expect(finding(.clock, facts)?.severity == .ok)
}

@Test func theAgentsStateSaysWhatToDo() throws {
    var facts = healthy()
    facts.agent = .notRunning(socket: "/run/roam/agent.sock")
    #expect(finding(.agent, facts)?.severity == .problem)
    #expect(finding(.agent, facts)?.evidence == ["no control socket at /run/roam/agent.sock"])
    for (state, severity) in [("failed", Finding.Severity.problem), ("backing-off", .problem), ("offline", .problem),
                              ("portal", .warning), ("paused", .warning), ("connecting", .warning), ("connected", .ok)] {
        facts.agent = .running(AgentStatus(state: state, reason: "why", since: "2026-01-01T00:00:00Z"))
        let agent = try #require(finding(.agent, facts))
        #expect(agent.severity == severity, "\(state)")
        #expect(agent.evidence.contains("last transition: why at 2026-01-01T00:00:00Z"))
    }
    facts.agent = .unanswered(socket: "/run/roam/agent.sock", why: "permission denied")
    #expect(finding(.agent, facts)?.severity == .warning)
}
