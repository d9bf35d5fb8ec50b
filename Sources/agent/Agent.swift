import ArgumentParser
import CShims
import ConfigReader
import Control
import ControlWire
import Glibc

@main
struct Agent: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "agent",
        abstract: "Roam: an always-on VPN agent that follows a roaming laptop's network path.",
        version: Release.version,
        subcommands: [
            ReplayCommand.self, MonitorCommand.self, RecordCommand.self, KeygenCommand.self, PubkeyCommand.self,
            PasswdCommand.self, ServeCommand.self, UpCommand.self, StatusCommand.self, ReconnectCommand.self,
            SleepCommand.self, WakeCommand.self, DownCommand.self, StopCommand.self, LockdownCommand.self, DrainCommand.self, CheckCommand.self, ProfilesCommand.self,
            PortalCommand.self, ExcludeCommand.self, InstallProfileCommand.self, UseProfileCommand.self, DoctorCommand.self, BugReportCommand.self, TimelineCommand.self,
        ])

    /// Runs the command; a bad file a person wrote exits 2 with `file:line: message`, any other
    /// failure exits 1 with one line saying what to do. Argument errors keep the usual usage text.
    static func main() {
        // Every live stream (monitor, record, status) is read line by line, also through a pipe
        // or into a file: a line goes out when it is complete, never held in a block buffer.
        CShims_line_buffer_stdout()
        do {
            var command = try parseAsRoot()
            try command.run()
        } catch let error as ConfigError {
            printError("\(error)")
            Glibc.exit(2)
        } catch let error as AgentError {
            printError(error.message)
            Glibc.exit(1)
        } catch let error as ControlError {
            printError(error.message)
            Glibc.exit(1)
        } catch {
            exit(withError: error)
        }
    }
}

/// A failure at run time, said in one line.
struct AgentError: Error {
    var message: String
    init(_ message: String) { self.message = message }
}
