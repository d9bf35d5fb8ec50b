import Topology
import Basics
import Connectivity
import ControlWire
import Diagnosis
import PathMonitor
import Settings
import SystemDNS

/// The doctor's look at the network beyond the gateway's probes: the connectivity check, the
/// system's resolvers, and what the running agent's status says of its MTU, its resolvers and
/// what others took away.
extension DoctorFacts {
    /// The agent's connectivity check over `path`, outside the tunnel, as the agent makes it;
    /// not made while a running agent's lockdown would stop it (its status says what it found).
    static func portal(_ settings: ClientSettings, via path: Path, mark: UInt32?, agent: AgentFact,
                       tables: Result<LoadedTables, DoctorError>) -> PortalFact {
        guard settings.reconnect.portalCheck else {
            return .notChecked("the configuration turns the connectivity check off ('portal: {check: off}')")
        }
        let via = "\(path.interface) (\(path.source))"
        if case .running(let status) = agent, case .success(let loaded) = tables, loaded.lockdown {
            return .notChecked("the lockdown lets only the running agent's own sockets out; its state (\(status.state)) says whether its check found a portal")
        }
        // Names looked up outside the tunnel: never through the resolvers the agent applied.
        let avoiding = if case .running(let status) = agent { (status.dns?.resolvers ?? []).compactMap(IPAddress.init) } else { [IPAddress]() }
        let answer: PortalAnswer = switch settings.portal.run(via: path, mark: mark, avoiding: avoiding) {
        case .online: .online
        case .portal(let login): .portal(login: login)
        case .unknown(let why): .unknown(why)
        }
        return .checked(url: settings.portal.url.text, via: via, answer)
    }

    /// resolv.conf's resolvers, read only while the agent applies its own through the file
    /// (systemd-resolved keeps a link's setting itself).
    static func systemResolvers(_ agent: AgentFact, file: String = "/etc/resolv.conf") -> SystemResolvers? {
        guard case .running(let status) = agent, status.dns?.manager == TunnelDNS.Manager.resolvConf.rawValue else { return nil }
        guard let bytes = SystemFiles.bytes(file, limit: 1 << 20) else {
            return SystemResolvers(file: file, nameservers: .failure(DoctorError("cannot read \(file)")))
        }
        return SystemResolvers(file: file, nameservers: .success(ResolvConfFile.nameservers(in: String(decoding: bytes, as: UTF8.self))))
    }

    /// `service` and, with the lockdown, the boot lockdown's unit, as `systemctl show` says them.
    static func units(_ service: String, lockdown: Bool) -> UnitFacts {
        let names = [service] + (lockdown ? [UnitFacts.lockdownUnit] : [])
        guard let systemctl = PortalCommand.find("systemctl", path: CommandOutput.path) else {
            return UnitFacts(service: service, lockdown: lockdown, states: .failure(DoctorError("systemctl is not installed")))
        }
        let text = CommandOutput.run(systemctl, ["systemctl", "show", "--property=" + UnitState.properties] + names,
                                     limit: 64 << 10, timeout: .seconds(5))
        guard let states = UnitState.parse(text) else {
            let said = text.split(separator: "\n").first.map(String.init) ?? "no output"
            return UnitFacts(service: service, lockdown: lockdown, states: .failure(DoctorError("systemctl cannot say: \(said)")))
        }
        return UnitFacts(service: service, lockdown: lockdown, states: .success(states))
    }

    /// The unit that runs the configuration at `path`, by the units' own convention (roam-client
    /// for /etc/roam/client.yaml, a profile's roam@NAME for /etc/roam/NAME.yaml); nil for a
    /// file elsewhere, which no unit of Roam's runs.
    static func serviceUnit(for path: String) -> String? {
        guard path.hasPrefix("/etc/roam/"), path.hasSuffix(".yaml") else { return nil }
        let name = path.dropFirst("/etc/roam/".count).dropLast(".yaml".count)
        guard !name.isEmpty, !name.contains("/") else { return nil }
        return name == "client" ? "roam-client.service" : "roam@\(name).service"
    }

    // MARK: The agent's status

    static func mtu(_ json: JSON?) -> AgentMTU? {
        guard let json, let tunnel = json["tunnel"]?.int, let configured = json["configured"]?.int, let floor = json["floor"]?.int
        else { return nil }
        return AgentMTU(tunnel: Int(clamping: tunnel), configured: Int(clamping: configured), floor: Int(clamping: floor),
                        searching: json["searching"]?.bool ?? false)
    }

    static func dns(_ json: JSON?) -> AgentDNS? {
        guard let json, let manager = json["manager"]?.string else { return nil }
        return AgentDNS(manager: manager, resolvers: (json["resolvers"]?.array ?? []).compactMap(\.string), problem: json["problem"]?.string)
    }

    static func upkeep(_ json: JSON?) -> [AgentUpkeep] {
        guard case .object(let holdings)? = json else { return [] }
        return holdings.map { holding, record in
            AgentUpkeep(holding: holding, restores: Int(clamping: record["restores"]?.int ?? 0), missing: record["missing"]?.string,
                        lastRemovedBy: record["last_removed_by"]?.string, heldOff: record["held_for_ms"]?.double != nil)
        }
    }
}
