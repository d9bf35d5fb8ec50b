import Basics
import Glibc
import Device

/// Data-plane counters an operator reads in status.
public struct TrafficCounters: Sendable, Equatable {
    public var packetsIn = 0
    public var packetsOut = 0
    public var bytesIn = 0
    public var bytesOut = 0
    /// Inner packets dropped because no session could carry them (down, or no such peer).
    public var noSession = 0
    /// Datagrams the kernel had no room for.
    public var sendFailures = 0
    /// Keepalives received: authenticated, empty.
    public var keepalivesIn = 0
    /// Handshake initiations dropped because the server's handshake queue was full.
    public var initiationsOverflowed = 0
    /// TCP super-packets from the TUN device cut into segments (TSO).
    public var superPackets = 0
    /// Packets from the TUN device dropped whole because their offload metadata cannot be right.
    public var offloadDrops = 0
    /// Super-packets written to the TUN device, each several segments of one TCP flow joined.
    public var superPacketsWritten = 0
    /// Packets bigger than their client's path carries (`SealFailure.tooBig`): answered as a
    /// router would (`PacketTooBig`), or dropped when they may not be answered.
    public var tooBig = 0
    /// Of those, the answers written back into the tunnel device.
    public var tooBigAnswered = 0
    public init() {}

    /// Adds another thread's counts.
    mutating func add(_ other: TrafficCounters) {
        packetsIn += other.packetsIn
        packetsOut += other.packetsOut
        bytesIn += other.bytesIn
        bytesOut += other.bytesOut
        noSession += other.noSession
        sendFailures += other.sendFailures
        keepalivesIn += other.keepalivesIn
        initiationsOverflowed += other.initiationsOverflowed
        superPackets += other.superPackets
        offloadDrops += other.offloadDrops
        superPacketsWritten += other.superPacketsWritten
        tooBig += other.tooBig
        tooBigAnswered += other.tooBigAnswered
    }

    /// Takes the counts a TUN reader kept of what it cut and dropped since the last time.
    mutating func record(_ reader: inout TunReader) {
        superPackets += reader.superPackets
        offloadDrops += reader.dropped.values.reduce(0, +)
        reader.resetCounts()
    }
}
