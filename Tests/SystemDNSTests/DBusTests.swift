import Foundation
import Testing
import NamespaceLab
@testable import SystemDNS
import Basics

/// The D-Bus client against a real dbus-daemon of the test's own.
@Suite(.enabled(if: PrivateBus.available, "needs /usr/bin/dbus-daemon (Debian package dbus-daemon)"))
struct DBusTests {
    @Test func itAuthenticatesAndAsksTheBus() throws {
        let bus = try PrivateBus()
        let connection = try DBusConnection(path: bus.socketPath)
        #expect(try connection.hasOwner("org.freedesktop.DBus"))
        #expect(try !connection.hasOwner("org.freedesktop.resolve1"))
        // Many calls on one connection: serials and buffering hold.
        for _ in 0..<50 { #expect(try connection.hasOwner("org.freedesktop.DBus")) }
    }

    @Test func aServiceThatIsNotThereIsANamedError() throws {
        let bus = try PrivateBus()
        let connection = try DBusConnection(path: bus.socketPath)
        #expect(throws: DBusError.self) {
            try Resolved(connection).revert(link: 1)
        }
        do {
            try Resolved(connection).configure(link: 1, .none, routeAll: true)
            Issue.record("no error")
        } catch .remote(let name, _) {
            #expect(name == "org.freedesktop.DBus.Error.ServiceUnknown")
        } catch {
            Issue.record("\(error)")
        }
    }

    @Test func noBusIsAClearError() {
        #expect(throws: DBusError.noBus("/nonexistent/bus.sock", ENOENT)) { try DBusConnection(path: "/nonexistent/bus.sock") }
    }

    @Test func valuesAreMarshalledAsTheSpecificationSays() {
        var writer = DBusWriter()
        writer.int32(7)
        writer.array(alignment: 8) { list in
            list.structure()
            list.string("ab")
            list.bool(true)
        }
        // int32 7 | array length 12 (padding before the first struct is not counted) | "ab" (length,
        // bytes, NUL) | padding to 4 | true
        #expect(writer.bytes == [7, 0, 0, 0, 12, 0, 0, 0, 2, 0, 0, 0, 0x61, 0x62, 0, 0, 1, 0, 0, 0])
    }
}

/// A bus that takes the connection and never answers (a hung daemon) costs a caller with a
/// deadline no more than the deadline, however long each call's own time-out is.
@Test func aSilentBusEndsAtTheDeadline() throws {
    let path = FileManager.default.temporaryDirectory.appendingPathComponent("roam-silent-bus-\(getpid()).sock").path
    unlink(path)
    let listener = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(listener); unlink(path) }
    var address = sockaddr_un()
    address.sun_family = sa_family_t(AF_UNIX)
    withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: Array(path.utf8)) }
    let bound = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(listener, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
    }
    try #require(bound == 0 && listen(listener, 4) == 0)
    let start = ContinuousClock.now
    #expect(throws: DBusError.timedOut) {
        try DBusConnection(path: path, timeout: .seconds(5), deadline: Instant.now() + .milliseconds(300))
    }
    let took = ContinuousClock.now - start
    #expect(took >= .milliseconds(250) && took < .seconds(2), "\(took)")
}
