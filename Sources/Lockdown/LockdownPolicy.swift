public import Basics

/// What the lockdown firewall lets out of this machine while the tunnel is (or is not yet) up,
/// as one nftables table of Roam's own, `inet roam`. Pure: `ruleset` is the whole table as
/// nftables' language, loaded in one transaction.
///
/// Full mode: only loopback, the tunnel device, the session's own UDP to the server (marked and
/// from the agent's cgroup: `owner`), DHCP and the ICMPv6 messages an uplink needs leave; with
/// `allowLAN`, also the local subnets (printers, casting), but never DNS to them. Everything else
/// is rejected with an administratively-prohibited ICMP, so applications fail at once instead of
/// hanging; nothing comes in from an uplink but what is for the agent's own sockets, DHCP, ICMP
/// errors and neighbour discovery. In both modes nothing for the tunnel's inner addresses comes
/// in but through the tunnel.
///
/// Split mode: the configured prefixes never leave but through the tunnel (before the first
/// handshake and while it is down, they would follow the default route in clear); the rest
/// of the traffic is the uplinks' business, as split mode means.
public struct LockdownPolicy: Hashable, Sendable {
    public enum Scope: Hashable, Sendable {
        /// Everything goes through the tunnel; the session's own packets carry `mark`.
        case full(mark: UInt32)
        /// Only these prefixes go through the tunnel, and only through it.
        case split([Prefix])
    }

    /// Where the session's UDP goes.
    public struct Server: Hashable, Sendable {
        public var address: IPAddress
        public var port: UInt16
        public init(_ address: IPAddress, port: UInt16) {
            self.address = address
            self.port = port
        }
    }

    public var scope: Scope
    /// The TUN device's name (it need not exist yet).
    public var tunnelInterface: String
    /// Where the session's UDP may go: every server the agent may use (the current one, one a
    /// session is being prepared with, the others it may fail over to); empty while no
    /// server's address is known yet.
    public var servers: [Server]
    /// Let the local subnets through (full mode): the private part of `localNetworks` is allowed
    /// (`lan(from:also:)`), name resolution to them is not.
    public var allowLAN: Bool
    /// Ranges that count as local besides the private ones, with `allowLAN`: the operator's
    /// list (each inside one of `listableRanges`, e.g. a carrier-grade NAT's 100.64.0.0/10),
    /// opened as the private ones are, only where an uplink's subnet meets them.
    public var lanRanges: [Prefix] = []
    /// The subnets of the uplinks' addresses now; used only with `allowLAN`.
    public var localNetworks: [Prefix]
    /// Subnets that never count as local (`never-local`): `allowLAN` opens no part of them.
    public var neverLocal: [Prefix] = []
    /// The session's marked sockets may open TCP to these ports: the connectivity check's
    /// plain HTTP request.
    public var checkPorts: [UInt16] = []
    /// The servers' TLS port for the stream transport (networks that drop UDP): the session's
    /// marked sockets may open TCP to each server's address on it; nil: UDP only.
    public var streamPort: UInt16?
    /// The HTTP proxy the stream transport goes through, when configured: the session's marked
    /// sockets may open TCP to it (and to nothing else through it but what the proxy relays),
    /// and no more to the servers' stream port directly.
    public var proxy: Proxy?

    /// The HTTP proxy's port and its addresses: the one the configuration gives, or those its
    /// name gave on the networks the machine is on (none until a look-up answered).
    public struct Proxy: Hashable, Sendable {
        public var addresses: [IPAddress]
        public var port: UInt16
        public init(addresses: [IPAddress], port: UInt16) {
            self.addresses = addresses
            self.port = port
        }
    }
    /// Whose marked sockets the session's exceptions are for (full mode): nil before an agent
    /// runs (`agent lockdown on` at early boot), when nothing but DHCP and neighbour discovery
    /// leaves and the agent loads its own table once it starts.
    public var owner: Owner?
    /// The tunnel device's inner addresses: nothing addressed to them comes in but through the
    /// tunnel, so a host on the LAN cannot probe the tunnel's connections (CVE-2019-14899).
    public var innerAddresses: [IPAddress] = []
    /// The bridges the machine's containers and VMs sit behind (full mode; see
    /// `NetworkModel.guestNetworks`): the machine and its guests talk freely on them (DHCP, DNS
    /// to a forwarder on the bridge, published ports), guests talk among themselves, and what
    /// they send beyond goes where the machine's own goes: into the tunnel, or to the LAN on
    /// allow-lan's terms, never out of an uplink in clear.
    public var guests: [String] = []
    /// Addresses reached only through the tunnel (its resolvers): allow-lan never lets them out
    /// on an uplink, even where a network's subnet holds them.
    public var tunnelOnly: [IPAddress] = []

    /// The agent, as the lockdown tells its sockets from everyone else's. A mark alone does not:
    /// since Linux 5.17 CAP_NET_RAW is enough to set one, and container runtimes grant it.
    public enum Owner: Hashable, Sendable {
        /// Sockets made by processes in this cgroup (or below it): the agent's leaf cgroup of its
        /// own, as nftables names it (a path under /sys/fs/cgroup) and its depth.
        case cgroup(String, level: Int)
        /// Any socket that carries the mark: the agent could make no cgroup of its own.
        case anyMarked

        /// How narrow the match is, for status and metrics: `own-cgroup` (the agent's leaf, the
        /// agent alone), `started-cgroup` (the cgroup it was started in, with whatever else runs
        /// there) or `any-mark` (every socket that carries the mark).
        public var kind: String {
            switch self {
            case .cgroup(let path, _): path.split(separator: "/").last?.hasPrefix("roam-agent.") == true ? "own-cgroup" : "started-cgroup"
            case .anyMarked: "any-mark"
            }
        }
    }
    /// A portal window, while one is open (full mode only).
    public var portalWindow: PortalWindow?
    /// An on-demand rule trusts the network on this interface: the machine may talk to it
    /// directly, both ways; every other interface stays locked.
    public var trustedInterface: String?

    /// For a while, one process tree (a cgroup of its own) may reach the network directly
    /// through one uplink to log in to a captive portal: its packets carry the session's mark
    /// (so they take the uplink's routes, not the tunnel's), its name look-ups go to the
    /// network's own resolvers, and it may speak HTTP and HTTPS; anything else it sends is
    /// refused, and nobody else gains anything.
    public struct PortalWindow: Hashable, Sendable {
        /// The cgroup as nftables names it: a path under /sys/fs/cgroup.
        public var cgroup: String
        /// Its depth in the cgroup hierarchy.
        public var level: Int
        /// The uplink it may use.
        public var interface: String
        /// The network's own resolvers, where its name look-ups go.
        public var resolvers: [IPAddress]
        /// The login page's port when it is neither HTTP's nor HTTPS's: to its address only,
        /// when known.
        public var login: LoginPage?

        public struct LoginPage: Hashable, Sendable {
            public var address: IPAddress?
            public var port: UInt16
            public init(address: IPAddress?, port: UInt16) {
                self.address = address
                self.port = port
            }
        }

        public init(cgroup: String, level: Int, interface: String, resolvers: [IPAddress], login: LoginPage? = nil) {
            self.cgroup = cgroup
            self.level = level
            self.interface = interface
            self.resolvers = resolvers
            self.login = login
        }
    }

    /// The conntrack mark of the window's connections, so their answers come in.
    static let portalConnectionMark: UInt32 = 0x726f616d

    /// Applications kept outside the tunnel on purpose (`agent exclude`, with `exclusion:
    /// allow`): one cgroup whose sockets' packets take the session's mark (so the uplinks'
    /// routes, not the tunnel's), whose name look-ups go to the network's own resolvers whatever
    /// resolver the system names, and which may send anything else; nobody else gains anything.
    /// A deliberate hole, for that cgroup alone.
    public struct Exclusion: Hashable, Sendable {
        /// The cgroup as nftables names it (a path under /sys/fs/cgroup), and its depth.
        public var cgroup: String
        public var level: Int
        /// The network's own resolvers (none known: its look-ups are refused).
        public var resolvers: [IPAddress]

        public init(cgroup: String, level: Int, resolvers: [IPAddress]) {
            self.cgroup = cgroup
            self.level = level
            self.resolvers = resolvers
        }

        var match: String { "socket cgroupv2 level \(level) " + LockdownPolicy.quoted(cgroup) }
    }
    /// The excluded applications' cgroup, once one was asked for (full mode only).
    public var exclusion: Exclusion?
    /// The conntrack mark of the excluded applications' connections, so their answers come in.
    static let exclusionConnectionMark: UInt32 = 0x726f6178

    public init(scope: Scope, tunnelInterface: String, server: Server? = nil, servers: [Server] = [],
                allowLAN: Bool = false, localNetworks: [Prefix] = [], owner: Owner? = nil) {
        self.scope = scope
        self.owner = owner
        self.tunnelInterface = tunnelInterface
        self.servers = (server.map { [$0] } ?? []) + servers
        self.allowLAN = allowLAN
        self.localNetworks = localNetworks
    }

    /// The table's name in the `inet` family.
    public static let table = "roam"

    /// The guard's name: the same rules in a table only the agent's process may change (see
    /// `Lockdown`).
    public static let guardTable = "roam_guard"
    /// The boot lockdown's guard, held until an agent holds its own (`agent lockdown on --hold`).
    public static let bootGuardTable = "roam_boot"

    /// The table, complete, in nftables' language; its counters start from `counts` (what the
    /// table it replaces had counted, so a roam or a new agent does not reset them). `owned`:
    /// a table only the process that loads it may change or delete, gone when it ends.
    public func ruleset(counts: [BlockCause: BlockCount] = [:], table: String = Self.table, owned: Bool = false) -> String {
        var lines = ["table inet \(table) {"]
        if owned { lines.append("    flags owner") }
        for cause in BlockCause.allCases {
            let count = counts[cause] ?? BlockCount()
            lines.append("    counter \(cause.counter) { packets \(count.packets) bytes \(count.bytes) }")
        }
        lines += inner
        switch scope {
        case .full(let mark): lines += full(mark: mark)
        case .split(let prefixes): lines += split(prefixes)
        }
        lines.append("}")
        if owned { lines = lines.map(Self.afterTheTable) }
        return lines.joined(separator: "\n") + "\n"
    }

    /// A base chain's declaration hooked one step later (`priority filter` becomes `priority
    /// filter + 1`, `priority -100` becomes `priority -99`): the guard's chains see what the
    /// table's let through, so the table counts what the lockdown stops while it is there.
    static func afterTheTable(_ line: String) -> String {
        let parts = line.split(separator: " priority ", maxSplits: 1, omittingEmptySubsequences: false)
        guard line.contains(" hook "), parts.count == 2, let end = parts[1].firstIndex(of: ";") else { return line }
        let priority = parts[1][..<end]
        let later = Int(priority).map { "\($0 + 1)" } ?? "\(priority) + 1"
        return parts[0] + " priority " + later + parts[1][end...]
    }

    private var tunnel: String { Self.quoted(tunnelInterface) }

    /// Packets for the tunnel's inner addresses that arrive on any other interface are dropped
    /// before conntrack and routing see them: with loose reverse-path filtering the kernel would
    /// answer them (a reset to a forged SYN/ACK), which tells a host on the LAN which connections
    /// the tunnel carries and lets it inject into them (CVE-2019-14899). Both modes.
    private var inner: [String] {
        var lines = ["    chain inner {", "        type filter hook prerouting priority raw; policy accept;"]
        for (family, name) in [(IPAddress.Family.v4, "ip"), (.v6, "ip6")] {
            let addresses = innerAddresses.filter { $0.family == family }.map(\.description)
            guard !addresses.isEmpty else { continue }
            // Loopback is the machine itself: its own traffic to the tunnel's address arrives there.
            lines.append("        iifname != { \"lo\", \(tunnel) } \(name) daddr { \(addresses.joined(separator: ", ")) } counter name \(BlockCause.inner.counter) drop")
        }
        return lines + ["    }"]
    }

    /// What the session's exceptions match: the mark and the agent's cgroup; nil when no agent
    /// is known, and no socket gets them.
    private func own(_ mark: UInt32) -> String? {
        switch owner {
        case .cgroup(let path, let level): "meta mark \(hex(mark)) socket cgroupv2 level \(level) \(Self.quoted(path))"
        case .anyMarked: "meta mark \(hex(mark))"
        case nil: nil
        }
    }

    /// The same for a packet coming in, by the socket it is for.
    private func ownSocket(_ mark: UInt32) -> String? {
        switch owner {
        case .cgroup(let path, let level): "socket mark \(hex(mark)) socket cgroupv2 level \(level) \(Self.quoted(path))"
        case .anyMarked: "socket mark \(hex(mark))"
        case nil: nil
        }
    }

    private func full(mark: UInt32) -> [String] {
        let lan = allowLAN ? Prefix.excluding(neverLocal, from: Self.lan(from: localNetworks, also: lanRanges).open + Self.linkScope) : []
        var lines = Self.set("lan4", lan.filter { $0.address.family == .v4 }) + Self.set("lan6", lan.filter { $0.address.family == .v6 })
        let reject = "goto refuse"
        if let window = portalWindow { lines += outsideChains("portal", match: window.match, resolvers: window.resolvers, mark: mark) }
        if let exclusion { lines += outsideChains("exclusion", match: exclusion.match, resolvers: exclusion.resolvers, mark: mark) }
        lines += Self.refuse + [
            "    chain output {",
            "        type filter hook output priority filter; policy accept;",
            "        oifname \"lo\" accept",
        ]
        if let guests = guestSet { lines.append("        oifname \(guests) accept") }
        if let trusted = trustedInterface { lines.append("        oifname \(Self.quoted(trusted)) accept") }
        if let window = portalWindow {
            // The window's process tree: DNS to the network's resolvers, HTTP and HTTPS, on its
            // uplink; nothing else (the tunnel included: its packets are marked for the uplink).
            let match = window.match
            let connection = "ct mark set \(hex(Self.portalConnectionMark)) accept"
            for (family, name) in [(IPAddress.Family.v4, "ip"), (.v6, "ip6")] {
                let resolvers = window.resolvers.filter { $0.family == family }.map(\.description)
                guard !resolvers.isEmpty else { continue }
                lines.append("        \(match) oifname \(Self.quoted(window.interface)) \(name) daddr { \(resolvers.joined(separator: ", ")) } meta l4proto { tcp, udp } th dport 53 \(connection)")
            }
            lines.append("        \(match) oifname \(Self.quoted(window.interface)) tcp dport { 80, 443 } \(connection)")
            if let login = window.login {
                let to = login.address.map { "\($0.family == .v4 ? "ip" : "ip6") daddr \($0) " } ?? ""
                lines.append("        \(match) oifname \(Self.quoted(window.interface)) \(to)tcp dport \(login.port) \(connection)")
            }
            lines.append("        \(match) counter name \(BlockCause.outbound.counter) \(reject)")
        }
        if let exclusion {
            // The excluded applications: to the network directly, their look-ups only to its
            // resolvers (where the nat chain sent them), their connections marked for the answers.
            let match = exclusion.match
            for (family, name, proto) in [(IPAddress.Family.v4, "ip", "ipv4"), (.v6, "ip6", "ipv6")] {
                let addresses = exclusion.resolvers.filter { $0.family == family }.map(\.description)
                let elsewhere = addresses.isEmpty ? "" : "\(name) daddr != { \(addresses.joined(separator: ", ")) } "
                lines.append("        \(match) meta nfproto \(proto) \(elsewhere)meta l4proto { tcp, udp } th dport { 53, 853 } "
                    + "counter name \(BlockCause.dns.counter) \(reject)")
            }
            lines.append("        \(match) oifname != \(tunnel) ct mark set \(hex(Self.exclusionConnectionMark)) accept")
        }
        lines.append("        oifname \(tunnel) accept")
        if let own = own(mark) {
            for server in servers {
                let family = server.address.family == .v4 ? "ip" : "ip6"
                lines.append("        \(own) \(family) daddr \(server.address) udp dport \(server.port) accept")
                // The stream to the same server, for networks that drop UDP.
                if let streamPort, proxy == nil {
                    lines.append("        \(own) \(family) daddr \(server.address) tcp dport \(streamPort) accept")
                }
            }
            if let proxy, streamPort != nil {
                for address in proxy.addresses {
                    let family = address.family == .v4 ? "ip" : "ip6"
                    lines.append("        \(own) \(family) daddr \(address) tcp dport \(proxy.port) accept")
                }
            }
            // The agent's own look-ups of the server's name, on marked sockets like the session's.
            lines.append("        \(own) meta l4proto { tcp, udp } th dport 53 accept")
            if !checkPorts.isEmpty {
                // The connectivity check's plain HTTP, from the agent's marked socket.
                lines.append("        \(own) tcp dport { \(checkPorts.map(String.init).joined(separator: ", ")) } accept")
            }
        }
        lines += Self.uplinkOut + [
            // Names are asked only through the tunnel: DNS, DNS over TLS, mDNS and LLMNR never
            // go to the LAN (their answers could be forged there, their questions overheard).
            "        meta l4proto { tcp, udp } th dport { 53, 853, 5353, 5355 } counter name \(BlockCause.dns.counter) \(reject)",
        ]
        if allowLAN {
            // What the tunnel carries wins over the LAN: a hotel subnet that holds the tunnel's
            // resolver does not get its traffic.
            lines += tunnelOnlyRules("daddr", counter: BlockCause.outbound.counter, verdict: reject)
            lines += ["        ip daddr @lan4 accept", "        ip6 daddr @lan6 accept"]
        }
        lines += [
            "        meta nfproto ipv6 counter name \(BlockCause.ipv6.counter) \(reject)",
            "        counter name \(BlockCause.outbound.counter) \(reject)",
            "    }",
            "    chain input {",
            "        type filter hook input priority filter; policy accept;",
            "        iifname \"lo\" accept",
            "        iifname \(tunnel) accept",
        ]
        if let guests = guestSet {
            // A guest that sends from the tunnel's resolvers' addresses (CAP_NET_RAW is a
            // container's by default) is not them.
            lines += tunnelOnlyRules("saddr", counter: BlockCause.inbound.counter, verdict: "drop", matching: "iifname \(guests) ")
            lines.append("        iifname \(guests) accept")
        }
        if let trusted = trustedInterface { lines.append("        iifname \(Self.quoted(trusted)) accept") }
        if exclusion != nil {
            // Answers to the excluded applications' own connections, and the ICMP errors about them.
            let marked = "iifname != \(tunnel) ct mark \(hex(Self.exclusionConnectionMark))"
            lines += ["        \(marked) ct state established accept",
                      "        \(marked) ct state related meta l4proto { icmp, ipv6-icmp } accept"]
        }
        if let own = ownSocket(mark) {
            // Only what is for the agent's own sockets, which carry the mark: the server's
            // answers (to the session's port, wherever it is bound now, not to any UDP listener
            // here), answers to its look-ups of the server's name, and a multi-homed server that
            // answers from another of its addresses than the one the session sends to.
            lines.append("        \(own) accept")
        }
        if let window = portalWindow {
            // Answers to the window's own connections, on its uplink, and the ICMP errors about them.
            let uplink = "iifname \(Self.quoted(window.interface)) ct mark \(hex(Self.portalConnectionMark))"
            lines += ["        \(uplink) ct state established accept",
                      "        \(uplink) ct state related meta l4proto { icmp, ipv6-icmp } accept"]
        }
        lines += Self.uplinkIn
        if allowLAN {
            // A LAN host that sends from the tunnel's resolver's address is not it.
            lines += tunnelOnlyRules("saddr", counter: BlockCause.inbound.counter, verdict: "drop")
            lines += ["        ip saddr @lan4 accept", "        ip6 saddr @lan6 accept"]
        }
        lines += [
            "        counter name \(BlockCause.inbound.counter) drop",
            "    }",
            // Containers and VMs behind this machine: into the tunnel, and back, from and to
            // their bridges alone. A host on an uplink's LAN that routes through this machine
            // (forwarding on, a container runtime's masquerade covering its address) reaches
            // nothing through the tunnel.
            "    chain forward {",
            "        type filter hook forward priority filter; policy accept;",
        ] + tunnelForwarding
        // Guests among themselves, on a bridge (with br_netfilter) or between bridges.
        if let guests = guestSet { lines.append("        iifname \(guests) oifname \(guests) accept") }
        if allowLAN {
            // The same LAN as the machine's own, on the same terms: no name look-ups on it (nor
            // answers from it: a LAN host could forge them), and nothing to or from the tunnel's
            // own addresses (what came from the tunnel was let through above).
            lines.append("        meta l4proto { tcp, udp } th dport { 53, 853, 5353, 5355 } counter name \(BlockCause.dns.counter) drop")
            lines.append("        meta l4proto { tcp, udp } th sport { 53, 853, 5353, 5355 } counter name \(BlockCause.dns.counter) drop")
            lines += tunnelOnlyRules("daddr", counter: BlockCause.forward.counter, verdict: "drop")
            lines += tunnelOnlyRules("saddr", counter: BlockCause.forward.counter, verdict: "drop")
            if let guests = guestSet {
                // To the guests from the LAN only the answers to their own connections (a
                // container's to a printer), and the ICMP errors about them; the LAN's own
                // connections to them stay out, though their bridges' subnets count as local.
                lines += ["        oifname \(guests) ip saddr @lan4 ct direction reply ct state established accept",
                          "        oifname \(guests) ip6 saddr @lan6 ct direction reply ct state established accept",
                          "        oifname \(guests) ip saddr @lan4 ct state related meta l4proto icmp accept",
                          "        oifname \(guests) ip6 saddr @lan6 ct state related meta l4proto ipv6-icmp accept",
                          "        oifname \(guests) counter name \(BlockCause.forward.counter) drop"]
            }
            // What a guest (or another forwarder) sends to the LAN.
            lines += ["        ip daddr @lan4 accept", "        ip6 daddr @lan6 accept"]
        }
        lines += [
            "        counter name \(BlockCause.forward.counter) drop",
            "    }",
        ]
        return lines + clamp
    }

    /// The forward chain's first rules, in either mode: into the tunnel and back only from and
    /// to the guests' bridges; whatever else would be forwarded into or out of it is stopped.
    private var tunnelForwarding: [String] {
        (guestSet.map { ["        iifname \($0) oifname \(tunnel) accept", "        iifname \(tunnel) oifname \($0) accept"] } ?? [])
            + ["        oifname \(tunnel) counter name \(BlockCause.forward.counter) drop",
               "        iifname \(tunnel) counter name \(BlockCause.forward.counter) drop"]
    }

    /// The guests' bridges as an nftables set of names; nil when there are none.
    private var guestSet: String? {
        guests.isEmpty ? nil : "{ " + guests.map(Self.quoted).joined(separator: ", ") + " }"
    }

    /// Rules that stop what matches `tunnelOnly` by `field` (`daddr` or `saddr`), one per family.
    private func tunnelOnlyRules(_ field: String, counter: String, verdict: String, matching: String = "") -> [String] {
        [(IPAddress.Family.v4, "ip"), (.v6, "ip6")].compactMap { family, name in
            let inside = tunnelOnly.filter { $0.family == family }.map(\.description)
            guard !inside.isEmpty else { return nil }
            return "        \(matching)\(name) \(field) { \(inside.joined(separator: ", ")) } counter name \(counter) \(verdict)"
        }
    }

    /// TCP connections that containers and VMs open through the tunnel announce a segment size
    /// that fits the tunnel's MTU as it is now (it follows the path: `rt mtu` is the route's,
    /// which is the device's), so the far end never sends them more than the path carries. The
    /// machine's own connections need no clamp: the kernel derives theirs from the device.
    private var clamp: [String] {
        [
            "    chain clamp {",
            "        type filter hook forward priority mangle; policy accept;",
            "        oifname \(tunnel) tcp flags & (syn | rst) == syn tcp option maxseg size set rt mtu",
            "    }",
        ]
    }

    /// A process tree's way out past the tunnel (a portal window's, the excluded applications'),
    /// as chains called `name`_route and `name`_nat: its packets take the session's mark (a route
    /// chain, so the kernel routes them again, through the uplink), and its name look-ups,
    /// whichever resolver the system names, go to the network's own `resolvers`.
    private func outsideChains(_ name: String, match: String, resolvers: [IPAddress], mark: UInt32) -> [String] {
        var lines = [
            "    chain \(name)_route {",
            "        type route hook output priority mangle; policy accept;",
            "        \(match) meta mark set \(hex(mark))",
            "    }",
            "    chain \(name)_nat {",
            "        type nat hook output priority -100; policy accept;",
        ]
        for family in [IPAddress.Family.v4, .v6] {
            guard let resolver = resolvers.first(where: { $0.family == family }) else { continue }
            let (protocolName, loopback) = family == .v4 ? ("ip", "127.0.0.0/8") : ("ip6", "::1")
            lines.append("        \(match) meta nfproto \(family == .v4 ? "ipv4" : "ipv6") \(protocolName) daddr != \(loopback) "
                + "meta l4proto { tcp, udp } th dport 53 dnat \(protocolName) to \(resolver)")
        }
        lines.append("    }")
        return lines
    }

    private func split(_ prefixes: [Prefix]) -> [String] {
        let networks = prefixes.map(\.network)
        let v4 = networks.filter { $0.address.family == .v4 }
        let v6 = networks.filter { $0.address.family == .v6 }
        var lines = Self.set("tunneled4", v4) + Self.set("tunneled6", v6) + Self.refuse
        lines += [
            "    chain output {",
            "        type filter hook output priority filter; policy accept;",
            // The machine's own addresses (the tunnel's among them) are reached over loopback.
            "        oifname \"lo\" accept",
            "        oifname \(tunnel) accept",
        ] + (trustedInterface.map { ["        oifname \(Self.quoted($0)) accept"] } ?? []) + [
            "        ip daddr @tunneled4 counter name \(BlockCause.outbound.counter) goto refuse",
            "        ip6 daddr @tunneled6 counter name \(BlockCause.outbound.counter) goto refuse",
            "    }",
            "    chain forward {",
            "        type filter hook forward priority filter; policy accept;",
        ] + tunnelForwarding + [
            "        ip daddr @tunneled4 counter name \(BlockCause.forward.counter) drop",
            "        ip6 daddr @tunneled6 counter name \(BlockCause.forward.counter) drop",
            "    }",
        ] + clamp
        return lines
    }

    /// What an uplink needs to leave, and only in the form its protocol sends it (loopback and
    /// the tunnel were let through before): DHCPv4 broadcast, or unicast to a private or
    /// link-local address (a renewal to the server; one at a public address is renewed by
    /// broadcast, at the rebinding time); DHCPv6 to its multicast group or a link-local server;
    /// router and neighbour solicitations and advertisements with the hop limit 255 that
    /// receivers require, and multicast listener reports, to link-local or link-scope multicast
    /// addresses. None of them reaches a public address.
    private static let uplinkOut = [
        "        meta nfproto ipv4 udp sport 68 udp dport 67 ip daddr { 255.255.255.255, "
            + privateRanges.filter { $0.address.family == .v4 }.map(\.description).joined(separator: ", ") + " } accept",
        "        meta nfproto ipv6 udp sport 546 udp dport 547 ip6 daddr { ff02::1:2, fe80::/10 } accept",
        "        icmpv6 type { nd-router-solicit, nd-neighbor-solicit, nd-neighbor-advert } ip6 hoplimit 255 ip6 daddr { fe80::/10, ff02::/16 } accept",
        "        icmpv6 type { mld-listener-report, mld2-listener-report } ip6 daddr ff02::/16 accept",
    ]

    /// What an uplink may send in of its own: DHCPv4's answers (to the client's port, over IPv4
    /// only), DHCPv6's from a link-local server or relay, router advertisements and multicast
    /// listener queries from link-local routers, neighbour discovery with hop limit 255 (which a
    /// router cannot have forwarded), and the ICMP errors the session's path needs: only those
    /// conntrack relates to a flow that left here (a LAN host cannot reset sockets with made-up ones).
    private static let uplinkIn = [
        "        meta nfproto ipv4 udp sport 67 udp dport 68 accept",
        "        meta nfproto ipv6 udp sport 547 udp dport 546 ip6 saddr fe80::/10 accept",
        "        icmpv6 type { nd-router-advert, mld-listener-query } ip6 saddr fe80::/10 accept",
        "        icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert } ip6 hoplimit 255 accept",
        "        icmpv6 type { packet-too-big, destination-unreachable, time-exceeded, parameter-problem } ct state related accept",
        "        icmp type { destination-unreachable, time-exceeded } ct state related accept",
    ]

    /// How a packet of this machine's own is refused: TCP with a reset, which the kernel
    /// delivers to a socket that is busy connecting (an ICMP error to it is dropped then, and
    /// connect would wait for the SYN's retransmission), anything else with an
    /// administratively-prohibited ICMP. Either way the application fails at once.
    private static let refuse = [
        "    chain refuse {",
        "        meta l4proto tcp reject with tcp reset",
        "        reject with icmpx admin-prohibited",
        "    }",
    ]

    /// Link-local and multicast: what printers and casting use beside the subnets themselves.
    /// What local discovery needs beyond the subnets: link-local addresses, the link-local
    /// multicast groups (224.0.0.0/24, ff02::/16), SSDP's group (casting, printers) and the
    /// broadcast address; never the routed multicast ranges.
    private static let linkScope = ["169.254.0.0/16", "224.0.0.0/24", "239.255.255.250/32", "255.255.255.255/32",
                                    "fe80::/10", "ff02::/16"].compactMap { Prefix($0) }

    /// The private and link-local ranges (RFC 1918, RFC 3927, RFC 4193, RFC 4291): all that
    /// allow-lan opens of what a network calls local, unless the operator lists more (`lanRanges`).
    static let privateRanges = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16", "fc00::/7", "fe80::/10"]
        .compactMap { Prefix($0) }

    /// What an operator may list as local (`lanRanges`): the private and link-local ranges, and
    /// the shared address space of carrier-grade NAT (RFC 6598), which is local only on the
    /// networks that use it, so opened only when listed. Everything else (documentation ranges
    /// included) is public.
    public static let listableRanges = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16",
                                        "fc00::/7", "fe80::/10"].compactMap { Prefix($0) }

    /// Whether `prefix` lies inside one of `listableRanges`.
    public static func mayCountAsLocal(_ prefix: Prefix) -> Bool {
        listableRanges.contains { $0.contains(prefix) }
    }

    /// What allow-lan opens of the uplinks' subnets (`open`), and the subnets a network called
    /// local that are not all private or `listed` (`refused`, for a warning). A network decides
    /// its subnet mask: a DHCP server that hands out `10.0.0.5` with mask `128.0.0.0` calls
    /// `0.0.0.0/1` local, and a rogue access point can put a public address in its "local"
    /// subnet. So only what lies in a private or link-local range, or in one the operator
    /// `listed`, is opened: a subnet inside one as it is, and of a subnet larger than the range
    /// its addresses fall in, only the ranges inside it, never a prefix shorter than they are.
    public static func lan(from subnets: [Prefix], also listed: [Prefix] = []) -> (open: [Prefix], refused: [Prefix]) {
        let ranges = privateRanges + listed.map(\.network)
        var open: [Prefix] = []
        var refused: [Prefix] = []
        for subnet in subnets.map(\.network) {
            if ranges.contains(where: { $0.contains(subnet) }) {
                open.append(subnet)
                continue
            }
            refused.append(subnet)
            open += ranges.filter { $0.length > subnet.length && subnet.contains($0.address) }
        }
        var unique: [Prefix] = []
        for prefix in open where !unique.contains(prefix) { unique.append(prefix) }
        return (unique, refused)
    }

    private static func set(_ name: String, _ prefixes: [Prefix]) -> [String] {
        let type = name.hasSuffix("6") ? "ipv6_addr" : "ipv4_addr"
        // Overlapping prefixes (two addresses in one subnet) would make the load fail.
        let elements = Array(Set(prefixes)).sorted { $0.description < $1.description }
            .filter { p in !prefixes.contains { $0 != p && $0.length < p.length && $0.contains(p.address) } }
        var lines = ["    set \(name) {", "        type \(type); flags interval;"]
        if !elements.isEmpty {
            lines.append("        elements = { " + elements.map { "\($0.address)/\($0.length)" }.joined(separator: ", ") + " }")
        }
        lines.append("    }")
        return lines
    }

    /// Whether `name` can be written as an nftables string as it is: nftables reads a quoted
    /// string up to the next quote, with no escapes, so a backslash (systemd's `\x2d` in an
    /// escaped unit's cgroup) stands for itself; a quote or a control character cannot be written.
    public static func canQuote(_ name: String) -> Bool {
        name.unicodeScalars.allSatisfy { $0.value >= 0x20 && $0.value != 0x7f && $0 != "\"" }
    }

    /// A name (an interface's, checked at configuration; a cgroup's path, checked with
    /// `canQuote` where it is found) as an nftables string.
    fileprivate static func quoted(_ name: String) -> String {
        // Should a name that cannot be written come here anyway, the quote and control
        // characters go: the string can neither end early nor break the line (nor match).
        "\"" + String(String.UnicodeScalarView(name.unicodeScalars.filter { $0.value >= 0x20 && $0.value != 0x7f && $0 != "\"" })) + "\""
    }

    private func hex(_ value: UInt32) -> String { "0x" + String(value, radix: 16) }
}

/// What one of the table's counters holds.
public struct BlockCount: Hashable, Sendable {
    public var packets: UInt64 = 0
    public var bytes: UInt64 = 0
    public init(packets: UInt64 = 0, bytes: UInt64 = 0) {
        self.packets = packets
        self.bytes = bytes
    }
}

/// Why the lockdown stopped a packet: one counter each in the table.
public enum BlockCause: String, CaseIterable, Sendable {
    /// A name look-up to a resolver outside the tunnel.
    case dns
    /// IPv6 that would have left outside the tunnel.
    case ipv6
    /// Anything else this machine tried to send outside the tunnel.
    case outbound = "out"
    /// Something an uplink sent in that no one here asked for.
    case inbound = "in"
    /// Traffic forwarded for containers or VMs that would have left outside the tunnel.
    case forward
    /// Something addressed to the tunnel's inner address that came in on an uplink: a host on
    /// the LAN probing the tunnel's connections.
    case inner

    /// The named counter in the table.
    public var counter: String { "blocked_\(rawValue)" }
}

extension LockdownPolicy.PortalWindow {
    /// Packets of sockets in the window's cgroup (or below it).
    fileprivate var match: String {
        "socket cgroupv2 level \(level) " + LockdownPolicy.quoted(cgroup)
    }
}
