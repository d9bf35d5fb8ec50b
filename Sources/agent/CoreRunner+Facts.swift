import Topology
import Connectivity
import SystemDNS
import Logging
import Observability
import ConfigReader
import Glibc
import Lockdown
import Basics
import PathMonitor
import Reconnector
import Device
import Tunnel
import Streams
import Netlink
import Settings

/// Facts in: the kernel, the power supply, suspends, signals, the data plane's notices, look-ups,
/// checks and probes, a reload, all turned into the core's events.
extension ClientDaemon.CoreRunner {
    /// Every change the kernel reported goes to the core.
    func monitorSpoke() {
        var changes: [NetworkChange] = []
        var notices: [RoutingNotice] = []
        for event in monitor.next(timeout: .zero) {
            switch event {
            case .routing(let more): notices += more
            case .paths(_, _, let change), .ignored(_, _, let change): changes.append(change)
            case .resynced(let difference, _):
                // The kernel dropped messages: a fresh dump stands in for them.
                metrics.resynced()
                log.warning("netlink overrun; routing state read again",
                            metadata: ["changes": .stringConvertible(difference.count), "resyncs": .stringConvertible(monitor.resyncs)])
                changes += difference
            case .reopened(let error):
                log.warning("netlink socket failed; reopened", error: error, metadata: ["reopens": .stringConvertible(monitor.reopens)])
            }
        }
        for change in changes { feed(.network(change)) }
        effects.networkObserved(core.network.model)
        if !notices.isEmpty { routingNoticed(notices) }
        // A network change is when DHCP clients and their hooks rewrite resolv.conf.
        checkResolvers()
    }

    /// The tunnel's own search domains, which resolv.conf holds beside the network's.
    var tunnelSearch: [String] { effects.dns?.applied?.searchDomains ?? [] }

    /// What the rules decided (or wait for), for the operator.
    func report(_ decision: OnDemandDecision) {
        switch decision {
        case .decided(let verdict):
            log.notice("on-demand", metadata: ["rule": "\(verdict.rule)", "action": "\(verdict.action.rawValue)",
                                               "path": "\(verdict.interface)", "lockdown": "\(verdict.liftsLockdown ? "lifted" : "kept")"])
        case .waiting(let rule, let wanted, let path):
            let interface = core.network.model.links[path.linkIndex]?.name ?? "link \(path.linkIndex)"
            log.info("on-demand waits", metadata: ["rule": "\(rule)", "path": "\(interface)",
                                                   "for": "\(wanted.map(\.description).joined(separator: ","))"])
        }
    }

    func powerMayHaveChanged() {
        let source = PowerSupply.current()
        guard source != reconnector.power else { return }
        log.info("power", metadata: ["source": "\(source.rawValue)"])
        feed(.powerChanged(source))
    }

    func checkSuspend() -> Duration? {
        let clocks = SuspendDetector.clocks()
        return suspends.check(monotonic: clocks.monotonic, boottime: clocks.boottime)
    }

    func handle(_ event: ClientDaemon.Event) {
        switch event {
        case .signal(SIGTSTP):
            sleptAt = Instant.now()
            feed(.sleep)
        case .signal(SIGCONT):
            // The gap between the clocks says how long the machine really slept; the hook's
            // announcement says when it went; both cover a suspend the hook missed.
            let gap = checkSuspend() ?? .zero
            let announced = sleptAt.map { Instant.now() - $0 } ?? .zero
            sleptAt = nil
            feed(.powerChanged(PowerSupply.current()))
            woke(after: max(gap, announced))
        case .signal(SIGHUP):
            reload()
        case .signal(let number):
            if number == SIGTERM, service.stopSkipsExecStop {
                // `systemctl stop` while the start still waits skips ExecStop: systemd's job
                // says whether this is the operator's stop.
                let (opens, why) = UnitStop.readOwn(timeout: .seconds(2))
                log.info("stopping", metadata: ["signal": "\(number)", "machine": opens ? "opens: \(why)" : "stays closed: \(why)"])
                feed(.request(.stop(opens ? .byOperator : .bySignal)))
                return
            }
            log.info("stopping", metadata: ["signal": "\(number)"])
            feed(.request(.stop(.bySignal)))
        case .lookedUp(let index, let result):
            lookedUp(index, result)
        case .proxyLookedUp(let path, let result):
            switch result {
            case .success(let addresses): feed(.proxyLookedUp(on: path, addresses: addresses))
            case .failure(let error):
                // A name the network does not know is an answer; no answer is none.
                log.warning("the proxy's name has no address on this network", metadata: ["path": "\(path.interface)", "error": "\(error)"])
                feed(.proxyLookedUp(on: path, addresses: error.isTemporary ? nil : []))
            }
        case .dataPlane(let event):
            dataPlane(event)
        case .control(let call):
            answer(call)
        case .connectivity(let result, let id):
            checked(result, on: id)
        case .stream(let id, let carrier, let event):
            // A stream replaced or closed since says nothing of the path's stream now.
            guard effects.streamChanged(id, carrier, event) else { return }
            switch event {
            case .opened:
                log.info("stream opened", metadata: ["path": "\(id)", "stream": "\(carrier.label)", "tls": "\(carrier.suite ?? "-")"])
            case .failed(let why):
                log.warning("stream failed", metadata: ["path": "\(id)", "stream": "\(carrier.label)", "why": "\(why)"])
                metrics.streamFailed()
                feed(.streamFailed(id, why: why))
            }
        case .found(let fact):
            if case .probeAnswered(let probe, _, let result) = fact {
                var metadata: Logger.Metadata = ["url": "\(probe.url)", "expected": "\(result != .unexpected)"]
                if case .expected(let proof?) = result { metadata["key"] = "\(proof.pin)" }
                log.info("on-demand probe answered", metadata: metadata)
            }
            feed(.networkFact(fact))
        }
    }

    /// What the data plane told the core, counted for the metrics on the way.
    func dataPlane(_ event: AgentEvent) {
        switch event {
        case .handshakeCompleted, .handoverReady: metrics.handshake("completed")
        case .handshakeRejected, .handoverRejected: metrics.handshake("rejected")
        default: break
        }
        feed(event)
    }

    /// After a suspend the machine may be on another network, where the server's name may
    /// resolve elsewhere. The time asleep was no time without an answer.
    func woke(after slept: Duration) {
        feed(.wake(sleptFor: slept))
    }

    /// Looks up server `index`'s name for the core, off the deciding thread (at once, for a
    /// server given by address or a look-up that cannot start).
    func lookUp(_ index: Int) -> [AgentEvent] {
        let entry = settings.servers[index]
        guard entry.endpoint.address == nil else {
            return [.serverLookedUp(server: index, addresses: [entry.endpoint.host].compactMap { IPAddress($0) })]
        }
        do {
            try ServerLookup.start(entry.endpoint.host, mark: settings.mode.socketMark,
                                   avoiding: effects.dns?.applied?.resolvers ?? []) { [weak mailbox] result in
                mailbox?.post(.lookedUp(server: index, result))
            }
        } catch {
            log.warning("cannot look up the server's name", metadata: ["error": "\(error)"])
            return [.serverLookedUp(server: index, addresses: nil)]
        }
        return []
    }

    /// Looks up the proxy's name for the core over `path`'s uplink, off the deciding thread.
    func lookUpProxy(on path: Path) -> [AgentEvent] {
        guard let host = settings.stream?.proxy?.endpoint.host else { return [] }
        do {
            try ServerLookup.start(host, mark: settings.mode.socketMark, avoiding: effects.dns?.applied?.resolvers ?? [],
                                   device: path.interface) { [weak mailbox] result in
                mailbox?.post(.proxyLookedUp(path, result))
            }
        } catch {
            log.warning("cannot look up the proxy's name", metadata: ["error": "\(error)"])
            return [.proxyLookedUp(on: path, addresses: nil)]
        }
        return []
    }

    /// A look-up ended: what it gave goes to the core, which follows the server when its name
    /// moved (and never into the tunnel's own routes).
    func lookedUp(_ index: Int, _ result: Result<[IPAddress], ResolverError>) {
        switch result {
        case .success(let addresses):
            feed(.serverLookedUp(server: index, addresses: addresses))
        case .failure(let error):
            log.warning("server name not resolved; keeping its address",
                        metadata: ["server": "\(settings.servers[index].name)", "error": "\(error)"])
            feed(.serverLookedUp(server: index, addresses: nil))
        }
    }

    /// Stops before the tunnel ever came up, with `reason` for the operator and the exit status.
    func giveUp(_ reason: String) {
        log.error("giving up", metadata: ["reason": "\(reason)"])
        failure = reason
        running = false
    }

}
