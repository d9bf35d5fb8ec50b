public import Topology
public import Basics
import Glibc
public import Netlink

/// What the live monitor saw in one buffer from the kernel.
public enum MonitorEvent: Sendable {
    /// The ranked paths to the server changed significantly, after `change` (described).
    case paths([Path], after: String, change: NetworkChange)
    /// A change that moved nothing for the tunnel, described.
    case ignored(String, why: String, change: NetworkChange)
    /// The kernel dropped messages (overrun) and a fresh dump was reconciled: `changes` is the
    /// net difference applied; `paths` is set when the paths changed.
    case resynced(changes: [NetworkChange], paths: [Path]?)
    /// The socket failed and was reopened, followed by a resync.
    case reopened(NetlinkError)
    /// Policy rules added or removed and routes removed, with who asked: after the changes of
    /// the same buffer.
    case routing([RoutingNotice])
}

/// Follows the kernel's rtnetlink messages and keeps the paths to one server current.
///
/// Subscribes first, then dumps, so no change falls between the two; a later duplicate of
/// something the dump already showed changes nothing in the model.
public final class LiveMonitor {
    /// The server's address, whose paths are tracked.
    public var endpoint: IPAddress { tracker.endpoint }
    public private(set) var tracker: PathTracker
    public private(set) var decoder = NetlinkDecoder()
    /// Overruns survived by re-dumping.
    public private(set) var resyncs = 0
    public private(set) var reopens = 0
    private var events: NetlinkSocket
    private let receiveBuffer: Int
    private let tunnelInterface: String?
    private let namespace: NetworkNamespace?
    /// Raw buffers, in order, when recording.
    private let record: ((ArraySlice<UInt8>, _ isDump: Bool) -> Void)?

    /// Opens the monitor; `record` sees the dump's buffers and then every buffer received.
    /// With `namespace`, every socket it opens watches that namespace.
    public init(endpoint: IPAddress, tunnelInterface: String? = nil, receiveBuffer: Int = 4 << 20,
                namespace: NetworkNamespace? = nil,
                record: ((ArraySlice<UInt8>, _ isDump: Bool) -> Void)? = nil) throws(NetlinkError) {
        self.namespace = namespace
        self.tunnelInterface = tunnelInterface
        self.receiveBuffer = receiveBuffer
        self.record = record
        events = try Self.open(in: namespace, groups: Self.groups, receiveBuffer: receiveBuffer)
        tracker = PathTracker(model: NetworkModel(tunnelInterface: tunnelInterface), endpoint: endpoint)
        tracker = PathTracker(model: try freshModel(recording: true), endpoint: endpoint)
    }

    /// The current ranked paths.
    public var paths: [Path] { tracker.paths }

    /// What the monitor follows: the paths' links, addresses and routes, and the policy rules
    /// (someone may remove the tunnel's).
    static let groups: NetlinkGroups = NetlinkGroups.paths.union(.rules)

    /// Tracks the paths to `endpoint` from now on; returns them when they changed significantly.
    public func retarget(to endpoint: IPAddress) -> [Path]? { tracker.retarget(to: endpoint) }

    /// Learns every address the server has (see `PathTracker.reachableAlternative`).
    public func learn(serverAddresses: [IPAddress]) { tracker.learn(serverAddresses: serverAddresses) }

    /// The socket to poll for readiness.
    public var fileDescriptor: Int32 { events.fileDescriptor }

    /// Waits for the next buffer from the kernel (at most `timeout`, if given) and applies it.
    public func next(timeout: Duration? = nil) -> [MonitorEvent] {
        do {
            let bytes = try events.receive(timeout: timeout)
            if bytes.isEmpty { return [] }
            record?(bytes, false)
            let batch = decoder.decode(bytes)
            return apply(batch.changes.map(LinkClassifier.refine)) + (batch.notices.isEmpty ? [] : [.routing(batch.notices)])
        } catch let error where error.isOverrun {
            return [resync()]
        } catch {
            // Anything else: the socket is no longer to be trusted. Reopen, then resync.
            reopens += 1
            if let socket = try? Self.open(in: namespace, groups: Self.groups, receiveBuffer: receiveBuffer) { events = socket }
            return [.reopened(error), resync()]
        }
    }

    /// Applies decoded changes, reporting each as a path change or as ignored.
    public func apply(_ changes: [NetworkChange]) -> [MonitorEvent] {
        changes.map { change in
            let text = tracker.model.describe(change)
            if let paths = tracker.apply(change) { return .paths(paths, after: text, change: change) }
            return .ignored(text, why: "paths to \(endpoint) unchanged", change: change)
        }
    }

    /// Re-dumps and applies only the net difference, so a lost message never leaves the model stale.
    public func resync() -> MonitorEvent {
        resyncs += 1
        // What is still queued predates the overrun: replayed after the dump it would undo
        // the kernel's silent flushes. Drop it; the dump says everything it said.
        for _ in 0..<100_000 {
            guard let bytes = try? events.receive(timeout: .zero), !bytes.isEmpty else { break }
        }
        guard let fresh = try? freshModel(recording: false) else { return .resynced(changes: [], paths: nil) }
        let difference = tracker.model.changes(toMatch: fresh)
        var changed: [Path]?
        for change in difference { if let paths = tracker.apply(change) { changed = paths } }
        return .resynced(changes: difference, paths: changed)
    }

    /// The kernel's state now, from a dump on a socket of its own (the event socket's queue
    /// keeps only notifications).
    private func freshModel(recording: Bool) throws(NetlinkError) -> NetworkModel {
        let socket = try Self.open(in: namespace)
        var model = NetworkModel(tunnelInterface: tunnelInterface)
        let changes = try socket.dump(decoder: &decoder) { [record] bytes in
            if recording { record?(bytes, true) }
        }
        for change in changes { model.apply(LinkClassifier.refine(change)) }
        return model
    }

    /// Asks the kernel which route it would take to the server, for comparison with the model.
    public func kernelRoute(mark: UInt32 = 0) throws(NetlinkError) -> Route? {
        try Self.open(in: namespace).lookupRoute(to: endpoint, mark: mark)
    }

    private static func open(in namespace: NetworkNamespace?, groups: NetlinkGroups = [], receiveBuffer: Int = 0)
        throws(NetlinkError) -> NetlinkSocket
    {
        guard let namespace else { return try NetlinkSocket(groups: groups, receiveBuffer: receiveBuffer) }
        return try namespace.run { () throws(NetlinkError) in
            try NetlinkSocket(groups: groups, receiveBuffer: receiveBuffer)
        }
    }
}

/// Refines what netlink says about a link with what sysfs knows: Wi-Fi and WWAN devices are
/// ARPHRD_ETHER to netlink, and only `uevent`'s DEVTYPE or a `wireless` directory tell them apart.
public enum LinkClassifier {
    public static func refine(_ change: NetworkChange) -> NetworkChange {
        guard case .linkChanged(var link) = change, link.kind == .ethernet || link.kind == .other else { return change }
        link.kind = kind(of: link.name, default: link.kind)
        return .linkChanged(link)
    }

    static func kind(of name: String, default fallback: LinkKind) -> LinkKind {
        guard !name.contains("/"), !name.hasPrefix(".") else { return fallback }
        let base = "/sys/class/net/\(name)"
        if access(base + "/wireless", F_OK) == 0 || access(base + "/phy80211", F_OK) == 0 { return .wifi }
        guard let uevent = SystemFiles.text(base + "/uevent") else { return fallback }
        for line in uevent.split(separator: "\n") where line.hasPrefix("DEVTYPE=") {
            switch line.dropFirst("DEVTYPE=".count) {
            case "wlan": return .wifi
            case "wwan": return .wwan
            default: break
            }
        }
        return fallback
    }
}
