import Basics
import Testing
@testable import Reconnector


/// The summaries, given what the flap damping says: one line when it calls the interface
/// flapping, one per window while it goes on, one when it has been quiet a whole window.
@Test func aFlapStormIsSummarisedNotToldPerFlap() {
    var flaps = FlapNotices(window: .seconds(10))
    var notices: [Notice] = []
    var losses = 0
    // The damping's verdict: flapping from the third loss on.
    let rule = { (_: String) -> (losses: Int, since: Instant)? in losses >= 3 ? (losses, at(1000)) : nil }
    notices += flaps.paths(["eth0", "wifi0"], now: at(0), isFlapping: rule)
    // eth0 down and up every 250 ms for 20 s.
    for i in 0..<80 {
        let t = 1000 + Int64(i) * 250
        if i % 2 == 0 { losses += 1 }
        notices += flaps.paths(i % 2 == 0 ? ["wifi0"] : ["eth0", "wifi0"], now: at(t), isFlapping: rule)
        notices += flaps.tick(now: at(t))
    }
    for t in stride(from: Int64(21_000), through: 40_000, by: 1000) { notices += flaps.tick(now: at(t)) }
    let kinds = notices.map { notice -> String in
        switch notice {
        case .flapping: "flapping"
        case .stillFlapping: "still"
        case .stoppedFlapping: "stopped"
        default: "other"
        }
    }
    #expect(kinds == ["flapping", "still", "still", "stopped"], "\(notices)")
    if case .flapping(let interface, let count, _, let next) = notices.first {
        #expect(interface == "eth0" && count == 3 && next == .seconds(10))
    }
    if case .stoppedFlapping(_, let total, _, let up) = notices.last { #expect(total == 40 && up) }
    #expect(flaps.nextDue == nil, "no wake-ups once it is quiet")
}

@Test func lossesTheDampingDoesNotCallFlappingAreNotTold() {
    var flaps = FlapNotices(window: .seconds(10))
    var notices = flaps.paths(["eth0", "wifi0"], now: at(0)) { _ in nil }
    notices += flaps.paths(["wifi0"], now: at(1000)) { _ in nil }
    notices += flaps.paths(["eth0", "wifi0"], now: at(2000)) { _ in nil }
    notices += flaps.paths(["wifi0"], now: at(30_000)) { _ in nil }
    #expect(notices.isEmpty && flaps.nextDue == nil)
}
