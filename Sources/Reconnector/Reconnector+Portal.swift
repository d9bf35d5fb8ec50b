import Topology
import Basics

/// Captive portals: the connectivity check that finds one, its rechecks, and the window a user logs
/// in through.
extension Reconnector {
    /// Every attempt on `path` went unanswered: one plain HTTP request over it tells a captive
    /// portal (which holds everything back until a user logs in) from an outage. Only on a path
    /// through a default route (a network that claims to reach the internet), one at a time.
    mutating func checkForPortal(on path: Path, _ out: inout [Effect]) {
        guard config.portalCheck, path.prefixLength == 0 else { return }
        checkConnectivity(via: path, &out)
    }

    mutating func checkConnectivity(via path: Path, _ out: inout [Effect]) {
        guard checking == nil else { return }
        checking = path.id
        connectivityChecks += 1
        out.append(.checkConnectivity(via: path))
    }

    mutating func connectivity(_ result: Connectivity, on id: Path.ID, _ now: Instant, _ out: inout [Effect]) {
        if checking == id { checking = nil }
        switch (result, state) {
        case (.portal(let url), .backingOff(let path)) where path.id == id:
            // No attempts until the network changes, an operator acts, or a recheck sees it open:
            // a portal does not open by itself, so handshakes into it only spend the budget.
            rechecks = 0
            // Whatever went unanswered there was the portal's doing, not the network's policy.
            transports.forget(NetworkKey(path))
            enter(.portal(path, url: url), .captivePortal(path.interface, url: url), now, &out)
            arm(.recheck, at: now + recheckWait)
        case (.portal(let url), .portal(let path, let known, _, _)) where path.id == id && url != known:
            enter(.portal(path, url: url), .captivePortal(path.interface, url: url), now, &out)
        case (.online, .portal(let path, _, _, _)) where path.id == id:
            // Logged in: the session comes up at once (a probe if its keys are still fresh).
            startAttempt(on: path, .portalOpened(path.interface), now, &out, handshake: false)
        default:
            // The network reaches the internet and the server is silent (an outage), nothing is
            // known, or the answer is about a path the session left.
            coalesced += 1
        }
    }

    /// Rechecks back off: twice as long each time up to the cap (both doubled on battery); a
    /// portal window, while a user logs in, checks often.
    var recheckWait: Duration {
        if portalWindowUntil != nil { return config.portalWindowRecheck }
        let factor = power == .battery ? 2 : 1
        return min(config.portalRecheckCap * factor, config.portalRecheck * factor * (1 << min(rechecks, 20)))
    }

    mutating func openPortalWindow(_ now: Instant, _ out: inout [Effect]) {
        guard case .portal(let path, let url, _, _) = state, portalWindowUntil == nil else { coalesced += 1; return }
        let until = now + config.portalWindow
        portalWindow = PortalWindow(until: until, recheckBefore: deadlines[.recheck])
        out.append(.openPortalWindow(via: path, portal: url, until: until))
        enter(.portal(path, url: url), .portalWindowOpened(config.portalWindow), now, &out)
        arm(.portalWindow, at: until)
        arm(.recheck, at: now + config.portalWindowRecheck)
    }

    /// The window's process ended: the user may just have logged in, so the network is checked
    /// at once, and the rechecks start over.
    mutating func closePortalWindow(_ now: Instant, _ out: inout [Effect]) {
        guard case .portal(let path, let url, _, _) = state, portalWindowUntil != nil else { coalesced += 1; return }
        portalWindow = nil
        out.append(.closePortalWindow)
        enter(.portal(path, url: url), .portalWindowClosed(why: "its process ended"), now, &out)
        checkConnectivity(via: path, &out)
        rechecks = 0
        arm(.recheck, at: now + recheckWait)
    }

    /// The lockdown did not let the window through: no window stands, nothing is closed, and
    /// the backed-off rechecks go on as before it was asked for (no check at once: nobody
    /// could have logged in through a window that never opened).
    mutating func portalWindowRefused(_ now: Instant, _ out: inout [Effect]) {
        guard case .portal(let path, let url, _, _) = state, portalWindowUntil != nil else { coalesced += 1; return }
        let recheckBefore = portalWindow?.recheckBefore
        portalWindow = nil
        cancel(.portalWindow)
        enter(.portal(path, url: url), .portalWindowClosed(why: "the lockdown did not let it through"), now, &out)
        arm(.recheck, at: max(now, recheckBefore ?? now + recheckWait))
    }
}
