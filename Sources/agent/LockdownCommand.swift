import Control
import ArgumentParser
import ConfigReader
import Lockdown
import Basics
import Reconnector
import SystemDNS
import Tunnel
import Settings

/// `agent lockdown on|off|status`: the lockdown firewall without a running agent, for early
/// boot, the service's stop path, and an operator who needs the machine open again.
struct LockdownCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "lockdown",
        abstract: "Load, remove or show the lockdown firewall (nftables table inet roam).",
        subcommands: [On.self, Off.self, Show.self])

    struct On: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "on",
            abstract: "Load the lockdown from a client configuration, before any interface is up (early boot).",
            discussion: "Nothing but DHCP and neighbour discovery leaves until the agent starts and loads its own table, which lets its own sockets reach the server.")
        @Option(help: "The client configuration file.")
        var config: String

        func run() throws {
            let (reader, root) = try YAMLReader.load(config, as: .clientConfiguration)
            let settings = try reader.client(root)
            try Preflight.requireNetworkAdmin(for: "lockdown on")
            guard settings.lockdown else { throw AgentError("\(config) says 'lockdown: off'") }
            do {
                // No agent yet: no process's marked sockets get the session's exceptions.
                _ = try Firewall(settings.lockdownPolicy)
            } catch {
                throw AgentError("cannot load the lockdown firewall: \(error)")
            }
        }
    }

    struct Off: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "off",
            abstract: "Remove the lockdown: traffic leaves outside the tunnel again.",
            discussion: """
                Also puts back the resolv.conf that the agent replaced with the tunnel's resolvers, if it is \
                still there (an agent that died could not). With --after-stop (the service's ExecStopPost), only when systemd says the agent was stopped \
                ($SERVICE_RESULT success or timeout): after a crash or a give-up systemd starts it again, and \
                the machine stays closed meanwhile.
                """)
        @Flag(help: "Only after an operator's stop, as systemd's ExecStopPost tells it.")
        var afterStop = false

        func run() throws {
            if afterStop {
                let result = environment("SERVICE_RESULT") ?? ""
                guard ["success", "timeout"].contains(result) else {
                    printError("lockdown kept: the agent ended with '\(result.isEmpty ? "unknown" : result)' and will be started again")
                    return
                }
            }
            try Preflight.requireNetworkAdmin(for: "lockdown off")
            do { try Lockdown().remove() } catch { throw AgentError("cannot remove the lockdown firewall: \(error)") }
            do {
                if try ResolvConfFile().restore() { printError("resolv.conf restored") }
            } catch {
                throw AgentError("cannot put resolv.conf back: \(error)")
            }
        }
    }

    struct Show: ParsableCommand {
        static let configuration = CommandConfiguration(commandName: "status", abstract: "Whether the lockdown is loaded, and what it stopped.")
        @Flag(help: "Print one JSON object.")
        var json = false

        func run() throws {
            try Preflight.requireNetworkAdmin(for: "lockdown status")
            let lockdown: Lockdown
            let installed: Bool
            let counters: [BlockCause: UInt64]
            do {
                lockdown = try Lockdown()
                installed = try lockdown.isInstalled()
                counters = try lockdown.counters()
            } catch {
                throw AgentError("cannot read the lockdown firewall: \(error)")
            }
            let fields = [("lockdown", installed ? "on" : "off")] + BlockCause.allCases.map { ($0.counter, "\(counters[$0] ?? 0)") }
            print(json ? LogLine.json(fields, numbers: Set(BlockCause.allCases.map(\.counter)))
                       : fields.map { LogLine.logfmt([$0]) }.joined(separator: "\n"))
        }
    }
}
