import Basics
import Testing
@testable import agent

private func at(_ ms: Int64) -> Instant { Instant(nanoseconds: ms * 1_000_000) }

@Test func aFlapStormIsSummarisedNotLoggedPerFlap() {
    var s = FlapSummary()
    var lines: [FlapSummary.Line] = []
    lines += s.paths(["eth0", "wifi0"], now: at(0))
    // eth0 down and up every 250 ms for 20 s.
    for i in 0..<80 {
        let t = 1000 + Int64(i) * 250
        lines += s.paths(i % 2 == 0 ? ["wifi0"] : ["eth0", "wifi0"], now: at(t))
        lines += s.tick(now: at(t))
    }
    for t in stride(from: Int64(21_000), through: 40_000, by: 1000) { lines += s.tick(now: at(t)) }
    #expect(lines.map(\.message) == ["interface flapping", "interface still flapping", "interface still flapping",
                                     "interface stopped flapping"])
    #expect(lines[0].fields.first { $0.0 == "losses" }?.1 == "3")
    #expect(lines.last?.fields.first { $0.0 == "losses" }?.1 == "40")
    #expect(s.nextDue == nil, "no wake-ups once it is quiet")
}

@Test func oneLossOrTwoFarApartAreNotFlapping() {
    var s = FlapSummary()
    var lines = s.paths(["eth0", "wifi0"], now: at(0))
    lines += s.paths(["wifi0"], now: at(1000))
    lines += s.paths(["eth0", "wifi0"], now: at(2000))
    lines += s.paths(["wifi0"], now: at(30_000))
    #expect(lines.isEmpty && s.nextDue == nil)
}
