import Foundation
import Glibc
import NamespaceLab
import Basics
import Testing

/// On-demand rules in the lab: the laptop's wired uplink (`eth0`, 10.20.0.57/24 behind the
/// router's `eth-l`) is a trusted network; Wi-Fi (`wifi0`) is not. The office's HTTPS server
/// (`openssl s_server` on the router's 10.20.0.1:443, a key made for the test) answers the
/// pinned probe that every rule lifting the lockdown must carry.
@Suite(.enabled(if: NamespaceLab.isRoot && PinnedServer.isAvailable,
                Comment(rawValue: NamespaceLab.isRoot ? "needs openssl (scripts/setup installs it)" : NamespaceLab.skipReason)),
       .serialized)
struct OnDemandLabTests {
    /// The office router's hardware address, given to the router's side of the laptop's cable.
    static let officeMAC = "52:54:00:0f:f1:ce"
    /// Where the office's server answers the probe, and what.
    static let probeURL = "https://10.20.0.1/roam"

    /// The office's pinned probe, for a rule's `match`.
    static func probe(pin: String) -> String {
        "probe: {url: \"\(probeURL)\", expect: roam-office, pin: \"\(pin)\"}"
    }

    /// The office, matched by its router's hardware address and proven by its server's pinned
    /// key, with the lockdown lifted there.
    static func office(mac: String = officeMAC, subnet: String = "10.20.0.0/16", pin: String) -> String {
        """
          - name: office
            match: {gateway-mac: "\(mac)", subnet: \(subnet), \(probe(pin: pin))}
            action: disconnect
            lockdown: lift
        """
    }

    /// A lab whose router has the office's hardware address on the cable's side and runs the
    /// office's HTTPS server; `rules` are given the server's pin.
    private func lab(rules: (_ pin: String) -> String) throws -> (RoamingLab, PinnedServer) {
        let lab = try RoamingLab(vpn: .roam, routing: .full)
        try lab.server.ip("link set eth-l address \(Self.officeMAC)")
        let server = try PinnedServer(in: lab.server, directory: lab.directory, name: "office", accept: "10.20.0.1:443")
        try lab.configure("client", "on-demand:\n" + rules(server.pin))
        try lab.startServer()
        return (lab, server)
    }

    private func lab(rules: String) throws -> RoamingLab {
        try lab { _ in rules }.0
    }

    private func directPing(_ lab: RoamingLab, _ address: String) -> Bool {
        let ping = try? NamespaceLab.capture(NamespaceLab.ipTool, ["netns", "exec", lab.laptop.name, "ping", "-c", "1", "-W", "1", address])
        return ping?.status == 0
    }

    private func isTrue(_ value: String?) -> Bool { value == "1" || value == "true" }

    /// Whether the lockdown lets `interface` through (an on-demand rule trusts its network).
    private func trusts(_ lab: RoamingLab, _ interface: String) -> Bool {
        let table = try? NamespaceLab.capture(NamespaceLab.ipTool, ["netns", "exec", lab.laptop.name, "nft", "list", "table", "inet", "roam"])
        return table?.output.contains("oifname \"\(interface)\" accept") == true
    }

    /// Docked behind the office's router (its hardware address, and its server's pinned key
    /// shown over the cable, `lockdown: lift`): the tunnel is never tried, the lockdown and the
    /// tunnel's routes step aside, and the laptop reaches the network directly. The cable
    /// pulled, the lockdown is back and the tunnel comes up on Wi-Fi; docked again, the session
    /// ends and the lockdown lifts again.
    @Test func aTrustedGatewayLiftsTheLockdownAndLeavingItConnects() throws {
        let (lab, office) = try lab { Self.office(pin: $0) }
        defer { office.stop() }
        try lab.loadBootLockdown()
        let started = LabClock.now
        try lab.startClient(waitForTunnel: false)
        // The gateway's entry is resolved and the probe made (the rules wait, nothing is tried), then the rule decides.
        #expect(lab.waitFor(seconds: 10) { isTrue(lab.status()["on_demand.lockdown_lifted"]) }, "\(lab.log("client.log"))")
        let trusted = LabClock.now - started
        let status = lab.status()
        #expect(status["state"] == "disconnected" && status["on_demand.rule"] == "office", "\(status)")
        #expect(lab.log("client.log").contains("reason=\"onDemandWaits(office for gateway-mac,probe \(Self.probeURL))\""))
        #expect(lab.attempts() == 0, "a trusted network is never tried: \(status)")
        #expect(lab.log("client.log").contains("reason=\"onDemand(office on eth0: disconnect, lockdown lifted)\""),
                "the transition names the rule: \(lab.log("client.log"))")
        #expect(lab.lockdownLoaded() && trusts(lab, "eth0") && !trusts(lab, "wifi0"), "the lockdown is lifted for eth0 alone")
        #expect(directPing(lab, "198.51.100.7"), "the laptop talks to the trusted network directly")
        #expect(!directPing(lab, "192.168.1.1"), "Wi-Fi stays locked while the office is trusted")

        // Undocked: the lockdown first, then the tunnel on Wi-Fi.
        let undocked = LabClock.now
        try lab.laptop.ip("link set eth0 down")
        #expect(lab.waitFor(seconds: 10) { lab.status()["state"] == "connected" }, "\(lab.log("client.log"))")
        let connected = LabClock.now - undocked
        #expect(lab.status()["path.interface"] == "wifi0")
        #expect(lab.lockdownLoaded() && !trusts(lab, "eth0"), "the lockdown is back")
        let log = lab.log("client.log")
        #expect(log.contains("reason=\"lockdownRestored(") && log.contains("onDemand(default on wifi0: connect)"), "\(log)")
        let tunnel = try NamespaceLab.capture(NamespaceLab.ipTool, ["netns", "exec", lab.laptop.name, "ping", "-c", "1", "-W", "2",
                                                                    lab.serverInner.description])
        #expect(tunnel.status == 0, "traffic flows through the tunnel: \(tunnel.output)")

        // Docked again: the session ends with a goodbye, and the lockdown lifts for the office.
        try lab.laptop.batch(["link set eth0 up", "route add default via 10.20.0.1 dev eth0 metric 100"])
        #expect(lab.waitFor(seconds: 10) { lab.status()["state"] == "disconnected" && trusts(lab, "eth0") },
                "\(lab.log("client.log"))")
        #expect(lab.wait(for: "session closed by the client", in: "server.log", seconds: 3),
                "the server heard the goodbye: \(lab.log("server.log"))")
        print("on-demand: trusted gateway decided \(trusted.short) after start (status polled every 20 ms), "
            + "tunnel up on Wi-Fi \(connected.short) after the cable was pulled")
    }

    /// A lab subnet trusted without lifting the lockdown: the tunnel stays down there, and
    /// nothing leaves outside it either; moving to Wi-Fi connects.
    @Test func aTrustedSubnetKeepsTheLockdownAndOtherUplinksConnect() throws {
        let lab = try lab(rules: """
              - name: lab
                match: {interface: "eth*", subnet: 10.20.0.0/16}
                action: disconnect
            """)
        try lab.startClient(waitForTunnel: false)
        #expect(lab.waitFor(seconds: 10) { lab.status()["state"] == "disconnected" }, "\(lab.log("client.log"))")
        #expect(lab.status()["on_demand.rule"] == "lab" && !isTrue(lab.status()["on_demand.lockdown_lifted"]))
        #expect(lab.log("client.log").contains("reason=\"onDemand(lab on eth0: disconnect)\""))
        usleep(1_000_000)
        #expect(lab.attempts() == 0, "\(lab.status())")
        #expect(lab.lockdownLoaded() && !directPing(lab, "198.51.100.7"), "the lockdown stays")
        let memory = lab.clientMemory()
        print("on-demand: a subnet rule (no TLS), client RSS \(memory.rss) kB (anonymous \(memory.anonymous) kB, "
            + "libssl and libcrypto \(tlsLibraries(lab)))")

        try lab.laptop.ip("link set eth0 down")
        #expect(lab.waitFor(seconds: 10) { lab.status()["state"] == "connected" }, "\(lab.log("client.log"))")
        #expect(lab.status()["path.interface"] == "wifi0")
        #expect(lab.log("client.log").contains("onDemand(default on wifi0: connect)"))
    }

    /// A network that relays the probe's connection to the office's real server (here the
    /// router's Wi-Fi side, which translates the laptop's connection to its own address, as a
    /// relay to a server reachable from anywhere would): the server shows the pinned key and
    /// answers, but says it saw the relay, so the lockdown stays and the tunnel connects there.
    /// On the office's own cable the same server sees the laptop itself, and the lockdown lifts.
    @Test func aRelayToTheOfficesServerLiftsNothing() throws {
        let (lab, office) = try lab { pin in
            """
              - name: office
                match: {subnet: [10.20.0.0/16, 192.168.1.0/24], \(Self.probe(pin: pin))}
                action: disconnect
                lockdown: lift
            """
        }
        defer { office.stop() }
        let relay = """
            table ip relay {
                chain in {
                    type nat hook input priority 100; policy accept;
                    iifname "wifi-l" tcp dport 443 snat to 192.168.1.1
                }
            }
            """
        try relay.write(toFile: lab.directory + "/relay.nft", atomically: true, encoding: .utf8)
        let loaded = try NamespaceLab.capture(NamespaceLab.ipTool, ["netns", "exec", lab.server.name, "nft", "-f", lab.directory + "/relay.nft"])
        try #require(loaded.status == 0, "\(loaded.output)")
        try lab.laptop.ip("link set eth0 down")
        try lab.startClient()
        #expect(lab.status()["state"] == "connected" && lab.status()["path.interface"] == "wifi0", "\(lab.status())")
        #expect(lab.wait(for: "saw the connection come from 192.168.1.1:", in: "client.log", seconds: 5), "\(lab.log("client.log"))")
        #expect(!isTrue(lab.status()["on_demand.lockdown_lifted"]) && !trusts(lab, "wifi0"), "\(lab.status())")
        // Pings to a public address: through the tunnel, none in clear at the relaying network.
        try countLeaks(lab, on: "wifi-l", from: "192.168.1.23")
        for _ in 0..<5 { _ = directPing(lab, "198.51.100.80") }
        let leaks = leaked(lab)
        #expect(leaks == 0, "\(leaks.map(String.init) ?? "?") of 5 pings left in clear through the relaying network")
        print("on-demand: a network relaying the probe to the office's server: \(leaks.map(String.init) ?? "?") of 5 pings in clear, lockdown kept")

        try lab.laptop.batch(["link set eth0 up", "route add default via 10.20.0.1 dev eth0 metric 100"])
        #expect(lab.waitFor(seconds: 10) { isTrue(lab.status()["on_demand.lockdown_lifted"]) && trusts(lab, "eth0") },
                "\(lab.log("client.log"))")
        #expect(!trusts(lab, "wifi0"), "only the cable is trusted")
    }

    /// The office router replaced by another (same gateway address, same cable, another hardware
    /// address) is another network: no link, address or route changes, but the neighbour table's
    /// notice is enough for the lockdown to come back and the tunnel to come up on the cable.
    @Test func anotherRouterBehindTheSameAddressIsAnotherNetwork() throws {
        let (lab, office) = try lab { Self.office(pin: $0) }
        defer { office.stop() }
        try lab.startClient(waitForTunnel: false)
        #expect(lab.waitFor(seconds: 10) { isTrue(lab.status()["on_demand.lockdown_lifted"]) && trusts(lab, "eth0") },
                "\(lab.log("client.log"))")

        // The kernel forgetting the entry says nothing about the network: the lift holds.
        try lab.laptop.ip("neigh flush dev eth0")
        usleep(300_000)
        #expect(trusts(lab, "eth0") && lab.status()["state"] == "disconnected", "\(lab.log("client.log"))")

        // Another router: the laptop learns its address over ARP, as it would from any packet.
        try lab.server.ip("link set eth-l address 52:54:00:0f:f1:cf")
        try lab.laptop.ip("neigh flush dev eth0")
        let replaced = LabClock.now
        _ = directPing(lab, "198.51.100.7")
        #expect(lab.waitFor(seconds: 10) { lab.status()["state"] == "connected" }, "\(lab.log("client.log"))")
        let connected = LabClock.now - replaced
        #expect(lab.status()["path.interface"] == "eth0" && !trusts(lab, "eth0"), "\(lab.status())")
        #expect(lab.log("client.log").contains("onDemand(default on eth0: connect)"), "\(lab.log("client.log"))")
        print("on-demand: another router behind the gateway's address, tunnel up \(connected.short) after the laptop's first packet to it")
    }

    /// Rules changed by a reload apply at once: a connected tunnel ends when the new rules trust
    /// its network; rules with a mistake are refused at their line and the running ones stay.
    @Test func aReloadAppliesNewRulesAtOnceAndRefusesBrokenOnes() throws {
        let (lab, office) = try lab { Self.office(mac: "52:54:00:00:00:01", pin: $0) }
        defer { office.stop() }
        try lab.startClient()
        #expect(lab.status()["state"] == "connected" && lab.status()["path.interface"] == "eth0")
        let pid = try #require(lab.clientPID)

        try lab.editConfiguration("client") { $0.replacingOccurrences(of: "52:54:00:00:00:01", with: Self.officeMAC) }
        kill(pid, SIGHUP)
        #expect(lab.waitFor(seconds: 10) { lab.status()["state"] == "disconnected" && trusts(lab, "eth0") },
                "\(lab.log("client.log"))")
        #expect(lab.wait(for: "session closed by the client", in: "server.log", seconds: 3), "\(lab.log("server.log"))")

        try lab.editConfiguration("client") { $0 + "  - name: office\n    match: {interface: eth0}\n    action: connect\n" }
        kill(pid, SIGHUP)
        #expect(lab.wait(for: "configuration not reloaded", in: "client.log"), "\(lab.log("client.log"))")
        #expect(lab.log("client.log").contains("line "), "the refusal names the line: \(lab.log("client.log"))")
        #expect(lab.status()["state"] == "disconnected" && trusts(lab, "eth0"), "the running rules stay")
    }

    /// A rule on the search domain DHCP gives: on a new network the rules wait until its DHCP
    /// client writes resolv.conf (the file still names the last network's domain until then), and
    /// decide the moment it does.
    @Test func searchDomainsAreAwaitedOnANewNetworkAndFollowed() throws {
        let lab = try lab(rules: """
              - name: home
                match: {dns-domain: home.example}
                action: disconnect
            """)
        try lab.startClient(waitForTunnel: false)
        #expect(lab.waitFor(seconds: 10) { lab.status()["state"] == "disconnected" }, "\(lab.log("client.log"))")
        #expect(lab.status()["on_demand.rule"] == "home" && lab.log("client.log").contains("onDemand(home on eth0: disconnect)"))

        // Off the cable: Wi-Fi's DHCP client writes resolv.conf a moment after its routes.
        try lab.laptop.ip("link set eth0 down")
        usleep(400_000)
        #expect(lab.status()["state"] == "disconnected" && lab.attempts() == 0, "\(lab.status())")
        #expect(lab.log("client.log").contains("msg=\"on-demand waits\" path=wifi0 for=dns-domain rule=home"), "\(lab.log("client.log"))")
        #expect(!lab.log("client.log").contains("onDemand(home on wifi0"), "the cable's domain is not Wi-Fi's")
        let written = LabClock.now
        try "# from DHCP on wifi0\nnameserver 192.168.1.1\nsearch hotel.example\n"
            .write(toFile: lab.laptopResolvConfPath, atomically: false, encoding: .utf8)
        #expect(lab.waitFor(seconds: 1.2) { lab.log("client.log").contains("onDemand(default on wifi0: connect)") },
                "decided when the file was written, not when the wait ran out: \(lab.log("client.log"))")
        let decided = LabClock.now - written
        #expect(lab.waitFor(seconds: 10) { lab.status()["state"] == "connected" }, "\(lab.log("client.log"))")
        print("on-demand: Wi-Fi's search domain decided \(decided.short) after its resolv.conf was written")
    }

    /// A trusted search domain with the lockdown lifted, then another network on the same cable
    /// whose DHCP client writes no resolv.conf: the file still names the trusted network's
    /// domain (the agent's own write of it, as the lockdown comes back, proves nothing), so the
    /// rules wait, then take the new network as giving none, and the tunnel comes up there.
    @Test func theLastNetworksSearchDomainIsNotTheNextOnes() throws {
        let (lab, office) = try lab { pin in
            """
              - name: home
                match: {dns-domain: home.example, subnet: [10.20.0.0/16, 192.168.1.0/24], \(Self.probe(pin: pin))}
                action: disconnect
                lockdown: lift
            """
        }
        defer { office.stop() }
        try lab.startClient(waitForTunnel: false)
        #expect(lab.waitFor(seconds: 10) { trusts(lab, "eth0") }, "\(lab.log("client.log"))")

        let moved = LabClock.now
        try lab.laptop.batch(["address del 10.20.0.57/24 dev eth0", "address add 10.20.0.99/24 dev eth0",
                              "route replace default via 10.20.0.1 dev eth0 metric 100"])
        #expect(lab.waitFor(seconds: 1) { !trusts(lab, "eth0") }, "the lockdown is back while the rules look")
        var liftedAgain = false
        while LabClock.now - moved < .milliseconds(1500) {
            liftedAgain = liftedAgain || trusts(lab, "eth0")
            usleep(20_000)
        }
        #expect(!liftedAgain && lab.status()["state"] == "disconnected", "\(lab.log("client.log"))")
        #expect(lab.waitFor(seconds: 10) { lab.status()["state"] == "connected" }, "\(lab.log("client.log"))")
        #expect(lab.status()["path.interface"] == "eth0" && !trusts(lab, "eth0"))
        #expect(lab.log("client.log").contains("onDemand(default on eth0: connect)"), "\(lab.log("client.log"))")
    }

    /// A probe that answers only inside the trusted network: the intranet's health page answers
    /// over the cable, the router refuses it from Wi-Fi. The tunnel is never tried on the cable;
    /// on Wi-Fi the probe fails and the tunnel comes up.
    @Test func aProbeThatAnswersOnlyInsideTrustsThatNetwork() throws {
        let lab = try lab(rules: """
              - name: intranet
                match: {probe: {url: "http://198.51.100.80/check", expect: "\(LabPortal.expected)"}}
                action: disconnect
            """)
        // The lab's portal, opened at once, is only its web server here.
        let intranet = try LabPortal(router: lab.server, uplink: "eth-l", routerAddress: IPAddress("10.20.0.1")!)
        defer { intranet.stop() }
        intranet.open()
        let refuse = try NamespaceLab.capture(NamespaceLab.ipTool, ["netns", "exec", lab.server.name, "nft",
            "add table inet lab_intranet; add chain inet lab_intranet input { type filter hook input priority -10 ; }; "
                + "add rule inet lab_intranet input iifname wifi-l tcp dport 80 reject with tcp reset"])
        #expect(refuse.status == 0, "\(refuse.output)")

        try lab.startClient(waitForTunnel: false)
        // Disconnected while the probe is out, and then for what it answered.
        #expect(lab.waitFor(seconds: 10) {
            lab.status()["state"] == "disconnected" && lab.log("client.log").contains("onDemand(intranet on eth0: disconnect)")
        }, "\(lab.log("client.log"))")
        let log = lab.log("client.log")
        #expect(log.contains("msg=\"on-demand probe\" path=eth0"), "\(log)")
        #expect(lab.attempts() == 0, "the rules waited for the probe before anything was tried: \(lab.status())")
        #expect(intranet.requestLines.contains { $0.hasPrefix("GET /check ") }, "\(intranet.requestLines)")

        try lab.laptop.ip("link set eth0 down")
        #expect(lab.waitFor(seconds: 10) { lab.status()["state"] == "connected" }, "\(lab.log("client.log"))")
        #expect(lab.status()["path.interface"] == "wifi0")
        #expect(lab.log("client.log").contains("onDemand(default on wifi0: connect)"), "\(lab.log("client.log"))")
    }

    /// Packets the router saw come in on `interface` from the laptop outside the tunnel (ICMP
    /// echo requests from its own address there), counted by a rule of the test's.
    private func countLeaks(_ lab: RoamingLab, on interface: String, from address: String) throws {
        let added = try NamespaceLab.capture(NamespaceLab.ipTool, ["netns", "exec", lab.server.name, "nft",
            "add table inet lab_leak; add chain inet lab_leak input { type filter hook prerouting priority -300 ; }; "
                + "add rule inet lab_leak input iifname \(interface) ip saddr \(address) icmp type echo-request counter"])
        #expect(added.status == 0, "\(added.output)")
    }

    /// The client's resident kB in libssl's and libcrypto's mappings, and how much of it is
    /// its own (private dirty: not shared with other processes, not dropped under pressure).
    private func tlsLibraries(_ lab: RoamingLab) -> String {
        guard let pid = lab.clientPID else { return "?" }
        let sum = try? NamespaceLab.capture(URL(fileURLWithPath: "/usr/bin/awk"), [
            "/^[0-9a-f]+-[0-9a-f]+ / { c = /libssl|libcrypto/; next } c && /^Rss:/ { s += $2 } "
                + "c && /^Private_Dirty:/ { d += $2 } END { print s + 0 \" kB, \" d + 0 \" kB private dirty\" }",
            "/proc/\(pid)/smaps"])
        return sum?.output.trimmingCharacters(in: .whitespacesAndNewlines) ?? "?"
    }

    private func leaked(_ lab: RoamingLab) -> Int? {
        let table = try? NamespaceLab.capture(NamespaceLab.ipTool, ["netns", "exec", lab.server.name, "nft", "list", "table", "inet", "lab_leak"])
        guard let text = table?.output, let range = text.range(of: "counter packets ") else { return nil }
        return Int(text[range.upperBound...].prefix { $0.isNumber })
    }

    /// A café that impersonates the office: its router answers with the office router's hardware
    /// address, and the probe's address (the office server's) answers over TLS with another key.
    /// The rule does not match, the lockdown stays whole (not lifted, and a packet sent to the
    /// café's router outside the tunnel never reaches it) and the tunnel comes up. Docked at
    /// the office, where the server shows the pinned key over the cable, the lockdown lifts for
    /// the cable alone.
    @Test func aCafeImpersonatingTheOfficeKeepsTheLockdownAndTheOfficesKeyLiftsIt() throws {
        // The café claims the office's subnet too (here the rule takes the café's as the office's).
        let (lab, office) = try lab { Self.office(subnet: "[10.20.0.0/16, 192.168.1.0/24]", pin: $0) }
        defer { office.stop() }
        // The café's router: the office's hardware address, and its own server where the probe goes.
        try lab.server.ip("link set wifi-l address \(Self.officeMAC)")
        let impostor = try PinnedServer(in: lab.server, directory: lab.directory, name: "cafe", accept: "8443")
        defer { impostor.stop() }
        #expect(impostor.pin != office.pin)
        let redirect = try NamespaceLab.capture(NamespaceLab.ipTool, ["netns", "exec", lab.server.name, "nft",
            "add table ip lab_cafe; add chain ip lab_cafe pre { type nat hook prerouting priority -100 ; }; "
                + "add rule ip lab_cafe pre iifname wifi-l tcp dport 443 redirect to :8443"])
        #expect(redirect.status == 0, "\(redirect.output)")
        try countLeaks(lab, on: "wifi-l", from: "192.168.1.23")

        // At the café: no cable.
        try lab.laptop.ip("link set eth0 down")
        try lab.loadBootLockdown()
        try lab.startClient(waitForTunnel: false)
        #expect(lab.waitFor(seconds: 15) { lab.status()["state"] == "connected" }, "\(lab.log("client.log"))")
        let log = lab.log("client.log")
        #expect(log.contains("msg=\"on-demand probe proved nothing\"") && log.contains("not the pinned \(office.pin)"), "\(log)")
        #expect(log.contains("showed the key \(impostor.pin)"), "the impostor's key is named: \(log)")
        #expect(log.contains("onDemand(default on wifi0: connect)") && !log.contains("lockdown lifted"), "\(log)")
        let status = lab.status()
        #expect(status["path.interface"] == "wifi0" && !isTrue(status["on_demand.lockdown_lifted"]), "\(status)")
        #expect(lab.lockdownLoaded() && !trusts(lab, "wifi0"), "the lockdown stays whole")
        let direct = try? NamespaceLab.capture(NamespaceLab.ipTool, ["netns", "exec", lab.laptop.name, "ping", "-c", "2", "-i", "0.2",
                                                                     "-W", "1", "-I", "wifi0", "192.168.1.1"])
        #expect(direct?.status != 0, "nothing leaves outside the tunnel: \(direct?.output ?? "")")
        #expect(leaked(lab) == 0, "the café's router saw nothing from the laptop outside the tunnel")

        // At the office: the cable in, the server shows the pinned key over it.
        let docked = LabClock.now
        try lab.laptop.batch(["link set eth0 up", "route add default via 10.20.0.1 dev eth0 metric 100"])
        #expect(lab.waitFor(seconds: 10) { isTrue(lab.status()["on_demand.lockdown_lifted"]) && trusts(lab, "eth0") },
                "\(lab.log("client.log"))")
        let lifted = LabClock.now - docked
        let after = lab.log("client.log")
        #expect(after.contains("reason=\"onDemand(office on eth0: disconnect, lockdown lifted)\""), "\(after)")
        #expect(after.contains("msg=\"on-demand probe answered\"") && after.contains("key=\"\(office.pin)\"")
                    || after.contains("key=\(office.pin)"), "\(after)")
        #expect(!trusts(lab, "wifi0"), "Wi-Fi stays locked")
        #expect(directPing(lab, "10.20.0.1"), "the laptop talks to the office directly")
        let memory = lab.clientMemory()
        print("on-demand: the café's key refused, the office's pinned key lifted the lockdown \(lifted.short) after docking; "
            + "client RSS \(memory.rss) kB (anonymous \(memory.anonymous) kB, libssl and libcrypto \(tlsLibraries(lab))) "
            + "after both TLS probes")
    }
}
