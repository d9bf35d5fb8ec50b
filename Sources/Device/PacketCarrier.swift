import Basics

/// What carries the protocol's messages between the client and the gateway on one path: a UDP
/// socket (`UDPSocket`), or a stream to the gateway (TLS on TCP, for networks that drop UDP). The
/// data plane sends and receives through it the same way whichever it is: a session moves from
/// one carrier to another as it moves from one path to another.
public protocol PacketCarrier: AnyObject, Sendable {
    /// The descriptor to poll for input; nil while there is none to poll (a stream still
    /// connecting, or closed).
    var pollDescriptor: Int32? { get }
    /// Whether messages already read are waiting, which a poll of the descriptor would not show.
    var hasBuffered: Bool { get }
    /// The interface the carrier is bound to, if any.
    var device: String? { get }
    /// What the carrier is, for logs: `UDP 192.0.2.7:40112` or `TLS to 198.51.100.1:443`.
    var label: String { get }

    /// Sends one message to `peer` (a stream ignores it: it reaches one gateway); false when it
    /// was dropped for want of room.
    @discardableResult
    func send(_ message: UnsafeRawBufferPointer, to peer: SocketAddress) throws(DeviceError) -> Bool
    /// Sends every message of `batch` and returns how many went (the rest were dropped, as a
    /// congested link drops them).
    @discardableResult
    func sendSegmented(_ batch: PacketBatch) throws(DeviceError) -> Int
    /// Receives into `buffer` what has arrived: one message, or (UDP) a run of messages from
    /// one sender joined, each `segment` bytes but the last; nil when nothing came within
    /// `timeout` (zero: do not wait; nil: as long as it takes).
    func receiveJoined(into buffer: UnsafeMutableRawBufferPointer, timeout: Duration?)
        throws(DeviceError) -> (length: Int, peer: SocketAddress, segment: Int)?
}

extension UDPSocket: PacketCarrier {
    public var pollDescriptor: Int32? { fileDescriptor }
    public var hasBuffered: Bool { false }
    public var label: String { "UDP \(local)" }
}
