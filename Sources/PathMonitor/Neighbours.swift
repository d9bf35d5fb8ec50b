public import Topology
public import Basics
import CMnl
import Glibc
public import Netlink

/// The kernel's state for a neighbour entry (`NUD_*`); an entry is in one of them.
public struct NeighbourState: OptionSet, Hashable, Sendable {
    public let rawValue: UInt16
    public init(rawValue: UInt16) { self.rawValue = rawValue }
    /// Resolution is under way: asked, no answer yet.
    public static let incomplete = NeighbourState(rawValue: 0x01)
    /// The neighbour answered recently.
    public static let reachable = NeighbourState(rawValue: 0x02)
    /// Known, but not confirmed lately; used, and checked again when traffic goes to it.
    public static let stale = NeighbourState(rawValue: 0x04)
    /// Used while stale; the kernel waits for confirmation before probing.
    public static let delay = NeighbourState(rawValue: 0x08)
    /// Being probed by unicast after a delay.
    public static let probe = NeighbourState(rawValue: 0x10)
    /// Resolution failed: no answer.
    public static let failed = NeighbourState(rawValue: 0x20)
    /// The link needs no resolution (point-to-point, multicast, loopback).
    public static let noARP = NeighbourState(rawValue: 0x40)
    /// Configured by an administrator; never expires.
    public static let permanent = NeighbourState(rawValue: 0x80)

    /// The kernel would send to the entry's link-layer address as it stands (`NUD_VALID`).
    public var isValid: Bool { !isDisjoint(with: [.reachable, .stale, .delay, .probe, .noARP, .permanent]) }
}

/// One entry of the kernel's neighbour table (ARP for IPv4, neighbour discovery for IPv6).
public struct Neighbour: Hashable, Sendable {
    /// The link the neighbour is on.
    public var linkIndex: Int32
    /// The neighbour's IP address.
    public var address: IPAddress
    /// Its link-layer address, when the kernel has one (not while incomplete or failed).
    public var hardwareAddress: HardwareAddress?
    /// How far the kernel trusts `hardwareAddress`.
    public var state: NeighbourState

    /// An entry as the kernel reports it.
    public init(linkIndex: Int32, address: IPAddress, hardwareAddress: HardwareAddress?, state: NeighbourState) {
        self.linkIndex = linkIndex
        self.address = address
        self.hardwareAddress = hardwareAddress
        self.state = state
    }

    /// The link-layer address a frame to this neighbour would carry now; nil when there is
    /// none or the kernel does not vouch for it.
    public var usableHardwareAddress: HardwareAddress? { state.isValid ? hardwareAddress : nil }
}

extension NetlinkDecoder {
    /// Decodes one `RTM_NEWNEIGH` message (header included: `struct ndmsg`, then `NDA_*`
    /// attributes); nil for any other message, a family other than IPv4 or IPv6, or bytes that
    /// do not hold together.
    static func neighbour(_ message: some Collection<UInt8>) -> Neighbour? {
        let b = Array(message)
        // nlmsghdr (16) + ndmsg: family u8, pad u8, pad u16, ifindex s32, state u16, flags u8, type u8.
        guard b.count >= 28, b.u16(4) == RTM.newNeighbour else { return nil }
        let length = Int(b.u32(0))
        guard (28...b.count).contains(length) else { return nil }
        let family = b[16]
        let linkIndex = Int32(bitPattern: b.u32(20))
        let state = NeighbourState(rawValue: b.u16(24))
        guard family == AF.inet || family == AF.inet6, linkIndex > 0 else { return nil }
        var address: IPAddress?
        var hardwareAddress: HardwareAddress?
        guard attributes(b, 28..<length, { type, value in
            switch type {
            case NDA.destination: address = IPAddress(bytes: b[value])
            case NDA.linkLayerAddress: hardwareAddress = HardwareAddress(bytes: b[value])
            default: break
            }
        }), let address, address.family == (family == AF.inet ? .v4 : .v6) else { return nil }
        return Neighbour(linkIndex: linkIndex, address: address, hardwareAddress: hardwareAddress, state: state)
    }
}

extension NetlinkSocket {
    /// Every entry of the kernel's neighbour table for `family` (`RTM_GETNEIGH` dump).
    public func neighbours(family: IPAddress.Family) throws(NetlinkError) -> [Neighbour] {
        let seq = try request(type: RTM.getNeighbour, flags: UInt16(NLM_F_DUMP), header: Self.header(family, 0))
        var found: [Neighbour] = []
        try answers(to: seq, "dump \(family) neighbours") { buffer, message in
            if let neighbour = NetlinkDecoder.neighbour(buffer[message.bytes]) { found.append(neighbour) }
        }
        return found
    }

    /// The kernel's entry for `address` on link `linkIndex`; nil when it has none.
    public func neighbour(of address: IPAddress, linkIndex: Int32) throws(NetlinkError) -> Neighbour? {
        let what = "look up neighbour \(address) on link \(linkIndex)"
        let seq = try request(type: RTM.getNeighbour, flags: UInt16(NLM_F_ACK), header: Self.header(address.family, linkIndex)) { nlh in
            Self.putDestination(address, nlh)
        }
        var found: Neighbour?
        do throws(NetlinkError) {
            try answers(to: seq, what) { buffer, message in
                if let neighbour = NetlinkDecoder.neighbour(buffer[message.bytes]) { found = neighbour }
            }
        } catch {
            if error.code == ENOENT { return nil }
            throw error
        }
        return found
    }

    /// Asks the kernel to resolve `address` on link `linkIndex` now (an ARP request or a
    /// neighbour solicitation) without sending any IP packet, so the gateway's link-layer
    /// address is known before traffic needs it; the answer shows in `neighbour(of:linkIndex:)`.
    /// An entry an administrator made permanent is left alone: it is resolved already.
    public func resolve(_ address: IPAddress, linkIndex: Int32) throws(NetlinkError) {
        // NTF_USE would also clear NUD_PERMANENT (__neigh_update), making a static entry dynamic.
        if try neighbour(of: address, linkIndex: linkIndex)?.state.contains(.permanent) == true { return }
        // RTM_NEWNEIGH with NTF_USE: neigh_add creates the entry if missing (NLM_F_CREATE), keeps
        // its state (ndm_state is ignored) and calls neigh_event_send, which sends the probe.
        var header = Self.header(address.family, linkIndex)
        header[10] = 0x01  // ndm_flags: NTF_USE
        let seq = try request(type: RTM.newNeighbour, flags: UInt16(NLM_F_CREATE | NLM_F_ACK), header: header) { nlh in
            Self.putDestination(address, nlh)
        }
        try answers(to: seq, "resolve \(address) on link \(linkIndex)")
    }

    /// `struct ndmsg` for `family` on link `linkIndex` (0: any), state and flags 0.
    private static func header(_ family: IPAddress.Family, _ linkIndex: Int32) -> [UInt8] {
        var header = [UInt8](repeating: 0, count: 12)
        header[0] = family == .v4 ? AF.inet : AF.inet6
        header.store(UInt32(bitPattern: linkIndex), at: 4)
        return header
    }

    private static func putDestination(_ address: IPAddress, _ nlh: UnsafeMutablePointer<nlmsghdr>) {
        let bytes = address.bytes
        bytes.withUnsafeBytes { mnl_attr_put(nlh, NDA.destination, bytes.count, $0.baseAddress) }
    }
}

// linux/neighbour.h: neighbour attributes.
private enum NDA { static let destination: UInt16 = 1, linkLayerAddress: UInt16 = 2 }

/// Follows the kernel's neighbour table (`RTMGRP_NEIGH`): entries learned or changed, so a
/// gateway's hardware address is known the moment the kernel learns it, and a new one at once.
public final class NeighbourEvents {
    private let socket: NetlinkSocket

    /// Subscribes in the calling thread's network namespace.
    public init() throws(NetlinkError) {
        socket = try NetlinkSocket(groups: .neighbour, receiveBuffer: 1 << 20)
    }

    /// The socket to poll for readiness.
    public var fileDescriptor: Int32 { socket.fileDescriptor }

    /// What arrived, without waiting.
    public enum Notice: Equatable, Sendable {
        /// An entry as it stands now (`RTM_NEWNEIGH`); removals are not notices: the kernel
        /// forgetting an entry says nothing about the network.
        case entry(Neighbour)
        /// Notices were lost (the queue overran): any entry may have changed.
        case lost
    }

    /// Reads what is queued, without waiting.
    public func take() -> [Notice] {
        var notices: [Notice] = []
        let lost = socket.takeQueued { message in
            if let entry = NetlinkDecoder.neighbour(message) { notices.append(.entry(entry)) }
        }
        return lost ? [.lost] + notices : notices
    }
}
