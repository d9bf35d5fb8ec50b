/// A link-layer address (temporary until the neighbour table lands).
public struct HardwareAddress: Hashable, Sendable, CustomStringConvertible {
    public var bytes: [UInt8]
    public init?(_ text: String) {
        let parts = text.split(separator: ":", omittingEmptySubsequences: false)
        guard parts.count == 6 else { return nil }
        var out: [UInt8] = []
        for p in parts {
            guard p.count == 2, let b = UInt8(p, radix: 16) else { return nil }
            out.append(b)
        }
        bytes = out
    }
    public var description: String {
        bytes.map { let s = String($0, radix: 16); return s.count == 1 ? "0" + s : s }.joined(separator: ":")
    }
}

public struct Neighbour: Hashable, Sendable {
    public var linkIndex: Int32
    public var address: IPAddress
    public var hardwareAddress: HardwareAddress?
    public var isValid: Bool { hardwareAddress != nil }
}
extension NetlinkSocket {
    public func neighbour(of address: IPAddress, linkIndex: Int32) throws(NetlinkError) -> Neighbour? { nil }
    public func resolve(_ address: IPAddress, linkIndex: Int32) throws(NetlinkError) {}
}
public struct SSID: Hashable, Sendable, CustomStringConvertible {
    public var bytes: [UInt8]
    public var description: String { String(decoding: bytes, as: UTF8.self) }
}
public enum WirelessLookup: Sendable { case ssid(SSID), notAssociated, notWireless, failed(NetlinkError) }
public enum Wireless { public static func ssid(ofInterface index: Int32) -> WirelessLookup { .notWireless } }
