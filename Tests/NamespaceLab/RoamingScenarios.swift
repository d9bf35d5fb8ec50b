public import Foundation
import Glibc
import Basics
import Tunnel
import Device

/// The roaming situations the lab plays, each on a fresh lab, with a probe stream through the
/// tunnel every 20 ms (and, for the tests, a TCP stream whose every byte is checked). The better
/// path's stream runs every 2 ms: the time until it arrives over eth0 measures the agent, not
/// where a 20 ms tick happened to fall.
public enum RoamingScenario: String, CaseIterable, Sendable, CustomStringConvertible {
    /// Nothing happens for 20 s: what the probe stream alone costs (the flap storm's baseline).
    case steady
    /// eth0 goes down while the session runs on it; wifi0 is up.
    case uplinkLoss = "uplink-loss"
    /// The session runs on wifi0; eth0 comes up and gets its default route.
    case betterPath = "better-path"
    /// DHCP renumbers eth0 (10.20.0.57 -> 10.20.0.58) under the session.
    case addressChange = "address-change"
    /// eth0 gets 10.20.0.58/32 beside 10.20.0.57/24 and the old address goes, but the kernel
    /// refuses binds to the new one for 400 ms (its local route taken away and put back: the
    /// moment promote_secondaries leaves, made long and certain).
    case addressRefused = "address-refused"
    /// eth0 stays up, but the router drops everything that arrives from it.
    case silentBlackhole = "silent-blackhole"
    /// eth0 goes down and up every 250 ms for 20 s; wifi0 is healthy.
    case flapStorm = "flap-storm"
    /// The machine suspends (SIGTSTP), the dock with eth0 is pulled while it sleeps, it resumes (SIGCONT).
    case suspendResume = "suspend-resume"
    /// The VPN server restarts and comes back with no sessions.
    case serverRestart = "server-restart"
    /// Both uplinks go down for 30 s, then wifi0 comes back.
    case bothUplinksDown = "both-uplinks-down"
    /// The router drops a random 20 % of what crosses eth0, each way, for 20 s (nftables'
    /// `numgen random`: this kernel has no netem); wifi0 is healthy.
    case lossyUplink = "lossy-uplink"
    /// On wifi0 with eth0 down, then eth0 comes up behind a router whose links run at an MTU of
    /// 1,280 and which sends no ICMP (`SilentRouter`): the session moves there (it ranks first)
    /// and full-size tunnel packets vanish while small ones pass. 20 s with the TCP stream
    /// running (20 MB at its megabyte a second).
    case mtuBlackHole = "mtu-black-hole"
    /// Both ends offer the stream transport (`tcp: 443`); the router drops UDP to the gateway that
    /// comes from wifi0. The session runs on eth0 over UDP; eth0 goes down: it lands on a network
    /// that drops UDP and must carry on over TLS.
    case udpBlockedLanding = "udp-blocked-landing"
    /// As above with eth0 down from the start, so the session runs over the stream on wifi0; then
    /// the router lets UDP through again: the session moves back to UDP on its own (the re-test,
    /// 30 s after landing on the stream by default), with nothing lost.
    case udpReturns = "udp-returns"

    public var description: String { rawValue }

    /// Whether the scenario needs Roam's stream transport (wireguard-go has none to compare).
    public var needsStream: Bool { self == .udpBlockedLanding || self == .udpReturns }
}

/// What one run of a scenario measured.
public struct RoamingOutcome: Sendable {
    public var scenario: RoamingScenario
    public var vpn: TunnelUnderTest
    public var routing: LabRouting
    /// The longest time without a probe echo, from the scenario's event (for suspend/resume:
    /// from SIGCONT; for a server restart: from the server being back) to its end.
    public var outage: Duration
    public var lostProbes: Int
    public var sentProbes: Int
    /// Handshake initiations the server received during the scenario.
    public var handshakes: Int
    /// Roam's reconnect attempts (binds, rebinds, handshakes) during the scenario.
    public var attempts: Int?
    /// Roam's attempts while no uplink existed (both uplinks down).
    public var attemptsWhileOffline: Int?
    /// Client CPU time during the scenario.
    public var cpu: Duration
    /// Better path: from the route appearing to the probe stream arriving over eth0.
    public var moved: Duration?
    /// Roam's interface at the end, and the transport over it (`udp` or `stream`).
    public var interface: String?
    public var transport: String?
    /// Roam's tunnel MTU at the end, and how long it took to come down to what the path carries.
    public var tunnelMTU: Int?
    public var adapted: Duration?
    /// The TCP stream: bytes written, bytes read, every byte in order, what failed.
    public var tcp: (sent: Int, received: Int, intact: Bool, failure: String?)?
    /// The MTU black hole's second stream, the other way (the server sends, the laptop reads).
    public var download: (sent: Int, received: Int, intact: Bool, failure: String?)?
    /// The tunnel device's index, flags, addresses and routes at the end, equal to the start.
    public var tunnelUntouched: Bool
    public var clientLog: String
    public var serverLog: String
    /// With a leak check: what left the laptop outside the tunnel, from before the client
    /// started to the end (see `LeakTap`), and how many packets the tap judged.
    public var leaks: [String]?
    public var packetsJudged: Int
}

extension RoamingScenario {
    /// Builds a lab, plays the scenario and measures it. With `tcp`, a TCP stream runs through
    /// the tunnel the whole time and is checked at the end.
    /// With `leaks`, applications keep trying to send outside the tunnel from before the client
    /// starts (`LeakBait`), and a tap on the router's side of the uplinks judges every packet.
    public func run(vpn: TunnelUnderTest, routing: LabRouting, agent: URL = RoamingLab.builtAgent, tcp: Bool,
                    leaks: Bool = false) throws -> RoamingOutcome {
        let lab = try RoamingLab(vpn: vpn, routing: routing, agent: agent)
        let laptop = lab.laptop
        if needsStream {
            try lab.configure("server", "tcp: 443")
            try lab.configure("client", "tcp: 443")
            if self == .udpReturns { try laptop.ip("link set eth0 down") }
            try lab.server.nft("add table inet block")
            try lab.server.nft("add chain inet block in { type filter hook prerouting priority -300 ; }")
            try lab.server.nft("add rule inet block in iifname wifi-l udp dport \(lab.port) drop")
        }
        let router = self == .mtuBlackHole ? try SilentRouter(between: laptop, and: lab.server, mtu: 1280) : nil
        if self == .betterPath || self == .mtuBlackHole { try laptop.ip("link set eth0 down") }
        if self == .addressChange { try NamespaceLab.ip(["netns", "exec", laptop.name, "sysctl", "-qw", "net.ipv4.conf.eth0.promote_secondaries=1"]) }
        try lab.startServer()
        let tap = try PacketTap(port: lab.port, in: lab.server)
        // The machine boots with the lockdown loaded before any application runs.
        if leaks, vpn == .roam { try lab.loadBootLockdown() }
        let web = needsStream ? [SocketAddress(IPAddress("198.51.100.7")!, port: 443)] : []
        let leakTap = leaks ? try lab.leakTap(web: web) : nil
        // What the laptop sends to its eth0 gateway stops at the router, so it is judged there too.
        let routerLeakTap = leaks ? try router.map { try lab.leakTap(on: ["lan"], in: $0.lab) } : nil
        let bait = leaks ? try lab.leakBait() : nil
        defer { bait?.stop() }
        try lab.startClient()
        let probes = try ProbeStream(from: SocketAddress(lab.clientInner, port: 0), in: laptop,
                                     to: SocketAddress(lab.serverInner, port: 5006), in: lab.server,
                                     interval: self == .betterPath ? .milliseconds(2) : .milliseconds(20))
        defer { probes.stop() }
        guard lab.waitFor(seconds: 10, { probes.firstEcho(after: LabClock.now - .seconds(1)) != nil }) else {
            throw NamespaceLab.Failure(description: "no echo through the tunnel: \(lab.log("client.log"))")
        }
        let stream = tcp ? try TCPStream(to: SocketAddress(lab.serverInner, port: 5007), listenerIn: lab.server, from: laptop) : nil
        // Through a path that loses big packets, both ways matter: the server learns from the
        // client what its path carries.
        let download = tcp && self == .mtuBlackHole
            ? try TCPStream(to: SocketAddress(lab.clientInner, port: 5008), listenerIn: laptop, from: lab.server) : nil
        usleep(500_000)
        let tunnelBefore = lab.tunnelSnapshot()
        let attemptsBefore = lab.attempts()
        let cpuBefore = lab.clientCPU()
        let start = LabClock.now
        var measuredFrom = start
        var moved: Duration?
        var attemptsWhileOffline: Int?
        var adapted: Duration?
        let eth0 = lab.serverIndex(of: "eth-l")

        switch self {
        case .steady:
            usleep(20_000_000)
        case .uplinkLoss:
            try laptop.ip("link set eth0 down")
            usleep(2_000_000)
        case .betterPath:
            try laptop.ip("link set eth0 up")
            let appeared = LabClock.now
            try laptop.ip("route add default via 10.20.0.1 dev eth0 metric 100")
            _ = lab.waitFor(seconds: 2) { tap.packets(where: { $0.interface == eth0 && isProbeStream($0, vpn) && $0.at > appeared }).count > 0 }
            moved = tap.packets(where: { $0.interface == eth0 && isProbeStream($0, vpn) && $0.at > appeared }).first.map { $0.at - appeared }
            usleep(1_500_000)
        case .addressChange:
            try laptop.ip("address add 10.20.0.58/24 dev eth0")
            try laptop.ip("address del 10.20.0.57/24 dev eth0")
            usleep(2_000_000)
        case .addressRefused:
            // A /32 is a primary address of its own: removing the old one promotes nothing, so
            // nothing puts the local route back before the lab does.
            try laptop.batch(["address add 10.20.0.58/32 dev eth0", "route del local 10.20.0.58 dev eth0 table local",
                              "address del 10.20.0.57/24 dev eth0"])
            usleep(400_000)
            try laptop.ip("route add local 10.20.0.58 dev eth0 table local proto kernel scope host src 10.20.0.58")
            usleep(2_000_000)
        case .silentBlackhole:
            try lab.server.nft("add table inet lab")
            try lab.server.nft("add chain inet lab in { type filter hook prerouting priority -300 ; }")
            try lab.server.nft("add rule inet lab in iifname eth-l drop")
            usleep(4_000_000)
        case .flapStorm:
            let end = LabClock.now + .seconds(20)
            var next = LabClock.now
            var up = true
            while LabClock.now < end {
                if up {
                    try laptop.ip("link set eth0 down")
                } else {
                    try laptop.batch(["link set eth0 up", "route add default via 10.20.0.1 dev eth0 metric 100"])
                }
                up.toggle()
                next = next + .milliseconds(250)
                let now = LabClock.now
                if next > now { usleep(UInt32((next - now).nanoseconds / 1000)) }
            }
            usleep(1_000_000)
        case .suspendResume:
            stream?.pause()
            probes.pause()
            lab.suspendClient()
            usleep(300_000)
            try laptop.ip("link del eth0")
            usleep(1_000_000)
            measuredFrom = LabClock.now
            lab.resumeClient()
            probes.resume()
            stream?.resume()
            usleep(2_000_000)
        case .serverRestart:
            lab.stopServer()
            usleep(200_000)
            measuredFrom = try lab.startServer()
            usleep(2_000_000)
        case .bothUplinksDown:
            stream?.pause()
            try laptop.ip("link set eth0 down")
            try laptop.ip("link set wifi0 down")
            usleep(500_000)
            let offlineAttempts = lab.attempts()
            usleep(29_500_000)
            attemptsWhileOffline = difference(lab.attempts(), offlineAttempts)
            try laptop.ip("link set wifi0 up")
            measuredFrom = LabClock.now
            try laptop.ip("route add default via 192.168.1.1 dev wifi0 metric 600")
            stream?.resume()
            usleep(2_000_000)
        case .lossyUplink:
            try dropOnEth0(lab, "numgen random mod 100 < 20")
            usleep(20_000_000)
            try lab.server.nft("delete table inet lab")
            usleep(1_000_000)
        case .udpBlockedLanding:
            try laptop.ip("link set eth0 down")
            _ = waitForStatus(lab, seconds: 5) { $0["path.transport"] == "stream" }
            usleep(2_000_000)
        case .udpReturns:
            try lab.server.nft("delete table inet block")
            let lifted = LabClock.now
            if waitForStatus(lab, seconds: 40, { $0["path.transport"] == "udp" }) { moved = LabClock.now - lifted }
            usleep(1_000_000)
        case .mtuBlackHole:
            try laptop.ip("link set eth0 up")
            let from = LabClock.now
            try laptop.ip("route add default via 10.20.0.1 dev eth0 metric 100")
            if lab.waitFor(seconds: 10, { lab.status()["mtu.tunnel"].flatMap { Int($0) }.map { $0 <= 1220 } ?? false }) {
                adapted = LabClock.now - from
            }
            let rest = from + .seconds(20) - LabClock.now
            if rest > .zero { usleep(UInt32(rest.nanoseconds / 1000)) }
        }

        let end = LabClock.now
        let cpu = lab.clientCPU() - cpuBefore
        let status = lab.status()
        let attempts = difference(status["attempts"].flatMap { Int($0) }, attemptsBefore)
        let interface = status["path.interface"]
        let handshakes = tap.packets(where: { $0.at >= start && isInitiation($0, vpn) }).count
        let (lost, sent) = probes.lost(from: measuredFrom, to: end - .milliseconds(200))
        let outage = probes.outage(from: measuredFrom, to: end)
        var tcpResult = stream.map { $0.finish(within: .seconds(30)) }
        var downloadResult = download.map { $0.finish(within: .seconds(30)) }
        if tcpResult?.failure != nil || downloadResult?.failure != nil {
            // Where a stalled stream's segments went: each end's kernel counters and the tunnel's MTU.
            let drops = lab.log("server.log").split(separator: "\n").filter { $0.contains("drops") }.suffix(2).joined(separator: " / ")
            let counters = "; laptop's TCP counters: \(laptop.tcpDropCounters()); server's: \(lab.server.tcpDropCounters()); "
                + "tunnel MTU \(status["mtu.tunnel"] ?? "-"); client: \(status.filter { $0.key.contains("drop") || $0.key.contains("offload") })"
                + "; laptop's sockets: \(laptop.socketState(port: 5007)); server's: \(lab.server.socketState(port: 5007))"
                + "; gateway's drops: \(drops.isEmpty ? "none logged" : drops)"
            tcpResult?.failure? += counters
            downloadResult?.failure? += counters
        }
        let tunnelAfter = lab.tunnelSnapshot()
        return RoamingOutcome(scenario: self, vpn: vpn, routing: routing, outage: outage, lostProbes: lost, sentProbes: sent,
                              handshakes: handshakes, attempts: attempts, attemptsWhileOffline: attemptsWhileOffline,
                              cpu: cpu, moved: moved, interface: interface, transport: status["path.transport"],
                              tunnelMTU: status["mtu.tunnel"].flatMap { Int($0) }, adapted: adapted, tcp: tcpResult, download: downloadResult,
                              tunnelUntouched: tunnelAfter == tunnelBefore, clientLog: lab.log("client.log"),
                              serverLog: lab.log("server.log"), leaks: leakTap.map { $0.leaks() + (routerLeakTap?.leaks() ?? []) },
                              packetsJudged: (leakTap?.packetsSeen ?? 0) + (routerLeakTap?.packetsSeen ?? 0))
    }
}

/// Polls the agent's status every 100 ms (each look is a process) for up to `seconds` until `condition`.
private func waitForStatus(_ lab: RoamingLab, seconds: Double, _ condition: ([String: String]) -> Bool) -> Bool {
    let end = LabClock.now + .milliseconds(Int64(seconds * 1000))
    while LabClock.now < end {
        if condition(lab.status()) { return true }
        usleep(100_000)
    }
    return false
}

/// The probe stream's datagrams (100-byte payload, 128-byte inner packet) as the tunnel carries them.
private func isProbeStream(_ packet: PacketTap.Packet, _ vpn: TunnelUnderTest) -> Bool {
    guard (128 + 16...128 + 48).contains(packet.payloadLength), packet.head.count >= 2 else { return false }
    return vpn == .roam ? packet.head[1] == 3 : packet.head[0] == 4
}

/// A handshake initiation: Roam's header is version 2 or 3, type 1 (version 3's first part);
/// WireGuard's type is 1 with three zero bytes.
private func isInitiation(_ packet: PacketTap.Packet, _ vpn: TunnelUnderTest) -> Bool {
    guard packet.head.count >= 4 else { return false }
    return vpn == .roam ? [2, 3].contains(packet.head[0]) && packet.head[1] == 1 : packet.head == [1, 0, 0, 0]
}

private func difference(_ a: Int?, _ b: Int?) -> Int? {
    guard let a, let b else { return nil }
    return a - b
}

/// The router drops what crosses the laptop's eth0 and matches `match`, each way (table `inet lab`).
private func dropOnEth0(_ lab: RoamingLab, _ match: String) throws {
    try lab.server.nft("add table inet lab")
    try lab.server.nft("add chain inet lab in { type filter hook prerouting priority -300 ; }")
    try lab.server.nft("add chain inet lab out { type filter hook postrouting priority 300 ; }")
    try lab.server.nft("add rule inet lab in iifname eth-l \(match) drop")
    try lab.server.nft("add rule inet lab out oifname eth-l \(match) drop")
}

