import Basics
import ControlWire
import DesktopModel
import DesktopShell
import Glibc

/// The app on the main thread: it turns what the agent reports into what the shell shows, and
/// what the user does into requests on the control socket. It decides nothing about the tunnel.
@MainActor
final class DesktopApp {
    let options: DesktopOptions
    private var report: AgentReport?
    private var screen: Screen?
    /// The notification shown now, if any: the app keeps one.
    private var alert: Alert?
    /// The tray's menu as last shown, to know what an entry's index means.
    private var tray: TrayView?
    /// The profile being imported: its name and bytes, and where it stands.
    private var importing: (name: String, bytes: [UInt8])?
    private var importStatus: ImportStatus?

    init(options: DesktopOptions) {
        self.options = options
    }

    /// The app starts: build the window, show what is known (nothing yet: not running), present
    /// it unless started hidden, and start following the agent.
    func activate() {
        if options.hidden { roam_shell_keep_running() }
        roam_shell_build_window("Roam")
        show(.unreachable(why: "Waiting for the agent at \(options.socket)…"))
        if !options.hidden { roam_shell_present() }
        AgentLink.follow(socket: options.socket)
    }

    /// What a background thread handed over.
    func deliver(_ delivery: Delivery) {
        switch delivery {
        case .report(let report): show(report)
        case .refused(let message):
            roam_shell_toast(message)
            // The switch moved but the agent did not: put it back where the agent is.
            if let screen { render(screen) }
        }
    }

    func switchToggled(on: Bool) {
        AgentLink.ask(command(switchingOn: on), socket: options.socket)
    }

    func logIn() {
        guard case .status(let status) = report, status.state == .portal else { return }
        var arguments = [options.agent, "portal", "--control", options.socket, "--run", options.browser]
        if let url = status.portal?.url { arguments.append(url) }
        let problem = Self.withCStrings(arguments) { argv in roam_shell_spawn(argv + [nil]) }
        if let problem {
            roam_shell_toast("Cannot open the login page: \(String(cString: problem))")
            free(problem)
        }
    }

    /// The user chose `key` on the notification; `default` is the notification itself.
    func notificationAction(_ key: String) {
        perform(MenuAction(rawValue: key) ?? .open)
    }

    /// The user chose the tray menu's entry at `index`.
    func menuChosen(_ index: Int) {
        guard let items = tray?.items, items.indices.contains(index), items[index].enabled else { return }
        if items[index].action == .useProfile, let profile = items[index].profile { return use(profile) }
        perform(items[index].action)
    }

    /// The user pressed "Use" on the Profiles list's row at `index`.
    func profileChosen(_ index: Int) {
        guard case .details(let details) = screen, details.choices.indices.contains(index) else { return }
        use(details.choices[index].name)
    }

    /// Asks the agent to run `profile` instead of its own.
    private func use(_ profile: String) {
        AgentLink.ask(.useProfile, socket: options.socket, profile: profile)
    }

    /// The user chose `path` to import: read it (as the user: it is theirs), then check it.
    func importChosen(_ path: String) {
        guard importStatus?.isBusy != true else { return }
        let name: String
        do {
            name = try ProfileImport.name(ofFile: path)
        } catch {
            return showImport(.refused(error.message))
        }
        guard let bytes = SystemFiles.bytes(path, limit: Profiles.maxBytes + 1) else {
            return showImport(.refused("Cannot read \(path): \(String(cString: strerror(errno)))"))
        }
        guard bytes.count <= Profiles.maxBytes else {
            return showImport(.refused("\(path) is larger than \(Profiles.maxBytes >> 10) KiB: not a profile"))
        }
        importing = (name, bytes)
        showImport(.checking(name))
        run(.check, name: name, bytes: bytes)
    }

    /// A step of the import ended: the check's pass starts the installation.
    func commandFinished(tag: Int, status: Int32, output: String) {
        guard let importing, let step = [ProfileImport.Step.check, .install].first(where: { Self.tag(of: $0) == tag }) else { return }
        let next = ProfileImport.status(after: step, name: importing.name, exitStatus: status, output: output)
        showImport(next)
        if case .installing = next {
            run(.install, name: importing.name, bytes: importing.bytes)
        } else {
            self.importing = nil
        }
    }

    private static func tag(of step: ProfileImport.Step) -> Int { step == .check ? 0 : 1 }

    private func run(_ step: ProfileImport.Step, name: String, bytes: [UInt8]) {
        Self.withCStrings(ProfileImport.arguments(step, name: name, agent: options.agent)) { argv in
            roam_shell_run_command(argv + [nil], bytes, bytes.count, Int32(Self.tag(of: step)))
        }
    }

    private func showImport(_ status: ImportStatus) {
        importStatus = status
        if let report { show(report) }
    }

    private func perform(_ action: MenuAction) {
        switch action {
        case .connect: AgentLink.ask(.up, socket: options.socket)
        case .disconnect: AgentLink.ask(.down, socket: options.socket)
        case .logIn: logIn()
        case .open: roam_shell_present()
        case .quit: roam_shell_quit()
        // Only a tray entry names a profile (menuChosen); a heading does nothing.
        case .useProfile, .heading: break
        }
    }

    private func show(_ report: AgentReport) {
        let profiles = Profiles.names(in: options.profiles) ?? []
        let screen = Screen(report: report, profiles: profiles, importing: importStatus)
        switch AlertChange.between(showing: alert, report: report, previous: self.report) {
        case .keep: break
        case .show(let alert):
            self.alert = alert
            Self.withCStrings(alert.actions.map(\.key)) { keys in
                Self.withCStrings(alert.actions.map(\.label)) { labels in
                    roam_shell_notify(alert.title, alert.body, alert.icon, Int32(keys.count), keys, labels)
                }
            }
        case .withdraw:
            alert = nil
            roam_shell_withdraw()
        }
        self.report = report
        let tray = TrayView(report: report)
        if tray != self.tray {
            self.tray = tray
            Self.withCStrings(tray.items.map(\.label)) { labels in
                roam_shell_tray_update(tray.icon, tray.tooltip, Int32(labels.count), labels, tray.items.map(\.enabled))
            }
        }
        guard screen != self.screen else { return }
        self.screen = screen
        render(screen)
    }

    private func render(_ screen: Screen) {
        switch screen {
        case .welcome(let welcome):
            roam_shell_show_welcome(welcome.title, welcome.body, welcome.detail, welcome.importButton,
                                    welcome.importing?.text ?? "", welcome.importing?.isError ?? false,
                                    welcome.importing?.isBusy ?? false)
        case .details(let details):
            if let banner = details.banner {
                roam_shell_show_details(details.state, details.stateDetail, details.switchOn, details.switchEnabled,
                                        banner.text, banner.button)
            } else {
                roam_shell_show_details(details.state, details.stateDetail, details.switchOn, details.switchEnabled, nil, nil)
            }
            Self.withCStrings(details.rows.map(\.kind.title)) { titles in
                Self.withCStrings(details.rows.map(\.value)) { values in
                    roam_shell_set_rows(Int32(details.rows.count), titles, values)
                }
            }
            let choices = details.choices
            Self.withCStrings(choices.map(\.name)) { names in
                Self.withCStrings(choices.map(\.subtitle)) { subtitles in
                    Self.withCStrings(choices.map(\.buttonDescription)) { descriptions in
                        Self.withCStrings(choices.map { $0.button ?? "" }) { buttons in
                            let present = zip(buttons, choices).map { $1.button == nil ? nil : $0 }
                            roam_shell_set_profiles(Int32(choices.count), names, subtitles, present, descriptions)
                        }
                    }
                }
            }
        }
    }

    /// C strings for the duration of `body`.
    private static func withCStrings<R>(_ strings: [String], _ body: ([UnsafePointer<CChar>?]) -> R) -> R {
        let copies = strings.map { strdup($0) }
        defer { copies.forEach { free($0) } }
        return body(copies.map { UnsafePointer($0) })
    }
}

/// What a background thread hands to the main thread.
enum Delivery: Sendable {
    /// The agent's status, or that it is gone.
    case report(AgentReport)
    /// A request the agent refused or that could not reach it, said for the user.
    case refused(String)
}
