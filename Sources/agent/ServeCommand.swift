import ArgumentParser
import ConfigReader
import Glibc
import PathMonitor
import Synchronization
import Tunnel

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
            stops when no session is left or the period ends. A second SIGTERM stops it at once.
            """)

    @OptionGroup var daemon: DaemonOptions

    func run() throws {
        let log = daemon.log
        // Before any key or password is read: a crash must not write them into a core file.
        if !ProcessHardening.forbidCoreDumps() { log("warning", "cannot make the process non-dumpable; a core dump could hold keys") }
        try Preflight.requireNetworkAdmin(for: "serve")
        let (reader, root) = try YAMLReader.load(daemon.config, as: .serverConfiguration)
        let settings = try reader.server(root)
        try Preflight.requireTunDriver()
        let key = try loadPrivateKey(settings.privateKeyFile)
        let core: ServerCore
        do { core = try ServerCore(privateKey: key, users: settings.users, dns: settings.dns) } catch { throw AgentError("\(error)") }
        let tun: TunDevice
        var sockets: [UDPSocket] = []
        do {
            tun = try TunDevice(name: settings.tunnel.name, mtu: settings.tunnel.mtu, addresses: settings.tunnel.addresses,
                                offload: settings.tunnel.offload)
            sockets.append(try UDPSocket(bindingTo: SocketAddress(.v4(0), port: settings.listenPort), reportsDestination: true,
                                         joinsReceived: true))
        } catch {
            throw AgentError("\(error)")
        }
        do {
            sockets.append(try UDPSocket(bindingTo: SocketAddress(.v6(0, 0), port: settings.listenPort), reportsDestination: true,
                                         joinsReceived: true))
        } catch {
            // A host without IPv6 still serves IPv4 clients.
            log("warning", "no IPv6 listening socket", ["error": "\(error)"])
        }
        let server = TunnelServer(core: core, device: tun, sockets: sockets, publishesRoutes: true) { message in log("info", message) }
        let drainPeriod = settings.drainPeriod
        let stopping = Atomic<Bool>(false)
        try forwardSignals([SIGINT, SIGTERM]) { signal in
            // The first SIGTERM drains when a period is set; anything after it stops at once.
            guard signal == SIGTERM, drainPeriod > .zero, !stopping.exchange(true, ordering: .relaxed) else {
                log("info", "stopping", ["signal": "\(signal)"])
                return server.stop()
            }
            log("info", "draining", ["sessions": "\(server.liveSessions)", "period": drainPeriod.short])
            SystemdNotifier().notify("STOPPING=1\nSTATUS=draining")
            server.drain()
            do {
                try OSThread.detach {
                    let deadline = Instant.now() + drainPeriod
                    while Instant.now() < deadline { usleep(100_000) }
                    log("info", "stopping", ["why": "drain period over", "sessions": "\(server.liveSessions)"])
                    server.stop()
                }
            } catch {
                server.stop()
            }
        }
        log("info", "serving", ["port": "\(settings.listenPort)", "tunnel": tun.name, "offload": tun.offload.description,
                                "addresses": settings.tunnel.addresses.map(\.description).joined(separator: ","),
                                "public_key": key.publicKey.base64])
        SystemdNotifier().notify("READY=1")
        server.run()
        let traffic = server.traffic
        log("info", "stopped", ["packets_in": "\(traffic.packetsIn)", "packets_out": "\(traffic.packetsOut)",
                                "initiations_overflowed": "\(traffic.initiationsOverflowed)", "super_packets": "\(traffic.superPackets)",
                                "super_packets_written": "\(traffic.superPacketsWritten)",
                                "offload_drops": "\(traffic.offloadDrops)", "drops": server.drops.description])
    }
}
