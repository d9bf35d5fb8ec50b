import Topology
import Glibc
public import Basics
import Netlink

/// An IP address and a port: where a datagram comes from or goes to, or (`overStream`) the far
/// end of a stream a gateway takes messages on, which is never the same endpoint as a UDP one
/// with the same address and port.
public struct SocketAddress: Hashable, Sendable, CustomStringConvertible {
    public var ip: IPAddress
    public var port: UInt16
    /// A stream's far end (TCP), not a UDP endpoint: the sockets' calls ignore it.
    public var overStream: Bool

    public init(_ ip: IPAddress, port: UInt16, overStream: Bool = false) {
        self.ip = ip
        self.port = port
        self.overStream = overStream
    }

    /// The endpoint's address and port; nil when its host is a name (resolve it first) or it
    /// has no port.
    public init?(_ endpoint: Endpoint) {
        guard let ip = endpoint.address, let port = endpoint.port else { return nil }
        self.init(ip, port: port)
    }

    /// `192.0.2.1:51820` or `[2001:db8::1]:51820`.
    public var description: String { (ip.family == .v4 ? "\(ip):\(port)" : "[\(ip)]:\(port)") + (overStream ? "/tcp" : "") }
}

extension SocketAddress {
    /// Writes the address as a `sockaddr_in` or `sockaddr_in6` into `storage`, which has room
    /// for either, and returns its length.
    func write(to storage: UnsafeMutablePointer<sockaddr_in6>) -> socklen_t {
        let raw = UnsafeMutableRawPointer(storage)
        switch ip {
        case .v4(let address):
            var sin = sockaddr_in()
            sin.sin_family = sa_family_t(AF_INET)
            sin.sin_port = port.bigEndian
            sin.sin_addr.s_addr = address.bigEndian
            raw.storeBytes(of: sin, as: sockaddr_in.self)
            return socklen_t(MemoryLayout<sockaddr_in>.size)
        case .v6(let high, let low):
            var sin6 = sockaddr_in6()
            sin6.sin6_family = sa_family_t(AF_INET6)
            sin6.sin6_port = port.bigEndian
            withUnsafeMutableBytes(of: &sin6.sin6_addr) {
                $0.storeBytes(of: high.bigEndian, toByteOffset: 0, as: UInt64.self)
                $0.storeBytes(of: low.bigEndian, toByteOffset: 8, as: UInt64.self)
            }
            storage.pointee = sin6
            return socklen_t(MemoryLayout<sockaddr_in6>.size)
        }
    }

    /// Reads a `sockaddr_in` or `sockaddr_in6` of `length` bytes; nil for any other family.
    init?(reading storage: UnsafePointer<sockaddr_in6>, length: socklen_t) {
        let raw = UnsafeRawPointer(storage)
        switch Int32(storage.pointee.sin6_family) {
        case AF_INET where length >= MemoryLayout<sockaddr_in>.size:
            let sin = raw.load(as: sockaddr_in.self)
            self.init(.v4(UInt32(bigEndian: sin.sin_addr.s_addr)), port: UInt16(bigEndian: sin.sin_port))
        case AF_INET6 where length >= MemoryLayout<sockaddr_in6>.size:
            let sin6 = storage.pointee
            let (high, low) = withUnsafeBytes(of: sin6.sin6_addr) {
                (UInt64(bigEndian: $0.loadUnaligned(as: UInt64.self)),
                 UInt64(bigEndian: $0.loadUnaligned(fromByteOffset: 8, as: UInt64.self)))
            }
            self.init(.v6(high, low), port: UInt16(bigEndian: sin6.sin6_port))
        default:
            return nil
        }
    }
}
