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
    /// Each opening asked of the lockdown: the network, its new address, and every address let through.
    fileprivate var proxyAllowances: [(NetworkKey, IPAddress, [IPAddress])] {
        compactMap { effect -> (NetworkKey, IPAddress, [IPAddress])? in
            guard case .proxyAt(let all, let key?) = effect, let address = all[key] else { return nil }
            return (key, address, [IPAddress](Set(all.values)).sorted { $0.description < $1.description })
        }
    }
    /// Each closing: what the lockdown still lets through.
    fileprivate var proxyClosings: [[NetworkKey: IPAddress]] {
        compactMap { if case .proxyAt(let all, nil) = $0 { all } else { nil } }
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
    #expect(second.proxyAllowances.map(\.2) == [[proxyAddress, other].sorted { $0.description < $1.description }],
            "every network's address, the new one added")
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

@Test func theBookAsksAboutEightNetworksAtMostAndTheLockdownNeverHoldsMore() {
    var book = ProxyBook()
    let keys = (0..<20).map { NetworkKey(interface: "wwan0", gateway: .v4(0x0A00_0001 + UInt32($0) << 8)) }
    // Twenty networks at once, none answered yet: eight look-ups, no more.
    let asked = keys.filter { book.ask($0) }
    #expect(asked.count == ProxyBook.networksKept)
    for (n, key) in asked.enumerated() {
        #expect(book.answered(key, .address(.v4(0x0A00_0008 + UInt32(n) << 8))) == .open(.v4(0x0A00_0008 + UInt32(n) << 8)))
    }
    #expect(book.lockdown.count == ProxyBook.networksKept)
    // A network that is not kept gets no answer in.
    #expect(book.answered(keys[19], .address(.v4(0x0A00_1308))) == nil && book.lockdown.count == ProxyBook.networksKept)
}

/// The office's network and a café's that looks the same (the same interface and gateway
/// address): the office's proxy address is forgotten when its path goes, and the café is asked
/// afresh; no stream (with the proxy's password) goes to the office's address there.
@Test func aNetworkLeftIsForgottenAndOneThatLooksTheSameIsAskedAfresh() {
    var core = proxiedCore(on: [office])
    _ = core.handle(.start, now: at(0))
    _ = core.handle(.proxyLookedUp(on: office, addresses: [proxyAddress]), now: at(10))
    _ = core.handle(.proxyAllowed(on: NetworkKey(office), address: proxyAddress, true), now: at(11))
    #expect(core.proxies?.reachable == [NetworkKey(office)])
    // The laptop leaves: the path goes, and with it the address, from the lockdown too.
    let left = core.handle(.network(carrier(office, false)), now: at(20_000))
    #expect(left.proxyClosings == [[:]], "\(left)")
    #expect(core.proxies?.networks.isEmpty == true && core.reconnector.streamNetworks == [])
    // The café: same interface, same gateway. Its look-up is asked; nothing streams before it.
    let cafe = core.handle(.network(carrier(office, true)), now: at(60_000))
    #expect(cafe.proxyLookUps == ["eth0"])
    #expect(cafe.streamEffects.isEmpty)
    // The café's DNS does not know the name: no stream there, and the office's address stays out.
    let unknown = core.handle(.proxyLookedUp(on: office, addresses: []), now: at(60_010))
    #expect(unknown.proxyAllowances.isEmpty && core.proxies?.reachable == [])
    #expect(core.handle(.timerFired(.race), now: at(60_300)).streamEffects.isEmpty)
}

/// A name the network says it does not know takes an address known there out; a look-up that
/// nobody answered keeps it.
@Test func aNameThatIsGoneTakesItsAddressOutButSilenceKeepsIt() {
    var core = proxiedCore(on: [office])
    _ = core.handle(.start, now: at(0))
    _ = core.handle(.proxyLookedUp(on: office, addresses: [proxyAddress]), now: at(10))
    _ = core.handle(.proxyAllowed(on: NetworkKey(office), address: proxyAddress, true), now: at(11))
    _ = core.handle(.wake(sleptFor: .seconds(60)), now: at(70_000))
    #expect(core.handle(.proxyLookedUp(on: office, addresses: nil), now: at(70_010)).proxyClosings.isEmpty)
    #expect(core.proxies?.reachable == [NetworkKey(office)])
    _ = core.handle(.wake(sleptFor: .seconds(60)), now: at(140_000))
    let gone = core.handle(.proxyLookedUp(on: office, addresses: []), now: at(140_010))
    #expect(gone.proxyClosings == [[:]] && core.proxies?.reachable == [])
}

/// What a forged answer could point the proxy's password at is never dialled.
@Test func anAnswerOfThisMachineOrNoHostIsNotUsed() {
    for forged in ["127.0.0.1", "0.0.0.0", "169.254.1.1", "224.0.0.1", "255.255.255.255", "\(office.source)"] {
        var core = proxiedCore(on: [office])
        _ = core.handle(.start, now: at(0))
        let effects = core.handle(.proxyLookedUp(on: office, addresses: [IPAddress(forged)!]), now: at(10))
        #expect(effects.proxyAllowances.isEmpty, "\(forged)")
    }
}

/// A network left while its look-up was out is forgotten too: its late answer opens nothing, and
/// a network that looks the same when the laptop comes back is asked afresh.
@Test func aNetworkLeftWhileItsLookUpWasOutIsForgotten() {
    var core = proxiedCore(on: [office])
    #expect(core.handle(.start, now: at(0)).proxyLookUps == ["eth0"])
    _ = core.handle(.network(carrier(office, false)), now: at(100))
    #expect(core.proxies?.networks.isEmpty == true)
    let late = core.handle(.proxyLookedUp(on: office, addresses: [proxyAddress]), now: at(200))
    #expect(late.proxyAllowances.isEmpty, "\(late)")
    #expect(core.handle(.network(carrier(office, true)), now: at(60_000)).proxyLookUps == ["eth0"])
}
