import Topology
import Basics
import Device
import Logging
import PathMonitor
import Reconnector
import Settings
import Streams
import Tunnel

/// Why the socket of a path could not be had; the core hears of it (`AgentEvent.bindFailed`,
/// `AgentEvent.streamFailed`) and decides what follows.
enum SocketFailure: Error {
    /// The UDP socket could not be opened or bound (its address is not the machine's now).
    case bind(String)
    /// The stream could not be started.
    case stream(String)
    /// The session could not be started on its first socket (its protocol core, its thread).
    case session(String)

    /// The event that tells the core of it.
    func event(on id: Path.ID) -> AgentEvent {
        switch self {
        case .bind(let why): .bindFailed(id, why: why)
        case .stream(let why): .streamFailed(id, why: why)
        case .session(let why): .sessionFailed(why)
        }
    }
}

/// What the session sends on while no socket of its own works: nothing (each send counts as a
/// failed one). A socket whose address is gone would only fail the same way, or, were the
/// address given to another machine meanwhile, send as someone else.
final class Unbound: PacketCarrier {
    var pollDescriptor: Int32? { nil }
    var hasBuffered: Bool { false }
    var device: String? { nil }
    var label: String { "none" }
    func send(_ message: UnsafeRawBufferPointer, to peer: SocketAddress) throws(DeviceError) -> Bool { false }
    func sendSegmented(_ batch: PacketBatch) throws(DeviceError) -> Int { 0 }
    func receiveJoined(into buffer: UnsafeMutableRawBufferPointer, timeout: Duration?)
        throws(DeviceError) -> (length: Int, peer: SocketAddress, segment: Int)? { nil }
}

/// The session's sockets: one per path it uses or tries, a UDP socket or a stream.
extension SessionEffects {
    /// Opens the session's socket on `path`, or moves the session there; sockets on paths that
    /// no longer exist (`paths`) are closed, even when the new one cannot be had: the session
    /// then sends on none (`Unbound`) until a bind works.
    func bind(_ path: Path, paths: [Path]) throws(SocketFailure) {
        let socket: any PacketCarrier
        do {
            socket = try self.socket(for: path)
        } catch {
            forgetSocketsNotOn(paths)
            throw error
        }
        defer { forgetSocketsNotOn(paths) }
        if let client {
            client.rebind(to: socket)
        } else if let failure = start(on: socket) {
            throw .session(failure)
        }
    }

    func handshake(on path: Path) throws(SocketFailure) {
        let socket = try socket(for: path)
        if client?.socket !== socket { client?.rebind(to: socket) }
        client?.startHandshake()
    }

    /// Sends probe `id` through the socket of `path` (a second socket when the session is
    /// elsewhere), padded to stand for a tunnel packet of `size` bytes if given.
    func probe(_ id: UInt64, via path: Path, size: Int? = nil) throws(SocketFailure) {
        let socket = try socket(for: path)
        client?.probe(id: id, via: socket, size: size)
    }

    /// The socket bound to `path`'s interface and source, made on first use: a UDP socket, or
    /// for a stream path a stream to the current server (opening: `streamTold` says how it went).
    func socket(for path: Path) throws(SocketFailure) -> any PacketCarrier {
        if let socket = sockets[path.id] { return socket }
        if path.transport == .stream { return try stream(for: path) }
        do {
            let socket = try UDPSocket(bindingTo: SocketAddress(path.source, port: 0), device: path.interface,
                                       mark: settings.mode.socketMark, joinsReceived: true)
            sockets[path.id] = socket
            return socket
        } catch {
            log.warning("cannot open a socket on \(path.interface)", metadata: ["source": "\(path.source)", "error": "\(error)"])
            throw .bind("\(error)")
        }
    }

    /// Starts opening a stream to the current server over `path`: TLS on TCP to its `tcp` port
    /// (through the proxy, when there is one), from the path's source, bound and marked as the
    /// path's UDP socket would be.
    private func stream(for path: Path) throws(SocketFailure) -> StreamCarrier {
        guard let stream = settings.stream else {
            log.warning("a stream was asked for without 'tcp' in the configuration", metadata: ["path": "\(path.interface)"])
            throw .stream("no 'tcp' port for the gateway in the configuration")
        }
        let name = stream.serverName ?? servers[serverIndex].entry.endpoint.host
        let context: TLSContext
        do {
            context = try streamContexts[name] ?? TLSContext.client(serverName: name)
        } catch {
            log.error("cannot make a TLS context for the stream", metadata: ["error": "\(error)"])
            throw .stream("cannot make a TLS context: \(error)")
        }
        streamContexts[name] = context
        var proxy = self.proxy
        if let named = stream.proxy, named.address == nil {
            // Named by host: the address its name gave on this path's network, which the lockdown lets through.
            guard let at = proxyAt[NetworkKey(path)] else {
                throw .stream("the proxy's name \(named.endpoint.host) has no address on \(path.interface) yet")
            }
            proxy?.address = SocketAddress(at, port: named.port)
        }
        let id = path.id
        let told = streamTold
        let endpoint = servers[serverIndex].entry.endpoint
        let carrier = StreamCarrier.open(to: SocketAddress(server.ip, port: stream.port), as: server,
                                         host: endpoint.address == nil ? endpoint.host : nil, from: path.source,
                                         device: path.interface, mark: settings.mode.socketMark, proxy: proxy, context: context) {
            told(id, $0, $1)
        }
        sockets[path.id] = carrier
        streamPaths[path.id] = path
        log.info("opening a stream", metadata: ["path": "\(path.interface)", "stream": "\(carrier.label)"])
        if brokenSessionStream == path.id {
            brokenSessionStream = nil
            client?.rebind(to: carrier)
        }
        return carrier
    }

    /// The stream on path `id` opened or failed: the session's data loop polls what there is
    /// now, and a failed stream is forgotten, so the next attempt opens a fresh one.
    /// Returns whether `carrier` is still the path's: what an earlier stream, since replaced or
    /// closed, says is stale.
    func streamChanged(_ id: Path.ID, _ carrier: StreamCarrier, _ event: StreamCarrier.Event) -> Bool {
        guard let held = sockets[id], held === carrier else { return false }
        if case .failed = event {
            sockets[id] = nil
            streamPaths[id] = nil
            client?.forget(candidate: carrier)
            if client?.socket === carrier { brokenSessionStream = id }
        }
        client?.carriersChanged()
        return true
    }

    /// The streams to where the server was: opened again to where it is now, the session's own
    /// first (a stream, unlike a UDP socket, reaches one address).
    func restreamToServer() {
        for (id, carrier) in sockets {
            guard let stream = carrier as? StreamCarrier, stream.peer != server, let path = streamPaths[id] else { continue }
            stream.close()
            sockets[id] = nil
            streamPaths[id] = nil
            client?.forget(candidate: stream)
            guard let client, client.socket === stream, let fresh = try? self.stream(for: path) else { continue }
            client.rebind(to: fresh)
        }
    }

    func forgetSocketsNotOn(_ paths: [Path]) {
        // The core's paths are the uplinks' UDP paths; a stream over one of them stays with it.
        for id in sockets.keys where !paths.contains(where: { $0.id == id.over(.udp) }) {
            if let socket = sockets.removeValue(forKey: id) {
                // The session's own, when a bind to where it goes failed: its address is gone,
                // so the session sends on nothing until a bind works.
                if client?.socket === socket { client?.rebind(to: Unbound()) }
                client?.forget(candidate: socket)
                (socket as? StreamCarrier)?.close()
            }
            streamPaths[id] = nil
        }
    }
}
