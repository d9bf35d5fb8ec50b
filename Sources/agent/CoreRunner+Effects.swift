import Topology
import Control
import ControlWire
import SystemDNS
import Logging
import Observability
import ConfigReader
import Glibc
import Lockdown
import Basics
import Reconnector
import Tunnel
import Settings
import PathMonitor

/// Decisions out: the core's effects carried out on the session's sockets, the lockdown and the
/// resolvers, through the driver every runner of the core shares (`CoreRunning`); what the core
/// keeps across processes.
extension ClientDaemon.CoreRunner: CoreRunning {
    var coreNow: Instant { Instant.now() }

    /// After each event: its transitions told to watchers once the machine has settled (the
    /// status beside each is the one it led to), the memory kept.
    func handled(_ event: AgentEvent, effects: [Effect]) {
        let made = effects.compactMap { if case .transition(let transition) = $0 { transition } else { nil } }
        if control.watched, !made.isEmpty {
            let now = Instant.now()
            let status = status(now: now).json
            for transition in made {
                let fields = [("transition", transitionStatus(transition, now: now).json), ("status", status)]
                control.publish(ControlProtocol.event("transition", fields))
            }
        }
        saveMemory()
    }

    /// The upkeep's news is not dropped with the rest: a lockdown the machine refused, or a
    /// restore's answer, is all that has it put back. It comes again through the mailbox, after
    /// what is waiting there.
    func ranAway(dropping dropped: [AgentEvent]) {
        let kept = dropped.filter { if case .damaged = $0 { true } else if case .intact = $0 { true } else { false } }
        log.error("effects kept producing events; the rest are dropped",
                  metadata: ["left": "\(dropped.count - kept.count)", "fed_again": "\(kept.count)"])
        for event in kept { mailbox.post(.dataPlane(event)) }
    }

    /// Carries one of the core's effects out on the session's sockets, the lockdown and the
    /// resolvers; returns what it produced at once. A change of the lockdown that nftables refused
    /// leaves the table uncertain (a closing still wanted; an opening refused, whose answer the
    /// core hears too, may have been taken all the same): the lockdown is not as it should be, and
    /// the core hears it as damage (`Upkeep`), and has it put back until it holds. A restore's
    /// refusal is its own answer.
    func perform(_ effect: Effect) -> [AgentEvent] {
        let refusals = effects.firewall?.refusalsEver ?? 0
        let produced = carryOut(effect)
        guard let firewall = effects.firewall, firewall.refusalsEver > refusals, let error = firewall.lastRefusal else { return produced }
        if case .restore = effect { return produced }
        return produced + [.damaged(.lockdown, Upkeep.Damage.lockdownRefused("\(error)"))]
    }

    private func carryOut(_ effect: Effect) -> [AgentEvent] {
        switch effect {
        // A socket that could not be had is the core's to decide on: it hears of it.
        case .bind(let path, _, _):
            do { try effects.bind(path, paths: reconnector.paths) } catch { return [error.event(on: path.id)] }
        case .handshake(let path, _):
            do { try effects.handshake(on: path) } catch { return [error.event(on: path.id)] }
        case .resendHandshake(let path):
            metrics.resentHandshake()
            do { try effects.handshake(on: path) } catch { return [error.event(on: path.id)] }
        case .probe(let id, let path, let size):
            if size == nil { metrics.probed() } else { metrics.sizeProbed() }
            do { try effects.probe(id, via: path, size: size) } catch { return [error.event(on: path.id)] }
        case .setTunnelMTU(let mtu):
            let kept = effects.setTunnelMTU(mtu)
            metrics.tunnelMTU(effects.tunnelMTU)
            if let kept { return [.tunnelMTUFailed(actual: kept.actual, why: kept.why)] }
        case .reportFailure(let reason):
            log.error("the tunnel cannot come up without help", metadata: ["reason": "\(reason.description)"])
        case .transition(let transition):
            lastTransition = transition
            service.transition(transition)
            metrics.record(transition)
            log.info("transition", metadata: transition.metadata)
        case .useServer(let index, let address):
            if let failure = effects.useServer(index, at: address) { return [.sessionFailed(failure)] }
        case .prepareHandover(let index, let address, let path): effects.prepareHandover(to: index, at: address, on: path)
        case .lookUpServer(let index): return lookUp(index)
        case .lookUpProxy(let path): return lookUpProxy(on: path)
        case .proxyAt(let addresses, let opening):
            let allowed = effects.proxyAt(addresses, opening: opening)
            if let opening, let address = addresses[opening] { return [.proxyAllowed(on: opening, address: address, allowed)] }
        case .allowServer(let index, let address, let lockdown):
            return [.serverAllowed(server: index, address: address, effects.allow(lockdown))]
        case .useAddress(let address, let why):
            if let failure = effects.useAddress(address, why: why) { return [.sessionFailed(failure)] }
        case .localNetworks(let prefixes, let widerClaims): effects.localNetworksChanged(prefixes, widerClaims: widerClaims)
        case .guestNetworks(let guests): effects.guestNetworksChanged(guests)
        case .completeHandover: effects.completeHandover()
        case .cancelHandover: effects.cancelHandover()
        case .disconnect: effects.disconnect()
        case .attachTunnel:
            do {
                try effects.attachTunnel()
                metrics.tunnelMTU(effects.tunnelMTU)
                return [.tunnelAttached]
            } catch {
                return [.tunnelFailed(error.message)]
            }
        case .resolvers(let decision): effects.useResolvers(decision)
        case .checkConnectivity(let path): checkConnectivity(via: path)
        case .openPortalWindow(let path, let url, _):
            metrics.portalWindow(open: true)
            windowOpened = true
            return [.portalWindowOpened(effects.openPortalWindow(via: path, portal: url, runtimeDirectory: control.path.parentDirectory))]
        case .closePortalWindow:
            metrics.portalWindow(open: false)
            effects.closePortalWindow()
        case .liftLockdown(let interface):
            if let refused = effects.liftLockdown(interface: interface) { return [.liftRefused(refused)] }
            metrics.lockdownLifted(true)
        case .restoreLockdown:
            metrics.lockdownLifted(false)
            effects.restoreLockdown()
        case .ready: service.ready()
        case .giveUp(.noAnswer(let wait, let interface)):
            let path = interface.map { " over \($0)" } ?? ""
            giveUp("no answer from the server \(effects.server) in \(wait.short)\(path): check that it runs, its "
                + "address and port, that UDP reaches it, and that 'server-key' is its public key")
        case .giveUp(.rejected):
            giveUp("the server rejected this client: check 'username' and 'password-file', or that the server's "
                + "users list this client's public key")
        case .giveUp(.tunnelFailed(let why)), .giveUp(.sessionFailed(let why)): giveUp(why)
        case .giveUp(.serverCarried(let index, let addresses)): giveUp(carried(index, addresses))
        case .stop(let opens):
            opensMachine = opens
            running = false
        case .restart(let changes):
            log.warning("configuration reloaded: the tunnel itself changed; restarting", metadata: ["changed": "\(changes.joined(separator: ","))"])
            restartRequested = true
            opensMachine = false
            running = false
        case .findOut(.probe(let probe, let path, let generation)): return startProbe(probe, via: path, generation: generation)
        case .findOut(let request):
            return facts.read(request, tunnelSearch: tunnelSearch).map { [.networkFact($0)] } ?? []
        case .followNotices(let notices): facts.follow(notices)
        case .onDemandDecided(let decision): report(decision)
        case .restore(let holding, let damage): return [restore(holding, damage)]
        case .openExclusion:
            return [.exclusionOpened(effects.openExclusion(runtimeDirectory: control.path.parentDirectory))]
        case .pingWatchdog: service.pingWatchdog()
        case .extendStart(let more): service.extendStart(by: more)
        case .writeMetrics: writeMetrics()
        case .upkeepHeld(let holding, let damage, let restores, let until):
            metrics.upkeepHeld(holding.rawValue)
            log.error("someone keeps taking it away: holding off before putting it back again",
                      metadata: ["what": "\(holding.rawValue)", "missing": "\(damage.what)", "by": "\(damage.by ?? "unknown")",
                                 "restores": "\(restores) in \(Upkeep.window.short)", "until": "\((until - Instant.now()).short)"])
        case .reply(let answer): return replied(answer)
        case .notice(.flapping(let interface, let losses, let over, let next)):
            log.warning("interface flapping", metadata: ["interface": "\(interface)", "losses": "\(losses)", "in": "\(over.short)",
                                                         "next_summary": "\(next.short)"])
        case .notice(.stillFlapping(let interface, let losses, let within, let total, let over)):
            log.warning("interface still flapping", metadata: ["interface": "\(interface)", "losses": "\(losses)", "in": "\(within.short)",
                                                               "total": "\(total)", "for": "\(over.short)"])
        case .notice(.stoppedFlapping(let interface, let losses, let over, let up)):
            log.info("interface stopped flapping", metadata: ["interface": "\(interface)", "losses": "\(losses)", "for": "\(over.short)",
                                                              "up": "\(up ? "yes" : "no")"])
        case .notice(.takenAway(let holding, let damage)) where damage.refused:
            log.warning("not as it should be: the machine refused a change", metadata: ["what": "\(holding.rawValue)",
                                                                                         "error": "\(damage.what)"])
        case .notice(.takenAway(let holding, let damage)):
            log.warning("taken away by someone else", metadata: ["what": "\(holding.rawValue)", "missing": "\(damage.what)",
                                                                 "by": "\(damage.by ?? "unknown")"])
        case .notice(.serverCarried(let index, let addresses)): log.warning("\(carried(index, addresses))")
        case .notice(.serverNameUnusable(let index, let addresses)):
            log.warning("the server's name gives no address this machine can use now; keeping its address",
                        metadata: ["server": "\(settings.servers[index].name)",
                                   "addresses": "\(addresses.map(\.description).joined(separator: ","))"])
        }
        return []
    }

    /// Why server `index`, whose name gave `addresses` at start, is never used: words the
    /// operator can act on.
    private func carried(_ index: Int, _ addresses: [IPAddress]) -> String {
        let listed = addresses.map(\.description).joined(separator: ", ")
        guard addresses.contains(where: \.isRemoteUnicast) else {
            return "server \(settings.servers[index].name) gives no address of another host (\(listed)): "
                + "this machine, link-local, multicast, broadcast and IPv4-mapped addresses cannot carry the session"
        }
        return "the split routes contain server \(settings.servers[index].name) (\(listed)): "
            + "the tunnel would carry its own packets; narrow them"
    }

    /// The machine as the previous process of the agent left it, if it left anything usable.
    static func restoredMachine(settings: ClientSettings, memoryPath: String, log: Logger) -> Reconnector {
        let now = Instant.now()
        let power = PowerSupply.current()
        let seed = UInt64(getpid())
        let names = settings.servers.map(\.name)
        guard let text = SystemFiles.text(memoryPath) else {
            return Reconnector(config: settings.reconnect, power: power, seed: seed, now: now, servers: names)
        }
        guard let memory = Reconnector.Memory(text: text) else {
            log.warning("reconnect state unreadable; starting with a full budget", metadata: ["file": "\(memoryPath)"])
            return Reconnector(config: settings.reconnect, power: power, seed: seed, now: now, servers: names)
        }
        let reconnector = Reconnector(config: settings.reconnect, power: power, seed: seed, now: now, memory: memory, servers: names)
        log.info("reconnect state restored", metadata: ["budget_left": "\(reconnector.tokens)", "dead_paths": "\(memory.dead.count)"])
        return reconnector
    }

    /// The metrics file, now (the core says when: `Heartbeats`).
    func writeMetrics() {
        guard var file = metricsFile else { return }
        if let client = effects.client { metrics.sync(client) }
        if let error = file.write(metrics.exposition()) {
            log.warning("cannot write the metrics file", metadata: ["error": "\(error)"])
        }
        metricsFile = file
    }

    func saveMemory() {
        let memory = reconnector.memory
        guard memory != savedMemory else { return }
        do {
            try SystemFiles.write(memory.text, to: memoryPath, mode: 0o600)
        } catch {
            if savedMemory != nil || error.code != ENOENT {
                log.warning("cannot keep the reconnect state", metadata: ["file": "\(memoryPath)", "error": "\(error)"])
            }
        }
        savedMemory = memory
    }
}
