import Topology
import Glibc
import Testing
import Basics
@testable import PathMonitor
@testable import Netlink

// MARK: The controller, captured

// Captured on Linux 6.18.44 (`uname -r`: 6.18.44-fc-v669), which has no Wi-Fi (no cfg80211):
// a NETLINK_GENERIC socket with NETLINK_EXT_ACK and NETLINK_CAP_ACK set sent CTRL_CMD_GETFAMILY
// (version 1, NLM_F_REQUEST|NLM_F_ACK, sequence 1) with CTRL_ATTR_FAMILY_NAME, and kept each
// buffer that came back.

/// For "nlctrl": CTRL_CMD_NEWFAMILY with its name, id 0x10, version, header size, attribute
/// count, and its operations and multicast groups nested.
private let nlctrlReply = bytes(hex: """
    88000000100000000100000081100000010200000b0002006e6c6374726c000006000100100000000800030002000000
    080004000000000008000500000000002c000600140001000800010003000000080002000e0000001400020008000100
    0a000000080002000c0000001c0007001800010008000200100000000b0001006e6f746966790000
    """)

/// The acknowledgement that followed it (NLMSG_ERROR 0, the request's header capped).
private let nlctrlAcknowledgement = bytes(hex: "240000000200000101000000811000000000000020000000100005000100000000000000")

/// For "nl80211": the refusal, -ENOENT: this kernel has no such family.
private let nl80211Refusal = bytes(hex: "240000000200000101000000ab100000feffffff20000000100005000100000000000000")

@Test func theControllerNamesItsOwnFamily() {
    #expect(Wireless.family(nlctrlReply)?.id == 0x10)
    #expect(Wireless.family(nlctrlAcknowledgement) == nil)
    for cut in 0..<nlctrlReply.count { #expect(Wireless.family(nlctrlReply.prefix(cut)) == nil, "cut at \(cut)") }
}

@Test func theControllerNamesItsMulticastGroups() throws {
    let family = try #require(Wireless.family(nlctrlReply))
    #expect(family == Wireless.Family(id: 0x10, name: "nlctrl", groups: ["notify": 0x10]))
    // A group list that runs past its attribute is refused whole.
    var broken = nlctrlReply
    broken[0x70] = 0xFF  // the "notify" group's nest length: past the list that holds it
    #expect(Wireless.family(broken) == nil)
    // The same description as a CTRL_CMD_DELFAMILY notice (the controller sends the family's
    // attributes with it): a removal, not a family to follow.
    var removed = nlctrlReply
    removed[16] = 2
    #expect(Wireless.family(removed) == nil && Wireless.family(removed, removed: true)?.name == "nlctrl")
}

@Test func aKernelWithoutNl80211SaysENOENTWhichMeansNotWireless() throws {
    let message = try #require(NetlinkDecoder.messages(nl80211Refusal).messages.first)
    let answer = try #require(NetlinkDecoder.acknowledgement(nl80211Refusal, message))
    #expect(answer.code == -ENOENT && answer.sequence == 1 && answer.message == nil)
    #expect(Wireless.lookup(refusal: NetlinkError("look up nl80211", -answer.code)) == .notWireless)
    for code in [ENODEV, EOPNOTSUPP, EINVAL] { #expect(Wireless.lookup(refusal: NetlinkError("get", code)) == .notWireless) }
    let denied = NetlinkError("get", EPERM)
    #expect(Wireless.lookup(refusal: denied) == .failed(denied))
}

// MARK: nl80211's interface, as the kernel lays it out

// No Wi-Fi hardware or mac80211_hwsim here, so these are written by hand, attribute by
// attribute in the order nl80211_send_iface (net/wireless/nl80211.c, Linux 6.12 and later)
// puts them for a mac80211 station on one link: the netdev's index and name, then wiphy,
// iftype, wdev, MAC, generation, 4addr and radio mask; the channel (nl80211_send_chandef) and
// TX power when the driver reports them; the SSID (wdev->u.client.ssid) while associated; and
// the TX queue statistics (nl80211_put_txq_stats). Attributes are u32 unless noted.

/// The id the controller gave nl80211; it hands these out at boot, 0x1b stands for one.
private let nl80211: UInt16 = 0x1b

private let identity = [
    "0800030003000000",  // NL80211_ATTR_IFINDEX 3
    "0a000400776c616e30000000",  // NL80211_ATTR_IFNAME "wlan0" (string, NUL, padding)
    "0800010000000000",  // NL80211_ATTR_WIPHY 0
    "0800050002000000",  // NL80211_ATTR_IFTYPE 2: NL80211_IFTYPE_STATION
    "0c0099000100000000000000",  // NL80211_ATTR_WDEV 1 (u64; x86-64 needs no NL80211_ATTR_PAD before it)
    "0a00060002005e1000570000",  // NL80211_ATTR_MAC 02:00:5e:10:00:57
    "08002e0005000000",  // NL80211_ATTR_GENERATION 5
    "0500530000000000",  // NL80211_ATTR_4ADDR 0 (u8)
    "08004d0101000000",  // NL80211_ATTR_VIF_RADIO_MASK 1 (attribute 333)
]
private let channel = [
    "0800260085090000",  // NL80211_ATTR_WIPHY_FREQ 2437: channel 6
    "0800220100000000",  // NL80211_ATTR_WIPHY_FREQ_OFFSET 0
    "0800270001000000",  // NL80211_ATTR_WIPHY_CHANNEL_TYPE 1: NL80211_CHAN_HT20
    "08009f0001000000",  // NL80211_ATTR_CHANNEL_WIDTH 1: NL80211_CHAN_WIDTH_20
    "0800a00085090000",  // NL80211_ATTR_CENTER_FREQ1 2437
]
private let power = "08006200d0070000"  // NL80211_ATTR_WIPHY_TX_POWER_LEVEL 2000 mBm
// NL80211_ATTR_TXQ_STATS, nested (nla_nest_start_noflag: no NLA_F_NESTED): backlog bytes and
// packets, flows, drops, ECN marks, overlimit, collisions, TX bytes, TX packets.
private let queues = """
    4c000901080001000000000008000200000000000800030001000000080004000000000008000500000000000800
    0600000000000800080000000000080009000807000008000a000c000000
    """

/// An NL80211_CMD_NEW_INTERFACE message holding `attributes`, as the kernel answers a
/// GET_INTERFACE request with sequence 7 (genlmsg_reply: flags 0).
private func newInterface(_ attributes: [String]) -> [UInt8] {
    let body = bytes(hex: "07010000" + attributes.joined())  // genlmsghdr: cmd 7, version 1, reserved
    let length = UInt32(16 + body.count)
    let header = withUnsafeBytes(of: length.littleEndian, Array.init) + withUnsafeBytes(of: nl80211.littleEndian, Array.init)
        + [0, 0, 7, 0, 0, 0, 0x10, 0x2f, 0, 0]  // flags, sequence, port id
    return header + body
}

private let associated = newInterface(identity + channel + [power, "0f003400526f616d204f666669636500", queues])  // NL80211_ATTR_SSID "Roam Office"
private let latin1 = newInterface(identity + channel + [power, "08003400436166e9", queues])  // NL80211_ATTR_SSID "Café" in Latin-1
/// Not associated: no channel to report, and no SSID.
private let unassociated = newInterface(identity + [power, queues])

@Test func anAssociatedStationNamesItsNetwork() throws {
    let interface = try #require(Wireless.interface(associated, family: nl80211))
    #expect(interface == Wireless.Interface(index: 3, type: 2, ssid: SSID("Roam Office")))
    #expect(Wireless.lookup(interface) == .ssid(SSID("Roam Office")!))
    #expect(SSID(bytes: Array("Roam Office".utf8))?.description == "Roam Office")
}

@Test func aNameThatIsNotUTF8IsKeptAsBytesAndPrintedEscaped() throws {
    let interface = try #require(Wireless.interface(latin1, family: nl80211))
    let ssid = try #require(interface.ssid)
    #expect(ssid.bytes == [0x43, 0x61, 0x66, 0xE9])
    #expect(ssid.description == "Caf\\xe9")
    #expect(SSID(ssid.description) == ssid, "the printed form configures the same network")
    #expect(SSID("Café") != ssid, "é in UTF-8 is two other bytes")
    #expect(Wireless.lookup(interface) == .ssid(ssid))
}

@Test func anUnassociatedStationHasNoNetwork() throws {
    let interface = try #require(Wireless.interface(unassociated, family: nl80211))
    #expect(interface == Wireless.Interface(index: 3, type: 2, ssid: nil))
    #expect(Wireless.lookup(interface) == .notAssociated)
    // An access point's SSID is the network it serves, not one it joined.
    #expect(Wireless.lookup(Wireless.Interface(index: 3, type: 3, ssid: SSID("Roam Office"))) == .notAssociated)
}

@Test func truncatedOrForeignInterfaceMessagesDecodeToNothing() {
    for cut in 0..<associated.count {
        #expect(Wireless.interface(associated.prefix(cut), family: nl80211) == nil, "cut at \(cut)")
    }
    // The header claims the whole message, but an attribute runs past the end.
    var overrun = associated
    overrun[20] = 0xFF  // NL80211_ATTR_IFINDEX's length
    #expect(Wireless.interface(overrun, family: nl80211) == nil)
    #expect(Wireless.interface(associated, family: 0x1c) == nil, "another family's message")
    var otherCommand = associated
    otherCommand[16] = 8  // NL80211_CMD_DEL_INTERFACE
    #expect(Wireless.interface(otherCommand, family: nl80211) == nil)
    let tooLong = newInterface(identity + ["250034" + "00" + String(repeating: "41", count: 33) + "000000"])
    #expect(Wireless.interface(tooLong, family: nl80211) == nil, "an SSID of 33 bytes")
    #expect(Wireless.interface(newInterface(Array(identity.dropFirst())), family: nl80211) == nil, "no index")
}

// MARK: nl80211's notices (the mlme group)

/// A notice as nl80211_send_connect_result, nl80211_send_roamed, nl80211_send_disconnected and
/// nl80211_send_port_authorized multicast it (sequence 0, port 0): the wiphy, then the netdev's
/// index, then what the command carries (a BSSID; a reason code).
private func notice(_ command: UInt8, _ attributes: [String]) -> [UInt8] {
    let body = bytes(hex: hex(command) + "010000" + attributes.joined())
    let length = UInt32(16 + body.count)
    return withUnsafeBytes(of: length.littleEndian, Array.init) + withUnsafeBytes(of: nl80211.littleEndian, Array.init)
        + [0, 0, 0, 0, 0, 0, 0, 0, 0, 0] + body  // flags, sequence, port id
}
private func hex(_ byte: UInt8) -> String { (byte < 16 ? "0" : "") + String(byte, radix: 16) }
private let wiphy = "0800010000000000", index3 = "0800030003000000", bssid = "0a000600020000000a010000"

@Test func connectsRoamsAndDisconnectsNameTheirLink() {
    #expect(Wireless.associationChange(notice(46, [wiphy, index3, bssid, "0600480000000000"]), family: nl80211) == 3)
    #expect(Wireless.associationChange(notice(47, [wiphy, index3, bssid]), family: nl80211) == 3)
    #expect(Wireless.associationChange(notice(48, [wiphy, index3, "0600360003000000"]), family: nl80211) == 3)
    #expect(Wireless.associationChange(notice(125, [wiphy, index3, bssid]), family: nl80211) == 3)
    // A scan's results, another family's connect, a notice that does not hold together: nothing.
    #expect(Wireless.associationChange(notice(34, [wiphy, index3]), family: nl80211) == nil)
    #expect(Wireless.associationChange(notice(46, [wiphy, index3]), family: 0x1c) == nil)
    let connect = notice(46, [wiphy, index3, bssid])
    for cut in 0..<connect.count { #expect(Wireless.associationChange(connect.prefix(cut), family: nl80211) == nil, "cut at \(cut)") }
    #expect(Wireless.associationChange(notice(48, [wiphy]), family: nl80211) == nil, "no link named")
}

@Test func ssidTextRoundTrips() {
    #expect(SSID("Roam Office")?.bytes == Array("Roam Office".utf8))
    #expect(SSID("Caf\\xE9")?.bytes == [0x43, 0x61, 0x66, 0xE9])
    #expect(SSID("\\x00\\x01")?.description == "\\x00\\x01")
    #expect(SSID("Zürich 🚆")?.description == "Zürich 🚆")
    #expect(SSID(bytes: [0x41, 0x0A, 0x42])?.description == "A\\x0aB", "a newline would split a log line")
    #expect(SSID(bytes: Array("a\u{202E}b".utf8))?.description == "a\\xe2\\x80\\xaeb", "a right-to-left override")
    // A backslash stays itself unless it would read as an escape.
    #expect(SSID("a\\b")?.description == "a\\b")
    let literal = SSID(bytes: Array("\\x41".utf8))
    #expect(literal?.description == "\\x5cx41")
    #expect(SSID(literal?.description ?? "") == literal)
    #expect(SSID(String(repeating: "a", count: 32)) != nil)
    #expect(SSID(String(repeating: "a", count: 33)) == nil)
    #expect(SSID(String(repeating: "\\xff", count: 33)) == nil)
    #expect(SSID("")?.bytes == [])
    // Every byte string survives printing and parsing.
    for byte in UInt8.min...UInt8.max {
        let ssid = SSID(bytes: [0x5C, byte, 0x78, byte, 0xC3])
        #expect(SSID(ssid?.description ?? "") == ssid)
    }
}

// MARK: This kernel

@Test func loopbackIsNotWireless() {
    #expect(Wireless.ssid(ofInterface: 1) == .notWireless)
}

/// The controller's notices are followed even on a kernel without Wi-Fi (nl80211 may come with a
/// driver later); nothing arrives while nothing changes.
@Test func wirelessNoticesCanBeFollowedWithoutWiFi() throws {
    let events = try WirelessEvents()
    #expect(events.take() == [])
}
