import Foundation
import Glibc
import NamespaceLab
import Basics
import Testing

/// The doctor's findings of the network and of what the agent holds, each made real in the lab
/// and then taken away again.
extension DoctorLabTests {
    /// A hotel's portal on the Wi-Fi (the laptop's only uplink): the doctor's connectivity check
    /// from that uplink is sent to the login page, which the finding names; once someone logged
    /// in, the check reaches the lab's internet.
    @Test func aCaptivePortalIsNamedWithItsLoginPageAndAnOpenNetworkIsFine() throws {
        let lab = try RoamingLab(vpn: .roam, routing: .full)
        try lab.laptop.ip("link set eth0 down")
        let portal = try LabPortal(router: lab.server, uplink: "wifi-l", routerAddress: IPAddress("192.168.1.1")!)
        defer { portal.stop() }
        try lab.configure("client", "portal: {url: \"http://\(portal.check)/check\", expect: \"\(LabPortal.expected)\"}")
        try lab.startServer()
        let before = lab.nftTables()
        let (status, behind, _) = try doctor(lab)
        let found = try #require(behind.first { $0.check == "portal" })
        #expect(found.severity == "problem", "\(found)")
        #expect(found.evidence.joined().contains("http://\(portal.login)/login") && found.evidence.joined().contains("wifi0"), "\(found)")
        #expect(status == 1)
        #expect(portal.opened == nil && lab.nftTables() == before, "the doctor only looked: \(portal.requestLines)")

        portal.open()
        let (_, open, _) = try doctor(lab)
        let online = try #require(open.first { $0.check == "portal" })
        #expect(online.severity == "ok" && online.title.contains("reaches the internet"), "\(online)")
    }

    /// The router's link to the laptop carries 1,300 bytes and says nothing of what it drops:
    /// the agent's padded probes find the size, and the doctor reports it from the agent's
    /// status with the MTU to set; on a link of 1,500 the same tunnel is fine.
    @Test func aPathSmallerThanTheTunnelsMTUIsWarnedOfAndAFullOneIsFine() throws {
        let lab = try RoamingLab(vpn: .roam, routing: .full)
        try lab.laptop.ip("link set wifi0 down")
        try lab.server.ip("link set eth-l mtu 1300")
        try lab.startServer()
        try lab.startClient()
        let small = lab.waitFor(seconds: 20) {
            let status = lab.status()
            return Self.isFalse(status["mtu.searching"]) && (status["mtu.tunnel"].flatMap { Int($0) } ?? 1500) < 1300
        }
        #expect(small, "the agent found the path's size: \(lab.status())")
        let (_, narrow, _) = try doctor(lab)
        let mtu = try #require(narrow.first { $0.check == "mtu" })
        #expect(mtu.severity == "warning" && mtu.title.contains("less than the configured 1420"), "\(mtu)")
        #expect(mtu.evidence.contains { $0.hasPrefix("the agent's padded probes: tunnel MTU 12") }, "\(mtu)")

        _ = try lab.stopClient()
        try lab.server.ip("link set eth-l mtu 1500")
        try lab.startClient()
        #expect(lab.waitFor(seconds: 20) { Self.isFalse(lab.status()["mtu.searching"]) && lab.status()["mtu.tunnel"] == "1420" },
                "\(lab.status())")
        let (_, wide, _) = try doctor(lab)
        let fine = try #require(wide.first { $0.check == "mtu" })
        #expect(fine.severity == "ok", "\(fine)")
    }

    /// While the agent writes resolv.conf, the file names the tunnel's resolver and nobody took
    /// anything away: both fine. Then someone rewrites the file again each time the agent puts
    /// it back (a DHCP hook that fights): the agent holds off, and the doctor says that the
    /// system's resolvers are not the tunnel's and who keeps taking them.
    @Test func resolvConfRewrittenInAFightIsAProblemAndTheTunnelsIsFine() throws {
        let lab = try RoamingLab(vpn: .roam, routing: .full)
        try DNSLabTests.append("dns: {servers: [10.77.0.1]}\n", to: lab.directory + "/server.yaml")
        try lab.startServer()
        try lab.startClient()
        #expect(lab.wait(for: "msg=dns", in: "client.log"), "\(lab.log("client.log"))")
        let (_, applied, _) = try doctor(lab)
        let resolvers = try #require(applied.first { $0.check == "resolvers" })
        #expect(resolvers.severity == "ok" && resolvers.evidence.contains("/etc/resolv.conf names 10.77.0.1"), "\(resolvers)")
        #expect(applied.first { $0.check == "upkeep" }?.severity == "ok", "\(applied)")

        let theirs = "# dhcp hook\nnameserver 10.20.0.1\n"
        var rewrites = 0
        while lab.status()["upkeep.resolvers.held_for_ms"] == "none" && rewrites < 20 {
            try theirs.write(toFile: lab.laptopResolvConfPath, atomically: false, encoding: .utf8)
            rewrites += 1
            _ = lab.waitFor(seconds: 2) {
                lab.status()["upkeep.resolvers.held_for_ms"] != "none"
                    || (try? String(contentsOfFile: lab.laptopResolvConfPath, encoding: .utf8))?.contains("nameserver 10.77.0.1") == true
            }
        }
        #expect(lab.status()["upkeep.resolvers.held_for_ms"] != "none", "held off after \(rewrites) rewrites: \(lab.status())")
        // The file someone else wrote stays while the agent holds off.
        try theirs.write(toFile: lab.laptopResolvConfPath, atomically: false, encoding: .utf8)
        let (status, fought, _) = try doctor(lab)
        let rewritten = try #require(fought.first { $0.check == "resolvers" })
        #expect(rewritten.severity == "problem" && rewritten.evidence.contains("/etc/resolv.conf names 10.20.0.1"), "\(rewritten)")
        let fight = try #require(fought.first { $0.check == "upkeep" })
        #expect(fight.severity == "warning" && fight.title.contains("resolvers"), "\(fight)")
        #expect(fight.evidence.contains { $0.hasPrefix("resolvers: put back ") && $0.contains("holds off") }, "\(fight)")
        #expect(status == 1)
    }

    /// A server's name the network's resolver does not know is a problem that points at the
    /// configuration; a name it knows resolves, and the gateway answers at its address.
    @Test func aNameThatDoesNotExistIsAProblemAndOneThatResolvesIsFine() throws {
        let lab = try RoamingLab(vpn: .roam, routing: .full)
        let resolver = try LabResolver(at: IPAddress("10.20.0.1")!, in: lab.server, names: ["gateway.lab.example": IPAddress("198.51.100.7")!])
        defer { resolver.stop() }
        try lab.startServer()
        try lab.editConfiguration("client") { $0.replacingOccurrences(of: "server: 198.51.100.7:", with: "server: missing.lab.example:") }
        let (status, missing, _) = try doctor(lab)
        let lookup = try #require(missing.first { $0.check == "lookup" })
        #expect(lookup.severity == "problem" && lookup.title.contains("does not exist"), "\(lookup)")
        #expect(status == 1)
        #expect(resolver.queries.contains("missing.lab.example"))

        try lab.editConfiguration("client") { $0.replacingOccurrences(of: "server: missing.lab.example:", with: "server: gateway.lab.example:") }
        let (_, known, _) = try doctor(lab)
        let resolved = try #require(known.first { $0.check == "lookup" })
        #expect(resolved.severity == "ok" && resolved.evidence.first?.hasPrefix("gateway.lab.example is 198.51.100.7") == true, "\(resolved)")
        #expect(known.first { $0.check == "udp" }?.severity == "ok", "\(known)")
    }

    /// A JSON `false` as the lab's flattened status reads it.
    static func isFalse(_ value: String?) -> Bool { value == "0" || value == "false" }
}

/// The doctor's word on the systemd units, where systemctl can run (not in a container without
/// systemd as PID 1): the units' state as `systemctl show` says it, and a unit that is not
/// there named as not installed.
@Suite(.enabled(if: NamespaceLab.isRoot && Systemctl.cannotRun == nil,
                Comment(rawValue: NamespaceLab.isRoot ? "systemctl cannot run here: \(Systemctl.cannotRun ?? "")" : NamespaceLab.skipReason)),
       .serialized)
struct DoctorUnitsLabTests {
    @Test func theUnitsAreReportedAsSystemdHasThemAndAMissingOneIsNamed() throws {
        let lab = try RoamingLab(vpn: .roam, routing: .full)
        let (status, output) = try NamespaceLab.capture(URL(fileURLWithPath: "/usr/bin/systemctl"),
                                                        ["show", "--property=Id,LoadState,UnitFileState,ActiveState,SubState", "roam-client.service"])
        try #require(status == 0, "\(output)")
        let field = { (key: String) in output.split(separator: "\n").first { $0.hasPrefix(key + "=") }.map { String($0.dropFirst(key.count + 1)) } ?? "" }
        let (_, installed, _) = try DoctorLabTests().doctor(lab, ["--unit", "roam-client.service"])
        let units = try #require(installed.first { $0.check == "units" })
        #expect(units.evidence.first?.hasPrefix("roam-client.service: \(field("LoadState"))") == true
                && units.evidence.first?.hasSuffix("\(field("ActiveState")) (\(field("SubState")))") == true, "\(units) against \(output)")

        let (_, missing, _) = try DoctorLabTests().doctor(lab, ["--unit", "roam-no-such-unit.service"])
        let absent = try #require(missing.first { $0.check == "units" })
        #expect(absent.severity == "warning" && absent.title == "roam-no-such-unit.service is not installed", "\(absent)")
    }
}

enum Systemctl {
    /// Why systemctl cannot answer here (no systemd as PID 1, as in a container); nil when it can.
    static let cannotRun: String? = {
        guard let (status, output) = try? NamespaceLab.capture(URL(fileURLWithPath: "/usr/bin/systemctl"), ["show", "--property=Id", "init.scope"])
        else { return "/usr/bin/systemctl is not installed" }
        return status == 0 && output.hasPrefix("Id=") ? nil : output.split(separator: "\n").first.map(String.init) ?? "exit status \(status)"
    }()
}
