import Topology
import Foundation
@testable import PathMonitor
import Testing

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

@Test func powerSupplyUeventsAreRecognised() {
    func message(_ fields: [String]) -> [UInt8] { fields.flatMap { Array($0.utf8) + [0] } }
    let charger = message(["change@/devices/LNXSYSTM:00/LNXSYBUS:00/ACPI0003:00/power_supply/AC", "ACTION=change",
                           "DEVPATH=/devices/LNXSYSTM:00/LNXSYBUS:00/ACPI0003:00/power_supply/AC", "SUBSYSTEM=power_supply",
                           "POWER_SUPPLY_NAME=AC", "POWER_SUPPLY_ONLINE=1", "SEQNUM=4321"])
    let usb = message(["add@/devices/pci0000:00/usb1/1-1", "ACTION=add", "SUBSYSTEM=usb", "SEQNUM=4322"])
    #expect(PowerEvents.isPowerSupplyEvent(charger))
    #expect(!PowerEvents.isPowerSupplyEvent(usb))
    #expect(!PowerEvents.isPowerSupplyEvent([UInt8]()))
    #expect(!PowerEvents.isPowerSupplyEvent(Array("SUBSYSTEM=power_supply_extra".utf8)))
}

@Test func theUeventSocketOpens() {
    // Any Linux kernel offers it; in a namespace it stays silent, which is fine.
    let events = PowerEvents()
    #expect(events != nil)
    #expect(events?.drain() == false)
}
