public import Topology
import Glibc
public import Basics
public import Netlink

/// Which traffic the kernel sends into the tunnel.
public enum RoutingMode: Hashable, Sendable {
    /// Only these prefixes, through routes in the main table; everything else keeps its route.
    /// None of them may hold the server, or the tunnel's own packets would loop into it.
    case split([Prefix])
    /// Everything, the way wg-quick does it: see `FullTunnel`.
    case full(FullTunnel)

    /// The split prefixes; none in full mode, whose marked socket never loops into the tunnel.
    public var splitPrefixes: [Prefix] {
        if case .split(let prefixes) = self { prefixes } else { [] }
    }

    /// Whether packets to `address` go through the tunnel: all of them in full mode.
    public func carries(_ address: IPAddress) -> Bool {
        if case .split(let prefixes) = self { prefixes.contains { $0.contains(address) } } else { true }
    }

    /// What the tunnel carries: the split prefixes, or everything.
    public var carried: [Prefix] {
        if case .split(let prefixes) = self { prefixes } else { [.any(.v4), .any(.v6)] }
    }

    /// Policy rules of others that decide before this mode's (full mode: any rule with a lower
    /// priority than its own that sends packets to a table other than the kernel's own: another
    /// VPN's policy routing, Tailscale's `5270: lookup 52`). Split mode has no rules to come before.
    public func rulesBefore(in rules: [RoutingRule]) -> [RoutingRule] {
        guard case .full(let policy) = self else { return [] }
        return rules.filter { $0.priority < policy.priority && ![Route.mainTable, 253, 255, policy.table].contains($0.table) }
    }

    /// The rules that keep what a network claimed wider than a LAN (`widerClaims`, see
    /// `NetworkModel.localClaim`) in the tunnel, full mode only: the kernel's route for the
    /// claimed subnet is in the main table, which decides before the tunnel's for anything more
    /// specific than a default route, so without them the rest of a claimed 10/8 would go to the
    /// network that claimed it. Before the mode's own rules, after its `neverLocal` ones: the
    /// session's marked packets keep the main table, what counts as local (`local` inside a
    /// claim) keeps it too, and the rest of each claim goes to the tunnel's table. Split mode
    /// needs none: its routes are its prefixes.
    public func claimRules(local: [Prefix], widerClaims: [Prefix]) -> [RoutingRule] {
        guard case .full(let policy) = self, !widerClaims.isEmpty else { return [] }
        var rules: [RoutingRule] = []
        for family in [IPAddress.Family.v4, .v6] {
            let claims = widerClaims.filter { $0.address.family == family }.map(\.network)
            guard !claims.isEmpty else { continue }
            // The plan's own mark rule is there already when it has never-local subnets.
            if !policy.neverLocal.contains(where: { $0.address.family == family }) {
                rules.append(RoutingRule(family: family, priority: policy.priority - 4, table: Route.mainTable, mark: policy.mark))
            }
            for kept in local.map(\.network) where kept.address.family == family && claims.contains(where: { $0.contains(kept) }) {
                // The main table's own routes for it (the LAN's), never its default route: were
                // the LAN's route gone, the tunnel's rules after decide.
                rules.append(RoutingRule(family: family, priority: policy.priority - 2, table: Route.mainTable, suppressPrefixLength: 0,
                                         destination: kept))
            }
            for claim in claims {
                rules.append(RoutingRule(family: family, priority: policy.priority - 1, table: policy.table, destination: claim))
            }
        }
        return rules
    }

    /// The mark the session's sockets must carry (`UDPSocket(mark:)`) in this mode.
    public var socketMark: UInt32? {
        if case .full(let policy) = self { policy.mark } else { nil }
    }

    /// The routes and rules that put this mode in place for the TUN interface `linkIndex`,
    /// whose inner addresses are of `tunneled` families, in the order they are installed: a
    /// packet never meets a rule whose route is missing.
    ///
    /// Full mode covers both families whatever the tunnel carries: a family without an inner
    /// address gets an unreachable default route, so its packets fail at once (applications
    /// fall back to the other family) and never leave in clear. The kernel accepts that route
    /// even where IPv6 is disabled, unlike one through a device.
    public func plan(linkIndex: Int32, tunneled: Set<IPAddress.Family> = [.v4, .v6]) -> RoutingPlan {
        let hop = [NextHop(linkIndex: linkIndex)]
        switch self {
        case .split(let prefixes):
            return RoutingPlan(routes: prefixes.map { Route(destination: $0, nextHops: hop) }, rules: [])
        case .full(let policy):
            var plan = RoutingPlan(routes: [], rules: [])
            for family in [IPAddress.Family.v4, .v6] {
                plan.routes.append(tunneled.contains(family)
                    ? Route(table: policy.table, destination: .any(family), nextHops: hop)
                    : Route(table: policy.table, destination: .any(family), type: .reject, nextHops: []))
                // What never counts as local goes to the tunnel's table before the main table
                // can give it to a LAN that claims it; the session's marked packets keep the main table.
                let neverLocal = policy.neverLocal.filter { $0.address.family == family }
                if !neverLocal.isEmpty {
                    plan.rules.append(RoutingRule(family: family, priority: policy.priority - 4, table: Route.mainTable, mark: policy.mark))
                    for prefix in neverLocal {
                        plan.rules.append(RoutingRule(family: family, priority: policy.priority - 3, table: policy.table, destination: prefix))
                    }
                }
                // The main table first, but only for what it routes more specifically than a
                // default route: the LAN, the uplinks' own subnets.
                plan.rules.append(RoutingRule(family: family, priority: policy.priority, table: Route.mainTable,
                                              suppressPrefixLength: 0))
                // Then every packet without the tunnel's mark goes to the tunnel's table. The
                // session's packets carry the mark, skip this rule, and meet the main table's
                // default route: whichever uplink is current, so no host route can be stranded.
                plan.rules.append(RoutingRule(family: family, priority: policy.priority + 1, table: policy.table,
                                              mark: policy.mark, inverted: true))
            }
            return plan
        }
    }
}

/// Full-tunnel policy routing, as wg-quick sets it up for a `/0` allowed IP:
/// ```
/// ip rule add priority 32764 lookup main suppress_prefixlength 0
/// ip rule add priority 32765 not fwmark 0xca6c lookup 51820
/// ip route add default dev roam0 table 51820
/// ```
public struct FullTunnel: Hashable, Sendable {
    /// The table holding the default route into the tunnel.
    public var table: UInt32
    /// The mark on the session's own packets.
    public var mark: UInt32
    /// The suppressing rule's priority; the mark rule takes the next. Both must come before
    /// the main table's rule (32766).
    public var priority: UInt32
    /// Subnets that never count as local, whatever a network says (`never-local`: the
    /// intranet's ranges): rules before the main table's send them to the tunnel's table.
    public var neverLocal: [Prefix]

    public init(table: UInt32 = 51820, mark: UInt32 = 0xca6c, priority: UInt32 = 32764, neverLocal: [Prefix] = []) {
        self.table = table
        self.mark = mark
        self.priority = priority
        self.neverLocal = neverLocal.map(\.network)
    }
}

/// Routes and rules to install, in order.
public struct RoutingPlan: Hashable, Sendable {
    public var routes: [Route]
    public var rules: [RoutingRule]
}

/// A routing mode installed in the kernel for one TUN device; the one owner of its routes and
/// rules, removed by `remove()` or, failing that, deinit.
///
/// Rules outlive the TUN device (its routes die with it), so a crash leaves them: a rule that
/// exists already when installing is taken as this agent's own, and removed with the rest.
public final class TunnelRoutes {
    public let plan: RoutingPlan
    private let netlink: NetlinkSocket
    private var installedRoutes = 0
    private var installedRules = 0
    /// Rules that follow the networks (`RoutingMode.claimRules`), installed beside the plan's.
    public private(set) var followed: [RoutingRule] = []

    /// Installs `mode` for `device`; on failure removes what it installed, then throws.
    public init(_ mode: RoutingMode, device: TunDevice, namespace: NetworkNamespace? = nil) throws(DeviceError) {
        plan = mode.plan(linkIndex: device.index, tunneled: Set(device.addresses.map(\.address.family)))
        netlink = try inNamespace(namespace) { () throws(DeviceError) in
            do throws(NetlinkError) { return try NetlinkSocket() } catch { throw DeviceError(error) }
        }
        do throws(NetlinkError) {
            for route in plan.routes {
                try netlink.write(route)
                installedRoutes += 1
            }
            for rule in plan.rules {
                do throws(NetlinkError) { try netlink.write(rule) } catch where error.code == EEXIST {}
                installedRules += 1
            }
        } catch {
            try? remove()
            throw DeviceError(error)
        }
    }

    deinit { try? remove() }

    /// What of the plan the kernel does not hold now, in `ip`'s words: its routes looked up in
    /// `routes` (the path model's copy of every table), its rules in a fresh dump. Empty when
    /// whole, or when it was never installed or has been removed.
    public func missing(routes: some Collection<Route>) throws(DeviceError) -> [String] {
        guard installedRoutes > 0 || installedRules > 0 else { return [] }
        var missing: [String] = []
        for route in plan.routes[..<installedRoutes] where !routes.contains(where: { Self.same($0, route) }) {
            missing.append("route \(route.destination)" + (route.table == Route.mainTable ? "" : " table \(route.table)"))
        }
        if installedRules > 0 {
            let present: [RoutingRule]
            do throws(NetlinkError) { present = try netlink.rules() } catch { throw DeviceError(error) }
            for rule in plan.rules[..<installedRules] + followed where !present.contains(rule) { missing.append("rule \(rule)") }
        }
        return missing
    }

    /// Installs `rules` in place of the ones followed so far: the new ones first, then the old
    /// ones no longer wanted are removed. A rule the kernel holds already counts as installed.
    public func follow(_ rules: [RoutingRule]) throws(DeviceError) {
        guard rules != followed else { return }
        do throws(NetlinkError) {
            for rule in rules where !followed.contains(rule) {
                do throws(NetlinkError) { try netlink.write(rule) } catch where error.code == EEXIST {}
                followed.append(rule)
            }
            for rule in followed where !rules.contains(rule) {
                do throws(NetlinkError) { try netlink.write(rule, delete: true) } catch where [ENOENT, ESRCH].contains(error.code) {}
                followed.removeAll { $0 == rule }
            }
        } catch {
            throw DeviceError(error)
        }
    }

    /// Whether `found` is `wanted` as the kernel reports it: an unreachable route's next hop is
    /// the loopback device, whatever was asked.
    private static func same(_ found: Route, _ wanted: Route) -> Bool {
        found.table == wanted.table && found.destination == wanted.destination && found.type == wanted.type
            && (wanted.type == .reject || found.nextHops.map(\.linkIndex) == wanted.nextHops.map(\.linkIndex))
    }

    /// Puts back whatever of the plan someone removed: each route and rule is written again, in
    /// the plan's order (routes before the rules that send packets to them); what is there
    /// already stays.
    public func reinstall() throws(DeviceError) {
        do throws(NetlinkError) {
            for route in plan.routes[..<installedRoutes] {
                do throws(NetlinkError) { try netlink.write(route) } catch where error.code == EEXIST {}
            }
            for rule in plan.rules[..<installedRules] + followed {
                do throws(NetlinkError) { try netlink.write(rule) } catch where error.code == EEXIST {}
            }
        } catch {
            throw DeviceError(error)
        }
    }

    /// Removes the rules (first, so no packet meets a rule without its route), then the
    /// routes. Whatever is gone already (routes die with the TUN device) is not an error;
    /// anything else is, after the rest was removed. Safe to call again.
    public func remove() throws(DeviceError) {
        var failure: NetlinkError?
        func undo(_ body: () throws(NetlinkError) -> Void) {
            do throws(NetlinkError) {
                try body()
            } catch where [ENOENT, ESRCH, ENODEV].contains(error.code) {
                // Gone already.
            } catch {
                failure = failure ?? error
            }
        }
        while let rule = followed.popLast() {
            undo { () throws(NetlinkError) in try netlink.write(rule, delete: true) }
        }
        while installedRules > 0 {
            installedRules -= 1
            undo { () throws(NetlinkError) in try netlink.write(plan.rules[installedRules], delete: true) }
        }
        while installedRoutes > 0 {
            installedRoutes -= 1
            undo { () throws(NetlinkError) in try netlink.write(plan.routes[installedRoutes], delete: true) }
        }
        if let failure { throw DeviceError(failure) }
    }
}
