import Topology
import Control
import ControlWire
import SystemDNS
import Logging
import Observability
import ConfigReader
import Glibc
import Lockdown
import Basics
import PathMonitor
import Reconnector
import Tunnel
import Device
import Settings
import Streams

/// The always-on client, one direction of flow: facts (the path monitor, the data plane's
/// events, signals, the operator's requests, timers) go into the core (`AgentCore`); its effects
/// go to `SessionEffects`, which carries them out. Other threads only post into the mailbox; one
/// thread decides, and the data plane never waits for a decision. The daemon itself stays on
/// the thread that made it: other threads get only its `mailbox`.
final class ClientDaemon {
    /// Everything another thread may tell the deciding thread.
    enum Event: Sendable {
        /// What the data plane told the core (a handshake, an echo, data sent or heard).
        case dataPlane(AgentEvent)
        case signal(Int32)
        /// What a look-up of server `server`'s name gave.
        case lookedUp(server: Int, Result<[IPAddress], ResolverError>)
        /// What a look-up of the proxy's name on the path's network gave.
        case proxyLookedUp(Path, Result<[IPAddress], ResolverError>)
        /// An operator's request from the control socket, to answer through `ControlServer.reply`.
        case control(ControlServer.Call)
        /// A connectivity check over the path ended.
        case connectivity(Connectivity, Path.ID)
        /// Something found out about a network for the on-demand rules (a probe's answer).
        case found(NetworkFact)
        /// The stream on a path opened or failed.
        case stream(Path.ID, StreamCarrier, StreamCarrier.Event)
    }

    /// The only state shared across threads: where other threads (signal handlers included)
    /// post events for the deciding thread.
    let mailbox: Mailbox<Event>
    /// The deciding thread's state; nothing else touches it.
    private let runner: CoreRunner

    /// `servers` are the configured servers with every address their names gave at start, which
    /// the core judges (the agent starts on the first server, on the first usable address an
    /// uplink reaches, and changes family when the uplinks do).
    init(settings: ClientSettings, configPath: String, key: PrivateKey, credentials: Credentials?, servers: [ResolvedServer],
         log: Logger, control: ControlSocket, waitForServer: Duration?, firewall: Firewall?) throws {
        let mailbox = try Mailbox<Event>()
        self.mailbox = mailbox
        let server = try ControlServer(socket: control, operatorGroup: settings.groupOperates ? ControlSocket.readerGroupID() : nil) {
            [weak mailbox] call in mailbox?.post(.control(call))
        }
        runner = try CoreRunner(settings: settings, configPath: configPath, key: key, credentials: credentials,
                        servers: servers, log: log, control: server,
                        waitForServer: waitForServer, firewall: firewall, mailbox: mailbox)
    }

    /// Decides until SIGTERM/SIGINT or a reason to stop; call once, on the deciding thread.
    func run() { runner.run() }

    /// Why the agent gave up, when it did: the caller exits with it.
    var failure: String? { runner.failure }
    /// The server address the session uses (read before run() or after it returns).
    var server: SocketAddress { runner.server }
    /// A reload changed more than tunables: the caller starts the agent afresh.
    var restartRequested: Bool { runner.restartRequested }
    /// The configuration the restart runs, when an operator chose another profile (`use-profile`).
    var nextConfigPath: String? { runner.nextConfigPath }
}

extension ClientDaemon {
    /// The deciding thread: a poll over the monitor, the mailbox (where the control socket's
    /// requests arrive too) and the power supply, with the core's next deadline as its timeout:
    /// every timer is the core's, the watchdog's and the metrics file's too.
    final class CoreRunner {
        var settings: ClientSettings
        /// Where the settings came from, read again on SIGHUP.
        let configPath: String
        var restartRequested = false
        /// The profile an operator chose (`use-profile`), run by the restart.
        var nextConfigPath: String?
        /// The core said the stop opens the machine: only the operator's does.
        var opensMachine = false
        var failure: String?
        var server: SocketAddress { effects.server }
        let log: Logger
        let mailbox: Mailbox<Event>
        /// Every decision: the session's state machine and what lies around it.
        var core: AgentCore
        var reconnector: Reconnector { core.reconnector }
        let monitor: LiveMonitor
        let effects: SessionEffects
        var service: ServiceReporter
        var suspends: SuspendDetector
        /// When the suspend hook announced a suspend (CLOCK_BOOTTIME, so the sleep counts).
        var sleptAt: Instant?
        let control: ControlServer
        let power = PowerEvents()
        var lastTransition: Transition?
        /// Decisions that bound, rebound or handshook, since start.
        var attempts: Int { core.attempts }
        var running = true
        let metrics = ClientMetrics()
        var metricsFile: MetricsFile?
        /// The control call whose request is being fed: the core's reply goes to it.
        var asking: ControlServer.Call?
        /// A portal window opened while it was being fed.
        var windowOpened = false
        /// Finds out what the on-demand rules ask about the network, and follows its notices.
        let facts: FactFinder
        /// Where the budget, the backoff and the dead-path verdicts outlive this process (the
        /// runtime directory, beside the control socket), and what was written there last.
        let memoryPath: String
        var savedMemory: Reconnector.Memory?
        /// The lockdown's table and resolv.conf, watched for someone else's changes (see
        /// `CoreRunner+Upkeep`).
        var tableWatch: TableWatch?
        var resolvConfWatch: ResolvConfWatch?

        init(settings: ClientSettings, configPath: String, key: PrivateKey, credentials: Credentials?, servers: [ResolvedServer],
             log: Logger, control: ControlServer, waitForServer: Duration?, firewall: Firewall?,
             mailbox: Mailbox<Event>) throws {
            self.settings = settings
            self.configPath = configPath
            self.log = log
            self.control = control
            self.mailbox = mailbox
            guard let first = servers.first?.addresses.first, let port = settings.server.port else {
                throw AgentError("the server has no address")
            }
            let clocks = SuspendDetector.clocks()
            suspends = SuspendDetector(monotonic: clocks.monotonic, boottime: clocks.boottime)
            service = ServiceReporter()
            memoryPath = control.path.parentDirectory + "/reconnect-state"
            metricsFile = settings.metricsFile.map(MetricsFile.init)
            facts = FactFinder(log: log)
            do {
                monitor = try LiveMonitor(endpoint: first, tunnelInterface: settings.tunnel.name)
            } catch {
                throw AgentError("cannot read the routing tables: \(error)")
            }
            // The core starts on the first address an uplink reaches now (a dual-stack server on
            // an IPv4-only network); the lockdown lets the session reach every one of them.
            core = AgentCore(Self.restoredMachine(settings: settings, memoryPath: memoryPath, log: log), startupWait: waitForServer,
                             model: monitor.tracker.model,
                             servers: servers.map { ServerBook.Entry(named: $0.entry.endpoint.address == nil, addresses: $0.addresses) },
                             rules: settings.onDemand, exclusionAllowed: settings.exclusionAllowed,
                             portalWindows: settings.lockdown && settings.mode.socketMark != nil,
                             tunnelCarries: settings.mode.splitPrefixes,
                             resolvers: settings.dns.manager == .off ? nil
                                 : ResolverChoice(override: settings.dns.override, carried: settings.mode.carried, lockdown: settings.lockdown),
                             proxyNamed: settings.stream?.proxy.map { $0.address == nil } ?? false,
                             heartbeats: Heartbeats(watchdog: SystemdNotifier.watchdogInterval(), extendsStart: SystemdNotifier().isActive,
                                                    metricsFile: settings.metricsFile))
            // The monitor follows the address the core judged usable, not the first answer.
            if monitor.endpoint != core.serverAddress { _ = monitor.retarget(to: core.serverAddress) }
            effects = SessionEffects(settings: settings, key: key, credentials: credentials, servers: servers,
                                     server: SocketAddress(core.serverAddress, port: port),
                                     firewall: firewall, proxy: try Self.proxy(settings), log: log,
                                     notify: { [weak mailbox] event in mailbox?.post(.dataPlane(event)) },
                                     streamTold: { [weak mailbox] id, carrier, event in mailbox?.post(.stream(id, carrier, event)) })
            // The lockdown lets the session reach what the core kept of each answer; a first
            // server it kept nothing of ends the agent as it starts, with nothing opened for it.
            for (index, addresses) in core.servers.allowed.enumerated() { effects.servers[index].addresses = addresses }
            if !core.servers.allowed[0].isEmpty {
                do {
                    try effects.openLockdown()
                } catch {
                    throw AgentError("cannot open the lockdown firewall to the server: \(error)")
                }
            }
            if let owner = firewall?.owner { metrics.lockdownExceptions(for: owner.kind) }
            // Every server's protocol core can be made (its key is one a session can pin): a
            // failover never finds out late that it cannot turn to one.
            for (index, server) in servers.enumerated() {
                do { _ = try effects.core(for: index) } catch { throw AgentError("server \(server.entry.name): \(error)") }
            }
        }

        /// The proxy of the `tcp` section, with the password from its file (read once, here). A
        /// proxy named by host is at `at` (the address its name gave on the network), or at the
        /// unspecified address until a look-up gives one.
        static func proxy(_ settings: ClientSettings, at: IPAddress? = nil) throws -> HTTPProxy? {
            guard let proxy = settings.stream?.proxy else { return nil }
            let address = proxy.address ?? SocketAddress(at ?? .v4(0), port: proxy.port)
            guard let user = proxy.user, let file = proxy.passwordFile else { return HTTPProxy(address: address) }
            do {
                return HTTPProxy(address: address, credentials: (user, try readSecretFile(file)))
            } catch {
                throw AgentError("the proxy's password: \(error)")
            }
        }

        func run() {
            do {
                try control.start()
            } catch {
                log.error("cannot serve the control socket; status and commands are unavailable", metadata: ["error": "\(error)"])
            }
            effects.networkObserved(core.network.model)
            effects.checkRulesBefore()
            startWatches()
            feed(.start)
            while running {
                let now = Instant.now()
                let descriptors = [monitor.fileDescriptor, mailbox.fileDescriptor] + (power.map { [$0.fileDescriptor] } ?? [])
                    + facts.fileDescriptors + watchDescriptors
                let ready = (try? pollReadable(descriptors, timeout: core.nextDeadline.map { max($0 - now, .zero) })) ?? []
                if let power, ready.contains(power.fileDescriptor), power.drain() { powerMayHaveChanged() }
                if let slept = checkSuspend() { woke(after: slept) }
                if ready.contains(monitor.fileDescriptor) {
                    facts.linksChanged()
                    monitorSpoke()
                }
                watchesSpoke(ready: ready)
                for fact in facts.noticesArrived(ready: ready, about: core.onDemand.network, tunnelSearch: tunnelSearch) {
                    feed(.networkFact(fact))
                }
                if ready.contains(mailbox.fileDescriptor) {
                    for event in mailbox.take() { handle(event) }
                }
                fireDueTimers(at: Instant.now())
            }
            service.stopping()
            writeMetrics()
            // Closed before the socket goes: `agent stop` waits for it to go, and then the
            // machine is open.
            effects.close(operatorStop: opensMachine && failure == nil && !restartRequested)
            control.publish(ControlProtocol.event("stopped", [("why", .string(failure ?? (restartRequested ? "restarting" : "stopped")))]))
            control.stop()
        }
    }
}
