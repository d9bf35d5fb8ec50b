import Foundation
import Glibc
import Testing
@testable import SystemDNS
import Tunnel

/// The watch over resolv.conf, on real files in a scratch directory: /etc/resolv.conf as a link
/// to a resolver's file in another directory, as systemd-resolved and NetworkManager lay it out.
@Suite struct ResolvConfWatchTests {
    let etc: String
    let run: String
    var link: String { etc + "/resolv.conf" }
    var target: String { run + "/stub-resolv.conf" }

    init() throws {
        let base = FileManager.default.temporaryDirectory.appendingPathComponent("roam-watch-\(getpid())-\(UUID().uuidString)").path
        etc = base + "/etc"
        run = base + "/run"
        for directory in [etc, run] { try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true) }
        try "nameserver 127.0.0.53\nsearch home.example\n".write(toFile: target, atomically: false, encoding: .utf8)
        try FileManager.default.createSymbolicLink(atPath: link, withDestinationPath: "../run/stub-resolv.conf")
    }

    func cleanUp() { try? FileManager.default.removeItem(atPath: etc.parentDirectoryPath) }

    /// Waits briefly for the watch to say something changed (events are queued synchronously
    /// by the kernel, so one short look is enough).
    private func changed(_ watch: ResolvConfWatch) -> Bool {
        var ready = pollfd(fd: watch.fileDescriptor, events: Int16(POLLIN), revents: 0)
        _ = poll(&ready, 1, 200)
        return watch.changed()
    }

    @Test func writesAndReplacementsOfTheFileOrWhatItLinksToAreChanges() throws {
        defer { cleanUp() }
        let watch = try ResolvConfWatch(path: link)
        #expect(!watch.changed(), "nothing yet")

        // Written in place, through the link.
        try "nameserver 127.0.0.53\nsearch hotel.example\n".write(toFile: target, atomically: false, encoding: .utf8)
        #expect(changed(watch))

        // Replaced by a rename in the resolver's directory, as systemd-resolved writes it.
        try "nameserver 127.0.0.53\nsearch corp.example\n".write(toFile: run + "/.stub-tmp", atomically: false, encoding: .utf8)
        #expect(!changed(watch), "another file in that directory")
        #expect(rename(run + "/.stub-tmp", target) == 0)
        #expect(changed(watch))

        // The replaced file is followed too.
        try "nameserver 127.0.0.53\n".write(toFile: target, atomically: false, encoding: .utf8)
        #expect(changed(watch))

        // The link itself replaced by a plain file (a DHCP client that writes /etc/resolv.conf).
        try "nameserver 10.0.0.1\n".write(toFile: etc + "/resolv.conf.new", atomically: false, encoding: .utf8)
        #expect(!changed(watch), "another file in /etc")
        #expect(rename(etc + "/resolv.conf.new", link) == 0)
        #expect(changed(watch))
        try "nameserver 10.0.0.2\n".write(toFile: link, atomically: false, encoding: .utf8)
        #expect(changed(watch), "and written in place")
    }

    @Test func eventsSplitAsTheKernelLaysThemOut() {
        // wd 1, IN_MOVED_TO, cookie 7, len 16, "resolv.conf" NUL-padded; then wd 2, IN_Q_OVERFLOW, no name.
        var bytes: [UInt8] = [1, 0, 0, 0, 0x80, 0, 0, 0, 7, 0, 0, 0, 16, 0, 0, 0] + Array("resolv.conf".utf8) + [0, 0, 0, 0, 0]
        bytes += [0xFF, 0xFF, 0xFF, 0xFF, 0, 0x40, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        #expect(ResolvConfWatch.events(bytes[...]) == [
            .init(watch: 1, name: "resolv.conf", overflow: false, ignored: false),
            .init(watch: -1, name: "", overflow: true, ignored: false),
        ])
        #expect(ResolvConfWatch.events(bytes.prefix(20)) == [], "a truncated event ends the list")
    }
}

private extension String {
    var parentDirectoryPath: String { (self as NSString).deletingLastPathComponent }
}
