import Control
import ControlWire
import Logging
import Observability
import ArgumentParser
import ConfigReader
import Glibc
import Basics
import Reconnector
import Synchronization
import Streams
import Tunnel
import Device
import Settings

/// `agent serve`: the server daemon.
struct ServeCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "serve",
        abstract: "Run the server: a TUN device with the server's inner address, and sessions for the configured users.",
        discussion: """
            Every user has a stable inner address. For internet access through the server, an admin adds \
            forwarding and NAT, e.g.: sysctl -w net.ipv4.ip_forward=1; nft add table ip roam; nft add chain \
            ip roam post '{ type nat hook postrouting priority 100; }'; nft add rule ip roam post ip saddr \
            10.77.0.0/16 oifname "eth0" masquerade. Traffic between clients goes through the kernel too: it \
            needs forwarding on, and a forward-chain rule such as iifname "roam0" oifname "roam0" drop forbids it. \
            The configuration must be 0600, owned by root or the user running the agent (it holds the users' \
            password hashes). Each session's inner addresses are routed to the server's TUN device while \
            the client is reachable here (host routes, for a second server on the same host or a routing \
            daemon to take over). With 'drain-period', SIGTERM first tells every session that this server \
            is being taken down, so clients with another server move there make-before-break; the server \
            stops when no session is left or the period ends. A second SIGTERM stops it at once. With \
            'users-from' (a PostgreSQL URL) in place of 'users', the users come from the fleet's directory: \
            read at start (or from the snapshot when the database cannot be reached), each change applied \
            as it commits, the last users kept while the database is away; SIGHUP reads it all again.
            """)

    @OptionGroup var daemon: DaemonOptions

    @Option(help: ArgumentHelp(
        "A control socket for `agent drain` and `agent status` (root's only), e.g. \(ServerControl.defaultPath); none unless given."))
    var control: String?

    func run() throws {
        // Before any thread starts: one that did not block them could take a signal (SIGHUP's
        // default ends the process).
        blockSignals([SIGINT, SIGTERM, SIGHUP])
        let log = daemon.log
        // Before any key or password is read: a crash must not write them into a core file.
        if !ProcessHardening.forbidCoreDumps() { log.warning("cannot make the process non-dumpable; a core dump could hold keys") }
        if let problem = CipherSelfTest.run() { throw AgentError("the data path's cipher failed its self-test: \(problem)") }
        // A mistake in the file is said first, whoever runs it.
        let configFile = try daemon.configFile(for: "serve")
        let (reader, root) = try YAMLReader.load(configFile, as: .serverConfiguration)
        let settings = try reader.server(root)
        try Preflight.requireNetworkAdmin(for: "serve")
        try Preflight.requireTunDriver()
        let key = try loadPrivateKey(settings.privateKeyFile)
        // The fleet's directory, when the users come from it: read now (or its snapshot), then followed.
        let directory = try settings.usersFrom.map { try DirectoryFollower($0, tunnel: settings.tunnel.addresses, log: log) }
        let core: ServerCore
        do {
            let users = try directory.map { try UserDatabase($0.users) } ?? settings.users
            core = try ServerCore(privateKey: key, users: users, dns: settings.dns, protocols: settings.protocols)
        } catch {
            throw AgentError("\(error)")
        }
        let tun: TunDevice
        var workers: [[UDPSocket]]
        do {
            tun = try TunDevice(name: settings.tunnel.name, mtu: settings.tunnel.mtu, addresses: settings.tunnel.addresses,
                                offload: settings.tunnel.offload, queues: settings.workers)
            workers = try UDPSocket.listening(on: SocketAddress(.v4(0), port: settings.listenPort), count: settings.workers,
                                              reportsDestination: true, joinsReceived: true).map { [$0] }
        } catch {
            throw AgentError("\(error)")
        }
        do {
            let v6 = try UDPSocket.listening(on: SocketAddress(.v6(0, 0), port: settings.listenPort), count: settings.workers,
                                             reportsDestination: true, joinsReceived: true)
            for (i, socket) in v6.enumerated() { workers[i].append(socket) }
        } catch {
            // A host without IPv6 still serves IPv4 clients.
            log.warning("no IPv6 listening socket", metadata: ["error": "\(error)"])
        }
        // The stream transport: TLS on TCP beside UDP, on the addresses given or every address of both families.
        let streams: StreamListener?
        if let stream = settings.stream {
            do {
                let context = try TLSContext.server(name: stream.name, certificate: stream.certificate)
                var addresses = [SocketAddress(.v4(0), port: stream.port)]
                if workers[0].count > 1 { addresses.append(SocketAddress(.v6(0, 0), port: stream.port)) }
                if let chosen = stream.addresses { addresses = chosen.map { SocketAddress($0, port: stream.port) } }
                streams = try StreamListener(on: addresses, context: context)
            } catch let error as StreamError {
                throw AgentError("'tcp': \(error)")
            } catch {
                throw AgentError("'tcp': cannot listen on TCP port \(stream.port): \(error)")
            }
        } else {
            streams = nil
        }
        var streamLimits = StreamLimits()
        if streams != nil {
            // Each stream is a descriptor: the soft limit (1,024 by default) goes up to the hard one,
            // and the streams take what that leaves after the gateway's own.
            let descriptors = Self.raiseOpenFileLimit()
            streamLimits = streamLimits.fitting(descriptors: descriptors)
            if streamLimits.connections < StreamLimits().connections {
                log.warning("fewer streams than the default: the open-file limit is low",
                            metadata: ["streams": "\(streamLimits.connections)", "open_files": "\(descriptors)"])
            }
        }
        let server = TunnelServer(core: core, device: tun, workers: workers, streams: streams, streamLimits: streamLimits,
                                  publishesRoutes: true, logger: log)
        let drainPeriod = settings.drainPeriod
        let stopping = Atomic<Bool>(false)
        /// Tells every session to move, then stops when none is left or `period` ends. Says how
        /// many sessions were live when it began (read before the first is told: one that moves
        /// at once would not be counted after), nil when a drain or a stop is under way already.
        @Sendable func drain(for period: Duration, why: String) -> Int? {
            guard !stopping.exchange(true, ordering: .relaxed) else { return nil }
            let sessions = server.liveSessions
            log.info("draining", metadata: ["sessions": "\(sessions)", "period": "\(period.short)", "why": "\(why)"])
            SystemdNotifier().notify("STOPPING=1\nSTATUS=draining")
            server.drain()
            do {
                try OSThread.detach {
                    let deadline = Instant.now() + period
                    while Instant.now() < deadline { usleep(100_000) }
                    log.info("stopping", metadata: ["why": "drain period over", "sessions": "\(server.liveSessions)"])
                    server.stop()
                }
            } catch {
                server.stop()
            }
            return sessions
        }
        /// SIGHUP: the users are read again and replaced; sessions of users listed as before stay.
        /// A file with a mistake changes nothing; other settings need a restart.
        @Sendable func reloadUsers() {
            if let directory {
                log.notice("reading the user directory again", metadata: ["why": "SIGHUP"])
                return directory.rereadAll()
            }
            let fresh: ServerSettings
            do {
                let (reader, root) = try YAMLReader.load(configFile, as: .serverConfiguration)
                fresh = try reader.server(root)
            } catch {
                return log.error("users not reloaded; the running ones stay", metadata: ["error": "\(error)"])
            }
            guard fresh.usersFrom == nil else {
                return log.error("users not reloaded: the file now takes its users from 'users-from'; restart to read them from there")
            }
            let before = server.userCount
            let ended = server.replaceUsers(fresh.users)
            log.notice("users reloaded", metadata: ["users": .stringConvertible(fresh.users.users.count), "before": .stringConvertible(before),
                                                    "sessions_ended": .stringConvertible(ended)])
            if !fresh.sameServer(as: settings) {
                log.warning("settings other than the users changed; they apply at the next restart")
            }
        }
        try forwardSignals([SIGINT, SIGTERM, SIGHUP]) { signal in
            if signal == SIGHUP { return reloadUsers() }
            // The first SIGTERM drains when a period is set; anything after it stops at once.
            guard signal == SIGTERM, drainPeriod > .zero, drain(for: drainPeriod, why: "SIGTERM") != nil else {
                stopping.store(true, ordering: .relaxed)
                log.info("stopping", metadata: ["signal": "\(signal)"])
                return server.stop()
            }
        }
        // After the signals are blocked, so its thread never takes one (their default ends the process).
        // Strong: the following thread may outlive this function's last use of the server.
        try directory?.follow({ users in server.replaceUsers(users) }, records: { server.records })
        var controlServer: ControlServer?
        if let control {
            // Answered on the control socket's own thread: everything read here is safe to read from any.
            let status = { @Sendable [unowned server] () -> JSON in
                let counts = server.streamCounts
                let streams = !server.servesStreams ? nil : ServerStatus.Streams(
                    port: Int(settings.stream?.port ?? 0), open: counts.open, accepted: counts.accepted, refused: counts.refused,
                    sessions: server.sessionsOnStreams)
                return ServerStatus(
                    sessions: server.liveSessions, draining: stopping.load(ordering: .relaxed), workers: server.workers.count,
                    offload: tun.offload.description, traffic: server.traffic, drops: server.drops, admissions: server.admissions,
                    users: server.userCount, streams: streams,
                    directory: directory.map { ServerStatus.Directory($0.figures, source: $0.source, now: Instant.now()) },
                    protocols: settings.protocols, sessionsByProtocol: server.sessionsByProtocol
                ).json
            }
            let served = try ControlServer(socket: try ControlSocket(path: control)) { call in
                switch call.command {
                case .status: call.reply(ControlProtocol.answer([("status", status())]))
                case .watch: call.reply(ControlProtocol.event("status", [("status", status())]), watch: true)
                case .drain:
                    let sessions = drain(for: drainPeriod > .zero ? drainPeriod : ServerControl.defaultDrainPeriod, why: "agent drain")
                    call.reply(ControlProtocol.answer([("message", .string(sessions.map { "draining \($0) sessions" } ?? "stopping already"))]))
                default:
                    call.reply(ControlFailure(code: "not-here", message: "a server answers status, watch and drain").line)
                }
            }
            try served.start()
            controlServer = served
        }
        if let address = settings.metricsListen {
            let metrics = ServerMetrics()
            do {
                let endpoint = try MetricsEndpoint(address) { [unowned server] dropped in metrics.scrape(server, endpoint: dropped, directory: directory?.figures) }
                try endpoint.start()
                log.info("metrics", metadata: ["url": "http://\(endpoint.listener.local)/metrics"])
            } catch {
                throw AgentError("cannot serve the metrics on \(address): \(error)")
            }
        }
        log.info("serving", metadata: ["port": "\(settings.listenPort)", "tcp_port": "\(settings.stream.map { "\($0.port)" } ?? "off")",
                                "tunnel": "\(tun.name)", "offload": "\(tun.offload.description)",
                                "workers": "\(server.workers.count)",
                                "protocols": "\(settings.protocols.versions.sorted().map(String.init).joined(separator: ","))",
                                "cipher": "\(settings.protocols.cipher.map(\.description) ?? "negotiated")",
                                "addresses": "\(settings.tunnel.addresses.map(\.description).joined(separator: ","))",
                                "public_key": "\(key.publicKey.base64)"])
        SystemdNotifier().notify("READY=1")
        server.run()
        directory?.stop()
        controlServer?.publish(ControlProtocol.event("stopped", [("why", .string("stopped"))]))
        controlServer?.stop()
        let traffic = server.traffic
        log.info("stopped", metadata: ["packets_in": "\(traffic.packetsIn)", "packets_out": "\(traffic.packetsOut)",
                                "initiations_overflowed": "\(traffic.initiationsOverflowed)", "super_packets": "\(traffic.superPackets)",
                                "super_packets_written": "\(traffic.superPacketsWritten)",
                                "offload_drops": "\(traffic.offloadDrops)", "drops": "\(server.drops.description)",
                                "admitted_general": "\(server.admissions.general)", "admitted_peer": "\(server.admissions.peer)"])
    }
}

extension ServeCommand {
    /// Raises the process's soft limit on open files to its hard limit; returns the soft limit now.
    static func raiseOpenFileLimit() -> Int {
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return 1_024 }
        if limit.rlim_cur < limit.rlim_max {
            var raised = limit
            raised.rlim_cur = limit.rlim_max
            if setrlimit(Int32(RLIMIT_NOFILE.rawValue), &raised) == 0 { limit = raised }
        }
        return Int(clamping: limit.rlim_cur)
    }
}

extension ServerSettings {
    /// The same server apart from its users: what a reload can leave running.
    func sameServer(as other: ServerSettings) -> Bool {
        listenPort == other.listenPort && privateKeyFile == other.privateKeyFile && tunnel == other.tunnel && dns == other.dns
            && drainPeriod == other.drainPeriod && workers == other.workers && metricsListen == other.metricsListen
            && usersFrom == other.usersFrom && stream == other.stream
    }
}

extension ServerStatus.Directory {
    /// A gateway's following of the user directory, for `agent status`.
    init(_ figures: DirectoryFigures, source: UserSource, now: Instant) {
        self.init(reachable: figures.reachable, origin: figures.origin, duration: now - figures.since, users: figures.users,
                  refused: figures.refused, changes: figures.changes, reconnects: figures.reconnects,
                  lastChange: figures.lastChange.map { now - $0 }, error: figures.error, snapshot: source.snapshot,
                  snapshotWritten: figures.snapshotWritten.map { now - $0 }, snapshotError: figures.snapshotError, gateway: source.gateway)
    }
}
