import Topology
import Basics

/// UDP and the stream: which an attempt starts on, the race between them, the UDP re-test, a
/// stream's failure.
extension Reconnector {
    /// Which transport an attempt on `uplink` (its UDP path) starts on, with the reason to log
    /// and whether UDP races the stream:
    /// - the stream off (`Config.stream` nil): UDP, as ever;
    /// - a network known to block UDP (`TransportBook`): the stream at once, even when it
    ///   failed there lately (a reset, a gateway restarting): UDP goes nowhere there, so the
    ///   stream is the only way, and the backoff paces it;
    /// - the stream failed lately elsewhere: UDP alone;
    /// - any other (nothing known, or UDP answered there): UDP first, and the stream over the
    ///   same uplink if UDP has not answered within the race delay (happy eyeballs).
    func transport(for uplink: Path, _ reason: Reason, _ now: Instant) -> (Path, Reason, race: Bool) {
        guard config.stream != nil else { return (uplink, reason, false) }
        if transports[NetworkKey(uplink)] == .blocked, streamNetworks?.contains(NetworkKey(uplink)) ?? true {
            return (uplink.over(.stream), .knownToBlockUDP(uplink.interface, because: reason), false)
        }
        guard !isDead(uplink.id.over(.stream), now) else { return (uplink, reason, false) }
        return (uplink, reason, true)
    }

    /// The stream is on, and UDP went unanswered on `uplink`'s network while the stream answered.
    func knownToBlockUDP(_ uplink: Path, _ now: Instant) -> Bool {
        config.stream != nil && transports[NetworkKey(uplink)] == .blocked && !isDead(uplink.id.over(.stream), now)
    }

    /// How long UDP may go unanswered before the attempt goes to the stream: the policy's
    /// delay, or the path's patience when it is longer (a slow path's answer takes longer), at
    /// most `handshakeResend`, so a blocked network costs under a second before the stream opens.
    func raceDelay(_ now: Instant) -> Duration {
        let least = config.stream?.raceDelay ?? .zero
        return max(least, min(patience(now), config.handshakeResend))
    }

    /// UDP went unanswered for the race delay: the attempt moves to the stream on the same
    /// uplink, a handshake if one was in flight, a probe if the session lives. It is the same
    /// attempt over another transport, yet a move of the socket all the same: it spends a token
    /// (without one, the attempt stays on UDP and its own timeout decides).
    mutating func raceToStream(from path: Path, _ now: Instant, _ out: inout [Effect]) {
        let stream = path.over(.stream)
        guard !isDead(stream.id, now), takeToken(now) else { return }
        let reason = Reason.udpSilent(path.interface, after: now - enteredAt)
        raced = path.id
        moveSocket(to: stream, reason, &out)
        if case .connecting = state {
            // The UDP initiation's late answer no longer counts; the stream's handshake is
            // covered by what is left of the attempt's timeout.
            if deadlines[.resend] != nil { cancel(.resend) }
            out.append(.handshake(on: stream, reason: reason))
            enter(.connecting(stream), reason, now, &out)
        } else {
            probe(stream, now, &out)
            enter(.probing(stream, sent: 1), reason, now, &out)
        }
    }

    /// The re-test is due: a make-before-break probe of UDP over the stream's uplink, within
    /// the budget as any move by choice.
    mutating func retestUDP(from stream: Path, _ now: Instant, _ out: inout [Effect]) {
        guard let udp = paths.first(where: { $0.id == stream.id.over(.udp) }) else { return }
        guard takeToken(now) else {
            let next = nextToken()
            retest?.due = next
            return arm(.udpRetest, at: next)
        }
        probe(udp, now, &out)
        enter(.switching(from: stream, to: udp, sent: 1), .udpRetest(udp.interface), now, &out)
    }

    /// The stream on path `id` could not be opened or broke. A stream that answered since it
    /// was opened broke (a middlebox's reset, a proxy that dropped it): the next attempt opens a
    /// new one at once, within the budget. One that never answered failed to open: a failed
    /// attempt on that path, as a handshake timeout would be, only sooner.
    mutating func streamFailed(on id: Path.ID, why: String, _ now: Instant, _ out: inout [Effect]) {
        guard config.stream != nil, id.transport == .stream else { coalesced += 1; return }
        let broke = streamProven == id
        if broke { streamProven = nil }
        switch state {
        case .connecting(let path, _) where path.id == id:
            failed(on: path, .streamFailed(path.name, why: why), now, &out)
        case .connected(let path, _, _) where path.id == id, .probing(let path, _, _, _, _) where path.id == id,
             .switching(let path, _, _, _) where path.id == id:
            let reason = Reason.streamFailed(path.name, why: why)
            if broke { return attempt(on: path, reason, now, &out) }
            failed(on: path, reason, now, &out)
        case .switching(let from, let to, _, _) where to.id == id:
            markDead(id, now)
            enter(.connected(from), .streamFailed(to.name, why: why), now, &out)
            considerBetterPath(now, &out)
        default:
            coalesced += 1  // a stream the session has left
        }
    }

    /// A stream can open on `networks` now (a proxy's name gave an address there). An attempt
    /// that could not use the stream on a network it now can gets it at once: a backoff on that
    /// uplink ends with an attempt (within the budget), and an attempt over its UDP races the
    /// stream from now on, as if it had from the start.
    mutating func streamNetworksChanged(_ networks: Set<NetworkKey>, _ now: Instant, _ out: inout [Effect]) {
        let before = streamNetworks
        streamNetworks = networks
        guard config.stream != nil, let uplink = state.path?.over(.udp),
              let udp = paths.first(where: { $0.id == uplink.id }), networks.contains(NetworkKey(udp)),
              !(before?.contains(NetworkKey(udp)) ?? true) else { return coalesced += 1 }
        switch state {
        case .backingOff:
            guard takeToken(now) else { return coalesced += 1 }
            budget.forgetWait()
            startAttempt(on: udp, .proxyFound(udp.interface), now, &out, handshake: false)
        case .connecting(let path, _) where path.transport == .udp && raced == nil && deadlines[.race] == nil:
            arm(.race, at: max(now, enteredAt + raceDelay(now)))
        default:
            coalesced += 1
        }
    }

    /// The other transport over `path`'s uplink to fall back on, when the stream is on: the
    /// stream for a UDP path, unless it failed lately; UDP for a stream path, unless UDP went
    /// unanswered in this very attempt or the network is known to block it (a failed stream
    /// there backs off: trying again at once would only fail again).
    func otherTransport(of path: Path, _ now: Instant) -> Path? {
        guard config.stream != nil else { return nil }
        let twin = path.over(path.transport == .udp ? .stream : .udp)
        guard !isDead(twin.id, now), twin.id != raced else { return nil }
        if twin.transport == .udp, transports[NetworkKey(path)] == .blocked { return nil }
        if twin.transport == .udp, !paths.contains(where: { $0.id == twin.id }) { return nil }
        return twin
    }

    /// Connected on `path`: what it shows of UDP on its network is remembered, and on the
    /// stream the next UDP re-test is scheduled (kept across the probing a silence brings, so a
    /// lossy stream does not put it off for ever).
    mutating func connectedOn(_ path: Path, _ now: Instant, _ out: inout [Effect]) {
        guard config.stream != nil else { return }
        let key = NetworkKey(path)
        switch path.transport {
        case .udp:
            transports.learn(.answers, for: key)
            retest = nil
        case .stream:
            if raced == path.id.over(.udp) { transports.learn(.blocked, for: key) }
            streamProven = path.id
            let udp = path.id.over(.udp)
            if retest?.udp != udp { retest = (udp, now + config.udpRetest(after: 0, on: power), 0) }
            if let due = retest?.due { arm(.udpRetest, at: max(due, now)) }
        }
        raced = nil
    }

    /// True when moving from `from` to `to` is the UDP re-test: from the stream to UDP over
    /// the same uplink and source.
    static func isUDPRetest(from: Path, to: Path) -> Bool {
        from.transport == .stream && to.id == from.id.over(.udp)
    }
}
