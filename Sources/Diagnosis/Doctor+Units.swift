/// A systemd unit as `systemctl show` says it.
public struct UnitState: Equatable, Sendable {
    public var name: String
    /// `loaded`, `not-found`, ...
    public var load: String
    /// `enabled`, `disabled`, `static`, ... (empty for a unit without a file).
    public var unitFile: String
    /// `active`, `inactive`, `failed`, `activating`, ...
    public var active: String
    public var sub: String
    public init(name: String, load: String, unitFile: String, active: String, sub: String) {
        self.name = name
        self.load = load
        self.unitFile = unitFile
        self.active = active
        self.sub = sub
    }

    /// The properties `parse` reads, for `systemctl show --property=`.
    public static let properties = "Id,LoadState,UnitFileState,ActiveState,SubState"

    /// `systemctl show --property=\(properties) UNIT...`: a block of `Key=value` lines per unit,
    /// blank lines between; nil when it holds no unit (systemctl could not run, and said why).
    public static func parse(_ text: String) -> [UnitState]? {
        var units: [UnitState] = []
        for block in text.split(separator: "\n", omittingEmptySubsequences: false).split(whereSeparator: { $0.isEmpty }) {
            var fields: [Substring: String] = [:]
            for line in block {
                guard let equals = line.firstIndex(of: "=") else { continue }
                fields[line[..<equals]] = String(line[line.index(after: equals)...])
            }
            guard let name = fields["Id"], !name.isEmpty, let load = fields["LoadState"] else { continue }
            units.append(UnitState(name: name, load: load, unitFile: fields["UnitFileState"] ?? "",
                                   active: fields["ActiveState"] ?? "", sub: fields["SubState"] ?? ""))
        }
        return units.isEmpty ? nil : units
    }
}

/// The service that runs this configuration, and the boot lockdown's, as systemd has them.
public struct UnitFacts: Equatable, Sendable {
    /// `roam-client.service`, or a profile's `roam@NAME.service`.
    public var service: String
    /// `lockdown: on`: the boot lockdown's unit belongs beside the service.
    public var lockdown: Bool
    /// Each unit asked about, or why systemctl could not say.
    public var states: Result<[UnitState], DoctorError>
    public init(service: String, lockdown: Bool, states: Result<[UnitState], DoctorError>) {
        self.service = service
        self.lockdown = lockdown
        self.states = states
    }

    /// The boot lockdown's unit.
    public static let lockdownUnit = "roam-lockdown.service"
}

extension Doctor {
    // MARK: The systemd units

    /// The service is installed, enabled (so the tunnel comes up at boot) and active; with the
    /// lockdown, the boot lockdown's unit is installed beside it.
    static func units(_ facts: UnitFacts?) -> Finding? {
        guard let facts else { return nil }
        let units: [UnitState]
        switch facts.states {
        case .failure(let why):
            return Finding(.units, .ok, "The systemd units were not checked", evidence: [why.description])
        case .success(let states): units = states
        }
        let evidence = units.map { "\($0.name): \($0.load)" + ($0.unitFile.isEmpty ? "" : ", \($0.unitFile)") + ", \($0.active) (\($0.sub))" }
        let service = units.first { $0.name == facts.service }
        let install = "install contrib/\(facts.service.contains("@") ? "roam@.service" : facts.service) and contrib/roam-lockdown.service in /etc/systemd/system"
        guard let service, service.load == "loaded" else {
            return Finding(.units, .warning, "\(facts.service) is not installed", evidence: evidence,
                           fix: "\(install), then systemctl enable --now \(facts.service)")
        }
        if facts.lockdown, units.first(where: { $0.name == UnitFacts.lockdownUnit })?.load != "loaded" {
            return Finding(.units, .warning, "\(UnitFacts.lockdownUnit) is not installed: nothing holds the machine closed at boot until the agent starts",
                           evidence: evidence, fix: install)
        }
        if service.active == "failed" {
            return Finding(.units, .problem, "\(facts.service) failed", evidence: evidence,
                           fix: "journalctl -u \(facts.service) says why; systemctl restart \(facts.service)")
        }
        guard ["enabled", "enabled-runtime", "static", "alias", "indirect", "generated"].contains(service.unitFile) else {
            return Finding(.units, .warning, "\(facts.service) is not enabled: the tunnel does not come up at boot", evidence: evidence,
                           fix: "systemctl enable \(facts.service)")
        }
        guard service.active == "active" || service.active == "activating" || service.active == "reloading" else {
            return Finding(.units, .warning, "\(facts.service) is \(service.active)", evidence: evidence,
                           fix: "systemctl start \(facts.service)")
        }
        return Finding(.units, .ok, "\(facts.service) is installed, enabled and \(service.active)", evidence: evidence)
    }
}
