import Topology
import Basics
import PathMonitor
import Testing
@testable import Reconnector
import Netlink

extension [Effect] {
    var probeIDs: [(UInt64, String, Int?)] {
        compactMap { if case .probe(let id, let p, let size) = $0 { (id, p.interface, size) } else { nil } }
    }
    var gaveUp: GiveUp? { lazy.compactMap { if case .giveUp(let why) = $0 { why } else { nil } }.first }
    var readies: Int { filter { $0 == .ready }.count }
}

let server = IPAddress("198.51.100.7")!

/// What the kernel reports as `path`'s uplink comes up: the link, its address, its default route.
func uplink(_ path: Path) -> [NetworkChange] {
    let length = path.source.family == .v4 ? 24 : 64
    return [.linkChanged(Link(index: path.linkIndex, name: path.interface, kind: path.kind, mtu: path.mtu)),
            .addressAdded(Address(linkIndex: path.linkIndex, prefix: Prefix(path.source, length: length)!)),
            .routeAdded(Route(destination: .any(path.source.family), nextHops: [NextHop(gateway: path.gateway, linkIndex: path.linkIndex)],
                              metric: path.metric))]
}

/// What the kernel reports as `path`'s link loses its carrier, or gets it back.
func carrier(_ path: Path, _ on: Bool) -> NetworkChange {
    .linkChanged(Link(index: path.linkIndex, name: path.interface, kind: path.kind, hasCarrier: on, mtu: path.mtu))
}

/// A core on a machine whose uplinks give `paths`, for a server named by host at `server`.
func agentCore(on paths: [Path], wait: Duration? = nil, servers: [[IPAddress]] = [[server]], tunnelCarries: [Prefix] = []) -> AgentCore {
    var model = NetworkModel()
    for change in paths.flatMap(uplink) { model.apply(change) }
    return AgentCore(Reconnector(servers: servers.indices.map { "gateway\($0)" }), startupWait: wait, model: model,
                     servers: servers.map { ServerBook.Entry(named: true, addresses: $0) }, tunnelCarries: tunnelCarries)
}

extension AgentCore {
    /// Feeds every change, returning every effect.
    mutating func handle(_ changes: [NetworkChange], now: Instant) -> [Effect] {
        changes.flatMap { handle(.network($0), now: now) }
    }
}

/// A core connected on `paths.first` at 20 ms.
private func connectedCore(_ paths: [Path], wait: Duration? = .seconds(30), tunnelCarries: [Prefix] = []) -> AgentCore {
    var core = agentCore(on: paths, wait: wait, tunnelCarries: tunnelCarries)
    #expect(core.network.paths == paths)
    _ = core.handle(.start, now: at(0))
    _ = core.handle(.handshakeCompleted(rtt: .milliseconds(20), sizedProbes: false, carriesIPv6: true), now: at(20))
    _ = core.handle(.tunnelAttached, now: at(20))
    return core
}

@Test func anEchoCountsOnlyForAProbeInFlightOnItsOwnPath() {
    var core = connectedCore([eth0, wifi0])
    // Silence: the liveness timer probes the session's path and the best other one.
    _ = core.handle(.dataSent, now: at(1_000))
    let due = core.timers[.liveness]!
    let out = core.handle(.timerFired(.liveness), now: due)
    let probes = out.probeIDs
    #expect(probes.map(\.1) == ["eth0", "wifi0"])
    #expect(Set(probes.map(\.0)).count == 2)
    // An id never sent proves nothing.
    #expect(core.handle(.probeEcho(id: 999, rtt: .milliseconds(5), size: nil), now: due + .milliseconds(5)).isEmpty)
    #expect(core.reconnector.state.name == "probing")
    // wifi0's echo: the session's own path stays suspect, wifi0 is known to work.
    let wifiEcho = probes.first { $0.1 == "wifi0" }!.0
    _ = core.handle(.probeEcho(id: wifiEcho, rtt: .milliseconds(25), size: nil), now: due + .milliseconds(25))
    #expect(core.reconnector.state.name == "probing")
    // The same echo twice counts once; eth0's own echo ends the suspicion.
    #expect(core.handle(.probeEcho(id: wifiEcho, rtt: .milliseconds(25), size: nil), now: due + .milliseconds(26)).isEmpty)
    let ethEcho = probes.first { $0.1 == "eth0" }!.0
    _ = core.handle(.probeEcho(id: ethEcho, rtt: .milliseconds(8), size: nil), now: due + .milliseconds(30))
    #expect(core.reconnector.state == .connected(eth0))
}

@Test func aSizeProbeEchoedShortProvesNothing() {
    var core = agentCore(on: [eth0])
    _ = core.handle(.start, now: at(0))
    _ = core.handle(.handshakeCompleted(rtt: .milliseconds(20), sizedProbes: true, carriesIPv6: true), now: at(20))
    let out = core.handle(.tunnelAttached, now: at(20))
    let sized = out.probeIDs.compactMap { probe in probe.2.map { (probe.0, $0) } }
    guard let (id, size) = sized.first else {
        Issue.record("no size probe after a handshake with a server that echoes sizes: \(out)")
        return
    }
    let mtuBefore = core.reconnector.tunnelMTU
    // A twin of this core hears every size of the round echoed whole: that is proof, and the
    // round ends (its next round is due at once, or the search is done).
    var twin = core
    var proven: [Effect] = []
    for (n, (probe, wanted)) in sized.enumerated() {
        proven += twin.handle(.probeEcho(id: probe, rtt: .milliseconds(20), size: wanted), now: at(45 + Int64(n)))
    }
    #expect(!proven.isEmpty || twin.reconnector.tunnelMTU != mtuBefore || twin.timers[.pathMTU] != core.timers[.pathMTU],
            "whole echoes prove the sizes: \(proven), next round \(String(describing: twin.timers[.pathMTU])) against \(String(describing: core.timers[.pathMTU]))")
    // This core hears each echoed 100 bytes short: no proof the path carries any size.
    var short: [Effect] = []
    for (n, (probe, wanted)) in sized.enumerated() {
        short += core.handle(.probeEcho(id: probe, rtt: .milliseconds(20), size: wanted - 100), now: at(45 + Int64(n)))
    }
    #expect(short.isEmpty && core.reconnector.tunnelMTU == mtuBefore && core.reconnector.isSearchingPathMTU, "\(short)")
    #expect(core.timers[.pathMTU] != twin.timers[.pathMTU] || core.reconnector.tunnelMTU != twin.reconnector.tunnelMTU,
            "short echoes do not end the round as whole ones do")
    // The id is spent either way: the right size later is no longer an answer.
    #expect(core.handle(.probeEcho(id: id, rtt: .milliseconds(20), size: size), now: at(60)).isEmpty)
    #expect(core.reconnector.tunnelMTU <= mtuBefore)
}

@Test func theAgentGivesUpOnlyAfterTheWaitOnAUsablePath() {
    var core = agentCore(on: [], wait: .seconds(30))
    #expect(core.handle(.start, now: at(0)).readies == 1)  // no network: nothing to wait for
    #expect(core.timers[.startup] == nil)
    // A path: attempts start the wait.
    _ = core.handle(uplink(eth0), now: at(5_000))
    #expect(core.timers[.startup] == at(35_000))
    // Too early: nothing.
    #expect(core.handle(.timerFired(.startup), now: at(34_000)).gaveUp == nil)
    // The network goes and comes back: the time without a path did not count.
    _ = core.handle(.network(carrier(eth0, false)), now: at(20_000))
    #expect(core.timers[.startup] == nil)
    _ = core.handle(.network(carrier(eth0, true)), now: at(40_000))
    let due = core.timers[.startup]!
    #expect(due == at(70_000))
    // A suspend does not count either.
    _ = core.handle(.sleep, now: at(50_000))
    _ = core.handle(.wake(sleptFor: .seconds(10)), now: at(60_000))
    let later = core.timers[.startup]!
    #expect(later >= at(90_000))
    let out = core.handle(.timerFired(.startup), now: later)
    #expect(out == [.giveUp(.noAnswer(after: .seconds(30), interface: core.reconnector.state.path?.interface))])
    // Gave up: nothing more is decided, and nothing wakes the runner.
    #expect(core.stopped && core.timers.isEmpty && core.nextDeadline == nil)
    #expect(core.handle(uplink(wifi0), now: at(100_000)).isEmpty)
}

@Test func onceTheTunnelCameUpTheAgentNeverGivesUp() {
    var core = connectedCore([eth0])
    #expect(core.tunnelUp && core.timers[.startup] == nil)
    // The server goes silent for an hour: retries, no give-up.
    _ = core.handle(.dataSent, now: at(1_000))
    var now = at(1_000)
    for _ in 0..<200 {
        guard let (kind, due) = core.timers.min(by: { $0.value < $1.value }), due < at(3_600_000) else { break }
        now = due
        #expect(core.handle(.timerFired(kind), now: now).gaveUp == nil)
    }
    #expect(now > at(60_000))
    // A refusal now is the server's word on a later handshake: the machine fails, the agent stays.
    #expect(core.handle(.handshakeRejected, now: now).gaveUp == nil)
}

@Test func aRefusalBeforeTheTunnelCameUpEndsTheAgent() {
    var core = agentCore(on: [eth0])
    _ = core.handle(.start, now: at(0))
    #expect(core.handle(.handshakeRejected, now: at(20)) == [.giveUp(.rejected)])
    #expect(core.stopped)
}

@Test func readyIsToldOnceAndNotBehindADeadServer() {
    var core = agentCore(on: [eth0], wait: .seconds(30))
    #expect(core.handle(.start, now: at(0)).readies == 0)
    // Ready once the device is up, not before.
    #expect(core.handle(.handshakeCompleted(rtt: .milliseconds(20), sizedProbes: false, carriesIPv6: true), now: at(20)) == [.attachTunnel])
    #expect(core.handle(.tunnelAttached, now: at(20)).readies == 1)
    #expect(core.handle(.network(carrier(eth0, false)), now: at(1_000)).readies == 0)
}

@Test func afterTheStopNothingIsDecided() {
    var core = connectedCore([eth0, wifi0])
    #expect(core.handle(.request(.stop(.byOperator)), now: at(100)) == [.stop(opensMachine: true)])
    #expect(core.handle(.wake(sleptFor: .seconds(5)), now: at(200)).isEmpty)
    #expect(core.handle(.network(carrier(eth0, false)), now: at(300)).isEmpty)
    #expect(core.reconnector.state == .connected(eth0))
}

/// A signal never says the machine may open: a restart, an upgrade, a shutdown, a start that
/// timed out and anyone's kill all look the same; only the operator's stop opens it.
@Test(arguments: [(AgentEvent.Stop.byOperator, true), (.bySignal, false), (.restarting, false)])
func onlyTheOperatorsStopOpensTheMachine(_ who: AgentEvent.Stop, _ opens: Bool) {
    for var core in [connectedCore([eth0]), agentCore(on: [eth0])] {
        #expect(core.handle(.request(.stop(who)), now: at(100)) == [.stop(opensMachine: opens)])
        #expect(core.stopped)
        // A second stop (the operator's after a signal) decides nothing more.
        #expect(core.handle(.request(.stop(.byOperator)), now: at(200)).isEmpty)
    }
}

extension [Effect] {
    var lookUps: [Int] { compactMap { if case .lookUpServer(let i) = $0 { i } else { nil } } }
    var allowed: [IPAddress] { compactMap { if case .allowServer(_, let a, _) = $0 { a } else { nil } } }
    var usedAddresses: [IPAddress] { compactMap { if case .useAddress(let a, _) = $0 { a } else { nil } } }
    var notices: [Notice] { compactMap { if case .notice(let n) = $0 { n } else { nil } } }
}

/// Runs the core's timers until `until` (at most 500 of them), collecting every effect.
private func runTimers(_ core: inout AgentCore, until: Instant) -> [Effect] {
    var out: [Effect] = []
    for _ in 0..<500 {
        guard let (kind, due) = core.timers.min(by: { $0.value < $1.value }), due <= until else { break }
        out += core.handle(.timerFired(kind), now: due)
    }
    return out
}

@Test func aServerThatGoesSilentIsLookedUpAndFollowedOnlyOnceTheLockdownLetsItThrough() {
    var core = connectedCore([eth0])
    let moved = IPAddress("198.51.100.8")!
    // Silence: the session is suspect, and the name is asked again, once.
    _ = core.handle(.dataSent, now: at(1_000))
    let suspect = core.handle(.timerFired(.liveness), now: core.timers[.liveness]!)
    #expect(core.reconnector.state.name == "probing")
    #expect(suspect.lookUps == [0])
    // The name gives another address: the lockdown is asked first; nothing moves yet.
    let answered = core.handle(.serverLookedUp(server: 0, addresses: [moved]), now: at(1_700))
    #expect(answered.allowed == [moved] && answered.usedAddresses.isEmpty)
    #expect(core.serverAddress == server)
    // A yes for another address proves nothing; the yes for this one moves the session.
    #expect(core.handle(.serverAllowed(server: 0, address: server, true), now: at(1_701)).isEmpty)
    let followed = core.handle(.serverAllowed(server: 0, address: moved, true), now: at(1_702))
    #expect(followed.usedAddresses == [moved])
    #expect(core.serverAddress == moved && core.network.endpoint == moved)
    #expect(followed.probeIDs.count == 1, "one probe proves the session at the new address: \(followed)")
    #expect(followed.lookUps.isEmpty, "following asks nothing again")
}

/// The lockdown's addresses for a server are the core's: each address the session moved to is
/// added, at most `allowedPerServer` are kept (a name's answers, forged ones too, cannot grow
/// them), the oldest go first but never the one in use, and a refused one is never kept.
@Test func theLockdownsAddressesForAServerAreBoundedAndKeepTheOneInUse() {
    var core = connectedCore([eth0])
    var inUse = server
    for n in 0..<12 {
        let next = IPAddress("198.51.100.\(20 + n)")!
        let asked = core.handle(.serverLookedUp(server: 0, addresses: [next]), now: at(2_000 + Int64(n) * 100))
        guard case .allowServer(0, next, let lockdown)? = asked.first(where: { if case .allowServer = $0 { true } else { false } }) else {
            Issue.record("no lockdown asked for \(next): \(asked)")
            return
        }
        #expect(lockdown[0].count <= ServerBook.allowedPerServer && lockdown[0].contains(next) && lockdown[0].contains(inUse),
                "\(lockdown)")
        // Every third is refused by the lockdown: the session stays, and the address is not kept.
        let refused = n % 3 == 2
        _ = core.handle(.serverAllowed(server: 0, address: next, !refused), now: at(2_001 + Int64(n) * 100))
        if refused {
            #expect(!core.servers.allowed[0].contains(next) && core.serverAddress == inUse)
        } else {
            #expect(core.servers.allowed[0] == lockdown[0] && core.serverAddress == next)
            inUse = next
        }
    }
    #expect(core.servers.allowed[0].count == ServerBook.allowedPerServer)
}

@Test func aNameThatMovesIntoTheTunnelsOwnRoutesIsNeverFollowedAndTheOperatorIsToldOnce() {
    var core = connectedCore([eth0], tunnelCarries: [Prefix("198.51.100.8/29")!])
    _ = core.handle(.dataSent, now: at(1_000))
    _ = core.handle(.timerFired(.liveness), now: core.timers[.liveness]!)
    let inside = IPAddress("198.51.100.9")!, outside = IPAddress("203.0.113.5")!
    // Inside the split routes: the session's packets would loop into the tunnel. Not proposed.
    let answered = core.handle(.serverLookedUp(server: 0, addresses: [inside]), now: at(1_700))
    #expect(answered.allowed.isEmpty && core.serverAddress == server)
    #expect(answered.notices == [.serverNameUnusable(server: 0, addresses: [inside])])
    // The same answer again is not news; a failed look-up says nothing.
    #expect(core.handle(.serverLookedUp(server: 0, addresses: [inside]), now: at(31_700)).notices.isEmpty)
    #expect(core.handle(.serverLookedUp(server: 0, addresses: nil), now: at(61_700)).notices.isEmpty)
    // An answer with one usable address beside it: that one is proposed, and nothing is noticed.
    let usable = core.handle(.serverLookedUp(server: 0, addresses: [inside, outside]), now: at(91_700))
    #expect(usable.allowed == [outside] && usable.notices.isEmpty)
}

/// The answers at start are judged by the rule every later answer is: a first server whose name
/// gives only addresses inside the split routes ends the agent as it starts, before any attempt.
@Test func aFirstServerInsideTheSplitRoutesEndsTheAgentAtStart() {
    let inside = IPAddress("198.51.100.9")!
    var core = agentCore(on: [eth0], servers: [[inside]], tunnelCarries: [Prefix("198.51.100.8/29")!])
    #expect(core.servers.allowed == [[]])
    #expect(core.handle(.start, now: at(0)) == [.giveUp(.serverCarried(server: 0, addresses: [inside]))])
    #expect(core.attempts == 0 && core.stopped && core.nextDeadline == nil)
}

/// Another server with nothing usable at start is told of and let through nothing; an answer
/// with a usable address beside one inside keeps that one alone, and says nothing.
@Test func theAnswersAtStartAreJudgedAsEveryLaterOne() {
    let inside = IPAddress("198.51.100.9")!, alsoInside = IPAddress("198.51.100.10")!, outside = IPAddress("203.0.113.5")!
    var core = agentCore(on: [eth0], servers: [[inside, server], [inside, alsoInside]], tunnelCarries: [Prefix("198.51.100.8/29")!])
    #expect(core.servers.allowed == [[server], []] && core.serverAddress == server)
    let started = core.handle(.start, now: at(0))
    #expect(started.gaveUp == nil && started.notices == [.serverCarried(server: 1, addresses: [inside, alsoInside])])
    #expect(started.contains { $0.isAttempt })
    #expect(core.reconnector.addressless == [1], "a failover passes it while another has an address")
    // A later answer for the same server is filtered by the same rule.
    _ = core.handle(.serverLookedUp(server: 1, addresses: [alsoInside, outside]), now: at(10))
    #expect(core.servers.entries[1].addresses == [outside])
    #expect(core.reconnector.addressless.isEmpty)
}

/// A name may answer with addresses no session can reach another host at (this machine, an
/// IPv4 address written as IPv6, which a socket of the other family cannot send to, no host,
/// multicast, link-local, broadcast): at start and later, none is kept, and the one usable beside
/// them is.
@Test func addressesOfNoOtherHostAreNeverTheServers() {
    let useless = ["127.0.0.1", "::1", "::ffff:203.0.113.5", "0.0.0.0", "::", "224.0.0.1", "ff02::1", "fe80::1", "169.254.1.1",
                   "255.255.255.255"].map { IPAddress($0)! }
    let outside = IPAddress("203.0.113.5")!
    for address in useless {
        #expect(ServerBook.usable([address, outside], carried: []) == [outside], "\(address)")
    }
    var core = agentCore(on: [eth0], servers: [useless])
    #expect(core.servers.allowed == [[]])
    #expect(core.handle(.start, now: at(0)) == [.giveUp(.serverCarried(server: 0, addresses: useless))])
    var later = connectedCore([eth0])
    _ = later.handle(.serverLookedUp(server: 0, addresses: useless), now: at(1_700))
    #expect(later.serverAddress == server && later.servers.entries[0].addresses.allSatisfy(\.isRemoteUnicast))
}

@Test func aLockdownThatRefusesKeepsTheOldAddress() {
    var core = connectedCore([eth0])
    _ = core.handle(.dataSent, now: at(1_000))
    _ = core.handle(.timerFired(.liveness), now: core.timers[.liveness]!)
    let moved = IPAddress("198.51.100.8")!
    _ = core.handle(.serverLookedUp(server: 0, addresses: [moved]), now: at(1_700))
    let refused = core.handle(.serverAllowed(server: 0, address: moved, false), now: at(1_701))
    #expect(refused.usedAddresses.isEmpty && core.serverAddress == server)
    // A failed look-up keeps what was known; an answer that still names the address changes nothing.
    #expect(core.handle(.serverLookedUp(server: 0, addresses: nil), now: at(1_800)).allowed.isEmpty)
    #expect(core.handle(.serverLookedUp(server: 0, addresses: [server, moved]), now: at(1_900)).allowed.isEmpty)
}

@Test func whileBackingOffTheNameIsAskedEveryHalfMinuteOneLookUpAtATime() {
    var core = agentCore(on: [eth0], wait: nil)
    _ = core.handle(.start, now: at(0))
    // The server never answers: attempts fail into backoff.
    var out = runTimers(&core, until: at(600_000))
    #expect(core.reconnector.state.name == "backing-off")
    // One look-up went out; until it answers, the asks of later failures fold into one more.
    #expect(out.lookUps == [0], "\(out.lookUps)")
    #expect(core.handle(.serverLookedUp(server: 0, addresses: [server]), now: at(600_001)).lookUps == [0])
    #expect(core.handle(.serverLookedUp(server: 0, addresses: [server]), now: at(600_002)).lookUps.isEmpty)
    // From now on the backoff's own look-up timer asks, every 30 s.
    let due = core.timers[.lookUp]!
    #expect(due <= at(600_001) + ServerBook.lookUpEvery)
    out = core.handle(.timerFired(.lookUp), now: due)
    #expect(out.lookUps == [0])
    #expect(core.timers[.lookUp] == due + ServerBook.lookUpEvery)
    // A server that moved is a new chance: the attempt goes at once to its new address.
    let moved = IPAddress("2001:db8::7")!
    _ = core.handle(.serverLookedUp(server: 0, addresses: [moved, IPAddress("198.51.100.9")!]), now: due + .milliseconds(20))
    // (No uplink reaches the IPv6 address: the IPv4 one is followed.)
    let v4 = IPAddress("198.51.100.9")!
    let followed = core.handle(.serverAllowed(server: 0, address: v4, true), now: due + .milliseconds(21))
    #expect(followed.usedAddresses == [v4])
    #expect(core.reconnector.state.name == "connecting" || core.reconnector.state.name == "probing", "\(core.reconnector.state.name)")
}

// MARK: On-demand rules in the core

private let officeGateway = "52:54:00:0f:f1:ce"
private let officePin = KeyPin(hash: Array(repeating: 7, count: 32))!
private let officeProbe = OnDemandRule.Probe(url: "https://10.20.0.1/roam", expect: .status(204), pin: officePin)
private let officeRule = OnDemandRule(name: "office", match: .init(gatewayMACs: [officeGateway], probe: officeProbe),
                                      action: .disconnect, liftsLockdown: true)

/// The office's server answered the pinned probe over `path`, showing `key`.
private func proven(_ core: AgentCore, on path: Path, key: KeyPin = officePin) -> AgentEvent {
    .networkFact(.probeAnswered(officeProbe, generation: core.onDemand.generation,
                                .expected(proof: directProof(key, on: path.id))))
}

extension [Effect] {
    var attempts: Int { filter { if case .bind = $0 { true } else if case .handshake = $0 { true } else { false } }.count }
    var asked: [FactRequest] { compactMap { if case .findOut(let request) = $0 { request } else { nil } } }
}

/// A trusted network is never tried: at start, and when a cable to it is plugged in while the
/// session runs elsewhere, nothing is sent until the rules have read what they match on.
@Test func aNetworkTheRulesTrustIsNeverTried() {
    var core = agentCore(on: [eth0])
    core = AgentCore(core.reconnector, model: core.network.model, servers: [ServerBook.Entry(named: true, addresses: [server])],
                     rules: OnDemandRules([officeRule]))
    let start = core.handle(.start, now: at(0))
    #expect(start.contains(.followNotices(FactNotices(gateway: true))))
    #expect(start.asked == [.gateway(eth0.gateway!, linkIndex: eth0.linkIndex, resolve: true)])
    #expect(start.attempts == 0 && core.reconnector.state == .offline, "the machine hears of the paths only after the rules")
    let answer = core.handle(.networkFact(.gateway(linkIndex: eth0.linkIndex, eth0.gateway!, mac: officeGateway)), now: at(1))
    #expect(answer.attempts == 0 && !answer.contains(.liftLockdown(interface: "eth0")), "the hardware address proves nothing")
    #expect(answer.asked == [.probe(officeProbe, via: eth0, generation: core.onDemand.generation)])
    let proof = core.handle(proven(core, on: eth0), now: at(2))
    #expect(proof.attempts == 0)
    #expect(proof.contains(.liftLockdown(interface: "eth0")))
    #expect(core.reconnector.state == .disconnected(rule: "office", lifted: eth0.id))

    // Elsewhere: Wi-Fi only, with another gateway.
    var away = agentCore(on: [wifi0])
    away = AgentCore(away.reconnector, model: away.network.model, servers: [ServerBook.Entry(named: true, addresses: [server])],
                     rules: OnDemandRules([officeRule]))
    _ = away.handle(.start, now: at(0))
    let cafe = away.handle(.networkFact(.gateway(linkIndex: wifi0.linkIndex, wifi0.gateway!, mac: "a4:91:b1:00:ca:fe")), now: at(1))
    #expect(cafe.attempts > 0, "another gateway: the tunnel comes up")
    _ = away.handle(.handshakeCompleted(rtt: .milliseconds(20), sizedProbes: false, carriesIPv6: false), now: at(30))
    _ = away.handle(.tunnelAttached, now: at(30))
    // Docked at the office: the better path is not tried before the rules know its gateway.
    let docked = away.handle(uplink(eth0), now: at(10_000))
    #expect(docked.attempts == 0 && docked.asked.contains(.gateway(eth0.gateway!, linkIndex: eth0.linkIndex, resolve: true)))
    let gateway = away.handle(.networkFact(.gateway(linkIndex: eth0.linkIndex, eth0.gateway!, mac: officeGateway)), now: at(10_001))
    #expect(gateway.attempts == 0 && gateway.asked.count == 1, "the rules wait for the probe, the session stays")
    let trusted = away.handle(proven(away, on: eth0), now: at(10_001))
    #expect(trusted.contains(.disconnect) && trusted.contains(.liftLockdown(interface: "eth0")))
    #expect(trusted.attempts == 0)
    var later: [Effect] = []
    var t = 10_001
    while let due = away.nextDeadline, due <= at(20_000), later.count < 1000 {
        t = Int(due.nanoseconds / 1_000_000)
        later += away.handle(.timerFired(away.timers.first { $0.value == due }!.key), now: due)
    }
    #expect(later.attempts == 0, "nothing tried on the office network, \(t) ms")
}

/// A core on eth0 at the office, whose pinned probe proved the network: the rule lifted the
/// lockdown there.
private func liftedAtTheOffice() -> AgentCore {
    var core = agentCore(on: [eth0])
    core = AgentCore(core.reconnector, model: core.network.model, servers: [ServerBook.Entry(named: true, addresses: [server])],
                     rules: OnDemandRules([officeRule]))
    _ = core.handle(.start, now: at(0))
    _ = core.handle(.networkFact(.gateway(linkIndex: eth0.linkIndex, eth0.gateway!, mac: officeGateway)), now: at(1))
    #expect(core.handle(proven(core, on: eth0), now: at(2)).contains(.liftLockdown(interface: "eth0")))
    return core
}

/// The lift holds only while the proof does: the pinned probe is made again on the network,
/// and the first recheck that fails (the key not shown, no answer) closes the lockdown and
/// brings the tunnel up there.
@Test func aProofLostOnRecheckPutsTheLockdownBackAndConnects() {
    var core = liftedAtTheOffice()
    var rechecks: [FactRequest] = []
    var fired = 0
    while rechecks.isEmpty, let due = core.nextDeadline, fired < 100 {
        fired += 1
        rechecks += core.handle(.timerFired(core.timers.first { $0.value == due }!.key), now: due).asked
    }
    #expect(rechecks == [.probe(officeProbe, via: eth0, generation: core.onDemand.generation)])
    #expect(core.reconnector.state == .disconnected(rule: "office", lifted: eth0.id), "lifted while the recheck is out")
    let lost = core.handle(.networkFact(.probeAnswered(officeProbe, generation: core.onDemand.generation, .unexpected)),
                           now: at(60_100))
    #expect(lost.contains(.restoreLockdown) && lost.attempts > 0, "\(lost)")
    #expect(lost.firstIndex(of: .restoreLockdown)! < lost.firstIndex { if case .bind = $0 { true } else { false } }!,
            "the lockdown closes before anything is sent")
}

/// A lockdown that cannot be lifted stays whole: the rule's disconnect stands, the state says
/// the lockdown is not lifted and why, and nothing is restored that was never lifted.
@Test func aLiftTheLockdownRefusesLeavesTheMachineClosed() {
    var core = liftedAtTheOffice()
    let refused = core.handle(.liftRefused("busy"), now: at(3))
    #expect(core.reconnector.state == .disconnected(rule: "office", lifted: nil))
    let reasons = refused.compactMap { if case .transition(let t) = $0 { t.reason.description } else { nil } }
    #expect(reasons == ["liftRefused(busy)"])
    #expect(!refused.contains(.restoreLockdown) && refused.attempts == 0)
    #expect(core.handle(.liftRefused("busy"), now: at(4)).isEmpty, "a second refusal of a lift no longer asked changes nothing")
}

/// A session that cannot turn to its server (its protocol core cannot be made) ends the agent
/// with why, rather than sending into nothing until attempts time out.
@Test func aSessionThatCannotGoOnEndsTheAgentWithWhy() {
    var core = agentCore(on: [eth0])
    _ = core.handle(.start, now: at(0))
    let effects = core.handle(.sessionFailed("cannot use server gateway0: bad key"), now: at(1))
    #expect(effects.gaveUp == .sessionFailed("cannot use server gateway0: bad key"))
    #expect(core.stopped && core.handle(.timerFired(.handshake), now: at(5000)).isEmpty)
}

/// A reload that drops every rule brings the tunnel up where a rule kept it down.
@Test func rulesDroppedByAReloadBringTheTunnelUp() {
    var core = agentCore(on: [eth0])
    core = AgentCore(core.reconnector, model: core.network.model, servers: [ServerBook.Entry(named: true, addresses: [server])],
                     rules: OnDemandRules([officeRule]))
    _ = core.handle(.start, now: at(0))
    _ = core.handle(.networkFact(.gateway(linkIndex: eth0.linkIndex, eth0.gateway!, mac: officeGateway)), now: at(1))
    _ = core.handle(proven(core, on: eth0), now: at(1))
    #expect(core.handle(.reloaded(Reload(config: Config(), rules: OnDemandRules([officeRule]))), now: at(2)).isEmpty,
            "the same rules change nothing")
    let reload = core.handle(.reloaded(Reload(config: Config(), rules: OnDemandRules())), now: at(3))
    #expect(reload.contains(.followNotices(FactNotices())))
    #expect(reload.contains(.restoreLockdown))
    #expect(reload.attempts > 0)
}

/// A reload that changes the tunnel itself ends this agent for a new one in place, keeping the
/// machine closed; its tunables are not applied to the tunnel it leaves.
@Test func aReloadThatChangesTheTunnelRestartsTheAgentInPlace() {
    var core = agentCore(on: [eth0])
    _ = core.handle(.start, now: at(0))
    var faster = Config()
    faster.livenessTimeout = .milliseconds(300)
    let effects = core.handle(.reloaded(Reload(config: faster, rules: OnDemandRules(), tunnelChanges: ["servers", "tcp"])), now: at(1))
    #expect(effects == [.restart(because: ["servers", "tcp"])])
    #expect(core.stopped && core.reconnector.config.livenessTimeout != .milliseconds(300))
    #expect(core.handle(.timerFired(.handshake), now: at(5000)).isEmpty, "a stopping agent decides nothing more")
}

// MARK: The operator

extension [Effect] {
    var replies: [OperatorReply] { compactMap { if case .reply(let answer) = $0 { answer } else { nil } } }
}

/// A core behind a portal on wifi0 since 5.03 s.
private func coreBehindPortal() -> AgentCore {
    var core = agentCore(on: [wifi0])
    _ = core.handle(.start, now: at(0))
    _ = core.handle(.timerFired(.handshake), now: at(5000))
    _ = core.handle(.connectivity(.portal(url: "http://login.example/"), on: wifi0.id), now: at(5030))
    return core
}

/// The portal window is its opener's: another user can neither join it nor close it; root can.
/// It counts as open only once the lockdown let it through.
@Test func thePortalWindowIsItsOpenersAndOpensOnlyOnTheLockdownsYes() {
    var away = agentCore(on: [wifi0])
    _ = away.handle(.start, now: at(0))
    #expect(away.handle(.request(.openPortalWindow(by: 1000)), now: at(10)).replies == [.noPortal("connecting")])

    var core = coreBehindPortal()
    let open = core.handle(.request(.openPortalWindow(by: 1000)), now: at(6000))
    #expect(open.contains { if case .openPortalWindow = $0 { true } else { false } })
    #expect(open.replies.isEmpty, "answered once the lockdown said yes")
    let until = core.reconnector.portalWindowUntil!
    let yes = core.handle(.portalWindowOpened(true), now: at(6001))
    #expect(yes.replies == [.portalWindowOpen(url: "http://login.example/", interface: "wifi0", until: until)])
    #expect(core.portalWindowOwner == 1000)

    #expect(core.handle(.request(.openPortalWindow(by: 1001)), now: at(6100)).replies == [.notPermitted])
    #expect(core.handle(.request(.closePortalWindow(by: 1001)), now: at(6100)).replies == [.notPermitted])
    #expect(core.reconnector.portalWindowUntil != nil, "another user's close changes nothing")
    #expect(core.handle(.request(.openPortalWindow(by: 0)), now: at(6200)).replies
        == [.portalWindowOpen(url: "http://login.example/", interface: "wifi0", until: until)], "root joins")
    let closed = core.handle(.request(.closePortalWindow(by: 1000)), now: at(7000))
    #expect(closed.replies == [.portalWindowClosed] && closed.contains(.closePortalWindow))
    #expect(core.portalWindowOwner == nil)

    // Another user opens the next window; the lockdown refuses it: no window stands (there is
    // nothing to close: the opening left nothing behind), and the operator is told.
    let recheck = core.timers[.recheck]
    _ = core.handle(.request(.openPortalWindow(by: 1001)), now: at(8000))
    #expect(core.isOpeningWindow && core.reconnector.portalWindowUntil != nil)
    let no = core.handle(.portalWindowOpened(false), now: at(8001))
    #expect(no.replies == [.portalWindowFailed] && !no.contains(.closePortalWindow), "\(no)")
    #expect(core.reconnector.portalWindowUntil == nil && core.portalWindowOwner == nil && !core.isOpeningWindow)
    #expect(core.timers[.portalWindow] == nil && core.timers[.recheck] == recheck, "the rechecks go on as they were due")
}

/// Each operator request is answered, as the state it meets allows.
@Test func operatorRequestsAreAnsweredFromTheStateTheyMeet() {
    var core = connectedCore([eth0])
    #expect(core.handle(.request(.resume), now: at(100)).replies == [.upAlready("connected")])
    #expect(core.handle(.request(.reconnect), now: at(200)).replies == [.reconnecting])
    let down = core.handle(.request(.pause), now: at(300))
    #expect(down.replies == [.paused(already: false)] && down.contains(.disconnect))
    #expect(core.handle(.request(.pause), now: at(400)).replies == [.paused(already: true)])
    #expect(core.handle(.request(.reconnect), now: at(500)).replies == [.down])
    #expect(core.handle(.request(.resume), now: at(600)).replies == [.connecting])
}

// MARK: The tunnel device and its resolvers

@Test func theDeviceIsAskedForOnceAndTheSessionIsUpOnlyWithIt() {
    var core = agentCore(on: [eth0], wait: .seconds(30))
    _ = core.handle(.start, now: at(0))
    #expect(core.handle(.handshakeCompleted(rtt: .milliseconds(20), sizedProbes: false, carriesIPv6: true), now: at(20)) == [.attachTunnel])
    #expect(core.reconnector.state.name == "connecting" && !core.tunnelUp, "not up before the device is")
    _ = core.handle(.tunnelAttached, now: at(21))
    #expect(core.reconnector.state == .connected(eth0) && core.tunnelUp)
    // Fresh keys later: the device stays, nothing asks for another.
    _ = core.handle(.request(.reconnect), now: at(5_000))
    let again = core.handle(.handshakeCompleted(rtt: .milliseconds(20), sizedProbes: false, carriesIPv6: true), now: at(5_020))
    #expect(!again.contains(.attachTunnel) && core.reconnector.state == .connected(eth0))
}

@Test func aDeviceThatCannotBeMadeEndsTheAgent() {
    var core = agentCore(on: [eth0])
    _ = core.handle(.start, now: at(0))
    _ = core.handle(.handshakeCompleted(rtt: .milliseconds(20), sizedProbes: false, carriesIPv6: true), now: at(20))
    #expect(core.handle(.tunnelFailed("no /dev/net/tun"), now: at(21)) == [.giveUp(.tunnelFailed("no /dev/net/tun"))])
    #expect(!core.tunnelUp && core.stopped)
}

private func resolverCore(_ choice: ResolverChoice, on paths: [Path] = [eth0]) -> AgentCore {
    var model = NetworkModel()
    for change in paths.flatMap(uplink) { model.apply(change) }
    return AgentCore(Reconnector(servers: ["gateway0"]), model: model, servers: [ServerBook.Entry(named: true, addresses: [server])],
                     resolvers: choice)
}

private func dns(_ resolvers: String...) -> DNSSettings {
    (try? DNSSettings(resolvers: resolvers.map { IPAddress($0)! }, searchDomains: ["corp.example"])) ?? .none
}

extension [Effect] {
    var resolverDecisions: [ResolverDecision] { compactMap { if case .resolvers(let d) = $0 { d } else { nil } } }
}

@Test func resolversComeWithTheDeviceAndNeverOneAskedInClear() throws {
    // A full tunnel; eth0's own subnet is 10.20.0.0/24 (`uplink`), reached on the link.
    let onTheLink = IPAddress("10.20.0.53")!
    var core = resolverCore(ResolverChoice(override: nil, carried: [.any(.v4), .any(.v6)], lockdown: true))
    _ = core.handle(.start, now: at(0))
    let pushed = try DNSSettings(resolvers: [IPAddress("10.77.0.53")!, onTheLink], searchDomains: ["corp.example"])
    let before = core.handle(.handshakeCompleted(rtt: .milliseconds(20), sizedProbes: false, carriesIPv6: true, dns: .success(pushed)), now: at(20))
    #expect(before.resolverDecisions.isEmpty, "nothing before the device is up")
    let decided = core.handle(.tunnelAttached, now: at(21)).resolverDecisions
    #expect(decided.count == 1)
    #expect(decided.first?.use?.resolvers == [IPAddress("10.77.0.53")!] && decided.first?.use?.searchDomains == ["corp.example"])
    #expect(decided.first?.inClear == [onTheLink] && decided.first?.offLAN == pushed.resolvers)
    // The same list at the next handshake: nothing new to give.
    _ = core.handle(.request(.reconnect), now: at(5_000))
    #expect(core.handle(.handshakeCompleted(rtt: .milliseconds(20), sizedProbes: false, carriesIPv6: true, dns: .success(pushed)),
                        now: at(5_020)).resolverDecisions.isEmpty)
    // A server that got its list wrong: none, and why.
    let refused = core.handle(.handshakeCompleted(rtt: .milliseconds(20), sizedProbes: false, carriesIPv6: true,
                                                  dns: .failure(.tooManyResolvers(9))), now: at(6_000)).resolverDecisions
    #expect(refused.count == 1 && refused.first?.use == nil && refused.first?.why?.contains("refused") == true)
}

@Test func theConfigurationsResolversWinAndASplitTunnelKeepsOnlyWhatItCarries() throws {
    let own = dns("10.77.0.53", "9.9.9.9")
    var core = resolverCore(ResolverChoice(override: own, carried: [Prefix("10.77.0.0/16")!], lockdown: false))
    _ = core.handle(.start, now: at(0))
    _ = core.handle(.handshakeCompleted(rtt: .milliseconds(20), sizedProbes: false, carriesIPv6: true,
                                        dns: .success(dns("10.77.0.1"))), now: at(20))
    let decided = core.handle(.tunnelAttached, now: at(21)).resolverDecisions
    #expect(decided.first?.use?.resolvers == [IPAddress("10.77.0.53")!] && decided.first?.inClear == [IPAddress("9.9.9.9")!])
    // Every resolver outside: none given, said so (no lockdown, so nothing about it).
    var outside = resolverCore(ResolverChoice(override: dns("9.9.9.9"), carried: [Prefix("10.77.0.0/16")!], lockdown: false))
    _ = outside.handle(.start, now: at(0))
    _ = outside.handle(.handshakeCompleted(rtt: .milliseconds(20), sizedProbes: false, carriesIPv6: true), now: at(20))
    let none = outside.handle(.tunnelAttached, now: at(21)).resolverDecisions
    #expect(none.first?.use == nil && none.first?.why == "every resolver for the tunnel would be asked in clear")
}

/// A device that keeps its MTU where the core asked for another is known as it is: the next
/// size a search finds is asked for again, not taken as set.
@Test func aTunnelMTUTheDeviceRefusedIsKnownAsItIs() {
    var core = agentCore(on: [eth0])
    _ = core.handle(.start, now: at(0))
    let before = core.reconnector.tunnelMTU
    _ = core.handle(.tunnelMTUFailed(actual: 1500, why: "Operation not permitted"), now: at(1))
    #expect(before != 1500 && core.reconnector.tunnelMTU == 1500)
}

/// The device keeps the first session's addresses through every reconnect: an IPv6 one keeps its
/// MTU floor at 1,280 when a later server (a failover, a handover) gives IPv4 alone; Linux would
/// take IPv6 off a device below 1,280.
@Test func theDevicesIPv6KeepsTheFloorWhateverALaterServerGives() {
    var core = agentCore(on: [eth0])
    _ = core.handle(.start, now: at(0))
    _ = core.handle(.handshakeCompleted(rtt: .milliseconds(20), sizedProbes: true, carriesIPv6: true), now: at(20))
    _ = core.handle(.tunnelAttached, now: at(21))
    let floor = core.reconnector.floorMTU
    _ = core.handle(.handshakeCompleted(rtt: .milliseconds(20), sizedProbes: true, carriesIPv6: false), now: at(200_000))
    #expect(floor == Config().mtuFloor(ipv6: true) && core.reconnector.floorMTU == floor)
    _ = core.handle(.handoverReady(rtt: .milliseconds(20), sizedProbes: true, carriesIPv6: false), now: at(200_100))
    #expect(core.reconnector.floorMTU == floor)
}
