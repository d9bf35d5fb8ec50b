import Topology
import Basics

/// What each timer the machine keeps does when it is due.
extension Reconnector {
    mutating func timerFired(_ kind: TimerKind, _ now: Instant, _ out: inout [Effect]) {
        // A timer the state machine no longer wants (cancelled, or fired late) is ignored.
        guard let due = deadlines[kind], due <= now else { return }
        deadlines[kind] = nil
        switch (kind, state) {
        case (.liveness, .connected(let path, _, _)):
            let waited = livenessWait(now)
            probe(path, now, &out)
            // A hint came since the server was last heard: its check is this probe.
            if checkingHint { arm(.probe, at: now + hintPatience(now)) }
            // Make-before-break for a path that may have died: the best other path is asked at
            // the same time, and takes over if the session's own stays silent.
            let other = paths.first { $0.id != path.id.over(.udp) && !isDead($0.id, now) }
            if let other { sendProbe(via: other, &out) }
            enter(.probing(path, sent: 1, rescue: other.map { Rescue(path: $0.id) }, byLiveness: true),
                  .livenessTimeout(waited), now, &out)
        case (.probe, .probing(let path, let sent, _, _, _)) where checkingHint && sent < probesBeforeDead(after: sent, atLeast: 1):
            // On a path that loses packets one silent probe proves nothing: the check sends as
            // many as the path's loss calls for (one on a clean path), as a dead-path verdict does.
            sendProbe(via: path, &out)
            arm(.probe, at: now + hintPatience(now))
            stay(.probing(path, sent: sent + 1))
        case (.probe, .probing(let path, _, _, _, _)) where checkingHint:
            // Nothing authenticated came back: the server did lose the session.
            checkingHint = false
            session = nil
            attempt(on: path, .sessionUnknown, now, &out, handshake: true)
        case (.probe, .probing(let path, let sent, _, _, _)):
            if rescue?.rtt != nil, takeToken(now) { return failover(from: path, now, &out) }
            if sent < probesBeforeDead(after: sent) {
                probe(path, now, &out, attempt: sent + 1)
                if let other = rescue, other.rtt == nil, let rescuePath = paths.first(where: { $0.id == other.path }) {
                    sendProbe(via: rescuePath, &out)
                }
                stay(.probing(path, sent: sent + 1))
            } else {
                failed(on: path, .probeTimeout(sent, of: config.probeAttempts), now, &out)
            }
        case (.probe, .switching(let from, let to, let sent, _)):
            if sent < config.probeAttempts {
                probe(to, now, &out)
                stay(.switching(from: from, to: to, sent: sent + 1))
            } else if Self.isUDPRetest(from: from, to: to) {
                // Still blocked: no verdict against the UDP path (it is not dead, only blocked
                // here), and the next re-test waits twice as long.
                if var next = retest {
                    next.failed += 1
                    next.due = now + config.udpRetest(after: next.failed, on: power)
                    retest = next
                }
                enter(.connected(from), .udpStillSilent(to.interface, probes: sent), now, &out)
                considerBetterPath(now, &out)
            } else {
                markDead(to.id, now)
                enter(.connected(from), .candidateUnreachable(to.name, probes: sent), now, &out)
                considerBetterPath(now, &out)
            }
        case (.handshake, .connecting(let path, _)):
            failed(on: path, .handshakeTimeout(path.interface), now, &out)
        case (.resend, .connecting(let path, _)):
            // No transition: the attempt goes on, with a fresh initiation in case one was lost.
            resends += 1
            resentHandshakes += 1
            out.append(.resendHandshake(on: path))
            armResend(now, &out)
        case (.debounce, .connected(let current, _, _)):
            guard let id = candidate, let uplink = paths.first(where: { $0.id == id }),
                  Self.isPreferred(uplink, over: current), !isDead(id, now), id != rulesWait?.path
            else { return considerBetterPath(now, &out) }
            guard takeToken(now) else { return arm(.debounce, at: nextToken()) }
            candidate = nil
            // Over the stream if its network is known to block UDP.
            let target = knownToBlockUDP(uplink, now) ? uplink.over(.stream) : uplink
            let reason: Reason = target.linkIndex == current.linkIndex
                ? .addressChanged(current.interface, from: current.source, to: target.source)
                : .betterPath(target, over: current)
            // A session the server has forgotten by now (idle past its lifetime) cannot be probed
            // onto the better path: the probe would draw a hint, its check and a handshake on the
            // path being left. One handshake on the better path does it all.
            guard isSessionFresh(now) else {
                session = nil
                return startAttempt(on: target, reason, now, &out, handshake: true)
            }
            probe(target, now, &out)
            enter(.switching(from: current, to: target, sent: 1), reason, now, &out)
        case (.handover, _):
            handoverFailed(now, &out)
        case (.rebind, .backingOff):
            guard unbound, let refused = refusals, let path = Self.refreshed(refused.path, in: paths) else {
                guard let best = preferred(now) else { return enter(.offline, .retry, now, &out) }
                return attempt(on: best, .retry, now, &out)
            }
            // The same attempt, bound again: no token, no new attempt (see `bindRetries`).
            prove(path, .retry, now, &out, handshake: refused.handshake)
        case (.retry, .backingOff):
            guard let best = preferred(now) else { return enter(.offline, .retry, now, &out) }
            // A probe while the session lives (the server keeps it), a handshake once it is gone.
            attempt(on: best, .retry, now, &out)
        case (.recheck, .portal(let path, _, _, _)):
            checkConnectivity(via: path, &out)
            rechecks += 1
            arm(.recheck, at: now + recheckWait)
        case (.pathMTU, .connected(let path, _, _)):
            pathMTUTimer(on: path, now, &out)
        case (.race, .connecting(let path, _)) where path.transport == .udp,
             (.race, .probing(let path, _, _, _, _)) where path.transport == .udp:
            raceToStream(from: path, now, &out)
        case (.udpRetest, .connected(let path, _, _)) where path.transport == .stream:
            retestUDP(from: path, now, &out)
        case (.portalWindow, .portal(let path, let url, _, _)):
            portalWindow = nil
            out.append(.closePortalWindow)
            enter(.portal(path, url: url), .portalWindowClosed(why: "timed out"), now, &out)
            arm(.recheck, at: now + recheckWait)
        default:
            break
        }
    }
}
