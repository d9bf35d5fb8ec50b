public import Basics

/// How the session's packets travel over an uplink to the gateway.
public enum Transport: String, Hashable, Sendable {
    /// Datagrams, the protocol's own transport.
    case udp
    /// The same messages framed on a TCP stream inside TLS to the gateway (port 443 by default),
    /// directly or through an HTTP proxy: for networks that block UDP. Opening it takes round
    /// trips of its own (TCP, TLS, perhaps the proxy's CONNECT) before anything is sent.
    case stream
}

/// The way the tunnel's flow leaves this host for the server: an uplink, the source address the
/// session binds to, the route that carries it, and the transport over it (UDP unless the core
/// chose the stream: the network model only ever makes UDP paths).
public struct Path: Hashable, Sendable, CustomStringConvertible {
    /// What makes two paths the same for the session: the socket is bound to a link and a
    /// source, and carries one transport. The UDP and the stream path over one uplink are two
    /// paths: the session moves between them as it roams between uplinks.
    public struct ID: Hashable, Sendable, CustomStringConvertible {
        public var linkIndex: Int32
        public var source: IPAddress
        public var transport: Transport
        public init(linkIndex: Int32, source: IPAddress, transport: Transport = .udp) {
            self.linkIndex = linkIndex
            self.source = source
            self.transport = transport
        }
        /// The same uplink and source over `transport`.
        public func over(_ transport: Transport) -> ID {
            ID(linkIndex: linkIndex, source: source, transport: transport)
        }
        public var description: String { "\(linkIndex)/\(source)" + (transport == .stream ? "/tls" : "") }
    }

    public var linkIndex: Int32
    public var interface: String
    public var kind: LinkKind
    public var source: IPAddress
    public var gateway: IPAddress?
    public var metric: UInt32
    /// Prefix length of the route that matched the server: longer is more specific.
    public var prefixLength: Int
    public var mtu: Int
    /// The link's other valid addresses of the same family (deprecated ones included): a session
    /// bound to one of them may stay while the link's preference settles.
    public var otherSources: [IPAddress]
    public var transport: Transport

    public init(linkIndex: Int32, interface: String, kind: LinkKind, source: IPAddress, gateway: IPAddress?,
                metric: UInt32, prefixLength: Int, mtu: Int, otherSources: [IPAddress] = [], transport: Transport = .udp) {
        self.linkIndex = linkIndex
        self.interface = interface
        self.kind = kind
        self.source = source
        self.gateway = gateway
        self.metric = metric
        self.prefixLength = prefixLength
        self.mtu = mtu
        self.otherSources = otherSources
        self.transport = transport
    }

    public var id: ID { ID(linkIndex: linkIndex, source: source, transport: transport) }

    /// What the tunnel adds to an inner packet on the wire from `source`: the data header and
    /// the AEAD tag (32), UDP (8) and the outer IP header (20, or 40 over IPv6).
    public static func tunnelOverhead(from source: IPAddress) -> Int {
        32 + 8 + (source.family == .v4 ? 20 : 40)
    }

    /// The same uplink, source and route over `transport`.
    public func over(_ transport: Transport) -> Path {
        var path = self
        path.transport = transport
        return path
    }

    /// The interface, with `/tls` when the path is the stream: what logs and reasons name.
    public var name: String { transport == .stream ? interface + "/tls" : interface }

    /// True when the kernel would prefer this path over `other`: longest prefix, then lowest metric.
    public func ranks(above other: Path) -> Bool {
        if prefixLength != other.prefixLength { return prefixLength > other.prefixLength }
        if metric != other.metric { return metric < other.metric }
        return linkIndex < other.linkIndex
    }

    public var description: String {
        "\(name) \(source)" + (gateway.map { " via \($0)" } ?? "") + " metric \(metric)"
    }
}

/// A pure model of the kernel's links, addresses and routes, fed with decoded changes.
///
/// It answers one question for the tunnel: which uplinks can carry its UDP flow to the
/// server, best first. Nothing here does I/O, so recorded changes replay through it exactly.
public struct NetworkModel: Sendable, Equatable {
    public private(set) var links: [Int32: Link] = [:]
    public private(set) var addresses: [Address.Key: Address] = [:]
    public private(set) var routes: [Route.Key: Route] = [:]
    /// The agent's own tunnel interface: never a path, whatever its routes say.
    public var tunnelInterface: String? {
        didSet { if tunnelInterface != oldValue { countLocalNetworks() } }
    }
    /// The subnets of the uplinks' own usable addresses (link-local ones aside), each no wider
    /// than a LAN is (`localClaim`): what "the LAN" means for a firewall that lets it through. In
    /// address order, then shortest first, each once; kept up to date by `apply`, which works it
    /// out again only when a change can move it (most changes are carrier, route and lifetime
    /// updates that cannot).
    public private(set) var localNetworks: [Prefix] = []
    /// How many usable uplink addresses lie in each of `localNetworks`, in the same order.
    private var localCounts: [Int] = []
    /// Routing tables consulted for the server; the tunnel's own table stays out.
    public var tables: Set<UInt32> = [Route.mainTable]

    public init(tunnelInterface: String? = nil) {
        self.tunnelInterface = tunnelInterface
    }

    /// The link called `name`, if any.
    public func link(named name: String) -> Link? {
        links.values.first { $0.name == name }
    }

    /// Applies one change; returns false when it changed nothing (a duplicate notification).
    @discardableResult
    public mutating func apply(_ change: NetworkChange) -> Bool {
        switch change {
        case .linkChanged(let link):
            let old = links.updateValue(link, forKey: link.index)
            if old == link { return false }
            if old?.kind != link.kind || old?.name != link.name {
                for address in addresses.values where address.linkIndex == link.index {
                    countLocal(address, -1, on: old)
                    countLocal(address, 1, on: link)
                }
            }
            // The kernel flushes a downed link's IPv4 routes without sending RTM_DELROUTE
            // (fib_sync_down_dev on NETDEV_DOWN); IPv6 routes stay.
            if old?.isUp == true && !link.isUp { removeRoutes(family: .v4) { $0 == link.index } }
            return true
        case .linkRemoved(let index):
            guard let gone = links.removeValue(forKey: index) else { return false }
            let left = addresses.values.filter { $0.linkIndex == index }
            for address in left {
                countLocal(address, -1, on: gone)
                addresses.removeValue(forKey: address.key)
            }
            removeRoutes(family: nil) { $0 == index }
            return true
        case .addressAdded(let address):
            let old = addresses.updateValue(address, forKey: address.key)
            if old == address { return false }
            if old?.isUsable != address.isUsable || old?.prefix.network != address.prefix.network {
                if let old { countLocal(old, -1, on: links[old.linkIndex]) }
                countLocal(address, 1, on: links[address.linkIndex])
            }
            return true
        case .addressRemoved(let key):
            guard let removed = addresses.removeValue(forKey: key) else { return false }
            if removed.ip.family == .v4 { flushAfterRemoving(removed) }
            countLocal(removed, -1, on: links[removed.linkIndex])
            return true
        case .routeAdded(let route):
            // The kernel refuses IPv4 routes through a link that is administratively down, so
            // such a message can only be stale (queued before the link went down).
            if route.destination.address.family == .v4,
               route.nextHops.allSatisfy({ links[$0.linkIndex].map { !$0.isUp } ?? false }) { return false }
            return routes.updateValue(route, forKey: route.key) != route
        case .routeRemoved(let key):
            return routes.removeValue(forKey: key) != nil
        }
    }

    /// Mirrors fib_del_ifaddr: routes that named the address as source go with it, and a link
    /// left without any IPv4 address loses its IPv4 routes. Neither is notified by the kernel.
    private mutating func flushAfterRemoving(_ removed: Address) {
        routes = routes.filter { $0.value.preferredSource != removed.ip }
        let stillAddressed = addresses.values.contains { $0.linkIndex == removed.linkIndex && $0.ip.family == .v4 }
        if !stillAddressed { removeRoutes(family: .v4) { $0 == removed.linkIndex } }
    }

    /// Drops the next hops through links matching `isGone`; a route with none left goes.
    private mutating func removeRoutes(family: IPAddress.Family?, through isGone: (Int32) -> Bool) {
        for (key, route) in routes where family == nil || key.destination.address.family == family {
            let kept = route.nextHops.filter { !isGone($0.linkIndex) }
            if kept.isEmpty {
                routes.removeValue(forKey: key)
            } else if kept.count != route.nextHops.count {
                routes[key]?.nextHops = kept
            }
        }
    }

    /// Every uplink that can carry a flow to `endpoint` now, best first, one path per link.
    ///
    /// A link counts when it is up with carrier, is not the tunnel, and has a usable source
    /// address of the endpoint's family; its route is the most specific, then lowest metric,
    /// unicast route through it. The first path is the one the kernel would pick.
    public func paths(to endpoint: IPAddress) -> [Path] {
        var best: [Path] = []
        for route in routes.values where route.type == .unicast && tables.contains(route.table) {
            guard route.destination.contains(endpoint) else { continue }
            for hop in route.nextHops {
                guard let link = links[hop.linkIndex], link.isUsable, link.kind != .tunnel,
                      link.name != tunnelInterface,
                      let source = sourceAddress(on: link.index, family: endpoint.family, route: route, gateway: hop.gateway)
                else { continue }
                let path = Path(linkIndex: link.index, interface: link.name, kind: link.kind, source: source,
                                gateway: hop.gateway, metric: route.metric,
                                prefixLength: route.destination.length, mtu: link.mtu,
                                otherSources: otherSources(on: link.index, besides: source))
                if let i = best.firstIndex(where: { $0.linkIndex == link.index }) {
                    if path.ranks(above: best[i]) { best[i] = path }
                } else {
                    best.append(path)
                }
            }
        }
        best.sort { $0.ranks(above: $1) }
        return best
    }

    /// Counts `address` in (`delta` 1) or out (-1) of the local networks when it is a usable
    /// address of an uplink (`link`, as it is or was); a prefix stays while any address lies in it.
    private mutating func countLocal(_ address: Address, _ delta: Int, on link: Link?) {
        guard address.isUsable, let link, link.kind != .loopback, link.kind != .tunnel,
              link.name != tunnelInterface else { return }
        let prefix = Self.localClaim(address.prefix)
        var i = 0
        while i < localNetworks.count, (localNetworks[i].address, localNetworks[i].length) < (prefix.address, prefix.length) {
            i += 1
        }
        if i < localNetworks.count, localNetworks[i] == prefix {
            localCounts[i] += delta
            if localCounts[i] == 0 {
                localNetworks.remove(at: i)
                localCounts.remove(at: i)
            }
        } else if delta > 0 {
            localNetworks.insert(prefix, at: i)
            localCounts.insert(delta, at: i)
        }
    }

    /// The widest subnet a network may call local: an IPv4 /16, an IPv6 /64 (a link's prefix).
    public static func localBound(_ family: IPAddress.Family) -> Int { family == .v4 ? 16 : 64 }

    /// What a network may call local around an address of ours given as `prefix` (the address
    /// and the mask or prefix length the network gave): its subnet, cut to the `localBound`
    /// around the address when wider. A network decides its mask: one that gives `10.99.0.5/8`
    /// would otherwise claim all of 10/8, where the user's intranet lies behind the tunnel, and
    /// receive what the laptop sends there (TunnelCrack's "LocalNet"); a `/1` would claim half
    /// the internet. What was cut is in `widerClaims`.
    public static func localClaim(_ prefix: Prefix) -> Prefix {
        let bound = localBound(prefix.address.family)
        return prefix.length >= bound ? prefix.network : Prefix(prefix.address, length: bound)!.network
    }

    /// The subnets the uplinks' networks claim that are wider than a LAN (`localClaim` cut them),
    /// as claimed, for a warning; in address order, each once.
    public var widerClaims: [Prefix] {
        var claims: [Prefix] = []
        for address in addresses.values where address.isUsable && address.prefix.length < Self.localBound(address.ip.family) {
            guard let link = links[address.linkIndex], link.kind != .loopback, link.kind != .tunnel, link.name != tunnelInterface
            else { continue }
            if !claims.contains(address.prefix.network) { claims.append(address.prefix.network) }
        }
        return claims.sorted { ($0.address, $0.length) < ($1.address, $1.length) }
    }

    /// Counts the local networks again from every address (the tunnel's name changed).
    private mutating func countLocalNetworks() {
        localNetworks = []
        localCounts = []
        for address in addresses.values { countLocal(address, 1, on: links[address.linkIndex]) }
    }

    /// The machine's own little networks behind bridges, where containers and VMs live
    /// (Docker's docker0 and its networks' br-*, Podman's podman0, libvirt's virbr0): a bridge
    /// that is up, is not the tunnel, has no port but containers' veths and VMs' taps (a TAP that
    /// QEMU opened, with a virtio header), carries no default route, and whose subnets are all
    /// private. Nothing physical, no overlay such as a VXLAN and no VPN's TAP (OpenVPN, tinc, n2n
    /// bring another site's LAN in that way, and its hosts would route through this machine):
    /// nothing on it is a LAN or another site. Their traffic is the machine's own, forwarded; what
    /// they send beyond them goes where the machine's goes. In name order.
    public var guestNetworks: [GuestNetwork] {
        links.values.filter { $0.isBridge && $0.isUp && $0.name != tunnelInterface }.sorted { $0.name < $1.name }.compactMap { bridge in
            let ports = links.values.filter { $0.master == bridge.index }
            guard ports.allSatisfy({ $0.infoKind == "veth" || $0.isVirtualMachinesTap }),
                  !routes.values.contains(where: { $0.destination.length == 0 && $0.nextHops.contains { $0.linkIndex == bridge.index } })
            else { return nil }
            var subnets: [Prefix] = []
            for address in addresses.values where address.linkIndex == bridge.index && !address.ip.isLinkLocal {
                if !subnets.contains(address.prefix.network) { subnets.append(address.prefix.network) }
            }
            guard !subnets.isEmpty, subnets.allSatisfy({ subnet in GuestNetwork.privateRanges.contains { $0.contains(subnet) } }) else { return nil }
            return GuestNetwork(interface: bridge.name, subnets: subnets.sorted { $0.description < $1.description })
        }
    }

    /// Routes on an uplink that are more specific than a default route and take traffic out of
    /// a full tunnel: with the tunnel's default route in place they win (a policy rule lets the
    /// main table decide anything more specific than a default). A hostile network pushes them:
    /// through its gateway (DHCP option 121, router advertisements: `0.0.0.0/1` and
    /// `128.0.0.0/1` via its gateway, "TunnelVision"), or on the link itself (a DHCP mask of
    /// `128.0.0.0` makes the kernel add `0.0.0.0/1` on-link, and the network answers ARP for any
    /// address in it). An on-link route counts when it is wider than a LAN is (`isWiderThanALAN`)
    /// or lies inside one of the tunnel's own routes (it would win over it); a sane LAN's subnet
    /// does not.
    public var routesAroundTheTunnel: [DivertingRoute] { routesAroundTheTunnel(localRanges: []) }

    /// As `routesAroundTheTunnel`, with `localRanges` (what the operator lists for allow-lan)
    /// counted as a LAN's however wide: an on-link route inside one is not reported.
    public func routesAroundTheTunnel(localRanges: [Prefix]) -> [DivertingRoute] {
        var found: [DivertingRoute] = []
        let tunneled = routes.values.filter { route in
            route.destination.length > 0 && route.nextHops.contains { hop in
                links[hop.linkIndex].map { $0.kind == .tunnel || $0.name == tunnelInterface } ?? false
            }
        }.map(\.destination.network)
        for route in routes.values where route.type == .unicast && route.table == Route.mainTable && route.destination.length > 0 {
            let destination = route.destination.network
            for hop in route.nextHops {
                guard let link = links[hop.linkIndex], link.kind != .tunnel,
                      link.kind != .loopback, link.name != tunnelInterface else { continue }
                if hop.gateway == nil, localRanges.contains(where: { $0.contains(destination) }) || !Self.isWiderThanALAN(destination),
                   !tunneled.contains(where: { $0.contains(destination) }) { continue }
                found.append(DivertingRoute(destination: destination, gateway: hop.gateway, interface: link.name))
            }
        }
        return found.sorted { $0.description < $1.description }
    }

    /// Routes through another tunnel (a link of kind tunnel that is not the agent's own:
    /// Tailscale's tailscale0, OpenVPN's tun0, a WireGuard wg0) whose destination meets
    /// `prefixes`, what the agent's tunnel carries: for those addresses the kernel may choose the
    /// other tunnel (a more specific route wins; another VPN's table consulted by a rule before
    /// the agent's wins outright). In any table, since VPNs keep their routes in tables of their
    /// own. In description order.
    public func otherTunnels(meeting prefixes: [Prefix]) -> [DivertingRoute] {
        var found: Set<DivertingRoute> = []
        for route in routes.values where route.type == .unicast {
            let destination = route.destination.network
            guard prefixes.contains(where: { $0.contains(destination) || destination.contains($0) }) else { continue }
            for hop in route.nextHops {
                guard let link = links[hop.linkIndex], link.kind == .tunnel, link.name != tunnelInterface else { continue }
                found.insert(DivertingRoute(destination: destination, gateway: hop.gateway, interface: link.name,
                                            table: route.table == Route.mainTable ? nil : route.table))
            }
        }
        return found.sorted { $0.description < $1.description }
    }

    /// The private and link-local ranges, inside which a wide subnet is still a LAN's.
    private static let privateRanges = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16", "fe80::/10"]
        .compactMap { Prefix($0) }

    /// Whether an on-link subnet is wider than a LAN is: an IPv4 one shorter than /16 outside the
    /// private ranges (10.0.0.0/8 on-link is a LAN's, 0.0.0.0/1 is not), an IPv6 one shorter than
    /// /64 (a link's prefix is a /64) outside link-local.
    public static func isWiderThanALAN(_ prefix: Prefix) -> Bool {
        let bound = prefix.address.family == .v4 ? 16 : 64
        return prefix.length < bound
            && !privateRanges.contains { $0.contains(prefix) }
    }

    /// The address a socket bound to this link should use: the route's preferred source if it
    /// is usable, else a stable one. Temporary IPv6 addresses rotate, and binding to one would
    /// turn every rotation into a roam, so they come after stable ones.
    private func sourceAddress(on linkIndex: Int32, family: IPAddress.Family, route: Route,
                               gateway: IPAddress?) -> IPAddress? {
        var chosen: Address?
        for address in addresses.values where address.linkIndex == linkIndex && address.ip.family == family {
            guard address.isUsable else { continue }
            if address.ip == route.preferredSource { return address.ip }
            if chosen == nil || Self.sourcePreference(address, gateway) < Self.sourcePreference(chosen!, gateway) {
                chosen = address
            }
        }
        return chosen?.ip
    }

    /// The addresses the kernel may send from on the link.
    public func usableAddresses(on linkIndex: Int32) -> [IPAddress] {
        addresses.values.filter { $0.linkIndex == linkIndex && $0.isUsable }.map(\.ip)
    }

    /// In one pass and, on a link with one address of the family (the common case), without
    /// allocating: the core works paths out on every route change.
    private func otherSources(on linkIndex: Int32, besides source: IPAddress) -> [IPAddress] {
        var others: [IPAddress] = []
        for address in addresses.values where address.linkIndex == linkIndex && address.ip.family == source.family
            && address.ip != source && address.isUsable {
            others.append(address.ip)
        }
        if others.count > 1 { others.sort() }
        return others
    }

    private static func sourcePreference(_ a: Address, _ gateway: IPAddress?) -> (Int, Int, Int, IPAddress) {
        let onGatewaySubnet = gateway.map { a.prefix.contains($0) } ?? true
        return (a.flags.contains(.deprecated) ? 1 : 0,
                a.flags.contains(.secondary) ? 1 : 0,  // temporary (v6) or secondary (v4)
                onGatewaySubnet ? 0 : 1,
                a.ip)
    }

    /// A change in an operator's words, with link names where the model knows them.
    public func describe(_ change: NetworkChange) -> String {
        func name(_ index: Int32) -> String { links[index]?.name ?? "if\(index)" }
        switch change {
        case .linkChanged(let l):
            return "link \(l.name) \(l.isUp ? "up" : "down") \(l.hasCarrier ? "carrier" : "no-carrier") kind \(l.kind.rawValue) mtu \(l.mtu)"
        case .linkRemoved(let index): return "link \(name(index)) removed"
        case .addressAdded(let a):
            return "address \(a.prefix) on \(name(a.linkIndex)) added" + (a.flags.isEmpty ? "" : " flags 0x\(String(a.flags.rawValue, radix: 16))")
        case .addressRemoved(let k): return "address \(k.prefix) on \(name(k.linkIndex)) removed"
        case .routeAdded(let r):
            let hops = r.nextHops.map { ($0.gateway.map { "via \($0) " } ?? "") + "dev \(name($0.linkIndex))" }
            return "route \(r.destination) \(hops.joined(separator: ", ")) metric \(r.metric)"
                + (r.table == Route.mainTable ? "" : " table \(r.table)") + (r.type == .unicast ? "" : " \(r.type.rawValue)") + " added"
        case .routeRemoved(let k):
            return "route \(k.destination) metric \(k.metric)" + (k.table == Route.mainTable ? "" : " table \(k.table)") + " removed"
        }
    }

    /// The changes that turn this model into `other`, removals first: after an overrun, the
    /// fresh dump is `other`, and only the net difference is applied and reported.
    public func changes(toMatch other: NetworkModel) -> [NetworkChange] {
        var working = self
        var out: [NetworkChange] = []
        func add(_ change: NetworkChange) {
            if working.apply(change) { out.append(change) }
        }
        // Each stage is computed against the model as the previous stages (and the kernel's
        // silent flushes they imply) left it.
        for key in working.routes.keys where other.routes[key] == nil { add(.routeRemoved(key)) }
        for key in working.addresses.keys where other.addresses[key] == nil { add(.addressRemoved(key)) }
        for index in working.links.keys where other.links[index] == nil { add(.linkRemoved(index: index)) }
        for (index, link) in other.links where working.links[index] != link { add(.linkChanged(link)) }
        for (key, address) in other.addresses where working.addresses[key] != address { add(.addressAdded(address)) }
        for (key, route) in other.routes where working.routes[key] != route { add(.routeAdded(route)) }
        return out
    }

    /// True when the tunnel must hear about the change from `old` to `new` paths: a path came
    /// or went, changed its source, the ranking changed, or a link's other addresses changed
    /// (a session may be bound to one of them while the link prefers another: if it goes, the
    /// session must move). Metric or gateway changes that leave the order intact do not move
    /// the session.
    public static func isSignificant(from old: [Path], to new: [Path]) -> Bool {
        old.count != new.count || zip(old, new).contains { $0.id != $1.id || $0.otherSources != $1.otherSources }
    }
}

/// Follows the paths to one server endpoint as changes arrive, reporting only significant ones.
public struct PathTracker: Sendable {
    public private(set) var model: NetworkModel
    public private(set) var endpoint: IPAddress
    /// The ranked paths as last reported.
    public private(set) var paths: [Path]

    /// Every address the server has (its name's answer), the endpoint first: a dual-stack
    /// server is reached over whichever family the uplinks carry.
    public private(set) var serverAddresses: [IPAddress]

    public init(model: NetworkModel, endpoint: IPAddress) {
        self.model = model
        self.endpoint = endpoint
        self.serverAddresses = [endpoint]
        self.paths = model.paths(to: endpoint)
    }

    /// Learns the server's addresses (a fresh answer for its name); the endpoint stays.
    public mutating func learn(serverAddresses addresses: [IPAddress]) {
        var unique = [endpoint]
        for address in addresses where !unique.contains(address) { unique.append(address) }
        serverAddresses = unique
    }

    /// Another address of the server to use because no uplink reaches the current one (its
    /// IPv6 address on an IPv4-only network, or the other way round): the first of its
    /// addresses an uplink reaches now. nil while the endpoint is reachable or none is.
    public var reachableAlternative: IPAddress? {
        guard paths.isEmpty else { return nil }
        return serverAddresses.first { $0 != endpoint && !model.paths(to: $0).isEmpty }
    }

    /// Of a server's addresses, the one to start with: the first an uplink reaches now, else
    /// the first (a machine with no network yet).
    public static func preferred(_ addresses: [IPAddress], in model: NetworkModel) -> IPAddress? {
        addresses.first { !model.paths(to: $0).isEmpty } ?? addresses.first
    }

    /// Follows the server to `endpoint` (its name resolves elsewhere now); returns the new
    /// ranked paths when they differ significantly, else nil.
    public mutating func retarget(to endpoint: IPAddress) -> [Path]? {
        self.endpoint = endpoint
        learn(serverAddresses: serverAddresses)
        let new = model.paths(to: endpoint)
        defer { paths = new }
        return NetworkModel.isSignificant(from: paths, to: new) ? new : nil
    }

    /// Applies `change`; returns the new ranked paths when they differ significantly, else nil.
    public mutating func apply(_ change: NetworkChange) -> [Path]? {
        guard model.apply(change) else { return nil }
        // A route that does not cover the endpoint cannot be a path to it (a container's
        // subnet, a LAN's own route): nothing to work out again.
        if let destination = change.routeDestination, !destination.contains(endpoint) { return nil }
        let new = model.paths(to: endpoint)
        guard NetworkModel.isSignificant(from: paths, to: new) else {
            paths = new  // keep metrics and gateways current for the next comparison's log lines
            return nil
        }
        paths = new
        return new
    }
}

/// A route that takes traffic around a full tunnel: `0.0.0.0/1 via 192.168.1.1 dev wifi0`.
public struct DivertingRoute: Hashable, Sendable, CustomStringConvertible {
    public var destination: Prefix
    /// Nil for a route on the link itself.
    public var gateway: IPAddress?
    public var interface: String
    /// The table, when not the main one.
    public var table: UInt32? = nil
    public var description: String {
        "\(destination)" + (gateway.map { " via \($0)" } ?? "") + " dev \(interface)" + (table.map { " table \($0)" } ?? "")
    }
}

/// A bridge the machine's containers or VMs sit behind, and its subnets (see
/// `NetworkModel.guestNetworks`).
public struct GuestNetwork: Hashable, Sendable, CustomStringConvertible {
    public var interface: String
    public var subnets: [Prefix]

    public init(interface: String, subnets: [Prefix]) {
        self.interface = interface
        self.subnets = subnets
    }

    public var description: String { "\(interface) \(subnets.map(\.description).joined(separator: ","))" }

    /// Where a guest network's subnets must lie: the private ranges (RFC 1918, unique local).
    static let privateRanges = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7"].compactMap { Prefix($0) }
}

/// Where the machine's power comes from.
public enum PowerSource: String, Sendable, Equatable {
    case ac, battery
}
