import Foundation
import Reconnector
import Testing
@testable import agent

private func supplies(_ entries: [String: [String: String]]) throws -> String {
    let root = FileManager.default.temporaryDirectory.appendingPathComponent("roam-power-\(UUID().uuidString)").path
    for (name, files) in entries {
        try FileManager.default.createDirectory(atPath: root + "/" + name, withIntermediateDirectories: true)
        for (file, value) in files { try (value + "\n").write(toFile: root + "/" + name + "/" + file, atomically: true, encoding: .utf8) }
    }
    return root
}

@Test func powerSourceFromSysfs() throws {
    let laptopOnBattery = try supplies(["AC": ["type": "Mains", "online": "0"], "BAT0": ["type": "Battery", "scope": "System"]])
    let laptopPlugged = try supplies(["AC": ["type": "Mains", "online": "1"], "BAT0": ["type": "Battery"]])
    let usbC = try supplies(["ucsi-source-psy-1": ["type": "USB", "online": "1"], "BAT1": ["type": "Battery"]])
    let mouseOnly = try supplies(["hid-mouse-battery": ["type": "Battery", "scope": "Device"]])
    defer { for root in [laptopOnBattery, laptopPlugged, usbC, mouseOnly] { try? FileManager.default.removeItem(atPath: root) } }
    #expect(PowerSupply.current(root: laptopOnBattery) == .battery)
    #expect(PowerSupply.current(root: laptopPlugged) == .ac)
    #expect(PowerSupply.current(root: usbC) == .ac)
    #expect(PowerSupply.current(root: mouseOnly) == .ac, "a mouse battery is not the machine's")
    #expect(PowerSupply.current(root: "/nonexistent") == .ac, "no supplies: a desktop or a VM")
}

@Test func suspendIsTheGrowthOfTheBoottimeMonotonicGap() {
    var detector = SuspendDetector(monotonic: .seconds(100), boottime: .seconds(130))
    #expect(detector.check(monotonic: .seconds(160), boottime: .seconds(190)) == nil, "a minute awake")
    #expect(detector.check(monotonic: .seconds(161), boottime: .seconds(191) + .milliseconds(300)) == nil, "noise")
    let slept = detector.check(monotonic: .seconds(170), boottime: .seconds(191) + .milliseconds(300) + .seconds(9) + .seconds(7200))
    #expect(slept == .seconds(7200))
    #expect(detector.check(monotonic: .seconds(171), boottime: .seconds(7392) + .milliseconds(300)) == nil)
}

@Test func theRealClocksShowNoSuspendWithinATest() {
    let (m, b) = SuspendDetector.clocks()
    var detector = SuspendDetector(monotonic: m, boottime: b)
    let (m2, b2) = SuspendDetector.clocks()
    #expect(detector.check(monotonic: m2, boottime: b2) == nil)
    #expect(b >= m)
}
