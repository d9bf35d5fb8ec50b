import Topology
import Netlink
import Logging
import Lockdown
import Basics
import PathMonitor
import Reconnector
import SystemDNS
import Tunnel
import Device

/// The tunnel device, its routes and resolvers once the first handshake gives the inner
/// addresses; the lockdown's lifts and restores; the network's local subnets.
extension SessionEffects {
    /// The TUN device comes up once, after the first handshake tells our inner address (the
    /// core asks, `Effect.attachTunnel`), and stays through every reconnect. Throws why the
    /// device cannot be configured.
    func attachTunnel() throws(AgentError) {
        // A late answer after a rule lifted the lockdown brings no routes back.
        guard tun == nil, !lockdownLifted, let client else { return }
        let prefixes = client.addresses.compactMap { Prefix($0, length: $0.family.bitWidth) }
        // Before the device has them: nothing for these addresses comes in on an uplink.
        do {
            try firewall?.tunnelAddresses(client.addresses)
        } catch {
            log.error("cannot close the lockdown to the tunnel's addresses on the uplinks", metadata: ["error": "\(error)"])
        }
        do {
            let device = try TunDevice(name: settings.tunnel.name, mtu: wantedMTU ?? settings.tunnel.mtu, addresses: prefixes,
                                       offload: settings.tunnel.offload)
            routes = try TunnelRoutes(settings.mode, device: device)
            followClaims()
            tun = device
            client.attach(device)
            log.info("tunnel up", metadata: ["tunnel": "\(device.name)", "addresses": "\(prefixes.map(\.description).joined(separator: ","))",
                                      "offload": "\(device.offload.description)"])
        } catch {
            throw AgentError("cannot configure the tunnel device: \(error)")
        }
    }

    /// Gives the system the tunnel's resolvers the core chose (`ResolverChoice`), or tells why
    /// there are none.
    func useResolvers(_ decision: ResolverDecision) {
        guard let dns, let tun else { return }
        if !decision.offLAN.isEmpty {
            do {
                try firewall?.tunnelResolvers(decision.offLAN)
            } catch {
                log.error("cannot keep the tunnel's resolvers out of the LAN", metadata: ["error": "\(error)"])
            }
        }
        if !decision.inClear.isEmpty {
            log.warning("resolvers outside the tunnel are not used: they would be asked in clear",
                        metadata: ["resolvers": "\(decision.inClear.map(\.description).joined(separator: ","))"])
        }
        guard let wanted = decision.use else { return noResolvers(decision.why ?? "none", level: .warning) }
        guard wanted != dns.applied else { return }
        do {
            try dns.apply(wanted, interface: (tun.index, tun.name), routeAll: settings.mode.socketMark != nil)
            dnsProblem = nil
            log.info("dns", metadata: ["resolvers": "\(wanted.resolvers.map(\.description).joined(separator: ","))",
                                "search": "\(wanted.searchDomains.joined(separator: ","))", "via": "\(dns.manager.rawValue)"])
        } catch {
            noResolvers("\(error)", level: .error)
        }
    }

    func noResolvers(_ reason: String, level: Logger.Level) {
        guard reason != dnsProblem else { return }
        dnsProblem = reason
        log.log(level: level, "no tunnel dns", metadata: ["reason": "\(reason)"])
    }

    // MARK: On-demand rules

    /// An on-demand rule trusts the network: the lockdown, then the tunnel's routes and its
    /// resolvers step aside (the session has ended already), and the machine talks to the
    /// network directly. A lockdown that cannot be lifted leaves all three as they are: why is
    /// returned, for the core. A route or resolver step that fails is logged; the others still happen.
    func liftLockdown(interface: String) -> String? {
        do {
            try firewall?.lift(for: interface)
        } catch {
            log.error("cannot lift the lockdown; it stays, with the tunnel's routes and resolvers", metadata: ["error": "\(error)"])
            return "\(error)"
        }
        lockdownLifted = true
        do {
            try routes?.remove()
            routes = nil
        } catch {
            log.error("cannot take the tunnel's routes away", metadata: ["error": "\(error)"])
        }
        if let dns, dns.applied != nil {
            do {
                try dns.revert()
            } catch {
                log.error("cannot take the tunnel's resolvers back", metadata: ["error": "\(error)"])
            }
        }
        log.notice("lockdown lifted: the network is trusted", metadata: ["interface": "\(interface)",
            "routes": "\(routes == nil ? "removed" : "kept")", "lockdown": "\(firewall?.trustedInterface.map { "open on \($0) only" } ?? "none")"])
        return nil
    }

    /// The lockdown first (so nothing leaves in clear meanwhile), then the tunnel's routes and
    /// its resolvers. A lockdown that cannot come back is tried again every second.
    func restoreLockdown() {
        lockdownLifted = false
        restoreFirewall()
        if let tun, routes == nil {
            do {
                routes = try TunnelRoutes(settings.mode, device: tun)
                followClaims()
            } catch {
                log.error("cannot put the tunnel's routes back", metadata: ["error": "\(error)"])
            }
        }
        log.notice("lockdown restored")
    }

    func restoreFirewall() {
        do {
            try firewall?.restore()
        } catch {
            log.error("cannot put the lockdown back; trying again every second", metadata: ["error": "\(error)"])
        }
    }

    // MARK: The network

    /// The networks on the uplinks are `prefixes` now: the lockdown lets them through (with
    /// allow-lan), and a resolver on one of them is reached outside the tunnel.
    func localNetworksChanged(_ prefixes: [Prefix], widerClaims: [Prefix]) {
        do {
            try firewall?.localNetworksChanged(prefixes)
        } catch {
            log.error("cannot follow the local subnets in the lockdown", metadata: ["error": "\(error)"])
        }
        for claim in widerClaims where !self.widerClaims.contains(claim) {
            log.warning("a network claims a subnet wider than a LAN; only the part around this machine's address counts as local",
                        metadata: ["subnet": "\(claim)", "local": "\(prefixes.filter { claim.contains($0) }.map(\.description).joined(separator: ","))"])
        }
        self.widerClaims = widerClaims
        defer { followClaims() }
        if prefixes != localNetworks {
            if settings.allowLAN {
                let listed = settings.lanRanges
                let refusedBefore = LockdownPolicy.lan(from: localNetworks, also: listed).refused
                for subnet in LockdownPolicy.lan(from: prefixes, also: listed).refused where !refusedBefore.contains(subnet) {
                    let opened = LockdownPolicy.lan(from: [subnet], also: listed).open
                    log.warning("a network calls a subnet local that is not private; allow-lan opens only its private part",
                                metadata: ["subnet": "\(subnet)", "opened": "\(opened.map(\.description).joined(separator: ","))"])
                }
            }
            localNetworks = prefixes
            exclusionNetworkChanged()
        }
    }

    /// Keeps what networks claimed wider than a LAN in the tunnel, but for the part that counts
    /// as local (`RoutingMode.claimRules`).
    func followClaims() {
        do {
            try routes?.follow(settings.mode.claimRules(local: localNetworks, widerClaims: widerClaims))
        } catch {
            log.error("cannot keep what a network claimed in the tunnel", metadata: ["error": "\(error)"])
        }
    }

    /// The bridges the machine's containers and VMs sit behind: the lockdown lets them reach the
    /// machine (DHCP, DNS to a forwarder on the bridge, published ports) and each other; what
    /// they send beyond goes into the tunnel (full mode) like the machine's own.
    func guestNetworksChanged(_ guests: [GuestNetwork]) {
        do {
            try firewall?.guestNetworks(guests.map(\.interface))
        } catch {
            log.error("cannot let the containers' and VMs' bridges through the lockdown", metadata: ["error": "\(error)"])
        }
        guard guests != guestNetworks else { return }
        guestNetworks = guests
        log.info("guest networks", metadata: ["bridges": "\(guests.isEmpty ? "none" : guests.map(\.description).joined(separator: " "))"])
    }

    /// What the operator needs to know of a change in links, addresses or routes.
    func networkObserved(_ model: NetworkModel) {
        // Full mode only: split mode routes around the tunnel by design.
        guard settings.mode.socketMark != nil else { return }
        let diverting = model.routesAroundTheTunnel(localRanges: settings.allowLAN ? settings.lanRanges : [])
        for route in diverting where !divertingRoutes.contains(route) {
            log.warning("a route on an uplink takes traffic around the tunnel",
                metadata: ["route": "\(route.description)", "lockdown": "\(firewall == nil ? "off: that traffic leaves in clear" : "on: that traffic is stopped")"])
        }
        divertingRoutes = diverting
        let others = model.otherTunnels(meeting: settings.mode.carried)
        for route in others where !otherTunnelRoutes.contains(route) {
            log.warning("another tunnel's route meets what this tunnel carries; the kernel may send that traffic there",
                        metadata: ["route": "\(route.description)", "precedence": "\(Self.precedence(route))"])
        }
        otherTunnelRoutes = others
    }

    /// Who wins for a route of another tunnel, in words.
    static func precedence(_ route: DivertingRoute) -> String {
        route.table == nil ? "a more specific route in the main table wins over the tunnel's"
            : "it wins only if a rule before the tunnel's consults table \(route.table ?? 0)"
    }

    /// Policy rules of others that decide before the tunnel's (full mode), read from the kernel
    /// when rules change: each new one is warned of.
    func checkRulesBefore() {
        guard settings.mode.socketMark != nil else { return }
        let rules: [RoutingRule]
        do throws(NetlinkError) {
            rules = try NetlinkSocket().rules()
        } catch {
            return log.warning("cannot read the policy rules", metadata: ["error": "\(error)"])
        }
        let before = settings.mode.rulesBefore(in: rules)
        for rule in before where !rulesBefore.contains(rule) {
            log.warning("a policy rule decides before the tunnel's: what its table routes does not go into the tunnel",
                        metadata: ["rule": "\(rule)"])
        }
        rulesBefore = before
    }

    /// Ends the session and takes the routes down. Only the operator's `agent stop` opens the
    /// machine again and gives resolv.conf back; a signal (a restart, an upgrade, a shutdown,
    /// a start that timed out), a restart in place or a give-up keeps the lockdown and the
    /// resolvers, so nothing leaks until the next agent adopts them.
    func close(operatorStop: Bool) {
        client?.close()
        try? routes?.remove()
        // Whatever comes next (a stop, a restart in place), the window does not outlive the agent.
        closePortalWindow()
        closeExclusion()
        cgroups?.unmount()
        // A closing still refused gets a last try; the next agent loads the table whole anyway.
        if let firewall, firewall.refusals > 0, let error = firewall.retry() {
            log.error("the lockdown could not be put back whole before stopping", metadata: ["error": "\(error)"])
        }
        guard operatorStop else {
            if firewall != nil { log.info("lockdown kept: only 'agent stop' opens the machine") }
            return
        }
        if let dns, dns.applied != nil {
            do {
                try dns.revert()
                log.info("dns restored", metadata: ["via": "\(dns.manager.rawValue)"])
            } catch {
                log.error("cannot take the tunnel's resolvers back", metadata: ["error": "\(error)"])
            }
        }
        if let firewall {
            do {
                try firewall.remove()
                log.info("lockdown removed")
            } catch {
                log.error("cannot remove the lockdown firewall; remove it with 'agent lockdown off'", metadata: ["error": "\(error)"])
            }
        }
    }
}
