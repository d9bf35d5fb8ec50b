/// The search for the largest tunnel packet a path carries, in the manner of RFC 8899's
/// packetization-layer discovery: probes padded to a candidate size go out on the session's
/// keys, an echo proves the size both ways, and silence proves nothing until it is repeated
/// while the server is heard otherwise. No ICMP is needed, so it works where ICMP is filtered.
///
/// Sizes are tunnel MTUs: the inner packet a size probe stands for, so the datagram on the wire
/// is exactly that of a full-size tunnel packet. The search runs in rounds: each sends a few
/// sizes at once and waits one probe wait; answered sizes raise the floor at once, a size
/// missed `misses` times in rounds where the server was heard is too big.
public struct PathMTUSearch: Sendable {
    /// The smallest tunnel packet the tunnel needs (`Config.mtuFloor`).
    public let floor: Int
    /// The tunnel's configured MTU: never probed above.
    public let ceiling: Int
    /// The largest size an echo proved, if any.
    public private(set) var confirmed: Int?
    /// The smallest size found too big, if any.
    public private(set) var tooBig: Int?
    /// Unanswered sizes of earlier rounds, with how many rounds missed them.
    private var missed: [Int: Int] = [:]
    /// The sizes of the round in flight.
    public private(set) var inFlight: [Int] = []
    /// Rounds that ended with nothing heard from the server at all: they prove nothing.
    public private(set) var silentRounds = 0
    /// A look at one size before any search: whether the path grew or shrank since the last
    /// search of it, whose finding stands unless the look says otherwise.
    private var look: (kind: Look, size: Int, knownTooBig: Int?)?

    enum Look: Sendable {
        /// The smallest size the last search found too big: if it passes now, the search goes
        /// on upward from it (a finding that loss made too low is mended this way too).
        case grew
        /// The MTU in use: if it fails now, the whole search runs below it.
        case shrank
    }

    /// Sizes closer together than this are not told apart.
    public static let granularity = 8

    /// A search of a path between `floor` and `ceiling`.
    public init(floor: Int, ceiling: Int) {
        self.floor = min(floor, ceiling)
        self.ceiling = ceiling
    }

    /// On a path that carries `current` and not `tooBig`: did it grow? One size is asked.
    public static func raise(floor: Int, ceiling: Int, current: Int, tooBig: Int?) -> PathMTUSearch {
        var search = PathMTUSearch(floor: floor, ceiling: ceiling)
        let current = min(max(current, search.floor), ceiling)
        let known = tooBig.map { min($0, ceiling) } ?? ceiling
        // On a path found too small (even the floor failed) nothing is proven: the look is at the
        // floor itself.
        if known > current { search.confirmed = current }
        search.look = (.grew, max(known, current), known)
        return search
    }

    /// `current`, the MTU in use: did the path shrink? `tooBig` is what the last search of the
    /// path found too big (nil if the ceiling passed).
    public static func verify(floor: Int, ceiling: Int, current: Int, tooBig: Int?) -> PathMTUSearch {
        var search = PathMTUSearch(floor: floor, ceiling: ceiling)
        search.look = (.shrank, min(max(current, search.floor), ceiling), tooBig)
        return search
    }

    /// The search is over: the ceiling is proven, or the gap between the largest size proven
    /// and the smallest too big is within the granularity, or not even the floor passes.
    public var isDone: Bool {
        if confirmed == ceiling { return true }
        if isTooSmall { return true }
        guard let confirmed, let tooBig else { return false }
        return tooBig - confirmed <= Self.granularity
    }

    /// The floor itself is too big: the path cannot carry the tunnel.
    public var isTooSmall: Bool { tooBig.map { $0 <= floor } ?? false }

    /// What the search says the tunnel's MTU should be, once it says anything: the ceiling once
    /// proven, the largest proven size (at least the floor) once a bigger one failed; nil while
    /// nothing failed and the ceiling is not proven yet.
    public var found: Int? {
        if confirmed == ceiling { return ceiling }
        guard tooBig != nil else { return nil }
        return max(confirmed ?? floor, floor)
    }

    /// Starts a round: the sizes to probe. Sizes missed before are asked again (a miss may be
    /// loss), and up to three new ones split the range below the smallest of them, so a path
    /// much smaller than the ceiling is found in a few rounds, not one halving per round.
    public mutating func startRound() -> [Int] {
        guard !isDone else { inFlight = []; return [] }
        let low = confirmed ?? floor
        if let look {
            inFlight = [look.size]
            return inFlight
        }
        if tooBig == nil && missed.isEmpty {
            // Nothing failed yet: the ceiling (most paths carry it, and one echo ends the search),
            // with the floor if it is not proven yet (a path that cannot carry even that is told
            // at once).
            inFlight = confirmed == nil && floor < ceiling ? [floor, ceiling] : [ceiling]
            return inFlight
        }
        let high = tooBig ?? ceiling + 1
        var sizes = missed.keys.filter { $0 > low && $0 < high }.sorted()
        if confirmed == nil, !sizes.contains(floor), floor < high { sizes.insert(floor, at: 0) }
        let splitBelow = sizes.first { $0 > low } ?? high
        // Sizes between are worth asking only once the floor passed.
        if confirmed != nil, splitBelow - low > Self.granularity {
            for i in 1...3 {
                let size = (low + (splitBelow - low) * i / 4) / 4 * 4
                if size > low, size < splitBelow, !sizes.contains(size) { sizes.append(size) }
            }
        }
        inFlight = sizes.sorted()
        return inFlight
    }

    /// An echo of a size probe came back (of this round or a late one of an earlier round).
    public mutating func answered(_ size: Int) {
        guard size >= floor, size <= ceiling else { return }
        if confirmed.map({ size > $0 }) ?? true { confirmed = size }
        if let current = look, size >= current.size {
            look = nil
            switch current.kind {
            case .grew: break  // the search goes on above it
            case .shrank:
                // What the last search found stands.
                if let known = current.knownTooBig, known > size, tooBig == nil { tooBig = known }
            }
        }
        // An echo proves the size: an earlier verdict of too big was loss.
        if let big = tooBig, big <= size { tooBig = nil }
        missed = missed.filter { $0.key > size }
    }

    /// The round's wait is over. `heard` says whether anything authenticated came from the
    /// server during it; without that the silence proves nothing. A size is too big after
    /// `misses` rounds without its echo.
    public mutating func endRound(heard: Bool, misses: Int) {
        let low = confirmed ?? (floor - 1)
        let unanswered = inFlight.filter { $0 > low }
        inFlight = []
        guard heard else {
            silentRounds += 1
            return
        }
        silentRounds = 0
        for size in unanswered {
            let count = (missed[size] ?? 0) + 1
            if count >= max(misses, 1) {
                missed[size] = nil
                if tooBig.map({ size < $0 }) ?? true { tooBig = size }
                if let current = look, size == current.size {
                    // A look upward that failed leaves what was known; a look at the MTU in use
                    // that failed starts the whole search below it.
                    look = nil
                }
            } else {
                missed[size] = count
            }
        }
        if let big = tooBig { missed = missed.filter { $0.key < big } }
    }
}
