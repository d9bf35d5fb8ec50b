import Glibc

/// What only one agent on a machine (a network namespace) may hold at a time: the full tunnel
/// (the default route) and the lockdown firewall (one nftables table). Profiles (`roam@NAME`) may run side by side; the
/// first to claim these holds them, and a second is refused with the holder's name. The claim is
/// an advisory lock on a file in the runtime directory, let go by the kernel when the process
/// ends however it ends, so a crash never leaves it taken.
final class MachineClaim {
    private let fd: Int32

    private init(fd: Int32) { self.fd = fd }

    deinit { close(fd) }

    /// Takes the claim for `holder` (the configuration file), or says who has it.
    static func take(in directory: String, holder: String, wants: String) throws -> MachineClaim {
        let path = file(in: directory)
        mkdir(directory, 0o700)
        let fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard fd >= 0 else { throw AgentError("cannot open \(path): \(String(cString: strerror(errno)))") }
        guard flock(fd, LOCK_EX | LOCK_NB) == 0 else {
            let other = holderName(fd) ?? "another agent"
            close(fd)
            throw AgentError("\(wants) is held by the agent running \(other): only one profile at a time may have the full "
                + "tunnel or the lockdown; stop that one first, or give this one 'mode: split' and 'lockdown: off'")
        }
        _ = ftruncate(fd, 0)
        let bytes = Array(holder.utf8)
        _ = pwrite(fd, bytes, bytes.count, 0)
        return MachineClaim(fd: fd)
    }

    /// Whether another running agent holds the claim now.
    static func isHeld(in directory: String) -> Bool {
        let fd = open(file(in: directory), O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        return flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK
    }

    /// The holder's name as written in the claim file.
    private static func holderName(_ fd: Int32) -> String? {
        var buffer = [UInt8](repeating: 0, count: 1024)
        let n = pread(fd, &buffer, buffer.count, 0)
        return n > 0 ? String(decoding: buffer[0..<n], as: UTF8.self) : nil
    }

    /// One file per network namespace: agents in different ones hold different routes and tables.
    private static func file(in directory: String) -> String {
        var info = stat()
        let namespace = stat("/proc/self/ns/net", &info) == 0 ? "-\(info.st_ino)" : ""
        return (directory.isEmpty ? "." : directory) + "/exclusive\(namespace).lock"
    }
}
