import Topology
import Basics
import Reconnector

/// The world a scenario describes: its links, NATs, streams, the server and what each carries.
extension Replay {
    // MARK: The world

    func interface(of id: Path.ID) -> String? { kernel.model.links[id.linkIndex]?.name }

    /// True when a packet can still arrive on this path: its link has carrier and its address.
    func reaches(_ id: Path.ID) -> Bool {
        guard let link = kernel.model.links[id.linkIndex], link.isUsable else { return false }
        return kernel.model.addresses.values.contains { $0.linkIndex == id.linkIndex && $0.ip == id.source }
    }

    /// True when a packet the server sent to `endpoint` can arrive: the socket is still open and
    /// its path still reaches.
    func reaches(_ endpoint: ClientEndpoint) -> Bool {
        sockets[endpoint.path] == endpoint.socket && reaches(endpoint.path)
    }

    /// True when packets sent from this path reach the server (the gateway talked to, unless
    /// named): it is up and answers at the address they go to.
    func passes(_ id: Path.ID, gateway: Int? = nil) -> Bool {
        let to = gateway == nil ? sendingTo : standbyAddress
        guard !sleeping, gateways[gateway ?? target].up, let to, names[gateway ?? target].contains(to),
              isCurrent(id), let name = interface(of: id), !dropped.contains(name) else { return false }
        switch id.transport {
        case .udp: return portals[name] == nil && filter(name).passesUDP
        // The stream carries once open; a portal that appeared meanwhile intercepts what follows.
        case .stream: return streamReady[id] != nil && portals[name] == nil
        }
    }

    /// True when `id`'s uplink and source are one of the kernel's paths to the server now (the
    /// source may be one the link no longer prefers), whatever the transport.
    func isCurrent(_ id: Path.ID) -> Bool {
        let udp = id.over(.udp)
        return kernel.paths.contains { $0.id == udp || ($0.linkIndex == id.linkIndex && $0.otherSources.contains(id.source)) }
    }

    func filter(_ name: String) -> LinkFilter { filters[name] ?? .none }

    /// How a stream opened now over `id` fares: it opens after that many round trips (TCP,
    /// TLS, the proxy's CONNECT), fails after that long and why, or never opens (its SYN dropped:
    /// only the attempt's own timeout ends it).
    enum StreamOutcome { case opens(roundTrips: Int), fails(after: Duration, String), silent }

    func streamOutcome(_ id: Path.ID) -> StreamOutcome {
        guard !sleeping, reaches(id), let name = interface(of: id), !dropped.contains(name) else { return .silent }
        let rtt = roundTrip(id)
        // A portal intercepts HTTPS: TLS fails on its certificate.
        if portals[name] != nil { return .fails(after: rtt * 2, "TLS failed: the certificate is not the gateway's") }
        switch filter(name) {
        case .allButTCP443 where scenario.streamPort != 443: return .silent
        case .allButProxy where scenario.streamProxy == nil: return .fails(after: rtt, "connection refused")
        default: break
        }
        if scenario.proxyNamed {
            // The runner dials the address the core had the lockdown let through on this network.
            guard let at = proxyAddress(for: id) else { return .fails(after: .zero, "no address for the proxy on \(name)") }
            guard (proxyNames[name] ?? []).contains(at) else { return .silent }  // no proxy at that address here
        }
        guard gateways[target].up else { return .fails(after: rtt, "connection refused") }
        return .opens(roundTrips: scenario.streamProxy == nil ? 2 : 3)
    }

    /// The stream on `id`, opened on first use as the runner opens it: a new connection (a new
    /// socket, where nothing sent to an earlier one arrives).
    /// The proxy's address the runner dials for a stream on `id`'s network (a proxy named by host).
    func proxyAddress(for id: Path.ID) -> IPAddress? {
        kernel.paths.first { $0.id == id.over(.udp) }.flatMap { proxyAt[NetworkKey($0)] }
    }

    mutating func openStream(on id: Path.ID) {
        guard sockets[id] == nil else { return }
        if scenario.proxyNamed, proxyAddress(for: id) == nil {
            violation("a stream on \(interface(of: id) ?? "?") before the proxy's name gave an address there")
        }
        socketsMade += 1
        let socket = socketsMade
        sockets[id] = socket
        switch streamOutcome(id) {
        case .opens(let trips):
            let ready = now + roundTrip(id) * trips
            streamReady[id] = ready
            if let name = interface(of: id), let after = streamResets[name] {
                queue.push(ready + after, .streamBroke(id, socket: socket, why: "connection reset by peer"))
            }
        case .fails(let after, let why):
            queue.push(now + after, .streamBroke(id, socket: socket, why: why))
        case .silent:
            break
        }
    }

    /// The gateway's process went away (down, or restarting): its host resets every stream to
    /// it, which the agent hears of half a round trip later.
    mutating func breakStreams() {
        for (id, socket) in sockets where id.transport == .stream && streamReady[id] != nil {
            queue.push(now + roundTrip(id) / 2, .streamBroke(id, socket: socket, why: "connection reset by peer"))
        }
    }

    func roundTrip(_ id: Path.ID) -> Duration {
        interface(of: id).flatMap { rtt[$0] } ?? scenario.rtt
    }

    /// Whether one packet through `id` in this direction is lost: to the link's loss, to a path
    /// MTU smaller than the packet (`size` bytes on the wire, either way), or, for an answer, to
    /// a NAT that forgot the mapping before it arrived (`arriving`).
    mutating func lost(_ id: Path.ID, up: Bool, size: Int = 64, arriving: Instant? = nil) -> Bool {
        // TCP delivers what it carries (a loss only delays it) and cuts packets of any size.
        guard let name = interface(of: id), id.transport == .udp else { return false }
        if !fits(size, on: id) { return true }
        if up {
            if let timeout = natTimeout[name], let sent = lastSent[name], now - sent > timeout { natMapping[name, default: 0] += 1 }
            lastSent[name] = now
        } else if let at = arriving, let timeout = natTimeout[name], let sent = lastSent[name], at - sent > timeout {
            return true
        }
        if draw((up ? lossUp : lossDown)[name]) { return true }
        return draw((id.source.family == .v4 ? lossV4 : lossV6)[name])
    }

    /// True with probability `share` (none drawn without one, so a scenario's other draws stay put).
    mutating func draw(_ share: Double?) -> Bool {
        guard let share, share > 0 else { return false }
        return Double(chance.next() >> 11) / Double(1 << 53) < share
    }

    /// When the answer to a packet sent now through `id` arrives: the round trip plus the link's jitter.
    mutating func arrival(_ id: Path.ID) -> Instant {
        let spread = interface(of: id).flatMap { jitter[$0] } ?? .zero
        // Over a stream still opening, the packet goes once it is open.
        let opening = streamReady[id].map { $0 > now ? $0 - now : .zero } ?? .zero
        return now + opening + roundTrip(id) + chance.upTo(spread)
    }

    var carrying: Bool {
        switch reconnector.state {
        case .connected, .probing, .switching: true
        default: false
        }
    }

    /// True when the path through `id` carries a packet of `size` bytes on the wire.
    func fits(_ size: Int, on id: Path.ID) -> Bool {
        id.transport == .stream || (interface(of: id).flatMap { pathMTU[$0] }.map { size <= $0 } ?? true)
    }

    /// What the tunnel adds to an inner packet on the wire over `id`.
    static func overhead(_ id: Path.ID) -> Int { Path.tunnelOverhead(from: id.source) }

    /// The application's packet on the wire: at most the tunnel's MTU inside (the kernel makes
    /// the application's packets fit the device), plus the tunnel's overhead.
    func wireSize(of inner: Int, on id: Path.ID) -> Int {
        min(inner, tunnelMTU) + Self.overhead(id)
    }

    /// The application sends a packet of `inner` bytes, which its peer answers as big; as the
    /// data plane does, the first after a quiet spell is reported to the agent.
    mutating func sendTraffic(size inner: Int) {
        guard !sleeping, carrying, let socket else { return }
        lastAppSent = now
        if LivenessNotices.reportsSent(at: now, lastArrival: lastArrival, awaiting: awaitingReply, lastReport: lastSentReport) {
            awaitingReply = true
            lastSentReport = now
            feed(.dataSent)
        }
        let size = wireSize(of: inner, on: socket)
        answer(from: socket, clientHasSession ? .dataReceived : nil, size: size, downSize: size)
    }

    /// An authenticated packet reached the agent's session: the data plane notes it, and reports
    /// it as `LivenessNotices` say (a probe's echo or a handshake's answer is reported as such:
    /// `reporting: false`).
    mutating func arrived(reporting: Bool = true) {
        lastArrival = now
        if lastHeard != nil { lastHeard = now }
        hints.reset()
        guard reporting, LivenessNotices.reportsArrival(at: now, awaited: awaitingReply, lastReport: lastReported) else { return }
        awaitingReply = false
        lastReported = now
        feed(.dataReceived)
    }

    /// A keepalive from the session's socket (after a rebind, a handshake's confirmation, or
    /// `persistent` after the application's silence): the server and the NATs on the way hear
    /// it; nothing answers.
    mutating func sendKeepalive(persistent: Bool) {
        guard !sleeping, clientHasSession, let socket else { return }
        if persistent { keepalives += 1 }
        guard passes(socket), !lost(socket, up: true) else { return }
        serverHeard(from: socket)
    }

    /// The gateway (the one talked to, unless named) heard an authenticated packet from `id` on
    /// the session it holds: the session lives on, and it records where from.
    mutating func serverHeard(from id: Path.ID, gateway: Int? = nil) {
        let index = gateway ?? target
        guard gateways[index].hasSession else { return }
        gateways[index].heardAt = now
        if let endpoint = endpoint(of: id) { gateways[index].endpoint = endpoint }
    }

    /// Where a packet sent from `id` comes from, as a server sees it: the agent's socket on the
    /// path and the NAT's mapping of its link.
    func endpoint(of id: Path.ID) -> ClientEndpoint? {
        guard let socket = sockets[id], let name = interface(of: id) else { return nil }
        return ClientEndpoint(path: id, socket: socket, mapping: natMapping[name, default: 0])
    }

    /// A packet the server starts, sent to where it last heard the agent from: lost when the
    /// session is gone, the NAT forgot or remapped, or the agent's socket there is closed.
    mutating func serverSends(size inner: Int) {
        let gateway = gateways[target]
        guard gateway.up else { return }
        fromServer.sent += 1
        guard gateway.hasSession, now - gateway.heardAt < scenario.config.sessionLifetime, let endpoint = gateway.endpoint,
              let name = interface(of: endpoint.path), !dropped.contains(name), portals[name] == nil else { return }
        switch endpoint.path.transport {
        case .udp: guard natMapping[name, default: 0] == endpoint.mapping, filter(name).passesUDP else { return }
        case .stream: guard streamReady[endpoint.path] != nil else { return }
        }
        let at = now + roundTrip(endpoint.path) / 2
        guard !lost(endpoint.path, up: false, size: wireSize(of: inner, on: endpoint.path), arriving: at) else { return }
        fromServer.inFlight += 1
        queue.push(at, .fromServer(endpoint))
    }

    /// The server's answer to an authenticated packet from `id` (`size` bytes on the wire):
    /// `reply` if it knows the session (`downSize` bytes back), else its rate-limited
    /// "session unknown" hint.
    mutating func answer(from id: Path.ID, _ reply: AgentEvent?, size: Int = 64, downSize: Int = 64) {
        guard passes(id), let reply, !lost(id, up: true, size: size) else { return }
        if serverHasSession && now - serverHeardAt >= scenario.config.sessionLifetime { serverHasSession = false }
        if serverHasSession {
            serverHeard(from: id)
            let at = arrival(id)
            if !lost(id, up: false, size: downSize, arriving: at) {
                // An echo names its probe and reports the round trip it really took, jitter included.
                if case .probeEcho(let probe, _, let size) = reply {
                    queue.push(at, .echo(probe, rtt: at - now, size: size, via: id))
                } else {
                    queue.push(at, .deliver(reply, generation: 0, via: id))
                }
            }
        } else if lastHint.map({ now - $0 >= .milliseconds(100) }) ?? true {
            lastHint = now
            let at = arrival(id)
            if !lost(id, up: false, arriving: at) { queue.push(at, .deliver(.sessionUnknown, generation: clientKeys, via: id)) }
        }
    }

    mutating func deliver(_ input: AgentEvent) {
        switch input {
        case .handshakeCompleted:
            clientHasSession = true
            clientKeys += 1
            lastHeard = now
            arrived(reporting: false)
            // Its confirmation tells the server where the agent is.
            sendKeepalive(persistent: false)
        case .sessionUnknown:
            // The client keeps its keys (the hint is unauthenticated) and sends on. As its data
            // plane does, it reports one hint per session until the server is heard again.
            guard hints.hint() else { return }
            // A true hint: the server has said it lost the session.
            if !serverHasSession { lastHeard = nil }
        case .dataReceived:
            // An answer to the application's data: the data plane reports it if it reported
            // the data sent.
            return arrived()
        default: break
        }
        feed(input)
    }

    mutating func updateOutage() {
        // A tunnel the rules keep down is no outage.
        let keptDown = if case .disconnected = reconnector.state { true } else { false }
        let couldWork = !sleeping && !keptDown && gateways.contains(where: \.up) && acceptsAuth
            && kernel.paths.contains { couldCarry($0) }
        // Full-size packets count: a path that drops them (an MTU black hole) carries no tunnel.
        let works = carrying && clientHasSession && serverHasSession && missing[.routing] == nil
            && socket.map { passes($0) && fits(wireSize(of: scenario.trafficSize, on: $0), on: $0) } == true
            && socket.flatMap { streamReady[$0] }.map { $0 <= now } ?? true
        if couldWork && !works {
            if outageStart == nil { outageStart = now }
        } else {
            endOutage()
        }
    }

    mutating func endOutage() {
        guard let start = outageStart else { return }
        outageStart = nil
        report.maxOutage = max(report.maxOutage, now - start)
        if now > start { report.outages.append(start..<now) }
    }

    /// Whether the tunnel could work through `path`'s uplink: UDP passes, or the agent may use
    /// the stream and it would open there.
    func couldCarry(_ path: Path) -> Bool {
        guard !dropped.contains(path.interface), portals[path.interface] == nil else { return false }
        if filter(path.interface).passesUDP { return true }
        guard reconnector.config.stream != nil else { return false }
        if case .opens = streamOutcome(path.id.over(.stream)) { return true }
        return false
    }
}
