import Foundation
@testable import Lockdown
import NamespaceLab
import Testing

@Test func theCgroup2FileSystemIsFoundInMountinfo() {
    let hybrid = """
        25 30 0:23 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
        27 25 0:25 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
        28 27 0:26 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
        29 27 0:27 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,xattr,name=systemd
        """
    #expect(CgroupFileSystem.cgroup2Mount(in: hybrid)! == ("/sys/fs/cgroup/unified", "/"))
    let container = "35 30 0:29 /system.slice/x\\040y.service /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n"
    #expect(CgroupFileSystem.cgroup2Mount(in: container)! == ("/sys/fs/cgroup", "/system.slice/x y.service"))
    #expect(CgroupFileSystem.cgroup2Mount(in: "25 30 0:23 / /sys rw - sysfs sysfs rw\n") == nil)
    #expect(PortalCgroup(directory: "/sys/fs/cgroup/unified/roam-portal.7.1", level: 1).nftablesPath == "unified/roam-portal.7.1")
    #expect(PortalCgroup(directory: "/run/roam/cgroup2/roam-portal.7.1", level: 1).nftablesPath == "../../../run/roam/cgroup2/roam-portal.7.1")
    // Where a process's cgroup (as /proc/PID/cgroup names it) lies under a mount.
    let system = CgroupFileSystem(point: "/sys/fs/cgroup", root: "/", mountedByUs: false)
    #expect(system.directory(of: "/user.slice/user-1000.slice/session-2.scope") == "/sys/fs/cgroup/user.slice/user-1000.slice/session-2.scope")
    #expect(system.directory(of: "/") == "/sys/fs/cgroup")
    let namespaced = CgroupFileSystem(point: "/sys/fs/cgroup", root: "/system.slice/roam.service", mountedByUs: false)
    #expect(namespaced.directory(of: "/system.slice/roam.service/x") == "/sys/fs/cgroup/x")
    #expect(namespaced.directory(of: "/user.slice") == nil)
}

/// The process is checked before the move and again after it: a process that changed in
/// between (its id taken by a stranger) goes back where it came from, and the join fails.
@Test func aProcessThatChangesWhileItMovesGoesBack() throws {
    let root = FileManager.default.temporaryDirectory.appendingPathComponent("roam-cgroup-\(UUID().uuidString)").path
    defer { try? FileManager.default.removeItem(atPath: root) }
    for directory in ["", "/home.scope", "/window"] {
        try FileManager.default.createDirectory(atPath: root + directory, withIntermediateDirectories: true)
        #expect(FileManager.default.createFile(atPath: root + directory + "/cgroup.procs", contents: nil))
    }
    func processes(_ directory: String) -> String { (try? String(contentsOfFile: root + directory + "/cgroup.procs", encoding: .utf8)) ?? "?" }
    let fs = CgroupFileSystem(point: root, root: "/", mountedByUs: false)
    var window = PortalCgroup(directory: root + "/window", level: 1)
    struct Changed: Error, CustomStringConvertible { var description: String { "process 4242 is gone (or is another process now)" } }

    // Refused before the move, in the check's own words: nothing moves.
    #expect(throws: CgroupError("process 4242 is gone (or is another process now)")) {
        try window.add(4242, from: "/home.scope", fs: fs) { throw Changed() }
    }
    #expect(processes("/window").isEmpty && window.returnTo == nil)

    // Moved in, and where it came from is kept for the close.
    try window.add(4242, from: "/home.scope", fs: fs) {}
    #expect(processes("/window") == "4242\n" && window.returnTo == root + "/home.scope")

    // The check passes before the move and fails after it: the stranger goes back at once.
    var checks = 0
    #expect(throws: CgroupError("process 4343 changed while it was moved into the portal window")) {
        try window.add(4343, from: "/home.scope", fs: fs) {
            checks += 1
            if checks > 1 { throw Changed() }
        }
    }
    #expect(checks == 2 && processes("/home.scope") == "4343\n")

    // A window whose first process came from a cgroup outside the mount has nowhere of the
    // asker's to send a stranger back to: it goes to the root, and the join fails all the same.
    var other = PortalCgroup(directory: root + "/window", level: 1)
    checks = 0
    #expect(throws: CgroupError("process 4444 changed while it was moved into the portal window")) {
        try other.add(4444, from: nil, fs: fs) {
            checks += 1
            if checks > 1 { throw Changed() }
        }
    }
    #expect(checks == 2 && other.returnTo == nil && processes("").hasSuffix("4444\n"))
}

/// A child started inside an excluded process goes back where its nearest ancestor that joined
/// came from; its parent's origin wins over a grandparent's; a walk ends at init, at a loop and
/// after a bounded number of steps.
@Test func aChildGoesBackWhereItsNearestJoinedAncestorCameFrom() {
    let parents: [Int32: Int32] = [300: 200, 200: 100, 100: 1, 400: 1, 500: 500, 600: 601, 601: 600]
    let origins: [Int32: String] = [100: "/user.slice/user-1000.slice/session-2.scope", 200: "/user.slice/user-1000.slice/app.scope"]
    func origin(_ pid: Int32) -> String? { PortalCgroup.origin(of: pid, in: origins, parent: { parents[$0] }) }
    #expect(origin(100) == origins[100] && origin(200) == origins[200])
    #expect(origin(300) == origins[200], "a grandchild goes where its parent came from")
    #expect(origin(400) == nil && origin(500) == nil && origin(600) == nil && origin(999) == nil)
    // A child of another user (a set-user-ID program) does not follow its parent into its cgroup.
    #expect(PortalCgroup.origin(of: 300, in: origins, parent: { parents[$0] }, same: { $0 != 200 }) == nil)
    #expect(PortalCgroup.origin(of: 200, in: origins, parent: { parents[$0] }, same: { _ in false }) == origins[200], "its own origin")
    // This process's own parent chain ends at init: a real /proc walk terminates.
    #expect(PortalCgroup.parent(getpid()) == getppid())
    #expect(PortalCgroup.user(of: getpid()) == getuid())
}

/// Each agent mounts the cgroup2 file system (when none is mounted) at a point of its own in the
/// runtime directory, never one another agent may use (one agent's end removes its point, and
/// removing a directory that is a mount point in another namespace takes that mount away
/// there), and only in a directory of root's own that nobody else may write to.
@Test(.enabled(if: NamespaceLab.isRoot, Comment(rawValue: NamespaceLab.skipReason)))
func eachAgentMountsAtAPointOfItsOwnInADirectoryOnlyRootWrites() throws {
    let runtime = FileManager.default.temporaryDirectory.appendingPathComponent("roam-runtime-\(UUID().uuidString)").path
    defer { try? FileManager.default.removeItem(atPath: runtime) }
    try FileManager.default.createDirectory(atPath: runtime, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o755])
    let first = try CgroupFileSystem.newMountPoint(in: runtime)
    let second = try CgroupFileSystem.newMountPoint(in: runtime)
    #expect(first != second && first.hasPrefix(runtime + "/cgroup2.\(getpid()).") && second.hasPrefix(runtime + "/cgroup2.\(getpid())."))
    var info = stat()
    #expect(lstat(first, &info) == 0 && (info.st_mode & S_IFMT) == S_IFDIR && info.st_mode & 0o777 == 0o700)
    for mode in [0o775, 0o757, 0o1777] {
        chmod(runtime, mode_t(mode))
        #expect(throws: CgroupError.self, "mode \(String(mode, radix: 8))") { try CgroupFileSystem.newMountPoint(in: runtime) }
    }
    chmod(runtime, 0o755)
    try FileManager.default.createSymbolicLink(atPath: runtime + "/link", withDestinationPath: runtime)
    #expect(throws: CgroupError.self, "a link") { try CgroupFileSystem.newMountPoint(in: runtime + "/link") }
}

/// libnftables resolves a rule's cgroup from /sys/fs/cgroup: a directory elsewhere is found
/// through the path the policy writes, one that went away is not.
@Test func nftablesFindsACgroupWhereverItIsMountedWhileItIsThere() throws {
    try #require(access("/sys/fs/cgroup", F_OK) == 0, "no /sys/fs/cgroup here")
    let directory = FileManager.default.temporaryDirectory.appendingPathComponent("roam-cgroup-\(UUID().uuidString)").path
    try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
    #expect(CgroupFileSystem.nftablesFinds(directory))
    try FileManager.default.removeItem(atPath: directory)
    #expect(!CgroupFileSystem.nftablesFinds(directory))
}
