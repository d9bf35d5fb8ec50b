import SystemDNS
import Logging
import Observability
import ConfigReader
import Glibc
import Lockdown
import PathMonitor
import Reconnector
import Tunnel

/// The operator: control requests, the portal window's owner, and the status the control socket
/// and the metrics give.
extension ClientDaemon.CoreRunner {
    /// Answers an operator's request from the control socket.
    func answer(_ call: ControlServer.Call) {
        let done = { (message: String) in
            call.reply(ControlProtocol.answer([("message", .string(message)), ("state", .string(self.machine.state.name))]))
        }
        switch call.command {
        case .status:
            call.reply(ControlProtocol.answer([("status", statusJSON)]))
        case .watch:
            call.reply(ControlProtocol.event("status", [("status", statusJSON)]), watch: true)
        case .reconnect:
            if case .paused = machine.state { return done("down: `agent up` connects again") }
            if case .disconnected(let rule, _) = machine.state {
                return done("the on-demand rule '\(rule)' keeps the tunnel down on this network")
            }
            feed(.request(.reconnect))
            done("reconnecting")
        case .sleep:
            handle(.signal(SIGTSTP))
            done("sleeping")
        case .wake:
            handle(.signal(SIGCONT))
            done("awake")
        case .down:
            if case .paused = machine.state { return done("down already") }
            feed(.request(.pause))
            done("down: the session is closed; the tunnel device" + (effects.firewall == nil ? "" : " and the lockdown") + " stay")
        case .up:
            guard case .paused = machine.state else { return done("up already (\(machine.state.name))") }
            feed(.request(.resume))
            done("connecting")
        case .drain:
            call.reply(ControlFailure(code: "not-here", message: "drain is for a server (agent serve --control); this is a client").line)
        case .portalOpen:
            openPortalWindow(call)
        case .portalClose:
            guard mayChangeWindow(call.peer) else {
                return call.reply(ControlFailure(code: "not-permitted", message: "the portal window is another user's").line)
            }
            feed(.request(.closePortalWindow))
            done("portal window closed")
        }
    }

    /// `agent portal`: the asking process goes into the window's cgroup, then the window opens.
    func openPortalWindow(_ call: ControlServer.Call) {
        let refuse = { (code: String, message: String) in call.reply(ControlFailure(code: code, message: message).line) }
        guard case .portal(let path, let url) = machine.state else {
            return refuse("no-portal", "no captive portal found (the agent is \(machine.state.name)); a window opens only "
                + "after the connectivity check found one")
        }
        guard let firewall = effects.firewall, firewall.supportsPortalWindow else {
            return refuse("not-needed", "without a full tunnel's lockdown the portal is reachable as it is: log in at \(url)")
        }
        let opening = machine.portalWindowUntil == nil
        if !opening, !mayChangeWindow(call.peer) {
            return refuse("not-permitted", "the portal window is another user's")
        }
        do {
            // Into the open window's cgroup, or a new one.
            try effects.joinPortalWindow(call.peer, runtimeDirectory: control.path.parentDirectory)
        } catch {
            log.error("cannot open the portal window", metadata: ["error": "\(error.message)", "pid": "\(call.peer.pid)"])
            return refuse("failed", error.message)
        }
        if opening {
            windowOwner = call.peer.uid
            feed(.request(.openPortalWindow))
            guard effects.portalWindow != nil else {
                feed(.request(.closePortalWindow))  // which takes the cgroup away too
                return refuse("failed", "the lockdown could not be opened for the window (see the agent's log)")
            }
            log.notice("portal window opened", metadata: ["pid": "\(call.peer.pid)", "uid": "\(call.peer.uid)", "url": "\(url)"])
        }
        let left = (machine.portalWindowUntil ?? Instant.now()) - Instant.now()
        let resolvers = (effects.portalWindow?.resolvers ?? []).map { JSON.string($0.description) }
        call.reply(ControlProtocol.answer([("message", .string("portal window open")), ("url", .string(url)),
                                           ("interface", .string(path.interface)), ("for_ms", left.milliseconds),
                                           ("resolvers", .array(resolvers))]))
    }

    /// Only the one who opened the portal window (or root) closes it or adds to it.
    func mayChangeWindow(_ peer: PeerProcess) -> Bool {
        windowOwner.map { peer.uid == 0 || peer.uid == $0 } ?? true
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
        .object([("interface", .string(path.interface)), ("kind", .string(path.kind.rawValue)), ("source", .string("\(path.source)"))])
    }

    /// The client's status, typed (docs/CONTROL.md).
    var statusJSON: JSON {
        let now = Instant.now()
        var server: [(String, JSON)] = [("name", .string(effects.serverName)), ("address", .string("\(effects.server)"))]
        if let next = machine.handover { server.append(("handover_to", .string(settings.servers[next].name))) }
        var fields: [(String, JSON)] = [
            ("role", .string("client")), ("state", .string(machine.state.name)), ("server", .object(server)),
            ("path", machine.state.path.map(Self.pathJSON) ?? .null),
            ("rtt_ms", machine.roundTripTime.map(\.milliseconds) ?? .null),
            ("mtu", .object([("tunnel", .int(Int64(effects.tunnelMTU))), ("configured", .int(Int64(settings.tunnel.mtu))),
                             ("floor", .int(Int64(machine.floorMTU))),
                             ("searching", .bool(machine.isSearchingPathMTU)),
                             ("size_probes", .int(Int64(machine.sizeProbes)))])),
        ]
        if let t = lastTransition {
            fields += [("since", .string(wallClock(ago: now - t.at))), ("for_ms", (now - t.at).milliseconds),
                       ("last_transition", transitionJSON(t))]
        }
        if case .portal(_, let url) = machine.state {
            var portal: [(String, JSON)] = [("url", .string(url))]
            if let until = machine.portalWindowUntil { portal.append(("window_ms", (until - now).milliseconds)) }
            if let due = machine.timers[.recheck] { portal.append(("next_check_ms", (due - now).milliseconds)) }
            fields.append(("portal", .object(portal)))
        }
        if case .disconnected(let rule, let lifted) = machine.state {
            fields.append(("on_demand", .object([("rule", .string(rule)), ("lockdown_lifted", .bool(lifted != nil))])))
        }
        fields += [("attempts", .int(Int64(attempts))), ("budget_left", .int(Int64(machine.tokens))),
                   ("connectivity_checks", .int(Int64(machine.connectivityChecks))),
                   ("power", .string(machine.power.rawValue))]
        if let client = effects.client {
            let traffic = client.traffic
            fields += [("traffic", .traffic(traffic)),
                       ("drops", .drops(client.drops, traffic, extra: [("no_session", .count(traffic.noSession))]))]
        }
        fields.append(("offload", effects.offload.map { .string($0.description) } ?? .null))
        var lockdown: [(String, JSON)] = [("enabled", .bool(effects.firewall != nil))]
        if let firewall = effects.firewall {
            let counters = firewall.counters()
            lockdown.append(("blocked", .object(BlockCause.allCases.map { ($0.rawValue, .int(Int64(clamping: counters[$0] ?? 0))) })))
            lockdown += [("open_on", firewall.trustedInterface.map { .string($0) } ?? .null),
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
        return .object(fields)
    }
}
