import Foundation

/// A router between the laptop's `eth0` and the server whose two links run at a small MTU while
/// the laptop and the server each see 1,500 on their side, and which says nothing of what it
/// drops: no ICMP "fragmentation needed" or "packet too big" leaves it (the path MTU black
/// hole of a PPPoE line, an LTE bearer or a tunnel inside a hotel's network). Packets too big
/// for a link vanish as a real router's would, each datagram of a segmentation-offload batch
/// judged alone (the kernel's forwarding checks every segment against the link's MTU); those
/// that may be fragmented are, and the fragments are dropped on the way out, as many networks
/// drop them. So nothing bigger than the link passes, whatever its don't-fragment bit says (a
/// batch of UDP datagrams goes out without it).
///
/// It replaces the lab's direct `eth0`/`eth-l` link: `eth0` (10.20.0.57/24, fd00:20::57/64, down,
/// no route) meets the router's `lan` (10.20.0.1, fd00:20::1), whose `wan` (10.21.0.2,
/// fd00:21::2) meets the server's `eth-l` (10.21.0.1, fd00:21::1). The server's side keeps its
/// interface names, so taps on `eth-l` still tell which uplink a packet came from.
public final class SilentRouter {
    public let lab: NamespaceLab
    public let mtu: Int

    public init(between laptop: NamespaceLab, and server: NamespaceLab, mtu: Int) throws {
        lab = try NamespaceLab()
        self.mtu = mtu
        try laptop.ip("link del eth0")
        try laptop.ip("link add eth0 type veth peer name lan netns \(lab.name)")
        try laptop.ip("address add 10.20.0.57/24 dev eth0")
        try laptop.ip("address add fd00:20::57/64 dev eth0 nodad")
        try lab.ip("link add wan type veth peer name eth-l netns \(server.name)")
        try lab.batch([
            "address add 10.20.0.1/24 dev lan", "address add fd00:20::1/64 dev lan nodad",
            "address add 10.21.0.2/24 dev wan", "address add fd00:21::2/64 dev wan nodad",
            "link set lan mtu \(mtu) up", "link set wan mtu \(mtu) up",
            "route add default via 10.21.0.1 dev wan", "route add ::/0 via fd00:21::1 dev wan",
        ])
        try server.batch([
            "address add 10.21.0.1/24 dev eth-l", "address add fd00:21::1/64 dev eth-l nodad", "link set eth-l up",
            "route add 10.20.0.0/24 via 10.21.0.2 dev eth-l", "route add fd00:20::/64 via fd00:21::2 dev eth-l",
        ])
        for setting in ["net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"] {
            _ = try NamespaceLab.ip(["netns", "exec", lab.name, "sysctl", "-qw", setting])
        }
        let rules = """
            table inet silent {
                chain out {
                    type filter hook output priority 0; policy accept;
                    icmp type destination-unreachable icmp code frag-needed drop
                    icmpv6 type packet-too-big drop
                }
            }
            table netdev silent-lan {
                chain out { type filter hook egress device "lan" priority 0; ip frag-off & 0x3fff != 0 drop; }
            }
            table netdev silent-wan {
                chain out { type filter hook egress device "wan" priority 0; ip frag-off & 0x3fff != 0 drop; }
            }
            """
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("silent-\(lab.name).nft").path
        try rules.write(toFile: file, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: file) }
        let (status, output) = try NamespaceLab.capture(NamespaceLab.ipTool, ["netns", "exec", lab.name, "nft", "-f", file])
        guard status == 0 else { throw NamespaceLab.Failure(description: "nft in the router: \(output)") }
    }
}
