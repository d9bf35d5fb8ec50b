import ControlWire
import DesktopModel
import DesktopShell
import Glibc

/// The app's side of the control socket, off the main thread: a watch that follows the agent
/// (and reconnects while it is gone), and the requests the user makes. Results go to the main
/// thread through the shell's queue; nothing here touches GTK.
enum AgentLink {
    /// How long to wait before watching again after the agent went away or never answered.
    static let retryDelay: UInt32 = 2

    /// Watches the agent at `socket` for the rest of the app's life, on a thread of its own.
    static func follow(socket: String) {
        background(Job { watch(socket: socket) })
    }

    /// Asks the agent for `command` on a thread of its own (the agent may take up to 10 s to
    /// answer); a refusal is said to the user.
    static func ask(_ command: ControlCommand, socket: String, profile: String? = nil) {
        background(Job {
            do {
                _ = try ControlClient.ask(command, at: socket, profile: profile)
            } catch {
                post(.refused("\(error)"))
            }
        })
    }

    private static func watch(socket: String) {
        var last: AgentReport?
        func tell(_ report: AgentReport) {
            // A gone agent is reported once, not every retry.
            guard report != last else { return }
            last = report
            post(.report(report))
        }
        while true {
            do {
                try ControlClient.watch(at: socket) { line in
                    if let report = try AgentReport(line: line) { tell(report) }
                    return true
                }
            } catch let error as StatusError {
                tell(.unreachable(why: error.description))
            } catch {
                tell(.unreachable(why: "\(error)"))
            }
            sleep(retryDelay)
        }
    }

    private static func post(_ delivery: Delivery) {
        roam_shell_post(Unmanaged.passRetained(Box(delivery)).toOpaque())
    }

    private static func background(_ job: Job) {
        roam_shell_background({ argument in
            guard let argument else { return }
            Unmanaged<Job>.fromOpaque(argument).takeRetainedValue().work()
        }, Unmanaged.passRetained(job).toOpaque())
    }

    /// Work for a background thread.
    final class Job: Sendable {
        let work: @Sendable () -> Void
        init(_ work: @escaping @Sendable () -> Void) { self.work = work }
    }
}

/// A value carried through C as a pointer.
final class Box<Value: Sendable>: Sendable {
    let value: Value
    init(_ value: Value) { self.value = value }
}
