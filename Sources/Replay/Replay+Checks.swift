import Basics
import Reconnector

/// What every replay checks: the budget, the invariants after each event, the expectations at the end.
extension Replay {
    // MARK: Checks

    /// No window of the timeline may hold more attempts than the token bucket allows.
    mutating func checkBudget() {
        let log = attemptLog.filter(\.budgeted)
        for j in log.indices {
            var sawAC = false
            var i = j
            while i > 0 && j - i < 400 {
                i -= 1
                if log[i + 1].power == .ac || log[i].power == .ac { sawAC = true }
                let budget = reconnector.config.budget(on: sawAC ? .ac : .battery)
                let span = (log[j].at - log[i].at).nanoseconds
                let allowed = budget.burst + Int(span / budget.refill.nanoseconds)
                if j - i + 1 > allowed {
                    violation("\(j - i + 1) attempts between \(log[i].at)s and \(log[j].at)s exceed the budget of \(allowed)")
                    return
                }
            }
        }
    }

    /// How long the machine was connected through `interface`, from its transitions.
    func timeConnected(on interface: String) -> Duration {
        var total = Duration.zero
        for (i, t) in report.transitions.enumerated() {
            guard case .connected(let path, _, _) = t.to, path.name == interface else { continue }
            let end = i + 1 < report.transitions.count ? report.transitions[i + 1].at : now
            total += end - t.at
        }
        return total
    }

    /// Whether a transition is what `state` or `state:reasonPrefix` names.
    static func matches(_ t: Transition, _ pattern: String) -> Bool {
        let parts = pattern.split(separator: ":", maxSplits: 1)
        return t.to.name == parts[0] && (parts.count == 1 || t.reason.description.hasPrefix(parts[1]))
    }

    mutating func checkExpectations() {
        let e = scenario.expect
        var failures: [String] = []
        func expect(_ ok: Bool, _ message: @autoclosure () -> String) { if !ok { failures.append(message()) } }
        if let state = e.state { expect(reconnector.state.name == state, "final state: expected \(state), got \(reconnector.state.name)") }
        if let path = e.path {
            let actual = reconnector.state.path?.name ?? "none"
            expect(actual == path, "final path: expected \(path), got \(actual)")
        }
        if let lifted = e.lockdownLifted {
            expect(lifted == lockdownLifted, "lockdown: expected it \(lifted ? "lifted" : "whole") at the end, it was \(lockdownLifted ? "lifted" : "whole")")
        }
        if let opened = e.machineOpened {
            if let actual = report.stopped?.opensMachine {
                expect(opened == actual, "the stop was to \(opened ? "open" : "keep") the lockdown; it \(actual ? "opened the machine" : "kept it")")
            } else {
                failures.append("the stop was to \(opened ? "open" : "keep") the lockdown; no stop was decided")
            }
        }
        switch (e.givesUp, report.gaveUp) {
        case (.never?, let gaveUp?): failures.append("the agent gave up at \(gaveUp.at)s: \(gaveUp.why)")
        case (.within?, nil): failures.append("the agent was to give up; it kept trying")
        case (.within(let from, let to)?, let gaveUp?):
            expect(gaveUp.at >= from && gaveUp.at <= to, "gave up at \(gaveUp.at)s, expected within \(from)s...\(to)s")
        case (.never?, nil), (nil, _): break
        }
        if let server = e.server {
            let actual = scenario.gateways[reconnector.server]
            expect(actual == server, "final server: expected \(server), got \(actual)")
        }
        if let address = e.serverAddress {
            expect(core.serverAddress == address, "final server address: expected \(address), got \(core.serverAddress)")
        }
        // Counts: what was counted, its bounds, and how many there were.
        let counts: [(String, Int?, Int?, Int)] = [
            ("attempts", e.minAttempts, e.maxAttempts, report.attempts),
            ("handshakes", e.minHandshakes, e.maxHandshakes, report.handshakes),
            ("connectivity checks", e.minChecks, e.maxChecks, report.checks),
            ("probes", e.minProbes, e.maxProbes, report.probes),
            ("resent handshakes", e.minResends, e.maxResends, report.resends),
            ("size probes", e.minSizeProbes, e.maxSizeProbes, report.sizeProbes),
            ("persistent keepalives", e.minKeepalives, e.maxKeepalives, report.keepalives),
            ("restores", e.minRestores, e.maxRestores, report.restores),
            ("exclusions granted", e.excluded, e.excluded, report.excluded),
            ("exclusions refused", e.exclusionsRefused, e.exclusionsRefused, report.exclusionsRefused),
            ("portal windows not needed", e.portalWindowsNotNeeded, e.portalWindowsNotNeeded, report.portalWindowsNotNeeded),
            ("portal windows failed", e.portalWindowsFailed, e.portalWindowsFailed, report.portalWindowsFailed),
            ("restarts in place", e.restartsInPlace, e.restartsInPlace, report.restartsInPlace),
            ("proxy addresses allowed", e.proxiesAllowed, e.proxiesAllowed, report.proxiesAllowed),
            ("proxy addresses refused", e.proxiesRefused, e.proxiesRefused, report.proxiesRefused),
            ("unusable server names", e.serverNamesUnusable, e.serverNamesUnusable, report.serverNamesUnusable),
            ("servers inside the routes at start", e.serversCarried, e.serversCarried, report.serversCarried),
            ("watchdog pings", e.watchdogPings, e.watchdogPings, report.watchdogPings),
            ("requests for more time to start", e.startExtensions, e.startExtensions, report.startExtensions),
            ("metrics file writes", e.metricsWrites, e.metricsWrites, report.metricsWrites.count),
            ("resolver decisions", e.resolverDecisions, e.resolverDecisions, report.resolvers.count),
            ("held fights", e.minHolds, e.maxHolds, report.holds),
        ]
        for (what, min, max, n) in counts {
            if let max { expect(n <= max, "\(what): expected at most \(max), got \(n)") }
            if let min { expect(n >= min, "\(what): expected at least \(min), got \(n)") }
        }
        for (at, use, inClear) in e.resolversAt {
            let decision = report.resolvers.last { $0.at <= at }?.decision
            let given = (decision?.use?.resolvers ?? [], decision?.inClear ?? [])
            expect(given.0 == use && given.1 == inClear,
                   "resolvers at \(at)s: expected \(use) (in clear \(inClear)), got \(given.0) (in clear \(given.1))")
        }
        if let max = e.maxOutage {
            expect(report.maxOutage <= max, "outage: expected at most \(max.short), got \(report.maxOutage.short)")
        }
        if let max = e.maxMissing {
            expect(report.maxMissing <= max, "missing: expected at most \(max.short), got \(report.maxMissing.short)")
        }
        var remaining = e.sequence[...]
        for t in report.transitions {
            guard let want = remaining.first else { break }
            if Self.matches(t, want) { remaining.removeFirst() }
        }
        if let missing = remaining.first {
            failures.append("sequence: never saw '\(missing)'; transitions were "
                + report.transitions.map { "\($0.to.name):\($0.reason)" }.joined(separator: ", "))
        }
        for never in e.never {
            if let t = report.transitions.first(where: { Self.matches($0, never) }) {
                failures.append("entered \(t.to.name) at \(t.at)s (\(t.reason)), which '\(never)' forbids")
            }
        }
        if let max = e.maxCPU {
            expect(report.cpuTime <= max, "replay CPU time: expected at most \(max.short), got \(report.cpuTime.short)")
        }
        for w in e.windows {
            let n = attemptLog.filter { $0.at >= w.from && $0.at <= w.to }.count
            if let max = w.maxAttempts { expect(n <= max, "attempts in \(w.from)s...\(w.to)s: expected at most \(max), got \(n)") }
            if let min = w.minAttempts { expect(n >= min, "attempts in \(w.from)s...\(w.to)s: expected at least \(min), got \(n)") }
            func count(_ times: [Instant]) -> Int { times.filter { $0 >= w.from && $0 <= w.to }.count }
            if let max = w.maxHandshakes {
                let n = count(handshakeTimes)
                expect(n <= max, "handshakes in \(w.from)s...\(w.to)s: expected at most \(max), got \(n)")
            }
            if let max = w.maxProbes {
                let n = count(probeTimes)
                expect(n <= max, "probes in \(w.from)s...\(w.to)s: expected at most \(max), got \(n)")
            }
            if let max = w.maxChecks {
                let n = count(checkTimes)
                expect(n <= max, "connectivity checks in \(w.from)s...\(w.to)s: expected at most \(max), got \(n)")
            }
            if let max = w.maxTransitions {
                let n = count(report.transitions.map(\.at))
                expect(n <= max, "transitions in \(w.from)s...\(w.to)s: expected at most \(max), got \(n)")
            }
        }
        if let mtu = e.tunnelMTU { expect(report.tunnelMTU == mtu, "tunnel MTU at the end: expected \(mtu), got \(report.tunnelMTU)") }
        if let max = e.maxLostFromServer {
            expect(report.lostFromServer <= max, "packets the server started that never arrived: expected at most \(max), got \(report.lostFromServer) of \(report.fromServer)")
        }
        if let min = e.minFromServer {
            let arrived = report.fromServer - report.lostFromServer
            expect(arrived >= min, "packets the server started that arrived: expected at least \(min), got \(arrived) of \(report.fromServer)")
        }
        for entry in e.timeOn {
            let spent = timeConnected(on: entry.path)
            if let min = entry.min { expect(spent >= min, "time connected on \(entry.path): expected at least \(min.short), got \(spent.short)") }
            if let max = entry.max { expect(spent <= max, "time connected on \(entry.path): expected at most \(max.short), got \(spent.short)") }
        }
        for (i, check) in e.stateAt.enumerated() {
            expect(stateAtResults[i] == check.state, "state at \(check.at)s: expected \(check.state), got \(stateAtResults[i])")
        }
        for (i, check) in e.pathAt.enumerated() {
            let actual = pathAtResults[i] ?? "none"
            expect(actual == check.path, "path at \(check.at)s: expected \(check.path), got \(actual)")
        }
        report.failures = failures
    }
}
