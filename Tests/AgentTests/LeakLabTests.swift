import Foundation
import Glibc
import NamespaceLab
import Basics
import Testing
import Tunnel
import Device

/// The gaps in an always-on tunnel's life, with applications trying to send all along and a
/// tap on the router's side of both uplinks: nothing may leave outside the tunnel but the
/// session, DHCP and neighbour discovery (full mode), or anything for the tunnel's prefix
/// (split mode).
@Suite(.enabled(if: NamespaceLab.isRoot, Comment(rawValue: NamespaceLab.skipReason)), .serialized)
struct LeakLabTests {
    /// Start-up with the server down, a give-up, a crash (`kill -9`) with no agent for a while,
    /// a new agent that adopts the lockdown, a restart in place (SIGHUP with a changed tunnel),
    /// the server coming back, SIGTERM without `agent stop`, and a start behind a dead server
    /// ended by SIGTERM: one lab, one tap, in each mode.
    @Test(arguments: LabRouting.allCases)
    func nothingLeavesThroughStartGiveUpCrashAndRestart(_ routing: LabRouting) throws {
        let lab = try RoamingLab(vpn: .roam, routing: routing)
        let tap = try lab.leakTap()

        // Start-up, server down: the agent gives up after 1 s and exits 1, the lockdown stays.
        let (status, output) = try lab.runAgent(["up", "--config", lab.directory + "/client.yaml", "--control",
                                                 lab.controlSocket, "--wait-for-server", "1s"], seconds: 10)
        #expect(status == 1 && output.contains("no answer from the server"), "\(output)")
        #expect(lab.lockdownLoaded(), "a give-up keeps the machine closed")
        let bait = try lab.leakBait()
        defer { bait.stop() }
        usleep(1_000_000)

        // An agent starts (the lockdown adopted), waits for the server, comes up when it is back.
        try lab.startClient(waitForTunnel: false)
        usleep(1_000_000)
        try lab.startServer()
        #expect(lab.wait(for: "msg=\"tunnel up\"", in: "client.log", seconds: 10), "\(lab.log("client.log"))")

        // A crash: kill -9, no agent for a second, then a new one.
        let client = try #require(lab.client)
        kill(client.processIdentifier, SIGKILL)
        client.waitUntilExit()
        #expect(lab.lockdownLoaded(), "a crash leaves the lockdown")
        usleep(1_000_000)
        try lab.startClient(waitForTunnel: false)
        #expect(lab.wait(for: "msg=\"tunnel up\"", in: "client.log", seconds: 10))

        // SIGHUP with a changed tunnel: the agent starts afresh in place, the lockdown kept.
        let configuration = lab.directory + "/client.yaml"
        try (try String(contentsOfFile: configuration, encoding: .utf8) + "\ntunnel: {mtu: 1400}\n")
            .write(toFile: configuration, atomically: true, encoding: .utf8)
        let restarted = lab.log("client.log").components(separatedBy: "msg=\"tunnel up\"").count
        kill(try #require(lab.clientPID), SIGHUP)
        #expect(lab.waitFor(seconds: 10) { lab.log("client.log").components(separatedBy: "msg=\"tunnel up\"").count > restarted },
                "\(lab.log("client.log"))")
        usleep(500_000)

        let status2 = lab.status()
        #expect(status2["lockdown.enabled"] == "1", "\(status2)")
        if routing == .full {
            #expect(Int(status2["lockdown.blocked.dns"] ?? "") ?? 0 > 0 && Int(status2["lockdown.blocked.out"] ?? "") ?? 0 > 0, "\(status2)")
        }
        // SIGTERM without `agent stop` (a restart, an upgrade, a shutdown, anyone's kill): the
        // agent ends, the machine stays closed with no agent for a while.
        let signalled = try #require(lab.client)
        kill(signalled.processIdentifier, SIGTERM)
        signalled.waitUntilExit()
        #expect(lab.lockdownLoaded(), "a signal keeps the lockdown")
        #expect(lab.log("client.log").contains("lockdown kept: only 'agent stop' opens the machine"))
        usleep(1_000_000)

        // A start behind a dead server, ended by its service manager's start time-out (SIGTERM).
        lab.stopServer()
        try lab.startClient(["--wait-for-server", "0"], waitForTunnel: false)
        usleep(1_500_000)
        let starting = try #require(lab.client)
        kill(starting.processIdentifier, SIGTERM)
        starting.waitUntilExit()
        #expect(lab.lockdownLoaded(), "a start time-out keeps the machine closed")
        usleep(1_000_000)

        print("leak check: start, give-up, crash, restart, SIGTERM, start time-out (\(routing)): \(tap.leaks().count) packets left outside the tunnel of \(tap.packetsSeen) judged")
        #expect(tap.leaks().isEmpty && tap.packetsSeen > 0, "leaks: \(tap.leaks())")
    }

    /// Since Linux 5.17 CAP_NET_RAW is enough to set a socket's mark, and container runtimes
    /// grant it: processes that are not the agent (one with CAP_NET_RAW and no other capability,
    /// and the test itself, both in another cgroup than the agent's own) set the session's mark
    /// and send to the server's address and port. Nothing of it leaves, while the agent's session
    /// carries traffic all along; and with the tunnel up, a forged SYN/ACK for the tunnel's inner
    /// address on the uplink gets no answer.
    @Test func anotherProcessWithTheSessionsMarkGetsNothingThrough() throws {
        let lab = try RoamingLab(vpn: .roam, routing: .full)
        try lab.startServer()
        try lab.startClient()
        let agentCgroup = (try? String(contentsOfFile: "/proc/\(try #require(lab.clientPID))/cgroup", encoding: .utf8)) ?? ""
        #expect(agentCgroup.contains("/roam-agent."), "the agent runs in a cgroup of its own: \(agentCgroup)")
        let watch = try PacketWatch(in: lab.server)
        let probes = try ProbeStream(from: SocketAddress(lab.clientInner, port: 0), in: lab.laptop,
                                     to: SocketAddress(lab.serverInner, port: 5008), in: lab.server)
        defer { probes.stop() }
        let start = LabClock.now
        let borrower = try UDPSocket(bindingTo: SocketAddress(.v4(0), port: 0), mark: 0xca6c, namespace: lab.laptop.namespace)
        for _ in 0..<5 { _ = try? borrower.send(Array("in clear".utf8), to: SocketAddress(IPAddress("198.51.100.7")!, port: lab.port)) }
        let sender = RoamingLab.builtAgent.deletingLastPathComponent().appendingPathComponent("MarkedSender").path
        let (status, said) = try NamespaceLab.capture(NamespaceLab.ipTool, [
            "netns", "exec", lab.laptop.name, "setpriv", "--inh-caps=-all,+net_raw", "--ambient-caps=+net_raw",
            "--bounding-set=-all,+net_raw", sender, "0xca6c", "198.51.100.7", "\(lab.port)", "5"])
        #expect(status == 0 && said.contains("capabilities 0000000000002000") && said.contains("mark set"),
                "CAP_NET_RAW alone sets the mark: \(said)")
        let senderPort = said.split(separator: "\n").first { $0.hasPrefix("port ") }.map { String($0.dropFirst(5)) } ?? "?"
        // The attack the tunnel's address invites from the LAN (CVE-2019-14899): sent to the
        // laptop's uplink, addressed to the tunnel's address.
        let forged = NamespaceLab.tcpSegment(from: SocketAddress(IPAddress("10.20.0.1")!, port: 40000),
                                             to: SocketAddress(lab.clientInner, port: 22222), flags: 0x12)
        for _ in 0..<3 { try lab.server.sendForged(forged, to: IPAddress("10.20.0.57")!) }
        usleep(800_000)
        let borrowed = watch.seen.filter { $0.contains(":\(borrower.local.port) -> 198.51.100.7:\(lab.port)") }
        #expect(borrowed.isEmpty, "a marked socket not the agent's reached the server: \(borrowed)")
        let raw = watch.seen.filter { $0.contains(":\(senderPort) -> 198.51.100.7:\(lab.port)") }
        #expect(raw.isEmpty, "a process with CAP_NET_RAW alone reached the server in clear: \(raw)")
        #expect(!watch.seen.contains { $0.hasPrefix("tcp \(lab.clientInner)") }, "the laptop answered for its tunnel's address")
        let (lost, sent) = probes.lost(from: start, to: LabClock.now - .milliseconds(200))
        #expect(sent >= 20 && lost * 10 <= sent, "the session carried \(sent - lost) of \(sent)")
        let agentStatus = lab.status()
        #expect(Int(agentStatus["lockdown.blocked.out"] ?? "") ?? 0 >= 10 && Int(agentStatus["lockdown.blocked.inner"] ?? "") ?? 0 >= 3,
                "\(agentStatus)")
    }

    /// A hostile network pushes routes that split the address space around the tunnel
    /// ("TunnelVision"), through its gateway or on the link: nothing leaves, the agent warns once
    /// and status names them.
    @Test func routesPushedAroundTheTunnelLeakNothing() throws {
        let lab = try RoamingLab(vpn: .roam, routing: .full)
        try lab.startServer()
        try lab.startClient()
        let tap = try lab.leakTap()
        let bait = try lab.leakBait()
        defer { bait.stop() }
        try lab.laptop.ip("route add 0.0.0.0/1 via 192.168.1.1 dev wifi0")
        try lab.laptop.ip("route add 128.0.0.0/1 via 192.168.1.1 dev wifi0")
        #expect(lab.wait(for: "a route on an uplink takes traffic around the tunnel\" lockdown=\"on: that traffic is stopped\" route=\"0.0.0.0/1 via 192.168.1.1 dev wifi0\"",
                         in: "client.log"), "\(lab.log("client.log"))")
        usleep(1_000_000)
        #expect(lab.status()["diverting_routes"]?.contains("128.0.0.0/1 via 192.168.1.1 dev wifi0") == true, "\(lab.status())")
        // The same on the link itself, as a DHCP mask of 192.0.0.0 makes the kernel add: no
        // gateway, a quarter of the internet "local".
        try lab.laptop.ip("route add 64.0.0.0/2 dev wifi0")
        #expect(lab.wait(for: "a route on an uplink takes traffic around the tunnel\" lockdown=\"on: that traffic is stopped\" route=\"64.0.0.0/2 dev wifi0\"",
                         in: "client.log"), "\(lab.log("client.log"))")
        #expect(tap.leaks().isEmpty && tap.packetsSeen > 0, "leaks: \(tap.leaks())")
    }

    /// TunnelCrack's "ServerIP": the server is named by host, and the LAN's resolver answers the
    /// agent's look-up of that name with an address of the attacker's choosing, a web host in
    /// another network where something answers like a server. The agent tries it; but the
    /// lockdown's exception for it is the agent's own sockets', and full mode routes by the
    /// session's mark: an ordinary process that sends there (plainly, bound to the uplink, or with
    /// the session's mark, as CAP_NET_RAW allows) gets nothing out in clear, no handshake from
    /// it completes, and no route to it appears. Once the name gives the server's real address,
    /// the agent connects, and the web host is reached through the tunnel only.
    @Test func aSpoofedAnswerForTheServersNameWidensNothing() throws {
        let lab = try RoamingLab(vpn: .roam, routing: .full)
        let spoofed = IPAddress("203.0.113.80")!
        let victim = try NamespaceLab()
        try victim.attach(to: lab.server, device: "eth0", peer: "victim-l", address: "203.0.113.80", gateway: "203.0.113.1")
        try NamespaceLab.ip(["netns", "exec", lab.server.name, "sysctl", "-qw", "net.ipv4.ip_forward=1"])
        let impostor = try ImpostorServer(at: SocketAddress(spoofed, port: lab.port), in: victim)
        defer { impostor.stop() }
        let web = try TCPListener(bindingTo: SocketAddress(spoofed, port: 80), namespace: victim.namespace)
        let uplinks = "iifname { \"eth-l\", \"wifi-l\" } ip daddr \(spoofed)"
        let counters = try RouterCounters(in: lab.server, [
            // Initiations: version 2's, version 3's two parts.
            ("handshakes", "\(uplinks) udp dport \(lab.port) @th,64,16 { 0x0201, 0x0301, 0x0306 }"),
            ("clear", uplinks),
            ("tunnelled", "iifname \"roam0\" ip daddr \(spoofed)"),
        ])
        let resolver = try LabResolver(at: IPAddress("10.20.0.1")!, in: lab.server, names: ["vpn.roam.test": spoofed])
        defer { resolver.stop() }
        try lab.laptop.setHosts("127.0.0.1 localhost\n")
        try lab.editConfiguration("client") { $0.replacingOccurrences(of: "server: 198.51.100.7:", with: "server: vpn.roam.test:") }
        try lab.startServer()
        try lab.startClient(waitForTunnel: false)
        #expect(lab.waitFor(seconds: 10) { (counters.packets()?["handshakes"] ?? 0) > 0 },
                "the agent tries the spoofed address: \(counters.packets() ?? [:]) \(lab.log("client.log"))")

        // Ordinary processes send to the spoofed address, to the server's port and another.
        let namespace = lab.laptop.namespace
        let any = SocketAddress(.v4(0), port: 0)
        let senders = [try UDPSocket(bindingTo: any, namespace: namespace), try UDPSocket(bindingTo: any, device: "eth0", namespace: namespace),
                       try UDPSocket(bindingTo: any, mark: 0xca6c, namespace: namespace)]
        func sendFromOrdinaryProcesses() {
            for socket in senders {
                for port in [lab.port, 7] {
                    for _ in 0..<5 { _ = try? socket.send(Array("in clear".utf8), to: SocketAddress(spoofed, port: port)) }
                }
            }
        }
        let tcp = SocketAddress(spoofed, port: 80)
        sendFromOrdinaryProcesses()
        #expect(!lab.laptop.tcpConnects(to: tcp) && !lab.laptop.tcpConnects(to: tcp, device: "eth0")
                && !lab.laptop.tcpConnects(to: tcp, mark: 0xca6c), "no TCP to the spoofed address")
        usleep(2_000_000)  // the impostor answers every initiation meanwhile
        let before = counters.packets() ?? [:]
        let ports = Set(senders.map(\.local.port))
        let heard = impostor.received
        let initiations: Set<[UInt8]> = [[2, 1], [3, 1], [3, 6]]
        #expect(heard.allSatisfy { !ports.contains($0.peer.port) && initiations.contains(Array($0.bytes.prefix(2))) },
                "the spoofed address heard more than the agent's initiations: \(heard.map { "\($0.peer) \($0.bytes.prefix(4))" })")
        #expect(before["clear"] == 0 && (before["handshakes"] ?? 0) > 0, "\(before)")
        #expect(!lab.log("client.log").contains("msg=\"tunnel up\"") && lab.status()["state"] != "connected",
                "a handshake from the spoofed address completed: \(lab.status()) \(lab.log("client.log"))")
        let routes = try lab.laptop.ip("-4 route show table all") + lab.laptop.ip("-4 rule show")
        #expect(!routes.contains("\(spoofed)"), "a route or rule for the spoofed address: \(routes)")
        func exceptions() throws -> [Substring] {
            try NamespaceLab.capture(NamespaceLab.ipTool, ["netns", "exec", lab.laptop.name, "nft", "list", "table", "inet", "roam"])
                .output.split(separator: "\n").filter { $0.contains("\(spoofed)") }
        }
        let spoofedExceptions = try exceptions()
        #expect(!spoofedExceptions.isEmpty && spoofedExceptions.allSatisfy { $0.contains("meta mark 0x0000ca6c socket cgroupv2") },
                "the lockdown lets only the agent's own sockets reach the spoofed address: \(spoofedExceptions)")

        // The name gives the server's real address: the agent connects, and what goes to the
        // web host goes through the tunnel.
        resolver.answer("vpn.roam.test", with: IPAddress("198.51.100.7")!)
        #expect(lab.wait(for: "msg=\"tunnel up\"", in: "client.log", seconds: 45), "\(lab.log("client.log"))")
        sendFromOrdinaryProcesses()
        #expect(lab.laptop.tcpConnects(to: tcp, seconds: 3), "the web host is reached through the tunnel")
        #expect(!lab.laptop.tcpConnects(to: tcp, device: "eth0") && !lab.laptop.tcpConnects(to: tcp, mark: 0xca6c),
                "nor around it")
        usleep(500_000)
        let after = counters.packets() ?? [:]
        #expect(after["clear"] == 0 && (after["tunnelled"] ?? 0) > 0, "\(after)")
        #expect(try lab.laptop.ip("-4 route get \(spoofed)").contains("dev roam0"))
        let routesAfter = try lab.laptop.ip("-4 route show table all") + lab.laptop.ip("-4 rule show")
        #expect(!routesAfter.contains("\(spoofed)"), "\(routesAfter)")
        #expect(try exceptions().allSatisfy { $0.contains("meta mark 0x0000ca6c socket cgroupv2") })
        print("spoofed server name: \(after["handshakes"] ?? -1) initiations from the agent to the spoofed address, "
              + "\(after["clear"] ?? -1) other packets to it in clear, \(after["tunnelled"] ?? -1) through the tunnel; "
              + "\(heard.count) datagrams heard there before the real answer")
        withExtendedLifetime(web) {}
    }

    /// allow-lan: a host on the LAN answers, the internet and the LAN's resolver do not.
    @Test func allowLANOpensTheLANOnly() throws {
        let lab = try fullLab(with: "allow-lan: true")
        let printer = try UDPSocket(bindingTo: SocketAddress(IPAddress("10.20.0.1")!, port: 9100), namespace: lab.server.namespace)
        let resolver = try UDPSocket(bindingTo: SocketAddress(IPAddress("10.20.0.1")!, port: 53), namespace: lab.server.namespace)
        let app = try UDPSocket(bindingTo: SocketAddress(.v4(0), port: 0), namespace: lab.laptop.namespace)
        _ = try app.send(Array("job".utf8), to: printer.local)
        _ = try? app.send(Array("query".utf8), to: resolver.local)
        #expect(try printer.receive(timeout: .seconds(1))?.peer.ip == IPAddress("10.20.0.57"), "the LAN host hears the laptop directly")
        _ = try printer.send(Array("done".utf8), to: SocketAddress(IPAddress("10.20.0.57")!, port: app.local.port))
        #expect(try app.receive(timeout: .seconds(1))?.bytes == Array("done".utf8))
        #expect(try resolver.receive(timeout: .milliseconds(300)) == nil, "DNS to the LAN stays blocked")
    }

    /// A full-mode lab whose client has `extra` in its configuration, both ends running.
    private func fullLab(with extra: String) throws -> RoamingLab {
        let lab = try RoamingLab(vpn: .roam, routing: .full)
        let configuration = lab.directory + "/client.yaml"
        try (try String(contentsOfFile: configuration, encoding: .utf8) + "\n" + extra + "\n")
            .write(toFile: configuration, atomically: true, encoding: .utf8)
        try lab.startServer()
        try lab.startClient()
        return lab
    }

    /// Sends 3 datagrams to the intranet's file server at 10.50.0.9 (an address the network
    /// holds too) and one to the LAN's printer: the printer hears the laptop directly, and every
    /// datagram to the intranet comes through the tunnel (from the inner address), none in clear.
    private func expectTheIntranetThroughTheTunnel(_ lab: RoamingLab) throws {
        let smb = try UDPSocket(bindingTo: SocketAddress(IPAddress("10.50.0.9")!, port: 445), namespace: lab.server.namespace)
        let printer = try UDPSocket(bindingTo: SocketAddress(IPAddress("10.20.0.1")!, port: 9100), namespace: lab.server.namespace)
        let app = try UDPSocket(bindingTo: SocketAddress(.v4(0), port: 0), namespace: lab.laptop.namespace)
        for _ in 0..<3 { _ = try? app.send(Array("file".utf8), to: smb.local) }
        _ = try app.send(Array("job".utf8), to: printer.local)
        #expect(try printer.receive(timeout: .seconds(1))?.peer.ip == IPAddress("10.20.0.57"), "the LAN's own host is reached directly")
        var (inClear, throughTunnel) = (0, 0)
        while let got = try smb.receive(timeout: .milliseconds(500)) {
            if got.peer.ip == IPAddress("10.77.0.2") { throughTunnel += 1 } else { inClear += 1 }
        }
        #expect(inClear == 0, "\(inClear) of 3 datagrams to the intranet left in clear to the network that claimed it")
        #expect(throughTunnel == 3, "\(throughTunnel) of 3 datagrams to the intranet went through the tunnel")
    }

    /// TunnelCrack's "LocalNet": the network hands out 10.20.0.57 with mask 255.0.0.0, claiming
    /// all of 10/8 local, and answers for an intranet address in it. With allow-lan on, only the
    /// /16 around the laptop's address counts as local: its printer is reached directly, the rest
    /// of 10/8 goes through the tunnel and never in clear, and the agent says what the network claimed.
    @Test func aNetworkThatClaimsTheIntranetAsItsLANGetsNothingOfIt() throws {
        let lab = try fullLab(with: "allow-lan: true")
        try lab.laptop.ip("address add 10.20.0.57/8 dev eth0")
        try lab.laptop.ip("address del 10.20.0.57/24 dev eth0")
        try lab.laptop.ip("route replace default via 10.20.0.1 dev eth0 metric 100")
        // The network answers for the intranet's file server (the kernel answers ARP for any
        // address it holds, on any interface).
        try lab.server.ip("address add 10.50.0.9/32 dev eth-l")
        #expect(lab.wait(for: "a network claims a subnet wider than a LAN", in: "client.log"), "\(lab.log("client.log"))")
        #expect(lab.status()["wider_claims"]?.contains("10.0.0.0/8") == true, "\(lab.status())")
        try expectTheIntranetThroughTheTunnel(lab)
    }

    /// A network whose subnet is a LAN's width but lies over the intranet (10.50.0.0/16): only
    /// `never-local` can say it is not the LAN's. With it, the intranet is reached through the
    /// tunnel and nothing of it leaves in clear, allow-lan or not; the LAN's own host still is.
    @Test func neverLocalKeepsTheIntranetFromANetworkThatClaimsIt() throws {
        let lab = try fullLab(with: "allow-lan: true\nnever-local: [10.50.0.0/16]")
        try lab.laptop.ip("address add 10.50.0.57/16 dev eth0")
        try lab.server.ip("address add 10.50.0.9/16 dev eth-l")
        usleep(300_000)
        try expectTheIntranetThroughTheTunnel(lab)
    }

    /// A host on the café's LAN routes through the laptop into the tunnel: forwarding on (any
    /// machine with libvirt, Docker or Podman), loose reverse-path checks, and a container
    /// runtime's masquerade covering the address it sends from, so what leaves the tunnel
    /// carries the user's own tunnel address. Only the guests' bridges forward into the tunnel;
    /// nothing of it reaches the gateway's side, in either mode.
    @Test(arguments: LabRouting.allCases)
    func aLANNeighbourCannotRouteIntoTheTunnelThroughTheLaptop(routing: LabRouting) throws {
        let lab = try RoamingLab(vpn: .roam, routing: routing)
        try lab.startServer()
        try lab.startClient()
        for setting in ["net.ipv4.ip_forward=1", "net.ipv4.conf.all.rp_filter=2", "net.ipv4.conf.eth0.rp_filter=2"] {
            try NamespaceLab.ip(["netns", "exec", lab.laptop.name, "sysctl", "-qw", setting])
        }
        // Docker's rule for its default bridge, which this laptop does not even have.
        let masquerade = try NamespaceLab.capture(NamespaceLab.ipTool, ["netns", "exec", lab.laptop.name, "nft",
            "add table ip lab_nat; add chain ip lab_nat post { type nat hook postrouting priority 100 ; }; "
                + "add rule ip lab_nat post ip saddr 172.17.0.0/16 oifname != \"docker0\" masquerade"])
        try #require(masquerade.status == 0, "\(masquerade.output)")
        let inside = try UDPSocket(bindingTo: SocketAddress(lab.serverInner, port: 5333), namespace: lab.server.namespace)
        let before = Int(lab.status()["lockdown.blocked.forward"] ?? "") ?? 0
        let forged = NamespaceLab.udpDatagram(from: SocketAddress(IPAddress("172.17.0.5")!, port: 40000),
                                              to: SocketAddress(lab.serverInner, port: 5333), payload: Array("through you".utf8))
        for _ in 0..<3 { try lab.server.sendForged(forged, to: IPAddress("10.20.0.57")!) }
        var arrived = 0
        while try inside.receive(timeout: .milliseconds(500)) != nil { arrived += 1 }
        #expect(arrived == 0, "\(arrived) of 3 datagrams from the LAN reached the tunnel's far side as the user")
        let stopped = (Int(lab.status()["lockdown.blocked.forward"] ?? "") ?? 0) - before
        #expect(stopped >= 3, "the laptop got them and its lockdown stopped them: \(stopped)")
    }


    /// The boot order: the boot lockdown is loaded, and then a firewall's loader (Debian's
    /// nftables.service, firewalld) runs `flush ruleset` before the agent starts. Loaded and
    /// left, the lockdown is gone and applications' datagrams leave in clear; held
    /// (`agent lockdown on --hold`), nothing leaves, the table comes back, and the holder hands
    /// over to the agent when it starts.
    @Test func aFlushBeforeTheAgentStartsOpensNothingWhileTheBootLockdownIsHeld() throws {
        let lab = try RoamingLab(vpn: .roam, routing: .full)
        try lab.startServer()
        func nft(_ command: String) throws {
            let (status, output) = try NamespaceLab.capture(NamespaceLab.ipTool, ["netns", "exec", lab.laptop.name, "nft", command])
            try #require(status == 0, "nft \(command): \(output)")
        }
        // Loaded and left, as the boot unit did: a flush opens the machine.
        try lab.loadBootLockdown()
        let tap = try lab.leakTap()
        let bait = try lab.leakBait()
        defer { bait.stop() }
        usleep(300_000)
        #expect(tap.leaks().isEmpty, "the boot lockdown holds until someone flushes it: \(tap.leaks())")
        try nft("flush ruleset")
        usleep(300_000)
        let open = tap.leaks(limit: 100_000).count
        #expect(open > 0, "a flush of a lockdown nobody holds opens the machine (else this test proves nothing)")

        // Held: five flushes, nothing out, the table back after each.
        let holder = try lab.startBootHolder()
        let held = LabClock.now
        for _ in 0..<5 {
            try nft("flush ruleset")
            usleep(100_000)
        }
        usleep(200_000)
        let heldLeaks = tap.leaks(since: held, limit: 100_000)
        #expect(heldLeaks.isEmpty, "\(heldLeaks.count) packets out through 5 flushes with the boot lockdown held: \(heldLeaks.prefix(5))")
        #expect(lab.nftTables().contains("table inet roam\n"), "the holder loaded the table again: \(lab.log("holder.log"))")
        print("boot lockdown under 'flush ruleset': \(open) packets out in 300 ms when loaded and left, \(heldLeaks.count) through 5 flushes when held")

        // The agent starts, holds its own, and the holder ends with its guard.
        try lab.startClient()
        #expect(lab.waitFor(seconds: 5) { !holder.isRunning }, "the holder handed over: \(lab.log("holder.log"))")
        let tables = lab.nftTables()
        #expect(tables.contains("table inet roam_guard") && !tables.contains("roam_boot"), "\(tables)")
        usleep(300_000)
        #expect(tap.leaks(since: held).isEmpty, "nothing left in clear across the hand-over: \(tap.leaks(since: held))")
    }
}
