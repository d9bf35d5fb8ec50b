import Topology
import Glibc
public import Netlink
import Synchronization
public import Basics
public import Device

/// The client's stream to the gateway on one uplink: TCP, through an HTTP proxy when one is
/// configured, then TLS, carrying the protocol's messages as frames (`StreamFraming`). The data
/// plane uses it as it uses a UDP socket (`PacketCarrier`).
///
/// Opening takes round trips, so it happens on a thread of its own (`open`); messages sent
/// meanwhile wait, the last few kept (a handshake's initiation among them), and go first once
/// the stream is open. What happens to the stream is told once each: opened, or failed (never
/// opened, or broken later).
public final class StreamCarrier: PacketCarrier {
    /// What happened to a stream.
    public enum Event: Equatable, Sendable {
        /// TCP and TLS are up (through the proxy, when there is one): messages flow.
        case opened
        /// The stream could not be opened, or broke: why, in words for the log.
        case failed(String)
    }

    /// Where the stream goes: the gateway's TLS address.
    public let gateway: SocketAddress
    /// The address the session knows the gateway by (where its datagrams go): what arrives on
    /// the stream comes from there, as far as the session is concerned.
    public let peer: SocketAddress
    public let device: String?
    public let label: String
    private let state: Mutex<Phase>
    private let told: @Sendable (StreamCarrier, Event) -> Void
    /// Messages dropped because the stream could not take them then (its queue was full, or it
    /// was not open).
    private let dropped = Atomic<Int>(0)

    private enum Phase {
        /// Opening: messages sent meanwhile, oldest first.
        case opening(waiting: [[UInt8]])
        case open(FramedStream)
        case failed(String)
    }

    /// Messages kept while the stream opens: a version 3 initiation is up to three messages.
    static let waitingLimit = 8

    /// How long opening may take at most: TCP, the proxy and TLS.
    public static let openTimeout: Duration = .seconds(10)

    private init(gateway: SocketAddress, peer: SocketAddress, device: String?, label: String,
                 told: @escaping @Sendable (StreamCarrier, Event) -> Void) {
        self.gateway = gateway
        self.peer = peer
        self.device = device
        self.label = label
        self.told = told
        state = Mutex(.opening(waiting: []))
    }

    /// Starts opening a stream to `gateway` from `source` through `device` with `mark` (as the
    /// path's UDP socket would be), through `proxy` when given, with `context` (SNI and ALPN);
    /// `told` hears how it went, on the opening thread or a data thread. `peer`: the address the
    /// session knows the gateway by, the gateway's own when nil. `host`: the gateway's own name,
    /// which a proxy's `CONNECT` then names (the address otherwise; never the SNI cover name).
    public static func open(to gateway: SocketAddress, as peer: SocketAddress? = nil, host: String? = nil, from source: IPAddress?,
                            device: String?, mark: UInt32?, proxy: HTTPProxy?, context: TLSContext, timeout: Duration = openTimeout,
                            namespace: NetworkNamespace? = nil,
                            told: @escaping @Sendable (StreamCarrier, Event) -> Void) -> StreamCarrier {
        let label = "TLS to \(gateway)\(proxy.map { " via proxy \($0.address)" } ?? "")\(device.map { " on \($0)" } ?? "")"
        let carrier = StreamCarrier(gateway: gateway, peer: peer ?? gateway, device: device, label: label, told: told)
        let deadline = ContinuousClock.now + timeout
        do {
            try OSThread.detach { [carrier] in
                let result: Result<TLSChannel, StreamError>
                do throws(StreamError) {
                    result = .success(try connect(to: gateway, host: host, from: source, device: device, mark: mark, proxy: proxy,
                                                  context: context, namespace: namespace, deadline: deadline))
                } catch {
                    result = .failure(error)
                }
                carrier.finishOpening(result)
            }
        } catch {
            carrier.finishOpening(.failure(StreamError("cannot start a thread to open the stream: \(error)")))
        }
        return carrier
    }

    /// TCP, the proxy, TLS: blocking, by `deadline`.
    private static func connect(to gateway: SocketAddress, host: String?, from source: IPAddress?, device: String?, mark: UInt32?,
                                proxy: HTTPProxy?, context: TLSContext, namespace: NetworkNamespace?,
                                deadline: ContinuousClock.Instant) throws(StreamError) -> TLSChannel {
        let connection: TCPConnection
        do {
            connection = try TCPConnection.connect(to: proxy?.address ?? gateway, from: source, device: device, mark: mark,
                                                   namespace: namespace, deadline: deadline)
        } catch {
            throw StreamError(proxy == nil ? "\(error)" : "the proxy: \(error)")
        }
        try proxy?.open(connection, to: gateway, host: host, deadline: deadline)
        let channel = try TLSChannel(context, over: connection, accepting: false)
        while true {
            let events: Int16
            switch channel.handshake() {
            case .done: return channel
            case .wantRead: events = Int16(POLLIN)
            case .wantWrite: events = Int16(POLLOUT)
            case .closed(let why): throw StreamError(why.contains("handshake") ? why : "TLS handshake: \(why)")
            }
            let left = deadline - .now
            guard left > .zero else { throw StreamError("TLS handshake: no answer in \(openTimeout)") }
            var entry = pollfd(fd: connection.fileDescriptor, events: events, revents: 0)
            _ = poll(&entry, 1, Int32(clamping: left.nanoseconds / 1_000_000 + 1))
        }
    }

    private func finishOpening(_ result: Result<TLSChannel, StreamError>) {
        let opened = result.flatMap { channel -> Result<FramedStream, StreamError> in
            do throws(StreamError) { return .success(try FramedStream(channel)) } catch { return .failure(error) }
        }
        let event: Event? = state.withLock { phase in
            // Closed while it opened: its owner is done with it and hears nothing more.
            guard case .opening(let waiting) = phase else { return nil }
            switch opened {
            case .success(let stream):
                let sent = waiting.withUnsafeBufferPointers { stream.send($0) }
                if sent < waiting.count { dropped.add(waiting.count - sent, ordering: .relaxed) }
                phase = .open(stream)
                return .opened
            case .failure(let error):
                phase = .failed(error.description)
                return .failed(error.description)
            }
        }
        if let event { told(self, event) }
    }

    /// Ends the stream (it is over for good: a new one is opened if wanted); nothing more is told.
    public func close() {
        state.withLock { $0 = .failed("closed") }
    }

    /// Messages dropped so far because the stream could not take them.
    public var drops: Int { dropped.load(ordering: .relaxed) }

    /// The TLS suite of the open stream; nil while it is not open.
    public var suite: String? { openStream?.suite }

    /// The stream while it is open.
    private var openStream: FramedStream? { state.withLock { if case .open(let stream) = $0 { stream } else { nil } } }

    /// Whether the stream is open now.
    public var isOpen: Bool { state.withLock { if case .open = $0 { true } else { false } } }

    // MARK: PacketCarrier

    public var pollDescriptor: Int32? {
        guard let stream = openStream, stream.closed == nil else { return nil }
        return stream.fileDescriptor
    }

    public var hasBuffered: Bool {
        guard let stream = openStream else { return false }
        return stream.closed != nil || stream.hasBuffered
    }

    @discardableResult
    public func send(_ message: UnsafeRawBufferPointer, to peer: SocketAddress) throws(DeviceError) -> Bool {
        send([message]) == 1
    }

    @discardableResult
    public func sendSegmented(_ batch: PacketBatch) throws(DeviceError) -> Int {
        send((0..<batch.count).map { batch.packet(at: $0) })
    }

    /// Sends `messages` on the open stream (outside the carrier's lock: the stream's sending
    /// direction has its own), or keeps them while it opens.
    private func send(_ messages: [UnsafeRawBufferPointer]) -> Int {
        let (stream, kept) = state.withLock { phase -> (FramedStream?, Bool) in
            switch phase {
            case .opening(var waiting):
                for message in messages { waiting.append(Array(message)) }
                if waiting.count > Self.waitingLimit { waiting.removeFirst(waiting.count - Self.waitingLimit) }
                phase = .opening(waiting: waiting)
                return (nil, true)
            case .open(let stream): return (stream, false)
            case .failed: return (nil, false)
            }
        }
        var sent = kept ? messages.count : 0
        if let stream {
            sent = stream.send(messages)
            if stream.closed != nil { tellIfBroken(stream) }
        }
        if sent < messages.count { dropped.add(messages.count - sent, ordering: .relaxed) }
        return sent
    }

    public func receiveJoined(into buffer: UnsafeMutableRawBufferPointer, timeout: Duration?)
        throws(DeviceError) -> (length: Int, peer: SocketAddress, segment: Int)?
    {
        if let got = receiveNow(into: buffer) { return got }
        guard timeout != .zero else { return nil }
        guard let fd = pollDescriptor else {
            // Still opening (or failed): nothing to wait on but time.
            let pause = min(timeout ?? .milliseconds(10), .milliseconds(10))
            usleep(UInt32(pause.nanoseconds / 1_000))
            return nil
        }
        _ = try pollReadable([fd], timeout: timeout)
        return receiveNow(into: buffer)
    }

    /// What has arrived, joined as a UDP socket's GRO joins datagrams (`FramedStream.nextRun`).
    private func receiveNow(into buffer: UnsafeMutableRawBufferPointer) -> (length: Int, peer: SocketAddress, segment: Int)? {
        guard let stream = openStream else { return nil }
        stream.flushTail()
        if let run = stream.nextRun(into: buffer) { return (run.length, peer, run.segment) }
        if stream.closed != nil { tellIfBroken(stream) }
        return nil
    }

    /// `stream` broke: the carrier is failed from now on, and says so once.
    private func tellIfBroken(_ stream: FramedStream) {
        let why = state.withLock { phase -> String? in
            guard case .open(let current) = phase, current === stream, let why = stream.closed else { return nil }
            phase = .failed(why)
            return why
        }
        if let why { told(self, .failed(why)) }
    }
}

extension Array where Element == [UInt8] {
    /// Calls `body` with a view of each array's bytes.
    func withUnsafeBufferPointers<R>(_ body: ([UnsafeRawBufferPointer]) -> R) -> R {
        func nest(_ index: Int, _ views: [UnsafeRawBufferPointer]) -> R {
            guard index < count else { return body(views) }
            return self[index].withUnsafeBytes { nest(index + 1, views + [$0]) }
        }
        return nest(0, [])
    }
}
