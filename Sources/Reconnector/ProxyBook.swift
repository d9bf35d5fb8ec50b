public import Basics

/// Where the HTTP proxy is on each network, when the configuration names it by host. Kept by
/// `AgentCore`; pure.
///
/// A proxy's name is usually the local network's own (its DHCP search domain, its split-horizon
/// DNS): it is looked up on each network the machine is on, over that network's uplink, and the
/// lockdown lets the agent's streams reach the addresses those look-ups gave and nothing else.
/// No stream is tried on a network before its look-up answered and the lockdown let the answer
/// through. A network's name is asked again when a stream through the proxy fails there, after
/// a wake, and every `ServerBook.lookUpEvery` while the agent backs off on a network with none.
public struct ProxyBook: Equatable, Sendable {
    public struct Entry: Equatable, Sendable {
        /// The address streams on this network go to, once the lockdown let it through.
        public var address: IPAddress?
        /// A look-up on this network is out.
        public var asking = false
        /// The address the lockdown is being asked to let through.
        public var proposed: IPAddress?
    }

    public private(set) var networks: [NetworkKey: Entry] = [:]
    /// The networks asked about, least recently first.
    private var order: [NetworkKey] = []
    /// At most this many networks are remembered (and as many addresses let through); the one
    /// asked about longest ago goes first.
    public static let networksKept = 8

    public init() {}

    public subscript(key: NetworkKey) -> Entry? { networks[key] }

    /// The networks a stream can open on: those with an address the lockdown lets through.
    public var reachable: Set<NetworkKey> { Set(networks.compactMap { $0.value.address == nil ? nil : $0.key }) }

    /// Asks for a look-up on `key`'s network: true when one should start now (none is out there).
    mutating func ask(_ key: NetworkKey) -> Bool {
        guard networks[key]?.asking != true else { return false }
        networks[key, default: Entry()].asking = true
        order.removeAll { $0 == key }
        order.append(key)
        if order.count > Self.networksKept, let oldest = order.first(where: { networks[$0]?.asking != true }) {
            order.removeAll { $0 == oldest }
            networks[oldest] = nil
        }
        return true
    }

    /// The look-up on `key`'s network answered with `address` to use there (nil: nothing usable,
    /// and what was known stays). What the lockdown should let through, when it must change.
    mutating func answered(_ key: NetworkKey, _ address: IPAddress?) -> [IPAddress]? {
        guard var entry = networks[key] else { return nil }
        entry.asking = false
        defer { networks[key] = entry }
        guard let address, address != entry.address else { return nil }
        entry.proposed = address
        return lockdown(with: address, on: key)
    }

    /// The addresses the lockdown lets through once `key`'s network is at `address`: every
    /// network's, that one's new one in place of its old.
    private func lockdown(with address: IPAddress, on key: NetworkKey) -> [IPAddress] {
        var all: [IPAddress] = []
        for other in order {
            let entry = other == key ? address : networks[other]?.address
            if let entry, !all.contains(entry) { all.append(entry) }
        }
        return all
    }

    /// The lockdown said whether it lets the streams reach `address` on `key`'s network: true
    /// when the networks a stream can open on changed.
    mutating func allowed(_ key: NetworkKey, _ address: IPAddress, _ ok: Bool) -> Bool {
        guard var entry = networks[key], entry.proposed == address else { return false }
        entry.proposed = nil
        let before = entry.address
        if ok { entry.address = address }
        networks[key] = entry
        return (before == nil) != (entry.address == nil)
    }
}
