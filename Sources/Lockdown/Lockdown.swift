import Topology
import Basics
public import Netlink

/// The lockdown firewall in the kernel: Roam's own nftables table, replaced whole in one
/// transaction whenever the policy changes, so no packet ever meets a half-made table.
///
/// The table outlives the process on purpose: a crash, `kill -9` or a restart in place leaves
/// it, so the machine stays closed until an agent adopts it (`apply` replaces it) or an
/// operator's stop removes it (`remove`).
///
/// Any root process may delete that table, though (`nft flush ruleset` in a firewall's reload
/// does), and the machine would be open until the agent noticed and loaded it again. A running
/// agent's lockdown is `guarded`: the same rules in a second table with nftables' `owner` flag
/// (Linux 5.12+), which no other process may change or delete and `flush ruleset` passes over,
/// and which goes when the process ends (a crash leaves the first). A packet leaves only if
/// both let it, so while either is there the machine is closed.
public final class Lockdown {
    private let nft: Nftables
    /// The guard's table, when this process holds one.
    private let guardTable: String?
    /// What is loaded now, as far as this process knows.
    public private(set) var policy: LockdownPolicy?
    /// Transactions on the table this process committed: loads and removals (see `TableWatch`).
    public private(set) var commits = 0
    /// Why this kernel keeps no guard (it has no table owners), when one was asked for.
    public private(set) var guardUnavailable: LockdownError?

    /// `guard`: the guard's table name (`LockdownPolicy.guardTable` for an agent's), or nil for
    /// none.
    public init(guard: String? = nil, namespace: NetworkNamespace? = nil) throws(LockdownError) {
        nft = try Nftables(namespace: namespace)
        guardTable = `guard`
    }

    /// Whether this process holds a guard now.
    public var isGuarded: Bool { guardTable != nil && guardUnavailable == nil && policy != nil }

    /// Loads `policy`, replacing whatever table of ours is there (an earlier agent's
    /// included) in one transaction, and then the guard's. Nothing is sent to the kernel when
    /// it is loaded already.
    ///
    /// A table is emptied and filled again, not deleted and made again: the kernel takes a
    /// deleted base chain off its hook, and a deleted set out of its rules' lookups, before the
    /// new ones are in force, and a packet sent in that moment passes (under a flood of
    /// datagrams, most replacements let one out). What the new table declares again under the
    /// same name stays (chains on their hooks, sets emptied and filled), their rules and elements
    /// swapped whole by the commit; the rest of the old table goes. Only a table whose objects
    /// cannot take the new definitions (another version's) is deleted and made again.
    public func apply(_ policy: LockdownPolicy) throws(LockdownError) {
        guard policy != self.policy else { return }
        // A refusal may still have committed (an error after the kernel took it): what is loaded
        // is unknown then, and the next apply loads whatever it is given.
        self.policy = nil
        commits += try load(policy, into: LockdownPolicy.table)
        if let guardTable, guardUnavailable == nil {
            do {
                _ = try load(policy, into: guardTable, owned: true)
            } catch where error.message.lowercased().contains("not supported") {
                guardUnavailable = error
            }
        }
        self.policy = policy
    }

    /// Loads `policy` into `table`; returns the transactions committed.
    private func load(_ policy: LockdownPolicy, into table: String, owned: Bool = false) throws(LockdownError) -> Int {
        let listing = try isInstalled(table) ? try nft.run("list table inet \(table)", "read the lockdown firewall") : ""
        // The counters carry over from the table replaced.
        let ruleset = policy.ruleset(counts: Self.parseCounters(listing), table: table, owned: owned)
        let operation = "load the lockdown firewall (nftables table inet \(table))"
        do {
            // A set made in the transaction whose rules look it up is no better than one deleted
            // and made again: one the table does not have yet is made first, on its own, filled.
            let present = Set(TableObjects(listing).objects)
            let declared = TableObjects(ruleset)
            let newSets = declared.objects.filter { $0.holdsElements && !present.contains($0) }
            var commits = 0
            if !listing.isEmpty, !newSets.isEmpty {
                try nft.run("table inet \(table) {\n" + newSets.compactMap { declared.text[$0] }.joined() + "}\n", operation)
                commits += 1
            }
            try nft.run(Self.refill(listing, with: ruleset, table: table, owned: owned), operation)
            return commits + 1
        } catch {
            guard !listing.isEmpty else { throw error }
            // `add` makes the delete safe when the table went meanwhile; all three commit together.
            try nft.run("add table inet \(table)\(owned ? " { flags owner; }" : "")\ndelete table inet \(table)\n" + ruleset, operation)
            return 1
        }
    }

    /// The commands that turn the table `listing` shows into `ruleset` in one transaction: every
    /// rule flushed, the sets and maps `ruleset` declares again emptied, every other object
    /// deleted, then `ruleset` (which declares the kept objects again, unchanged, and fills them).
    /// An `owned` table is made owned: its owner cannot be given to it later.
    static func refill(_ listing: String, with ruleset: String, table: String = LockdownPolicy.table, owned: Bool = false) -> String {
        let kept = Set(TableObjects(ruleset).objects)
        var script = "add table inet \(table)\(owned ? " { flags owner; }" : "")\nflush table inet \(table)\n"
        for object in TableObjects(listing).objects {
            if !kept.contains(object) {
                script += "delete \(object.kind) inet \(table) \(object.name)\n"
            } else if object.holdsElements {
                script += "flush \(object.kind) inet \(table) \(object.name)\n"
            }
        }
        return script + ruleset
    }

    /// Someone else changed the table: the next `apply` loads it whole, even the same policy.
    public func forget() { policy = nil }

    /// Removes the table, whoever loaded it, and this process's guard; none there is no error.
    /// Another process's guard stays: only its end takes it away.
    public func remove() throws(LockdownError) {
        try nft.run("add table inet \(LockdownPolicy.table)\ndelete table inet \(LockdownPolicy.table)\n",
                    "remove the lockdown firewall (nftables table inet \(LockdownPolicy.table))")
        commits += 1
        policy = nil
        if let guardTable, guardUnavailable == nil, try isInstalled(guardTable) {
            try nft.run("delete table inet \(guardTable)", "remove the lockdown firewall's guard")
        }
    }

    /// Whether the table (or `table`) is loaded, whoever loaded it.
    public func isInstalled(_ table: String = LockdownPolicy.table) throws(LockdownError) -> Bool {
        let tables = try nft.run("list tables inet", "list nftables tables")
        return tables.split(whereSeparator: \.isNewline).contains { $0.trimmingPrefix("table inet ") == table[...] }
    }

    /// Packets stopped so far, by cause; empty when the table is not there.
    public func counters() throws(LockdownError) -> [BlockCause: UInt64] {
        try counts().mapValues(\.packets)
    }

    /// Packets and bytes stopped so far, by cause, by the table and the guard (a packet one
    /// of them stops the other never sees; the guard's chains, made last, see each first); empty
    /// when neither is there.
    private func counts() throws(LockdownError) -> [BlockCause: BlockCount] {
        var total: [BlockCause: BlockCount] = [:]
        for table in [LockdownPolicy.table, LockdownPolicy.guardTable, LockdownPolicy.bootGuardTable] where try isInstalled(table) {
            let text = try nft.run("list counters table inet \(table)", "read the lockdown firewall's counters")
            for (cause, count) in Self.parseCounters(text) {
                total[cause, default: BlockCount()].packets += count.packets
                total[cause, default: BlockCount()].bytes += count.bytes
            }
        }
        return total
    }

    /// Reads `counter blocked_dns { packets 3 bytes 180 }` out of nftables' listing.
    static func parseCounters(_ text: String) -> [BlockCause: BlockCount] {
        var result: [BlockCause: BlockCount] = [:]
        var current: BlockCause?
        for line in text.split(whereSeparator: \.isNewline) {
            let words = line.split(separator: " ").flatMap { $0.split(separator: "\t") }
            if words.first == "counter", words.count >= 2 {
                current = BlockCause.allCases.first { $0.counter == words[1] }
            }
            if let cause = current, let at = words.firstIndex(of: "packets"), at + 3 < words.count, words[at + 2] == "bytes",
               let packets = UInt64(words[at + 1]), let bytes = UInt64(words[at + 3]) {
                result[cause] = BlockCount(packets: packets, bytes: bytes)
                current = nil
            }
        }
        return result
    }
}

/// The objects one table declares, in nftables' language (`nft list table` or a ruleset the
/// agent wrote): chains, sets, maps, named counters and the like, by the words before their
/// names.
struct TableObjects {
    struct Object: Hashable {
        /// `chain`, `set`, `map`, `counter`, `ct helper`, ...
        var kind: String
        var name: String

        /// A set or a map: emptied and filled, never deleted and made again, while rules look it up.
        var holdsElements: Bool { kind == "set" || kind == "map" }
    }

    private(set) var objects: [Object] = []
    /// Each object's declaration, its lines as written.
    private(set) var text: [Object: String] = [:]

    init(_ listing: String) {
        var depth = 0
        var current: Object?
        for line in listing.split(whereSeparator: \.isNewline) {
            let words = line.split(whereSeparator: { $0 == " " || $0 == "\t" })
            if depth == 1, let brace = words.firstIndex(of: "{"), brace >= 2 {
                // `chain output {`, `ct helper ftp {`, `counter c { packets 0 bytes 0 }`: the
                // name is the word before the brace, the kind the words before the name.
                let object = Object(kind: words[..<(brace - 1)].joined(separator: " "), name: String(words[brace - 1]))
                objects.append(object)
                current = object
            }
            if let object = current { text[object, default: ""] += line + "\n" }
            for character in line {
                if character == "{" { depth += 1 } else if character == "}" { depth -= 1 }
            }
            if depth <= 1 { current = nil }
        }
    }
}
