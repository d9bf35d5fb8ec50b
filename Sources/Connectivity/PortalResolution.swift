public import Basics
import CShims
import Glibc
import SystemDNS

/// How the portal window's program resolves names. The window lets DNS through only to the
/// network's own resolvers, and only from the window's processes; a machine whose look-ups go
/// through a local resolver (systemd-resolved's stub at 127.0.0.53 or its NSS module, dnsmasq)
/// or to the tunnel's resolvers would send the program's look-ups where the portal holds them.
/// So the program runs in a mount namespace of its own, where /etc/resolv.conf names the
/// network's resolvers and /etc/nsswitch.conf has the C library ask them itself.
public enum PortalResolution {
    /// The files the window's program should see instead of the system's: nil when the system's
    /// already send its look-ups to `resolvers` alone.
    public static func plan(resolvers: [IPAddress], resolvConf: String, nsswitch: String?) -> (resolvConf: String, nsswitch: String?)? {
        guard !resolvers.isEmpty else { return nil }
        let asked = ResolvConf(resolvConf).nameservers
        let hosts = nsswitch.flatMap(hostsSources)
        let throughResolved = hosts?.contains { $0 == "resolve" } == true
        guard throughResolved || !asked.allSatisfy(resolvers.contains) else { return nil }
        let conf = "# The portal window's resolvers: the network's own.\n"
            + resolvers.prefix(3).map { "nameserver \($0)\n" }.joined() + "options timeout:2 attempts:2\n"
        var switched: String?
        if throughResolved, let nsswitch {
            switched = nsswitch.split(separator: "\n", omittingEmptySubsequences: false).map { line in
                line.hasPrefix("hosts:") ? "hosts: files dns" : String(line)
            }.joined(separator: "\n")
        }
        return (conf, switched)
    }

    /// The sources on nsswitch.conf's `hosts:` line, without their `[action]`s.
    static func hostsSources(_ text: String) -> [String]? {
        for line in text.split(whereSeparator: \.isNewline) where line.hasPrefix("hosts:") {
            return line.dropFirst("hosts:".count).prefix { $0 != "#" }.split(whereSeparator: { $0 == " " || $0 == "\t" })
                .filter { !$0.hasPrefix("[") && !$0.hasSuffix("]") }.map(String.init)
        }
        return nil
    }

    /// Puts this process (and what it starts after) in a mount namespace of its own where the
    /// plan's files stand in for /etc/resolv.conf and /etc/nsswitch.conf. Root needs only the
    /// mount namespace; anyone else gets a user namespace that maps them to themselves. Must be
    /// called while the process has one thread (the kernel refuses a user namespace otherwise).
    public static func isolate(resolvConf: String, nsswitch: String?) throws(PortalResolutionError) {
        var template = Array("/tmp/roam-portal-XXXXXX".utf8CString)
        guard let made = mkdtemp(&template) else { throw PortalResolutionError("cannot make a directory in /tmp: \(String(cString: strerror(errno)))") }
        let directory = String(cString: made)
        // The bind mounts keep the files; their names can go now.
        defer {
            unlink(directory + "/resolv.conf")
            unlink(directory + "/nsswitch.conf")
            rmdir(directory)
        }
        var files = [("resolv.conf", resolvConf)]
        if let nsswitch { files.append(("nsswitch.conf", nsswitch)) }
        for (name, text) in files { try write(text, to: directory + "/" + name, create: true) }

        let uid = getuid(), gid = getgid()
        if uid == 0 {
            guard CShims_unshare_mounts(0) == 0 else { throw failure("unshare(CLONE_NEWNS)") }
        } else {
            guard CShims_unshare_mounts(1) == 0 else { throw failure("unshare(CLONE_NEWUSER|CLONE_NEWNS)") }
            try write("deny", to: "/proc/self/setgroups")
            try write("\(uid) \(uid) 1", to: "/proc/self/uid_map")
            try write("\(gid) \(gid) 1", to: "/proc/self/gid_map")
        }
        guard mount(nil, "/", nil, UInt(MS_REC | MS_PRIVATE), nil) == 0 else { throw failure("make / private") }
        for (name, _) in files {
            guard mount(directory + "/" + name, "/etc/" + name, nil, UInt(MS_BIND), nil) == 0 else {
                throw failure("bind \(directory)/\(name) over /etc/\(name)")
            }
        }
    }

    private static func write(_ text: String, to path: String, create: Bool = false) throws(PortalResolutionError) {
        if let code = SystemFiles.overwrite(text, at: path, create: create) {
            throw PortalResolutionError("cannot write \(path): \(String(cString: strerror(code)))")
        }
    }

    private static func failure(_ what: String) -> PortalResolutionError {
        PortalResolutionError("cannot \(what): \(String(cString: strerror(errno)))")
    }
}

/// The portal window's program could not be given the network's resolvers, said in one line.
public struct PortalResolutionError: Error, Equatable, Sendable, CustomStringConvertible {
    public var message: String
    public init(_ message: String) { self.message = message }
    public var description: String { message }
}
