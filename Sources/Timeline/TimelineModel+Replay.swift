import Topology
import Basics
import Netlink
import PathMonitor
import Reconnector
public import Replay

extension TimelineModel {
    /// The picture of one replay of `scenario`. The report must come from a replay that kept its
    /// trace (`Replay(scenario, keepTrace: true)`): the trace's network changes say what each
    /// uplink could do, its sleeps and wakes when the machine slept.
    public init(report: ReplayReport, scenario: Scenario) {
        let end = max(scenario.until, report.transitions.last?.at ?? scenario.until)
        let session = Self.sessionLanes(report.transitions, end: end)
        let uplinks = Self.uplinkLanes(report: report, scenario: scenario, end: end)
        let outages = Lane(kind: .outage, name: "outage", bands: report.outages.map { span in
            let length = span.upperBound - span.lowerBound
            return Band(from: span.lowerBound, to: span.upperBound, paint: .outage, label: "outage " + length.short,
                        detail: "no working tunnel while an uplink could carry it: \(span.lowerBound)s to \(span.upperBound)s (\(length.short))")
        })
        let (asleep, traced) = Self.fromTrace(report.trace, end: end)
        var lanes = session + uplinks + [outages]
        if !asleep.isEmpty { lanes.append(Lane(kind: .machine, name: "asleep", bands: asleep)) }
        let marks = report.transitions.compactMap(Self.mark) + traced + Self.worldMarks(scenario)
        let verdict = report.passed ? "PASS" : "FAIL"
        self.init(
            title: scenario.name,
            subtitle: "\(scenario.file) · \(verdict) · attempts \(report.attempts) · handshakes \(report.handshakes) · "
                + "probes \(report.probes) · longest outage \(report.maxOutage.short) · final \(report.finalState.name)",
            start: .zero, end: end, lanes: lanes,
            marks: marks.sorted { $0.at < $1.at })
    }

    /// The session's states, and the path it runs on or heads for, from the transitions.
    static func sessionLanes(_ transitions: [Transition], end: Instant) -> [Lane] {
        var states: [Band] = []
        var paths: [Band] = []
        var state = State.offline
        var since = Instant.zero
        var why = "the agent starts"
        func close(at: Instant) {
            let length = (at - since).short
            states.append(Band(from: since, to: at, paint: .state(state.name), label: state.name,
                               detail: "\(state.name) from \(since)s to \(at)s (\(length)): \(why)"))
            guard let path = state.path else { return }
            let carrying = switch state {
            case .connected, .probing, .switching: true
            default: false
            }
            let paint = Paint.path(path.name, carrying: carrying)
            let verb = carrying ? "on" : "heading for"
            if var last = paths.last, last.paint == paint, last.to == since {
                last.to = at
                paths[paths.count - 1] = last
                paths[paths.count - 1].detail = "\(verb) \(path.name) (\(path.source)) from \(last.from)s to \(at)s (\((at - last.from).short))"
            } else {
                paths.append(Band(from: since, to: at, paint: paint, label: path.name,
                                  detail: "\(verb) \(path.name) (\(path.source)) from \(since)s to \(at)s (\(length))"))
            }
        }
        for transition in transitions {
            // After the agent's clock stepped back, its instants may run behind the last band's.
            let at = max(transition.at, since)
            close(at: at)
            state = transition.to
            since = at
            why = "\(transition.trigger): \(transition.reason)"
        }
        close(at: max(end, since))
        return [Lane(kind: .session, name: "session", bands: states), Lane(kind: .path, name: "path", bands: paths)]
    }

    /// One lane per uplink: what it could do for the tunnel, as the kernel's changes (the initial
    /// network, then the trace's) and the world's drops and portals made it.
    static func uplinkLanes(report: ReplayReport, scenario: Scenario, end: Instant) -> [Lane] {
        enum Step { case network(NetworkChange), world(ScenarioEvent) }
        var steps: [(at: Instant, step: Step)] = []
        for (at, event) in report.trace {
            if case .network(let change) = event { steps.append((at, .network(change))) }
        }
        for event in scenario.timeline {
            switch event.event {
            case .drop, .restore, .portal, .login: steps.append((event.at, .world(event.event)))
            default: break
            }
        }
        // Stable: at one instant the kernel's changes come before the world's.
        steps = steps.enumerated().sorted { ($0.element.at, $0.offset) < ($1.element.at, $1.offset) }.map(\.element)

        var model = report.initialNetwork
        var dropped: Set<String> = []
        var portals: Set<String> = []
        var order: [String] = []
        var open: [String: (condition: UplinkCondition, since: Instant)] = [:]
        var bands: [String: [Band]] = [:]
        var everUsable: Set<String> = []
        func conditions() -> [String: UplinkCondition] {
            var usable: Set<String> = []
            for address in scenario.serverAddresses {
                for path in model.paths(to: address) { usable.insert(path.interface) }
            }
            var out: [String: UplinkCondition] = [:]
            for link in model.links.values.sorted(by: { $0.index < $1.index }) {
                guard ![.loopback, .tunnel].contains(link.kind), link.name != model.tunnelInterface else { continue }
                out[link.name] = if !link.isUp { .down }
                    else if !link.hasCarrier { .noCarrier }
                    else if !usable.contains(link.name) { .noPath }
                    else if portals.contains(link.name) { .portal }
                    else if dropped.contains(link.name) { .dropping }
                    else { .usable }
            }
            return out
        }
        func settle(at: Instant) {
            let now = conditions()
            for name in now.keys where !order.contains(name) { order.append(name) }
            order.sort { a, b in
                (model.link(named: a)?.index ?? .max, a) < (model.link(named: b)?.index ?? .max, b)
            }
            for name in Set(open.keys).union(now.keys) {
                let was = open[name]
                let becomes = now[name]
                if becomes == .usable { everUsable.insert(name) }
                guard was?.condition != becomes else { continue }
                if let was { bands[name, default: []].append(Self.uplinkBand(name, was.condition, from: was.since, to: at)) }
                open[name] = becomes.map { ($0, at) }
            }
        }
        settle(at: .zero)
        for (at, step) in steps {
            switch step {
            case .network(let change): model.apply(change)
            case .world(.drop(let dev)): dropped.insert(dev)
            case .world(.restore(let dev)): dropped.remove(dev)
            case .world(.portal(let dev, _)): portals.insert(dev)
            case .world(.login(let dev)): portals.remove(dev)
            case .world: break
            }
            settle(at: at)
        }
        for (name, was) in open { bands[name, default: []].append(Self.uplinkBand(name, was.condition, from: was.since, to: end)) }
        // Links that never could carry the tunnel and are no uplink by kind (a container's
        // bridge, a veth) would only crowd the picture.
        return order.compactMap { name in
            let kind = model.link(named: name)?.kind ?? report.initialNetwork.link(named: name)?.kind
            guard everUsable.contains(name) || [.wifi, .ethernet, .wwan].contains(kind) else { return nil }
            return Lane(kind: .uplink, name: name, bands: bands[name] ?? [])
        }
    }

    static func uplinkBand(_ name: String, _ condition: UplinkCondition, from: Instant, to: Instant) -> Band {
        let words = switch condition {
        case .usable: "up"
        case .noPath: "no path"
        case .noCarrier: "no carrier"
        case .down: "down"
        case .dropping: "drops all"
        case .portal: "portal"
        }
        return Band(from: from, to: to, paint: .uplink(condition), label: words,
                    detail: "\(name) \(words) from \(from)s to \(to)s (\((to - from).short))")
    }

    /// What the trace alone tells: when the machine slept, announced or not (its sleeps and
    /// wakes), and what each connectivity check found.
    static func fromTrace(_ trace: [(at: Instant, event: AgentEvent)], end: Instant) -> (asleep: [Band], marks: [Mark]) {
        var bands: [Band] = []
        var marks: [Mark] = []
        var sleptAt: Instant?
        for (at, event) in trace {
            switch event {
            case .sleep:
                sleptAt = at
                marks.append(Mark(at: at, kind: .sleep, label: "sleep", detail: "\(at)s: the suspend hook announced a suspend"))
            case .wake(let slept):
                sleptAt = nil
                let from = max(at - slept, bands.last?.to ?? .zero)
                bands.append(Band(from: from, to: at, paint: .asleep, label: "asleep " + slept.short,
                                  detail: "asleep from \(from)s to \(at)s (\(slept.short))"))
                marks.append(Mark(at: at, kind: .wake, label: "wake " + slept.short, detail: "\(at)s: the machine woke after \(slept.short)"))
            case .connectivity(let found, _):
                let label = switch found {
                case .online: "check: online"
                case .portal: "check: portal"
                case .unknown: "check: no answer"
                }
                marks.append(Mark(at: at, kind: .portal, label: label, detail: "\(at)s: a connectivity check found \(found)"))
            default: break
            }
        }
        if let sleptAt {
            bands.append(Band(from: sleptAt, to: end, paint: .asleep, label: "asleep", detail: "asleep from \(sleptAt)s to the end"))
        }
        return (bands, marks)
    }

    /// The mark a transition's reason calls for, if any.
    static func mark(_ t: Transition) -> Mark? {
        let label: String
        let kind: Mark.Kind
        switch t.reason {
        case .handshakeSucceeded(let rtt): (kind, label) = (.handshake, "handshake " + rtt.short)
        case .handshakeTimeout: (kind, label) = (.handshakeFailed, "handshake timeout")
        case .rejected: (kind, label) = (.handshakeFailed, "rejected")
        case .sessionUnknown: (kind, label) = (.handshakeFailed, "session lost")
        case .backoff(let wait): (kind, label) = (.backoff, "backoff " + wait.short)
        case .budgetExhausted(let wait): (kind, label) = (.backoff, "no token " + wait.short)
        // A portal found or gone is the connectivity check's mark (`fromTrace`).
        case .portalWindowOpened(let length): (kind, label) = (.portal, "window " + length.short)
        case .portalWindowClosed: (kind, label) = (.portal, "window closed")
        case .onDemand(let verdict): (kind, label) = (.onDemand, "\(verdict.rule): \(verdict.action.rawValue)")
        case .onDemandWaits(let rule, _): (kind, label) = (.onDemand, rule + " waits")
        case .lockdownRestored: (kind, label) = (.onDemand, "lockdown back")
        default:
            guard case .connecting = t.to else { return nil }
            (kind, label) = (.attempt, "attempt \(t.attempt)")
        }
        return Mark(at: t.at, kind: kind, label: label, detail: t.logfmt)
    }

    /// What the scenario did to the server and the agent, beside the network (which the lanes show).
    static func worldMarks(_ scenario: Scenario) -> [Mark] {
        scenario.timeline.compactMap { event in
            let label: String
            switch event.event {
            case .server(let change): label = "server " + change.rawValue
            case .gateway(let index, let change): label = "\(scenario.gateways[index]) \(change.rawValue)"
            case .power(let source): label = "on " + source.rawValue
            case .auth(let accepts): label = accepts ? "credentials accepted" : "credentials refused"
            case .reconnect: label = "agent reconnect"
            case .operatorPause(let paused): label = paused ? "agent down" : "agent up"
            case .portalWindow(let open): label = open ? "agent portal" : "portal command ends"
            case .forgedHint: label = "forged hint"
            case .stop: label = "stop"
            case .reload: label = "reload"
            case .restart: label = "restart"
            case .taken(let holding, let by, _): label = holding.rawValue + " taken" + (by.map { " by " + $0 } ?? "")
            case .exclude: label = "agent exclude"
            case .clockBack(let step): label = "clock back " + step.short
            default: return nil
            }
            return Mark(at: event.at, kind: .world, label: label, detail: "\(event.at)s: \(label) (\(scenario.file):\(event.line))")
        }
    }
}
