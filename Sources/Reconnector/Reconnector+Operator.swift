import Topology
import Basics

/// The machine's sleep and power, and an operator's requests.
extension Reconnector {
    mutating func sleep(_ now: Instant, _ out: inout [Effect]) {
        asleep = true
        switch state {
        case .disconnected(_, _?, _):
            // The machine may wake on another network: the lift does not outlive the sleep.
            return restoreLift(.goingToSleep, now, &out)
        case .sleeping, .paused, .disconnected: return  // there is nothing to quiesce, and no session to keep
        default: break
        }
        stateBeforeSleep = state
        enter(.sleeping, .goingToSleep, now, &out)
    }

    mutating func wake(after slept: Duration, _ now: Instant, _ out: inout [Effect]) {
        asleep = false
        switch state {
        case .paused, .disconnected: coalesced += 1; return  // the operator or the rules bring it up, not a wake
        default: break
        }
        let before: State
        if case .sleeping = state { before = stateBeforeSleep } else { before = state }
        if case .failed(let why) = before { return enter(.failed(why), .wokeAfter(slept), now, &out) }
        // After a long sleep the networks may all be different, whatever their addresses: old
        // verdicts about paths no longer hold. After a short one, a path whose link and address
        // stayed is most likely the same network, and a dead uplink is still dead.
        // Nothing was learnt while asleep, so a kept verdict's hold-down does not run out in it.
        if slept >= config.shortSleep {
            dead.removeAll()
        } else {
            dead.shift(by: slept)
        }
        candidate = nil
        guard let best = preferred(now) else { return enter(.offline, .wokeAfter(slept), now, &out) }
        // Awake on a network the rules keep the tunnel off, or are still looking at.
        if let verdict = onDemand, verdict.action == .disconnect, verdict.path == best.id {
            return disconnect(verdict, now, &out, from: .wokeAfter(slept))
        }
        if let wait = rulesWait {
            session = nil
            enter(.disconnected(rule: wait.rule, lifted: nil), .onDemandWaits(wait.rule, for: wait.wanted), now, &out)
            if socket != nil { goodbye(&out) }
            return
        }
        if isSessionFresh(now), let socket, !unbound, best.id == socket.over(.udp) {
            // Short sleep on the same network: one probe tells whether anything changed (over
            // the transport the session was on).
            let path = best.over(socket.transport)
            probe(path, now, &out)
            return enter(.probing(path, sent: 1), .wokeAfter(slept), now, &out)
        }
        attempt(on: best, .wokeAfter(slept), now, &out)
    }

    mutating func powerChanged(_ source: PowerSource, _ now: Instant, _ out: inout [Effect]) {
        budget.change(from: inForce, to: config.budget(on: source), now)
        power = source
        // A wait drawn under battery's long backoff has lost its reason once on mains: draw
        // it again under the budget now in force, if that is sooner.
        guard case .backingOff = state, let due = deadlines[.retry] else { return }
        let wait = backoffWait(now)
        if now + wait < due { arm(.retry, at: now + wait) }
    }

    mutating func reconnectRequested(_ now: Instant, _ out: inout [Effect]) {
        switch state {
        case .sleeping, .paused, .disconnected: return  // down stays down until `agent up`, or the rules change
        case .connecting: coalesced += 1; return  // the fresh handshake asked for is already in flight
        default: break
        }
        budget.forgetFailures()
        guard let best = preferred(now) else { return enter(.offline, .operatorRequest, now, &out) }
        // An operator's explicit request is not a storm: it bypasses the budget.
        session = nil
        startAttempt(on: best, .operatorRequest, now, &out, handshake: true)
    }

    /// The operator takes the tunnel down without stopping the agent, as a paused always-on VPN
    /// is: the session ends with a goodbye, every timer stops, and nothing is tried until they
    /// bring it up again. The tunnel device and the lockdown stay, so nothing leaves in clear.
    mutating func pause(_ now: Instant, _ out: inout [Effect]) {
        if case .paused = state { coalesced += 1; return }
        session = nil
        if case .disconnected(_, _?, _) = state { out.append(.restoreLockdown) }
        enter(.paused, .operatorDown, now, &out)
        goodbye(&out)
    }

    /// The operator brings the tunnel up again: fresh keys on the best path at once. Like any
    /// operator's request it bypasses the budget, and it forgets earlier failures.
    mutating func resume(_ now: Instant, _ out: inout [Effect]) {
        guard case .paused = state else { coalesced += 1; return }
        budget.resetBackoff()
        if asleep {
            // Up again while the machine sleeps: the attempt waits for the wake.
            stateBeforeSleep = .offline
            return enter(.sleeping, .operatorUp, now, &out)
        }
        guard let best = preferred(now) else { return enter(.offline, .operatorUp, now, &out) }
        if let verdict = onDemand, verdict.action == .disconnect, verdict.path == best.id {
            // Up again on a network the rules keep the tunnel off: as they said.
            return disconnect(verdict, now, &out, from: .operatorUp)
        }
        startAttempt(on: best, .operatorUp, now, &out, handshake: true)
    }
}
