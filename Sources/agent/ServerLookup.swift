import SystemDNS
import Logging
import Basics
import Tunnel
import Device
import Settings

/// Looks server names up for the core (`Effect.lookUpServer`), each on a thread of its own, so
/// the deciding thread never waits for a resolver; the core asks for one at a time.
enum ServerLookup {
    /// Starts a look-up of `host`, whose result comes back through `post`. `mark` is the
    /// session's (full mode): look-ups go past the lockdown and the tunnel's routes; `avoiding`
    /// names the tunnel's own resolvers, which cannot answer while it is down.
    /// `device`: the queries go out over that interface alone (full mode).
    static func start(_ host: String, mark: UInt32?, avoiding: [IPAddress], device: String? = nil,
                      post: @escaping @Sendable (Result<[IPAddress], ResolverError>) -> Void) throws {
        try OSThread.detach {
            post(Result { () throws(ResolverError) in try Resolver.addresses(of: host, mark: mark, avoiding: avoiding, device: device) })
        }
    }
}

/// A server of the client's list with the addresses its name gave (its own, for a literal
/// address): at start every one, for the core to judge; then those the core allows.
struct ResolvedServer {
    let entry: ServerEntry
    var addresses: [IPAddress]

    /// Every address with the server's port.
    var socketAddresses: [SocketAddress] {
        guard let port = entry.endpoint.port else { return [] }
        return addresses.map { SocketAddress($0, port: port) }
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
