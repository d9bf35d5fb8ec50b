import SystemDNS
import Logging
import PathMonitor
import Tunnel

/// Follows a server named by host: on a new path the name may resolve elsewhere (split-horizon
/// DNS), and a server that stopped answering may have moved. One lookup at a time, off the
/// deciding thread; asks made meanwhile are folded into one more.
struct ServerFollower {
    /// The name; nil for a literal address, which never moves.
    let host: String?
    /// The session's mark (full mode): lookups go past the lockdown and the tunnel's routes.
    let mark: UInt32?
    private var resolving = false
    private var resolveAgain = false

    init(_ server: Endpoint, mark: UInt32?) {
        host = server.address == nil ? server.host : nil
        self.mark = mark
    }

    /// Starts a lookup, whose result comes back through `post`; `avoiding` names the tunnel's
    /// own resolvers, which cannot answer while it is down.
    mutating func ask(avoiding: [IPAddress], post: @escaping @Sendable (Result<[IPAddress], ResolverError>) -> Void) throws {
        guard let host else { return }
        guard !resolving else { resolveAgain = true; return }
        resolving = true
        let mark = mark
        do {
            try OSThread.detach {
                post(Result { () throws(ResolverError) in try Resolver.addresses(of: host, mark: mark, avoiding: avoiding) })
            }
        } catch {
            resolving = false
            throw error
        }
    }

    /// A lookup finished; true when another was asked for meanwhile and should start now.
    mutating func finished() -> Bool {
        resolving = false
        defer { resolveAgain = false }
        return resolveAgain
    }
}

/// A server of the client's list with the addresses its name gave (its own, for a literal
/// address), those the tunnel's routes would carry left out.
struct ResolvedServer {
    let entry: ServerEntry
    var addresses: [IPAddress]

    /// The address the session uses: the first.
    var socketAddress: SocketAddress? {
        addresses.first.flatMap { address in entry.endpoint.port.map { SocketAddress(address, port: $0) } }
    }

    /// One look-up of `entry`'s name (none for a literal address); no answer is logged and gives
    /// no address, for another look-up later.
    static func lookUp(_ entry: ServerEntry, mark: UInt32?, log: Logger) -> [IPAddress] {
        if let address = entry.endpoint.address { return [address] }
        do {
            return try Resolver.addresses(of: entry.endpoint.host, mark: mark)
        } catch {
            log.warning("cannot resolve a server's name; asking again when it is needed",
                metadata: ["server": "\(entry.name)", "error": "\(error)"])
            return []
        }
    }
}
