import Topology
import Glibc
import Basics
public import Netlink

/// Tells when someone else changed or deleted the lockdown's table: `nft flush ruleset` in a
/// script, a firewall manager that starts from a clean slate, an operator's `nft delete table`.
/// Without it the machine would be open until the agent next changed its policy.
///
/// nftables announces every committed transaction to the `NFNLGRP_NFTABLES` group: a message per
/// object it made or deleted, then the new generation with the committing process's id and name.
/// A transaction that touched `inet roam` is the agent's own when it is one the agent committed
/// (`Lockdown.commits`, counted in the order the kernel reports them), anyone else's otherwise.
/// Nothing is read but when the kernel has something to say: no idle wake-ups.
public final class TableWatch {
    private let socket: NetlinkSocket
    /// Transactions on the table the agent committed and the watch has not seen yet.
    private var ownPending = 0
    private var ownCommitsSeen = 0
    /// The transaction being read touched the table.
    private var touched: String?

    /// Watches this network namespace's nftables, or `namespace`'s, once the agent committed
    /// `ownCommits` transactions (whose announcements this watch never sees).
    public init(ownCommits: Int = 0, namespace: NetworkNamespace? = nil) throws(LockdownError) {
        ownCommitsSeen = ownCommits
        let open = { () throws(NetlinkError) -> NetlinkSocket in
            try NetlinkSocket(protocol: 12 /* NETLINK_NETFILTER */, groups: NetlinkGroups(rawValue: 1 << (7 - 1)) /* NFNLGRP_NFTABLES */,
                              receiveBuffer: 1 << 20)
        }
        do throws(NetlinkError) {
            if let namespace { socket = try namespace.run(open) } else { socket = try open() }
        } catch {
            throw LockdownError("watch nftables' changes", "\(error)")
        }
    }

    /// The descriptor to poll for readiness.
    public var fileDescriptor: Int32 { socket.fileDescriptor }

    /// Reads what the kernel announced, given how many transactions the agent has committed so
    /// far (`Lockdown.commits`); returns what someone else did to the table (with who, when the
    /// kernel said), nil when nothing. A lost announcement (the queue overran) counts as a change:
    /// the table is loaded again rather than trusted.
    public func foreignChange(ownCommits: Int) -> (what: String, by: String?)? {
        ownPending += ownCommits - ownCommitsSeen
        ownCommitsSeen = ownCommits
        var found: (what: String, by: String?)?
        let overran = socket.takeQueued { message in
            guard let event = Self.parse(Array(message)) else { return }
            switch event {
            // A deleted table's rules, chains and sets go first, then the table: the table says it all.
            case .touched(let what): touched = what == "table deleted" ? what : touched ?? what
            case .generation(let pid, let name):
                defer { touched = nil }
                guard let what = touched else { return }
                if ownPending > 0 {
                    ownPending -= 1
                } else {
                    found = (what, pid.map { "\(name ?? "?") (pid \($0))" })
                }
            }
        }
        if overran {
            ownPending = 0
            return ("changes lost: the announcements overran", nil)
        }
        return found
    }

    enum Event: Equatable {
        /// An object of the table was made or deleted (`what`, in nftables' words).
        case touched(String)
        /// A transaction was committed by process `pid` called `name`.
        case generation(pid: UInt32?, name: String?)
    }

    /// One nfnetlink message: nil when it is not about nftables, or about another table.
    static func parse(_ b: [UInt8]) -> Event? {
        guard b.count >= 20 else { return nil }
        let type = b.u16(4)
        guard type >> 8 == 10 /* NFNL_SUBSYS_NFTABLES */ else { return nil }
        let kind = type & 0xff
        let family = b[16]
        var table: String?
        var pid: UInt32?
        var name: String?
        _ = NetlinkDecoder.attributes(b, 20..<b.count) { attribute, value in
            switch (kind, attribute & 0x7fff) {
            case (15, 2): if value.count >= 4 { pid = UInt32(bigEndian: b.u32(value.lowerBound)) }  // NFTA_GEN_PROC_PID
            case (15, 3): name = b.cString(value)  // NFTA_GEN_PROC_NAME
            case (_, 1): table = b.cString(value)  // every object's table (NFTA_TABLE_NAME, NFTA_CHAIN_TABLE, ...)
            default: break
            }
        }
        if kind == 15 { return .generation(pid: pid, name: name) }
        guard family == 1 /* NFPROTO_INET */, table == LockdownPolicy.table, let what = Self.names[kind] else { return nil }
        return .touched(what)
    }

    /// The messages that change a table, by `NFT_MSG_*`.
    static let names: [UInt16: String] = [
        0: "table made again", 2: "table deleted", 3: "chain changed", 5: "chain deleted", 6: "rule added", 8: "rule deleted",
        9: "set changed", 11: "set deleted", 12: "set elements added", 14: "set elements deleted", 18: "object changed",
        20: "object deleted", 22: "flowtable changed", 24: "flowtable deleted", 26: "table deleted", 27: "chain deleted", 28: "rule deleted", 29: "set deleted",
        30: "set elements deleted", 31: "object deleted",
    ]
}
