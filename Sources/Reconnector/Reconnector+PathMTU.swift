import Topology
import Basics

/// The path MTU search on the session's path, and a path too small for the tunnel.
extension Reconnector {
    /// Replaces a finished search on `id` with one look at the MTU in use (one padded probe,
    /// whose failure alone starts a whole search), unless one was made within `mtuVerifyEvery`:
    /// on a lossy path the silences that ask for it come often. The look goes out once the
    /// session is connected again.
    mutating func prepareLookAtMTU(on id: Path.ID, _ now: Instant) {
        guard let search = mtu, search.path == id, search.search.isDone, !tooSmall.contains(id),
              mtuVerifiedAt.map({ now - $0 >= Self.mtuVerifyEvery }) ?? true else { return }
        mtuVerifiedAt = now
        mtu = (id, .verify(floor: floorMTU, ceiling: config.maxMTU, current: tunnelMTU, tooBig: search.search.tooBig),
               nil, nil)
    }

    /// The echo of a probe padded to `size`.
    mutating func sizeProbeReply(on id: Path.ID, size: Int, rtt: Duration, _ now: Instant, _ out: inout [Effect]) {
        if case .switching(_, let to, _, _) = state, to.id == id, tooSmall.contains(id) {
            // A path found too small carries the smallest tunnel packet again: a candidate like any.
            guard size >= floorMTU else { return noteHeard(now) }
            tooSmall.remove(id)
            return probeReply(on: id, rtt: rtt, now, &out)
        }
        noteHeard(now)
        if size >= floorMTU { tooSmall.remove(id) }
        guard var current = mtu, current.path == id, case .connected(let path, _, _) = state, path.id == id else { return }
        current.search.answered(size)
        let roundOver = !current.search.inFlight.isEmpty
            && current.search.inFlight.allSatisfy { $0 <= (current.search.confirmed ?? 0) }
        mtu = current
        // Mid-search the MTU changes only at a round's end (each change disturbs TCP's flows).
        if current.search.isDone { applyPathMTU(on: path, now, &out) }
        // Every size of the round came back: the next round need not wait out the probe wait.
        if roundOver, deadlines[.pathMTU] != nil, !current.search.isDone {
            pathMTUTimer(on: path, now, &out, force: true)
        } else if current.search.isDone, current.roundStart != nil {
            finishPathMTU(on: path, now, &out)
        }
    }

    /// The session is connected on `path`: the path's MTU search starts (a new path), goes on
    /// (it was paused while the session was not connected), or waits for its next look upward.
    mutating func continuePathMTU(on path: Path, _ now: Instant, _ out: inout [Effect]) {
        // A stream carries tunnel packets of any size (TCP cuts them): nothing to search for.
        guard config.pathMTUDiscovery, sizedProbes, floorMTU < config.maxMTU, path.transport == .udp else { return }
        if mtu?.path != path.id {
            mtu = (path.id, PathMTUSearch(floor: floorMTU, ceiling: config.maxMTU), nil, nil)
        }
        guard let current = mtu else { return }
        if current.search.isDone {
            // The look for a bigger MTU, when it is due; at once if it fell due meanwhile.
            if let raise = current.raiseAt { arm(.pathMTU, at: max(raise, now)) }
        } else {
            startPathMTURound(on: path, now, &out)
        }
    }

    /// The round's wait is over (or every echo of it came back, `force`), or it is time to look
    /// for a bigger MTU.
    mutating func pathMTUTimer(on path: Path, _ now: Instant, _ out: inout [Effect], force: Bool = false) {
        guard var current = mtu, current.path == path.id else { return continuePathMTU(on: path, now, &out) }
        if current.search.isDone {
            // Time to see whether the path grew: the ceiling is asked again, and what is known
            // stands if it still fails.
            let known = current.search.tooBig ?? tunnelMTU + PathMTUSearch.granularity
            mtu = (path.id, .raise(floor: floorMTU, ceiling: config.maxMTU, current: tunnelMTU, tooBig: known), nil, nil)
            return startPathMTURound(on: path, now, &out)
        }
        let heard = current.roundStart.flatMap { start in session.map { $0.lastHeard >= start } } ?? false
        // A size is too big after as many unanswered rounds as the path's loss calls for before
        // it is dead, and at least three (as RFC 8899's MAX_PROBES): one lost probe is no verdict.
        current.search.endRound(heard: force || heard, misses: probesBeforeDead(after: 0, atLeast: 3))
        current.roundStart = nil
        mtu = current
        if current.search.isTooSmall { return pathTooSmall(path, now, &out) }
        applyPathMTU(on: path, now, &out)
        if current.search.isDone { return finishPathMTU(on: path, now, &out) }
        if current.search.silentRounds >= 3 {
            // Nothing heard for three rounds: the path's liveness rules deal with that; the
            // search looks again later.
            mtu?.raiseAt = now + config.mtuRaiseAfter
            mtu?.search = .raise(floor: floorMTU, ceiling: config.maxMTU, current: tunnelMTU, tooBig: current.search.tooBig)
            return arm(.pathMTU, at: now + config.mtuRaiseAfter)
        }
        startPathMTURound(on: path, now, &out)
    }

    /// Sends a round of size probes on the session's path, and a small probe with them when the
    /// server has not been heard lately: its echo tells a lost size from a silent path.
    mutating func startPathMTURound(on path: Path, _ now: Instant, _ out: inout [Effect]) {
        guard var current = mtu else { return }
        let sizes = current.search.startRound()
        guard !sizes.isEmpty else { return finishPathMTU(on: path, now, &out) }
        let wait = max(config.probeTimeout, patience(now))
        for size in sizes { sendSizeProbe(size, via: path, &out) }
        if let session, now - session.lastHeard >= wait { sendProbe(via: path, &out) }
        current.roundStart = now
        mtu = current
        arm(.pathMTU, at: now + wait)
    }

    /// The search is over: the next look for a bigger MTU, if the path is smaller than the tunnel's.
    mutating func finishPathMTU(on path: Path, _ now: Instant, _ out: inout [Effect]) {
        mtu?.roundStart = nil
        if tunnelMTU < config.maxMTU {
            let raise = now + config.mtuRaiseAfter
            mtu?.raiseAt = raise
            arm(.pathMTU, at: raise)
        } else {
            mtu?.raiseAt = nil
            if deadlines[.pathMTU] != nil { cancel(.pathMTU) }
        }
    }

    /// Sets the tunnel's MTU to what the search found, when it found something: lower as soon
    /// as a size failed (full packets are lost meanwhile), higher once the search is over.
    mutating func applyPathMTU(on path: Path, _ now: Instant, _ out: inout [Effect]) {
        guard let search = mtu?.search, let found = search.found, found != tunnelMTU, found < tunnelMTU || search.isDone
        else { return }
        tunnelMTU = found
        out.append(.setTunnelMTU(found))
    }

    /// The path carries small probes but not the smallest tunnel packet: it is broken for the
    /// tunnel. Another path takes the session if there is one; else the tunnel stays at its
    /// smallest MTU here and looks again later.
    mutating func pathTooSmall(_ path: Path, _ now: Instant, _ out: inout [Effect]) {
        if tunnelMTU != floorMTU {
            tunnelMTU = floorMTU
            out.append(.setTunnelMTU(floorMTU))
        }
        let reason = Reason.pathTooSmall(path.interface, mtu: floorMTU)
        tooSmall.insert(path.id)
        if let other = paths.first(where: { $0.id != path.id && !isDead($0.id, now) }) {
            mtu = nil
            markDead(path.id, now)
            return attempt(on: other, reason, now, &out)
        }
        // The finished search stays: a return to connected (a silence a small probe ended) waits
        // for the look upward, which asks the smallest size again.
        mtu?.raiseAt = now + config.mtuRaiseAfter
        arm(.pathMTU, at: now + config.mtuRaiseAfter)
        out.append(.reportFailure(reason))
    }
}
