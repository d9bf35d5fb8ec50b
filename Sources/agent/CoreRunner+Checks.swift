import Topology
import Basics
import Connectivity
import Device
import PathMonitor
import Reconnector
import Settings

/// The connectivity checks and the on-demand rules' probes: each made over one uplink, outside
/// the tunnel, on a thread of its own; what it found comes back through the mailbox.
extension ClientDaemon.CoreRunner {
    /// Starts a connectivity check over `path` on a thread of its own; its result comes back
    /// through the mailbox.
    func checkConnectivity(via path: Path) {
        log.info("connectivity check", metadata: ["path": "\(path.interface)", "url": "\(settings.portal.url.text)"])
        run(settings.portal, via: path) { .connectivity($0, path.id) }
    }

    func checked(_ result: Connectivity, on id: Path.ID) {
        let interface = core.network.model.links[id.linkIndex]?.name ?? "link \(id.linkIndex)"
        switch result {
        case .online:
            metrics.checked("online")
            if case .portal = reconnector.state {
                log.info("connectivity check passed: the portal is open", metadata: ["path": "\(interface)"])
            } else {
                log.warning("connectivity check passed: the network reaches the internet, the server does not answer",
                            metadata: ["path": "\(interface)", "server": "\(effects.server)"])
            }
        case .portal(let url):
            metrics.checked("portal")
            log.info("connectivity check: captive portal", metadata: ["path": "\(interface)", "url": "\(url)"])
        case .unknown(let why):
            metrics.checked("unknown")
            log.warning("connectivity check failed", metadata: ["path": "\(interface)", "error": "\(why)"])
        }
        feed(.connectivity(result, on: id))
    }

    /// One on-demand probe over `path`, outside the tunnel, made as the connectivity check is:
    /// a plain one as the check itself, a pinned one over TLS. Why a probe proved nothing is
    /// logged; the core hears only what it showed (at once, for a probe that cannot be made).
    func startProbe(_ probe: OnDemandRule.Probe, via path: Path, generation: UInt64) -> [AgentEvent] {
        log.info("on-demand probe", metadata: ["path": "\(path.interface)", "url": "\(probe.url)"])
        if probe.pin != nil {
            guard let pinned = PinnedProbe(probe) else {
                return [.networkFact(.probeAnswered(probe, generation: generation, .unexpected))]
            }
            let log = log
            offThread(failed: .found(.probeAnswered(probe, generation: generation, .unexpected))) { mark, avoiding in
                switch pinned.run(via: path, mark: mark, avoiding: avoiding) {
                case .success(let proof):
                    return .found(.probeAnswered(probe, generation: generation, .expected(proof: proof)))
                case .failure(let why):
                    log.warning("on-demand probe proved nothing", metadata: ["path": "\(path.interface)", "url": "\(probe.url)",
                                                                             "error": "\(why)"])
                    return .found(.probeAnswered(probe, generation: generation, .unexpected))
                }
            }
            return []
        }
        guard let url = CheckURL(probe.url), !url.isHTTPS else {
            return [.networkFact(.probeAnswered(probe, generation: generation, .unexpected))]
        }
        run(PortalCheck(url: url, expect: probe.expect), via: path) {
            .found(.probeAnswered(probe, generation: generation, $0 == .online ? .expected(proof: nil) : .unexpected))
        }
        return []
    }

    /// Makes `check` over `path` on a thread of its own (marked sockets, the tunnel's resolvers
    /// avoided) and posts what `answer` makes of its result.
    func run(_ check: PortalCheck, via path: Path, answer: @escaping @Sendable (Connectivity) -> ClientDaemon.Event) {
        offThread(failed: answer(.unknown("cannot start its thread"))) { mark, avoiding in
            answer(check.run(via: path, mark: mark, avoiding: avoiding))
        }
    }

    /// Runs `work` on a thread of its own with the session's mark and the tunnel's resolvers to
    /// avoid, and posts the event it returns (`failed` when no thread could be had).
    func offThread(failed: ClientDaemon.Event? = nil,
                   _ work: @escaping @Sendable (_ mark: UInt32?, _ avoiding: [IPAddress]) -> ClientDaemon.Event) {
        let mark = settings.mode.socketMark
        let avoiding = effects.dns?.applied?.resolvers ?? []
        do {
            try OSThread.detach { [weak mailbox] in
                mailbox?.post(work(mark, avoiding))
            }
        } catch {
            log.warning("cannot start a thread", metadata: ["error": "\(error)"])
            if let failed { mailbox.post(failed) }
        }
    }
}
