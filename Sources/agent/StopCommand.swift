import ArgumentParser
import Basics
import Control
import ControlWire
import Glibc
import SystemDNS

/// `agent stop`: the operator's stop, the only one that opens the machine again.
struct StopCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "stop", abstract: "Stop the running client and open the machine again (the lockdown and the tunnel's resolvers go).",
        discussion: """
            A signal never opens the machine: SIGTERM, a restart, a package upgrade, a shutdown or a \
            start that timed out keep the lockdown until the next agent adopts it. This does, once the \
            session has said goodbye; it returns when the agent is gone. The client unit runs it as \
            ExecStop with --unit %n: then it stops the agent only when systemd stops the unit \
            (systemctl stop), not when systemd restarts it or the system shuts down, and otherwise \
            leaves the agent to end on SIGTERM with the lockdown kept. An agent that does not stop within 15 s \
            has the lockdown taken away without it, as `agent lockdown off` does.
            """)
    @OptionGroup var options: ControlOptions
    @Option(help: ArgumentHelp("Ask systemd's job for this unit first: open only on a stop, not a restart or a shutdown.", valueName: "unit"))
    var unit: String?

    func run() throws {
        if let unit {
            let (opens, why) = UnitStop.read(unit: unit)
            guard opens else {
                printError("the lockdown stays: \(why)")
                return
            }
        }
        let answer = try ControlClient.ask(.stop, at: options.control)
        print(answer["message"]?.string ?? answer.text)
        // The socket goes once the machine is open (or the lockdown could not be taken away,
        // which the agent's log says); an agent that hangs is systemd's to end.
        for _ in 0..<300 where access(options.control, F_OK) == 0 { usleep(50_000) }
        guard access(options.control, F_OK) != 0 else {
            // The operator asked for the machine to open: an agent that hangs does not keep it shut.
            printError("the agent did not stop within 15 s; opening the machine without it")
            return try LockdownCommand.openMachine()
        }
    }
}

/// Whether systemd stopping a unit is the operator's stop: the unit has a `stop` job (not a
/// `restart`, which `systemctl restart`, `try-restart` and a package's upgrade give) and the
/// system is not shutting down. Anything not known says no: the machine stays closed.
enum UnitStop {
    static func opensMachine(job: String?, systemState: String?) -> (Bool, String) {
        guard let job else { return (false, "systemd's job for the unit is not known") }
        guard job == "stop" else { return (false, "systemd is running a \(job) job, not a stop") }
        guard let systemState else { return (false, "the system's state is not known") }
        guard systemState != "stopping" else { return (false, "the system is shutting down") }
        return (true, "systemd is stopping the unit")
    }

    /// Asks systemd (on the system bus) for `unit`'s job and the system's state.
    static func read(unit: String) -> (Bool, String) {
        var name = DBusWriter()
        name.string(unit)
        return read(asking: "GetUnit", signature: "s", body: name.bytes)
    }

    /// The same for the unit this process runs in (a stop that comes as SIGTERM alone), all of
    /// it over within `timeout`. PID 0 names the caller, as systemd sees it (its credentials on
    /// the bus), which holds in a PID namespace too.
    static func readOwn(timeout: Duration) -> (Bool, String) {
        var pid = DBusWriter()
        pid.uint32(0)
        return read(asking: "GetUnitByPID", signature: "u", body: pid.bytes, deadline: Instant.now() + timeout)
    }

    private static func read(asking member: String, signature: String, body: [UInt8], deadline: Instant? = nil) -> (Bool, String) {
        let manager = "/org/freedesktop/systemd1"
        let destination = "org.freedesktop.systemd1"
        do {
            let bus = try DBusConnection.systemBus(deadline: deadline)
            let loaded = DBusVariant(try bus.call(destination: destination, path: manager, interface: destination + ".Manager",
                                                  member: member, signature: signature, body: body), signature: "o")
            guard let unitPath = loaded.string else { return opensMachine(job: nil, systemState: nil) }
            let job = try bus.property(destination: destination, path: unitPath, interface: destination + ".Unit", name: "Job")
            let jobType: String? = if let (id, path) = job.numberAndPath, id != 0 {
                try bus.property(destination: destination, path: path, interface: destination + ".Job", name: "JobType").string
            } else {
                nil
            }
            let state = try bus.property(destination: destination, path: manager, interface: destination + ".Manager", name: "SystemState")
            return opensMachine(job: jobType, systemState: state.string)
        } catch {
            return (false, "cannot ask systemd: \(error)")
        }
    }
}
