import Reconnector
import Testing

/// The pure path MTU search, driven as the core drives it: rounds of sizes, echoes for the
/// sizes a path of `carries` bytes passes, then the round's end.
@Suite struct PathMTUSearchTests {
    /// Plays rounds until the search ends (at most `rounds`); `lost` drops the echoes of sizes
    /// the path would carry, per round. Returns the rounds played.
    static func play(_ search: inout PathMTUSearch, carries: Int, rounds: Int = 20,
                     lost: (Int, Int) -> Bool = { _, _ in false }) -> Int {
        var played = 0
        while !search.isDone && played < rounds {
            let sizes = search.startRound()
            for size in sizes where size <= carries && !lost(played, size) { search.answered(size) }
            search.endRound(heard: true, misses: 3)
            played += 1
        }
        return played
    }

    @Test func aWholePathEndsWithTheFirstEcho() {
        var search = PathMTUSearch(floor: 1280, ceiling: 1420)
        #expect(search.startRound() == [1280, 1420], "the ceiling and the floor, at once")
        search.answered(1420)
        #expect(search.isDone && search.found == 1420)
    }

    @Test func aSmallerPathIsFoundToWithinTheGranularity() {
        var search = PathMTUSearch(floor: 1280, ceiling: 1420)
        let rounds = Self.play(&search, carries: 1340)
        #expect(search.isDone && !search.isTooSmall)
        let found = search.found ?? 0
        #expect(found <= 1340 && 1340 - found < PathMTUSearch.granularity, "found \(found)")
        #expect(rounds <= 8, "\(rounds) rounds")
    }

    @Test func oneLostEchoIsNoVerdict() {
        // The ceiling's first two echoes are lost: fewer misses than the verdict needs.
        var search = PathMTUSearch(floor: 1280, ceiling: 1420)
        _ = Self.play(&search, carries: 1500, lost: { round, size in size == 1420 && round < 2 })
        #expect(search.found == 1420)
    }

    @Test func aSilentRoundProvesNothing() {
        var search = PathMTUSearch(floor: 1280, ceiling: 1420)
        for _ in 0..<5 {
            _ = search.startRound()
            search.endRound(heard: false, misses: 1)
        }
        #expect(search.tooBig == nil && search.found == nil && search.silentRounds == 5)
    }

    @Test func aPathBelowTheFloorIsTooSmall() {
        var search = PathMTUSearch(floor: 1280, ceiling: 1420)
        _ = Self.play(&search, carries: 1200)
        #expect(search.isTooSmall && search.found == 1280)
    }

    @Test func aLookUpwardThatFailsKeepsWhatWasKnown() {
        var search = PathMTUSearch.raise(floor: 1280, ceiling: 1420, current: 1340, tooBig: 1348)
        #expect(search.startRound() == [1348], "only the smallest size found too big is asked")
        let rounds = Self.play(&search, carries: 1340)
        #expect(rounds == 3 && search.found == 1340)
    }

    @Test func aLookUpwardThatPassesSearchesOnToTheCeiling() {
        var search = PathMTUSearch.raise(floor: 1280, ceiling: 1420, current: 1340, tooBig: 1348)
        _ = Self.play(&search, carries: 1500)
        #expect(search.found == 1420)
    }

    @Test func aLookAtTheMTUInUseThatPassesChangesNothing() {
        var search = PathMTUSearch.verify(floor: 1280, ceiling: 1420, current: 1340, tooBig: 1348)
        #expect(search.startRound() == [1340])
        search.answered(1340)
        #expect(search.isDone && search.found == 1340)
    }

    @Test func aLookAtTheMTUInUseThatFailsSearchesBelowIt() {
        var search = PathMTUSearch.verify(floor: 1280, ceiling: 1420, current: 1340, tooBig: 1348)
        _ = Self.play(&search, carries: 1300)
        let found = search.found ?? 0
        #expect(found <= 1300 && 1300 - found < PathMTUSearch.granularity, "found \(found)")
    }
}

extension PathMTUSearchTests {
    @Test func aLookAtAPathFoundTooSmallAsksTheFloorAndCanFailAgain() {
        var search = PathMTUSearch.raise(floor: 1280, ceiling: 1420, current: 1280, tooBig: 1280)
        #expect(search.startRound() == [1280])
        let rounds = Self.play(&search, carries: 1200)
        #expect(search.isTooSmall && rounds == 3)
    }

    @Test func sizesAboveAnUnprovenFloorAreNotAsked() {
        var search = PathMTUSearch(floor: 1280, ceiling: 1420)
        _ = search.startRound()
        search.endRound(heard: true, misses: 3)
        #expect(search.startRound() == [1280, 1420], "the floor and the ceiling again, nothing between")
    }
}
