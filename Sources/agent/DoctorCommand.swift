import Topology
import ArgumentParser
import Basics
import ConfigReader
import Control
import ControlWire
import Device
import Diagnosis
import Glibc
import Lockdown
import Netlink
import PathMonitor
import Settings
import Streams
import Synchronization
import SystemDNS
import Tunnel

/// `agent doctor`: what stands between this machine and its gateway now, in words a person can
/// act on. It only looks: the facts are gathered here, `Doctor.findings` judges them.
struct DoctorCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "doctor",
        abstract: "Say why the tunnel does not come up: what is wrong on this machine and network now, and what to do.",
        discussion: """
            Checks, in order: whether the agent runs and what its status says (state, path, last transition); the \
            clock; for each server of the configuration, that its name resolves (and how long it took), which \
            uplink and source address the kernel's route to it takes, or that there is none; that the gateway \
            answers a handshake initiation over UDP (the one `agent up` sends, with this client's key: a response, \
            a cookie reply or a refusal proves it is there; three tries, 1.5 s each); with 'tcp:', that TCP and \
            TLS to its port come up and the gateway answers inside; the connectivity check (the agent's, from the \
            uplink the gateway is reached through, outside the tunnel: a captive portal is named with its login \
            page); the path MTU (the uplink's MTU against the tunnel's, and what the running agent's padded probes \
            found); whether Roam's nftables tables are loaded as the configuration and the agent's state call for; \
            while the agent writes resolv.conf, that the file still names the tunnel's resolvers; (full mode) \
            whether another VPN's policy rules decide before Roam's; and what others took away of the agent's \
            routing, resolvers and lockdown, and whether the agent holds off a fight over them; the systemd units \
            that run the configuration (roam-client, or a profile's roam@NAME, and roam-lockdown): installed, \
            enabled, active. Each finding has a \
            severity (ok, warning, problem), what was seen, and what to do. It changes nothing on the machine: no \
            route, rule, firewall, resolver or link; its sockets carry the session's mark and are closed at once. \
            With the lockdown loaded by a running agent, only the agent's own sockets pass, so the doctor's \
            handshake is stopped and said to be, and the agent's own state says whether it found a portal. Run it \
            as root: nftables, the mark and the key file need it. Exit status: 0 when no finding is a problem, 1 \
            otherwise, 2 for a configuration it cannot read. \
            Does not yet check: the gateway's certificate or a proxy's answer apart from the stream as a whole, \
            IPv6 and IPv4 separately when a name has both (the first address with a route is tried), the clock \
            against the gateway's, the path MTU beyond the first hop while no agent runs, systemd-resolved's \
            setting of the tunnel's link.
            """)

    @Option(help: "The client configuration file (as roam-client's `agent up` reads it).")
    var config = "/etc/roam/client.yaml"
    @Option(help: "The systemd unit that runs this configuration (by default roam-client.service for /etc/roam/client.yaml, roam@NAME.service for /etc/roam/NAME.yaml, none for a file elsewhere).")
    var unit: String?
    @OptionGroup var control: ControlOptions
    @Flag(help: "Print the findings as one JSON object.")
    var json = false

    /// Initiations sent over UDP before the gateway counts as silent, and how long each waits.
    static let tries = 3
    static let wait: Duration = .milliseconds(1500)
    /// How long TCP, the proxy and TLS may take, and then the answer inside.
    static let streamWait: Duration = .seconds(5)

    func run() throws {
        let (reader, root) = try YAMLReader.load(config, as: .clientConfiguration)
        let settings = try reader.client(root)
        let facts = DoctorFacts.gather(settings, configuration: config, unit: unit, control: control.control)
        let findings = Doctor.findings(facts)
        print(json ? Self.json(findings).text : Self.text(findings))
        if Doctor.exitStatus(findings) != 0 { throw ExitCode(Doctor.exitStatus(findings)) }
    }

    /// One block per finding: severity and title, then what was seen and what to do, indented.
    static func text(_ findings: [Finding]) -> String {
        findings.map { finding in
            let label = switch finding.severity { case .ok: "ok     "; case .warning: "warning"; case .problem: "PROBLEM" }
            var lines = ["\(label)  " + (finding.server.map { "[\($0)] " } ?? "") + finding.title]
            lines += finding.evidence.map { "         seen: \($0)" }
            if let fix = finding.fix { lines.append("         do:   \(fix)") }
            return lines.joined(separator: "\n")
        }.joined(separator: "\n")
    }

    static func json(_ findings: [Finding]) -> JSON {
        .object([
            ("ok", .bool(Doctor.exitStatus(findings) == 0)),
            ("problems", .int(Int64(findings.count { $0.severity == .problem }))),
            ("warnings", .int(Int64(findings.count { $0.severity == .warning }))),
            ("findings", .array(findings.map { finding in
                .object([("check", .string(finding.check.rawValue)), ("severity", .string(finding.severity.rawValue)),
                         ("server", finding.server.map(JSON.string) ?? .null), ("title", .string(finding.title)),
                         ("evidence", .array(finding.evidence.map(JSON.string))), ("fix", finding.fix.map(JSON.string) ?? .null)])
            })),
        ])
    }
}

