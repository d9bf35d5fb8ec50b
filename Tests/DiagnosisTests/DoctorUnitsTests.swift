import Diagnosis
import Testing

/// `systemctl show --property=Id,LoadState,UnitFileState,ActiveState,SubState` as systemd 257 prints it.
private func show(client: (file: String, active: String, sub: String)?, lockdown: Bool = true) -> String {
    var blocks: [String] = []
    if let client {
        blocks.append("Id=roam-client.service\nLoadState=loaded\nActiveState=\(client.active)\nSubState=\(client.sub)\nUnitFileState=\(client.file)\n")
    } else {
        blocks.append("Id=roam-client.service\nLoadState=not-found\nActiveState=inactive\nSubState=dead\nUnitFileState=\n")
    }
    blocks.append(lockdown ? "Id=roam-lockdown.service\nLoadState=loaded\nActiveState=active\nSubState=exited\nUnitFileState=enabled\n"
                           : "Id=roam-lockdown.service\nLoadState=not-found\nActiveState=inactive\nSubState=dead\nUnitFileState=\n")
    return blocks.joined(separator: "\n")
}

private func judge(_ text: String, lockdown: Bool = true) -> Finding? {
    var facts = healthy()
    facts.units = UnitFacts(service: "roam-client.service", lockdown: lockdown,
                            states: UnitState.parse(text).map { .success($0) } ?? .failure(DoctorError("systemctl cannot say: \(text)")))
    return finding(.units, facts)
}

@Test func systemctlsBlocksAreReadPerUnit() throws {
    let units = try #require(UnitState.parse(show(client: ("enabled", "active", "running"))))
    #expect(units == [UnitState(name: "roam-client.service", load: "loaded", unitFile: "enabled", active: "active", sub: "running"),
                      UnitState(name: "roam-lockdown.service", load: "loaded", unitFile: "enabled", active: "active", sub: "exited")])
    #expect(UnitState.parse("System has not been booted with systemd as init system (PID 1). Can't operate.\nFailed to connect to bus: Host is down\n") == nil)
    #expect(UnitState.parse("") == nil)
}

@Test func anInstalledEnabledActiveServiceIsFine() throws {
    let units = try #require(judge(show(client: ("enabled", "active", "running"))))
    #expect(units.severity == .ok && units.title == "roam-client.service is installed, enabled and active")
    #expect(units.evidence == ["roam-client.service: loaded, enabled, active (running)", "roam-lockdown.service: loaded, enabled, active (exited)"])
}

@Test func aMissingDisabledStoppedOrFailedServiceSaysWhatToDo() {
    let missing = judge(show(client: nil))
    #expect(missing?.severity == .warning && missing?.title == "roam-client.service is not installed")
    #expect(missing?.fix?.contains("systemctl enable --now roam-client.service") == true)
    #expect(judge(show(client: ("enabled", "active", "running"), lockdown: false))?.title.contains("roam-lockdown.service is not installed") == true)
    #expect(judge(show(client: ("enabled", "active", "running"), lockdown: false), lockdown: false)?.severity == .ok,
            "'lockdown: off' needs no boot lockdown")
    let disabled = judge(show(client: ("disabled", "active", "running")))
    #expect(disabled?.severity == .warning && disabled?.fix == "systemctl enable roam-client.service")
    #expect(judge(show(client: ("enabled", "inactive", "dead")))?.fix == "systemctl start roam-client.service")
    #expect(judge(show(client: ("enabled", "failed", "failed")))?.severity == .problem)
}

@Test func withoutSystemdTheUnitsAreNotChecked() {
    let unchecked = judge("System has not been booted with systemd as init system (PID 1). Can't operate.\n")
    #expect(unchecked?.severity == .ok && unchecked?.title == "The systemd units were not checked")
    var facts = healthy()
    facts.units = nil
    #expect(finding(.units, facts) == nil, "a configuration no unit runs")
}
