public import PathMonitor

/// What carries out the core's commands: the daemon's sockets and session, or a replay's world.
/// Timers are not here: whoever drives reads `Reconnector.timers` and feeds `timerFired`.
public protocol SessionDriver {
    /// Open the session's socket on `path` (`first`), or move it there with the keys kept.
    mutating func bind(_ path: Path, first: Bool)
    /// Send a handshake initiation for fresh keys on `path`.
    mutating func handshake(on path: Path)
    /// Send the handshake in flight on `path` again: a fresh initiation within the same attempt.
    mutating func resendHandshake(on path: Path)
    /// Send authenticated probe `id` on `path`; its echo names the id.
    mutating func probe(_ id: UInt64, via path: Path)
    /// Send authenticated probe `id` on `path`, padded to stand for a tunnel packet of `size`
    /// bytes; the server's echo is as big.
    mutating func probe(_ id: UInt64, via path: Path, size: Int)
    /// Set the tunnel device's MTU (the session's path carries no more).
    mutating func setTunnelMTU(_ mtu: Int)
    /// The tunnel cannot come up without an operator.
    mutating func reportFailure(_ reason: Reason)
    /// One state change, for the operator's log.
    mutating func transitioned(_ transition: Transition)
    /// Talk to server `index` of the list from now on; its session starts with the next handshake.
    mutating func useServer(_ index: Int)
    /// Handshake with server `index` over the session's socket on `path`, keeping the current session.
    mutating func prepareHandover(to index: Int, on path: Path)
    /// The prepared session takes the traffic; the old server is told goodbye.
    mutating func completeHandover()
    /// The prepared session is forgotten.
    mutating func cancelHandover()
    /// The session ends with a goodbye to the server; the tunnel device and the lockdown stay.
    mutating func disconnect()
    /// Make one connectivity check over `path` outside the tunnel; its result is fed back as
    /// `Input.connectivity` (later, from the daemon's check thread; at once, in a replay).
    mutating func checkConnectivity(via path: Path)
    /// Let the portal window's process tree through the lockdown on `path` (to the login page at
    /// `url` too) until `until`.
    mutating func openPortalWindow(via path: Path, portal url: String, until: Instant)
    /// The lockdown is whole again.
    mutating func closePortalWindow()
    /// An on-demand rule trusts the network: the lockdown, the tunnel's routes and its
    /// resolvers step aside.
    mutating func liftLockdown(interface: String)
    /// The lockdown, the tunnel's routes and its resolvers are back.
    mutating func restoreLockdown()
}

/// The one action interpreter, run by the daemon and by every replay: facts go into the core,
/// its actions go to a `SessionDriver` in order, and the bookkeeping between them lives here:
/// which path each probe in flight went on (an echo names only its id), and that a stopping
/// agent does not roam.
public struct Interpreter: Sendable {
    public var machine: Reconnector
    /// Probes in flight: an echo for an id not here (stale, from before the server moved, or
    /// made up) proves nothing.
    private var probes: [UInt64: (path: Path.ID, size: Int?)] = [:]
    private var nextProbe: UInt64 = 1
    /// At most this many probes are remembered; the oldest is forgotten first.
    static let probesKept = 64
    public private(set) var stopping = false

    public init(_ machine: Reconnector) { self.machine = machine }

    /// Feeds `input` at `now` and carries the actions out through `driver`; returns them. Once
    /// stopping, nothing is fed: whatever comes after the stop (a SIGCONT a service manager sends,
    /// a timer) must not move a session whose goodbye is on its way.
    @discardableResult
    public mutating func feed<Driver: SessionDriver>(_ input: Input, now: Instant, driver: inout Driver) -> [Action] {
        guard !stopping else { return [] }
        let actions = machine.handle(input, now: now)
        for action in actions {
            switch action {
            case .bind(let path, _): driver.bind(path, first: true)
            case .rebind(let path, _): driver.bind(path, first: false)
            case .handshake(let path, _): driver.handshake(on: path)
            case .resendHandshake(let path): driver.resendHandshake(on: path)
            case .probe(let path):
                driver.probe(remember(path, size: nil), via: path)
            case .probeSize(let size, let path):
                driver.probe(remember(path, size: size), via: path, size: size)
            case .setTunnelMTU(let mtu, _): driver.setTunnelMTU(mtu)
            case .reportFailure(let reason): driver.reportFailure(reason)
            case .report(let transition): driver.transitioned(transition)
            case .useServer(let index, _):
                // Echoes still on their way come from the old server: they prove nothing now.
                probes.removeAll()
                driver.useServer(index)
            case .prepareHandover(let index, let path): driver.prepareHandover(to: index, on: path)
            case .completeHandover:
                probes.removeAll()
                driver.completeHandover()
            case .cancelHandover: driver.cancelHandover()
            case .disconnect:
                probes.removeAll()
                driver.disconnect()
            case .checkConnectivity(let path): driver.checkConnectivity(via: path)
            case .openPortalWindow(let path, let url, let until): driver.openPortalWindow(via: path, portal: url, until: until)
            case .closePortalWindow: driver.closePortalWindow()
            case .liftLockdown(let interface): driver.liftLockdown(interface: interface)
            case .restoreLockdown: driver.restoreLockdown()
            case .armTimer, .cancelTimer, .quiesce: break
            }
        }
        return actions
    }

    /// A new probe's id, remembered with the path it goes on and its size.
    private mutating func remember(_ path: Path, size: Int?) -> UInt64 {
        let id = nextProbe
        nextProbe += 1
        probes[id] = (path.id, size)
        if probes.count > Self.probesKept, let oldest = probes.keys.min() { probes[oldest] = nil }
        return id
    }

    /// The echo of probe `id` came back after `rtt`: the fact to feed, or nil when no probe
    /// with that id is in flight. A size probe's echo counts only if it is as big as the probe
    /// (`size`, the tunnel packet it stood for): a server that echoed it short proved nothing.
    public mutating func echo(_ id: UInt64, rtt: Duration, size: Int? = nil) -> Input? {
        guard let probe = probes.removeValue(forKey: id) else { return nil }
        guard let wanted = probe.size else { return .probeReply(on: probe.path, rtt: rtt) }
        guard let size, size >= wanted else { return nil }
        return .sizeProbeReply(on: probe.path, size: wanted, rtt: rtt)
    }

    /// The server answers at another address: an echo from the old one proves nothing about it.
    public mutating func forgetProbes() { probes.removeAll() }

    /// The agent is stopping: no more decisions.
    public mutating func stop() { stopping = true }
}
