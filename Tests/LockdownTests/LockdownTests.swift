import Topology
import Foundation
import Glibc
@testable import Lockdown
import NamespaceLab
import Basics
import Synchronization
import Testing
import Tunnel
import Device
import Netlink

/// The ruleset as text: no root, no kernel.
struct LockdownPolicyTests {
    let server = LockdownPolicy.Server(IPAddress("198.51.100.7")!, port: 51820)

    @Test func fullModeLetsOutOnlyTheTunnelTheSessionAndWhatAnUplinkNeeds() {
        let text = LockdownPolicy(scope: .full(mark: 0xca6c), tunnelInterface: "roam0", server: server, owner: .anyMarked).ruleset()
        #expect(text.hasPrefix("table inet roam {"))
        #expect(text.contains("oifname \"roam0\" accept"))
        #expect(text.contains("meta mark 0xca6c ip daddr 198.51.100.7 udp dport 51820 accept"))
        #expect(text.contains("meta nfproto ipv4 udp sport 68 udp dport 67 ip daddr { 255.255.255.255, 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, 169.254.0.0/16 } accept"), "DHCP")
        #expect(text.contains("counter name blocked_out goto refuse") && text.contains("reject with icmpx admin-prohibited"))
        #expect(!text.contains("@lan4 accept"), "the LAN is closed unless allowed")
        // DNS is refused before the LAN is let through.
        let lan = LockdownPolicy(scope: .full(mark: 1), tunnelInterface: "roam0", server: server, allowLAN: true,
                                 localNetworks: [Prefix("192.168.1.23/24")!, Prefix("192.168.1.99/24")!, Prefix("fd00:20::57/64")!]).ruleset()
        #expect(lan.contains("elements = { 169.254.0.0/16, 192.168.1.0/24, 224.0.0.0/24, 239.255.255.250/32, 255.255.255.255/32 }"), "\(lan)")
        #expect(lan.contains("elements = { fd00:20::/64, fe80::/10, ff02::/16 }"), "local discovery's multicast, not the routed groups")
        #expect(lan.contains("th dport { 53, 853, 5353, 5355 } counter name blocked_dns"), "no name resolution on the LAN")
        let dns = try! #require(lan.range(of: "counter name blocked_dns"))
        let open = try! #require(lan.range(of: "ip daddr @lan4 accept"))
        #expect(dns.lowerBound < open.lowerBound)

        // The tunnel's resolver on a network whose subnet holds it: the tunnel wins.
        var collides = LockdownPolicy(scope: .full(mark: 1), tunnelInterface: "roam0", server: server, allowLAN: true,
                                      localNetworks: [Prefix("10.77.3.9/16")!])
        collides.tunnelOnly = [IPAddress("10.77.0.1")!, IPAddress("fd77::1")!]
        let text4 = collides.ruleset()
        let inside = try! #require(text4.range(of: "ip daddr { 10.77.0.1 } counter name blocked_out goto refuse"), "\(text4)")
        #expect(text4.contains("ip6 daddr { fd77::1 } counter name blocked_out goto refuse"))
        #expect(inside.lowerBound < (try! #require(text4.range(of: "ip daddr @lan4 accept"))).lowerBound)
    }

    /// allow-lan's terms hold for every chain it opens: a LAN host that claims the tunnel's
    /// resolver's address is not heard, and containers and VMs forwarded to the LAN neither ask
    /// it for names nor reach the tunnel's resolver on it.
    @Test func allowLANsTermsHoldForWhatComesInAndWhatIsForwarded() throws {
        var policy = LockdownPolicy(scope: .full(mark: 1), tunnelInterface: "roam0", server: server, allowLAN: true,
                                    localNetworks: [Prefix("10.77.3.9/16")!])
        policy.tunnelOnly = [IPAddress("10.77.0.1")!, IPAddress("fd77::1")!]
        let text = policy.ruleset()
        func chain(_ name: String) throws -> Substring {
            let start = try #require(text.range(of: "    chain \(name) {"))
            let end = try #require(text[start.upperBound...].range(of: "\n    }"))
            return text[start.upperBound..<end.lowerBound]
        }
        func order(_ chain: Substring, _ first: String, before second: String) throws -> Bool {
            try #require(chain.range(of: first)).lowerBound < #require(chain.range(of: second)).lowerBound
        }
        let input = try chain("input")
        #expect(try order(input, "ip saddr { 10.77.0.1 } counter name blocked_in drop", before: "ip saddr @lan4 accept"), "\(input)")
        #expect(try order(input, "ip6 saddr { fd77::1 } counter name blocked_in drop", before: "ip6 saddr @lan6 accept"))
        let forward = try chain("forward")
        #expect(try order(forward, "th dport { 53, 853, 5353, 5355 } counter name blocked_dns drop", before: "ip daddr @lan4 accept"), "\(forward)")
        #expect(try order(forward, "ip daddr { 10.77.0.1 } counter name blocked_forward drop", before: "ip daddr @lan4 accept"))
        #expect(try order(forward, "th sport { 53, 853, 5353, 5355 } counter name blocked_dns drop", before: "ip daddr @lan4 accept"),
                "a LAN host's forged answers reach no container")
        #expect(try order(forward, "ip saddr { 10.77.0.1 } counter name blocked_forward drop", before: "ip daddr @lan4 accept"))
        #expect(try order(forward, "iifname \"roam0\" counter name blocked_forward drop", before: "th sport { 53, 853, 5353, 5355 }"),
                "what the tunnel forwards is settled first (to no guest here: stopped)")
        #expect(try order(forward, "ip6 daddr { fd77::1 } counter name blocked_forward drop", before: "ip6 daddr @lan6 accept"))
        // Without allow-lan nothing is let to the LAN at all, so nothing needs refusing first.
        policy.allowLAN = false
        let closed = policy.ruleset()
        #expect(!closed.contains("daddr @lan4") && !closed.contains("saddr { 10.77.0.1 }"), "\(closed)")
    }

    /// The containers' and VMs' bridges: open to and from the machine and among themselves;
    /// what they send elsewhere meets the forward chain's terms (the tunnel, or the LAN with
    /// allow-lan, answers included); none of it before the tunnel's own rules or in split mode.
    @Test func guestBridgesTalkToTheMachineAndEachOtherButLeaveOnlyThroughTheTunnel() throws {
        var policy = LockdownPolicy(scope: .full(mark: 1), tunnelInterface: "roam0", server: server)
        #expect(!policy.ruleset().contains("docker0"))
        policy.guests = ["docker0", "virbr0"]
        let text = policy.ruleset()
        #expect(text.contains("        oifname { \"docker0\", \"virbr0\" } accept"), "\(text)")
        #expect(text.contains("        iifname { \"docker0\", \"virbr0\" } accept"), "\(text)")
        #expect(text.contains("        iifname { \"docker0\", \"virbr0\" } oifname { \"docker0\", \"virbr0\" } accept"), "\(text)")
        #expect(!text.contains("ct direction reply"), "without allow-lan nothing comes back from the LAN")
        policy.allowLAN = true
        policy.localNetworks = [Prefix("192.168.1.23/24")!, Prefix("172.17.0.1/16")!]
        policy.tunnelOnly = [IPAddress("10.77.0.1")!]
        let lan = policy.ruleset()
        let forward = lan[try #require(lan.range(of: "chain forward {")).upperBound...]
        func at(_ text: String) throws -> String.Index { try #require(forward.range(of: text), "\(forward)").lowerBound }
        let guests = "oifname { \"docker0\", \"virbr0\" }"
        // A forged answer from the LAN is refused before any answer is let through; only answers
        // go to the guests from the LAN, though docker0's subnet counts as local; then the LAN.
        #expect(try at("th sport { 53, 853, 5353, 5355 } counter name blocked_dns drop") < at("\(guests) ip saddr @lan4 ct direction reply ct state established accept"))
        #expect(try at("\(guests) ip saddr @lan4 ct direction reply ct state established accept") < at("\(guests) counter name blocked_forward drop"))
        #expect(try at("\(guests) counter name blocked_forward drop") < at("ip daddr @lan4 accept"))
        #expect(!forward.contains("ct state { established, related } accept"), "no answer from anywhere to anything")
        // A guest that sends from the tunnel's resolver's address is not heard.
        let input = lan[try #require(lan.range(of: "chain input {")).upperBound...]
        #expect(try #require(input.range(of: "iifname { \"docker0\", \"virbr0\" } ip saddr { 10.77.0.1 } counter name blocked_in drop")).lowerBound
                < #require(input.range(of: "iifname { \"docker0\", \"virbr0\" } accept")).lowerBound, "\(input)")
        let split = LockdownPolicy(scope: .split([Prefix("10.77.0.0/16")!]), tunnelInterface: "roam0", server: server)
        var splitWithGuests = split
        splitWithGuests.guests = ["docker0"]
        // In split mode too only the guests forward into the tunnel, and only to them does it forward.
        let splitAlone = split.ruleset()
        let forwardAlone = splitAlone[try #require(splitAlone.range(of: "chain forward {")).upperBound...]
        #expect(!forwardAlone.contains("accept\n") || forwardAlone.firstRange(of: "accept\n")!.lowerBound > forwardAlone.firstRange(of: "\n    }")!.lowerBound,
                "nothing forwarded is accepted without guests: \(forwardAlone)")
        #expect(forwardAlone.contains("oifname \"roam0\" counter name blocked_forward drop"))
        let splitForward = splitWithGuests.ruleset()
        #expect(try #require(splitForward.range(of: "iifname { \"docker0\" } oifname \"roam0\" accept")).lowerBound
                < #require(splitForward.range(of: "oifname \"roam0\" counter name blocked_forward drop")).lowerBound, "\(splitForward)")
        #expect(splitForward.contains("iifname \"roam0\" oifname { \"docker0\" } accept"))
    }

    /// Names are written as nftables reads them: a backslash (systemd's escape in a unit's
    /// cgroup, `roam@office\x2dvpn.service`) stands for itself, and what cannot be written (a
    /// quote, a control character) is refused where the name is found.
    @Test func cgroupNamesKeepTheirBackslashes() {
        let path = #"system.slice/system-roam.slice/roam@office\x2dvpn.service/roam-agent.7"#
        let text = LockdownPolicy(scope: .full(mark: 1), tunnelInterface: "roam0", server: server, owner: .cgroup(path, level: 4)).ruleset()
        #expect(text.contains("socket cgroupv2 level 4 \"\(path)\""), "\(text)")
        #expect(LockdownPolicy.canQuote(path))
        #expect(!LockdownPolicy.canQuote("a\"b") && !LockdownPolicy.canQuote("a\nb") && !LockdownPolicy.canQuote("a\u{7f}"))
        #expect(LockdownPolicy.Owner.cgroup(path, level: 4).kind == "own-cgroup")
        #expect(LockdownPolicy.Owner.cgroup("system.slice/roam.service", level: 2).kind == "started-cgroup")
        #expect(LockdownPolicy.Owner.anyMarked.kind == "any-mark")
    }

    /// `never-local` subnets are no LAN's: allow-lan opens no part of them, however a network's
    /// subnet covers them (exactly, around them, or inside them).
    @Test func allowLANOpensNothingOfWhatNeverCountsAsLocal() throws {
        var policy = LockdownPolicy(scope: .full(mark: 0xca6c), tunnelInterface: "roam0", allowLAN: true,
                                    localNetworks: [Prefix("10.50.0.0/16")!, Prefix("192.168.1.0/24")!, Prefix("10.60.1.0/24")!])
        policy.neverLocal = [Prefix("10.50.0.0/18")!, Prefix("10.60.0.0/16")!]
        let text = policy.ruleset()
        let set = try #require(text.split(separator: "\n").first { $0.contains("elements") && $0.contains("192.168.1.0/24") }, "\(text)")
        #expect(set.contains("10.50.64.0/18") && set.contains("10.50.128.0/17"), "\(set)")
        #expect(!set.contains("10.50.0.0/") && !set.contains("10.60."), "\(set)")
    }

    /// A subnet without another: the parts beside it, largest first; nothing when it is held,
    /// itself when they do not meet or are of different families.
    @Test func aSubnetWithoutAnotherIsThePartsBesideIt() {
        func cut(_ a: String, _ b: String) -> [String] { Prefix(a)!.subtracting(Prefix(b)!).map(\.description) }
        #expect(cut("10.0.0.0/8", "10.64.0.0/10") == ["10.128.0.0/9", "10.0.0.0/10"])
        #expect(cut("10.0.0.0/8", "10.0.0.0/8") == [] && cut("10.1.0.0/16", "10.0.0.0/8") == [])
        #expect(cut("10.0.0.0/8", "192.168.0.0/16") == ["10.0.0.0/8"] && cut("10.0.0.0/8", "fd00::/8") == ["10.0.0.0/8"])
        #expect(cut("fd00::/8", "fd00:1::/32") == ["fd80::/9", "fd40::/10", "fd20::/11", "fd10::/12", "fd08::/13", "fd04::/14",
                                                  "fd02::/15", "fd01::/16", "fd00:8000::/17", "fd00:4000::/18", "fd00:2000::/19",
                                                  "fd00:1000::/20", "fd00:800::/21", "fd00:400::/22", "fd00:200::/23", "fd00:100::/24",
                                                  "fd00:80::/25", "fd00:40::/26", "fd00:20::/27", "fd00:10::/28", "fd00:8::/29",
                                                  "fd00:4::/30", "fd00:2::/31", "fd00:0::/32"].map { Prefix($0)!.description })
        #expect(cut("fd00:1:2:3::/64", "fd00:1:2:3:8000::/65") == ["fd00:1:2:3::/65"])
        // What is left and what was cut cover the subnet exactly: every address in one of them.
        let parts = Prefix("172.16.0.0/12")!.subtracting(Prefix("172.20.7.0/24")!)
        for probe in ["172.16.0.1", "172.20.6.255", "172.20.8.0", "172.31.255.255"] {
            #expect(parts.filter { $0.contains(IPAddress(probe)!) }.count == 1, "\(probe)")
        }
        #expect(!parts.contains { $0.contains(IPAddress("172.20.7.9")!) })
    }

    /// A network decides its subnet mask: allow-lan opens only what lies in a private or
    /// link-local range, and of an oversized subnet only the private ranges inside it.
    @Test(arguments: [
        (["10.20.0.57/24", "fd00:20::57/64"], ["10.20.0.0/24", "fd00:20::/64"], [String]()),
        // A rogue DHCP server's mask 128.0.0.0: of 0.0.0.0/1 only 10.0.0.0/8 is private.
        (["10.0.0.5/1"], ["10.0.0.0/8"], ["0.0.0.0/1"]),
        // A LocalNet-style network: a public address in the "local" subnet.
        (["8.8.8.5/24"], [], ["8.8.8.0/24"]),
        (["172.20.1.2/8"], ["172.16.0.0/12"], ["172.0.0.0/8"]),
        (["0.0.0.0/0", "::/0"], ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16", "fc00::/7", "fe80::/10"],
         ["default", "default"]),
        (["2001:db8:1::5/64", "169.254.7.7/16"], ["169.254.0.0/16"], ["2001:db8:1::/64"]),
    ] as [([String], [String], [String])])
    func allowLANOpensOnlyThePrivatePartOfWhatANetworkCallsLocal(_ subnets: [String], _ open: [String], _ refused: [String]) {
        let lan = LockdownPolicy.lan(from: subnets.compactMap { Prefix($0) })
        #expect(lan.open.map(\.description) == open)
        #expect(lan.refused.map(\.description) == refused)
        let text = LockdownPolicy(scope: .full(mark: 1), tunnelInterface: "roam0", server: server, allowLAN: true,
                                  localNetworks: subnets.compactMap { Prefix($0) }).ruleset()
        for prefix in refused where prefix != "default" { #expect(!text.contains(prefix), "\(prefix) is not let through") }
    }

    /// A carrier-grade NAT's LAN (RFC 6598's 100.64.0.0/10) is local only when the operator lists
    /// it: then the uplink's subnet in it is opened as a private one would be, and a listed range
    /// no uplink is on opens nothing.
    @Test func aSharedAddressSubnetIsOpenedOnlyWhenListed() throws {
        let uplinks = [Prefix("100.72.10.23/24")!, Prefix("192.168.1.23/24")!]
        var policy = LockdownPolicy(scope: .full(mark: 1), tunnelInterface: "roam0", server: server, allowLAN: true,
                                    localNetworks: uplinks)
        let unlisted = policy.ruleset()
        #expect(!unlisted.contains("100.72.10.0/24") && unlisted.contains("192.168.1.0/24"), "\(unlisted)")
        #expect(LockdownPolicy.lan(from: uplinks).refused == [Prefix("100.72.10.0/24")!], "the agent warns of it")

        policy.lanRanges = [Prefix("100.64.0.0/10")!, Prefix("fd12::/48")!]
        let listed = policy.ruleset()
        #expect(listed.contains("elements = { 100.72.10.0/24, 169.254.0.0/16, 192.168.1.0/24, 224.0.0.0/24, 239.255.255.250/32, 255.255.255.255/32 }"),
                "\(listed)")
        #expect(!listed.contains("100.64.0.0/10") && !listed.contains("fd12::"), "only where an uplink's subnet meets a listed range")
        #expect(LockdownPolicy.lan(from: uplinks, also: policy.lanRanges).refused.isEmpty)
        // An uplink subnet wider than the listed range: only the listed part is opened.
        let wide = LockdownPolicy.lan(from: [Prefix("100.64.0.9/10")!], also: [Prefix("100.72.10.0/24")!])
        #expect(wide.open == [Prefix("100.72.10.0/24")!] && wide.refused == [Prefix("100.64.0.0/10")!])
        // The tunnel still comes first, and name resolution on the LAN stays refused.
        let tunnel = try #require(listed.range(of: "oifname \"roam0\" accept"))
        let dns = try #require(listed.range(of: "counter name blocked_dns"))
        let open = try #require(listed.range(of: "ip daddr @lan4 accept"))
        #expect(tunnel.upperBound < open.lowerBound && dns.upperBound < open.lowerBound)
        // Without allow-lan, a list opens nothing.
        policy.allowLAN = false
        #expect(!policy.ruleset().contains("100.72.10.0/24"))
    }

    @Test(arguments: [("100.64.0.0/10", true), ("100.127.255.0/24", true), ("fe80::/64", true), ("fd00::/8", true),
                      ("10.1.0.0/16", true), ("100.128.0.0/10", false), ("100.0.0.0/8", false), ("8.8.8.0/24", false),
                      ("0.0.0.0/0", false), ("2001:db8::/32", false), ("198.51.100.0/24", false), ("::/0", false)])
    func onlyPrivateSharedAndLinkLocalRangesMayBeListed(_ text: String, _ allowed: Bool) {
        #expect(LockdownPolicy.mayCountAsLocal(Prefix(text)!) == allowed)
    }

    @Test func aPortalWindowLetsOnlyItsCgroupOutAndOnlyToWhatALoginNeeds() {
        var policy = LockdownPolicy(scope: .full(mark: 0xca6c), tunnelInterface: "roam0", server: server, owner: .anyMarked)
        policy.checkPorts = [80]
        let closed = policy.ruleset()
        #expect(closed.contains("meta mark 0xca6c tcp dport { 80 } accept"), "the agent's own check")
        #expect(!closed.contains("cgroupv2"), "no window, no cgroup rule")
        policy.portalWindow = .init(cgroup: "unified/roam-portal.7.1", level: 1, interface: "wifi0",
                                    resolvers: [IPAddress("192.168.1.1")!, IPAddress("fd00::1")!],
                                    login: .init(address: IPAddress("192.168.1.1")!, port: 8080))
        let text = policy.ruleset()
        let match = "socket cgroupv2 level 1 \"unified/roam-portal.7.1\""
        #expect(text.contains("\(match) meta mark set 0xca6c"), "its packets take the uplink's routes")
        #expect(text.contains("\(match) meta nfproto ipv4 ip daddr != 127.0.0.0/8 meta l4proto { tcp, udp } th dport 53 dnat ip to 192.168.1.1"))
        #expect(text.contains("\(match) oifname \"wifi0\" ip daddr { 192.168.1.1 } meta l4proto { tcp, udp } th dport 53 ct mark set 0x726f616d accept"))
        #expect(text.contains("\(match) oifname \"wifi0\" tcp dport { 80, 443 } ct mark set 0x726f616d accept"))
        #expect(text.contains("\(match) oifname \"wifi0\" ip daddr 192.168.1.1 tcp dport 8080 ct mark set 0x726f616d accept"))
        #expect(text.contains("iifname \"wifi0\" ct mark 0x726f616d ct state established accept"))
        // Everything else from the window is refused before any rule that accepts marked packets.
        let refused = try! #require(text.range(of: "\(match) counter name blocked_out goto refuse"))
        let marked = try! #require(text.range(of: "meta mark 0xca6c meta l4proto { tcp, udp } th dport 53 accept"))
        let tunnel = try! #require(text.range(of: "oifname \"roam0\" accept"))
        #expect(refused.upperBound < marked.lowerBound && refused.upperBound < tunnel.lowerBound)
        // A name in the cgroup's path cannot break out of its string.
        policy.portalWindow?.cgroup = "x\" accept\nchain y"
        #expect(policy.ruleset().contains("socket cgroupv2 level 1 \"x acceptchain y\""))
    }

    @Test func aTrustedInterfaceIsLetThroughAndNothingElse() {
        var policy = LockdownPolicy(scope: .full(mark: 0xca6c), tunnelInterface: "roam0", server: server)
        #expect(!policy.ruleset().contains("oifname \"eth0\""))
        policy.trustedInterface = "eth0"
        let text = policy.ruleset()
        #expect(text.contains("oifname \"eth0\" accept") && text.contains("iifname \"eth0\" accept"))
        // Before any refusal, and for that interface only: the rest still ends in the refusals.
        let trusted = try! #require(text.range(of: "oifname \"eth0\" accept"))
        let refused = try! #require(text.range(of: "counter name blocked_out goto refuse"))
        #expect(trusted.upperBound < refused.lowerBound && !text.contains("oifname \"wifi0\""))
        policy.trustedInterface = "x\" accept\nchain y"
        #expect(policy.ruleset().contains("oifname \"x acceptchain y\" accept"), "a name cannot break out of its string")
        var split = LockdownPolicy(scope: .split([Prefix("10.0.0.0/8")!]), tunnelInterface: "roam0")
        split.trustedInterface = "eth0"
        #expect(split.ruleset().contains("oifname \"eth0\" accept"))
    }

    @Test func anIPv6ServerIsMatchedAsIPv6() {
        let text = LockdownPolicy(scope: .full(mark: 0xca6c), tunnelInterface: "roam0",
                                  server: LockdownPolicy.Server(IPAddress("2001:db8::7")!, port: 443), owner: .anyMarked).ruleset()
        #expect(text.contains("meta mark 0xca6c ip6 daddr 2001:db8::7 udp dport 443 accept"))
    }

    /// The stream transport: the agent's own TCP to each server's TLS port, or with a proxy to
    /// the proxy alone (the servers are reached through it); nothing when it is off.
    @Test func theStreamTransportOpensTheTLSPortOrTheProxyOnly() {
        var policy = LockdownPolicy(scope: .full(mark: 0xca6c), tunnelInterface: "roam0", server: server,
                                    servers: [.init(IPAddress("2001:db8::7")!, port: 51820)], owner: .anyMarked)
        #expect(!policy.ruleset().contains("tcp dport 443"))
        policy.streamPort = 443
        let direct = policy.ruleset()
        #expect(direct.contains("meta mark 0xca6c ip daddr 198.51.100.7 tcp dport 443 accept"))
        #expect(direct.contains("meta mark 0xca6c ip6 daddr 2001:db8::7 tcp dport 443 accept"))
        policy.proxy = .init(addresses: [], port: 3128)
        let unresolved = policy.ruleset()
        #expect(!unresolved.contains("tcp dport 3128") && !unresolved.contains("tcp dport 443"),
                "a proxy whose name has no address yet opens nothing, nor the servers' TLS port")
        policy.proxy = .init(addresses: [IPAddress("192.0.2.8")!, IPAddress("2001:db8::8")!], port: 3128)
        let proxied = policy.ruleset()
        #expect(proxied.contains("meta mark 0xca6c ip daddr 192.0.2.8 tcp dport 3128 accept"))
        #expect(proxied.contains("meta mark 0xca6c ip6 daddr 2001:db8::8 tcp dport 3128 accept"))
        #expect(!proxied.contains("tcp dport 443"), "through the proxy, the servers' TLS port stays closed")
        policy.scope = .split([Prefix("10.77.0.0/16")!])
        #expect(!policy.ruleset().contains("tcp dport 3128"), "split mode opens nothing for the agent's own sockets")
    }

    /// The session's exceptions are the agent's: its cgroup as well as the mark, both ways; the
    /// server's answers come in only to a socket of its own, never to any local UDP port; and
    /// with no agent known (`agent lockdown on` at boot) nobody has them.
    @Test func theSessionsExceptionsAreTheAgentsOwn() {
        var policy = LockdownPolicy(scope: .full(mark: 0xca6c), tunnelInterface: "roam0", server: server,
                                    owner: .cgroup("unified/roam-agent.7", level: 1))
        policy.checkPorts = [80]
        let text = policy.ruleset()
        let own = "meta mark 0xca6c socket cgroupv2 level 1 \"unified/roam-agent.7\""
        #expect(text.contains("\(own) ip daddr 198.51.100.7 udp dport 51820 accept"))
        #expect(text.contains("\(own) meta l4proto { tcp, udp } th dport 53 accept"))
        #expect(text.contains("\(own) tcp dport { 80 } accept"))
        #expect(text.contains("socket mark 0xca6c socket cgroupv2 level 1 \"unified/roam-agent.7\" accept"))
        #expect(!text.contains("saddr 198.51.100.7"), "no opening for whatever claims the server's address")
        #expect(text.components(separatedBy: "meta mark 0xca6c").count == 4, "every marked exception names the cgroup: \(text)")
        policy.owner = nil
        let boot = policy.ruleset()
        #expect(!boot.contains("mark 0xca6c"), "\(boot)")
        #expect(boot.contains("counter name blocked_out goto refuse"))
    }

    /// Packets for the tunnel's inner addresses come in only through the tunnel, dropped before
    /// conntrack sees them, in either mode.
    @Test func theTunnelsAddressesAreReachedOnlyThroughTheTunnel() {
        for scope in [LockdownPolicy.Scope.full(mark: 1), .split([Prefix("10.77.0.0/24")!])] {
            var policy = LockdownPolicy(scope: scope, tunnelInterface: "roam0")
            #expect(!policy.ruleset().contains("blocked_inner drop"))
            policy.innerAddresses = [IPAddress("10.77.0.2")!, IPAddress("fd77::2")!]
            let text = policy.ruleset()
            #expect(text.contains("type filter hook prerouting priority raw; policy accept;"))
            // Loopback is this machine's own traffic to its tunnel's address.
            #expect(text.contains("iifname != { \"lo\", \"roam0\" } ip daddr { 10.77.0.2 } counter name blocked_inner drop"), "\(text)")
            #expect(text.contains("iifname != { \"lo\", \"roam0\" } ip6 daddr { fd77::2 } counter name blocked_inner drop"))
        }
    }

    /// DHCP and neighbour discovery leave and come in only in the form their protocols use.
    @Test func dhcpAndNeighbourDiscoveryAreLimitedToWhatTheyUse() {
        let text = LockdownPolicy(scope: .full(mark: 1), tunnelInterface: "roam0").ruleset()
        #expect(text.contains("meta nfproto ipv6 udp sport 546 udp dport 547 ip6 daddr { ff02::1:2, fe80::/10 } accept"))
        #expect(text.contains("icmpv6 type { nd-router-solicit, nd-neighbor-solicit, nd-neighbor-advert } ip6 hoplimit 255 ip6 daddr { fe80::/10, ff02::/16 } accept"))
        #expect(text.contains("meta nfproto ipv4 udp sport 67 udp dport 68 accept"))
        #expect(text.contains("icmpv6 type { nd-router-advert, mld-listener-query } ip6 saddr fe80::/10 accept"))
        #expect(!text.contains("        udp sport 68 udp dport 67 accept") && !text.contains("        udp sport 67 udp dport 68 accept"),
                "DHCPv4's ports alone, over IPv6 too, are no longer enough")
    }

    @Test func splitModeKeepsOnlyItsPrefixesInTheTunnel() {
        let text = LockdownPolicy(scope: .split([Prefix("10.77.0.9/24")!, Prefix("fd77::/48")!]), tunnelInterface: "roam0").ruleset()
        #expect(text.contains("elements = { 10.77.0.0/24 }") && text.contains("elements = { fd77::/48 }"))
        #expect(text.contains("ip daddr @tunneled4 counter name blocked_out goto refuse"))
        #expect(!text.contains("chain input"), "split mode leaves the rest of the traffic alone")
    }

    @Test func countersAreReadOutOfTheListing() {
        let listing = """
            table inet roam {
            \tcounter blocked_dns {
            \t\tpackets 3 bytes 180
            \t}
            \tcounter blocked_out {
            \t\tpackets 12 bytes 720
            \t}
            }
            """
        #expect(Lockdown.parseCounters(listing) == [.dns: BlockCount(packets: 3, bytes: 180), .outbound: BlockCount(packets: 12, bytes: 720)])
        // A new table starts where the one it replaces stopped.
        #expect(LockdownPolicy(scope: .split([]), tunnelInterface: "roam0").ruleset(counts: [.dns: BlockCount(packets: 3, bytes: 180)])
            .contains("counter blocked_dns { packets 3 bytes 180 }"))
    }

    @Test func aTableIsRefilledKeepingWhatTheNewOneDeclares() {
        let listing = """
            table inet roam {
            \tcounter blocked_out {
            \t\tpackets 12 bytes 720
            \t}
            \tset tunneled4 {
            \t\ttype ipv4_addr
            \t\tflags interval
            \t\telements = { 10.77.0.0/24,
            \t\t\t     10.99.0.0/16 }
            \t}
            \tchain refuse {
            \t\tmeta l4proto tcp reject with tcp reset
            \t}
            \tchain output {
            \t\ttype filter hook output priority filter; policy accept;
            \t\tip daddr @tunneled4 counter name "blocked_out" goto refuse
            \t}
            \tchain input {
            \t\ttype filter hook input priority filter; policy drop;
            \t}
            \tct helper ftp {
            \t\ttype "ftp" protocol tcp
            \t}
            }
            """
        #expect(TableObjects(listing).objects == [
            .init(kind: "counter", name: "blocked_out"), .init(kind: "set", name: "tunneled4"), .init(kind: "chain", name: "refuse"),
            .init(kind: "chain", name: "output"), .init(kind: "chain", name: "input"), .init(kind: "ct helper", name: "ftp"),
        ])
        let ruleset = LockdownPolicy(scope: .split([Prefix("10.77.0.0/24")!]), tunnelInterface: "roam0").ruleset()
        let declared = TableObjects(ruleset).objects
        #expect(declared.contains(.init(kind: "counter", name: "blocked_out")), "one-line objects are objects too: \(declared)")
        #expect(declared.contains(.init(kind: "chain", name: "output")) && declared.contains(.init(kind: "set", name: "tunneled4")))
        #expect(TableObjects(ruleset).text[.init(kind: "set", name: "tunneled4")]?.hasSuffix("elements = { 10.77.0.0/24 }\n    }\n") == true,
                "a declaration is kept whole, to be made on its own")
        let script = Lockdown.refill(listing, with: ruleset)
        let commands = script.split(separator: "\n").prefix { !$0.hasPrefix("table ") }
        // The output chain stays on its hook and the set in its rules' lookups, emptied; the input
        // chain and the helper the split policy has no use for go.
        #expect(commands == ["add table inet roam", "flush table inet roam", "flush set inet roam tunneled4",
                             "delete chain inet roam input", "delete ct helper inet roam ftp"])
        #expect(script.hasSuffix(ruleset))
    }

    @Test func theGuardsChainsHookOneStepAfterTheTables() {
        #expect(LockdownPolicy.afterTheTable("        type filter hook output priority filter; policy accept;")
                == "        type filter hook output priority filter + 1; policy accept;")
        #expect(LockdownPolicy.afterTheTable("        type nat hook output priority -100; policy accept;")
                == "        type nat hook output priority -99; policy accept;")
        #expect(LockdownPolicy.afterTheTable("        ip daddr 10.0.0.1 accept") == "        ip daddr 10.0.0.1 accept")
        let guardText = LockdownPolicy(scope: .full(mark: 1), tunnelInterface: "roam0").ruleset(table: "roam_guard", owned: true)
        #expect(guardText.hasPrefix("table inet roam_guard {\n    flags owner\n") && !guardText.contains("priority filter;"))
    }

    @Test func nftablesErrorsReadAsOneLineOfHelp() {
        let error = LockdownError("load the lockdown firewall", "Error: Could not process rule: Operation not permitted\nadd table inet roam\n^^^^^^^^^\n")
        #expect(error.description == "load the lockdown firewall: Error: Could not process rule: Operation not permitted / add table inet roam; run the agent as root or give it CAP_NET_ADMIN")
        #expect(LockdownError("x", "Error: Could not process rule: Not supported").help.contains("nf_tables"))
    }
}

/// The table in a real kernel, in a namespace of its own.
@Suite(.enabled(if: NamespaceLab.isRoot, Comment(rawValue: NamespaceLab.skipReason)), .serialized)
struct LockdownKernelTests {
    /// The agent's own loads pass unremarked; someone else's change or deletion of the table is
    /// told, with who did it; another table's changes are not.
    @Test func theTableWatchTellsSomeoneElsesChangesFromTheAgentsOwn() throws {
        let (laptop, _) = try NamespaceLab.laptopAndServer()
        let lockdown = try Lockdown(namespace: laptop.namespace)
        let watch = try TableWatch(namespace: laptop.namespace)
        func nft(_ command: String) throws {
            let (status, output) = try NamespaceLab.capture(NamespaceLab.ipTool, ["netns", "exec", laptop.name, "nft", command])
            try #require(status == 0, "nft \(command): \(output)")
        }
        func settle() { usleep(100_000) }
        var policy = LockdownPolicy(scope: .full(mark: 0xca6c), tunnelInterface: "roam0", owner: .anyMarked)
        try lockdown.apply(policy)
        settle()
        #expect(watch.foreignChange(ownCommits: lockdown.commits) == nil)
        policy.allowLAN = true
        try lockdown.apply(policy)
        try nft("add table inet other")
        settle()
        #expect(watch.foreignChange(ownCommits: lockdown.commits) == nil, "the agent's load and another table")

        try nft("delete table inet roam")
        settle()
        let deleted = watch.foreignChange(ownCommits: lockdown.commits)
        #expect(deleted?.what == "table deleted" && deleted?.by?.hasPrefix("nft (pid ") == true, "\(String(describing: deleted))")
        lockdown.forget()
        try lockdown.apply(policy)
        try nft("add rule inet roam output accept")
        settle()
        let changed = watch.foreignChange(ownCommits: lockdown.commits)
        #expect(changed?.what == "rule added", "\(String(describing: changed))")
        try nft("flush ruleset")
        settle()
        #expect(watch.foreignChange(ownCommits: lockdown.commits)?.what != nil, "flush ruleset takes the table too")
        #expect(watch.foreignChange(ownCommits: lockdown.commits) == nil, "told once")
    }

    /// Every change of policy replaces the table in one transaction, and not one packet of a
    /// flood it stops passes while it does (a table deleted and made again lets some through).
    @Test func replacingTheTableLetsNothingThroughUnderAFlood() throws {
        let (laptop, server) = try NamespaceLab.laptopAndServer()
        let lockdown = try Lockdown(namespace: laptop.namespace)
        let listener = try UDPSocket(bindingTo: SocketAddress(IPAddress("198.51.100.7")!, port: 5354), namespace: server.namespace)
        let policies: [LockdownPolicy] = [
            LockdownPolicy(scope: .split([Prefix("198.51.100.0/24")!]), tunnelInterface: "roam0"),
            LockdownPolicy(scope: .split([Prefix("198.51.100.0/24")!, Prefix("10.99.0.0/16")!]), tunnelInterface: "roam0"),
            LockdownPolicy(scope: .full(mark: 0xca6c), tunnelInterface: "roam0", owner: .anyMarked),
            LockdownPolicy(scope: .full(mark: 0xca6c), tunnelInterface: "roam0", allowLAN: true, owner: .anyMarked),
        ]
        try lockdown.apply(policies[0])
        let app = try UDPSocket(bindingTo: SocketAddress(.v4(0), port: 0), namespace: laptop.namespace)
        let flooding = Atomic<Bool>(true)
        let attempts = Atomic<Int>(0)
        let flood = Thread {
            let deadline = ContinuousClock.now + .seconds(60)
            while flooding.load(ordering: .relaxed), ContinuousClock.now < deadline, attempts.load(ordering: .relaxed) < 50_000_000 {
                _ = try? app.send(Array("leak".utf8), to: listener.local)
                attempts.add(1, ordering: .relaxed)
            }
        }
        flood.start()
        defer { flooding.store(false, ordering: .relaxed) }
        for round in 0..<240 {
            // Split and full in turn, and each with a change inside it.
            try lockdown.apply(policies[(round / 2 % 2) * 2 + round % 2])
        }
        flooding.store(false, ordering: .relaxed)
        usleep(100_000)
        #expect(attempts.load(ordering: .relaxed) > 1000, "the flood ran: \(attempts.load(ordering: .relaxed)) datagrams")
        var leaked = 0
        while try listener.receive(timeout: .milliseconds(100)) != nil { leaked += 1 }
        #expect(leaked == 0, "\(leaked) of \(attempts.load(ordering: .relaxed)) datagrams passed while the table was replaced 240 times")
        // What no policy declares is gone; the table is the last policy's, whole.
        let listing = try NamespaceLab.capture(NamespaceLab.ipTool, ["netns", "exec", laptop.name, "nft", "list", "table", "inet", "roam"]).output
        #expect(Set(TableObjects(listing).objects) == Set(TableObjects(policies[3].ruleset()).objects), "\(listing)")
        #expect(try lockdown.counters()[.outbound] ?? 0 > 1000, "the stopped datagrams were counted across the replacements")
    }

    /// Another root process deletes or empties the table (`nft flush ruleset` in a firewall's
    /// reload, `nft delete table`) while a flood tries to leave: without the guard every deletion
    /// lets datagrams out until the table is loaded again; with it, none. Nobody else may delete
    /// the guard, and it goes with the process that holds it, leaving the table.
    @Test func theGuardHoldsWhileOthersDeleteTheTable() throws {
        let (laptop, server) = try NamespaceLab.laptopAndServer()
        let listener = try UDPSocket(bindingTo: SocketAddress(IPAddress("198.51.100.7")!, port: 5354), namespace: server.namespace)
        let policy = LockdownPolicy(scope: .full(mark: 0xca6c), tunnelInterface: "roam0", owner: .anyMarked)
        func nft(_ command: String) throws -> Int32 {
            try NamespaceLab.capture(NamespaceLab.ipTool, ["netns", "exec", laptop.name, "nft", command]).status
        }
        let app = try UDPSocket(bindingTo: SocketAddress(.v4(0), port: 0), namespace: laptop.namespace)
        /// Datagrams that reached the server while others deleted the table `rounds` times, the
        /// lockdown loading it again 20 ms after each.
        func leaks(guarded: Bool, rounds: Int) throws -> Int {
            let lockdown = try Lockdown(guard: guarded ? LockdownPolicy.guardTable : nil, namespace: laptop.namespace)
            try lockdown.apply(policy)
            #expect(lockdown.isGuarded == guarded, "\(String(describing: lockdown.guardUnavailable))")
            let flooding = Atomic<Bool>(true)
            let flood = Thread {
                let deadline = ContinuousClock.now + .seconds(30)
                var sent = 0
                while flooding.load(ordering: .relaxed), ContinuousClock.now < deadline, sent < 50_000_000 {
                    _ = try? app.send(Array("leak".utf8), to: listener.local)
                    sent += 1
                }
            }
            flood.start()
            defer { flooding.store(false, ordering: .relaxed) }
            for round in 0..<rounds {
                let command = ["delete table inet roam", "flush ruleset", "flush chain inet roam output"][round % 3]
                #expect(try nft(command) == 0, "\(command)")
                usleep(20_000)
                lockdown.forget()
                try lockdown.apply(policy)
            }
            flooding.store(false, ordering: .relaxed)
            usleep(100_000)
            var leaked = 0
            while try listener.receive(timeout: .milliseconds(100)) != nil { leaked += 1 }
            if guarded {
                #expect(try nft("delete table inet roam_guard") != 0, "only its owner deletes the guard")
                #expect(try nft("add rule inet roam_guard output accept") != 0, "or changes it")
            }
            try lockdown.remove()
            return leaked
        }
        let open = try leaks(guarded: false, rounds: 15)
        #expect(open > 0, "the flood finds the moments the table is gone (else this test proves nothing)")
        let guarded = try leaks(guarded: true, rounds: 30)
        print("table deleted by others under a flood: \(open) datagrams out in 15 deletions without the guard, \(guarded) in 30 with it")
        #expect(guarded == 0, "\(guarded) datagrams left with the guard held (\(open) in 15 deletions without)")

        // The guard goes with the process that held it; the table, made to outlive it, stays.
        var holder: Lockdown? = try Lockdown(guard: LockdownPolicy.guardTable, namespace: laptop.namespace)
        try holder?.apply(policy)
        let tables = { (try? NamespaceLab.capture(NamespaceLab.ipTool, ["netns", "exec", laptop.name, "nft", "list", "tables"]).output) ?? "" }
        #expect(tables().contains("table inet roam_guard"))
        holder = nil
        #expect(!tables().contains("table inet roam_guard") && tables().contains("table inet roam"), "\(tables())")
    }

    /// A table whose base chain cannot take the new definition (another version's priority) is
    /// still replaced, whole.
    @Test func aTableOfAnotherShapeIsReplacedWhole() throws {
        let (laptop, _) = try NamespaceLab.laptopAndServer()
        let (status, output) = try NamespaceLab.capture(NamespaceLab.ipTool, ["netns", "exec", laptop.name, "nft",
            "add table inet roam; add chain inet roam output { type filter hook output priority 10 ; policy accept ; }; add rule inet roam output counter"])
        try #require(status == 0, "\(output)")
        let lockdown = try Lockdown(namespace: laptop.namespace)
        let policy = LockdownPolicy(scope: .split([Prefix("10.77.0.0/24")!]), tunnelInterface: "roam0")
        try lockdown.apply(policy)
        let listing = try NamespaceLab.capture(NamespaceLab.ipTool, ["netns", "exec", laptop.name, "nft", "list", "chain", "inet", "roam", "output"]).output
        #expect(listing.contains("priority filter") && listing.contains("@tunneled4") && !listing.contains("priority filter + 10"), "\(listing)")
    }

    @Test func fullLockdownStopsEverythingButTheSessionAndComesOffWhole() throws {
        let (laptop, server) = try NamespaceLab.laptopAndServer()
        let lockdown = try Lockdown(namespace: laptop.namespace)
        let listener = try UDPSocket(bindingTo: SocketAddress(IPAddress("198.51.100.7")!, port: 51820), namespace: server.namespace)
        let other = try UDPSocket(bindingTo: SocketAddress(IPAddress("198.51.100.7")!, port: 5354), namespace: server.namespace)
        let policy = LockdownPolicy(scope: .full(mark: 0xca6c), tunnelInterface: "roam0", server: LockdownPolicy.Server(IPAddress("198.51.100.7")!, port: 51820),
                                    owner: .anyMarked)
        try lockdown.apply(policy)
        #expect(try lockdown.isInstalled())

        // The session's marked socket gets through; an unmarked one does not, even to the server.
        let session = try UDPSocket(bindingTo: SocketAddress(.v4(0), port: 0), mark: 0xca6c, namespace: laptop.namespace)
        _ = try session.send(Array("hello".utf8), to: listener.local)
        #expect(try listener.receive(timeout: .seconds(1))?.bytes == Array("hello".utf8))
        let app = try UDPSocket(bindingTo: SocketAddress(.v4(0), port: 0), namespace: laptop.namespace)
        _ = try? app.send(Array("leak".utf8), to: listener.local)
        _ = try? app.send(Array("leak".utf8), to: other.local)
        #expect(try listener.receive(timeout: .milliseconds(200)) == nil)
        #expect(try other.receive(timeout: .milliseconds(200)) == nil)
        // The server's answer comes back in; nothing else does.
        #expect(try listener.send(Array("welcome".utf8), to: SocketAddress(IPAddress("10.20.0.57")!, port: session.local.port)))
        #expect(try session.receive(timeout: .seconds(1))?.bytes == Array("welcome".utf8))

        // An application fails at once instead of hanging.
        let start = ContinuousClock.now
        let refused = try tcpConnect(from: laptop, to: "198.51.100.7", port: 80)
        #expect(refused == EHOSTUNREACH || refused == EACCES || refused == ECONNREFUSED, "connect: \(String(cString: strerror(refused)))")
        #expect(ContinuousClock.now - start < .milliseconds(200), "\(ContinuousClock.now - start)")
        // DNS to the LAN's resolver is counted as its own cause.
        _ = try? app.send(Array("query".utf8), to: SocketAddress(IPAddress("10.20.0.1")!, port: 53))
        let counters = try lockdown.counters()
        #expect((counters[.outbound] ?? 0) >= 3 && (counters[.dns] ?? 0) >= 1, "\(counters)")

        // A second agent adopts the table: same result, one table.
        let adopter = try Lockdown(namespace: laptop.namespace)
        try adopter.apply(policy)
        #expect(try NamespaceLab.capture(NamespaceLab.ipTool, ["netns", "exec", laptop.name, "nft", "list", "tables"]).output
            .components(separatedBy: "table inet roam").count == 2)
        // and what the table had counted carries over.
        #expect(try adopter.counters()[.outbound] ?? 0 >= counters[.outbound] ?? 0 && counters[.outbound] ?? 0 >= 3)

        try adopter.remove()
        #expect(try !lockdown.isInstalled())
        try adopter.remove()  // again: nothing there, no error
        _ = try app.send(Array("open".utf8), to: other.local)
        #expect(try other.receive(timeout: .seconds(1))?.bytes == Array("open".utf8))
    }

    @Test func allowLANLetsTheLANThroughButNotItsResolver() throws {
        let (laptop, server) = try NamespaceLab.laptopAndServer()
        // A host on the LAN holds the address of the tunnel's own resolver too.
        try server.ip("address add 10.20.0.2/32 dev lo")
        let lockdown = try Lockdown(namespace: laptop.namespace)
        var policy = LockdownPolicy(scope: .full(mark: 0xca6c), tunnelInterface: "roam0", allowLAN: true,
                                    localNetworks: [Prefix("10.20.0.57/24")!, Prefix("192.168.1.23/24")!])
        policy.tunnelOnly = [IPAddress("10.20.0.2")!]
        try lockdown.apply(policy)
        let printer = try UDPSocket(bindingTo: SocketAddress(IPAddress("10.20.0.1")!, port: 9100), namespace: server.namespace)
        let resolver = try UDPSocket(bindingTo: SocketAddress(IPAddress("10.20.0.1")!, port: 53), namespace: server.namespace)
        let internet = try UDPSocket(bindingTo: SocketAddress(IPAddress("198.51.100.7")!, port: 9100), namespace: server.namespace)
        let impostor = try UDPSocket(bindingTo: SocketAddress(IPAddress("10.20.0.2")!, port: 443), namespace: server.namespace)
        let app = try UDPSocket(bindingTo: SocketAddress(.v4(0), port: 0), namespace: laptop.namespace)
        for target in [printer, resolver, internet, impostor] { _ = try? app.send(Array("job".utf8), to: target.local) }
        #expect(try printer.receive(timeout: .seconds(1))?.bytes == Array("job".utf8))
        #expect(try resolver.receive(timeout: .milliseconds(200)) == nil)
        #expect(try internet.receive(timeout: .milliseconds(200)) == nil)
        #expect(try impostor.receive(timeout: .milliseconds(200)) == nil, "the tunnel's resolver's address went to the LAN")
        // And the printer's answer comes back; the host that claims the resolver's address is not heard.
        _ = try impostor.send(Array("forged".utf8), to: SocketAddress(IPAddress("10.20.0.57")!, port: app.local.port))
        _ = try printer.send(Array("done".utf8), to: SocketAddress(IPAddress("10.20.0.57")!, port: app.local.port))
        #expect(try app.receive(timeout: .seconds(1))?.bytes == Array("done".utf8))
        #expect(try app.receive(timeout: .milliseconds(300)) == nil, "a LAN host speaking as the tunnel's resolver was heard")
        try lockdown.remove()
    }

    /// A rogue DHCP server hands out 10.20.0.58 with mask 128.0.0.0: the kernel adds an on-link
    /// route for 0.0.0.0/1, and the network answers ARP for any address in it. With allow-lan on,
    /// the LAN's printer is reached and nothing leaves for a public address in that range.
    @Test func aSubnetMaskThatCallsTheInternetLocalOpensOnlyItsPrivatePart() throws {
        let (laptop, server) = try NamespaceLab.laptopAndServer()
        try laptop.ip("address add 10.20.0.58/1 dev eth0")
        try server.ip("address add 99.0.0.9/32 dev lo")
        let lockdown = try Lockdown(namespace: laptop.namespace)
        try lockdown.apply(LockdownPolicy(scope: .full(mark: 0xca6c), tunnelInterface: "roam0", allowLAN: true,
                                          localNetworks: [Prefix("10.20.0.58/1")!, Prefix("192.168.1.23/24")!]))
        let printer = try UDPSocket(bindingTo: SocketAddress(IPAddress("10.20.0.1")!, port: 9100), namespace: server.namespace)
        let public_ = try UDPSocket(bindingTo: SocketAddress(IPAddress("99.0.0.9")!, port: 9100), namespace: server.namespace)
        let app = try UDPSocket(bindingTo: SocketAddress(.v4(0), port: 0), namespace: laptop.namespace)
        for target in [printer, public_] { _ = try? app.send(Array("job".utf8), to: target.local) }
        #expect(try printer.receive(timeout: .seconds(1))?.bytes == Array("job".utf8))
        #expect(try public_.receive(timeout: .milliseconds(300)) == nil, "a public address the network calls local stays locked")
        try lockdown.remove()
    }

    /// CVE-2019-14899: a host on the LAN sends a forged SYN/ACK for the tunnel's inner address to
    /// the laptop's uplink; a kernel that answers with a reset tells it which connections the
    /// tunnel carries. With the inner address known to the lockdown, nothing comes back, in
    /// split mode and with allow-lan (where the answer to the LAN would be let out), and the
    /// drop is counted.
    @Test(arguments: [false, true])
    func aForgedPacketForTheTunnelsAddressOnAnUplinkGetsNoAnswer(split: Bool) throws {
        let (laptop, lan) = try NamespaceLab.laptopAndServer()
        try laptop.ip("tuntap add roam0 mode tun")
        try laptop.ip("address add 10.77.0.2/32 dev roam0")
        try laptop.ip("link set roam0 up")
        // The attacker routes the inner address to the laptop's Ethernet address.
        try lan.ip("route add 10.77.0.2/32 via 10.20.0.57 dev eth-l")
        let lockdown = try Lockdown(namespace: laptop.namespace)
        var policy = split ? LockdownPolicy(scope: .split([Prefix("10.77.0.0/24")!]), tunnelInterface: "roam0")
            : LockdownPolicy(scope: .full(mark: 0xca6c), tunnelInterface: "roam0", allowLAN: true,
                             localNetworks: [Prefix("10.20.0.57/24")!], owner: .anyMarked)
        policy.innerAddresses = [IPAddress("10.77.0.2")!, IPAddress("fd77::2")!]
        try lockdown.apply(policy)
        let watch = try PacketWatch(in: lan)
        let forged = NamespaceLab.tcpSegment(from: SocketAddress(IPAddress("10.20.0.1")!, port: 40000),
                                             to: SocketAddress(IPAddress("10.77.0.2")!, port: 22222), flags: 0x12)
        for _ in 0..<3 { try lan.sendForged(forged, to: IPAddress("10.77.0.2")!) }
        // The same from the laptop's own subnet to its own uplink address is answered: the
        // laptop is there and answers what is addressed to the uplink.
        let probe = NamespaceLab.tcpSegment(from: SocketAddress(IPAddress("10.20.0.1")!, port: 40001),
                                            to: SocketAddress(IPAddress("10.20.0.57")!, port: 22222), flags: 0x12)
        if split { try lan.sendForged(probe, to: IPAddress("10.20.0.57")!) }
        usleep(500_000)
        let answers = watch.seen.filter { $0.hasPrefix("tcp 10.77.0.2") }
        #expect(answers.isEmpty, "the laptop answered for its tunnel's address: \(answers)")
        if split { #expect(watch.seen.contains { $0.hasPrefix("tcp 10.20.0.57:22222 -> 10.20.0.1:40001") }, "\(watch.seen)") }
        let counters = try lockdown.counters()
        #expect(counters[.inner] ?? 0 >= 3, "\(counters)")
        // This machine's own traffic to its tunnel's address (over loopback) is its own business.
        let service = try UDPSocket(bindingTo: SocketAddress(IPAddress("10.77.0.2")!, port: 0), namespace: laptop.namespace)
        let local = try UDPSocket(bindingTo: SocketAddress(.v4(0), port: 0), namespace: laptop.namespace)
        _ = try local.send(Array("self".utf8), to: service.local)
        #expect(try service.receive(timeout: .seconds(1))?.bytes == Array("self".utf8), "the machine cannot reach its own tunnel address")
        try lockdown.remove()
    }

    /// A host on the LAN that claims the server's address and port reaches no UDP listener here:
    /// only the session's own socket (marked, the agent's) hears the server.
    @Test func aLANHostClaimingTheServersAddressReachesNoListenerHere() throws {
        let (laptop, server) = try NamespaceLab.laptopAndServer()
        let lockdown = try Lockdown(namespace: laptop.namespace)
        try lockdown.apply(LockdownPolicy(scope: .full(mark: 0xca6c), tunnelInterface: "roam0",
                                          server: LockdownPolicy.Server(IPAddress("198.51.100.7")!, port: 51820), owner: .anyMarked))
        let spoofer = try UDPSocket(bindingTo: SocketAddress(IPAddress("198.51.100.7")!, port: 51820), namespace: server.namespace)
        let listener = try UDPSocket(bindingTo: SocketAddress(.v4(0), port: 0), namespace: laptop.namespace)
        let session = try UDPSocket(bindingTo: SocketAddress(.v4(0), port: 0), mark: 0xca6c, namespace: laptop.namespace)
        _ = try spoofer.send(Array("probe".utf8), to: SocketAddress(IPAddress("10.20.0.57")!, port: listener.local.port))
        #expect(try listener.receive(timeout: .milliseconds(300)) == nil, "a local listener heard the 'server'")
        _ = try spoofer.send(Array("welcome".utf8), to: SocketAddress(IPAddress("10.20.0.57")!, port: session.local.port))
        #expect(try session.receive(timeout: .seconds(1))?.bytes == Array("welcome".utf8), "the session still hears the server")
        #expect(try lockdown.counters()[.inbound] ?? 0 >= 1)
        try lockdown.remove()
    }

    /// ICMP errors come in only about flows that left here: a real "port unreachable" for the
    /// session's datagram passes, one a LAN host makes up about a flow that never was is dropped.
    @Test func onlyICMPErrorsAboutFlowsThatLeftHereComeIn() throws {
        let (laptop, server) = try NamespaceLab.laptopAndServer()
        let lockdown = try Lockdown(namespace: laptop.namespace)
        try lockdown.apply(LockdownPolicy(scope: .full(mark: 0xca6c), tunnelInterface: "roam0",
                                          server: LockdownPolicy.Server(IPAddress("198.51.100.7")!, port: 51820), owner: .anyMarked))
        let session = try UDPSocket(bindingTo: SocketAddress(.v4(0), port: 0), mark: 0xca6c, namespace: laptop.namespace)
        // Nobody listens at the server's port: its kernel answers with a real error.
        _ = try session.send(Array("hello".utf8), to: SocketAddress(IPAddress("198.51.100.7")!, port: 51820))
        usleep(300_000)
        let before = try lockdown.counters()[.inbound] ?? 0
        #expect(before == 0, "the real error about the session's datagram was refused")
        // A made-up one about a flow from this machine's port 5353 to a LAN host.
        let flow = NamespaceLab.udpDatagram(from: SocketAddress(IPAddress("10.20.0.57")!, port: 5353),
                                            to: SocketAddress(IPAddress("10.20.0.1")!, port: 5353), payload: [])
        for _ in 0..<3 {
            try server.sendForged(NamespaceLab.portUnreachable(from: IPAddress("10.20.0.1")!, to: IPAddress("10.20.0.57")!, about: flow),
                                  to: IPAddress("10.20.0.57")!)
        }
        usleep(300_000)
        #expect(try lockdown.counters()[.inbound] ?? 0 >= before + 3)
        try lockdown.remove()
    }

    /// DHCP's and neighbour discovery's ports and types reach no address their protocols do not
    /// use: DHCPv4 from port 68 to a public server, DHCPv6 from port 546 to a global address.
    @Test func dhcpPortsReachNoPublicAddress() throws {
        let (laptop, server) = try NamespaceLab.laptopAndServer()
        let lockdown = try Lockdown(namespace: laptop.namespace)
        try lockdown.apply(LockdownPolicy(scope: .full(mark: 0xca6c), tunnelInterface: "roam0", owner: .anyMarked))
        let publicServer = try UDPSocket(bindingTo: SocketAddress(IPAddress("198.51.100.7")!, port: 67), namespace: server.namespace)
        let lanServer = try UDPSocket(bindingTo: SocketAddress(IPAddress("10.20.0.1")!, port: 67), namespace: server.namespace)
        let globalServer = try UDPSocket(bindingTo: SocketAddress(IPAddress("fd00:20::1")!, port: 547), namespace: server.namespace)
        let client = try UDPSocket(bindingTo: SocketAddress(.v4(0), port: 68), namespace: laptop.namespace)
        let client6 = try UDPSocket(bindingTo: SocketAddress(IPAddress("::")!, port: 546), namespace: laptop.namespace)
        _ = try? client.send(Array("renew".utf8), to: publicServer.local)
        _ = try? client.send(Array("renew".utf8), to: lanServer.local)
        _ = try? client6.send(Array("solicit".utf8), to: globalServer.local)
        #expect(try lanServer.receive(timeout: .seconds(1))?.bytes == Array("renew".utf8), "a renewal to the LAN's server leaves")
        #expect(try publicServer.receive(timeout: .milliseconds(300)) == nil, "DHCP's port reached a public address")
        #expect(try globalServer.receive(timeout: .milliseconds(300)) == nil, "DHCPv6's port reached a global address")
        try lockdown.remove()
    }

    @Test func splitLockdownKeepsTheTunnelsPrefixesOffTheUplinks() throws {
        let (laptop, server) = try NamespaceLab.laptopAndServer()
        try server.ip("address add 10.77.0.1/32 dev lo")
        let lockdown = try Lockdown(namespace: laptop.namespace)
        try lockdown.apply(LockdownPolicy(scope: .split([Prefix("10.77.0.0/24")!]), tunnelInterface: "roam0"))
        let inside = try UDPSocket(bindingTo: SocketAddress(IPAddress("10.77.0.1")!, port: 7), namespace: server.namespace)
        let outside = try UDPSocket(bindingTo: SocketAddress(IPAddress("198.51.100.7")!, port: 7), namespace: server.namespace)
        let app = try UDPSocket(bindingTo: SocketAddress(.v4(0), port: 0), namespace: laptop.namespace)
        _ = try? app.send(Array("x".utf8), to: inside.local)
        _ = try app.send(Array("y".utf8), to: outside.local)
        #expect(try inside.receive(timeout: .milliseconds(200)) == nil, "no tunnel: the split prefix stays in")
        #expect(try outside.receive(timeout: .seconds(1))?.bytes == Array("y".utf8), "the rest is split mode's business")
        try lockdown.remove()
    }

    /// A TCP connect from `lab`: 0 or the errno it failed with (within 2 s).
    private func tcpConnect(from lab: NamespaceLab, to host: String, port: UInt16) throws -> Int32 {
        let fd = try lab.namespace.run { () throws(NetlinkError) -> Int32 in socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0) }
        defer { close(fd) }
        var tv = timeval(tv_sec: 2, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = port.bigEndian
        inet_pton(AF_INET, host, &address.sin_addr)
        let result = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        return result == 0 ? 0 : errno
    }
}
