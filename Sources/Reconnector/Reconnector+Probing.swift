import Topology
import Basics

/// Probes and what the server is heard to say: a suspect path's probes, a failover to the path that
/// answered, the RTT, and the check of a "session unknown" hint.
extension Reconnector {
    mutating func probeReply(on id: Path.ID, rtt: Duration, _ now: Instant, _ out: inout [Effect]) {
        noteHeard(now)
        if id == socket { probeRecord.answered = min(probeRecord.answered + 1, probeRecord.sent) }
        switch state {
        case .probing(let path, _, _, _, _) where path.id == id:
            sampleRTT(rtt, now)
            dead.clear(id)
            if suspectedByLiveness {
                quietProofs = min(quietProofs + 1, 5)
                // Data went unanswered, yet a small probe passes: the path may have begun to drop
                // big packets (a route change behind it). Its MTU is looked for again.
                prepareLookAtMTU(on: id, now)
            }
            enter(.connected(path), .probeAnswered(rtt: rtt), now, &out)
            considerBetterPath(now, &out)
        case .connected(let path, _, _) where path.id == id:
            sampleRTT(rtt, now)  // an estimate's refresh, or a probe's late echo
        case .probing(let path, let sent, _, _, _) where rescue?.path == id:
            rescue?.rtt = rtt
            // Once the session's own path has missed a probe, the path that answers takes over,
            // within the budget as on the probe timer's expiry.
            if sent > 1, takeToken(now) { failover(from: path, now, &out) }
        case .switching(let from, let to, _, _) where to.id == id:
            dead.clear(id)
            sampleRTT(rtt, now, newPath: true)
            // Back from the stream to UDP on the same uplink: a roam like any, no handshake.
            let reason: Reason = Self.isUDPRetest(from: from, to: to) ? .udpAnswered(to.interface, rtt: rtt)
                : .switched(to.name, rtt: rtt)
            moveSocket(to: to, reason, &out)
            enter(.connected(to), reason, now, &out)
        case .backingOff(let path) where path.id == id, .connecting(let path, _) where path.id == id,
             .portal(let path, _, _, _) where path.id == id:
            // An echo on the session's keys that came later than the probes waited (an RTT that
            // rose): the path works and the server still has the session. No handshake needed.
            guard session != nil, !unbound else { return }
            sampleRTT(rtt, now)
            dead.clear(id)
            enter(.connected(path), .probeAnswered(rtt: rtt), now, &out)
            considerBetterPath(now, &out)
        default:
            break
        }
    }

    mutating func dataSent(_ now: Instant, _ out: inout [Effect]) {
        guard case .connected(let path, _, _) = state else { return }
        if let session, now - session.lastHeard >= config.sessionLifetime {
            return attempt(on: path, .sessionExpired(idle: now - session.lastHeard), now, &out, handshake: true)
        }
        if deadlines[.liveness] == nil { arm(.liveness, at: now + livenessWait(now)) }
        refreshRTT(on: path, heardBefore: session?.lastHeard, now, &out)
    }

    /// While the tunnel carries traffic the estimate is kept current: a probe when three
    /// quarters of `rttStaleAfter` have passed since the last sample (at most one per that,
    /// none while idle), so that it never goes stale; the waits for answers and a hint's check
    /// rest on it. Data sent after a quiet spell asks for it, and so does a busy conversation,
    /// which reports only its arrivals (`LivenessNotices`). Traffic flows when the server was
    /// heard within `rttStaleAfter` before (`heardBefore`): an application that sends a packet a
    /// minute costs no probes.
    mutating func refreshRTT(on path: Path, heardBefore: Instant?, _ now: Instant, _ out: inout [Effect]) {
        let answering = heardBefore.map { now - $0 < config.rttStaleAfter } ?? false
        if answering, rtt.refresh(now, staleAfter: config.rttStaleAfter) { sendProbe(via: path, &out) }
    }

    mutating func dataReceived(_ now: Instant, _ out: inout [Effect]) {
        let heardBefore = session?.lastHeard
        noteHeard(now)
        quietProofs = 0
        switch state {
        case .connected(let path, _, _):
            if deadlines[.liveness] != nil { cancel(.liveness) }
            refreshRTT(on: path, heardBefore: heardBefore, now, &out)
        case .probing(let path, _, _, _, _):
            // With a rescue probe out, the server follows the session to the rescue path and its
            // data may arrive there: no proof for the silent path. The probe timer decides.
            guard rescue == nil else { return }
            enter(.connected(path), .trafficResumed, now, &out)
            considerBetterPath(now, &out)
        case .backingOff(let path), .connecting(let path, _), .portal(let path, _, _, _):
            // Data on the session's keys: the path works after all (its answers were only late)
            // and the server has the session. No handshake is needed. Not when the driver could
            // not bind the path: the data came over a socket the session is leaving.
            guard session != nil, !unbound else { return }
            enter(.connected(onSocket(path)), .trafficResumed, now, &out)
            considerBetterPath(now, &out)
        default:
            break
        }
    }

    /// The session's path went silent and `rescue` answered: the session moves there at once.
    mutating func failover(from path: Path, _ now: Instant, _ out: inout [Effect]) {
        guard let rtt = rescue?.rtt, let target = paths.first(where: { $0.id == rescue?.path }) else { return }
        markDead(path.id, now)
        dead.clear(target.id)
        sampleRTT(rtt, now, newPath: true)
        let reason = Reason.failover(from: path.interface, to: target.interface, rtt: rtt)
        moveSocket(to: target, reason, &out)
        enter(.connected(target), reason, now, &out)
        considerBetterPath(now, &out)
    }

    /// The server says it lost our keys (it restarted). The hint is unauthenticated: anyone who
    /// sees the session's packets can send one. So it is checked first, with a probe on the
    /// session's keys: a server that still has the session answers it (and any data proves the
    /// same), and the forgery cost one probe. No answer within the path's patience confirms it,
    /// and a handshake follows at once.
    mutating func sessionUnknownHint(_ now: Instant, _ out: inout [Effect]) {
        guard session != nil else { coalesced += 1; return }
        if let quiet = hintsIgnoredUntil, now < quiet {
            // Soon after a forgery: no probe now, but not forgotten either. The next answer
            // disproves it; if none comes, the liveness probe's silence confirms it.
            checkingHint = true
            coalesced += 1
            return
        }
        if checkingHint, case .probing = state { coalesced += 1; return }  // its check is out
        switch state {
        case .connected(let path, _, _), .probing(let path, _, _, _, _), .switching(let path, _, _, _):
            checkingHint = true
            sendProbe(via: path, &out)
            arm(.probe, at: now + hintPatience(now))
            enter(.probing(path, sent: 1), .sessionUnknownHint, now, &out)
        case .backingOff:
            // The retry's probe checks it: its silence then brings a handshake at once.
            checkingHint = true
        case .connecting, .offline, .sleeping, .failed, .paused, .portal, .disconnected:
            coalesced += 1  // fresh keys are on their way, or nothing is sent meanwhile
        }
    }

    /// How long a hint's check waits for an authenticated answer: twice the smoothed RTT while
    /// the estimate is current. An echo later than that costs the handshake a hint used to cost
    /// every time. An estimate with no recent sample may be from a faster hour of the path (its
    /// RTT rose since), so the check then waits twice the path's patience, at least the probe
    /// timeout.
    func hintPatience(_ now: Instant) -> Duration {
        guard let smoothed = rtt.smoothed else { return config.probeTimeout }
        if !rtt.isStale(now, staleAfter: config.rttStaleAfter) { return max(.milliseconds(20), smoothed * 2) }
        return max(config.probeTimeout, (smoothed * 2 + rtt.variance * 4) * 2)
    }

    /// Sends a probe and waits for its echo: the path's patience (at least `probeTimeout`),
    /// doubled for each probe in a row before it, as TCP backs off its retransmissions.
    /// The doubling stops at the wait of the last probe a clean path gets: a lossy path's
    /// further probes are about loss, not about a queue that needs more time.
    mutating func probe(_ path: Path, _ now: Instant, _ out: inout [Effect], attempt: Int = 1) {
        if tooSmall.contains(path.id), path.id != socket {
            // A small echo proved nothing on this path before: only the smallest tunnel packet does.
            sendSizeProbe(floorMTU, via: path, &out)
        } else {
            sendProbe(via: path, &out)
        }
        let doublings = min(attempt - 1, max(config.probeAttempts - 1, 0), 4)
        var wait = max(config.probeTimeout, patience(now)) * (1 << doublings)
        // A stream being opened takes two round trips (TCP, TLS) before the probe goes out.
        if path.transport == .stream, streamProven != path.id { wait = wait * 3 }
        arm(.probe, at: now + wait)
    }

    /// Every small probe goes out through here: those on the session's path count for its loss.
    mutating func sendProbe(via path: Path, _ out: inout [Effect]) {
        out.append(.probe(id: probes.remember(path.id, size: nil), via: path, size: nil))
        guard path.id == socket else { return }
        probeRecord.sent += 1
        if probeRecord.sent >= 32 { probeRecord = (probeRecord.sent / 2, probeRecord.answered / 2) }
    }

    /// A probe padded to stand for a tunnel packet of `size` bytes: only an echo as big proves
    /// that the path carries one.
    mutating func sendSizeProbe(_ size: Int, via path: Path, _ out: inout [Effect]) {
        sizeProbes += 1
        out.append(.probe(id: probes.remember(path.id, size: size), via: path, size: size))
    }

    /// Unanswered probes in a row that make the session's path dead, after `sent` of them in
    /// this round: `probeAttempts` on a path that lost none of its probes before; on one that
    /// lost a share `p` of them (with two answered ones assumed, so that a short history does
    /// not look lossier than it is), the fewest `n` with `p^n` under 1 %, so loss alone makes a
    /// wrong verdict rare (at most `maxProbeAttempts`).
    func probesBeforeDead(after sent: Int, atLeast fewest: Int? = nil) -> Int {
        let before = max(probeRecord.sent - sent, 0)
        let answered = min(probeRecord.answered, before)
        let fewest = fewest ?? max(config.probeAttempts, 1)
        guard answered > 0, before > answered else { return fewest }
        let loss = Double(before - answered) / Double(before + 2)
        var n = 1
        var chance = loss
        while chance >= 0.01 && n < config.maxProbeAttempts {
            chance *= loss
            n += 1
        }
        return max(fewest, n)
    }

    /// How long an answer may take on the session's path before its absence means something
    /// (`RTTEstimator.patience`).
    func patience(_ now: Instant) -> Duration { rtt.patience(now, staleAfter: config.rttStaleAfter) }

    /// Data unanswered this long makes the path suspect.
    func livenessWait(_ now: Instant) -> Duration {
        max(config.livenessTimeout, patience(now) * 2) * (1 << quietProofs)
    }

    /// An authenticated answer on the session's keys: the server has the session, whatever a
    /// hint said.
    mutating func noteHeard(_ now: Instant) {
        if session != nil { session?.lastHeard = now }
        if checkingHint {
            checkingHint = false
            disprovedHints += 1
            hintsIgnoredUntil = now + Self.hintHoldDown
        }
    }

    /// One RTT sample of the session's path (`RTTEstimator.sample`).
    mutating func sampleRTT(_ sample: Duration, _ now: Instant, newPath: Bool = false) {
        rtt.sample(sample, now, staleAfter: config.rttStaleAfter, newPath: newPath)
    }
}
