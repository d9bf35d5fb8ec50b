import Foundation
import Glibc
import NamespaceLab
import Basics
import Testing
import Tunnel

/// Names asked on the laptop go to the tunnel's resolvers, through the tunnel, never to the
/// LAN's; resolv.conf is put back as it was (or as DHCP rewrote it meanwhile) on stop.
@Suite(.enabled(if: NamespaceLab.isRoot, Comment(rawValue: NamespaceLab.skipReason)), .serialized)
struct DNSLabTests {
    /// Full mode: the server pushes the resolvers. Split mode: the client's `dns` names them.
    @Test(arguments: LabRouting.allCases)
    func namesGoThroughTheTunnelAndTheOldFileComesBack(_ routing: LabRouting) throws {
        let lab = try RoamingLab(vpn: .roam, routing: routing)
        let dns = "dns: {servers: [10.77.0.1], search: [corp.example]}\n"
        try Self.append(dns, to: lab.directory + (routing == .full ? "/server.yaml" : "/client.yaml"))
        try lab.startServer()
        // The server's tunnel address, once its device shows it.
        var started: LabResolver?
        _ = lab.waitFor(seconds: 5) {
            started = try? LabResolver(at: lab.serverInner, in: lab.server, names: ["printer.corp.example": IPAddress("10.77.9.9")!])
            return started != nil
        }
        let tunnelResolver = try #require(started)
        let lanResolver = try LabResolver(at: IPAddress("10.20.0.1")!, in: lab.server, names: ["printer.home.example": IPAddress("10.20.9.9")!])
        defer { tunnelResolver.stop(); lanResolver.stop() }
        let tap = try lab.leakTap()
        try lab.startClient()
        #expect(lab.wait(for: "msg=dns resolvers=10.77.0.1 search=corp.example via=resolv.conf", in: "client.log"), "\(lab.log("client.log"))")

        let answer = try Self.lookUp("printer", in: lab)
        #expect(answer.contains("10.77.9.9"), "\(answer)")
        #expect(tunnelResolver.queries.contains("printer.corp.example"))
        #expect(lanResolver.queries.isEmpty, "the LAN's resolver heard \(lanResolver.queries)")
        let status = lab.status()
        #expect(status["dns.resolvers"] == "10.77.0.1" && status["dns.search"] == "corp.example" && status["dns.manager"] == "resolv.conf",
                "\(status)")

        // DHCP renews its lease and rewrites the file: the agent writes its own again at the
        // next change of the network, and keeps DHCP's as the one to put back.
        let renewed = "# renewed\nnameserver 10.20.0.1\nsearch renewed.example\n"
        try renewed.write(toFile: lab.laptopResolvConfPath, atomically: false, encoding: .utf8)
        try lab.laptop.ip("address add 192.168.1.99/24 dev wifi0")
        #expect(lab.waitFor(seconds: 5) { (try? String(contentsOfFile: lab.laptopResolvConfPath, encoding: .utf8))?.hasPrefix("# Written by roam") == true })
        #expect(try Self.lookUp("printer", in: lab).contains("10.77.9.9"))

        // A signal keeps the tunnel's resolvers (a restart must not ask the LAN in between);
        // the operator's stop puts DHCP's back.
        let client = try #require(lab.client)
        kill(client.processIdentifier, SIGTERM)
        client.waitUntilExit()
        #expect(try String(contentsOfFile: lab.laptopResolvConfPath, encoding: .utf8).hasPrefix("# Written by roam"))
        try lab.startClient()
        try lab.stopClient()
        #expect(try String(contentsOfFile: lab.laptopResolvConfPath, encoding: .utf8) == renewed)
        #expect(lanResolver.queries.isEmpty)
        #expect(tap.leaks().isEmpty, "leaks: \(tap.leaks())")
    }

    /// A crash leaves the tunnel's resolvers (nothing is asked in clear); the service's stop
    /// path, `agent lockdown off`, puts the file back.
    @Test func theStopPathPutsTheFileBackAfterACrash() throws {
        let lab = try RoamingLab(vpn: .roam, routing: .full)
        try Self.append("dns: {servers: [10.77.0.1]}\n", to: lab.directory + "/server.yaml")
        try lab.startServer()
        try lab.startClient()
        #expect(lab.wait(for: "msg=dns", in: "client.log"), "\(lab.log("client.log"))")
        let client = try #require(lab.client)
        kill(client.processIdentifier, SIGKILL)
        client.waitUntilExit()
        #expect(try String(contentsOfFile: lab.laptopResolvConfPath, encoding: .utf8).contains("nameserver 10.77.0.1"))
        let (status, output) = try lab.runAgent(["lockdown", "off"])
        #expect(status == 0 && output.contains("resolv.conf restored"), "\(output)")
        #expect(try String(contentsOfFile: lab.laptopResolvConfPath, encoding: .utf8) == RoamingLab.laptopResolvConf)
    }

    /// Adds `text` to the file in place, keeping its mode (the server's must stay 0600).
    static func append(_ text: String, to path: String) throws {
        try (try String(contentsOfFile: path, encoding: .utf8) + "\n" + text).write(toFile: path, atomically: false, encoding: .utf8)
    }

    /// What the C library on the laptop makes of `name` (getaddrinfo, as every application asks).
    static func lookUp(_ name: String, in lab: RoamingLab) throws -> String {
        try NamespaceLab.capture(NamespaceLab.ipTool, ["netns", "exec", lab.laptop.name, "getent", "ahostsv4", name]).output
    }
}

/// The same through Debian's own systemd-resolved (on a bus of the test's own): the agent sets
/// the tunnel device's resolvers and domains over D-Bus, names go where the routing mode says,
/// and the setting goes with the agent.
@Suite(.enabled(if: NamespaceLab.isRoot && LabResolved.available,
                Comment(rawValue: NamespaceLab.isRoot ? LabResolved.skipReason : NamespaceLab.skipReason)), .serialized)
struct ResolvedLabTests {
    @Test(arguments: LabRouting.allCases)
    func resolvedSendsTheTunnelsNamesToTheTunnelsResolvers(_ routing: LabRouting) throws {
        let lab = try RoamingLab(vpn: .roam, routing: routing)
        // The laptop as a systemd-resolved machine has it: applications ask the stub, and
        // NetworkManager gave the wired uplink DHCP's resolver and search domain.
        try lab.laptop.setResolvConf("nameserver 127.0.0.53\noptions edns0 trust-ad\n")
        let resolved = try LabResolved(in: lab.laptop)
        defer { resolved.stop() }
        lab.laptopEnvironment["DBUS_SYSTEM_BUS_ADDRESS"] = resolved.address
        try resolved.resolvectl(["dns", "eth0", "10.20.0.1"])
        try resolved.resolvectl(["domain", "eth0", "home.example"])

        try DNSLabTests.append("dns: {servers: [10.77.0.1], search: [corp.example]}\n",
                               to: lab.directory + (routing == .full ? "/server.yaml" : "/client.yaml"))
        try lab.startServer()
        var started: LabResolver?
        _ = lab.waitFor(seconds: 5) {
            started = try? LabResolver(at: lab.serverInner, in: lab.server,
                                       names: ["printer.corp.example": IPAddress("10.77.9.9")!, "www.example.org": IPAddress("10.77.8.8")!])
            return started != nil
        }
        let tunnelResolver = try #require(started)
        let lanResolver = try LabResolver(at: IPAddress("10.20.0.1")!, in: lab.server, names: ["www.example.org": IPAddress("10.20.8.8")!])
        defer { tunnelResolver.stop(); lanResolver.stop() }
        try lab.startClient()
        // From here on (start-up is the lockdown tests' concern; resolved joined its multicast
        // groups before the agent ran).
        let tap = try lab.leakTap()
        #expect(lab.wait(for: "msg=dns resolvers=10.77.0.1 search=corp.example via=systemd-resolved", in: "client.log"),
                "\(lab.log("client.log"))\n\(resolved.log.suffix(3000))")
        #expect(lab.status()["dns.manager"] == "systemd-resolved")
        let domains = try resolved.resolvectl(["domain", lab.tunnelDevice])
        #expect(domains.contains("corp.example") && domains.contains("~.") == (routing == .full), "\(domains)")
        #expect(try resolved.resolvectl(["dns", lab.tunnelDevice]).contains("10.77.0.1"))

        #expect(try DNSLabTests.lookUp("printer.corp.example", in: lab).contains("10.77.9.9"))
        #expect(tunnelResolver.queries.contains("printer.corp.example"))
        // Any other name: the tunnel's resolver in full mode, the LAN's in split mode.
        let other = try DNSLabTests.lookUp("www.example.org", in: lab)
        switch routing {
        case .full:
            #expect(other.contains("10.77.8.8"), "\(other)")
            #expect(lanResolver.queries.isEmpty, "the LAN's resolver heard \(lanResolver.queries)")
        case .split:
            #expect(other.contains("10.20.8.8"), "\(other)")
            #expect(!tunnelResolver.queries.contains("www.example.org"), "the tunnel's resolver heard \(tunnelResolver.queries)")
        }

        #expect(tap.leaks().isEmpty, "leaks: \(tap.leaks())")

        try lab.stopClient()
        #expect(try !resolved.resolvectl(["dns"]).contains("10.77.0.1"))
    }

    /// resolved runs but resolv.conf does not send applications to it ("foreign" mode): what
    /// resolved would be told reaches nobody, so the file is written.
    @Test func aResolvConfThatBypassesResolvedIsWritten() throws {
        let lab = try RoamingLab(vpn: .roam, routing: .full)
        let resolved = try LabResolved(in: lab.laptop)
        defer { resolved.stop() }
        lab.laptopEnvironment["DBUS_SYSTEM_BUS_ADDRESS"] = resolved.address
        try DNSLabTests.append("dns: {servers: [10.77.0.1]}\n", to: lab.directory + "/server.yaml")
        try lab.startServer()
        try lab.startClient()
        #expect(lab.wait(for: "msg=dns resolvers=10.77.0.1 search=\"\" via=resolv.conf", in: "client.log"), "\(lab.log("client.log"))")
        #expect(try String(contentsOfFile: lab.laptopResolvConfPath, encoding: .utf8).contains("nameserver 10.77.0.1"))
    }
}
