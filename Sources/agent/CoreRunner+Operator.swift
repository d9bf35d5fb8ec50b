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
import PathMonitor
import Reconnector
import Tunnel
import Streams
import Settings

/// The operator: control requests, the configuration read again on SIGHUP, the portal window's
/// owner, and the status the control socket and the metrics give.
extension ClientDaemon.CoreRunner {
    /// Answers an operator's request from the control socket: what the core makes of it comes
    /// back as its `reply` effect.
    func answer(_ call: ControlServer.Call) {
        switch call.command {
        case .status:
            call.reply(ControlProtocol.answer([("status", status(now: Instant.now()).json)]))
        case .watch:
            call.reply(ControlProtocol.event("status", [("status", status(now: Instant.now()).json)]), watch: true)
        case .reconnect: ask(.reconnect, for: call)
        case .sleep:
            handle(.signal(SIGTSTP))
            reply(call, "sleeping")
        case .wake:
            handle(.signal(SIGCONT))
            reply(call, "awake")
        case .down: ask(.pause, for: call)
        case .up: ask(.resume, for: call)
        case .stop:
            log.info("stopping", metadata: ["asked_by": "uid \(call.peer.uid)"])
            feed(.request(.stop(.byOperator)))
            reply(call, effects.firewall == nil ? "stopping" : "stopping: the lockdown and the tunnel's resolvers go with the agent")
        case .drain:
            call.reply(ControlFailure(code: "not-here", message: "drain is for a server (agent serve --control); this is a client").line)
        case .portalOpen: ask(.openPortalWindow(by: call.peer.uid), for: call)
        case .portalClose: ask(.closePortalWindow(by: call.peer.uid), for: call)
        case .exclude: ask(.exclude(by: call.peer.uid), for: call)
        case .useProfile: useProfile(call)
        }
    }

    /// SIGHUP: reads the configuration again and tells the core what it gives and what of the
    /// tunnel it changes; the core decides (tunables and rules apply to the running tunnel, another
    /// tunnel restarts the agent in place: `Effect.restart`). A file with a mistake changes nothing.
    func reload() {
        let fresh: ClientSettings
        do {
            let (reader, root) = try YAMLReader.load(configPath, as: .clientConfiguration)
            fresh = try reader.client(root)
        } catch {
            log.error("configuration not reloaded; the running one stays", metadata: ["error": "\(error)"])
            return
        }
        // Another metrics file is the one the core has written from now on.
        if fresh.metricsFile != settings.metricsFile { metricsFile = fresh.metricsFile.map(MetricsFile.init) }
        feed(.reloaded(Reload(config: fresh.reconnect, rules: fresh.onDemand, tunnelChanges: settings.tunnelChanges(to: fresh),
                              metricsFile: fresh.metricsFile)))
        guard !restartRequested else { return }
        let changed = settings.tunableChanges(to: fresh)
        do {
            try effects.firewall?.allowCheck(ports: fresh.checkPorts)
        } catch {
            // Still wanted: the core has the lockdown put back until it holds (`Upkeep`).
            log.error("the lockdown could not follow the connectivity check's new port", metadata: ["error": "\(error)"])
            feed(.damaged(.lockdown, Upkeep.Damage.lockdownRefused("\(error)")))
        }
        settings = fresh
        control.operatorGroup = fresh.groupOperates ? ControlSocket.readerGroupID() : nil
        effects.setPersistentKeepalive(fresh.persistentKeepalive)
        log.info("configuration reloaded", metadata: ["tunnel": "kept",
                                                      "tunables": "\(changed.isEmpty ? "unchanged" : changed.joined(separator: ","))"])
    }

    /// Feeds the operator's `request`; the core's reply goes to `call`.
    private func ask(_ request: AgentEvent.Request, for call: ControlServer.Call) {
        if call.command.forOperators, call.peer.uid != 0 {
            log.notice("asked by a member of the operators' group", metadata: ["command": "\(call.command.rawValue)", "asked_by": "uid \(call.peer.uid)"])
        }
        asking = call
        windowOpened = false
        feed(.request(request))
        if asking != nil {
            asking = nil
            call.reply(ControlFailure(code: "failed", message: "the agent gave no answer (it is \(reconnector.state.name))").line)
        }
    }

    private func reply(_ call: ControlServer.Call, _ message: String) {
        call.reply(ControlProtocol.answer([("message", .string(message)), ("state", .string(reconnector.state.name))]))
    }

    /// The core's answer to the request being asked, worded for the operator; an `agent portal`
    /// whose window is open goes into it (a window it cannot join is closed again at once).
    func replied(_ answer: OperatorReply) -> [AgentEvent] {
        guard let call = asking else { return [] }
        asking = nil
        let refuse = { (code: String, message: String) in call.reply(ControlFailure(code: code, message: message).line) }
        switch answer {
        case .reconnecting: reply(call, "reconnecting")
        case .down: reply(call, "down: `agent up` connects again")
        case .keptDownByRule(let rule): reply(call, "the on-demand rule '\(rule)' keeps the tunnel down on this network")
        case .paused(already: true): reply(call, "down already")
        case .paused(already: false):
            reply(call, "down: the session is closed; the tunnel device" + (effects.firewall == nil ? "" : " and the lockdown") + " stay")
        case .connecting: reply(call, "connecting")
        case .upAlready(let state): reply(call, "up already (\(state))")
        case .portalWindowClosed: reply(call, "portal window closed")
        case .noPortal(let state):
            refuse("no-portal", "no captive portal found (the agent is \(state)); a window opens only "
                + "after the connectivity check found one")
        case .portalReachable(let url):
            refuse("not-needed", "without a full tunnel's lockdown the portal is reachable as it is: log in at \(url ?? "the portal's page")")
        case .notPermitted: refuse("not-permitted", "the portal window is another user's")
        case .portalWindowFailed: refuse("failed", "the window could not be opened: its cgroup or the lockdown's opening for it failed (the agent's log says which)")
        case .exclusionOff:
            refuse("not-permitted", "this agent keeps every application in the tunnel: 'exclusion: allow' in its configuration allows exceptions")
        case .exclusionFailed:
            refuse("failed", "the exclusion could not be opened: its cgroup or the lockdown's opening for it failed (the agent's log says which)")
        case .excluded:
            do {
                let process = try effects.exclude(call.peer, target: call.target, started: call.targetStarted)
                log.notice("kept outside the tunnel", metadata: ["pid": "\(process.pid)", "name": "\(SystemFiles.text("/proc/\(process.pid)/comm") ?? "?")",
                                                                 "asked_by": "uid \(call.peer.uid)"])
                let resolvers = (effects.firewall?.excludedResolvers ?? []).map { JSON.string($0.description) }
                call.reply(ControlProtocol.answer([("message", .string("process \(process.pid) and what it starts reach the network outside the tunnel")),
                                                   ("pid", .int(Int64(process.pid))), ("resolvers", .array(resolvers))]))
            } catch {
                log.warning("cannot keep a process outside the tunnel", metadata: ["error": "\(error.message)", "asked_by": "uid \(call.peer.uid)"])
                refuse("failed", error.message)
            }
        case .portalWindowOpen(let url, let interface, let until):
            do {
                try effects.joinPortalWindow(call.peer)
            } catch {
                log.error("cannot put the process into the portal window", metadata: ["error": "\(error.message)", "pid": "\(call.peer.pid)"])
                refuse("failed", error.message)
                // A window opened for this process alone is of no use without it.
                return windowOpened ? [.request(.closePortalWindow(by: call.peer.uid))] : []
            }
            if windowOpened {
                log.notice("portal window opened", metadata: ["pid": "\(call.peer.pid)", "uid": "\(call.peer.uid)", "url": "\(url)"])
            }
            let left = until - Instant.now()
            let resolvers = (effects.portalWindow?.resolvers ?? []).map { JSON.string($0.description) }
            call.reply(ControlProtocol.answer([("message", .string("portal window open")), ("url", .string(url)),
                                               ("interface", .string(interface)), ("for_ms", left.milliseconds),
                                               ("resolvers", .array(resolvers))]))
        }
        return []
    }

    /// A transition as the control socket gives it.
    func transitionStatus(_ t: Transition, now: Instant) -> ClientStatus.Transition {
        var candidate: Path?
        if case .switching(_, let tried, _, _) = t.to { candidate = tried }
        return ClientStatus.Transition(
            at: wallClock(ago: now - t.at), from: t.from.name, to: t.to.name, trigger: t.trigger, reason: t.reason.description,
            path: t.to.path.map(Self.pathStatus), candidate: candidate.map(Self.pathStatus), server: t.server, attempt: t.attempt,
            nextRetry: t.nextRetry.map { $0 - t.at }, coalesced: t.coalesced)
    }

    static func pathStatus(_ path: Path) -> ClientStatus.Path {
        ClientStatus.Path(interface: path.interface, kind: path.kind.rawValue, source: "\(path.source)", transport: path.transport.rawValue)
    }

    /// The client's status (docs/CONTROL.md).
    func status(now: Instant) -> ClientStatus {
        let state = reconnector.state
        var portal: ClientStatus.Portal?
        if case .portal(_, let url, _, _) = state {
            portal = ClientStatus.Portal(url: url, window: reconnector.portalWindowUntil.map { $0 - now },
                                         nextCheck: reconnector.timers[.recheck].map { $0 - now })
        }
        var onDemand: ClientStatus.OnDemand?
        if case .disconnected(let rule, let lifted, _) = state { onDemand = ClientStatus.OnDemand(rule: rule, lockdownLifted: lifted != nil) }
        return ClientStatus(
            state: state.name,
            server: ClientStatus.Server(name: effects.serverName, address: "\(effects.server)",
                                        handoverTo: reconnector.handover.map { settings.servers[$0].name }),
            path: state.path.map(Self.pathStatus), ssid: state.path.flatMap { $0.kind == .wifi ? facts.wifiName(of: $0.linkIndex) : nil },
            profile: ClientStatus.Profile(name: Profiles.name(ofFile: configPath), file: configPath),
            profiles: Profiles.names(in: configPath.parentDirectory), roundTripTime: reconnector.roundTripTime,
            mtu: ClientStatus.MTU(tunnel: effects.tunnelMTU, configured: settings.tunnel.mtu, floor: reconnector.floorMTU,
                                  searching: reconnector.isSearchingPathMTU, sizeProbes: reconnector.sizeProbes),
            since: lastTransition.map {
                ClientStatus.Since(at: wallClock(ago: now - $0.at), duration: now - $0.at, transition: transitionStatus($0, now: now))
            },
            portal: portal, onDemand: onDemand, attempts: attempts, budgetLeft: reconnector.tokens,
            connectivityChecks: reconnector.connectivityChecks, power: reconnector.power.rawValue,
            dataPlane: effects.client.map { ClientStatus.DataPlane(traffic: $0.traffic, drops: $0.drops) },
            offload: effects.offload?.description, transports: transports, session: effects.client?.sessionProtocol,
            lockdown: effects.firewall.map { firewall in
                let counters = firewall.counters()
                return ClientStatus.Lockdown(blocked: BlockCause.allCases.map { ($0.rawValue, counters[$0] ?? 0) }, openOn: firewall.trustedInterface,
                                             exceptionsFor: firewall.owner?.kind, refusedLoads: firewall.refusals)
            },
            dns: effects.dns.map { dns in
                ClientStatus.DNS(manager: dns.manager.rawValue, applied: dns.applied.map { ($0.resolvers.map { "\($0)" }, $0.searchDomains) },
                                 problem: effects.dnsProblem)
            },
            divertingRoutes: effects.divertingRoutes.map(\.description),
            excluded: effects.excludedProcesses.map { ClientStatus.Excluded(pid: $0.pid, name: $0.name) },
            guestNetworks: effects.guestNetworks.map(\.description),
            // What counts as the LAN, and the networks that claimed more.
            localNetworks: effects.localNetworks.map(\.description), widerClaims: effects.widerClaims.map(\.description),
            // Other tunnels and policy rules that may take traffic this tunnel would carry.
            otherTunnels: effects.otherTunnelRoutes.map(\.description) + effects.rulesBefore.map { "rule \($0)" },
            // What others took away of the agent's routing, resolvers and lockdown, put back or held off.
            upkeep: Holding.allCases.map { holding in
                let record = core.upkeep.records[holding] ?? Upkeep.Record()
                return ClientStatus.Upkeep(holding: holding.rawValue, missing: record.damage?.what, restores: record.restores,
                                           lastRemovedBy: record.lastBy, heldFor: record.heldUntil.map { $0 - now })
            })
    }

    /// With a stream transport configured: what carries the session, and what each network the
    /// agent has met blocks.
    private var transports: ClientStatus.Transports? {
        guard let stream = settings.stream else { return nil }
        // A proxy named by host: where its name put it on each network (nil: nowhere yet).
        let proxyAt = core.proxies.map { proxies in
            proxies.networks.sorted { $0.key < $1.key }.map {
                ClientStatus.ProxyAddress(interface: $0.key.interface, gateway: "\($0.key.gateway)", address: $0.value.address.map { "\($0)" })
            }
        }
        return ClientStatus.Transports(
            stream: ClientStatus.Stream(port: Int(stream.port), proxy: stream.proxy.map { "\($0.endpoint)" },
                                        dropped: (effects.client?.socket as? StreamCarrier)?.drops, proxyAt: proxyAt),
            networks: reconnector.transportStatus.networks.map {
                ClientStatus.Network(interface: $0.key.interface, gateway: "\($0.key.gateway)", udp: $0.udp.rawValue)
            })
    }
}
