import Foundation
import Testing
import NamespaceLab
@testable import SystemDNS

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
