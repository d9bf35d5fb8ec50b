public import Tunnel
public import ControlWire

extension JSON {
    /// The data plane's traffic, as client and server report it; `extra` follows the shared fields.
    public static func traffic(_ t: TrafficCounters, extra: [(String, JSON)] = []) -> JSON {
        .object([("packets_in", .count(t.packetsIn)), ("packets_out", .count(t.packetsOut)),
                 ("bytes_in", .count(t.bytesIn)), ("bytes_out", .count(t.bytesOut)),
                 ("super_packets", .count(t.superPackets)), ("super_packets_written", .count(t.superPacketsWritten)),
                 ("too_big", .count(t.tooBig)), ("too_big_answered", .count(t.tooBigAnswered))] + extra)
    }

    /// Drops: the total, `extra`, the offload drops, then the causes that dropped anything.
    public static func drops(_ drops: DropCounters, _ t: TrafficCounters, extra: [(String, JSON)] = []) -> JSON {
        .object([("total", .count(drops.total))] + extra + [
            ("offload", .count(t.offloadDrops)),
            ("by_cause", .object(DropReason.allCases.filter { drops[$0] > 0 }.map { ("\($0)", .count(drops[$0])) })),
        ])
    }
}
