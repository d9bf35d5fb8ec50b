import Topology
import Basics

/// The servers of the list: a server that moved, one that drains (a handover to the next), one gone
/// silent.
extension Reconnector {
    /// The server answers at another address now. A live session is proved with a probe (the
    /// same server keeps it; another one behind the name answers "session unknown", which brings
    /// a handshake); a handshake in flight to the old address starts afresh; a backoff drawn for
    /// the old address ends: the new one is a new chance, within the budget, as a new path is.
    mutating func serverMoved(_ now: Instant, _ out: inout [Effect]) {
        // Paths that failed their probes failed them towards the old address, and the path to
        // the new one may carry other sizes.
        dead.removeAll()
        tooSmall.removeAll()
        mtu = nil
        switch state {
        case .offline, .sleeping, .failed, .paused, .portal, .disconnected:
            // The next attempt goes to the new address anyway (behind a portal, after it opens).
            coalesced += 1
        case .backingOff:
            guard let best = preferred(now), takeToken(now) else { coalesced += 1; return }
            startAttempt(on: best, .serverAddressChanged, now, &out, handshake: false)
        case .connected(let path, _, _), .probing(let path, _, _, _, _), .switching(let path, _, _, _):
            probe(path, now, &out)
            enter(.probing(path, sent: 1), .serverAddressChanged, now, &out)
        case .connecting(let path, _):
            // The initiation went to the old address: its answer will not come.
            attempt(on: preferred(now) ?? path, .serverAddressChanged, now, &out, handshake: true)
        }
    }

    /// The current server is being taken down: a session is made with the next server first,
    /// and the traffic moves once it is up (make-before-break). It costs no token: the server
    /// asked, and only once per drain. With no other server, the session stays until it ends.
    /// On the stream the handshake with the next server needs a stream of its own, and the
    /// session's reaches only the server it was opened to: the session ends there with a
    /// goodbye (the draining server stops as soon as none is left) and moves break-before-make,
    /// at once, over a new stream on the same uplink (also without a token).
    mutating func serverDraining(_ now: Instant, _ out: inout [Effect]) {
        drained[server] = now + Self.drainHoldDown
        guard handover == nil, session != nil, Self.allows(state, .handover), let path = state.path,
              let next = nextServer(now, drainedToo: false) else {
            coalesced += 1
            return
        }
        if path.transport == .stream {
            goodbye(&out)
            return startAttempt(on: path, .serverDraining(servers[server]), now, &out, handshake: true)
        }
        prepareHandover(to: next, on: path, now, &out)
        enter(state, .serverDraining(servers[server]), now, &out)
    }

    mutating func prepareHandover(to next: Int, on path: Path, _ now: Instant, _ out: inout [Effect]) {
        handover = next
        out.append(.prepareHandover(server: next, at: nil, on: path))
        arm(.handover, at: now + config.handshakeTimeout)
    }

    mutating func handoverReady(rtt: Duration, sizedProbes sized: Bool, _ now: Instant, _ out: inout [Effect]) {
        guard let next = handover, let path = state.path else { return }
        handover = nil
        cancel(.handover)
        let old = server
        server = next
        session = (now, now)
        sizedProbes = sized
        // Verdicts on paths, and their MTUs, were about the old server.
        dead.removeAll()
        tooSmall.removeAll()
        mtu = nil
        sampleRTT(rtt, now, newPath: true)
        // Echoes still on their way come from the old server: they prove nothing now.
        probes.removeAll()
        out.append(.completeHandover)
        enter(.connected(path), .handedOver(from: servers[old], to: servers[next], rtt: rtt), now, &out)
        considerBetterPath(now, &out)
    }

    /// The server the session was to move to stayed silent or refused: the next one is asked,
    /// or the traffic stays where it is.
    mutating func handoverFailed(_ now: Instant, _ out: inout [Effect]) {
        guard let failed = handover else { return }
        markServer(failed, now)
        if deadlines[.handover] != nil { cancel(.handover) }
        if let next = nextServer(now, drainedToo: false), next != failed, let path = state.path {
            return prepareHandover(to: next, on: path, now, &out)
        }
        dropHandover(&out)
        enter(state, .handoverFailed(servers[failed]), now, &out)
    }

    /// Break-before-make: the current server is silent, so its session is worth nothing; the
    /// next server gets a handshake at once (within the budget).
    mutating func switchServer(to next: Int, _ now: Instant, _ out: inout [Effect]) {
        let old = server
        markServer(old, now)
        let reason = Reason.serverUnreachable(servers[old])
        useServer(next, &out)
        guard let path = preferred(now) else { return enter(.offline, reason, now, &out) }
        attempt(on: path, reason, now, &out, handshake: true)
    }

    mutating func useServer(_ index: Int, _ out: inout [Effect]) {
        dropHandover(&out)
        server = index
        session = nil
        checkingHint = false
        dead.removeAll()
        tooSmall.removeAll()
        mtu = nil
        rtt.forget()
        probes.removeAll()  // echoes still on their way come from the old server
        out.append(.useServer(index, at: nil))
    }

    /// The first server in the list that is neither held down nor drained, else the first not
    /// held down; the current one if every server is held down. Of each kind, one with an
    /// address the session may use comes first.
    func preferredServer(_ now: Instant) -> Int {
        let open = servers.indices.filter { !isServerHeld($0, now) }
        return firstWithAddress(open.filter { !isDrained($0, now) }) ?? firstWithAddress(open) ?? server
    }

    /// Another server to try: the first in the list that is not held down, preferring those not
    /// drained (`drainedToo` false: only those), and of each kind one with an address the
    /// session may use.
    func nextServer(_ now: Instant, drainedToo: Bool = true) -> Int? {
        let others = servers.indices.filter { $0 != server && !isServerHeld($0, now) }
        return firstWithAddress(others.filter { !isDrained($0, now) }) ?? (drainedToo ? firstWithAddress(others) : nil)
    }

    /// The first of `candidates` with an address the session may use, else the first.
    private func firstWithAddress(_ candidates: [Int]) -> Int? {
        candidates.first { !addressless.contains($0) } ?? candidates.first
    }

    func isServerHeld(_ index: Int, _ now: Instant) -> Bool {
        heldServers.isHeld(index, now)
    }

    func isDrained(_ index: Int, _ now: Instant) -> Bool {
        drained[index].map { now < $0 } ?? false
    }

    /// A server that failed is avoided as a dead path is, doubling per repeat up to `maxHoldDown`.
    mutating func markServer(_ index: Int, _ now: Instant) {
        heldServers.strike(index, now, base: config.deadPathHoldDown, cap: config.maxHoldDown)
    }

    /// Forgets the session being prepared with another server, if there is one.
    mutating func dropHandover(_ out: inout [Effect]) {
        guard handover != nil else { return }
        handover = nil
        out.append(.cancelHandover)
    }
}
