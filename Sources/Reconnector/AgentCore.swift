public import Topology
public import Basics

/// The agent's decisions, in one pure place: events and the time go in, effects come out.
/// The daemon runs it on the real clock with real sockets, and a replay on a virtual clock with
/// a simulated world; both carry out the same effects, and feed back what they produce.
///
/// Around the session's state machine (`Reconnector`) it keeps the network as the kernel
/// reported it and the paths to the server's address (`network`), where the servers are and
/// the look-ups of their names (`servers`), the on-demand rules and what they know of the best
/// path's network (`onDemand`), the start-up deadline, and that a stopping agent decides nothing
/// more.
public struct AgentCore: Sendable {
    /// The session's state machine.
    public private(set) var reconnector: Reconnector
    /// The links, addresses and routes, and the ranked paths to the current server's address.
    public private(set) var network: PathTracker
    /// Every server's usable addresses, and the look-ups of the current one's name.
    public private(set) var servers: ServerBook
    /// The on-demand rules, and what they know of the best path's network.
    public private(set) var onDemand: OnDemandJudge
    /// What others took away of the agent's rules, routes, resolvers and lockdown, and the fights.
    public private(set) var upkeep = Upkeep()
    /// The containers' and VMs' bridges, as last told.
    public private(set) var guests: [GuestNetwork] = []
    /// The local networks and the wider claims (`NetworkModel.localNetworks`, `widerClaims`) as
    /// the model held them after the last change that could move them: only a change of the
    /// links' addresses can, so what a change moved is this against the model after it.
    private var local: (networks: [Prefix], widerClaims: [Prefix]) = ([], [])
    /// Events that bound a socket or started a handshake (one each, whatever else they did),
    /// since this core began.
    public private(set) var attempts = 0
    /// The agent is stopping, or gave up: nothing is decided any more.
    public private(set) var stopped = false
    /// The tunnel came up once (a handshake completed): the start-up deadline no longer applies.
    public private(set) var tunnelUp = false
    /// Before the tunnel first comes up, how long attempts on a usable path may go unanswered
    /// before the agent gives up (nil: it waits for ever); time without a path does not count.
    public let startupWait: Duration?
    /// Since when attempts have gone unanswered, before the tunnel first came up.
    private var unansweredSince: Instant?
    /// The service was told it is ready.
    private var announcedReady = false
    /// While the agent backs off, when to ask the server's name again.
    private var lookUpAt: Instant?
    /// The server a prepared handover goes to, and its address.
    private var handover: (server: Int, address: IPAddress?)?
    /// Who opened the portal window, while one is open: only they (or root) close it or join it.
    public private(set) var portalWindowOwner: UInt32?
    /// A window is being opened: the lockdown's answer is awaited.
    private var openingWindow = false
    /// Whether the lockdown's answer to a window being opened is awaited (the machine holds the
    /// window open meanwhile).
    public var isOpeningWindow: Bool { openingWindow }
    /// `exclusion: allow`: applications may be kept outside the tunnel.
    public let exclusionAllowed: Bool
    /// A full tunnel's lockdown holds a captive portal back, so a window may open through it;
    /// without one the portal is reachable as it is and no window is needed.
    public let portalWindows: Bool
    /// The excluded applications' cgroup stands, let through the lockdown; or it is being opened.
    public private(set) var exclusionOpen = false
    private var openingExclusion = false
    /// The prefixes the tunnel's own routes carry (split mode): a server address inside one is
    /// never used, for the session's packets to it would go into the tunnel they carry.
    public let tunnelCarries: [Prefix]
    /// Servers whose every address at start lies inside the tunnel's own routes, with what their
    /// names gave: the one the session starts with ends the agent as it starts, the others are told of.
    private let carriedAtStart: [(server: Int, addresses: [IPAddress])]
    /// The server's last answer that gave nothing usable, once the operator was told of it.
    private var unusableAnswer: [IPAddress]?
    /// What the operator is told of flapping interfaces.
    private var flaps: FlapNotices
    /// The session is being moved to another address: what that brings asks no look-up.
    private var following = false
    /// What the machine is told once the rules have the facts they asked for (new paths, a
    /// wake): a network the rules may trust is not tried before they have looked at it.
    private var held: [Input] = []
    /// The tunnel device is set up (it stays through every reconnect).
    public private(set) var tunnelAttached = false
    /// The device has an IPv6 address (the first session's, which it keeps through every
    /// reconnect): its MTU stays at 1,280 or above whatever a later server gives.
    private var deviceCarriesIPv6 = false
    /// A handshake that completed while the device was being set up: the session counts as up
    /// once the device is.
    private var awaitingDevice: (rtt: Duration, sized: Bool, v6: Bool)?
    /// The tunnel's resolvers, decided here (nil: the agent leaves the system's DNS alone).
    private var resolvers: ResolverChoice?
    /// Where the HTTP proxy is on each network, when the configuration names it by host (nil:
    /// no proxy, or one at a literal address, which every network reaches alike).
    public private(set) var proxies: ProxyBook?
    /// The service manager's watchdog, a start still trying, and the metrics file.
    public private(set) var heartbeats: Heartbeats

    /// `model` is the network as the first dump showed it; `servers` every server of the list
    /// with the addresses its name gave at start, which are judged as every later answer is
    /// (`ServerBook.usable`). The session starts with the first server, on the first of its
    /// usable addresses an uplink reaches now (the first, with no network yet).
    public init(_ reconnector: Reconnector, startupWait: Duration? = nil, model: NetworkModel, servers: [ServerBook.Entry],
                rules: OnDemandRules = OnDemandRules(), exclusionAllowed: Bool = false, portalWindows: Bool = true,
                tunnelCarries: [Prefix] = [], resolvers: ResolverChoice? = nil, proxyNamed: Bool = false,
                heartbeats: Heartbeats = Heartbeats()) {
        self.reconnector = reconnector
        self.heartbeats = heartbeats
        proxies = proxyNamed ? ProxyBook() : nil
        self.tunnelCarries = tunnelCarries
        self.resolvers = resolvers
        flaps = FlapNotices(window: reconnector.config.flapStableAfter)
        self.exclusionAllowed = exclusionAllowed
        self.portalWindows = portalWindows
        onDemand = OnDemandJudge(rules: rules)
        self.startupWait = startupWait
        let usable = servers.map { ServerBook.Entry(named: $0.named, addresses: ServerBook.usable($0.addresses, carried: tunnelCarries)) }
        carriedAtStart = zip(servers, usable).enumerated().compactMap { index, entry in
            entry.1.addresses.isEmpty && !entry.0.addresses.isEmpty ? (index, entry.0.addresses) : nil
        }
        self.servers = ServerBook(usable)
        let addresses = usable.first?.addresses ?? []
        let first = PathTracker.preferred(addresses, in: model) ?? .v4(0)
        network = PathTracker(model: model, endpoint: first)
        local = (model.localNetworks, model.widerClaims)
        network.learn(serverAddresses: addresses)
    }

    /// The address the session's packets go to.
    public var serverAddress: IPAddress { network.endpoint }

    /// Every timer the core keeps, the machine's and its own: the runner feeds
    /// `.timerFired(kind)` once `now` reaches one.
    public var timers: [TimerKind: Instant] {
        guard !stopped else { return [:] }
        var all = reconnector.timers
        if let giveUpAt { all[.startup] = giveUpAt }
        if let lookUpAt { all[.lookUp] = lookUpAt }
        if let due = onDemand.nextDeadline { all[.onDemand] = due }
        if let due = upkeep.nextDeadline { all[.upkeep] = due }
        if let due = flaps.nextDue { all[.flapSummary] = due }
        all.merge(heartbeats.timers) { $1 }
        return all
    }

    /// The earliest of `timers`.
    public var nextDeadline: Instant? {
        guard !stopped else { return nil }
        return [reconnector.nextDeadline, giveUpAt, lookUpAt, onDemand.nextDeadline, upkeep.nextDeadline, flaps.nextDue,
                heartbeats.nextDeadline].compactMap { $0 }.min()
    }

    private var giveUpAt: Instant? {
        guard !tunnelUp, let unansweredSince, let startupWait else { return nil }
        return unansweredSince + startupWait
    }

    /// Decides what `event` at `now` calls for. Once stopped, nothing: whatever comes after the
    /// stop (a SIGCONT a service manager sends, a timer) must not move a session whose goodbye
    /// is on its way.
    public mutating func handle(_ event: AgentEvent, now: Instant) -> [Effect] {
        guard !stopped else { return [] }
        flaps.window = reconnector.config.flapStableAfter  // a reload may change it
        let pathsBefore = reconnector.paths
        var out = decide(event, now: now)
        // Networks the machine left are forgotten; those it has not asked about are asked.
        if !stopped, proxies != nil {
            keepProxies(now, &out)
            askProxy(&out) { $1 == nil }
        }
        // The tunnel's resolvers follow what the event changed (a handshake, the device, the
        // local networks, the lockdown lifted or back).
        if !stopped, let decision = resolvers?.decision() { out.append(.resolvers(decision)) }
        // What the operator reads of flapping interfaces follows the paths the machine has.
        if reconnector.paths != pathsBefore, case let after = Set(reconnector.paths.map(\.interface)),
           after != Set(pathsBefore.map(\.interface)) {
            let machine = reconnector
            out += flaps.paths(after, now: now) { machine.flapping($0, now) }.map(Effect.notice)
        }
        if !stopped { heartbeats.settle(&out, ready: announcedReady, connected: isConnected, now: now) }
        if out.contains(where: \.isAttempt) { attempts += 1 }
        return out
    }

    private var isConnected: Bool { if case .connected = reconnector.state { true } else { false } }

    private mutating func decide(_ event: AgentEvent, now: Instant) -> [Effect] {
        var out: [Effect] = []
        switch event {
        case .start:
            // The session's packets to the server it starts with would go into the tunnel they carry.
            if let carried = carriedAtStart.first(where: { $0.server == reconnector.server }) {
                return giveUp(.serverCarried(server: carried.server, addresses: carried.addresses))
            }
            out += carriedAtStart.map { .notice(.serverCarried(server: $0.server, addresses: $0.addresses)) }
            out.append(.localNetworks(network.model.localNetworks, widerClaims: network.model.widerClaims))
            resolvers?.localNetworks(network.model.localNetworks)
            guests = network.model.guestNetworks
            out.append(.guestNetworks(guests))
            if onDemand.isActive { out.append(.followNotices(onDemand.notices)) }
            // No stream is tried on a network before the proxy's name gave an address there.
            if let proxies { run(.streamNetworks(proxies.reachable), now, &out) }
            tellAddressless(now, &out)
            pathsChanged(now, &out)
        case .network(let change): networkChanged(change, now, &out)
        case .serverLookedUp(let index, let addresses): lookedUp(index, addresses, now, &out)
        case .serverAllowed(let index, let address, let allowed): serverAllowed(index, address, allowed, now, &out)
        case .sleep: run(.sleep, now, &out)
        case .wake(let slept):
            unansweredSince = nil  // the time asleep was no time without an answer
            // Awake, perhaps on another network: the rules look at it afresh.
            onDemand.forgetNetwork()
            judge(now, &out)
            afterRules(.wake(sleptFor: slept), now, &out)
            // Perhaps on another network, where the name may resolve elsewhere.
            lookUp(&out)
            askProxy(&out) { _, _ in true }
        case .powerChanged(let source): run(.powerChanged(source), now, &out)
        case .probeEcho(let id, let rtt, let size):
            guard let echo = reconnector.echo(of: id, rtt: rtt, size: size) else { break }
            run(echo, now, &out)
        case .handshakeCompleted(let rtt, let sized, let v6, let dns):
            resolvers?.handshake(gave: dns)
            // A late answer after a rule lifted the lockdown brings no device or routes back.
            if !tunnelAttached, !lockdownLifted {
                awaitingDevice = (rtt, sized, v6)
                out.append(.attachTunnel)
                return out
            }
            sessionUp(rtt: rtt, sized: sized, v6: v6 || deviceCarriesIPv6, now, &out)
        case .tunnelAttached:
            tunnelAttached = true
            deviceCarriesIPv6 = awaitingDevice?.v6 ?? false
            resolvers?.attached()
            guard let (rtt, sized, v6) = awaitingDevice else { break }
            awaitingDevice = nil
            sessionUp(rtt: rtt, sized: sized, v6: v6, now, &out)
        case .handshakeRejected:
            guard tunnelUp else { return giveUp(.rejected) }
            run(.handshakeFailed(.rejected("the server refused this client's key or credentials")), now, &out)
        case .sessionUnknown: run(.handshakeFailed(.sessionUnknown), now, &out)
        case .dataSent: run(.dataSent, now, &out)
        case .dataReceived: run(.dataReceived, now, &out)
        case .serverDraining: run(.serverDraining, now, &out)
        case .handoverReady(let rtt, let sized, let v6, let dns):
            resolvers?.handshake(gave: dns)
            run(.handoverReady(rtt: rtt, sizedProbes: sized, carriesIPv6: v6 || deviceCarriesIPv6), now, &out)
        case .handoverRejected: run(.handoverRejected, now, &out)
        case .connectivity(let result, let path): run(.connectivity(result, on: path), now, &out)
        case .timerFired(.startup):
            guard let due = giveUpAt, due <= now else { break }
            return giveUp(.noAnswer(after: startupWait ?? .zero, interface: reconnector.state.path?.interface))
        case .timerFired(.lookUp):
            guard let due = lookUpAt, due <= now else { break }
            lookUpAt = now + ServerBook.lookUpEvery
            lookUp(&out)
            askProxy(&out) { $1?.address == nil }
        case .timerFired(.onDemand):
            var asks: [FactRequest] = []
            onDemand.timerFired(now: now, &asks)
            out += asks.map(Effect.findOut)
            judge(now, &out)
        case .timerFired(.upkeep): upkeep.timerFired(now: now, &out)
        case .timerFired(.flapSummary): out += flaps.tick(now: now).map(Effect.notice)
        case .timerFired(let kind) where [.watchdog, .extendStart, .metrics].contains(kind):
            heartbeats.timerFired(kind, connected: isConnected, now: now, &out)
        case .timerFired(let kind): run(.timerFired(kind), now, &out)
        case .damaged(let holding, let damage): upkeep.damaged(holding, damage, now: now, &out)
        case .intact(let holding): upkeep.intact(holding)
        case .networkFact(let fact):
            if onDemand.learn(fact, now: now) { judge(now, &out) }
        case .reloaded(let reload):
            // Tunables and rules apply to the running tunnel; another tunnel is another agent.
            guard reload.tunnelChanges.isEmpty else {
                stopped = true
                return [.restart(because: reload.tunnelChanges)]
            }
            reconnector.reconfigure(reload.config)
            rulesChanged(reload.rules, now, &out)
            heartbeats.metricsFile(reload.metricsFile, connected: isConnected, now: now, &out)
        case .tunnelFailed(let why):
            awaitingDevice = nil
            return giveUp(.tunnelFailed(why))
        case .request(let request): operatorAsked(request, now, &out)
        case .portalWindowOpened(let opened): portalWindowOpened(opened, now, &out)
        case .exclusionOpened(let opened): exclusionOpened(opened, &out)
        case .streamFailed(let id, let why):
            // The proxy may have moved on that network (a new lease, another front end).
            if let uplink = network.paths.first(where: { $0.id == id.over(.udp) }) {
                askProxy(&out) { key, entry in key == NetworkKey(uplink) && entry?.address != nil }
            }
            run(.streamFailed(on: id, why: why), now, &out)
        case .proxyLookedUp(let path, let addresses): proxyLookedUp(on: path, addresses, now, &out)
        case .tunnelMTUFailed(let actual, _): run(.tunnelMTUFailed(actual: actual), now, &out)
        case .sessionFailed(let why):
            // A session that cannot talk to its server would send nothing and hear nothing: the
            // agent ends, with why, for its service manager to start it afresh (the lockdown stays).
            return giveUp(.sessionFailed(why))
        case .liftRefused(let why):
            guard lockdownLifted else { break }
            resolvers?.restore()
            run(.liftRefused(why: why), now, &out)
        case .proxyAllowed(let key, let address, let ok):
            guard proxies?.allowed(key, address, ok) == true, let reachable = proxies?.reachable else { break }
            run(.streamNetworks(reachable), now, &out)
        case .bindFailed(let id, let why):
            run(.bindFailed(on: id, why: why), now, &out)
        }
        return out
    }

    // MARK: The operator

    /// An operator's request: carried out when it makes sense in the state the agent is in, and
    /// answered either way (the stop, a signal, is not).
    private mutating func operatorAsked(_ request: AgentEvent.Request, _ now: Instant, _ out: inout [Effect]) {
        switch request {
        case .reconnect:
            switch reconnector.state {
            case .paused: out.append(.reply(.down))
            case .disconnected(let rule, _, _): out.append(.reply(.keptDownByRule(rule)))
            default:
                run(.reconnectRequested, now, &out)
                out.append(.reply(.reconnecting))
            }
        case .pause:
            if case .paused = reconnector.state { return out.append(.reply(.paused(already: true))) }
            run(.pause, now, &out)
            out.append(.reply(.paused(already: false)))
        case .resume:
            guard case .paused = reconnector.state else { return out.append(.reply(.upAlready(reconnector.state.name))) }
            run(.resume, now, &out)
            out.append(.reply(.connecting))
        case .openPortalWindow(let uid):
            guard portalWindows else {
                let url = if case .portal(_, let url, _, _) = reconnector.state { url } else { String?.none }
                return out.append(.reply(.portalReachable(url: url)))
            }
            guard case .portal(let path, let url, _, _) = reconnector.state else { return out.append(.reply(.noPortal(reconnector.state.name))) }
            if let until = reconnector.portalWindowUntil {
                guard mayChangeWindow(uid) else { return out.append(.reply(.notPermitted)) }
                return out.append(.reply(.portalWindowOpen(url: url, interface: path.interface, until: until)))
            }
            portalWindowOwner = uid
            openingWindow = true
            // Answered once the lockdown says whether the window is open.
            run(.openPortalWindow, now, &out)
            if reconnector.portalWindowUntil == nil {
                openingWindow = false
                out.append(.reply(.portalWindowFailed))
            }
        case .closePortalWindow(let uid):
            if reconnector.portalWindowUntil != nil {
                guard mayChangeWindow(uid) else { return out.append(.reply(.notPermitted)) }
                run(.closePortalWindow, now, &out)
            }
            out.append(.reply(.portalWindowClosed))
        case .exclude:
            guard exclusionAllowed else { return out.append(.reply(.exclusionOff)) }
            if exclusionOpen { return out.append(.reply(.excluded)) }
            // Answered once the lockdown says whether the exclusion is let through.
            openingExclusion = true
            out.append(.openExclusion)
        case .stop(let who):
            stopped = true
            out.append(.stop(opensMachine: who == .byOperator))
        }
    }

    /// The lockdown's answer to the exclusion being opened.
    private mutating func exclusionOpened(_ opened: Bool, _ out: inout [Effect]) {
        guard openingExclusion else { return }
        openingExclusion = false
        exclusionOpen = opened
        out.append(.reply(opened ? .excluded : .exclusionFailed))
    }

    /// Only the one who opened the portal window, or root, joins or closes it.
    private func mayChangeWindow(_ uid: UInt32) -> Bool { uid == 0 || uid == portalWindowOwner }

    /// The lockdown's answer to a window being opened: the window stands, or closes at once.
    private mutating func portalWindowOpened(_ opened: Bool, _ now: Instant, _ out: inout [Effect]) {
        guard openingWindow else { return }
        openingWindow = false
        guard opened else {
            run(.portalWindowRefused, now, &out)
            return out.append(.reply(.portalWindowFailed))
        }
        // Opened, but the machine moved on meanwhile (the portal opened): the window closes.
        guard let until = reconnector.portalWindowUntil, case .portal(let path, let url, _, _) = reconnector.state else {
            run(.closePortalWindow, now, &out)
            return out.append(.reply(.portalWindowFailed))
        }
        out.append(.reply(.portalWindowOpen(url: url, interface: path.interface, until: until)))
    }

    // MARK: The network and the server's addresses

    /// One change from the kernel. When no uplink reaches the server's address any more but one
    /// reaches another of its addresses (the other family: an IPv6 address on an IPv4-only
    /// network), the session moves there instead of going offline.
    private mutating func networkChanged(_ change: NetworkChange, _ now: Instant, _ out: inout [Effect]) {
        // Worked out only for a change that can move them: most are routes and carrier.
        let localBefore = change.movesAddresses ? local : nil
        let paths = network.apply(change)
        // The rules look at the network first (an address may match a rule's subnet), so a
        // trusted network is never tried.
        judge(now, &out)
        // The local networks are the links' own addresses' subnets: a route never moves them.
        if let localBefore {
            local = (network.model.localNetworks, network.model.widerClaims)
            if local != localBefore {
                out.append(.localNetworks(local.networks, widerClaims: local.widerClaims))
                resolvers?.localNetworks(local.networks)
            }
        }
        // A bridge, its ports, its addresses or a default route through it.
        if change.movesAddresses || change.routeDestination?.length == 0 {
            let now = network.model.guestNetworks
            if now != guests {
                guests = now
                out.append(.guestNetworks(now))
            }
        }
        if servers.pending == nil, let other = network.reachableAlternative {
            return propose(.init(server: reconnector.server, address: other, why: "no uplink reaches \(network.endpoint) now",
                                 announce: false), &out)
        }
        if let paths { afterRules(.paths(paths), now, &out) }
    }

    // MARK: The proxy

    /// Asks for a look-up of the proxy's name on each network the paths are on that `which`
    /// picks (given its entry, nil when never asked), unless one is out there.
    private mutating func askProxy(_ out: inout [Effect], which: (NetworkKey, ProxyBook.Entry?) -> Bool) {
        guard proxies != nil else { return }
        for path in network.paths where path.transport == .udp && which(NetworkKey(path), proxies?[NetworkKey(path)]) {
            if proxies?.ask(NetworkKey(path)) == true { out.append(.lookUpProxy(on: path)) }
        }
    }

    /// Forgets the networks the machine is no longer on: their addresses leave the lockdown and
    /// the networks a stream can open on.
    private mutating func keepProxies(_ now: Instant, _ out: inout [Effect]) {
        guard var book = proxies else { return }
        let before = book.reachable
        let current = Set(network.paths.filter { $0.transport == .udp }.map(NetworkKey.init))
        let addressLeft = book.keep(only: current)
        proxies = book  // a network left while its look-up was out is forgotten too: its answer finds no entry
        if addressLeft { proxyAddressesLeft(reachableBefore: before, now, &out) }
    }

    /// Addresses left the book: the lockdown is narrowed to what is left, and the state machine
    /// hears of the networks a stream can no longer open on.
    private mutating func proxyAddressesLeft(reachableBefore: Set<NetworkKey>, _ now: Instant, _ out: inout [Effect]) {
        guard let book = proxies else { return }
        out.append(.proxyAt(book.lockdown, opening: nil))
        if book.reachable != reachableBefore { run(.streamNetworks(book.reachable), now, &out) }
    }

    /// A look-up of the proxy's name on `path`'s network answered: its first address that
    /// network's streams may reach (`mayDial`) is proposed to the lockdown; a name with none
    /// there takes what was known out; no answer changes nothing.
    private mutating func proxyLookedUp(on path: Path, _ addresses: [IPAddress]?, _ now: Instant, _ out: inout [Effect]) {
        guard var book = proxies else { return }
        let key = NetworkKey(path)
        let answer: ProxyBook.Answer = switch addresses?.first(where: { Self.mayDial($0, from: path, carried: tunnelCarries) }) {
        case let usable?: .address(usable)
        case nil: addresses == nil ? .noAnswer : .none
        }
        let before = book.reachable
        let change = book.answered(key, answer)
        proxies = book
        switch change {
        case .open?: out.append(.proxyAt(book.lockdown, opening: key))
        case .close?: proxyAddressesLeft(reachableBefore: before, now, &out)
        case nil: break
        }
    }

    /// Whether the agent may open its streams to a proxy at `address` (as a name's answer gives
    /// it) from `path`: the path's family, outside the tunnel's own routes, and a host on a
    /// network, never this machine, a multicast or broadcast group, an unspecified or a
    /// link-local address (which a forged answer could point the proxy's password at).
    public static func mayDial(_ address: IPAddress, from path: Path, carried: [Prefix]) -> Bool {
        address.family == path.source.family && address != path.source && ServerBook.isUsable(address, carried: carried)
    }

    /// Asks for a look-up of the current server's name (one at a time).
    private mutating func lookUp(_ out: inout [Effect]) {
        if servers.ask(reconnector.server) { out.append(.lookUpServer(reconnector.server)) }
    }

    /// A look-up answered. The session follows the current server to an address its name gives
    /// now when it no longer gives the one in use, if an uplink reaches it.
    private mutating func lookedUp(_ index: Int, _ answer: [IPAddress]?, _ now: Instant, _ out: inout [Effect]) {
        let addresses = answer.map { ServerBook.usable($0, carried: tunnelCarries) }
        follow(index, addresses, now, &out)
        // A name that answered, for the server in use, with nothing the session follows or keeps:
        // said once for each answer, not for every look-up that repeats it.
        guard let answer, index == reconnector.server else { return }
        guard servers.pending == nil, !(addresses ?? []).contains(network.endpoint) else { return unusableAnswer = nil }
        guard answer != unusableAnswer else { return }
        unusableAnswer = answer
        out.append(.notice(.serverNameUnusable(server: index, addresses: answer)))
    }

    /// Learns server `index`'s usable `addresses` (nil: the look-up failed) and, for the server
    /// in use, moves the session when its address is gone from them.
    private mutating func follow(_ index: Int, _ addresses: [IPAddress]?, _ now: Instant, _ out: inout [Effect]) {
        if servers.answered() { out.append(.lookUpServer(reconnector.server)) }
        guard let addresses, !addresses.isEmpty else { return }  // a failure keeps what was known
        servers.learn(index, addresses)
        tellAddressless(now, &out)
        guard index == reconnector.server else { return }
        network.learn(serverAddresses: addresses)
        guard servers.pending == nil else { return }
        guard !addresses.contains(network.endpoint) else {
            // Still there; but an uplink may reach another of its addresses only now.
            if let other = network.reachableAlternative {
                propose(.init(server: index, address: other, why: "no uplink reaches \(network.endpoint) now", announce: false), &out)
            }
            return
        }
        // Not one no uplink reaches (IPv6 on an IPv4-only network): the old address is kept.
        guard let address = addresses.first(where: { !network.model.paths(to: $0).isEmpty }) else { return }
        propose(.init(server: index, address: address, why: "its name resolves there now", announce: true), &out)
    }

    /// Tells the state machine which servers have no address the session may use, when that changed.
    private mutating func tellAddressless(_ now: Instant, _ out: inout [Effect]) {
        let addressless = Set(servers.entries.indices.filter { servers.entries[$0].addresses.isEmpty })
        if addressless != reconnector.addressless { run(.serversWithoutAddress(addressless), now, &out) }
    }

    /// The lockdown is asked to let the session reach the new address; the session follows
    /// once it says yes.
    private mutating func propose(_ move: ServerBook.Move, _ out: inout [Effect]) {
        var move = move
        move.lockdown = servers.allowing(move.address, to: move.server, inUse: network.endpoint)
        servers.propose(move)
        out.append(.allowServer(move.server, address: move.address, lockdown: move.lockdown))
    }

    private mutating func serverAllowed(_ index: Int, _ address: IPAddress, _ allowed: Bool, _ now: Instant,
                                        _ out: inout [Effect]) {
        guard let move = servers.pending, move.server == index, move.address == address else { return }
        if allowed { servers.allowedPending() }
        servers.propose(nil)
        guard allowed, index == reconnector.server, address != network.endpoint else {
            // The old address stays; the machine hears the paths to it as they are.
            if reconnector.paths != network.paths { pathsChanged(now, &out) }
            return
        }
        reconnector.forgetProbes()
        out.append(.useAddress(address, why: move.why))
        following = true
        defer { following = false }
        if network.retarget(to: address) != nil { pathsChanged(now, &out) }
        if move.announce { run(.serverMoved, now, &out) }
    }

    /// The session turned to server `index` (a failover or a completed handover) at `address`:
    /// the paths are those to its address.
    private mutating func turned(to index: Int, at address: IPAddress?, _ now: Instant, _ out: inout [Effect]) {
        servers.propose(nil)
        guard let address else { return }
        following = true
        defer { following = false }
        if network.retarget(to: address) != nil { pathsChanged(now, &out) }
        network.learn(serverAddresses: servers.entries[index].addresses)
    }

    // MARK: On-demand rules

    /// What the rules say for the best path's network, given to the machine when it changed;
    /// what they wait for is asked of the runner.
    private mutating func judge(_ now: Instant, _ out: inout [Effect]) {
        if onDemand.isActive {
            var asks: [FactRequest] = []
            let decision = onDemand.judge(network.paths.first, in: network.model, now: now, &asks)
            out += asks.map(Effect.findOut)
            if let decision {
                out.append(.onDemandDecided(decision))
                run(.onDemand(decision), now, &out)
            }
        }
        guard !onDemand.awaitsAnswers, !held.isEmpty else { return }
        let inputs = held
        held = []
        for input in inputs {
            // Paths held are the network as it was then; the machine hears it as it is now.
            if case .paths = input { run(.paths(network.paths), now, &out) } else { run(input, now, &out) }
        }
    }

    /// The paths to the server's address changed: the rules look at the network first, so a
    /// trusted network is never tried, then the machine hears the paths.
    private mutating func pathsChanged(_ now: Instant, _ out: inout [Effect]) {
        judge(now, &out)
        afterRules(.paths(network.paths), now, &out)
    }

    /// `input` goes to the machine now, or once the rules have the facts they asked for.
    private mutating func afterRules(_ input: Input, _ now: Instant, _ out: inout [Effect]) {
        guard onDemand.awaitsAnswers else { return run(input, now, &out) }
        // A lockdown lifted for a network the best path has left is put back at once, before
        // the rules look at the next one (the machine tries nothing on a verdict for another path).
        if case .paths = input, case .disconnected(_, let lifted?, _) = reconnector.state, lifted != network.paths.first?.id {
            return run(input, now, &out)
        }
        if case .paths = input { held.removeAll { if case .paths = $0 { true } else { false } } }
        held.append(input)
    }

    /// New rules from a reload: the network is judged afresh; with none left, always on.
    private mutating func rulesChanged(_ rules: OnDemandRules, _ now: Instant, _ out: inout [Effect]) {
        guard rules != onDemand.rules else { return }
        let had = onDemand.isActive
        onDemand.use(rules)
        out.append(.followNotices(onDemand.notices))
        if onDemand.isActive { return judge(now, &out) }
        guard had, let best = network.paths.first else { return }
        let always = OnDemandDecision.decided(OnDemandVerdict(action: .connect, rule: "default", path: best.id,
                                                              interface: best.interface))
        out.append(.onDemandDecided(always))
        run(.onDemand(always), now, &out)
    }

    // MARK: Around the machine

    private mutating func giveUp(_ why: GiveUp) -> [Effect] {
        stopped = true
        return [.giveUp(why)]
    }

    /// The session is up with fresh keys on a tunnel device that is up.
    private mutating func sessionUp(rtt: Duration, sized: Bool, v6: Bool, _ now: Instant, _ out: inout [Effect]) {
        tunnelUp = true
        ready(&out)
        run(.handshakeSucceeded(rtt: rtt, sizedProbes: sized, carriesIPv6: v6), now, &out)
    }

    /// A rule lifted the lockdown for the network the agent is on.
    private var lockdownLifted: Bool {
        if case .disconnected(_, .some, _) = reconnector.state { true } else { false }
    }

    private mutating func ready(_ out: inout [Effect]) {
        guard !announcedReady else { return }
        announcedReady = true
        out.append(.ready)
    }

    /// Feeds `input` to the machine and adds its effects, in order, with what follows from them
    /// here: the address of a server it turns to (and a look-up when none is known), the paths to
    /// that server, the attempt's clock, the tunnel's resolvers stepping aside with the lockdown.
    private mutating func run(_ input: Input, _ now: Instant, _ out: inout [Effect]) {
        let before = reconnector.state
        var attempted = false
        var rebound = false
        var turnedTo: (index: Int, address: IPAddress?)?
        for effect in reconnector.handle(input, now: now) {
            switch effect {
            case .bind(_, let first, _):
                attempted = true
                if !first { rebound = true }
            case .handshake: attempted = true
            // The machine names the server it turns to; where that server is reached now (the
            // first of its addresses an uplink reaches) is the book's to say.
            case .useServer(let index, _):
                let address = address(of: index)
                out.append(.useServer(index, at: address))
                if address == nil, servers.ask(index) { out.append(.lookUpServer(index)) }
                turnedTo = (index, address)
                continue
            case .prepareHandover(let index, _, let path):
                handover = (index, address(of: index))
                out.append(.prepareHandover(server: index, at: handover?.address, on: path))
                continue
            case .completeHandover:
                turnedTo = handover.map { ($0.server, $0.address) }
                handover = nil
            case .cancelHandover: handover = nil
            case .liftLockdown: resolvers?.lift()
            case .restoreLockdown: resolvers?.restore()
            default: break
            }
            out.append(effect)
        }
        if attempted, !tunnelUp, unansweredSince == nil { unansweredSince = now }
        // Each attempt asks the proxy's name again where it gave nothing yet (the network's DNS
        // may not have answered the first time): the attempt goes to the stream once it does.
        if attempted { askProxy(&out) { $1?.address == nil } }
        if reconnector.portalWindowUntil == nil { portalWindowOwner = nil }
        switch reconnector.state {
        case .offline, .disconnected, .portal:
            // No path, a rule keeps the tunnel down, or the network holds everything back until
            // a user logs in: nothing the server could answer, and nothing a boot should wait for.
            unansweredSince = nil
            ready(&out)
        case .sleeping: unansweredSince = nil
        default: break
        }
        if case .backingOff = reconnector.state {
            if lookUpAt == nil { lookUpAt = now + ServerBook.lookUpEvery }
        } else {
            lookUpAt = nil
        }
        // The moments the server's name may give another address: a new path (split-horizon
        // DNS), attempts that fail, a server gone silent. Not while following a move, which
        // would only ask the same question again.
        // A bind the machine refused says nothing of the server.
        var mayHaveMoved = Self.serverMayHaveMoved(from: before, to: reconnector.state)
        if case .bindFailed = input { mayHaveMoved = false }
        if !following, rebound || mayHaveMoved { lookUp(&out) }
        if let turnedTo { turned(to: turnedTo.index, at: turnedTo.address, now, &out) }
        // Attempts at this address went unanswered while the server has others an uplink reaches
        // (the network's IPv6 goes nowhere, one front end is down): the next attempt goes to the
        // next of them, as the uplinks' routes cannot tell which works.
        if !following, turnedTo == nil, case .backingOff = reconnector.state, mayHaveMoved, servers.pending == nil,
           let next = nextAddress() {
            propose(.init(server: reconnector.server, address: next, why: "attempts at \(network.endpoint) went unanswered",
                          announce: false), &out)
        }
    }

    /// Of server `index`'s addresses, the one to use: the first an uplink reaches now.
    private func address(of index: Int) -> IPAddress? {
        guard servers.entries.indices.contains(index) else { return nil }
        return PathTracker.preferred(servers.entries[index].addresses, in: network.model)
    }

    /// The current server's address after the one in use, in its name's order and round again,
    /// that an uplink reaches; nil when there is no other.
    private func nextAddress() -> IPAddress? {
        let addresses = servers.entries.indices.contains(reconnector.server) ? servers.entries[reconnector.server].addresses : []
        guard let at = addresses.firstIndex(of: network.endpoint) ?? (addresses.isEmpty ? nil : addresses.count - 1) else { return nil }
        for step in 1..<max(addresses.count, 1) {
            let candidate = addresses[(at + step) % addresses.count]
            if candidate != network.endpoint, !network.model.paths(to: candidate).isEmpty { return candidate }
        }
        return nil
    }

    private static func serverMayHaveMoved(from before: State, to after: State) -> Bool {
        switch (before, after) {
        case (.backingOff, .backingOff): false
        case (_, .backingOff): true
        case (.connected, .probing): true
        default: false
        }
    }
}
