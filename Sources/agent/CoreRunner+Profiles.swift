import ConfigReader
import Control
import ControlWire
import Basics
import Settings

/// `use-profile`: the operator chooses which installed profile the agent runs.
extension ClientDaemon.CoreRunner {
    /// Checks the profile `call` names, beside the configuration the agent runs, as a start would
    /// read it (the file, its keys and values, its key file); one that passes is run by starting
    /// the agent afresh in place (the lockdown kept throughout, as a reload that changes the
    /// tunnel does). A profile with a mistake changes nothing and is answered with it.
    func useProfile(_ call: ControlServer.Call) {
        guard let name = call.profile else {
            return call.reply(ControlFailure(code: "bad-request", message: "use-profile names the profile: "
                + "{\"version\":1,\"command\":\"use-profile\",\"profile\":\"NAME\"}").line)
        }
        let path = Profiles.file(of: name, in: configPath.parentDirectory)
        guard path != configPath else {
            return call.reply(ControlProtocol.answer([("message", .string("\(name) is the profile in use")), ("state", .string(reconnector.state.name))]))
        }
        do {
            let (reader, root) = try YAMLReader.load(path, as: .clientConfiguration)
            _ = try loadPrivateKey(try reader.client(root).privateKeyFile)
        } catch {
            log.warning("profile not used", metadata: ["profile": "\(name)", "error": "\(error)", "asked_by": "uid \(call.peer.uid)"])
            return call.reply(ControlFailure(code: "failed", message: "\(error)").line)
        }
        log.notice("switching profile; restarting", metadata: ["profile": "\(name)", "file": "\(path)", "asked_by": "uid \(call.peer.uid)"])
        call.reply(ControlProtocol.answer([("message", .string("switching to \(name): the agent starts again with \(path)")),
                                           ("state", .string(reconnector.state.name))]))
        nextConfigPath = path
        restartRequested = true
        feed(.request(.stop(.restarting)))
    }
}
