import ArgumentParser
import NamespaceLab
import Testing
@testable import agent

/// Every command path under `agent`, from the command tree itself: a subcommand added later is
/// walked too.
private func commandPaths(_ command: any ParsableCommand.Type, path: [String] = []) -> [[String]] {
    [path] + command.configuration.subcommands.flatMap { sub in
        commandPaths(sub, path: path + [sub.configuration.commandName ?? sub._commandName])
    }
}

@Test func everyCommandAnswersHelpWithItsHelpAndSuccess() throws {
    let paths = commandPaths(Agent.self)
    // The root, every subcommand, and the lockdown's own subcommands at least.
    #expect(paths.count >= 20)
    #expect(paths.contains(["portal"]) && paths.contains(["lockdown", "status"]))
    for path in paths {
        for flag in ["--help", "-h"] {
            let (status, output) = try NamespaceLab.capture(RoamingLab.builtAgent, path + [flag])
            let shown = (["agent"] + path).joined(separator: " ")
            #expect(status == 0, "\(shown) \(flag) exited \(status): \(output)")
            #expect(output.contains("USAGE: \(shown)"), "\(shown) \(flag) printed no usage: \(output)")
        }
    }
}
