/// What the client's data plane tells the decision core of a conversation it carries, without
/// waking it per packet (TunnelClient does this, and the replay's world the same):
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
}
