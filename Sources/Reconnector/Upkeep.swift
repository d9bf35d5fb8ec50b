public import Basics

/// What the agent puts on the machine and others may take away: a network manager that deletes
/// policy rules and routes it did not make, a DHCP hook that rewrites resolv.conf, a script that
/// flushes every nftables table. Without them the tunnel carries nothing (the rules, the
/// table), names go to the LAN (the resolvers) or traffic leaves in clear (the lockdown).
public enum Holding: String, CaseIterable, Hashable, Sendable {
    /// The tunnel's policy rules and the routes of its table (full mode), or its routes (split).
    case routing
    /// The tunnel's resolvers, as the system's resolver configuration names them.
    case resolvers
    /// The lockdown's nftables table.
    case lockdown
}

/// Putting back what someone else took away, at once, unless it turns into a fight: an agent
/// and a network manager that each undo the other's change would otherwise loop, both busy and
/// both logging. Past `restoresPerWindow` restores of one holding within `window`, the agent
/// holds off (`firstHold`, doubled for each hold in a row up to `longestHold`), restores once
/// when the hold is over, and says so; only a window without a restore ends the fight. The
/// lockdown is never held off: a fight over it is a fight over whether the machine is open, and
/// the agent keeps putting it back however often it is taken (`fighting(over:)` says how often,
/// for a log that does not say each one).
///
/// Pure: damage and its repair come in as events, restores go out as effects, the holds are
/// one of the core's timers (`TimerKind.upkeep`).
public struct Upkeep: Sendable {
    /// What is missing and, when the kernel said, who removed it.
    public struct Damage: Equatable, Sendable {
        public var what: String
        public var by: String?
        /// Nobody took it: the machine refused one of the agent's own changes, which leaves it
        /// uncertain (the lockdown), and it is put back as if taken.
        public var refused: Bool
        public init(what: String, by: String? = nil, refused: Bool = false) {
            self.what = what
            self.by = by
            self.refused = refused
        }

        /// nftables refused one of the agent's changes (`error`, as it said it): the lockdown is
        /// uncertain, put back as if taken.
        public static func lockdownRefused(_ error: String) -> Damage {
            Damage(what: "nftables refused a change: \(error)", refused: true)
        }
    }

    /// One holding's history.
    public struct Record: Equatable, Sendable {
        /// What is missing now; nil while it is whole.
        public var damage: Damage?
        /// When it was put back within the last `window`.
        public var recent: [Instant] = []
        /// Restores since the agent started.
        public var restores = 0
        /// Holds in a row: each doubles the next.
        public var holds = 0
        /// No restore before this, while a fight is held off.
        public var heldUntil: Instant?
        /// Who removed it last, when the kernel said.
        public var lastBy: String?
        /// A restore went out and what the machine found after it has not come back yet.
        public var restoring = false
        /// Restores in a row whose answer found it still missing (refused, or taken again while
        /// it went back): the first is tried again at once, the others `retryAfterRefusal` later.
        public var unheldInRow = 0
        /// A restore that did not hold is tried again then (not at once: a refusal that lasts
        /// would otherwise be asked again and again without a pause).
        public var retryAt: Instant?
        /// Held off now: a fight, for status.
        public var fighting: Bool { heldUntil != nil }

        public init() {}
    }

    public static let window: Duration = .seconds(60)
    public static let restoresPerWindow = 5
    public static let firstHold: Duration = .seconds(10)
    public static let longestHold: Duration = .seconds(300)
    /// How soon a restore that did not hold twice in a row is tried again.
    public static let retryAfterRefusal: Duration = .seconds(1)

    public private(set) var records: [Holding: Record] = [:]

    public init() {}

    /// When the first hold ends.
    public var nextDeadline: Instant? { records.values.flatMap { [$0.heldUntil, $0.retryAt].compactMap { $0 } }.min() }

    /// `holding` is missing `damage`: put back now, or held off in a fight.
    /// Every look at the machine is told, whatever it found: what is known missing already is
    /// not decided again at each notice (a fight held off stays held off, a restore on its way is
    /// not sent twice), and the operator hears once that it was taken. What is found after a
    /// restore is its answer, always decided.
    mutating func damaged(_ holding: Holding, _ damage: Damage, now: Instant, _ out: inout [Effect]) {
        var record = records[holding] ?? Record()
        let answersRestore = record.restoring
        record.restoring = false
        if !answersRestore {
            guard record.damage?.what != damage.what else { return }
            out.append(.notice(.takenAway(holding, damage)))
        }
        record.damage = damage
        if let by = damage.by { record.lastBy = by }
        record.recent.removeAll { now - $0 >= Self.window }
        if record.recent.isEmpty && record.heldUntil == nil { record.holds = 0 }
        if let until = record.heldUntil, until > now, holding != .lockdown {
            // Put back when the hold is over.
        } else if holding != .lockdown,
                  record.recent.count >= Self.restoresPerWindow || (record.holds > 0 && !record.recent.isEmpty) {
            // A fight, or one not over yet (a restore within the window after a hold): hold off.
            let hold = min(Self.firstHold * (1 << min(record.holds, 16)), Self.longestHold)
            record.holds += 1
            record.heldUntil = now + hold
            out.append(.upkeepHeld(holding, damage, restores: record.recent.count, until: now + hold))
        } else if answersRestore && record.unheldInRow > 0 {
            // The restore did not hold again (a refusal that lasts, or a taker that keeps at
            // it): again in a moment, not at once. The lockdown too (fail closed, never held off
            // for longer).
            record.unheldInRow += 1
            record.retryAt = now + Self.retryAfterRefusal
        } else {
            // News, or the first restore that did not hold: a removal the kernel tells in parts
            // (a flush deletes route after route) is still going on while the first part goes
            // back, and what it took after that goes back at once too.
            if answersRestore { record.unheldInRow += 1 }
            restore(holding, &record, damage, now, &out)
        }
        records[holding] = record
    }

    /// Restores of `holding` within the last `window` up to `now`: past `restoresPerWindow`, a fight.
    public func restoresWithin(window now: Instant, of holding: Holding) -> Int {
        records[holding]?.recent.filter { now - $0 < Self.window }.count ?? 0
    }

    /// `holding` is whole again (put back, or by whoever took it).
    mutating func intact(_ holding: Holding) {
        records[holding]?.damage = nil
        records[holding]?.restoring = false
        records[holding]?.retryAt = nil
        records[holding]?.unheldInRow = 0
    }

    /// A hold is over: what is still missing goes back once.
    mutating func timerFired(now: Instant, _ out: inout [Effect]) {
        for holding in Holding.allCases {
            guard var record = records[holding] else { continue }
            if let retry = record.retryAt, retry <= now {
                record.retryAt = nil
                if let damage = record.damage, record.heldUntil == nil { restore(holding, &record, damage, now, &out) }
            }
            if let until = record.heldUntil, until <= now {
                record.heldUntil = nil
                if let damage = record.damage, !record.restoring { restore(holding, &record, damage, now, &out) }
            }
            records[holding] = record
        }
    }

    private func restore(_ holding: Holding, _ record: inout Record, _ damage: Damage, _ now: Instant, _ out: inout [Effect]) {
        record.recent.append(now)
        record.restores += 1
        record.restoring = true
        out.append(.restore(holding, damage))
    }
}
