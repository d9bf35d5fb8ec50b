public import Basics

/// Where the servers are: every usable address each one's name gave, which of them the session
/// uses, and the look-ups of the current server's name. Kept by `AgentCore`; pure.
///
/// A server named by host may move (a new floating address, split-horizon DNS on another
/// network, a failover of its front end): its name is asked again when the session moves to a
/// new path, when attempts fail or the server goes silent, after a wake, and every
/// `lookUpEvery` while the agent backs off. One look-up at a time; asks made meanwhile are
/// folded into one more.
public struct ServerBook: Equatable, Sendable {
    /// One server of the list, in the order they are tried.
    public struct Entry: Equatable, Sendable {
        /// Named by host: its name can be looked up again (a literal address never moves).
        public var named: Bool
        /// The addresses its name gave that the session may use (none the tunnel's own routes
        /// would carry), in the resolver's order.
        public var addresses: [IPAddress]

        public init(named: Bool, addresses: [IPAddress]) {
            self.named = named
            self.addresses = addresses
        }
    }

    public private(set) var entries: [Entry]
    /// Each server's addresses the lockdown lets the session reach: those its name gave at
    /// start, then each it moved to (a session may still be on an older one), at most
    /// `allowedPerServer`: answers for a name (forged ones too) cannot grow it without end.
    public private(set) var allowed: [[IPAddress]]
    public static let allowedPerServer = 8
    /// A look-up of the current server's name is out.
    public private(set) var lookingUp = false
    /// Another look-up was asked for while one was out.
    private var askAgain = false
    /// A move the lockdown has been asked to allow: the session follows once it says yes.
    public private(set) var pending: Move?
    /// How often the name is looked up while the agent backs off: the server may be back
    /// elsewhere before the next attempt is due.
    public static let lookUpEvery: Duration = .seconds(30)

    /// A move of the session to another address of the current server.
    public struct Move: Equatable, Sendable {
        public var server: Int
        public var address: IPAddress
        public var why: String
        /// The core hears it as `serverMoved` (a new chance, ending a backoff); a move because
        /// the uplinks changed family is told by the new paths alone.
        public var announce: Bool
        /// What the lockdown lets through once it allows the move (see `allowed`).
        public var lockdown: [[IPAddress]] = []
    }

    /// Of the addresses a name gave, those the session may use: another host's
    /// (`IPAddress.isRemoteUnicast`: a name may answer `::ffff:10.1.2.3`, `127.0.0.1` or
    /// `0.0.0.0`), and none the tunnel's own routes (`carried`) contain, for the session's packets
    /// to one would go into the tunnel they carry. The one rule for the server's answers at start
    /// and for every later look-up, and the proxy's.
    public static func usable(_ answer: [IPAddress], carried: [Prefix]) -> [IPAddress] {
        answer.filter { isUsable($0, carried: carried) }
    }

    /// One address by the rule of `usable`.
    public static func isUsable(_ address: IPAddress, carried: [Prefix]) -> Bool {
        address.isRemoteUnicast && !carried.contains { $0.contains(address) }
    }

    public init(_ entries: [Entry]) {
        self.entries = entries
        allowed = entries.map { Array($0.addresses.prefix(Self.allowedPerServer)) }
    }

    /// `allowed` with `address` added to server `index`'s, the oldest dropped past the bound
    /// (never the address in use, `inUse`, nor the new one).
    func allowing(_ address: IPAddress, to index: Int, inUse: IPAddress) -> [[IPAddress]] {
        var lists = allowed
        guard lists.indices.contains(index) else { return lists }
        if !lists[index].contains(address) { lists[index].append(address) }
        while lists[index].count > Self.allowedPerServer,
              let oldest = lists[index].firstIndex(where: { $0 != address && $0 != inUse }) {
            lists[index].remove(at: oldest)
        }
        return lists
    }

    /// Whether server `index`'s name can be looked up.
    public func named(_ index: Int) -> Bool { entries.indices.contains(index) && entries[index].named }

    /// Asks for a look-up of server `index`: true when one should start now.
    mutating func ask(_ index: Int) -> Bool {
        guard named(index) else { return false }
        guard !lookingUp else { askAgain = true; return false }
        lookingUp = true
        return true
    }

    /// A look-up ended: true when another was asked for meanwhile and should start now.
    mutating func answered() -> Bool {
        lookingUp = false
        defer { askAgain = false }
        if askAgain { lookingUp = true }
        return askAgain
    }

    mutating func learn(_ index: Int, _ addresses: [IPAddress]) {
        guard entries.indices.contains(index) else { return }
        entries[index].addresses = addresses
    }

    mutating func propose(_ move: Move?) { pending = move }

    /// The lockdown let the pending move through: what it allows now is the move's.
    mutating func allowedPending() {
        if let move = pending, !move.lockdown.isEmpty { allowed = move.lockdown }
    }
}
