import Topology
import Basics

/// What the on-demand rules decide for the network the session is on.
extension Reconnector {
    /// What the rules decided for the best path's network. `connect` brings a tunnel they kept
    /// down up at once; `disconnect` ends the session with a goodbye and tries nothing while
    /// they hold (lifting the lockdown for that network only if the rule says so); `ignore`
    /// keeps what is. While they wait for a fact, a lifted lockdown is put back.
    mutating func onDemand(_ decision: OnDemandDecision, _ now: Instant, _ out: inout [Effect]) {
        if case .waiting(let rule, let wanted, _) = decision {
            // What was decided is about a network the rules are looking at again.
            onDemand = nil
            rulesWait = (rule, wanted.map(\.description), decision.path)
            switch state {
            case .disconnected(_, _?, _):
                restoreLift(.lockdownRestored("the rules look at the network"), now, &out)
            case .offline:
                // Nothing tried yet: nothing is, until the rules know whether this network is trusted
                // (a session that works meanwhile keeps working).
                enter(.disconnected(rule: rule, lifted: nil), .onDemandWaits(rule, for: wanted.map(\.description)), now, &out)
            default:
                coalesced += 1
            }
            return
        }
        guard case .decided(let verdict) = decision else { return }
        let waited = rulesWait != nil
        rulesWait = nil
        onDemand = verdict
        // A better path held back while the rules looked at its network is one again.
        if waited, case .connected = state { considerBetterPath(now, &out) }
        switch state {
        case .paused, .failed, .sleeping:
            // The operator's word (or a rejection) stands; a wake brings the rules' word anew.
            coalesced += 1
            return
        default: break
        }
        // Held only for the rules to look: anything but disconnect means the tunnel is wanted.
        let action = heldForRules && verdict.action == .ignore ? .connect : verdict.action
        switch action {
        case .connect:
            guard case .disconnected(_, let lifted, _) = state else { coalesced += 1; return }
            guard let best = preferred(now), best.id == verdict.path else {
                // The paths that show this network come next, and the attempt with them; the
                // lockdown is whole meanwhile.
                guard lifted != nil else { coalesced += 1; return }
                return restoreLift(.lockdownRestored("left the network"), now, &out)
            }
            if lifted != nil { out.append(.restoreLockdown) }
            budget.forgetFailures()
            attempt(on: best, .onDemand(verdict), now, &out, handshake: true)
        case .disconnect:
            disconnect(verdict, now, &out, from: .onDemand(verdict))
        case .ignore:
            // Keep what is, but a lifted lockdown was the lifting rule's, not this one's.
            guard case .disconnected(_, _?, _) = state else { coalesced += 1; return }
            restoreLift(.onDemand(verdict), now, &out)
        }
    }

    /// The lockdown a rule lifted is whole again; the tunnel stays down as that rule said.
    mutating func restoreLift(_ reason: Reason, _ now: Instant, _ out: inout [Effect]) {
        guard case .disconnected(let rule, _?, _) = state else { return }
        out.append(.restoreLockdown)
        enter(.disconnected(rule: rule, lifted: nil), reason, now, &out)
    }

    /// Ends the session (with a goodbye, if there is one) as `verdict` says and keeps the
    /// tunnel down; the lockdown steps aside only if the rule lifts it.
    mutating func disconnect(_ verdict: OnDemandVerdict, _ now: Instant, _ out: inout [Effect], from reason: Reason) {
        let lift = verdict.liftsLockdown ? verdict.path : nil
        if case .disconnected(let rule, let lifted, _) = state {
            // Kept down already: a transition still names the rule that decides now, and ends a
            // hold that was only for the rules to look.
            guard lifted != lift || rule != verdict.rule || heldForRules else { coalesced += 1; return }
            if lifted != nil { out.append(.restoreLockdown) }
            if lift != nil { out.append(.liftLockdown(interface: verdict.interface)) }
            return enter(.disconnected(rule: verdict.rule, lifted: lift), reason, now, &out)
        }
        session = nil
        enter(.disconnected(rule: verdict.rule, lifted: lift), reason, now, &out)
        if socket != nil { goodbye(&out) }  // a session, or one on its way: a goodbye
        if lift != nil { out.append(.liftLockdown(interface: verdict.interface)) }
    }
}
