import Topology
import ArgumentParser
import Basics
import ConfigReader
import Control
import ControlWire
import Device
import Diagnosis
import Glibc
import Lockdown
import Netlink
import PathMonitor
import Settings
import Streams
import Synchronization
import SystemDNS
import Tunnel

/// What `agent doctor` looks at, gathered at the edge: the clock, the agent, the kernel's
/// links, routes and rules, nftables, resolv.conf and the connectivity check.
extension DoctorFacts {
    /// Looks at the machine, the network and the agent for `settings`, read from `configuration`
    /// and run by `unit` (nil: the unit the path names).
    static func gather(_ settings: ClientSettings, configuration: String, unit: String?, control: String) -> DoctorFacts {
        // Without root the mark, nftables and the key cannot be used: the checks that need them say so.
        let privileged = Preflight.hasNetworkAdmin(processStatus: SystemFiles.text("/proc/self/status") ?? "")
        let mark = privileged ? settings.mode.socketMark : nil
        let model = try? Self.network(tunnel: settings.tunnel.name)
        let lockdown = privileged ? try? Lockdown() : nil
        // The key and the credentials, as `agent up` reads them: a version 2 gateway refuses a
        // password user's handshake without them.
        let key: Result<(PrivateKey, Credentials?), DoctorError> = Result { (try loadPrivateKey(settings.privateKeyFile), try UpCommand.credentials(settings)) }
            .mapError { DoctorError("the private key or the password cannot be read: \($0)") }
        let agent = Self.agent(at: control)
        // Read first, before the probes take seconds: what the agent said and what the file says
        // are of the same moment.
        let systemResolvers = Self.systemResolvers(agent)
        // A version 2 handshake the gateway accepts takes the place of a rekey the running agent
        // may have in flight, and moves the timestamps it checks: with an agent running, the
        // doctor sends none (version 3's first message leaves the gateway's state alone).
        let quiet: String? = if settings.protocolVersion == 2, case .running = agent {
            "with protocol 2, a handshake would disturb the running agent's session on the gateway; its status says how the gateway answers"
        } else {
            nil
        }
        var servers: [ServerFacts] = []
        for entry in settings.servers {
            servers.append(Self.server(entry, settings: settings, model: model, mark: mark, key: key, lockdown: lockdown, quiet: quiet))
        }
        let tables = Self.tables(lockdown)
        var facts = DoctorFacts(
            clock: Self.clock(), agent: agent, servers: servers,
            lockdown: LockdownFacts(configured: settings.lockdown, tables: tables),
            rules: Result { () throws(NetlinkError) in try NetlinkSocket().rules() }.mapError { DoctorError("cannot read the policy rules: \($0)") },
            mode: settings.mode, uplinks: model.map(Self.uplinks) ?? [], defaultRoutes: model.map(Self.defaultRoutes) ?? [])
        // The uplink the kernel takes to the first server it routes: the agent's best path.
        if let best = servers.lazy.flatMap(\.routes).first(where: { !$0.paths.isEmpty })?.paths[0] {
            facts.pathMTU = PathMTUFacts(configured: settings.tunnel.mtu, uplink: best.interface, uplinkMTU: best.mtu,
                                         overhead: Path.tunnelOverhead(from: best.source))
            facts.portal = Self.portal(settings, via: best, mark: mark, agent: agent, tables: tables)
        }
        facts.systemResolvers = systemResolvers
        facts.units = (unit ?? Self.serviceUnit(for: configuration)).map { Self.units($0, lockdown: settings.lockdown) }
        return facts
    }

    static func clock() -> WallClock {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        return WallClock(unixSeconds: Int64(ts.tv_sec), text: wallClock(ago: .zero))
    }

    static func agent(at socket: String) -> AgentFact {
        guard access(socket, F_OK) == 0 else { return .notRunning(socket: socket) }
        do {
            let answer = try ControlClient.ask(.status, at: socket)
            guard let status = answer["status"] else { return .unanswered(socket: socket, why: "no status in \(answer.text)") }
            let path = status["path"].flatMap { path -> String? in
                guard let interface = path["interface"]?.string else { return nil }
                return interface + (path["source"]?.string.map { " from \($0)" } ?? "") + (path["transport"]?.string.map { " over \($0)" } ?? "")
            }
            let server = status["server"].flatMap { server in
                server["name"]?.string.map { $0 + (server["address"]?.string.map { " (\($0))" } ?? "") }
            }
            let transition = status["last_transition"]
            return .running(AgentStatus(state: status["state"]?.string ?? "unknown", server: server, path: path,
                                        reason: transition?["reason"]?.string, since: transition?["at"]?.string,
                                        portal: status["portal"]?["url"]?.string, mtu: Self.mtu(status["mtu"]),
                                        dns: Self.dns(status["dns"]), upkeep: Self.upkeep(status["upkeep"])))
        } catch {
            return .unanswered(socket: socket, why: "\(error)")
        }
    }

    /// The kernel's links, addresses and routes now, from one dump.
    static func network(tunnel: String) throws(NetlinkError) -> NetworkModel {
        var decoder = NetlinkDecoder()
        var model = NetworkModel(tunnelInterface: tunnel)
        for change in try NetlinkSocket().dump(decoder: &decoder) { model.apply(LinkClassifier.refine(change)) }
        return model
    }

    static func uplinks(_ model: NetworkModel) -> [Uplink] {
        model.links.values.filter { $0.kind != .loopback && $0.kind != .tunnel && $0.name != model.tunnelInterface }
            .sorted { $0.index < $1.index }
            .map { Uplink(name: $0.name, isUp: $0.isUp, hasCarrier: $0.hasCarrier, addresses: model.usableAddresses(on: $0.index)) }
    }

    static func defaultRoutes(_ model: NetworkModel) -> [String] {
        model.routes.values.filter { $0.table == Route.mainTable && $0.destination.length == 0 && $0.type == .unicast }
            .flatMap { route in
                route.nextHops.map { hop in
                    "default" + (hop.gateway.map { " via \($0)" } ?? "") + " dev \(model.links[hop.linkIndex]?.name ?? "if\(hop.linkIndex)") metric \(route.metric)"
                }
            }.sorted()
    }

    static func tables(_ lockdown: Lockdown?) -> Result<LoadedTables, DoctorError> {
        guard let lockdown else { return .failure(DoctorError("nftables cannot be read without root (or CAP_NET_ADMIN)")) }
        do {
            return .success(LoadedTables(lockdown: try lockdown.isInstalled(), guarded: try lockdown.isInstalled(LockdownPolicy.guardTable),
                                         boot: try lockdown.isInstalled(LockdownPolicy.bootGuardTable)))
        } catch {
            return .failure(DoctorError("\(error)"))
        }
    }

    /// What the lockdown has stopped so far, all causes; nil without one to read.
    static func stopped(_ lockdown: Lockdown?) -> UInt64? {
        (try? lockdown?.counters()).map { $0.values.reduce(0, +) }
    }

    /// Packets the lockdown stopped since it counted `before`.
    static func increase(since before: UInt64?, _ lockdown: Lockdown?) -> UInt64 {
        guard let before, let after = stopped(lockdown), after > before else { return 0 }
        return after - before
    }
}
