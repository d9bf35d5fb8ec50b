import Basics
public import Netlink

/// The lockdown firewall in the kernel: Roam's own nftables table, replaced whole in one
/// transaction whenever the policy changes, so no packet ever meets a half-made table.
///
/// The table outlives the process on purpose: a crash, `kill -9` or a restart in place leaves
/// it, so the machine stays closed until an agent adopts it (`apply` replaces it) or an
/// operator's stop removes it (`remove`).
public final class Lockdown {
    private let nft: Nftables
    /// What is loaded now, as far as this process knows.
    public private(set) var policy: LockdownPolicy?
    /// Transactions on the table this process committed: loads and removals (see `TableWatch`).
    public private(set) var commits = 0

    public init(namespace: NetworkNamespace? = nil) throws(LockdownError) {
        nft = try Nftables(namespace: namespace)
    }

    /// Loads `policy`, replacing whatever table of ours is there (an earlier agent's
    /// included) in the same transaction. Nothing is sent to the kernel when it is loaded already.
    public func apply(_ policy: LockdownPolicy) throws(LockdownError) {
        guard policy != self.policy else { return }
        // `add` makes the delete safe when no table exists; all three commit together. The
        // counters carry over from the table replaced.
        // A refusal may still have committed (an error after the kernel took it): what is loaded
        // is unknown then, and the next apply loads whatever it is given.
        self.policy = nil
        let counts = try counts()
        try nft.run("add table inet \(LockdownPolicy.table)\ndelete table inet \(LockdownPolicy.table)\n"
                    + policy.ruleset(counts: counts),
                    "load the lockdown firewall (nftables table inet \(LockdownPolicy.table))")
        commits += 1
        self.policy = policy
    }

    /// Someone else changed the table: the next `apply` loads it whole, even the same policy.
    public func forget() { policy = nil }

    /// Removes the table, whoever loaded it; none there is no error.
    public func remove() throws(LockdownError) {
        try nft.run("add table inet \(LockdownPolicy.table)\ndelete table inet \(LockdownPolicy.table)\n",
                    "remove the lockdown firewall (nftables table inet \(LockdownPolicy.table))")
        commits += 1
        policy = nil
    }

    /// Whether the table is loaded, whoever loaded it.
    public func isInstalled() throws(LockdownError) -> Bool {
        let tables = try nft.run("list tables inet", "list nftables tables")
        return tables.split(whereSeparator: \.isNewline).contains { $0.trimmingPrefix("table inet ") == LockdownPolicy.table[...] }
    }

    /// Packets stopped so far, by cause; empty when the table is not there.
    public func counters() throws(LockdownError) -> [BlockCause: UInt64] {
        try counts().mapValues(\.packets)
    }

    /// Packets and bytes stopped so far, by cause; empty when the table is not there.
    private func counts() throws(LockdownError) -> [BlockCause: BlockCount] {
        guard try isInstalled() else { return [:] }
        let text = try nft.run("list counters table inet \(LockdownPolicy.table)", "read the lockdown firewall's counters")
        return Self.parseCounters(text)
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
