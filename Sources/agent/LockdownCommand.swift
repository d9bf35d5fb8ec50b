import Control
import ControlWire
import ArgumentParser
import ConfigReader
import Lockdown
import Basics
import Reconnector
import SystemDNS
import Tunnel
import Settings
import Device

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
        @Flag(help: ArgumentHelp("Stay and keep the lockdown until an agent holds its own: a firewall's 'flush ruleset' meanwhile opens nothing.",
                                 discussion: "Holds a second table no other process may delete (nftables' owner flag, Linux 5.12+) and loads the first again whenever it is deleted; ends when an agent holds its own guard, on SIGTERM, or with 'agent lockdown off'."))
        var hold = false
        @Option(help: ArgumentHelp("With --hold, where the holder's PID is written, for 'agent lockdown off'.", valueName: "directory"))
        var runtime = LockdownHolder.defaultRuntime

        func run() throws {
            try Preflight.requireNetworkAdmin(for: "lockdown on")
            let settings: ClientSettings
            do {
                let (reader, root) = try YAMLReader.load(config, as: .clientConfiguration)
                settings = try reader.client(root)
            } catch {
                // A configuration that cannot be read at boot is no reason to boot open: the
                // machine is closed to everything but DHCP and neighbour discovery until an
                // agent with a good one starts.
                let closed = LockdownPolicy(scope: .full(mark: FullTunnel().mark), tunnelInterface: TunnelSettings().name,
                                            allowLAN: false, localNetworks: [])
                do {
                    _ = try Firewall(closed)
                } catch let refused {
                    throw AgentError("\(error); the closed lockdown could not be loaded either: \(refused)")
                }
                throw AgentError("\(error); the lockdown is loaded with no server let through")
            }
            // The client's unit requires this one: a machine without a lockdown starts its agent.
            guard settings.lockdown else { return printError("\(config) says 'lockdown: off': nothing loaded") }
            // No agent yet: no process's marked sockets get the session's exceptions.
            if hold { return try LockdownHolder(policy: settings.lockdownPolicy, runtime: runtime).run() }
            do {
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
                still there (an agent that died could not). A running agent stops with `agent stop`, which \
                does the same.
                """)

        @Option(help: ArgumentHelp("Where a boot holder ('agent lockdown on --hold') wrote its PID.", valueName: "directory"))
        var runtime = LockdownHolder.defaultRuntime

        func run() throws {
            try Preflight.requireNetworkAdmin(for: "lockdown off")
            try LockdownHolder.end(runtime: runtime)
            try openMachine()
        }
    }

    /// Takes the lockdown away and puts back the resolv.conf an agent replaced: by hand, or
    /// for an agent that did not stop when asked.
    static func openMachine() throws {
        do { try Lockdown().remove() } catch { throw AgentError("cannot remove the lockdown firewall: \(error)") }
        do {
            if try ResolvConfFile().restore() { printError("resolv.conf restored") }
        } catch {
            throw AgentError("cannot put resolv.conf back: \(error)")
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
