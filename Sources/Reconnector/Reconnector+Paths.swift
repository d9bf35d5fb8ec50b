import Topology
public import Basics

/// The paths to the server: which one the session should be on, and when a better one is tried.
extension Reconnector {
    mutating func pathsChanged(_ new: [Path], _ now: Instant, _ out: inout [Effect]) {
        // A link's loss counts for flap damping; a change of its address does not.
        for old in paths where !new.contains(where: { $0.linkIndex == old.linkIndex }) { noteLoss(of: old, now) }
        paths = new
        dead.keep { id in new.contains { $0.id == id.over(.udp) } }
        if let other = rescue, !new.contains(where: { $0.id == other.path }) { rescue = nil }
        switch state {
        case .sleeping, .failed, .paused:
            coalesced += 1
        case .disconnected(_, let lifted, _):
            // A lifted lockdown belongs to the network it was lifted for: leaving it puts it back
            // at once, before the rules have looked at the next one.
            let best = preferred(now)
            if let lifted, best?.id != lifted { restoreLift(.lockdownRestored("left the network"), now, &out) }
            // The rules said connect for the network these paths now show.
            if let best, let verdict = onDemand, verdict.action == .connect || (heldForRules && verdict.action == .ignore),
               verdict.path == best.id {
                budget.forgetFailures()
                return attempt(on: best, .onDemand(verdict), now, &out, handshake: true)
            }
            coalesced += 1
        case .offline:
            guard let best = preferred(now) else { return }
            // Back from no path at all with the session alive (a Wi-Fi roam's carrier gap, a
            // cable replugged): the network took the path away, nobody chose to move, so proving
            // the session again with a probe spends no token. A flapping link's returns do.
            if isSessionFresh(now), !isFlapping(best.interface, now) {
                return startAttempt(on: best, .pathAppeared(best.interface), now, &out, handshake: false)
            }
            attempt(on: best, .pathAppeared(best.interface), now, &out)
        case .portal(let path, let url, _, _):
            // Behind the portal nothing is tried until the network changes: another path, or
            // another address on this one (a new lease is a new chance too).
            guard let best = preferred(now) else { return enter(.offline, .pathLost(path.interface), now, &out) }
            guard best.id != path.id || best.gateway == path.gateway else {
                // The same address behind another gateway: another network that gave the same lease.
                return attempt(on: best, .pathAppeared(best.interface), now, &out)
            }
            guard best.id != path.id else {
                stay(.portal(best, url: url))
                coalesced += 1
                return
            }
            let stays = new.contains { $0.id == path.id }
            attempt(on: best, stays ? .betterPath(best, over: path) : reasonForLeaving(path, to: best), now, &out)
        case .backingOff(let path):
            guard let best = preferred(now) else { return enter(.offline, .pathLost(path.interface), now, &out) }
            if best.id != path.id {
                // A different path is a new chance, not a retry of what failed: no backoff wait,
                // and no handshake while the session lives.
                attempt(on: best, reasonForLeaving(path, to: best), now, &out)
            } else {
                stay(.backingOff(best))
                coalesced += 1
            }
        case .connecting(let current, _), .connected(let current, _, _), .probing(let current, _, _, _, _),
             .switching(let current, _, _, _):
            guard let best = preferred(now) else { return enter(.offline, .pathLost(current.interface), now, &out) }
            guard let same = Self.refreshed(current, in: new) ?? Self.stillValid(current, in: new) else {
                if let wait = rulesWait, wait.path == best.id {
                    // Left for a network the rules are still looking at: nothing is tried there
                    // until they know whether it is trusted.
                    session = nil
                    enter(.disconnected(rule: wait.rule, lifted: nil), .onDemandWaits(wait.rule, for: wait.wanted), now, &out)
                    if socket != nil { goodbye(&out) }
                    return
                }
                // The session's path is gone and another exists: act at once. With the session
                // alive the move is a rebind and a probe, and staying is no option, so it spends
                // no token: the budget bounds handshakes and moves by choice (returns to a better
                // path, which flap damping also holds back), not the way off a path that is gone.
                if !isHandshaking && isSessionFresh(now) {
                    return startAttempt(on: best, reasonForLeaving(current, to: best), now, &out, handshake: false)
                }
                return attempt(on: best, reasonForLeaving(current, to: best), now, &out,
                               handshake: isHandshaking)
            }
            switch state {
            case .connecting: stay(.connecting(same)); coalesced += 1
            case .probing(_, let sent, _, _, _): stay(.probing(same, sent: sent)); coalesced += 1
            case .switching(_, let to, let sent, _):
                if let target = Self.refreshed(to, in: new) {
                    stay(.switching(from: same, to: target, sent: sent))
                    coalesced += 1
                } else {
                    enter(.connected(same), .candidateLost(to.interface), now, &out)
                    considerBetterPath(now, &out)
                }
            default:
                stay(.connected(same))
                considerBetterPath(now, &out)
            }
        }
    }

    /// The session's path when its address is still valid on its link although the link now
    /// prefers another (an IPv6 prefix being deprecated, a temporary address rotating): the
    /// session stays on it while the preference settles, then moves make-before-break.
    static func stillValid(_ current: Path, in new: [Path]) -> Path? {
        guard var same = new.first(where: { $0.linkIndex == current.linkIndex }),
              same.otherSources.contains(current.source) else { return nil }
        same.otherSources = same.otherSources.filter { $0 != current.source } + [same.source]
        same.source = current.source
        same.transport = current.transport
        return same
    }

    /// True when the session should move from `current` to `path`: the kernel would prefer its
    /// route, or it is the address its link prefers now.
    static func isPreferred(_ path: Path, over current: Path) -> Bool {
        path.ranks(above: current) || (path.linkIndex == current.linkIndex && path.source != current.source)
    }

    /// `path` as `new` shows it now (its route's metric and gateway), over the same transport.
    static func refreshed(_ path: Path, in new: [Path]) -> Path? {
        new.first { $0.id == path.id.over(.udp) }.map { $0.over(path.transport) }
    }

    /// The best path with no verdict against it; else the best whose hold-down ran out (it has
    /// not answered since it failed: it is re-checked with a probe once the session works
    /// elsewhere, see `considerBetterPath`); the best of all if every one is held down.
    func preferred(_ now: Instant) -> Path? {
        paths.first { dead[$0.id] == nil } ?? paths.first { !isDead($0.id, now) } ?? paths.first
    }

    func reasonForLeaving(_ old: Path, to new: Path) -> Reason {
        old.linkIndex == new.linkIndex && old.source != new.source
            ? .addressChanged(old.interface, from: old.source, to: new.source)
            : .pathLost(old.interface)
    }

    /// Starts or keeps the debounce for a path that ranks above the current one.
    mutating func considerBetterPath(_ now: Instant, _ out: inout [Effect]) {
        guard case .connected(let current, _, _) = state,
              let better = paths.first(where: { $0.id != current.id && $0.id != rulesWait?.path && Self.isPreferred($0, over: current) })
        else {
            candidate = nil
            if deadlines[.debounce] != nil { cancel(.debounce) }
            return
        }
        if candidate == better.id, deadlines[.debounce] != nil {
            coalesced += 1
            return
        }
        candidate = better.id
        let quietUntil = now + holdDown(for: better, now)
        let due = dead[better.id].map { max($0.until, quietUntil) } ?? quietUntil
        arm(.debounce, at: due)
    }

    /// The debounce for a new path; for an interface lost recently the flap hold-down, doubled
    /// for every further recent loss: a flapping uplink must stay up longer before the session
    /// trusts it again.
    /// It never exceeds `flapStableAfter`: by then the interface counts as stable again.
    func holdDown(for path: Path, _ now: Instant) -> Duration {
        guard let loss = flaps.recent(path.interface, now, window: config.flapWindow) else { return config.debounce }
        let damped = min(config.flapStableAfter, config.flapHoldDown * (1 << min(loss.count - 1, 20)))
        return max(config.debounce, damped)
    }

    /// Counts a path's disappearance against its interface, whether or not the session used it.
    mutating func noteLoss(of path: Path, _ now: Instant) {
        flaps.noteLoss(of: path.interface, now, window: config.flapWindow)
    }

    /// The interface's losses when the flap damping counts it as flapping now (`isFlapping`):
    /// how many, since when. What the operator is told of a flap is decided by the same rule.
    public func flapping(_ interface: String, _ now: Instant) -> (losses: Int, since: Instant)? {
        flaps.flapping(interface, now, window: config.flapWindow, stableAfter: config.flapStableAfter)
    }

    /// The link flaps (`FlapRecord.isFlapping`, under `flapWindow` and `flapStableAfter`).
    func isFlapping(_ interface: String, _ now: Instant) -> Bool {
        flaps.isFlapping(interface, now, window: config.flapWindow, stableAfter: config.flapStableAfter)
    }

    func isDead(_ id: Path.ID, _ now: Instant) -> Bool {
        if id.transport == .stream, let networks = streamNetworks,
           !paths.contains(where: { $0.id == id.over(.udp) && networks.contains(NetworkKey($0)) }) {
            return true  // no stream opens on that network
        }
        return dead.isHeld(id, now)
    }

    mutating func markDead(_ id: Path.ID, _ now: Instant) {
        dead.strike(id, now, base: config.deadPathHoldDown, cap: config.maxHoldDown)
    }
}
