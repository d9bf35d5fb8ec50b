import ArgumentParser
import ControlWire

/// Where `agent drain` finds a server, and how long it gives sessions without a `drain-period`.
enum ServerControl {
    static let defaultPath = "/run/roam-server/control.sock"
    static let defaultDrainPeriod: Duration = .seconds(30)
}

/// `agent drain`.
struct DrainCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "drain",
        abstract: "Take a running server down gently: its clients move to their next server first, then it stops.",
        discussion: """
            Every session is told, authenticated, that the server is going away; clients with another server \
            in their list make a session there and move their traffic, then say goodbye. The server stops when \
            no session is left, or after its 'drain-period' (30 s when it has none). The server must run with \
            --control.
            """)
    @Option(help: "The server's control socket.")
    var control: String = ServerControl.defaultPath
    func run() throws { print(try ControlClient.ask(.drain, at: control)["message"]?.string ?? "") }
}
