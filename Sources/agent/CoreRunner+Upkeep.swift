import Topology
import Glibc
import Logging
import Basics
import Lockdown
import Netlink
import PathMonitor
import Reconnector
import SystemDNS

/// What the agent put on the machine, watched: the tunnel's rules and routes (rtnetlink's
/// notices, through the path monitor), the lockdown's table (nftables' announcements), the
/// resolvers (inotify on resolv.conf). What someone else took away goes to the core as
/// `damaged`; the core decides when it goes back (`Upkeep`).
extension ClientDaemon.CoreRunner {
    /// Opens the watches that need a descriptor of their own; one that cannot be opened is logged
    /// and the rest still work.
    func startWatches() {
        if let firewall = effects.firewall {
            do {
                tableWatch = try TableWatch(ownCommits: firewall.commits)
            } catch {
                log.warning("cannot watch the lockdown's table; a change by someone else goes unnoticed", metadata: ["error": "\(error)"])
            }
        }
        if effects.dns?.manager == .resolvConf {
            do {
                resolvConfWatch = try ResolvConfWatch()
            } catch {
                log.warning("cannot watch resolv.conf; a rewrite by someone else is noticed only on the next network change",
                            metadata: ["error": "\(error)"])
            }
        }
    }

    var watchDescriptors: [Int32] { [tableWatch?.fileDescriptor, resolvConfWatch?.fileDescriptor].compactMap { $0 } }

    /// Reads what the watches that are ready say.
    func watchesSpoke(ready: [Int32]) {
        if let tableWatch, ready.contains(tableWatch.fileDescriptor), let firewall = effects.firewall,
           let change = tableWatch.foreignChange(ownCommits: firewall.commits) {
            noticed(.lockdown, what: ["nftables table inet \(LockdownPolicy.table): \(change.what)"], by: change.by)
        }
        if let resolvConfWatch, ready.contains(resolvConfWatch.fileDescriptor), resolvConfWatch.changed() { checkResolvers() }
    }

    /// The kernel reported rules or removed routes: whether any of the tunnel's went, and who took them.
    func routingNoticed(_ notices: [RoutingNotice]) {
        if notices.contains(where: { if case .rule = $0.subject { true } else { false } }) { effects.checkRulesBefore() }
        let own = UInt32(bitPattern: getpid())
        let by = notices.first { $0.removed && $0.sender != 0 && $0.sender != own }.flatMap { Self.who(port: $0.sender) }
        checkRouting(by: by)
    }

    func checkRouting(by: String? = nil) {
        guard let routes = effects.routes else { return noticed(.routing, what: [], by: nil) }
        do {
            noticed(.routing, what: try routes.missing(routes: core.network.model.routes.values), by: by)
        } catch {
            log.warning("cannot read the tunnel's rules back", metadata: ["error": "\(error)"])
        }
    }

    func checkResolvers() {
        noticed(.resolvers, what: effects.dns?.missing.map { [$0] } ?? [], by: nil)
    }

    /// Tells the core what a look at `holding` found; what is news is the core's to say.
    private func noticed(_ holding: Holding, what: [String], by: String?) {
        feed(what.isEmpty ? .intact(holding) : .damaged(holding, Upkeep.Damage(what: what.joined(separator: "; "), by: by)))
    }

    /// The core's `restore`: puts `holding` back, then reads it again; what is found goes back
    /// to the core (still missing: `damaged` again, which the core may hold off).
    func restore(_ holding: Holding, _ damage: Upkeep.Damage) -> AgentEvent {
        metrics.restored(holding.rawValue)
        var failure: String?
        switch holding {
        case .routing:
            do { try effects.routes?.reinstall() } catch { failure = "\(error)" }
        case .resolvers:
            do { try effects.dns?.reassert() } catch { failure = "\(error)" }
        case .lockdown:
            do { try effects.firewall?.reload() } catch { failure = "\(error)" }
        }
        // The lockdown is put back however often it is taken: past the first few a minute, one
        // line in a hundred says so.
        let recent = core.upkeep.restoresWithin(window: Instant.now(), of: holding)
        let restores = core.upkeep.records[holding]?.restores ?? 0
        // A refusal that lasts is tried again every second: the first few say so, then one in 60.
        let inRow = core.upkeep.records[holding]?.unheldInRow ?? 0
        if let failure {
            if inRow < 3 || inRow.isMultiple(of: 60) {
                log.error("cannot put it back", metadata: ["what": "\(holding.rawValue)", "error": "\(failure)", "tries": "\(inRow + 1)"])
            }
        } else if recent <= Upkeep.restoresPerWindow || restores.isMultiple(of: 100) {
            log.notice("put back", metadata: ["what": "\(holding.rawValue)", "missing": "\(damage.what)", "by": "\(damage.by ?? "unknown")",
                                              "restores": "\(restores)"])
        }
        // Read again from the kernel and the file, not assumed.
        switch holding {
        case .routing:
            guard let routes = effects.routes else { return .intact(holding) }
            let left = (try? routes.missing(routes: Self.kernelRoutes())) ?? [damage.what]
            return settle(holding, left, damage)
        case .resolvers: return settle(holding, effects.dns?.missing.map { [$0] } ?? [], damage)
        case .lockdown: return settle(holding, failure == nil ? [] : [damage.what], damage)
        }
    }

    private func settle(_ holding: Holding, _ left: [String], _ damage: Upkeep.Damage) -> AgentEvent {
        left.isEmpty ? .intact(holding) : .damaged(holding, Upkeep.Damage(what: left.joined(separator: "; "), by: damage.by))
    }

    /// The routes of every table as the kernel holds them now: the path model hears of the
    /// agent's own writes only after this effect.
    private static func kernelRoutes() throws -> [Route] {
        var decoder = NetlinkDecoder()
        return try NetlinkSocket().dump(decoder: &decoder).compactMap { if case .routeAdded(let route) = $0 { route } else { nil } }
    }

    /// Who a netlink port belongs to, when it is a process's id (most programs' first socket):
    /// its name and id; else the port.
    static func who(port: UInt32) -> String? {
        guard port != 0 else { return nil }
        if let name = SystemFiles.text("/proc/\(port)/comm"), !name.isEmpty { return "\(name) (pid \(port))" }
        return "netlink port \(port)"
    }
}
