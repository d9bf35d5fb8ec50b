import Topology
import Basics
import PathMonitor
import Testing
@testable import Reconnector

/// The stream transport's rules: UDP first and the stream after the race delay, the stream at
/// once where UDP is known to be blocked, UDP re-tested from the stream, a stream's failure as a
/// failed attempt (or, once it worked, a break mended at once), and nothing of it with the stream off.
private func streamOn() -> Config {
    var config = Config()
    config.stream = Config.StreamPolicy()
    return config
}

private let hotel = Path(linkIndex: 4, interface: "wifi1", kind: .wifi, source: IPAddress("10.99.4.23")!,
                         gateway: IPAddress("10.99.0.1"), metric: 600, prefixLength: 0, mtu: 1500)

extension [Effect] {
    fileprivate var moves: [Path] {
        compactMap {
            switch $0 {
            case .bind(let p, _, _): p
            default: nil
            }
        }
    }
    fileprivate var handshakePaths: [Path] { compactMap { if case .handshake(let p, _) = $0 { p } else { nil } } }
    fileprivate var probePaths: [Path] { compactMap { if case .probe(_, let p, nil) = $0 { p } else { nil } } }
}

/// A machine that started on `hotel`, raced to its stream and was answered there: it knows the
/// hotel blocks UDP.
private func onTheHotelStream() -> Reconnector {
    var r = Reconnector(config: streamOn())
    _ = r.handle(.paths([hotel]), now: at(0))
    _ = r.handle(.timerFired(.race), now: at(300))
    _ = r.handle(.handshakeSucceeded(rtt: .milliseconds(120)), now: at(420))
    return r
}

@Test func udpFirstThenTheStreamAfterTheRaceDelay() {
    var r = Reconnector(config: streamOn())
    let first = r.handle(.paths([hotel]), now: at(0))
    #expect(first.handshakePaths == [hotel], "UDP first on a network nothing is known of")
    #expect(r.timers[.race] == at(300))
    let race = r.handle(.timerFired(.race), now: at(300))
    #expect(race.moves == [hotel.over(.stream)] && race.handshakePaths == [hotel.over(.stream)])
    #expect(race.reasons == ["udpSilent(wifi1 300ms, trying the stream)"])
    #expect(r.timers[.resend] == nil, "nothing resent over UDP once the attempt is on the stream")
    #expect(r.state == .connecting(hotel.over(.stream)))
    #expect(r.timers[.handshake] == at(5000), "the attempt's own timeout covers the stream's opening")
    _ = r.handle(.handshakeSucceeded(rtt: .milliseconds(120)), now: at(420))
    #expect(r.state == .connected(hotel.over(.stream)))
    #expect(r.transports[NetworkKey(hotel)] == .blocked)
    #expect(r.transportStatus.transport == .stream && r.transportStatus.networks.map(\.udp) == [.blocked])
}

@Test func aUDPAnswerBeforeTheRaceDelayKeepsUDPAndIsRemembered() {
    var r = Reconnector(config: streamOn())
    _ = r.handle(.paths([wifi0]), now: at(0))
    #expect(r.timers[.race] != nil)
    _ = r.handle(.handshakeSucceeded(rtt: .milliseconds(20)), now: at(20))
    #expect(r.state == .connected(wifi0) && r.timers[.race] == nil)
    #expect(r.transports[NetworkKey(wifi0)] == .answers)
    let late = r.handle(.timerFired(.race), now: at(300))
    #expect(late.isEmpty && r.state == .connected(wifi0))
}

@Test func withTheStreamOffNothingRacesAndNothingIsLearnt() {
    var r = Reconnector()
    _ = r.handle(.paths([hotel]), now: at(0))
    #expect(r.timers[.race] == nil)
    _ = r.handle(.timerFired(.handshake), now: at(5000))
    #expect(r.state == .backingOff(hotel))
    #expect(r.transports.networks.isEmpty)
    let failed = r.handle(.streamFailed(on: hotel.id.over(.stream), why: "refused"), now: at(5100))
    #expect(failed.isEmpty)
}

@Test func aNetworkKnownToBlockUDPStartsOnTheStreamAtOnce() {
    var r = onTheHotelStream()
    _ = r.handle(.paths([]), now: at(10_000))
    // Back after the session expired: a handshake, straight over the stream, no race.
    let back = r.handle(.paths([hotel]), now: at(400_000))
    #expect(back.handshakePaths == [hotel.over(.stream)])
    #expect(back.reasons == ["knownToBlockUDP(wifi1, on the stream at once; pathAppeared(wifi1))"])
    #expect(r.timers[.race] == nil && r.timers[.resend] == nil)
}

@Test func whatNetworksBlockOutlivesARestart() {
    let before = onTheHotelStream()
    let text = before.memory.text
    #expect(text.contains("udp blocked wifi1 10.99.0.1"))
    let memory = Reconnector.Memory(text: text)
    #expect(memory == before.memory)
    var after = Reconnector(config: streamOn(), now: at(1000), memory: memory!)
    let start = after.handle(.paths([hotel]), now: at(1000))
    #expect(start.handshakePaths == [hotel.over(.stream)])
}

@Test func aStreamPathsVerdictIsWrittenAndReadBack() {
    let stream = hotel.id.over(.stream)
    let memory = Reconnector.Memory(tokens: 3, refilledAt: at(0), failures: 1, notBefore: nil,
                                    dead: [stream: .init(until: at(9000), strikes: 2), hotel.id: .init(until: at(8000), strikes: 1)])
    #expect(memory.text.contains("dead 4 10.99.4.23 9000000000 2 tls\n"))
    #expect(Reconnector.Memory(text: memory.text) == memory)
    #expect(Reconnector.Memory(text: "tokens 1\nrefilled-at 0\ndead 4 10.99.4.23 9000 2 udp\n") == nil)
    #expect(Reconnector.Memory(text: "tokens 1\nrefilled-at 0\nudp sometimes wifi1 10.99.0.1\n") == nil)
}

@Test func udpIsRetestedMakeBeforeBreakAndWinsTheSessionBack() {
    var r = onTheHotelStream()
    #expect(r.timers[.udpRetest] == at(30_420))
    let retest = r.handle(.timerFired(.udpRetest), now: at(30_420))
    #expect(retest.probePaths == [hotel] && retest.moves.isEmpty, "probed while the stream carries the traffic")
    #expect(r.state == .switching(from: hotel.over(.stream), to: hotel, sent: 1))
    let answered = r.handle(.probeReply(on: hotel.id, rtt: .milliseconds(40)), now: at(30_460))
    #expect(answered.moves == [hotel] && answered.handshakePaths.isEmpty)
    #expect(answered.reasons == ["udpAnswered(wifi1 rtt 40ms)"])
    #expect(r.state == .connected(hotel) && r.transports[NetworkKey(hotel)] == .answers)
    #expect(r.timers[.udpRetest] == nil)
}

@Test func anUnansweredRetestStaysAndWaitsTwiceAsLongThenLongerOnBattery() {
    var r = onTheHotelStream()
    _ = r.handle(.timerFired(.udpRetest), now: at(30_420))
    var now: Int64 = 30_420
    while case .switching = r.state {
        now = r.timers[.probe].map { $0.nanoseconds / 1_000_000 } ?? now
        _ = r.handle(.timerFired(.probe), now: at(now))
    }
    #expect(r.state == .connected(hotel.over(.stream)))
    #expect(r.transports[NetworkKey(hotel)] == .blocked)
    #expect(r.timers[.udpRetest] == at(now + 60_000), "the second re-test waits twice the first's 30 s")
    #expect(Config().udpRetest(after: 0, on: .ac) == .zero, "no re-test without the stream")
    #expect(streamOn().udpRetest(after: 0, on: .battery) == .seconds(60))
    #expect(streamOn().udpRetest(after: 10, on: .ac) == .seconds(600), "capped")
}

@Test func aStreamThatNeverOpenedIsAFailedAttempt() {
    var r = Reconnector(config: streamOn())
    _ = r.handle(.paths([hotel]), now: at(0))
    _ = r.handle(.timerFired(.race), now: at(300))
    let failed = r.handle(.streamFailed(on: hotel.id.over(.stream), why: "connection refused"), now: at(340))
    #expect(failed.reasons == ["streamFailed(wifi1/tls: connection refused)"])
    // UDP went unanswered in this very attempt too: the whole network is silent, and it is
    // checked for a portal rather than handshaken into again.
    #expect(r.state == .backingOff(hotel))
    #expect(failed.contains(.checkConnectivity(via: hotel)))
    #expect(r.transports[NetworkKey(hotel)] == nil, "nothing answered: nothing learnt")
}

@Test func aPortalIsAPortalAndItsSilenceIsNotTheNetworks() {
    var r = Reconnector(config: streamOn())
    _ = r.handle(.paths([hotel]), now: at(0))
    _ = r.handle(.timerFired(.race), now: at(300))
    _ = r.handle(.streamFailed(on: hotel.id.over(.stream), why: "TLS failed"), now: at(360))
    _ = r.handle(.connectivity(.portal(url: "https://login.example/"), on: hotel.id), now: at(400))
    #expect(r.state == .portal(hotel, url: "https://login.example/"))
    let opened = r.handle(.connectivity(.online, on: hotel.id), now: at(60_000))
    #expect(opened.handshakePaths == [hotel], "UDP first after the login: the portal was what blocked it")
}

@Test func aStreamThatBreaksMidSessionIsMendedAtOnce() {
    var r = onTheHotelStream()
    let broke = r.handle(.streamFailed(on: hotel.id.over(.stream), why: "connection reset by peer"), now: at(20_000))
    #expect(broke.probePaths == [hotel.over(.stream)] && broke.handshakePaths.isEmpty)
    #expect(r.state == .probing(hotel.over(.stream), sent: 1))
    _ = r.handle(.probeReply(on: hotel.id.over(.stream), rtt: .milliseconds(360)), now: at(20_360))
    #expect(r.state == .connected(hotel.over(.stream)))
    // A new stream that cannot be opened either is a failure of the path, not a break.
    _ = r.handle(.streamFailed(on: hotel.id.over(.stream), why: "connection reset by peer"), now: at(25_000))
    let again = r.handle(.streamFailed(on: hotel.id.over(.stream), why: "connection refused"), now: at(25_100))
    #expect(again.reasons.first == "streamFailed(wifi1/tls: connection refused)")
    #expect(r.state.path == hotel, "UDP over the same uplink is tried next: it was not tried in this attempt")
}

@Test func aStaleStreamFailureChangesNothing() {
    var r = Reconnector(config: streamOn())
    _ = r.handle(.paths([wifi0]), now: at(0))
    _ = r.handle(.handshakeSucceeded(rtt: .milliseconds(20)), now: at(20))
    let stale = r.handle(.streamFailed(on: wifi0.id.over(.stream), why: "connection reset by peer"), now: at(1000))
    #expect(stale.isEmpty && r.state == .connected(wifi0))
}

@Test func pathsAndTheirIDsTellTheTransportsApart() {
    let stream = wifi0.over(.stream)
    #expect(stream.id != wifi0.id && stream.id.over(.udp) == wifi0.id)
    #expect(stream.name == "wifi0/tls" && wifi0.name == "wifi0")
    #expect(stream.description.hasPrefix("wifi0/tls 192.168.1.23"))
    #expect(stream.id.description == "2/192.168.1.23/tls")
    #expect(NetworkKey(stream) == NetworkKey(wifi0))
}

@Test func theBookForgetsTheNetworkLearntOfLongestAgo() {
    var book = TransportBook()
    for i in 0...TransportBook.capacity {
        book.learn(.blocked, for: NetworkKey(interface: "wlan0", gateway: .v4(UInt32(i))))
    }
    #expect(book.networks.count == TransportBook.capacity)
    #expect(book[NetworkKey(interface: "wlan0", gateway: .v4(0))] == nil)
    #expect(book[NetworkKey(interface: "wlan0", gateway: .v4(UInt32(TransportBook.capacity)))] == .blocked)
}

/// On a network known to block UDP, a stream that carried the session is reset and the next
/// ones are refused (a gateway restarting, a middlebox cutting for a while): every attempt goes
/// to the stream, each failure backs off instead of being tried again at once, and none goes
/// to UDP alone, where nothing answers.
@Test func refusedStreamsOnANetworkThatBlocksUDPBackOffAndStayOnTheStream() {
    var r = onTheHotelStream()
    let stream = hotel.id.over(.stream)
    var out = r.handle(.streamFailed(on: stream, why: "reset"), now: at(1_000))
    #expect(out.probePaths == [hotel.over(.stream)], "a stream that carried the session is opened again at once")
    var moments: [Instant] = []
    var now = at(1_010)
    for _ in 0..<6 {
        out = r.handle(.streamFailed(on: stream, why: "refused"), now: now)
        #expect(out.probePaths.allSatisfy { $0.transport == .stream }, "\(out)")
        guard case .backingOff = r.state, let retry = r.timers[.retry] else {
            Issue.record("a refused stream backs off: \(r.state)")
            return
        }
        moments.append(retry)
        now = retry
        out = r.handle(.timerFired(.retry), now: now)
        #expect(out.probePaths == [hotel.over(.stream)] || out.handshakePaths == [hotel.over(.stream)],
                "the retry is on the stream: \(out)")
        #expect(!out.probePaths.contains(hotel) && !out.handshakePaths.contains(hotel), "never UDP alone")
    }
    #expect(moments.count == 6)
}
