import Topology
import Basics

/// Attempts: the budget they take, the handshake or probe that proves a path, the socket moved
/// there, and what follows when one fails.
extension Reconnector {
    /// Spends a token on a reconnect to `path`, or backs off until one comes back.
    mutating func attempt(on path: Path, _ reason: Reason, _ now: Instant, _ out: inout [Effect],
                                  handshake: Bool = false) {
        if budget.isBackingOff, dead[path.id.over(.udp)] == nil, dead[path.id.over(.stream)] == nil {
            // The backoff was earned on paths that failed; this one has not failed since (a new
            // network, or one back after a long sleep): no step of it applies here. Its uplink
            // failed over either transport counts: a retry names the uplink, and its transport
            // is chosen afresh.
            budget.resetBackoff()
        }
        if let due = budget.notBefore, now < due {
            arm(.retry, at: due)
            return enter(.backingOff(path.over(.udp)), .backoff(nextIn: due - now), now, &out)
        }
        budget.forgetWait()
        guard takeToken(now) else {
            let next = nextToken()
            arm(.retry, at: next)
            return enter(.backingOff(path.over(.udp)), .budgetExhausted(nextIn: next - now), now, &out)
        }
        startAttempt(on: path, reason, now, &out, handshake: handshake)
    }

    /// Moves the socket if needed, then proves the path: a probe if the session is still
    /// alive (the server follows us on the first authenticated packet), else a handshake.
    mutating func startAttempt(on given: Path, _ because: Reason, _ now: Instant, _ out: inout [Effect],
                                       handshake: Bool) {
        attempt += 1
        raced = nil
        // An uplink's UDP path: the transport is chosen here (see `transport(for:)`); a stream
        // path given is the stream on purpose (a failed UDP attempt's fallback, a stream mended).
        var (path, reason, race) = (given, because, false)
        if given.transport == .udp { (path, reason, race) = transport(for: given, because, now) }
        if refusals?.path.id != path.id { refusals = nil }
        prove(path, reason, now, &out, handshake: handshake)
        if race {
            arm(.race, at: now + raceDelay(now))
        } else if deadlines[.race] != nil {
            cancel(.race)  // an earlier attempt's
        }
    }

    /// Moves the socket to `path` if needed (binds it again after a refusal), then proves the
    /// path: a probe if the session is still alive, else a handshake.
    mutating func prove(_ path: Path, _ reason: Reason, _ now: Instant, _ out: inout [Effect], handshake: Bool) {
        moveSocket(to: path, reason, &out)
        if handshake || !isSessionFresh(now) {
            checkingHint = false  // fresh keys settle it
            // New keys are a new start: with the first server in the list that is not held down.
            let first = preferredServer(now)
            if first != server { useServer(first, &out) }
            out.append(.handshake(on: path, reason: reason))
            arm(.handshake, at: now + config.handshakeTimeout)
            enter(.connecting(path), reason, now, &out)
            resends = 0
            // A stream delivers what it carries or breaks: nothing to send again within it.
            if path.transport == .udp { armResend(now, &out) }
        } else {
            probe(path, now, &out)
            enter(.probing(path, sent: 1), reason, now, &out)
        }
    }

    mutating func handshakeSucceeded(rtt: Duration, _ now: Instant, _ out: inout [Effect]) {
        // A handshake that was in flight when the operator took the tunnel down: its keys went
        // with the session.
        switch state {
        case .paused, .disconnected: return
        default: break
        }
        // The driver holds the fresh keys whatever the state: the session lives from now.
        session = (now, now)
        // In backing-off the answer came after the timeout gave up on it; it works all the same,
        // unless the driver could not bind the path since: the keys wait for the next bind.
        let path: Path
        switch state {
        case .connecting(let p, _), .portal(let p, _, _, _): path = p
        case .backingOff(let p) where !unbound: path = onSocket(p)
        default: return
        }
        // The handshake's time includes the server's work on it, so it bounds the path's RTT from
        // above: a sample when no estimate is known or when the estimate is slower than that
        // (a queue that has drained since the last probe).
        if self.rtt.smoothed.map({ rtt < $0 }) ?? true { sampleRTT(rtt, now) }
        dead.clear(path.id)
        enter(.connected(path), .handshakeSucceeded(rtt: rtt), now, &out)
        considerBetterPath(now, &out)
    }

    mutating func handshakeFailed(_ failure: HandshakeFailure, _ now: Instant, _ out: inout [Effect]) {
        switch failure {
        case .timeout:
            if case .connecting(let path, _) = state { failed(on: path, .handshakeTimeout(path.interface), now, &out) }
        case .rejected(let why):
            switch state {
            case .sleeping, .failed, .offline, .paused, .disconnected: return
            default:
                enter(.failed(.rejected(why)), .rejected(why), now, &out)
                out.append(.reportFailure(.rejected(why)))
            }
        case .sessionUnknown:
            sessionUnknownHint(now, &out)
        }
    }

    /// Resends the handshake in flight after the path's patience (at least `handshakeResend`),
    /// doubled per resend, while that is before the attempt's own timeout.
    mutating func armResend(_ now: Instant, _ out: inout [Effect]) {
        guard let timeout = deadlines[.handshake] else { return }
        let due = now + max(config.handshakeResend, patience(now)) * (1 << min(resends, 10))
        if due < timeout { arm(.resend, at: due) }
    }

    /// An attempt on `path` failed: move to another path at once if one is left, else back off.
    /// `blameServer` false: the failure was the machine's own (a bind it refused), which says
    /// nothing of the server.
    mutating func failed(on path: Path, _ reason: Reason, _ now: Instant, _ out: inout [Effect],
                                 blameServer: Bool = true) {
        // Every path went silent towards this server (the rescue path's probes too), or it had
        // only this one: the server is the suspect. Another server is tried at once, on the
        // best path, which is not blamed for it. Once attempts back off, a retry goes to the
        // first server not held down and its failure backs off again: the servers are not
        // cycled through between retries.
        // Other uplinks, that is: the other transport over this one is no other path to the server.
        let uplink = path.over(.udp)
        let otherPaths = paths.contains { $0.id != uplink.id && !isDead($0.id, now) }
        let rescueSilent = rescue.map { $0.rtt == nil } ?? false
        if blameServer, rescueSilent || !otherPaths, budget.failures == 0, let next = nextServer(now) {
            return switchServer(to: next, now, &out)
        }
        markDead(path.id, now)
        if let other = paths.first(where: { $0.id != uplink.id && !isDead($0.id, now) }) {
            return attempt(on: other, reason, now, &out, handshake: isHandshaking)
        }
        // No other uplink: the other transport over this one, unless it went unanswered in this
        // very attempt (UDP silent for the race delay, then the stream failed too: the whole
        // network is silent, which may be a portal).
        if let twin = otherTransport(of: path, now) {
            return attempt(on: twin, reason, now, &out, handshake: isHandshaking)
        }
        budget.noteFailure()
        arm(.retry, at: now + backoffWait(now))
        // Backing off is about the uplink: the retry chooses its transport afresh.
        enter(.backingOff(uplink), reason, now, &out)
        checkForPortal(on: uplink, &out)
    }

    /// The backoff's wait after a failed attempt (`ReconnectBudget.backoffWait`).
    mutating func backoffWait(_ now: Instant) -> Duration { budget.backoffWait(now, inForce, &rng) }

    /// The budget in force: the configuration's for the power source now.
    var inForce: Config.Budget { config.budget(on: power) }

    mutating func takeToken(_ now: Instant) -> Bool { budget.take(now, inForce) }

    func nextToken() -> Instant { budget.nextToken(inForce) }

    mutating func moveSocket(to path: Path, _ reason: Reason, _ out: inout [Effect]) {
        guard socket != path.id || unbound else { return }
        if socket != path.id { probeRecord = (0, 0) }  // another path's losses are its own
        out.append(.bind(path, first: socket == nil, reason: reason))
        socket = path.id
        unbound = false
    }

    /// `path` (a backoff's uplink) over the transport the driver's socket on that uplink has:
    /// what an answer arriving while backing off came over.
    func onSocket(_ path: Path) -> Path {
        guard let socket, socket.over(.udp) == path.id.over(.udp) else { return path }
        return path.over(socket.transport)
    }

    /// The driver could not bind the socket on path `id`. On the session's path it is not a
    /// verdict on the network (nothing was sent) but on the machine's addresses, which settle
    /// within moments (a secondary address being promoted, an IPv6 address still tentative): the
    /// session is taken off the path at once (never reported on a socket the driver lacks) and
    /// bound again after a short wait, doubled each time, `bindRetries` times, as the same
    /// attempt; then the path is a failed attempt, and the session moves to the next path or
    /// backs off. A candidate or rescue path that cannot be bound is not probed: the session
    /// stays where it is.
    mutating func bindFailed(on id: Path.ID, why: String, _ now: Instant, _ out: inout [Effect]) {
        // Probes sent on that path went nowhere the session is: a late echo of one proves nothing.
        probes.forget(on: id)
        guard id == socket, !unbound else {
            switch state {
            case .switching(let from, let to, _, _) where to.id == id:
                markDead(id, now)
                enter(.connected(from), .bindFailed("\(to.name) \(to.source)", why: why, retryIn: nil), now, &out)
                considerBetterPath(now, &out)
            case .probing where rescue?.path == id:
                rescue = nil
                coalesced += 1
            default:
                coalesced += 1  // a path the session is not on, or one already refused
            }
            return
        }
        unbound = true
        let path: Path
        let handshake: Bool
        switch state {
        case .connecting(let p, _) where p.id == id: (path, handshake) = (p, true)
        case .probing(let p, _, _, _, _) where p.id == id, .connected(let p, _, _) where p.id == id: (path, handshake) = (p, false)
        default:
            coalesced += 1
            return
        }
        var refused = refusals.flatMap { $0.path.id == id ? $0 : nil } ?? (path: path, count: 0, handshake: handshake)
        refused.count += 1
        refusals = refused
        let name = "\(path.name) \(path.source)"
        guard refused.count <= Self.bindRetries else {
            refusals = nil
            return failed(on: path, .bindFailed(name, why: why, retryIn: nil), now, &out, blameServer: false)
        }
        let wait = Self.bindRetryAfter * (1 << (refused.count - 1))
        arm(.rebind, at: now + wait)
        enter(.backingOff(path.over(.udp)), .bindFailed(name, why: why, retryIn: wait), now, &out)
    }

    func isSessionFresh(_ now: Instant) -> Bool {
        guard let session else { return false }
        return now - session.lastHeard < config.sessionLifetime
    }

    /// Ends the session with a goodbye: echoes still on their way prove nothing of the next one.
    mutating func goodbye(_ out: inout [Effect]) {
        probes.removeAll()
        out.append(.disconnect)
    }
}
