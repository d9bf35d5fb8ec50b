public import Topology
public import Basics

/// A network as the transport rules recognise it: the interface it is reached through and its
/// gateway's address (the source address, for a network reached without a gateway).
///
/// Why these: they are what the core always has, from the route every path comes with. A
/// network's Wi-Fi name and its gateway's hardware address are stabler still, but the core
/// learns them only when on-demand rules ask the runner for them (a read per network); the
/// on-demand judge's `Network` (a path ID and a gateway) holds the link's index, which changes
/// when a USB adapter is plugged in again, and the DHCP lease's address, which changes with
/// leases. Interface names are stable (udev's predictable names) and a network's gateway
/// address is its own. Two networks that share both (two home routers at 192.168.1.1 on one
/// Wi-Fi card) share one verdict: that costs at most the first attempt's transport, which the
/// race or the UDP re-test corrects, and their answers correct the verdict.
public struct NetworkKey: Hashable, Sendable, Comparable, CustomStringConvertible {
    public var interface: String
    public var gateway: IPAddress

    public init(interface: String, gateway: IPAddress) {
        self.interface = interface
        self.gateway = gateway
    }

    /// The network `path` is on.
    public init(_ path: Path) {
        self.init(interface: path.interface, gateway: path.gateway ?? path.source)
    }

    public var description: String { "\(interface) via \(gateway)" }

    public static func < (a: NetworkKey, b: NetworkKey) -> Bool {
        (a.interface, a.gateway.description) < (b.interface, b.gateway.description)
    }
}

/// What is known of UDP on one network (nothing known: no entry).
public enum UDPVerdict: String, Hashable, Sendable {
    /// The server answered over UDP there: UDP first, as everywhere.
    case answers
    /// UDP went unanswered while the stream over the same uplink answered: the stream first.
    case blocked
}

/// What the core knows of each network's transports, kept across restarts of the agent
/// (`Reconnector.Memory`). At most `capacity` networks; the one learnt of longest ago goes first.
public struct TransportBook: Sendable, Equatable {
    public private(set) var networks: [NetworkKey: UDPVerdict] = [:]
    /// Least recently learnt first.
    private var order: [NetworkKey] = []
    public static let capacity = 64

    public init() {}

    public subscript(key: NetworkKey) -> UDPVerdict? { networks[key] }

    /// Records what the last answer (or silence) showed of UDP on `key`'s network.
    public mutating func learn(_ verdict: UDPVerdict, for key: NetworkKey) {
        guard networks[key] != verdict else { return }
        networks[key] = verdict
        order.removeAll { $0 == key }
        order.append(key)
        if order.count > Self.capacity { networks[order.removeFirst()] = nil }
    }

    /// Forgets `key`'s network (a captive portal was found there: its silence was the portal's).
    public mutating func forget(_ key: NetworkKey) {
        guard networks.removeValue(forKey: key) != nil else { return }
        order.removeAll { $0 == key }
    }

    /// The verdicts, least recently learnt first (the order `Memory` keeps them in).
    public var entries: [(NetworkKey, UDPVerdict)] { order.compactMap { key in networks[key].map { (key, $0) } } }
}

/// Which transport carries the session and what each known network blocks: for the runner's
/// status and metrics.
public struct TransportStatus: Sendable, Equatable {
    /// The transport of the session's path (nil: no path).
    public var transport: Transport?
    /// The interface of the session's path.
    public var interface: String?
    /// Every network whose UDP is known, sorted by interface and gateway.
    public var networks: [Network]

    public struct Network: Sendable, Equatable {
        public var key: NetworkKey
        public var udp: UDPVerdict
    }
}
