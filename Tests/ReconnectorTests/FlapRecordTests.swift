import Basics
import Testing
@testable import Reconnector

/// The flap record on its own: runs of losses per interface, and when they count as flapping.
@Suite struct FlapRecordTests {
    static let window: Duration = .seconds(60)
    static let stableAfter: Duration = .seconds(10)

    static func record(_ losses: [Int64], on interface: String = "eth0") -> FlapRecord {
        var record = FlapRecord()
        for t in losses { record.noteLoss(of: interface, at(t), window: window) }
        return record
    }

    @Test func threeQuickLossesAreAFlap() {
        let record = Self.record([0, 5_000, 10_000])
        #expect(record.losses["eth0"] == .init(count: 3, first: at(0), last: at(10_000)))
        #expect(record.isFlapping("eth0", at(10_000), window: Self.window, stableAfter: Self.stableAfter))
        let flap = record.flapping("eth0", at(10_000), window: Self.window, stableAfter: Self.stableAfter)
        #expect(flap?.losses == 3 && flap?.since == at(0))
        #expect(!record.isFlapping("wlan0", at(10_000), window: Self.window, stableAfter: Self.stableAfter))
    }

    @Test func twoLossesAreNoFlap() {
        let record = Self.record([0, 1_000])
        #expect(!record.isFlapping("eth0", at(1_000), window: Self.window, stableAfter: Self.stableAfter))
        #expect(record.flapping("eth0", at(1_000), window: Self.window, stableAfter: Self.stableAfter) == nil)
    }

    @Test func lossesFarApartOnAverageAreNoFlap() {
        // 50 s over two gaps: up 25 s on average, longer than `stableAfter`.
        let record = Self.record([0, 25_000, 50_000])
        #expect(record.losses["eth0"]?.count == 3)
        #expect(!record.isFlapping("eth0", at(50_000), window: Self.window, stableAfter: Self.stableAfter))
    }

    @Test func aLossAfterTheWindowStartsANewRun() {
        let record = Self.record([0, 5_000, 65_000])
        #expect(record.losses["eth0"] == .init(count: 1, first: at(65_000), last: at(65_000)))
        #expect(record.recent("eth0", at(124_999), window: Self.window)?.count == 1)
        #expect(record.recent("eth0", at(125_000), window: Self.window) == nil, "the window ran out")
        let flapping = Self.record([0, 2_000, 4_000])
        #expect(!flapping.isFlapping("eth0", at(64_000), window: Self.window, stableAfter: Self.stableAfter),
                "a flap ends with the window after its last loss")
    }

    @Test func aShiftMovesEveryLoss() {
        var record = Self.record([10_000, 12_000])
        record.shift(by: .seconds(-3))
        #expect(record.losses["eth0"] == .init(count: 2, first: at(7_000), last: at(9_000)))
    }
}
