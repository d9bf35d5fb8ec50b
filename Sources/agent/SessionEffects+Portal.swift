import Topology
import Control
import ControlWire
import Logging
import Lockdown
import Basics
import PathMonitor
import Reconnector
import SystemDNS
import Tunnel

/// The portal window: its cgroup, and its opening in the lockdown.
extension SessionEffects {
    /// Moves `peer` into the open portal window's cgroup.
    func joinPortalWindow(_ peer: PeerProcess) throws(AgentError) {
        guard var cgroup = portalCgroup, let cgroups else { throw AgentError("no portal window is open") }
        do throws(CgroupError) {
            try cgroup.add(peer.pid, from: peer.cgroup, fs: cgroups) { try peer.verify() }
        } catch {
            throw AgentError(error.message)
        }
        portalCgroup = cgroup
    }

    /// Makes the portal window's cgroup (where `agent portal` puts its process) and lets it
    /// through the lockdown on `path`: DNS to the network's own resolvers (those the system named
    /// before the tunnel's, else the uplink's gateway), HTTP and HTTPS, and the login page's port.
    /// Returns whether the window is open; when not (logged), no cgroup is left.
    func openPortalWindow(via path: Path, portal url: String, runtimeDirectory: String) -> Bool {
        guard let firewall else {
            log.error("cannot open the portal window", metadata: ["error": "no lockdown"])
            return false
        }
        let cgroup: PortalCgroup
        do throws(CgroupError) {
            let found = if let cgroups { cgroups } else { try CgroupFileSystem.find(runtimeDirectory: runtimeDirectory) }
            cgroups = found
            windows += 1
            cgroup = try PortalCgroup.make(in: found, number: windows)
        } catch {
            log.error("cannot open the portal window", metadata: ["error": "\(error.message)"])
            return false
        }
        portalCgroup = cgroup
        var resolvers = networkResolvers()
        if resolvers.isEmpty, let gateway = path.gateway { resolvers = [gateway] }
        var window = LockdownPolicy.PortalWindow(cgroup: cgroup.nftablesPath, level: cgroup.level, interface: path.interface,
                                                 resolvers: resolvers)
        if let (host, port) = Self.hostAndPort(of: url), port != 80 && port != 443 {
            // The network chose this port: only to the login page's own address, or, for a
            // name (its address is the network's resolver's to give), only an unprivileged port.
            if let address = IPAddress(host) {
                window.login = .init(address: address, port: port)
            } else if port >= 1024 {
                window.login = .init(address: nil, port: port)
            } else {
                log.warning("the login page's port is not let through the portal window", metadata: ["port": "\(port)", "url": "\(url)"])
            }
        }
        do {
            try firewall.portalWindow(window)
            portalWindow = window
            log.notice("portal window open", metadata: ["path": "\(path.interface)", "resolvers": "\(resolvers.map(\.description).joined(separator: ","))",
                                                        "cgroup": "\(cgroup.directory)"])
            return true
        } catch {
            log.error("cannot open the portal window", metadata: ["error": "\(error)"])
            closePortalWindow()
            return false
        }
    }

    /// The host and the TCP port a login page's URL names, when it names a port
    /// (`http://10.0.0.1:8080/login`).
    static func hostAndPort(of url: String) -> (String, UInt16)? {
        guard let scheme = url.firstRange(of: "://") else { return nil }
        let authority = url[scheme.upperBound...].prefix { $0 != "/" && $0 != "?" && $0 != "#" }
        guard let endpoint = Endpoint(String(authority)), let port = endpoint.port else { return nil }
        return (endpoint.host, port)
    }

    /// The lockdown is whole again, and the window's processes go back to their own cgroup,
    /// which is removed: a rule for it, should nftables refuse the closing (it is tried again
    /// every second), matches no socket any more.
    func closePortalWindow() {
        if portalWindow != nil {
            portalWindow = nil
            do {
                try firewall?.portalWindow(nil)
                log.notice("portal window closed")
            } catch {
                log.error("cannot take the portal window out of the lockdown; trying again every second", metadata: ["error": "\(error)"])
            }
        }
        if let cgroup = portalCgroup, let cgroups {
            if let error = cgroup.close(fs: cgroups) {
                log.error("the portal window's cgroup stays", metadata: ["error": "\(error)",
                    "lockdown": "\((firewall?.refusals ?? 0) == 0 ? "closed to it" : "closing it is tried again every second")"])
            }
            portalCgroup = nil
        }
    }
}
