import Basics
import Testing
@testable import Reconnector

/// Hold-downs on their own: strikes that double the hold up to a cap, and what keeps them.
@Suite struct HoldDownsTests {
    static let base: Duration = .seconds(15)
    static let cap: Duration = .seconds(60)

    @Test func eachStrikeDoublesTheHoldUpToTheCap() {
        var holds = HoldDowns<String>()
        var ends: [Instant] = []
        for _ in 0..<4 {
            holds.strike("eth0", at(1_000), base: Self.base, cap: Self.cap)
            ends.append(holds["eth0"]!.until)
        }
        #expect(ends == [at(16_000), at(31_000), at(61_000), at(61_000)])
        #expect(holds["eth0"]?.strikes == 4)
    }

    @Test func aKeyIsHeldUntilItsHoldEndsAndKeepsItsStrikes() {
        var holds = HoldDowns<Int>()
        holds.strike(2, at(0), base: Self.base, cap: Self.cap)
        #expect(holds.isHeld(2, at(14_999)) && !holds.isHeld(2, at(15_000)))
        #expect(!holds.isHeld(1, at(0)) && holds[1] == nil)
        // Ran out but not cleared: the next strike is the second.
        holds.strike(2, at(20_000), base: Self.base, cap: Self.cap)
        #expect(holds[2] == .init(until: at(50_000), strikes: 2))
        holds.clear(2)
        holds.strike(2, at(60_000), base: Self.base, cap: Self.cap)
        #expect(holds[2] == .init(until: at(75_000), strikes: 1), "cleared, it starts over")
    }

    @Test func aShiftMovesEveryHoldAndKeepsItsStrikes() {
        var holds = HoldDowns<Int>([1: .init(until: at(10_000), strikes: 3), 2: .init(until: at(20_000), strikes: 1)])
        holds.shift(by: .seconds(-4))
        #expect(holds.entries == [1: .init(until: at(6_000), strikes: 3), 2: .init(until: at(16_000), strikes: 1)])
    }

    @Test func keepForgetsTheKeysItRefusesAndRemoveAllForgetsEvery() {
        var holds = HoldDowns<Int>()
        for key in 1...4 { holds.strike(key, at(0), base: Self.base, cap: Self.cap) }
        holds.keep { $0.isMultiple(of: 2) }
        #expect(holds.entries.keys.sorted() == [2, 4])
        holds.removeAll()
        #expect(holds.entries.isEmpty)
    }
}
