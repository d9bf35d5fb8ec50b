public import Basics

/// Where the HTTP proxy is on each network the machine is on, when the configuration names it by
/// host. Kept by `AgentCore`; pure.
///
/// A proxy's name is usually the local network's own (its DHCP search domain, its split-horizon
/// DNS): it is looked up on each network, over that network's uplink, and the lockdown lets the
/// agent's streams reach the addresses those look-ups gave and nothing else. No stream is tried
/// on a network before its look-up answered and the lockdown let the answer through. Only the
/// networks the machine is on now are kept: one it left is forgotten, so a network that comes
/// back, or another that looks the same (the same interface and gateway address at a café as at
/// the office), is asked afresh, and a proxy's password never goes to an address another
/// network's answer gave.
public struct ProxyBook: Equatable, Sendable {
    public struct Entry: Equatable, Sendable {
        /// The address streams on this network go to, once the lockdown let it through.
        public var address: IPAddress?
        /// A look-up on this network is out.
        public var asking = false
        /// The address the lockdown is being asked to let through.
        public var proposed: IPAddress?
    }

    /// What a look-up of the name on a network gave.
    public enum Answer: Equatable, Sendable {
        /// The address that network's streams go to.
        case address(IPAddress)
        /// The name has no usable address there (it does not exist, has none of the path's
        /// family, or only ones no stream may go to): what was known there is forgotten.
        case none
        /// No answer (no name server answered in time): what was known stays.
        case noAnswer
    }

    public private(set) var networks: [NetworkKey: Entry] = [:]
    /// At most this many networks are asked about (and as many addresses let through).
    public static let networksKept = 8

    public init() {}

    public subscript(key: NetworkKey) -> Entry? { networks[key] }

    /// Each network's address that streams may reach: those the lockdown let through, and those
    /// it is being asked to.
    public var lockdown: [NetworkKey: IPAddress] { networks.compactMapValues { $0.proposed ?? $0.address } }

    /// The networks a stream can open on: those with an address the lockdown lets through.
    public var reachable: Set<NetworkKey> { Set(networks.compactMap { $0.value.address == nil ? nil : $0.key }) }

    /// Forgets every network but `current`: true when an address left what the lockdown holds.
    mutating func keep(only current: Set<NetworkKey>) -> Bool {
        let gone = networks.keys.filter { !current.contains($0) }
        let had = gone.contains { networks[$0]?.address != nil || networks[$0]?.proposed != nil }
        for key in gone { networks[key] = nil }
        return had
    }

    /// Asks for a look-up on `key`'s network: true when one should start now (none is out there,
    /// and fewer than `networksKept` networks are kept).
    mutating func ask(_ key: NetworkKey) -> Bool {
        if let entry = networks[key] {
            guard !entry.asking else { return false }
        } else if networks.count >= Self.networksKept {
            return false
        }
        networks[key, default: Entry()].asking = true
        return true
    }

    /// What changes when a look-up on `key`'s network answered: an address to let through (an
    /// opening, which the lockdown answers), one to take out (a closing), or nothing.
    enum Change: Equatable { case open(IPAddress), close }

    mutating func answered(_ key: NetworkKey, _ answer: Answer) -> Change? {
        guard var entry = networks[key] else { return nil }  // a network left since
        entry.asking = false
        defer { networks[key] = entry }
        switch answer {
        case .noAnswer:
            return nil
        case .none:
            guard entry.address != nil || entry.proposed != nil else { return nil }
            entry.address = nil
            entry.proposed = nil
            return .close
        case .address(let address):
            guard address != entry.address else { return nil }
            entry.proposed = address
            return .open(address)
        }
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
