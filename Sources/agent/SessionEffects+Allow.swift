import Topology
import Basics
import Device
import Lockdown
import Logging
import Reconnector

/// What the lockdown lets the session's sockets reach: the servers' addresses the core allows,
/// and the proxy's on each network.
extension SessionEffects {
    /// Opens the lockdown to exactly `lockdown`, each server's addresses the core allows
    /// (`ServerBook.allowed`), beside the one in use; false, with the old ones kept, when it
    /// cannot.
    func allow(_ lockdown: [[IPAddress]]) -> Bool {
        let before = servers.map(\.addresses)
        for (index, addresses) in lockdown.enumerated() where servers.indices.contains(index) { servers[index].addresses = addresses }
        do {
            try openLockdown()
        } catch {
            log.error("cannot open the lockdown firewall to the server's new address; keeping the old ones",
                      metadata: ["error": "\(error)"])
            for (index, addresses) in before.enumerated() { servers[index].addresses = addresses }
            return false
        }
        return true
    }

    /// Streams go through the proxy at each network's address in `addresses`, once the lockdown
    /// lets the streams reach exactly those; `opening` names the network whose address is new.
    /// False, with what was there kept, when the lockdown cannot open to it; a closing (nil) is
    /// kept wanted and tried again by the firewall, and no stream goes to an address that left.
    func proxyAt(_ addresses: [NetworkKey: IPAddress], opening: NetworkKey?) -> Bool {
        let lockdown = Array(Set(addresses.values)).sorted { $0.description < $1.description }
        do {
            try firewall?.proxyAt(lockdown, closing: opening == nil)
        } catch {
            guard let opening else {
                log.error("cannot take the proxy's old addresses out of the lockdown; tried again", metadata: ["error": "\(error)"])
                proxyAt = addresses
                return false
            }
            log.error("cannot open the lockdown firewall to the proxy's address; its streams stay closed on that network",
                      metadata: ["network": "\(opening)", "proxy": "\(addresses[opening].map { "\($0)" } ?? "-")", "error": "\(error)"])
            return false
        }
        proxyAt = addresses
        if let opening, let address = addresses[opening] {
            log.info("proxy found", metadata: ["network": "\(opening)", "proxy": "\(SocketAddress(address, port: proxy?.address.port ?? 0))"])
        }
        return true
    }

    /// Lets the session's UDP through the lockdown to every address of every server, and to
    /// the one in use.
    func openLockdown() throws(LockdownError) {
        try firewall?.serve(([server] + servers.flatMap(\.socketAddresses)).map(LockdownPolicy.Server.init))
    }
}
