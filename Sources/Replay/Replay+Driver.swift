import Topology
package import Basics
package import Reconnector

/// The replay as a runner of the core, through the driver the daemon uses too.
extension Replay {
    // MARK: The driver

    /// The time on the agent's clock: the world's, stepped back as the scenario says.
    package var coreNow: Instant { now + skew }

    package mutating func willHandle(_ event: AgentEvent) {
        report.inputs += 1
        if case .liftRefused = event { liftRefusalOnItsWay = false }
        if keepsTrace { report.trace.append((now, event)) }
        feeding = (event, reconnector.state, false, core.attempts, reconnector.tokensTaken)
    }

    /// After each event: the core's timers armed in the world's queue, the attempt counted, and
    /// the invariants checked.
    package mutating func handled(_ event: AgentEvent, effects: [Effect]) {
        let before = feeding.before
        // The core's timers, one route: what it keeps is what the world's queue wakes it for.
        let timers = core.timers
        for (kind, at) in timers.sorted(by: { ($0.value, $0.key.rawValue) < ($1.value, $1.key.rawValue) }) where armed[kind] != at {
            if at < now + skew { violation("timer \(kind) armed in the past") }
            armed[kind] = at
            // The core's deadline is on its own clock; the world's queue on the world's.
            queue.push(at - skew, .timer(kind, at: at))
        }
        for kind in armed.keys where timers[kind] == nil { armed[kind] = nil }
        let reported = feeding.reported
        let attempted = core.attempts > feeding.attempts
        if attempted {
            report.attempts += core.attempts - feeding.attempts
            // An attempt that took no token (a forced move, an operator's request, a socket bound
            // again) is outside the budget.
            let budgeted = reconnector.tokensTaken > feeding.tokens
            let power: PowerSource = acSinceLastAttempt || reconnector.power == .ac ? .ac : .battery
            attemptLog.append((now, power, budgeted))
            if budgeted { acSinceLastAttempt = false }
        }
        if !reconnector.isHandshaking { handshakeInFlight = nil }
        // What the core says the session is on is what the data plane has.
        if case .connected(let path, _, _) = reconnector.state, socket != path.id {
            violation("connected on \(path.name)/\(path.source) while the session's socket is "
                + "\(socket.map { "\($0)" } ?? "on no path"), on \(event.name)")
        }
        // The session's path is bound to an address the machine has: one that went unnoticed
        // would send probes and data from nowhere.
        if let path = reconnector.state.path, !kernel.model.usableAddresses(on: path.linkIndex).contains(path.source) {
            violation("the session is on \(path.interface)/\(path.source), an address the machine no longer has, on \(event.name)")
        }
        switch reconnector.state {
        case .paused, .disconnected:
            if attempted || effects.contains(where: { if case .probe = $0 { true } else { false } }) {
                violation("an attempt while \(reconnector.state.name), on \(event.name)")
            }
        default: break
        }
        // The lockdown is lifted only while a rule keeps the tunnel down on the very network it
        // trusts, and never anywhere else.
        if case .disconnected(_, let lifted, _) = reconnector.state, let lifted {
            if !lockdownLifted, !liftRefusalOnItsWay { violation("the core says the lockdown is lifted, the world's is whole") }
            if kernel.paths.first?.id != lifted { violation("the lockdown is lifted for a network the best path is not on") }
        } else if lockdownLifted {
            violation("the lockdown is lifted in \(reconnector.state.name), on \(event.name)")
        }
        if before.name != reconnector.state.name && !reported {
            violation("\(before.name) -> \(reconnector.state.name) on \(event.name) without a logged transition")
        }
        switch reconnector.state {
        case .offline, .sleeping, .failed, .paused:
            if !reconnector.timers.isEmpty {
                violation("timers armed while \(reconnector.state.name): \(reconnector.timers.keys.map(\.rawValue).sorted())")
            }
        default: break
        }
        if windowOpen != (reconnector.portalWindowUntil != nil), !core.isOpeningWindow {
            violation("the portal window is \(windowOpen ? "open" : "closed") but the machine thinks otherwise, on \(event.name)")
        }
        if windowOpen && reconnector.state.name != "portal" {
            violation("a portal window open in \(reconnector.state.name)")
        }
        // What a scrape reads is never older than the refresh while connected, nor a state left.
        if core.heartbeats.metricsFile != nil, !core.stopped {
            let written = report.metricsWrites.last
            if feeding.before.name != reconnector.state.name, written != coreNow {
                violation("\(before.name) -> \(reconnector.state.name) on \(event.name) without the metrics file written")
            }
            if reconnector.state.name == "connected", let written, coreNow - written > Heartbeats.metricsRefresh {
                violation("connected with the metrics file \((coreNow - written).short) old")
            }
        }
    }

    mutating func serverHandshake(on path: Path) {
        handshakeGeneration += 1
        handshakeInFlight = path.id
        // The client pads its initiation to 392 bytes on the wire (docs/PROTOCOL.md).
        guard passes(path.id), !lost(path.id, up: true, size: 392) else { return }
        let at = arrival(path.id)
        let rtt = at - now
        if acceptsAuth {
            serverHasSession = true
            serverHeardAt = now
        }
        guard !lost(path.id, up: false, arriving: at) else { return }
        let reply: AgentEvent = acceptsAuth ? .handshakeCompleted(rtt: rtt, sizedProbes: scenario.serverEchoesSizes,
                                                                       carriesIPv6: scenario.tunnelCarriesIPv6, dns: serverDNS)
            : .handshakeRejected
        queue.push(at, .deliver(reply, generation: handshakeGeneration, via: path.id))
    }

    /// What the gateway gives at each handshake: `server-dns`, or nothing.
    var serverDNS: Result<DNSSettings, DNSSettingsError> {
        guard let resolvers = scenario.serverDNS else { return .success(.none) }
        return Result { () throws(DNSSettingsError) in try DNSSettings(resolvers: resolvers, searchDomains: []) }
    }

    mutating func requireKnown(_ path: Path, action: String) {
        if kernel.paths.isEmpty {
            violation("\(action) on \(path.interface) while offline")
        } else if !isCurrent(path.id) {
            violation("\(action) on \(path.name)/\(path.source), which is not a current path")
        }
    }

    mutating func violation(_ message: String) {
        report.violations.append("\(now)s: \(message)")
    }
}

/// The world as the core's runner: what the daemon's sockets, firewall and checks would do with
/// each effect, with the checks every replay makes on each.
extension Replay: CoreRunning {
    /// What the world does with `effect`; what it answers at once (the lockdown's word, the
    /// device made, a socket refused, a fact read) is fed after the event's other effects, as
    /// the daemon feeds it. What takes time in the world comes through its queue.
    package mutating func perform(_ effect: Effect) -> [AgentEvent] {
        switch effect {
        case .bind(let path, _, _): return bind(path)
        case .handshake(let path, _): return handshake(on: path)
        case .resendHandshake(let path): resendHandshake(on: path)
        case .probe(let id, let path, nil): return probe(id, via: path)
        case .probe(let id, let path, let size?): return probe(id, via: path, size: size)
        case .setTunnelMTU(let mtu): setTunnelMTU(mtu)
        case .reportFailure: break
        case .transition(let transition): transitioned(transition)
        case .useServer(let index, let address): useServer(index, at: address)
        case .prepareHandover(let index, let address, let path): prepareHandover(to: index, at: address, on: path)
        case .lookUpServer(let index):
            // The resolver answers after a round trip; with no uplink, or asleep, it cannot.
            // A network that drops every datagram drops DNS too.
            let uplink = kernel.model.paths(to: names[index].first ?? sendingTo).first
            let answer = uplink.map { filter($0.interface) == .udp } ?? true || sleeping ? nil : names[index]
            queue.push(now + scenario.rtt, .answer(.serverLookedUp(server: index, addresses: answer)))
        case .lookUpProxy(let path):
            // The network's resolver answers after a round trip, as for the server's name.
            // A name the network does not know is answered so (none); nothing answers on a
            // network that drops every datagram, or while asleep.
            let answer = sleeping || filter(path.interface) == .udp ? nil : proxyNames[path.interface] ?? []
            queue.push(now + roundTrip(path.id), .answer(.proxyLookedUp(on: path, addresses: answer)))
        case .proxyAt(let addresses, let opening):
            guard let key = opening, let address = addresses[key] else {
                proxyAt = addresses  // a closing holds
                break
            }
            let refused = scenario.lockdownRefuses.contains(.proxy)
            if !refused { proxyAt = addresses }
            if refused { report.proxiesRefused += 1 } else { report.proxiesAllowed += 1 }
            return [.proxyAllowed(on: key, address: address, !refused)] + refusal(refused)
        case .allowServer(let index, let address, _):
            return [.serverAllowed(server: index, address: address, true)]
        case .useAddress(let address, _): useAddress(address)
        case .localNetworks, .guestNetworks: break
        case .completeHandover: completeHandover()
        case .cancelHandover: cancelHandover()
        case .disconnect: disconnect()
        case .attachTunnel:
            // The device is made once by each process of the agent; a second would be a second device.
            if deviceAttached { violation("a second tunnel device asked for") }
            deviceAttached = true
            report.tunnelsAttached += 1
            return [.tunnelAttached]
        case .resolvers(let decision): report.resolvers.append((now, decision))
        case .checkConnectivity(let path): checkConnectivity(via: path)
        case .openPortalWindow(let path, _, _):
            let refused = scenario.lockdownRefuses.contains(.portalWindow)
            if !refused { openPortalWindow(via: path) }
            return [.portalWindowOpened(!refused)] + refusal(refused)
        case .closePortalWindow: closePortalWindow()
        case .liftLockdown(let interface):
            guard !scenario.lockdownRefuses.contains(.lift) else {
                liftRefusalOnItsWay = true
                return [.liftRefused("Error: Could not process rule: Device or resource busy")] + refusal(true)
            }
            liftLockdown(interface: interface)
        case .restoreLockdown: restoreLockdown()
        case .ready: break
        case .giveUp(let why): report.gaveUp = (now, why)
        case .stop(let opens): report.stopped = (now, opens)
        case .restart:
            // The agent starts again in place (it execs itself), on the configuration as it is now.
            report.restartsInPlace += 1
            queue.push(now, .restartAgent)
        case .findOut(let request): return findOut(request)
        case .followNotices(let wanted): notices = wanted
        case .reply(.excluded): report.excluded += 1
        case .reply(.exclusionOff), .reply(.exclusionFailed): report.exclusionsRefused += 1
        case .reply(.portalReachable): report.portalWindowsNotNeeded += 1
        case .reply(.portalWindowFailed): report.portalWindowsFailed += 1
        case .notice(.serverNameUnusable): report.serverNamesUnusable += 1
        case .notice(.serverCarried): report.serversCarried += 1
        case .notice(.flapping): report.flapNotices += 1
        case .notice(.takenAway), .notice(.stillFlapping), .notice(.stoppedFlapping): break
        case .onDemandDecided, .reply: break
        case .openExclusion:
            let refused = scenario.lockdownRefuses.contains(.exclusion)
            if !refused { report.exclusionsOpened += 1 }
            return [.exclusionOpened(!refused)] + refusal(refused)
        case .restore(let holding, _):
            report.restores += 1
            if missing[holding] == nil, !(holding == .lockdown && lockdownUncertain) {
                violation("\(holding.rawValue) put back while it was whole")
            }
            if holding == .lockdown { lockdownUncertain = false }
            putBack(holding)
            if let taker = takers[holding], now < taker.until { queue.push(now + .milliseconds(100), .retake(holding)) }
            return [.intact(holding)]
        case .upkeepHeld: report.holds += 1
        case .pingWatchdog: report.watchdogPings += 1
        case .extendStart: report.startExtensions += 1
        case .writeMetrics: report.metricsWrites.append(coreNow)
        }
        return []
    }

    /// After a change the lockdown refused (`refused`), what the daemon's runner adds to the
    /// answer: the table is uncertain, damage the core puts back.
    mutating func refusal(_ refused: Bool) -> [AgentEvent] {
        guard refused else { return [] }
        lockdownUncertain = true
        return [.damaged(.lockdown, Upkeep.Damage.lockdownRefused("Error: Could not process rule"))]
    }

    /// Someone takes `holding` away; the agent hears of it at once, as the kernel's notice or
    /// inotify tells the daemon.
    mutating func take(_ holding: Holding, by: String?) {
        if missing[holding] == nil { missing[holding] = now }
        feed(.damaged(holding, Upkeep.Damage(what: "\(holding.rawValue) removed", by: by)))
    }

    mutating func putBack(_ holding: Holding) {
        guard let since = missing.removeValue(forKey: holding) else { return }
        report.maxMissing = max(report.maxMissing, now - since)
    }

    /// What the network behind a link tells the agent's rules: its Wi-Fi network's name, its
    /// gateway's hardware address (every gateway has one; a scenario may name it), the search
    /// domains its DHCP server gave (written to resolv.conf by the best path's link), and a
    /// probe's answer after a round trip, if the network passes it and serves the URL.
    mutating func findOut(_ request: FactRequest) -> [AgentEvent] {
        func name(_ index: Int32) -> String? { kernel.model.links[index]?.name }
        switch request {
        case .wifi(let index):
            return [.networkFact(.wifi(linkIndex: index, wifi(on: name(index))))]
        case .gateway(let address, let index, _):
            return [.networkFact(.gateway(linkIndex: index, address, mac: gatewayMAC(on: index)))]
        case .searchDomains:
            return [.networkFact(.searchDomains(searchDomains, beforeBoot: false))]
        case .probe(let probe, let path, let generation):
            requireKnown(path, action: "on-demand probe")
            let name = interface(of: path.id)
            let passes = name.map { reaches(path.id) && !dropped.contains($0) } ?? false
            let network = passes && !sleeping ? name.flatMap { networks[$0] } : nil
            var result = ProbeResult.unexpected
            if let network, network.probes.contains(probe.url) {
                // Over TLS the network's server shows its key, which the daemon reports as it is.
                if probe.pin == nil {
                    result = .expected(proof: nil)
                } else if let key = network.tlsKey, key == probe.pin {
                    // The server says where it saw the connection come from: the laptop's own
                    // address and port, or the relay's.
                    let local = SocketEndpoint(path.source, port: 40_000)
                    let seen = network.relaysProbes ? SocketEndpoint(.v4(0xcb00_7101), port: 61_000) : local
                    result = .expected(proof: KeyProof(pin: key, path: path.id, local: local, seen: seen))
                }
            }
            let at = passes ? now + roundTrip(path.id) : now + .seconds(5)
            queue.push(at, .answer(.networkFact(.probeAnswered(probe, generation: generation, result))))
            return []
        }
    }

    func wifi(on name: String?) -> Fact<String> {
        name.flatMap { networks[$0]?.ssid }.map { .known($0) } ?? .absent
    }

    /// The gateway's hardware address as the neighbour table learns it: what the scenario
    /// names, nil for a gateway that never answers (`none`), else one of the link's own.
    func gatewayMAC(on index: Int32) -> String? {
        let named = kernel.model.links[index].flatMap { networks[$0.name]?.gatewayMAC }
        if named == "" { return nil }
        return named ?? "02:00:00:00:00:" + String(String(0x100 | Int(index & 0xff), radix: 16).dropFirst())
    }

    /// resolv.conf's search list: what the best path's network gave.
    var searchDomains: [String] {
        kernel.paths.first.flatMap { networks[$0.interface]?.domains } ?? []
    }

    /// The kernel's notices of a network's facts that a link's new description changed, for
    /// the ones the agent follows.
    mutating func noticeFacts(on name: String, before: NetworkFacts?) {
        guard let index = kernel.model.link(named: name)?.index, let after = networks[name] else { return }
        if notices.wifi, after.ssid != before?.ssid {
            queue.push(now, .answer(.networkFact(.wifi(linkIndex: index, wifi(on: name)))))
        }
        if notices.gateway, after.gatewayMAC != before?.gatewayMAC,
           let gateway = kernel.paths.first(where: { $0.linkIndex == index })?.gateway {
            queue.push(now, .answer(.networkFact(.gateway(linkIndex: index, gateway, mac: gatewayMAC(on: index)))))
        }
        if notices.searchDomains, after.domains != before?.domains, kernel.paths.first?.linkIndex == index {
            queue.push(now, .answer(.networkFact(.searchDomains(searchDomains, beforeBoot: false))))
        }
    }

    mutating func bind(_ path: Path) -> [AgentEvent] {
        requireKnown(path, action: "bind")
        let refused = openSocket(on: path.id)
        let bound = refused == nil
        if bound { socket = path.id }
        // The sockets of paths gone go, as the daemon's effects close them: the session's own
        // too when the bind failed, and it then sends on none.
        let current = kernel.paths.map(\.id)
        sockets = sockets.filter { current.contains($0.key.over(.udp)) || $0.key == path.id }
        streamReady = streamReady.filter { sockets[$0.key] != nil }
        if let held = socket, sockets[held] == nil { socket = nil }
        // The session moved: a keepalive tells the server at once.
        if bound { sendKeepalive(persistent: false) }
        return refused.map { [$0] } ?? []
    }

    /// The socket on `id`, made on first use (a new port); when the kernel refuses to bind it
    /// (`refuse-bind`), what the agent is told of it.
    mutating func openSocket(on id: Path.ID) -> AgentEvent? {
        if id.transport == .stream {
            openStream(on: id)
            return nil
        }
        guard sockets[id] == nil else { return nil }
        if let name = interface(of: id), let refusal = bindRefusals[name] {
            var refuses = false
            if let times = refusal.times {
                refuses = true
                bindRefusals[name] = times > 1 ? (times - 1, nil) : nil
            } else if let until = refusal.until, now < until {
                refuses = true
            } else {
                bindRefusals[name] = nil
            }
            if refuses { return .bindFailed(id, why: "\(id.source) is not an address of this host (any more)") }
        }
        socketsMade += 1
        sockets[id] = socketsMade
        return nil
    }

    mutating func handshake(on path: Path) -> [AgentEvent] {
        requireKnown(path, action: "handshake")
        if let refused = openSocket(on: path.id) { return [refused] }
        if let inFlight = handshakeInFlight, inFlight == path.id {
            violation("a second handshake on \(path.interface) while one is in flight")
        }
        report.handshakes += 1
        handshakeTimes.append(now)
        // Keys that the server answered within their lifetime still work: a handshake then only
        // costs an outage and a token (an operator's request aside).
        if feeding.event != .request(.reconnect), let heard = lastHeard, now - heard < scenario.config.sessionLifetime {
            violation("a handshake on \(path.interface) (in \(feeding.before.name), on \(feeding.event.name)) while the session lives "
                + "(the server answered \((now - heard).short) ago)")
        }
        serverHandshake(on: path)
        return []
    }

    mutating func resendHandshake(on path: Path) {
        requireKnown(path, action: "resent handshake")
        if handshakeInFlight != path.id { violation("a handshake resent on \(path.interface), where none is in flight") }
        report.resends += 1
        // The fresh initiation replaces the first in the client: only its answer counts.
        serverHandshake(on: path)
    }

    mutating func probe(_ id: UInt64, via path: Path) -> [AgentEvent] {
        requireKnown(path, action: "probe")
        if let refused = openSocket(on: path.id) { return [refused] }
        report.probes += 1
        probeTimes.append(now)
        answer(from: path.id, .probeEcho(id: id, rtt: .zero, size: nil))
        return []
    }

    /// A padded probe is as big on the wire as a tunnel packet of `size`; a server that echoes
    /// sizes answers as big, an older one drops it (it reads the padding as malformed).
    mutating func probe(_ id: UInt64, via path: Path, size: Int) -> [AgentEvent] {
        requireKnown(path, action: "size probe")
        if let refused = openSocket(on: path.id) { return [refused] }
        report.sizeProbes += 1
        if size < scenario.mtuFloor || size > scenario.config.maxMTU {
            violation("a size probe of \(size) bytes, outside \(scenario.mtuFloor)...\(scenario.config.maxMTU)")
        }
        guard scenario.serverEchoesSizes else { return [] }
        let wire = size + Self.overhead(path.id)
        answer(from: path.id, .probeEcho(id: id, rtt: .zero, size: size), size: wire, downSize: wire)
        return []
    }

    mutating func setTunnelMTU(_ mtu: Int) {
        if mtu < scenario.mtuFloor || mtu > scenario.config.maxMTU {
            violation("tunnel MTU set to \(mtu), outside \(scenario.mtuFloor)...\(scenario.config.maxMTU)")
        }
        if mtu == tunnelMTU { violation("tunnel MTU set to \(mtu), which it already is") }
        tunnelMTU = mtu
    }

    mutating func useServer(_ index: Int, at address: IPAddress?) {
        if index == target { violation("useServer(\(scenario.gateways[index])), the gateway in use") }
        target = index
        forgetSession()
        if let address { _ = kernel.retarget(to: address) }
    }

    /// The session sends to `address` from now on: a handshake in flight went to the old one
    /// (its answer never comes).
    mutating func useAddress(_ address: IPAddress) {
        if address == sendingTo { violation("told to use \(address), the address in use") }
        _ = kernel.retarget(to: address)
        handshakeInFlight = nil
        handshakeGeneration += 1
    }

    /// The agent holds no session any more: none prepared, none in use, no handshake awaited.
    mutating func forgetSession() {
        standby = nil
        clientHasSession = false
        clientKeys += 1
        lastHeard = nil
        hints.reset()
        handshakeInFlight = nil
        handshakeGeneration += 1
    }

    mutating func prepareHandover(to index: Int, at address: IPAddress?, on path: Path) {
        requireKnown(path, action: "handover")
        if index == target { violation("a handover to \(scenario.gateways[index]), the gateway in use") }
        // The session's stream reaches only the gateway it was opened to: the daemon would send
        // the next gateway's handshake to the one in use.
        if path.transport == .stream { violation("a handover prepared over the stream, which reaches only \(scenario.gateways[target])") }
        standby = index
        standbyAddress = address
        report.handshakes += 1
        handshakeTimes.append(now)
        guard passes(path.id, gateway: index), !lost(path.id, up: true, size: 392) else { return }
        let at = arrival(path.id)
        guard acceptsAuth else {
            queue.push(at, .deliver(.handoverRejected, generation: 0, via: path.id))
            return
        }
        gateways[index].hasSession = true
        serverHeard(from: path.id, gateway: index)
        if !lost(path.id, up: false, arriving: at) {
            queue.push(at, .deliver(.handoverReady(rtt: at - now, sizedProbes: scenario.serverEchoesSizes, carriesIPv6: scenario.tunnelCarriesIPv6,
                                                   dns: serverDNS), generation: 0, via: path.id))
        }
    }

    mutating func completeHandover() {
        guard let next = standby else { return violation("a handover completed without one prepared") }
        // The agent tells the old gateway goodbye: it forgets the session.
        gateways[target].hasSession = false
        target = next
        standby = nil
        if let address = standbyAddress { _ = kernel.retarget(to: address) }
        standbyAddress = nil
        clientHasSession = true
        clientKeys += 1
        lastHeard = now
        hints.reset()
    }

    mutating func cancelHandover() {
        if let standby { gateways[standby].hasSession = false }
        standby = nil
    }

    mutating func disconnect() {
        // The goodbye reaches the server when the session's path passes it; otherwise the
        // server's copy only expires.
        if let socket, passes(socket) { serverHasSession = false }
        if let standby { gateways[standby].hasSession = false }
        forgetSession()
    }

    /// The check's plain HTTP request: a portal redirects it to its login page, a network that
    /// reaches the internet gives the expected answer after a round trip, and a link that drops
    /// everything (or is gone) gives nothing until the check's own timeout.
    mutating func checkConnectivity(via path: Path) {
        requireKnown(path, action: "connectivity check")
        report.checks += 1
        checkTimes.append(now)
        let name = interface(of: path.id)
        let result: Connectivity
        let at: Instant
        if let name, let url = portals[name], reaches(path.id), !sleeping {
            (result, at) = (.portal(url: url), now + roundTrip(path.id))
        } else if let name, reaches(path.id), !dropped.contains(name), filter(name).passesCheck, !sleeping {
            (result, at) = (.online, now + roundTrip(path.id))
        } else {
            (result, at) = (.unknown("no answer in 5s"), now + .seconds(5))
        }
        queue.push(at, .answer(.connectivity(result, on: path.id)))
    }

    mutating func openPortalWindow(via path: Path) {
        requireKnown(path, action: "portal window")
        if windowOpen { violation("a portal window opened while one is open") }
        windowOpen = true
    }

    mutating func closePortalWindow() {
        if !windowOpen { violation("a portal window closed while none is open") }
        windowOpen = false
    }

    mutating func liftLockdown(interface: String) {
        if kernel.model.link(named: interface) == nil { violation("the lockdown lifted for \(interface), which does not exist") }
        if lockdownLifted { violation("the lockdown lifted twice") }
        lockdownLifted = true
    }

    mutating func restoreLockdown() {
        if !lockdownLifted { violation("the lockdown restored while whole") }
        lockdownLifted = false
    }

    mutating func transitioned(_ transition: Transition) {
        feeding.reported = true
        if transition.from.phase != feeding.before.phase && report.transitions.last?.to.phase != transition.from.phase {
            violation("transition from \(transition.from.name) but the machine was \(feeding.before.name)")
        }
        report.transitions.append(transition)
        onTransition(transition)
    }
}
