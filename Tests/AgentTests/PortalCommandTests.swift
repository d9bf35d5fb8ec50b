import Glibc
import Testing
@testable import Control
@testable import ControlWire
@testable import agent

/// Only a process whose every id is the asker's joins a window: not one that became a
/// set-user-ID program since it connected.
@Test func aPortalWindowTakesOnlyTheAskersOwnProcess() {
    let own = "Name:\tfirefox\nUid:\t1000\t1000\t1000\t1000\nGid:\t1000\t1000\t1000\t1000\n"
    #expect(PeerProcess.idsAll(in: own, uid: 1000, gid: 1000))
    let setuid = "Name:\tsu\nUid:\t1000\t0\t0\t0\nGid:\t1000\t1000\t1000\t1000\n"
    #expect(!PeerProcess.idsAll(in: setuid, uid: 1000, gid: 1000))
    #expect(!PeerProcess.idsAll(in: "Name:\tx\n", uid: 1000, gid: 1000), "no ids read: refused")
    let me = PeerProcess(pid: getpid(), uid: getuid(), gid: getgid())
    #expect(me.started != nil && me.cgroup != nil)
    #expect(throws: ControlError.self) { try me.verify() }  // the agent's own process never joins
    #expect(throws: ControlError.self) { try PeerProcess(pid: 1, uid: 0, gid: 0).verify() }
    var gone = PeerProcess(pid: getppid(), uid: getuid(), gid: getgid())
    gone.started = 1
    #expect(throws: ControlError.self) { try gone.verify() }  // another process under a reused id
}

@Test func theRunCommandIsFoundBeforeAnyWindowOpens() {
    #expect(PortalCommand.find("sh", path: "/nonexistent:/bin:/usr/bin") != nil)
    #expect(PortalCommand.find("no-such-browser-anywhere", path: "/bin:/usr/bin") == nil)
    #expect(PortalCommand.find("/bin", path: nil) == nil, "a directory is no program")
    #expect(PortalCommand.find("/bin/sh", path: nil) == "/bin/sh")
}
