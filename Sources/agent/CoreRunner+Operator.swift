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
            call.reply(ControlProtocol.answer([("status", statusJSON)]))
        case .watch:
            call.reply(ControlProtocol.event("status", [("status", statusJSON)]), watch: true)
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
        feed(.reloaded(Reload(config: fresh.reconnect, rules: fresh.onDemand, tunnelChanges: settings.tunnelChanges(to: fresh))))
        guard !restartRequested else { return }
        let changed = fresh.reconnect != settings.reconnect || fresh.persistentKeepalive != settings.persistentKeepalive
            || fresh.portal != settings.portal
            || fresh.metricsFile != settings.metricsFile
        if fresh.metricsFile != settings.metricsFile {
            metricsFile = fresh.metricsFile.map(MetricsFile.init)
            writeMetrics()
        }
        do {
            try effects.firewall?.allowCheck(ports: fresh.checkPorts)
        } catch {
            log.error("the lockdown could not follow the connectivity check's new port", metadata: ["error": "\(error)"])
        }
        settings = fresh
        control.operatorGroup = fresh.groupOperates ? ControlSocket.readerGroupID() : nil
        effects.setPersistentKeepalive(fresh.persistentKeepalive)
        log.info("configuration reloaded", metadata: ["tunnel": "kept", "tunables": "\(changed ? "changed" : "unchanged")"])
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
    /// whose window is open goes into it.
    func replied(_ answer: OperatorReply) {
        guard let call = asking else { return }
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
                // A window opened for this process alone is of no use without it.
                if windowOpened { produced.append(.request(.closePortalWindow(by: call.peer.uid))) }
                return refuse("failed", error.message)
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
    }

    /// A transition as the control socket gives it.
    func transitionJSON(_ t: Transition) -> JSON {
        var fields: [(String, JSON)] = [
            ("at", .string(wallClock(ago: Instant.now() - t.at))), ("from", .string(t.from.name)), ("to", .string(t.to.name)),
            ("trigger", .string(t.trigger)), ("reason", .string(t.reason.description)),
            ("path", t.to.path.map(Self.pathJSON) ?? .null),
        ]
        if case .switching(_, let candidate, _) = t.to { fields.append(("candidate", Self.pathJSON(candidate))) }
        if let server = t.server { fields.append(("server", .string(server))) }
        fields.append(("attempt", .int(Int64(t.attempt))))
        if let next = t.nextRetry { fields.append(("next_retry_ms", (next - t.at).milliseconds)) }
        fields.append(("coalesced", .int(Int64(t.coalesced))))
        return .object(fields)
    }

    static func pathJSON(_ path: Path) -> JSON {
        .object([("interface", .string(path.interface)), ("kind", .string(path.kind.rawValue)), ("source", .string("\(path.source)")),
                 ("transport", .string(path.transport.rawValue))])
    }

    /// The client's status, typed (docs/CONTROL.md).
    var statusJSON: JSON {
        let now = Instant.now()
        var server: [(String, JSON)] = [("name", .string(effects.serverName)), ("address", .string("\(effects.server)"))]
        if let next = reconnector.handover { server.append(("handover_to", .string(settings.servers[next].name))) }
        var fields: [(String, JSON)] = [
            ("role", .string("client")), ("state", .string(reconnector.state.name)), ("server", .object(server)),
            ("path", reconnector.state.path.map(Self.pathJSON) ?? .null),
            ("ssid", reconnector.state.path.flatMap { $0.kind == .wifi ? facts.wifiName(of: $0.linkIndex) : nil }.map { .string($0) } ?? .null),
            ("profile", .object([("name", Profiles.name(ofFile: configPath).map { .string($0) } ?? .null), ("file", .string(configPath))])),
            ("profiles", Profiles.names(in: configPath.parentDirectory).map { .array($0.map { .string($0) }) } ?? .null),
            ("rtt_ms", reconnector.roundTripTime.map(\.milliseconds) ?? .null),
            ("mtu", .object([("tunnel", .int(Int64(effects.tunnelMTU))), ("configured", .int(Int64(settings.tunnel.mtu))),
                             ("floor", .int(Int64(reconnector.floorMTU))),
                             ("searching", .bool(reconnector.isSearchingPathMTU)),
                             ("size_probes", .int(Int64(reconnector.sizeProbes)))])),
        ]
        if let t = lastTransition {
            fields += [("since", .string(wallClock(ago: now - t.at))), ("for_ms", (now - t.at).milliseconds),
                       ("last_transition", transitionJSON(t))]
        }
        if case .portal(_, let url) = reconnector.state {
            var portal: [(String, JSON)] = [("url", .string(url))]
            if let until = reconnector.portalWindowUntil { portal.append(("window_ms", (until - now).milliseconds)) }
            if let due = reconnector.timers[.recheck] { portal.append(("next_check_ms", (due - now).milliseconds)) }
            fields.append(("portal", .object(portal)))
        }
        if case .disconnected(let rule, let lifted) = reconnector.state {
            fields.append(("on_demand", .object([("rule", .string(rule)), ("lockdown_lifted", .bool(lifted != nil))])))
        }
        fields += [("attempts", .int(Int64(attempts))), ("budget_left", .int(Int64(reconnector.tokens))),
                   ("connectivity_checks", .int(Int64(reconnector.connectivityChecks))),
                   ("power", .string(reconnector.power.rawValue))]
        if let client = effects.client {
            let traffic = client.traffic
            fields += [("traffic", .traffic(traffic)),
                       ("drops", .drops(client.drops, traffic, extra: [("no_session", .count(traffic.noSession))]))]
        }
        fields.append(("offload", effects.offload.map { .string($0.description) } ?? .null))
        if settings.stream != nil {
            // What carries the session, and what each network the agent has met blocks.
            let known = reconnector.transportStatus
            var stream: [(String, JSON)] = [("port", .int(Int64(settings.stream?.port ?? 0))),
                                            ("proxy", settings.stream?.proxy.map { .string("\($0.endpoint)") } ?? .null)]
            if let carrier = effects.client?.socket as? StreamCarrier { stream.append(("dropped", .int(Int64(carrier.drops)))) }
            if let proxies = core.proxies {
                // A proxy named by host: where its name put it on each network (null: nowhere yet).
                stream.append(("proxy_at", .array(proxies.networks.sorted { $0.key < $1.key }.map {
                    .object([("interface", .string($0.key.interface)), ("gateway", .string("\($0.key.gateway)")),
                             ("address", $0.value.address.map { .string("\($0)") } ?? .null)])
                })))
            }
            fields.append(("transports", .object([
                ("stream", .object(stream)),
                ("networks", .array(known.networks.map {
                    .object([("interface", .string($0.key.interface)), ("gateway", .string("\($0.key.gateway)")),
                             ("udp", .string($0.udp.rawValue))])
                })),
            ])))
        }
        fields.append(("session", effects.client?.sessionProtocol.map {
            .object([("protocol", .int(Int64($0.version))), ("cipher", .string($0.cipher.description))])
        } ?? .null))
        var lockdown: [(String, JSON)] = [("enabled", .bool(effects.firewall != nil))]
        if let firewall = effects.firewall {
            let counters = firewall.counters()
            lockdown.append(("blocked", .object(BlockCause.allCases.map { ($0.rawValue, .int(Int64(clamping: counters[$0] ?? 0))) })))
            lockdown += [("open_on", firewall.trustedInterface.map { .string($0) } ?? .null),
                         ("exceptions_for", firewall.owner.map { .string($0.kind) } ?? .null),
                         ("refused_loads", .int(Int64(firewall.refusals)))]
        }
        fields.append(("lockdown", .object(lockdown)))
        if let dns = effects.dns {
            var entry: [(String, JSON)] = [("manager", .string(dns.manager.rawValue))]
            if let applied = dns.applied {
                entry += [("resolvers", .array(applied.resolvers.map { .string("\($0)") })),
                          ("search", .array(applied.searchDomains.map { .string($0) }))]
            }
            entry.append(("problem", effects.dnsProblem.map { .string($0) } ?? .null))
            fields.append(("dns", .object(entry)))
        }
        fields.append(("diverting_routes", .array(effects.divertingRoutes.map { .string($0.description) })))
        fields.append(("excluded", .array(effects.excludedProcesses.map {
            .object([("pid", .int(Int64($0.pid))), ("name", .string($0.name))])
        })))
        fields.append(("guest_networks", .array(effects.guestNetworks.map { .string($0.description) })))
        // What counts as the LAN, and the networks that claimed more.
        fields.append(("local_networks", .array(effects.localNetworks.map { .string($0.description) })))
        fields.append(("wider_claims", .array(effects.widerClaims.map { .string($0.description) })))
        // Other tunnels and policy rules that may take traffic this tunnel would carry.
        let others = effects.otherTunnelRoutes.map(\.description) + effects.rulesBefore.map { "rule \($0)" }
        fields.append(("other_tunnels", .array(others.map { JSON.string($0) })))
        // What others took away of the agent's routing, resolvers and lockdown, put back or held off.
        fields.append(("upkeep", .object(Holding.allCases.map { holding in
            let record = core.upkeep.records[holding] ?? Upkeep.Record()
            return (holding.rawValue, .object([
                ("missing", record.damage.map { .string($0.what) } ?? .null),
                ("restores", .int(Int64(record.restores))),
                ("last_removed_by", record.lastBy.map { .string($0) } ?? .null),
                ("held_for_ms", record.heldUntil.map { ($0 - now).milliseconds } ?? .null),
            ]))
        })))
        return .object(fields)
    }
}
