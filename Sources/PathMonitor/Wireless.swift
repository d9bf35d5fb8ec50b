public import Topology
import Basics
import CMnl
import Glibc
public import Netlink

/// What the kernel says about a link's Wi-Fi association.
public enum WirelessLookup: Equatable, Sendable {
    /// A Wi-Fi client link, associated to the network with this name.
    case ssid(SSID)
    /// A Wi-Fi link associated to no network, or one that joins none as a client (an access
    /// point, a monitor).
    case notAssociated
    /// Not a Wi-Fi link, or a kernel without Wi-Fi (no nl80211).
    case notWireless
    /// The kernel could not be asked.
    case failed(NetlinkError)
}

/// The Wi-Fi network a link is on, asked of the kernel's nl80211 over generic netlink.
public enum Wireless {
    /// The Wi-Fi network link `index` is associated to, in the calling thread's network
    /// namespace. A kernel without Wi-Fi, or a link that is not Wi-Fi, is an answer, not an error.
    public static func ssid(ofInterface index: Int32) -> WirelessLookup {
        do throws(NetlinkError) {
            let socket = try NetlinkSocket(protocol: NETLINK_GENERIC)
            let family = try socket.genericFamily(named: "nl80211").id
            let what = "get Wi-Fi interface \(index)"
            let seq = try socket.request(type: family, flags: UInt16(NLM_F_ACK), header: [NL80211.getInterface, 1, 0, 0]) { nlh in
                mnl_attr_put_u32(nlh, NL80211.interfaceIndex, UInt32(bitPattern: index))
            }
            var found: Interface?
            try socket.answers(to: seq, what) { buffer, message in
                if let interface = interface(buffer[message.bytes], family: family), interface.index == index { found = interface }
            }
            guard let found else { return .failed(NetlinkError(what, EPROTO)) }
            return lookup(found)
        } catch {
            return lookup(refusal: error)
        }
    }

    /// What the lookup needs of an `NL80211_CMD_NEW_INTERFACE` message.
    struct Interface: Equatable {
        var index: Int32
        /// `enum nl80211_iftype`.
        var type: UInt32
        /// Present while associated.
        var ssid: SSID?
    }

    /// An interface's answer: its network's name, for a link that joins one as a client.
    static func lookup(_ interface: Interface) -> WirelessLookup {
        guard NL80211.clientTypes.contains(interface.type), let ssid = interface.ssid, !ssid.bytes.isEmpty else {
            return .notAssociated
        }
        return .ssid(ssid)
    }

    /// A refusal's answer: no nl80211 family (`ENOENT`), or a link that is not Wi-Fi (`ENODEV`;
    /// `EOPNOTSUPP`; `EINVAL` from older kernels), says the link is not wireless.
    static func lookup(refusal error: NetlinkError) -> WirelessLookup {
        [ENOENT, ENODEV, EOPNOTSUPP, EINVAL].contains(error.code) ? .notWireless : .failed(error)
    }

    /// A generic netlink family as the controller describes it.
    struct Family: Equatable {
        var id: UInt16
        var name: String
        /// Its multicast groups: name and the id to join.
        var groups: [String: UInt32]
    }

    /// The family a `CTRL_CMD_NEWFAMILY` message describes (the answer to `CTRL_CMD_GETFAMILY`,
    /// or the controller's notice of a family registered since), or with `removed` the one a
    /// `CTRL_CMD_DELFAMILY` notice names; nil for anything else.
    static func family(_ message: some Collection<UInt8>, removed: Bool = false) -> Family? {
        let command = removed ? CTRL.deleteFamily : CTRL.newFamily
        guard case let (b, attributes)? = generic(message, family: CTRL.controller, commands: [command]) else { return nil }
        var id: UInt16?
        var name = ""
        var groups: [String: UInt32] = [:]
        var whole = true
        guard NetlinkDecoder.attributes(b, attributes, { type, value in
            switch type {
            case CTRL.familyIdentifier: if value.count >= 2 { id = b.u16(value.lowerBound) }
            case CTRL.familyName: name = b.cString(value)
            case CTRL.multicastGroups:
                // A nested array: each element nests a group's name and id.
                whole = whole && NetlinkDecoder.attributes(b, value) { _, element in
                    var groupName: String?
                    var groupID: UInt32?
                    whole = whole && NetlinkDecoder.attributes(b, element) { field, v in
                        if field == CTRL.groupName { groupName = b.cString(v) }
                        if field == CTRL.groupIdentifier, v.count >= 4 { groupID = b.u32(v.lowerBound) }
                    }
                    if let groupName, let groupID { groups[groupName] = groupID }
                }
            default: break
            }
        }), whole, let id else { return nil }
        return Family(id: id, name: name, groups: groups)
    }

    /// The link an nl80211 notice of the `mlme` group is about, when it may change which
    /// network the link is on: a connection made, a roam to another access point, a
    /// disconnection, a port authorised. Nil for any other message.
    static func associationChange(_ message: some Collection<UInt8>, family: UInt16) -> Int32? {
        guard case let (b, attributes)? = generic(message, family: family, commands: NL80211.associationCommands) else { return nil }
        var index: Int32?
        guard NetlinkDecoder.attributes(b, attributes, { attribute, value in
            if attribute == NL80211.interfaceIndex, value.count >= 4 { index = Int32(bitPattern: b.u32(value.lowerBound)) }
        }) else { return nil }
        return index
    }

    /// Decodes one whole `NL80211_CMD_NEW_INTERFACE` message of nl80211's `family` id; nil for
    /// anything else, or when the index or type is missing or the SSID is too long.
    static func interface(_ message: some Collection<UInt8>, family: UInt16) -> Interface? {
        guard case let (b, attributes)? = generic(message, family: family, commands: [NL80211.newInterface]) else { return nil }
        var index: Int32?
        var type: UInt32?
        var ssid: SSID?
        var ssidFits = true
        guard NetlinkDecoder.attributes(b, attributes, { attribute, value in
            switch attribute {
            case NL80211.interfaceIndex: if value.count >= 4 { index = Int32(bitPattern: b.u32(value.lowerBound)) }
            case NL80211.interfaceType: if value.count >= 4 { type = b.u32(value.lowerBound) }
            case NL80211.ssid:
                ssid = SSID(bytes: b[value])
                ssidFits = ssid != nil
            default: break
            }
        }), ssidFits, let index, let type else { return nil }
        return Interface(index: index, type: type, ssid: ssid)
    }

    /// A generic netlink message of `family` carrying one of `commands`: its bytes, and where its
    /// attributes lie after the headers (`nlmsghdr`, then `genlmsghdr`: cmd, version, reserved).
    private static func generic(_ message: some Collection<UInt8>, family: UInt16, commands: [UInt8])
        -> ([UInt8], Range<Int>)?
    {
        let b = Array(message)
        guard b.count >= 20 else { return nil }
        let length = Int(b.u32(0))
        guard (20...b.count).contains(length), b.u16(4) == family, commands.contains(b[16]) else { return nil }
        return (b, 20..<length)
    }
}

extension NetlinkSocket {
    /// Family `name` as the generic netlink controller describes it: the id it was given and
    /// its multicast groups. The kernel refuses with `ENOENT` when it has no such family.
    fileprivate func genericFamily(named name: String) throws(NetlinkError) -> Wireless.Family {
        let what = "look up generic netlink family '\(name)'"
        let seq = try request(type: CTRL.controller, flags: UInt16(NLM_F_ACK), header: [CTRL.getFamily, 1, 0, 0]) { nlh in
            mnl_attr_put_strz(nlh, CTRL.familyName, name)
        }
        var family: Wireless.Family?
        try answers(to: seq, what) { buffer, message in family = family ?? Wireless.family(buffer[message.bytes]) }
        guard let family else { throw NetlinkError(what, EPROTO) }
        return family
    }

    /// Joins multicast group `group` (any id; `bind` reaches only the first 32).
    func join(group: UInt32) throws(NetlinkError) {
        var id = group
        guard setsockopt(fileDescriptor, 270 /* SOL_NETLINK */, 1 /* NETLINK_ADD_MEMBERSHIP */, &id, 4) == 0 else {
            throw NetlinkError("join netlink group \(group)", errno)
        }
    }
}

/// Follows nl80211's notices of Wi-Fi links joining, leaving and moving between networks
/// (its `mlme` group), and the controller's of families registered since (a Wi-Fi driver
/// loaded after the agent started), so a change of Wi-Fi network is seen at once even when no
/// link, address or route changes with it.
public final class WirelessEvents {
    private let socket: NetlinkSocket
    /// nl80211's family id, once it exists.
    private var nl80211: UInt16?

    /// Subscribes in the calling thread's network namespace.
    public init() throws(NetlinkError) {
        socket = try NetlinkSocket(protocol: NETLINK_GENERIC, receiveBuffer: 1 << 20)
        let lookups = try NetlinkSocket(protocol: NETLINK_GENERIC)
        let controller = try lookups.genericFamily(named: "nlctrl")
        if let notify = controller.groups["notify"] { try socket.join(group: notify) }
        do {
            try follow(lookups.genericFamily(named: "nl80211"))
        } catch where error.code == ENOENT {
            // No Wi-Fi in this kernel yet: the controller says when it comes.
        }
    }

    /// The socket to poll for readiness.
    public var fileDescriptor: Int32 { socket.fileDescriptor }

    /// What arrived, without waiting.
    public enum Notice: Equatable, Sendable {
        /// Link `index` joined, left or moved between Wi-Fi networks.
        case association(linkIndex: Int32)
        /// Wi-Fi appeared in the kernel: links may be on networks now.
        case appeared
        /// Notices were lost (the queue overran): any Wi-Fi link may have changed.
        case lost
    }

    /// Reads what is queued, without waiting.
    public func take() -> [Notice] {
        var notices: [Notice] = []
        let lost = socket.takeQueued { message in
            if let nl80211, let index = Wireless.associationChange(message, family: nl80211) {
                notices.append(.association(linkIndex: index))
            } else if let family = Wireless.family(message), family.name == "nl80211", family.id != nl80211,
                      (try? follow(family)) != nil {
                notices.append(.appeared)
            } else if let family = Wireless.family(message, removed: true), family.name == "nl80211" {
                // Its driver unloaded: when it comes back, even under the same id, it is followed again.
                nl80211 = nil
            }
        }
        return lost ? [.lost] + notices : notices
    }

    private func follow(_ family: Wireless.Family) throws(NetlinkError) {
        guard let mlme = family.groups["mlme"] else { throw NetlinkError("find nl80211's mlme group", ENOENT) }
        try socket.join(group: mlme)
        nl80211 = family.id
    }
}

// linux/genetlink.h: the controller, which names families.
private enum CTRL {
    /// `GENL_ID_CTRL`: the controller's own fixed family id.
    static let controller: UInt16 = 0x10
    static let newFamily: UInt8 = 1, deleteFamily: UInt8 = 2, getFamily: UInt8 = 3
    static let familyIdentifier: UInt16 = 1, familyName: UInt16 = 2, multicastGroups: UInt16 = 7
    static let groupName: UInt16 = 1, groupIdentifier: UInt16 = 2
}

// linux/nl80211.h: commands, attributes and interface types.
private enum NL80211 {
    static let getInterface: UInt8 = 5, newInterface: UInt8 = 7
    /// NL80211_CMD_CONNECT, _ROAM, _DISCONNECT, _PORT_AUTHORIZED.
    static let associationCommands: [UInt8] = [46, 47, 48, 125]
    static let interfaceIndex: UInt16 = 3, interfaceType: UInt16 = 5, ssid: UInt16 = 52
    /// NL80211_IFTYPE_ADHOC, _STATION, _P2P_CLIENT: the types that join a network.
    static let clientTypes: [UInt32] = [1, 2, 8]
}
