/// What the client's data plane tells the decision core of a conversation it carries, without
/// waking it per packet. TunnelClient and the replay's world keep their own clocks of it and ask
/// these rules, so both report alike:
/// - application data sent more than `quietSpell` after the last authenticated arrival is
///   reported (`dataSent`): the core starts waiting for an answer; while none comes, data is
///   reported again at most every `heardEvery`;
/// - the next authenticated arrival answers it (`dataReceived`), and while packets keep arriving
///   one is reported at least every `heardEvery`, so through a long busy conversation the core
///   still knows the server holds the session.
public enum LivenessNotices {
    /// Delays the detection of a dead path by at most this.
    public static let quietSpell = Duration.milliseconds(100)
    /// At most one wakeup of the core per this while a conversation runs, or while data goes
    /// unanswered.
    public static let heardEvery = Duration.seconds(1)

    /// Whether application data sent at `now` is reported: `lastArrival` is the last
    /// authenticated arrival, `awaiting` whether data was reported and nothing arrived since,
    /// `lastReport` when data was last reported (nil: never).
    /// (Inlinable and in nanoseconds: the data plane asks once per batch it sends.)
    @inlinable
    public static func reportsSent(at now: Instant, lastArrival: Instant?, awaiting: Bool, lastReport: Instant?) -> Bool {
        guard lastArrival.map({ now.nanoseconds - $0.nanoseconds > quietSpell.nanoseconds }) ?? true else { return false }
        return !awaiting || lastReport.map { now.nanoseconds - $0.nanoseconds >= heardEvery.nanoseconds } ?? true
    }

    /// Whether an authenticated arrival at `now` is reported: `awaited` when data was reported
    /// sent and nothing arrived since, `lastReport` when an arrival was last reported (nil: never).
    /// (The data plane asks once per packet it receives.)
    @inlinable
    public static func reportsArrival(at now: Instant, awaited: Bool, lastReport: Instant?) -> Bool {
        awaited || lastReport.map { now.nanoseconds - $0.nanoseconds >= heardEvery.nanoseconds } ?? true
    }
}

/// The data plane's rule for the server's "session unknown" hint, which is unauthenticated: the
/// core hears of one hint per session, and of another only once the server has been heard,
/// authenticated, since (it had the session after all) or the session's keys changed.
public struct HintLatch: Equatable, Sendable {
    private var reported = false

    public init() {}

    /// A hint for the session in use arrived: whether the core is told of it.
    public mutating func hint() -> Bool {
        defer { reported = true }
        return !reported
    }

    /// The server was heard, authenticated, or the session's keys changed: the next hint is news.
    public mutating func reset() { reported = false }
}
