import Basics

/// The session path's round-trip time, as RFC 6298 estimates it, and the path's lowest: what
/// the waits for answers rest on. Kept by `Reconnector`; `staleAfter` is its configuration's
/// `rttStaleAfter`, given with each question (a reload may change it).
public struct RTTEstimator: Equatable, Sendable {
    /// The smoothed estimate and its deviation; nil before a first sample.
    public private(set) var smoothed: Duration?
    public private(set) var variance: Duration = .zero
    /// When the last sample came.
    private(set) var sampledAt: Instant?
    /// The path's lowest RTT: it follows the lowest samples at once and higher ones slowly.
    private(set) var minimum: Duration?
    /// When a probe was last sent only to refresh the estimate.
    private(set) var refreshedAt: Instant?

    public init() {}

    /// One sample; `newPath` starts over, and so does a sample that follows an aged estimate
    /// (the smoothing is for samples that come often: one from 10 s later is worth more than the
    /// average of what came before it). The lowest RTT follows a higher sample an eighth of the
    /// way, so a path whose base RTT rose for good is not waited on too briefly.
    mutating func sample(_ rtt: Duration, _ now: Instant, staleAfter: Duration, newPath: Bool = false) {
        let newPath = newPath || isAged(now, staleAfter: staleAfter)
        sampledAt = now
        if let lowest = minimum, !newPath {
            minimum = rtt < lowest ? rtt : lowest + (rtt - lowest) / 8
        } else {
            minimum = rtt
        }
        guard let smoothed, !newPath else {
            self.smoothed = rtt
            variance = rtt / 2
            return
        }
        let deviation = smoothed > rtt ? smoothed - rtt : rtt - smoothed
        variance = (variance * 3 + deviation) / 4
        self.smoothed = (smoothed * 7 + rtt) / 8
    }

    /// Another server: nothing known of the path to it.
    mutating func forget() {
        smoothed = nil
        variance = .zero
        minimum = nil
        sampledAt = nil
    }

    /// The clock stepped: what is remembered moves with it.
    mutating func shift(by step: Duration) {
        sampledAt = sampledAt.map { $0 + step }
        refreshedAt = refreshedAt.map { $0 + step }
    }

    /// No sample for `staleAfter` (or none at all).
    func isStale(_ now: Instant, staleAfter: Duration) -> Bool {
        sampledAt.map { now - $0 >= staleAfter } ?? true
    }

    /// A sample this long after the last one refreshes the estimate: three quarters of `staleAfter`.
    static func refreshDue(_ staleAfter: Duration) -> Duration { staleAfter * 3 / 4 }

    func isAged(_ now: Instant, staleAfter: Duration) -> Bool {
        sampledAt.map { now - $0 >= Self.refreshDue(staleAfter) } ?? true
    }

    /// How long an answer may take before its absence means something: twice the smoothed RTT
    /// plus four deviations (TCP's retransmission timeout, with room for the far end's own
    /// delays); zero with no estimate. A stale estimate is not trusted to be that slow (a queue
    /// that filled may have drained since, as TCP restarts after an idle spell): the wait starts
    /// from the path's lowest RTT.
    func patience(_ now: Instant, staleAfter: Duration) -> Duration {
        guard let smoothed else { return .zero }
        if isStale(now, staleAfter: staleAfter), let lowest = minimum, lowest < smoothed {
            return lowest * 4  // 2 × RTT + 4 × RTT/2: a first sample's wait
        }
        return smoothed * 2 + variance * 4
    }

    /// Whether a probe should refresh the estimate now, while the server answers: it has aged
    /// and none was sent for it lately. Notes the refresh when it should.
    mutating func refresh(_ now: Instant, staleAfter: Duration) -> Bool {
        let lately = refreshedAt.map { now - $0 < Self.refreshDue(staleAfter) } ?? false
        guard smoothed != nil, isAged(now, staleAfter: staleAfter), !lately else { return false }
        refreshedAt = now
        return true
    }
}
