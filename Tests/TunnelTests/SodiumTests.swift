import Testing
@testable import Tunnel

@Test func sodiumInitializesAndReportsVersion() throws {
    try Sodium.initialize()
    try Sodium.initialize()
    #expect(Sodium.version.split(separator: ".").count == 3)
}
