import ArgumentParser

@main
struct Agent: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "agent",
        abstract: "Roam: an always-on VPN agent that follows a roaming laptop's network path.",
        subcommands: [ReplayCommand.self, MonitorCommand.self, RecordCommand.self])
}
