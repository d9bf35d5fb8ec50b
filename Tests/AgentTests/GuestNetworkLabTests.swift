import Foundation
import Glibc
import NamespaceLab
import Basics
import Device
import Testing

/// A container behind a bridge on the laptop, set up as Docker sets one up (a bridge with the
/// host's address, a veth into the container's namespace, forwarding on, and the container's
/// subnet masqueraded on its way out), with the full tunnel and the lockdown on: what it sends
/// beyond the laptop goes only into the tunnel, it reaches the laptop's services on the bridge
/// (a resolver there, as libvirt's dnsmasq and Podman's aardvark-dns are) and the laptop reaches
/// it (a published port); nothing leaves an uplink in clear.
@Suite(.enabled(if: NamespaceLab.isRoot, Comment(rawValue: NamespaceLab.skipReason)), .serialized)
struct GuestNetworkLabTests {
    @Test func aContainersTrafficGoesIntoTheTunnelAndItsBridgeStaysOpen() throws {
        let lab = try RoamingLab(vpn: .roam, routing: .full)
        let container = try NamespaceLab()
        try lab.laptop.batch([
            "link add br-guest type bridge",
            "link add veth-guest type veth peer name eth0 netns \(container.name)",
            "link set veth-guest master br-guest",
            "address add 172.18.0.1/16 dev br-guest",
            "link set br-guest up",
            "link set veth-guest up",
        ])
        try container.batch(["address add 172.18.0.2/16 dev eth0", "link set eth0 up", "route add default via 172.18.0.1"])
        let forwarding = try NamespaceLab.capture(NamespaceLab.ipTool, ["netns", "exec", lab.laptop.name, "sysctl", "-qw", "net.ipv4.ip_forward=1"])
        try #require(forwarding.status == 0, "\(forwarding.output)")
        let nat = try NamespaceLab.capture(NamespaceLab.ipTool, ["netns", "exec", lab.laptop.name, "nft",
            "add table ip guestnat; add chain ip guestnat post { type nat hook postrouting priority srcnat; }; "
            + "add rule ip guestnat post ip saddr 172.18.0.0/16 oifname != \"br-guest\" masquerade"])
        try #require(nat.status == 0, "\(nat.output)")
        try container.setResolvConf("nameserver 172.18.0.1\n")

        try lab.startServer()
        let tap = try lab.leakTap()
        try lab.startClient()
        #expect(lab.wait(for: "msg=\"guest networks\" bridges=\"br-guest 172.18.0.0/16\"", in: "client.log"), "\(lab.log("client.log"))")
        let bait = try LeakBait(from: container, targets: [SocketAddress(IPAddress("198.51.100.7")!, port: 9999),
                                                           SocketAddress(IPAddress("10.20.0.1")!, port: 53),
                                                           SocketAddress(IPAddress("192.168.1.1")!, port: 80)])
        defer { bait.stop() }

        // Beyond the laptop: through the tunnel, with the laptop's inner address.
        let beyond = try ProbeStream(from: SocketAddress(IPAddress("172.18.0.2")!, port: 0), in: container,
                                     to: SocketAddress(lab.serverInner, port: 5010), in: lab.server)
        defer { beyond.stop() }
        // The laptop's own service on the bridge, and the laptop to the container.
        let toHost = try ProbeStream(from: SocketAddress(IPAddress("172.18.0.2")!, port: 0), in: container,
                                     to: SocketAddress(IPAddress("172.18.0.1")!, port: 5011), in: lab.laptop)
        defer { toHost.stop() }
        let toGuest = try ProbeStream(from: SocketAddress(IPAddress("172.18.0.1")!, port: 0), in: lab.laptop,
                                      to: SocketAddress(IPAddress("172.18.0.2")!, port: 5012), in: container)
        defer { toGuest.stop() }
        let resolver = try LabResolver(at: IPAddress("172.18.0.1")!, in: lab.laptop, names: ["nas.home.example": IPAddress("10.77.9.9")!])
        defer { resolver.stop() }

        let start = LabClock.now
        usleep(1_500_000)
        let end = LabClock.now
        for (what, probes) in [("beyond, through the tunnel", beyond), ("to the laptop on the bridge", toHost),
                               ("from the laptop to the container", toGuest)] {
            let (lost, sent) = probes.lost(from: start, to: end - .milliseconds(200))
            #expect(sent >= 40 && lost * 10 <= sent, "\(what): \(sent - lost) of \(sent) came back")
        }
        let answer = try NamespaceLab.capture(NamespaceLab.ipTool, ["netns", "exec", container.name, "getent", "ahostsv4", "nas.home.example"]).output
        #expect(answer.contains("10.77.9.9"), "the container's name look-up through the laptop's resolver: \(answer)")
        #expect(tap.leaks().isEmpty, "leaks: \(tap.leaks())")
        let status = lab.status()
        #expect((Int(status["lockdown.blocked.forward"] ?? "") ?? 0) > 0, "the container's packets to the LAN are stopped: \(status)")
        // Address pools stay free: nothing of the tunnel's is in the main table, where Docker
        // and Podman look for a free subnet for a new network.
        #expect(!(try lab.laptop.ip("route show table main")).contains("roam0"))
    }
}
