import Topology
import Glibc
public import Netlink
import Synchronization
public import Basics
public import Device

/// The gateway's listening TCP sockets for the stream transport and its TLS context.
public final class StreamListener: Sendable {
    public let sockets: [TCPListener]
    public let context: TLSContext

    /// Listens on `port` of `addresses` (each a wildcard or one of the host's) with `context`.
    public init(on addresses: [SocketAddress], context: TLSContext, namespace: NetworkNamespace? = nil) throws(DeviceError) {
        var sockets: [TCPListener] = []
        for address in addresses { sockets.append(try TCPListener(bindingTo: address, backlog: 512, namespace: namespace)) }
        self.sockets = sockets
        self.context = context
    }

    /// A connection waiting on `listener`, its TLS handshake not started; nil when none waits.
    public func accept(on listener: TCPListener, now: Instant) throws(DeviceError) -> GatewayStream? {
        guard let connection = try listener.accept(timeout: .zero), let peer = connection.peer else { return nil }
        do {
            return try GatewayStream(TLSChannel(context, over: connection, accepting: true), peer: peer, now: now)
        } catch {
            return nil  // libssl could not make a session for it: the connection closes with it
        }
    }
}

/// One client's stream at the gateway: the TLS handshake, then protocol messages both ways.
/// The stream thread reads it; any data thread may send on it (one at a time, under its lock).
public final class GatewayStream: Sendable {
    /// Where the connection comes from: the endpoint the sessions know this client by while it
    /// sends over this stream.
    public let peer: SocketAddress
    /// The gateway's address the client connected to.
    public let local: IPAddress?
    /// When it was accepted.
    public let accepted: Instant
    public let fileDescriptor: Int32
    private let state: Mutex<Phase>
    /// When an authenticated message last arrived or a handshake was answered on it (Instant
    /// nanoseconds); 0 until then. Garbage keeps nothing alive.
    private let lastProven = Atomic<Int64>(0)
    private let dropped = Atomic<Int>(0)

    private enum Phase {
        case handshaking(TLSChannel)
        case open(FramedStream)
        case closed(String)
    }

    init(_ channel: TLSChannel, peer: SocketAddress, now: Instant) {
        self.peer = SocketAddress(peer.ip, port: peer.port, overStream: true)
        fileDescriptor = channel.connection.fileDescriptor
        local = channel.connection.local?.ip
        accepted = now
        state = Mutex(.handshaking(channel))
    }

    /// What a turn of the stream thread found.
    public enum Progress: Equatable, Sendable {
        /// Nothing more to read now; `wantsWrite`: poll the socket for writing too.
        case waiting(wantsWrite: Bool)
        /// Messages are in the buffer given, `length` bytes in all, each `segment` bytes but the
        /// last (which may be shorter), as a UDP socket's GRO joins datagrams.
        case messages(length: Int, segment: Int)
        /// The stream is over, with why.
        case closed(String)
    }

    /// Moves the stream on: the TLS handshake's next step, or the next run of messages into `buffer`.
    public func advance(into buffer: UnsafeMutableRawBufferPointer, now: Instant) -> Progress {
        let step = state.withLock { phase -> Step in
            switch phase {
            case .handshaking(let channel):
                switch channel.handshake() {
                case .done:
                    do throws(StreamError) {
                        let stream = try FramedStream(channel)
                        phase = .open(stream)
                        return .open(stream)
                    } catch {
                        phase = .closed(error.description)
                        return .progress(.closed(error.description))
                    }
                case .wantRead: return .progress(.waiting(wantsWrite: false))
                case .wantWrite: return .progress(.waiting(wantsWrite: true))
                case .closed(let why):
                    phase = .closed(why)
                    return .progress(.closed(why))
                }
            case .open(let stream):
                return .open(stream)
            case .closed(let why):
                return .progress(.closed(why))
            }
        }
        switch step {
        case .progress(let progress): return progress
        case .open(let stream): return advance(stream, into: buffer)
        }
    }

    private enum Step {
        case open(FramedStream)
        case progress(Progress)
    }

    /// The open stream's next run, outside the phase's lock (the stream's receiving direction
    /// has its own, which sending does not take).
    private func advance(_ stream: FramedStream, into buffer: UnsafeMutableRawBufferPointer) -> Progress {
        stream.flushTail()
        if let run = stream.nextRun(into: buffer) { return .messages(length: run.length, segment: run.segment) }
        if let why = stream.closed {
            state.withLock { if case .open(let current) = $0, current === stream { $0 = .closed(why) } }
            return .closed(why)
        }
        return .waiting(wantsWrite: stream.wantsWrite)
    }

    /// Whether a message or a whole record waits that a poll would not show.
    public var hasBuffered: Bool { openStream?.hasBuffered ?? false }

    private var openStream: FramedStream? { state.withLock { if case .open(let stream) = $0 { stream } else { nil } } }

    /// Whether the TLS handshake is done.
    public var isOpen: Bool { state.withLock { if case .open = $0 { true } else { false } } }

    /// A message on the stream was authenticated, or the gateway answered a handshake on it:
    /// the stream carries a session, and is kept while it does.
    public func prove(_ now: Instant) { lastProven.store(now.nanoseconds, ordering: .relaxed) }

    /// When the stream last carried a session's message; nil while it never has.
    public var lastProof: Instant? {
        let value = lastProven.load(ordering: .relaxed)
        return value == 0 ? nil : Instant(nanoseconds: value)
    }

    /// Messages dropped because the stream could not take them then.
    public var drops: Int { dropped.load(ordering: .relaxed) }

    /// Sends `messages` as frames, all or none; how many went.
    @discardableResult
    public func send(_ messages: [UnsafeRawBufferPointer]) -> Int {
        let sent = openStream?.send(messages) ?? 0
        if sent < messages.count { dropped.add(messages.count - sent, ordering: .relaxed) }
        return sent
    }

    /// Ends the stream: nothing more is read or sent (the socket closes when the last
    /// reference goes).
    public func close(_ why: String) {
        state.withLock { $0 = .closed(why) }
    }
}
