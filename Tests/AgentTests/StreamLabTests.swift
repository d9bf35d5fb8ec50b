import Foundation
import Glibc
import NamespaceLab
import Basics
import Device
import Testing

/// Networks that drop UDP: the agent reaches the gateway over TLS on TCP port 443 (`tcp:` on both
/// ends), moves back to UDP without a handshake once UDP flows again, and leaks nothing meanwhile.
/// The lab's server namespace is also the laptop's router: what it drops, the network drops.
@Suite(.enabled(if: NamespaceLab.isRoot, Comment(rawValue: NamespaceLab.skipReason)), .serialized)
struct StreamLabTests {
    static let gateway = IPAddress("198.51.100.7")!

    /// A full-tunnel lab whose gateway and client both offer the stream on 443; UDP re-tested
    /// from the stream every `retest`.
    private func streamLab(retest: String = "2s") throws -> RoamingLab {
        let lab = try RoamingLab(vpn: .roam, routing: .full)
        try lab.configure("server", "tcp: 443")
        try lab.configure("client", "tcp: 443\nreconnect: {stream: {udp-retest: \(retest), udp-retest-cap: \(retest)}}")
        return lab
    }

    /// The router drops UDP to the gateway's port that arrives from `interface` (its side of an
    /// uplink), as a hotel's network does: table `inet block`.
    private func dropUDP(from interface: String, in lab: RoamingLab) throws {
        try nft(lab.server, "add table inet block")
        try nft(lab.server, "add chain inet block in { type filter hook prerouting priority -300 ; }")
        try nft(lab.server, "add rule inet block in iifname \(interface) udp dport \(lab.port) counter drop")
    }

    private func handshakes(_ lab: RoamingLab) -> Int {
        lab.log("server.log").split(separator: "\n").filter { $0.contains("msg=handshake ") }.count
    }

    @Test func aLaptopOnANetworkThatDropsUDPGetsItsTunnelOverTLSAndUDPBackWithoutAHandshake() throws {
        let lab = try streamLab()
        try lab.startServer()
        try dropUDP(from: "eth-l", in: lab)
        let (tap, bait, probes) = try startWatched(lab, web: [SocketAddress(Self.gateway, port: 443)])
        defer {
            bait.stop()
            probes.stop()
        }
        let status = lab.status()
        #expect(status["path.transport"] == "stream" && status["path.interface"] == "eth0", "\(status)")
        #expect(status["transports.networks"]?.contains("blocked") == true, "the network is known to block UDP: \(status)")
        #expect(lab.log("client.log").contains("msg=\"stream opened\""))
        #expect(lab.log("server.log").split(separator: "\n").contains { $0.contains("msg=handshake ") && $0.contains(":443") == false },
                "the gateway saw the handshake")

        // UDP flows again: the next re-test moves the session back, make-before-break.
        let before = handshakes(lab)
        usleep(500_000)
        let opened = LabClock.now
        try nft(lab.server, "delete table inet block")
        #expect(lab.waitFor(seconds: 10) { lab.status()["path.transport"] == "udp" }, "not back on UDP: \(lab.log("client.log"))")
        let back = LabClock.now
        usleep(500_000)
        let (lost, sent) = probes.lost(from: opened, to: LabClock.now - .milliseconds(200))
        print("stream lab: back on UDP \(back - opened) after it flowed again; \(lost) of \(sent) probes lost")
        #expect(lost == 0, "probes lost in the move back to UDP: \(lost) of \(sent)")
        #expect(handshakes(lab) == before, "the move to UDP needed no handshake: \(lab.log("server.log"))")
        #expect(lab.status()["transports.networks"]?.contains("answers") == true)

        let leaks = tap.leaks()
        #expect(leaks.isEmpty, "left in clear: \(leaks)")
        #expect(tap.packetsSeen > 100, "the tap saw the session")
    }

    @Test func aRoamOntoANetworkThatDropsUDPKeepsTheTunnelWithinASecond() throws {
        let lab = try streamLab(retest: "30s")
        try lab.startServer()
        try dropUDP(from: "wifi-l", in: lab)
        let tap = try lab.leakTap(web: [SocketAddress(Self.gateway, port: 443)])
        try lab.startClient()
        let probes = try ProbeStream(from: SocketAddress(lab.clientInner, port: 0), in: lab.laptop,
                                     to: SocketAddress(lab.serverInner, port: 5006), in: lab.server, interval: .milliseconds(20))
        defer { probes.stop() }
        #expect(lab.waitFor(seconds: 10) { probes.firstEcho(after: LabClock.now - .seconds(1)) != nil }, "\(lab.log("client.log"))")
        #expect(lab.status()["path.transport"] == "udp", "eth0 carries UDP")
        let stream = try TCPStream(to: SocketAddress(lab.serverInner, port: 5007), listenerIn: lab.server, from: lab.laptop)
        usleep(500_000)

        // The cable is pulled: the only network left drops UDP.
        let pulled = LabClock.now
        try lab.laptop.ip("link set eth0 down")
        #expect(lab.waitFor(seconds: 10) { lab.status()["path.transport"] == "stream" }, "not on the stream: \(lab.log("client.log"))")
        usleep(2_000_000)
        let outage = probes.outage(from: pulled, to: LabClock.now)
        print("stream lab: traffic back \(outage) after landing on a network that drops UDP")
        #expect(outage < .seconds(3), "the tunnel came back \(outage) after the roam (benchmark target: 1 s)")
        #expect(lab.status()["path.interface"] == "wifi0")
        let result = stream.finish(within: .seconds(30))
        #expect(result.intact && result.failure == nil, "the TCP stream through the tunnel survived the roam: \(result)")
        #expect(tap.leaks().isEmpty, "left in clear: \(tap.leaks())")
    }

    /// A middlebox resets the stream mid-session: the agent says so, opens a new stream under its
    /// budget, and the traffic comes back over it; nothing leaves in clear meanwhile.
    @Test func aStreamResetMidSessionIsOpenedAgain() throws {
        let lab = try streamLab(retest: "30s")
        // Backing off looks for a captive portal, whose check asks the network's resolver by
        // design (the agent's own marked socket), which the tap would count.
        try lab.configure("client", "portal: {check: off}")
        try lab.laptop.ip("link set wifi0 down")  // no other uplink to fail over to
        try lab.startServer()
        try dropUDP(from: "eth-l", in: lab)
        let (tap, bait, probes) = try startWatched(lab, web: [SocketAddress(Self.gateway, port: 443)])
        defer {
            bait.stop()
            probes.stop()
        }
        #expect(lab.status()["path.transport"] == "stream")
        // Every segment of the stream draws a reset for a second, as a middlebox that cuts long
        // connections does.
        let reset = LabClock.now
        try nft(lab.server, "add table inet cut")
        try nft(lab.server, "add chain inet cut in { type filter hook prerouting priority -300 ; }")
        try nft(lab.server, "add rule inet cut in iifname eth-l tcp dport 443 reject with tcp reset")
        #expect(lab.wait(for: "msg=\"stream failed\"", in: "client.log", seconds: 10), "\(lab.log("client.log"))")
        usleep(1_000_000)
        try nft(lab.server, "delete table inet cut")
        #expect(lab.waitFor(seconds: 15) { probes.firstEcho(after: LabClock.now - .milliseconds(100)) != nil },
                "no echo over a new stream: \(lab.log("client.log"))")
        let outage = probes.outage(from: reset, to: LabClock.now)
        print("stream lab: traffic back \(outage) after the stream was reset (the resets lasted about a second)")
        #expect(outage < .seconds(8), "a new stream under the budget's backoff, not the budget's exhaustion")
        #expect(lab.status()["path.transport"] == "stream")
        #expect(lab.log("client.log").components(separatedBy: "msg=\"stream opened\"").count - 1 >= 2, "a second stream opened")
        #expect(tap.leaks().isEmpty, "left in clear: \(tap.leaks())")
    }

    /// A network that lets out nothing but its HTTP proxy, which wants a user and a password: the
    /// tunnel comes up through the proxy with the credentials from the password file, and the
    /// lockdown lets nothing else out meanwhile. `named`: the configuration names the proxy by
    /// host, as offices do, and the network's own resolver (the only one the laptop has) knows the
    /// name: the agent looks it up over that network's uplink, and the lockdown opens to the
    /// address it gave and to nothing else; nothing leaves in clear but that one look-up.
    @Test(arguments: [false, true]) func aNetworkThatLetsOutOnlyItsProxyGetsTheTunnelThroughIt(named: Bool) throws {
        let (lab, proxy) = try proxyOnlyLab { try Self.aliceThrough(named ? "proxy.corp.example:3128" : "10.20.0.1:3128", directory: $0) }
        defer { proxy.stop() }
        // The office's resolver, at an address of the router's own that no application here asks.
        let dns = IPAddress("10.20.0.53")!
        _ = try lab.server.ip("addr add \(dns)/32 dev eth-l")
        let resolver = try LabResolver(at: dns, in: lab.server, names: ["proxy.corp.example": IPAddress("10.20.0.1")!])
        defer { resolver.stop() }
        try lab.laptop.setResolvConf("nameserver \(dns)\n")
        try nft(lab.server, "insert rule inet block in iifname eth-l ip daddr \(dns) udp dport 53 accept")
        try lab.startServer()
        let (tap, bait, probes) = try startWatched(lab, web: [proxy.address])
        defer {
            bait.stop()
            probes.stop()
        }
        #expect(lab.status()["path.transport"] == "stream")
        #expect(proxy.counts.opened >= 1 && proxy.counts.refused == 0, "\(proxy.counts)")
        let log = lab.log("client.log")
        #expect(!log.contains("proxy secret"), "the proxy's password is never logged")
        #expect(resolver.queries.contains("proxy.corp.example") == named, "\(resolver.queries)")
        if named {
            #expect(lab.status()["transports.stream.proxy_at"]?.contains("10.20.0.1") == true, "\(lab.status())")
            #expect(log.contains("msg=\"proxy found\" network=\"eth0 via"), "\(log)")
        }
        let ruleset = try NamespaceLab.capture(NamespaceLab.ipTool, ["netns", "exec", lab.laptop.name, "nft", "list", "table", "inet", "roam"]).output
        #expect(ruleset.contains("ip daddr 10.20.0.1 tcp dport 3128 accept"), "the lockdown opened to the proxy's address")
        let leaks = tap.leaks().filter { !(named && $0.contains("-> \(dns):53")) }
        #expect(leaks.isEmpty, "left in clear: \(leaks)")
    }

    /// The same proxy, but the client was given no credentials: each stream fails with the
    /// proxy's words, attempts back off under the budget, no tunnel and nothing in clear.
    @Test func aProxyThatWantsCredentialsTheClientLacksIsSaidPlainly() throws {
        // Both transports failing makes the core look for a captive portal, whose check asks the
        // network's resolver by design (the agent's own marked socket), which the tap would count.
        let (lab, proxy) = try proxyOnlyLab { _ in "tcp: {proxy: 10.20.0.1:3128}\nportal: {check: off}" }
        defer { proxy.stop() }
        try lab.startServer()
        try lab.loadBootLockdown()
        let tap = try lab.leakTap(web: [proxy.address])
        try lab.startClient(waitForTunnel: false)
        #expect(lab.wait(for: "asks for credentials", in: "client.log", seconds: 10), "\(lab.log("client.log"))")
        usleep(3_000_000)
        let status = lab.status()
        #expect(status["state"] != "connected", "\(status)")
        #expect(proxy.counts.opened == 0 && proxy.counts.refused >= 1)
        let failures = lab.log("client.log").split(separator: "\n").filter { $0.contains("msg=\"stream failed\"") }.count
        #expect((1...12).contains(failures), "attempts stay within the budget: \(failures) in about 4 s")
        #expect(tap.leaks().isEmpty, "left in clear: \(tap.leaks())")
    }

    /// A network that intercepts TLS to 443 and answers itself: the stream opens (TLS proves
    /// nothing), the handshake inside never completes (the client pins the gateway's key), so
    /// there is no session, and nothing leaves in clear.
    @Test func aMiddleboxThatInterceptsTLSGetsNoSession() throws {
        let lab = try streamLab(retest: "30s")
        try lab.editConfiguration("server") { $0.replacingOccurrences(of: "tcp: 443", with: "") }
        let impostor = try TLSImpostor(on: SocketAddress(Self.gateway, port: 443), in: lab.server)
        defer { impostor.stop() }
        try lab.laptop.ip("link set wifi0 down")
        try dropUDP(from: "eth-l", in: lab)
        try lab.startServer()
        try lab.loadBootLockdown()
        let tap = try lab.leakTap(web: [SocketAddress(Self.gateway, port: 443)])
        let bait = try lab.leakBait()
        defer { bait.stop() }
        try lab.startClient(waitForTunnel: false)
        #expect(lab.waitFor(seconds: 10) { impostor.framesRead > 0 }, "the client's frames reached the impostor: \(lab.log("client.log"))")
        usleep(3_000_000)
        #expect(lab.status()["state"] != "connected")
        #expect(!lab.log("client.log").contains("msg=\"handshake completed\""), "\(lab.log("client.log"))")
        #expect(!lab.log("server.log").contains("msg=handshake "))
        #expect(tap.leaks().isEmpty, "left in clear: \(tap.leaks())")
        #expect(tap.packetsSeen > 0)
    }

    /// Boots the laptop with the lockdown, starts applications that keep trying to get out, a tap
    /// that judges what leaves (TCP to `web` allowed), the client and a probe stream through the
    /// tunnel, and expects its first echo within 10 s.
    private func startWatched(_ lab: RoamingLab, web: [SocketAddress],
                              sourceLocation: SourceLocation = #_sourceLocation) throws -> (LeakTap, LeakBait, ProbeStream) {
        try lab.loadBootLockdown()
        let tap = try lab.leakTap(web: web)
        let bait = try lab.leakBait()
        let started = LabClock.now
        try lab.startClient()
        let probes = try ProbeStream(from: SocketAddress(lab.clientInner, port: 0), in: lab.laptop,
                                     to: SocketAddress(lab.serverInner, port: 5006), in: lab.server, interval: .milliseconds(20))
        #expect(lab.waitFor(seconds: 10) { probes.firstEcho(after: started) != nil }, "no echo through the tunnel: \(lab.log("client.log"))",
                sourceLocation: sourceLocation)
        return (tap, bait, probes)
    }

    /// A lab whose eth0 network lets out nothing but its HTTP proxy at 10.20.0.1:3128, which wants
    /// alice's user and password; wifi0 down; the client's `tcp` section is what `client` returns
    /// (given the lab's directory).
    private func proxyOnlyLab(client: (String) throws -> String) throws -> (RoamingLab, ConnectProxy) {
        let lab = try streamLab(retest: "30s")
        let proxy = try ConnectProxy(on: SocketAddress(IPAddress("10.20.0.1")!, port: 3128), in: lab.server,
                                     credentials: ("alice", "proxy secret"))
        let section = try client(lab.directory)
        try lab.editConfiguration("client") { $0.replacingOccurrences(of: "tcp: 443", with: section) }
        try lab.laptop.ip("link set wifi0 down")
        // The router drops everything from eth0 but TCP to the proxy (and ARP, which is not IP).
        try nft(lab.server, "add table inet block")
        try nft(lab.server, "add chain inet block in { type filter hook prerouting priority -300 ; }")
        try nft(lab.server, "add rule inet block in iifname eth-l ip daddr 10.20.0.1 tcp dport 3128 accept")
        try nft(lab.server, "add rule inet block in iifname eth-l meta nfproto ipv4 counter drop")
        try nft(lab.server, "add rule inet block in iifname eth-l meta nfproto ipv6 counter drop")
        return (lab, proxy)
    }

    /// The client's `tcp` section for the proxy at `address` as alice, her password in a file of
    /// the lab's `directory`.
    private static func aliceThrough(_ address: String, directory: String) throws -> String {
        let passwordFile = directory + "/proxy.password"
        try writeSecret("proxy secret\n", to: passwordFile)
        return "tcp: {port: 443, proxy: {address: \(address), user: alice, password-file: \(passwordFile)}}"
    }

    private func nft(_ lab: NamespaceLab, _ command: String) throws { try lab.nft(command) }
}
