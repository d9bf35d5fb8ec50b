import Control
import ControlWire
import ArgumentParser
import ConfigReader
import Glibc
import Basics
import Settings

/// `agent profiles`: the VPN profiles of this machine, as Apple's apps list their configurations.
struct ProfilesCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "profiles", abstract: "List the client profiles (/etc/roam/NAME.yaml) and the state of each.",
        discussion: """
            Each client configuration in the directory is a profile, run by the service roam@NAME (the one \
            named client.yaml also by roam-client). A profile's state comes from its control socket \
            (/run/roam/NAME.sock; roam-client's is /run/roam/agent.sock): stopped when nothing answers. A \
            file with a mistake is listed with its error. Server configurations are left out.
            """)

    @Option(help: "Where the profiles are.")
    var directory = Profiles.directory
    @Option(help: "Where running agents have their control sockets.")
    var runtime = "/run/roam"
    @Flag(help: "Print one JSON object per profile.")
    var json = false

    struct Row {
        var name: String
        var mode = "-", lockdown = "-", server = "-", state = "stopped"
        var error: String?
    }

    func run() throws {
        guard let names = Profiles.names(in: directory) else {
            throw AgentError("cannot list \(directory): \(String(cString: strerror(errno)))" + (errno == EACCES ? " (it is root's)" : ""))
        }
        var rows: [Row] = []
        for name in names {
            let path = directory + "/" + name + ".yaml"
            var row = Row(name: name)
            do {
                guard try CheckCommand.kind(of: path) == .client else { continue }
                let (reader, root) = try YAMLReader.load(path, as: .clientConfiguration)
                let settings = try reader.client(root)
                row.mode = settings.mode.socketMark != nil ? "full" : "split"
                row.lockdown = settings.lockdown ? "on" : "off"
                row.server = settings.servers.map(\.name).joined(separator: ",")
            } catch {
                row.error = "\(error)"
                row.state = "invalid"
            }
            if row.error == nil {
                var socket = runtime + "/" + name + ".sock"
                if name == "client", access(socket, F_OK) != 0 { socket = runtime + "/agent.sock" }
                if let answer = try? ControlClient.ask(.status, at: socket) {
                    row.state = answer["status"]?["state"]?.string ?? "running"
                }
            }
            rows.append(row)
        }
        if json {
            for row in rows {
                var fields: [(String, JSON)] = [("name", .string(row.name)), ("state", .string(row.state))]
                if let error = row.error {
                    fields.append(("error", .string(error)))
                } else {
                    fields += [("mode", .string(row.mode)), ("lockdown", .bool(row.lockdown == "on")),
                               ("servers", .array(row.server.split(separator: ",").map { .string(String($0)) }))]
                }
                print(JSON.object(fields).text)
            }
            return
        }
        guard !rows.isEmpty else { return print("no client profiles in \(directory)") }
        let width = max(4, rows.map(\.name.count).max() ?? 4)
        let pad = { (s: String, n: Int) in s + String(repeating: " ", count: max(1, n - s.count + 1)) }
        print(pad("NAME", width) + pad("MODE", 5) + pad("LOCKDOWN", 8) + pad("STATE", 11) + "SERVERS")
        for row in rows {
            if let error = row.error {
                print(pad(row.name, width) + pad("-", 5) + pad("-", 8) + pad(row.state, 11) + error)
            } else {
                print(pad(row.name, width) + pad(row.mode, 5) + pad(row.lockdown, 8) + pad(row.state, 11) + row.server)
            }
        }
    }
}
