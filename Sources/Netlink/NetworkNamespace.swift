import Topology
import CShims
import Glibc

/// A named network namespace (`ip netns add NAME`) in which sockets can be opened without
/// moving the process: the socket stays in the namespace it was created in.
public final class NetworkNamespace: Sendable {
    public let name: String
    private let fd: Int32

    public init(named name: String) throws(NetlinkError) {
        guard !name.isEmpty, !name.contains("/") else { throw NetlinkError("open namespace '\(name)'", EINVAL) }
        let fd = open("/var/run/netns/\(name)", O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw NetlinkError("open namespace '\(name)'", errno) }
        self.name = name
        self.fd = fd
    }

    deinit { close(fd) }

    /// Runs `body` with the calling thread inside the namespace, then moves it back. `body`
    /// must not suspend: only this thread changes namespace.
    public func run<T>(_ body: () throws(NetlinkError) -> T) throws(NetlinkError) -> T {
        let home = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC)
        guard home >= 0 else { throw NetlinkError("open own namespace", errno) }
        defer { close(home) }
        guard CShims_setns_net(fd) == 0 else { throw NetlinkError("enter namespace '\(name)'", errno) }
        let result: Result<T, NetlinkError>
        do throws(NetlinkError) { result = .success(try body()) } catch { result = .failure(error) }
        guard CShims_setns_net(home) == 0 else {
            // A thread stranded in another namespace would send every later socket there.
            fatalError("cannot return to the original network namespace: errno \(errno)")
        }
        return try result.get()
    }
}
