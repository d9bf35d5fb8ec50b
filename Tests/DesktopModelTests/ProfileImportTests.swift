@testable import DesktopModel
import Testing

@Suite struct ProfileImportTests {
    @Test func aProfileIsNamedByItsFile() throws {
        #expect(try ProfileImport.name(ofFile: "/home/ana/Downloads/work.yaml") == "work")
        #expect(try ProfileImport.name(ofFile: "/home/ana/home-2.yml") == "home-2")
        let spaced = #expect(throws: ImportRefusal.self) { try ProfileImport.name(ofFile: "/home/ana/My Work.yaml") }
        #expect(spaced?.message.contains("rename it") == true && spaced?.message.contains("roam@NAME") == true)
        let text = #expect(throws: ImportRefusal.self) { try ProfileImport.name(ofFile: "/home/ana/work.txt") }
        #expect(text?.message.contains("NAME.yaml") == true)
        for file in ["/x/.yaml", "/x/-a.yaml", "/x/a.b.yaml"] {
            #expect(throws: ImportRefusal.self) { try ProfileImport.name(ofFile: file) }
        }
    }

    @Test func theArgumentsAreTheNameAndNeverTheProfile() {
        #expect(ProfileImport.arguments(.check, name: "work", agent: "/usr/bin/agent")
            == ["/usr/bin/agent", "install-profile", "work", "--check"])
        #expect(ProfileImport.arguments(.install, name: "work", agent: "/usr/bin/agent")
            == ["pkexec", "/usr/libexec/roam/install-profile", "work"])
    }

    @Test func aMistakeIsShownWithItsLine() {
        let refused = ProfileImport.status(after: .check, name: "work", exitStatus: 2,
                                           output: "agent: work.yaml:4: 'mode' is full or split, got \"sideways\"\n")
        #expect(refused == .refused("Not installed: work.yaml:4: 'mode' is full or split, got \"sideways\""))
        #expect(refused.isError && !refused.isBusy)
        // A note (a key only root may read, not checked as the user) is no reason to stop.
        let passed = ProfileImport.status(after: .check, name: "work", exitStatus: 0,
                                          output: "note: /etc/roam/work.key is not readable as uid 1000: not checked\nwork.yaml: a client configuration\n")
        #expect(passed == .installing("work") && passed.isBusy)
    }

    @Test func theInstallationsEndings() {
        let installed = ProfileImport.status(after: .install, name: "work", exitStatus: 0, output: "installed /etc/roam/work.yaml: ...\n")
        #expect(installed.text.contains("systemctl start roam@work") && !installed.isError)
        #expect(ProfileImport.status(after: .install, name: "work", exitStatus: 126, output: "")
            == .refused("Not installed: no administrator's password was given"))
        let unauthorized = ProfileImport.status(after: .install, name: "work", exitStatus: 127,
                                                output: "Error executing command as another user: Not authorized\n")
        #expect(unauthorized.text.hasSuffix("Not authorized"))
        let keyless = ProfileImport.status(after: .install, name: "work", exitStatus: 1,
                                           output: "agent: work.yaml names its key file /etc/roam/work.key, which is not installed: ...\n")
        #expect(keyless.text.contains("/etc/roam/work.key, which is not installed"))
        let unstarted = ProfileImport.status(after: .install, name: "work", exitStatus: -1, output: "Failed to execute child process “pkexec” (No such file or directory)")
        #expect(unstarted.text.hasPrefix("Cannot install the profile: Failed to execute"))
    }

    @Test func theWelcomeScreenCarriesTheImport() {
        let screen = Screen(report: .unreachable(why: "no agent"), profiles: [], importing: .checking("work"))
        guard case .welcome(let welcome) = screen else {
            Issue.record("expected the Welcome screen")
            return
        }
        #expect(welcome.importButton == "Import a profile…" && welcome.importing == .checking("work"))
        #expect(welcome.importing?.isBusy == true)
    }
}
