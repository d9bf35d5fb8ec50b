import Topology
import ArgumentParser
import Basics
import ConfigReader
import Control
import ControlWire
import Device
import Diagnosis
import Glibc
import Lockdown
import Netlink
import PathMonitor
import Reconnector
import Settings
import Streams
import Synchronization
import SystemDNS
import Tunnel

/// The doctor's probes of each server: its name looked up, the route to it, a handshake
/// initiation over UDP and, with `tcp:`, TLS and an initiation inside it.
extension DoctorFacts {
    static func server(_ entry: ServerEntry, settings: ClientSettings, model: NetworkModel?, mark: UInt32?,
                       key: Result<(PrivateKey, Credentials?), DoctorError>, lockdown: Lockdown?, quiet: String? = nil) -> ServerFacts {
        let port = entry.endpoint.port ?? 0
        var facts = ServerFacts(name: entry.name, host: entry.endpoint.host, port: port, lookup: .literal, routes: [],
                                udp: .notTried("no address to send to"), streamPort: settings.stream?.port)
        var addresses: [IPAddress]
        if let address = entry.endpoint.address {
            addresses = [address]
        } else {
            let started = Instant.now()
            do throws(ResolverError) {
                addresses = try Resolver.addresses(of: entry.endpoint.host, mark: mark)
                facts.lookup = .resolved(addresses, took: Instant.now() - started)
            } catch {
                facts.lookup = .failed("\(error)", temporary: error.isTemporary, took: Instant.now() - started)
                addresses = []
            }
        }
        guard let model else {
            facts.udp = .notTried("the kernel's routes could not be read")
            return facts
        }
        facts.routes = addresses.map { AddressRoutes(address: $0, paths: model.paths(to: $0)) }
        guard let target = facts.routes.first(where: { !$0.paths.isEmpty }) else {
            if !addresses.isEmpty { facts.udp = .notTried("no route to send over") }
            if settings.stream != nil { facts.stream = .notTried("no route to send over") }
            return facts
        }
        if let quiet {
            facts.udp = .notTried(quiet)
            if settings.stream != nil { facts.stream = .notTried(quiet) }
            return facts
        }
        let path = target.paths[0]
        let gateway = SocketAddress(target.address, port: port)
        let core: ClientCore
        do {
            let (privateKey, credentials) = try key.get()
            core = try ClientCore(privateKey: privateKey, serverKey: entry.key, credentials: credentials,
                                  version: settings.protocolVersion, cipher: settings.cipher)
        } catch {
            facts.udp = .notTried("\(error)")
            if settings.stream != nil { facts.stream = .notTried("\(error)") }
            return facts
        }
        facts.udp = udpProbe(gateway, over: path, core: core, mark: mark, lockdown: lockdown)
        if let stream = settings.stream {
            facts.stream = streamProbe(gateway, entry: entry, stream: stream, settings: settings, over: path, core: core, mark: mark, lockdown: lockdown)
        }
        return facts
    }

    /// Handshake initiations over UDP from `path`'s interface and source, with the session's mark.
    static func udpProbe(_ gateway: SocketAddress, over path: Path, core: ClientCore, mark: UInt32?, lockdown: Lockdown?) -> Probe {
        let via = "\(path.interface) (\(path.source))"
        let before = stopped(lockdown)
        let socket: UDPSocket
        do {
            socket = try UDPSocket(bindingTo: SocketAddress(path.source, port: 0), device: path.interface, mark: mark)
        } catch {
            return .failed("\(error)", via: via)
        }
        var core = core
        var stranger: Int?
        for _ in 0..<DoctorCommand.tries {
            switch exchange(with: gateway, through: socket, core: &core, wait: DoctorCommand.wait) {
            case .answered(let answer, let from, let rtt):
                if case .unexpected(let bytes) = answer { stranger = bytes; continue }
                return .answered(answer, from: "\(from)", rtt: rtt, via: via)
            case .failed(let why): return .failed(why, via: via, stoppedByLockdown: increase(since: before, lockdown))
            case .silent: continue
            }
        }
        if let stranger { return .answered(.unexpected(bytes: stranger), from: "\(gateway)", rtt: .zero, via: via) }
        return .silent(tries: DoctorCommand.tries, wait: DoctorCommand.wait, via: via, stoppedByLockdown: increase(since: before, lockdown))
    }

    /// TCP and TLS to the gateway's `tcp` port from `path` (through the proxy, when there is one),
    /// then a handshake initiation inside.
    static func streamProbe(_ gateway: SocketAddress, entry: ServerEntry, stream: ClientStreamSettings, settings: ClientSettings,
                            over path: Path, core: ClientCore, mark: UInt32?, lockdown: Lockdown?) -> Probe {
        let via = "\(path.interface) (\(path.source))"
        let target = SocketAddress(gateway.ip, port: stream.port)
        let context: TLSContext
        let proxy: HTTPProxy?
        do {
            context = try TLSContext.client(serverName: stream.serverName ?? entry.endpoint.host)
            var at: IPAddress?
            if let named = stream.proxy, named.address == nil {
                // Named by host: as the agent does, its name is looked up over this path's uplink.
                let found = try Resolver.addresses(of: named.endpoint.host, mark: mark, device: path.interface)
                guard let usable = found.first(where: { AgentCore.mayDial($0, from: path, carried: settings.mode.splitPrefixes) }) else {
                    return .notTried("the proxy's name \(named.endpoint.host) gave no address a stream from \(path.interface) may go to "
                        + "(\(found.map(\.description).joined(separator: ", ")))")
                }
                at = usable
            }
            proxy = try ClientDaemon.CoreRunner.proxy(settings, at: at)
        } catch {
            return .notTried("\(error)")
        }
        let before = stopped(lockdown)
        let started = Instant.now()
        let done = Semaphore()
        let first = Mutex<StreamCarrier.Event?>(nil)
        let carrier = StreamCarrier.open(to: target, as: gateway, host: entry.endpoint.address == nil ? entry.endpoint.host : nil,
                                         from: path.source, device: path.interface, mark: mark, proxy: proxy, context: context,
                                         timeout: DoctorCommand.streamWait) { _, event in
            let isFirst = first.withLock { told in
                defer { if told == nil { told = event } }
                return told == nil
            }
            if isFirst { done.signal() }
        }
        defer { carrier.close() }
        // The carrier says how the opening went within its timeout, whatever happens.
        done.wait()
        let opened = Instant.now() - started
        switch first.withLock({ $0 }) {
        case .opened:
            var core = core
            let inside: Answer? = switch exchange(with: gateway, through: carrier, core: &core, wait: DoctorCommand.streamWait) {
            case .answered(let answer, _, _): answer
            default: nil
            }
            return .answered(.tls(suite: carrier.suite, gateway: inside), from: "\(target)", rtt: opened, via: via)
        case .failed(let why) where why.contains("no answer") || why.contains("timed out"):
            return .silent(tries: 1, wait: DoctorCommand.streamWait, via: via, stoppedByLockdown: increase(since: before, lockdown))
        case .failed(let why): return .failed(why, via: via)
        case nil: return .failed("the stream said nothing", via: via)
        }
    }

    enum Exchange {
        case answered(Answer, from: SocketAddress, rtt: Duration)
        case silent
        case failed(String)
    }

    /// One handshake initiation through `carrier` and what came back within `wait`. Nothing
    /// more is sent: no identity after a version 3 response, so the gateway holds no session;
    /// a version 2 session the response made is left unused (a goodbye would end the agent's
    /// session with it), and none is made while an agent runs (`gather`).
    static func exchange(with gateway: SocketAddress, through carrier: any PacketCarrier, core: inout ClientCore, wait: Duration) -> Exchange {
        let sent = Instant.now()
        let datagrams: [[UInt8]]
        do throws(CryptoError) {
            datagrams = try core.initiation(now: sent, wallClock: .now())
        } catch {
            return .failed("\(error)")
        }
        for datagram in datagrams {
            let refused: DeviceError? = datagram.withUnsafeBytes { bytes in
                do throws(DeviceError) {
                    _ = try carrier.send(bytes, to: gateway)
                    return nil
                } catch {
                    return error
                }
            }
            if let refused { return .failed("\(refused)") }
        }
        var buffer = [UInt8](repeating: 0, count: 65_536)
        let deadline = sent + wait
        var stranger: (Int, SocketAddress)?
        while case let now = Instant.now(), now < deadline {
            let received: Result<(length: Int, peer: SocketAddress, segment: Int)?, DeviceError> = buffer.withUnsafeMutableBytes { bytes in
                do throws(DeviceError) {
                    return .success(try carrier.receiveJoined(into: bytes, timeout: deadline - now))
                } catch {
                    return .failure(error)
                }
            }
            let got: (length: Int, peer: SocketAddress, segment: Int)
            switch received {
            case .failure(let error): return .failed("\(error)")
            case .success(nil): continue
            case .success(let some?): got = some
            }
            var datagram = Array(buffer[0..<min(got.length, max(got.segment, 1))])
            let (version, type) = (datagram.first ?? 0, datagram.count > 1 ? datagram[1] : 0)
            let rtt = Instant.now() - sent
            switch core.receive(&datagram, fromServer: got.peer == gateway, now: .now()) {
            case .established:
                // No goodbye: on the gateway it would first promote the doctor's session over the
                // agent's, then end both. An unused session is replaced by the next handshake.
                return .answered(.response(version: version), from: got.peer, rtt: rtt)
            case .rejected: return .answered(.rejected, from: got.peer, rtt: rtt)
            case .cookie: return .answered(.cookieReply, from: got.peer, rtt: rtt)
            case .send: return .answered(type == 5 ? .cookieReply : .response(version: version), from: got.peer, rtt: rtt)
            case .sessionUnknown: return .answered(.sessionUnknown, from: got.peer, rtt: rtt)
            default:
                // A hint names a session the doctor never had: still the gateway's voice, from its address.
                if type == 4, got.peer == gateway, datagram.count == 8 { return .answered(.sessionUnknown, from: got.peer, rtt: rtt) }
                stranger = (datagram.count, got.peer)
            }
        }
        if let (bytes, peer) = stranger { return .answered(.unexpected(bytes: bytes), from: peer, rtt: Instant.now() - sent) }
        return .silent
    }
}
