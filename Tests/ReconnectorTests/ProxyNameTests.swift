import Topology
import Basics
import PathMonitor
import Testing
@testable import Reconnector
import Netlink

/// A proxy named by host: its name is looked up on each network, the lockdown opened to exactly
/// what those look-ups gave, and no stream tried on a network before its answer is let through.

private let office = Path(linkIndex: 3, interface: "eth0", kind: .ethernet, source: IPAddress("10.44.3.17")!,
                          gateway: IPAddress("10.44.3.1"), metric: 100, prefixLength: 0, mtu: 1500)
private let home = Path(linkIndex: 4, interface: "wifi0", kind: .wifi, source: IPAddress("192.168.1.40")!,
                        gateway: IPAddress("192.168.1.1"), metric: 600, prefixLength: 0, mtu: 1500)
private let proxyAddress = IPAddress("10.44.3.8")!

private func proxiedCore(on paths: [Path], tunnelCarries: [Prefix] = []) -> AgentCore {
    var config = Config()
    config.stream = Config.StreamPolicy()
    var model = NetworkModel()
    for change in paths.flatMap(uplink) { model.apply(change) }
    return AgentCore(Reconnector(config: config), model: model, servers: [ServerBook.Entry(named: false, addresses: [server])],
                     tunnelCarries: tunnelCarries, proxyNamed: true)
}

extension [Effect] {
    fileprivate var proxyLookUps: [String] { compactMap { if case .lookUpProxy(let p) = $0 { p.interface } else { nil } } }
    fileprivate var proxyAllowances: [(NetworkKey, IPAddress, [IPAddress])] {
        compactMap { if case .allowProxy(let key, let address, let lockdown) = $0 { (key, address, lockdown) } else { nil } }
    }
    fileprivate var streamEffects: [Path] {
        compactMap {
            switch $0 {
            case .bind(let p, _, _) where p.transport == .stream: p
            case .handshake(let p, _) where p.transport == .stream: p
            case .probe(_, let p, _) where p.transport == .stream: p
            default: nil
            }
        }
    }
}

@Test func theProxysNameIsLookedUpOnEachNetworkAndNoStreamOpensBeforeItsAnswerIsLetThrough() {
    var core = proxiedCore(on: [office])
    let start = core.handle(.start, now: at(0))
    #expect(start.proxyLookUps == ["eth0"], "asked on the network as it appears")
    // UDP goes unanswered for the race delay, but the proxy has no address there yet: no stream.
    let race = core.handle(.timerFired(.race), now: at(300))
    #expect(race.streamEffects.isEmpty && start.streamEffects.isEmpty, "\(race)")
    // The answer: its address of the path's family, outside the tunnel's routes, goes to the lockdown.
    let answer = core.handle(.proxyLookedUp(on: office, addresses: [IPAddress("2001:db8::8")!, proxyAddress]), now: at(350))
    #expect(answer.proxyAllowances.map(\.1) == [proxyAddress] && answer.proxyAllowances.map(\.2) == [[proxyAddress]])
    #expect(answer.streamEffects.isEmpty, "nothing before the lockdown lets it through")
    let allowed = core.handle(.proxyAllowed(on: NetworkKey(office), address: proxyAddress, true), now: at(360))
    #expect(core.proxies?.reachable == [NetworkKey(office)])
    // The attempt over UDP races the stream now, as if it had from the start.
    #expect(core.timers[.race] == at(360), "\(allowed)")
    let stream = core.handle(.timerFired(.race), now: at(360))
    #expect(stream.streamEffects.first == office.over(.stream))
}

@Test func aNetworkWhoseLookUpGaveNothingTriesNoStreamAndEachAttemptAsksAgain() {
    var core = proxiedCore(on: [office])
    _ = core.handle(.start, now: at(0))
    _ = core.handle(.proxyLookedUp(on: office, addresses: nil), now: at(30))
    _ = core.handle(.timerFired(.race), now: at(300))
    // The attempt times out: no stream to fall back on, so it backs off.
    var effects = core.handle(.timerFired(.handshake), now: at(5000))
    #expect(effects.streamEffects.isEmpty)
    guard case .backingOff = core.reconnector.state else { Issue.record("\(core.reconnector.state)"); return }
    // The retry is a new attempt: the name is asked again there.
    effects = core.handle(.timerFired(.retry), now: core.timers[.retry] ?? at(6000))
    #expect(effects.proxyLookUps == ["eth0"], "\(effects)")
    #expect(effects.streamEffects.isEmpty)
}

@Test func aProxyFoundWhileBackingOffEndsTheBackoffWithAnAttempt() {
    var core = proxiedCore(on: [office])
    _ = core.handle(.start, now: at(0))
    // The network's DNS is slow (a look-up may take two 5 s timeouts): the attempt fails first.
    _ = core.handle(.timerFired(.handshake), now: at(5000))
    guard case .backingOff = core.reconnector.state, let retry = core.timers[.retry], retry > at(5002) else {
        Issue.record("\(core.reconnector.state) \(core.timers)"); return
    }
    let answer = core.handle(.proxyLookedUp(on: office, addresses: [proxyAddress]), now: at(5001))
    #expect(answer.proxyAllowances.count == 1)
    let allowed = core.handle(.proxyAllowed(on: NetworkKey(office), address: proxyAddress, true), now: at(5002))
    let reasons = allowed.compactMap { if case .transition(let t) = $0 { t.reason.description } else { nil } }
    #expect(reasons == ["proxyFound(eth0)"], "\(allowed)")
    guard case .connecting = core.reconnector.state else { Issue.record("\(core.reconnector.state)"); return }
    #expect(core.timers[.race] != nil, "UDP first, the stream raced after the delay")
}

@Test func theLockdownsRefusalKeepsTheStreamsOffThatNetwork() {
    var core = proxiedCore(on: [office])
    _ = core.handle(.start, now: at(0))
    _ = core.handle(.proxyLookedUp(on: office, addresses: [proxyAddress]), now: at(30))
    _ = core.handle(.proxyAllowed(on: NetworkKey(office), address: proxyAddress, false), now: at(31))
    #expect(core.proxies?.reachable == [])
    #expect(core.handle(.timerFired(.race), now: at(300)).streamEffects.isEmpty)
}

@Test func addressesInsideTheTunnelsRoutesOrOfTheOtherFamilyAreNotUsed() {
    var core = proxiedCore(on: [office], tunnelCarries: [Prefix("10.44.3.0/28")!])
    _ = core.handle(.start, now: at(0))
    let effects = core.handle(.proxyLookedUp(on: office, addresses: [proxyAddress, IPAddress("2001:db8::8")!]), now: at(30))
    #expect(effects.proxyAllowances.isEmpty, "10.44.3.8 is the tunnel's, and the path is IPv4: \(effects)")
}

@Test func eachNetworkHasItsOwnAddressAndTheLockdownHoldsBoth() {
    var core = proxiedCore(on: [office, home])
    let start = core.handle(.start, now: at(0))
    #expect(Set(start.proxyLookUps) == ["eth0", "wifi0"])
    let first = core.handle(.proxyLookedUp(on: office, addresses: [proxyAddress]), now: at(10))
    _ = core.handle(.proxyAllowed(on: NetworkKey(office), address: proxyAddress, true), now: at(11))
    let other = IPAddress("192.168.1.3")!
    let second = core.handle(.proxyLookedUp(on: home, addresses: [other]), now: at(12))
    #expect(first.proxyAllowances.map(\.2) == [[proxyAddress]])
    #expect(second.proxyAllowances.map(\.2) == [[proxyAddress, other]], "every network's address, the new one added")
    _ = core.handle(.proxyAllowed(on: NetworkKey(home), address: other, true), now: at(13))
    #expect(core.proxies?.reachable == [NetworkKey(office), NetworkKey(home)])
    // The same answer again asks nothing of the lockdown.
    _ = core.handle(.wake(sleptFor: .seconds(60)), now: at(20))
    #expect(core.handle(.proxyLookedUp(on: office, addresses: [proxyAddress]), now: at(21)).proxyAllowances.isEmpty)
}

@Test func aLiteralProxyAsksNothing() {
    var model = NetworkModel()
    for change in uplink(office) { model.apply(change) }
    var config = Config()
    config.stream = Config.StreamPolicy()
    var core = AgentCore(Reconnector(config: config), model: model, servers: [ServerBook.Entry(named: false, addresses: [server])])
    #expect(core.handle(.start, now: at(0)).proxyLookUps.isEmpty)
    #expect(core.handle(.timerFired(.race), now: at(300)).streamEffects.first == office.over(.stream))
}

@Test func theBookKeepsEightNetworksAndForgetsTheOneAskedAboutLongestAgo() {
    var book = ProxyBook()
    let keys = (0..<9).map { NetworkKey(interface: "wifi0", gateway: .v4(0x0A00_0001 + UInt32($0) << 8)) }
    for (n, key) in keys.enumerated() {
        let asked = book.ask(key)
        #expect(asked)
        let lockdown = book.answered(key, .v4(0x0A00_0008 + UInt32(n) << 8))
        let gained = book.allowed(key, .v4(0x0A00_0008 + UInt32(n) << 8), true)
        #expect(gained, "a network gained a stream")
        #expect((lockdown?.count ?? 0) <= ProxyBook.networksKept)
    }
    #expect(book.networks.count == ProxyBook.networksKept && book[keys[0]] == nil)
    #expect(book.reachable.count == ProxyBook.networksKept)
    // The lockdown then holds the eight networks' addresses, the forgotten one's gone.
    let asked = book.ask(keys[8])
    #expect(asked)
    let moved = book.answered(keys[8], .v4(0x0A00_0063))
    #expect(moved?.count == ProxyBook.networksKept && moved?.contains(.v4(0x0A00_0008)) == false)
}
