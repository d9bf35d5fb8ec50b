import ControlWire
import Foundation
import Glibc
import NamespaceLab
import Testing
@testable import agent

/// `agent install-profile`: what the desktop app's import runs as root (through pkexec), tried
/// here without polkit: a profile from standard input, checked as `agent check` checks it,
/// written root's and 0600, a mistake refused at its line with nothing written.
@Suite(.enabled(if: NamespaceLab.isRoot, Comment(rawValue: NamespaceLab.skipReason)))
struct InstallProfileTests {
    /// Runs the built agent's `install-profile` with `input` on its standard input, as root or,
    /// with `asNobody`, as uid 65534.
    static func install(_ arguments: [String], input: String, asNobody: Bool = false) throws -> (status: Int32, output: String) {
        let process = Process()
        if asNobody {
            process.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
            process.arguments = ["--reuid=65534", "--regid=65534", "--clear-groups", RoamingLab.builtAgent.path, "install-profile"] + arguments
        } else {
            process.executableURL = RoamingLab.builtAgent
            process.arguments = ["install-profile"] + arguments
        }
        let stdin = Pipe(), output = Pipe()
        process.standardInput = stdin
        process.standardOutput = output
        process.standardError = output
        try process.run()
        try stdin.fileHandleForWriting.write(contentsOf: Data(input.utf8))
        try stdin.fileHandleForWriting.close()
        let said = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return (process.terminationStatus, String(decoding: said, as: UTF8.self))
    }

    @Test func aProfileIsCheckedThenInstalledRootsAnd0600() throws {
        let work = FileManager.default.temporaryDirectory.appendingPathComponent("roam-install-\(getpid())").path
        mkdir(work, 0o755)
        defer { _ = try? FileManager.default.removeItem(atPath: work) }
        let directory = work + "/etc-roam"
        let key = try NamespaceLab.capture(RoamingLab.builtAgent, ["keygen", "--out", work + "/work.key"]).output
            .trimmingCharacters(in: .whitespacesAndNewlines)
        let profile = "server: 192.0.2.1:51820\nserver-key: \(key)\nprivate-key-file: \(work)/work.key\n"

        // A mistake: refused at its line, nothing written.
        let bad = try Self.install(["work", "--directory", directory], input: profile + "mode: sideways\n")
        #expect(bad.status == 2 && bad.output.contains("work.yaml:4: 'mode' is full or split"), "\(bad.output)")
        #expect(access(directory + "/work.yaml", F_OK) != 0)
        // A key file that is not there: the agent could not start it, and the refusal says where it must be.
        let keyless = try Self.install(["work", "--directory", directory], input: profile.replacingOccurrences(of: "work.key", with: "none.key"))
        #expect(keyless.status == 1 && keyless.output.contains("names its key file \(work)/none.key, which is not installed"), "\(keyless.output)")
        // --check: the same check, by anyone, writing nothing.
        let checked = try Self.install(["work", "--check", "--directory", directory], input: profile, asNobody: true)
        #expect(checked.status == 0 && checked.output.contains("work.yaml: a client configuration"), "\(checked.output)")
        let checkedBad = try Self.install(["work", "--check", "--directory", directory], input: profile + "mode: sideways\n", asNobody: true)
        #expect(checkedBad.status == 2 && checkedBad.output.contains("work.yaml:4: 'mode' is full or split"), "\(checkedBad.output)")
        #expect(access(directory, F_OK) != 0, "a check wrote nothing")
        // A server's configuration is not a profile; a name that is not one is refused before anything is read.
        let server = try Self.install(["work", "--directory", directory], input: "listen-port: 51820\nprivate-key-file: \(work)/work.key\nusers: {}\n")
        #expect(server.status != 0 && access(directory + "/work.yaml", F_OK) != 0, "\(server.output)")
        for name in ["../work", "work.yaml", "-work", "", String(repeating: "a", count: 33)] {
            let refused = try Self.install(["--directory", directory, "--", name], input: profile)
            #expect(refused.status == 64 && refused.output.contains("cannot be a profile's name"), "\(name): \(refused.output)")
        }
        // Only root installs.
        let nobody = try Self.install(["work", "--directory", directory], input: profile, asNobody: true)
        #expect(nobody.status == 1 && nobody.output.contains("run it as root"), "\(nobody.output)")

        let installed = try Self.install(["work", "--directory", directory], input: profile)
        #expect(installed.status == 0 && installed.output.contains("systemctl start roam@work"), "\(installed.output)")
        var info = stat()
        try #require(stat(directory + "/work.yaml", &info) == 0)
        #expect(info.st_uid == 0 && info.st_gid == 0 && info.st_mode & 0o7777 == 0o600, "mode \(String(info.st_mode & 0o7777, radix: 8))")
        #expect(try String(contentsOfFile: directory + "/work.yaml", encoding: .utf8) == profile)
        var made = stat()
        #expect(stat(directory, &made) == 0 && made.st_mode & 0o777 == 0o700, "the directory is made root's only")
        // An installed profile stays unless replaced; nothing of the attempt is left beside it.
        let again = try Self.install(["work", "--directory", directory], input: profile + "lockdown: false\n")
        #expect(again.status == 1 && again.output.contains("--replace"), "\(again.output)")
        let replaced = try Self.install(["work", "--replace", "--directory", directory], input: profile + "lockdown: false\n")
        #expect(replaced.status == 0 && replaced.output.contains("lockdown off"), "\(replaced.output)")
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory) == ["work.yaml"])
    }

    @Test func profileNames() {
        for name in ["work", "Home-2", "a_b", "0"] { #expect(Profiles.isName(name), "\(name)") }
        for name in ["", "../x", "a/b", "a.yaml", "-a", "_a", "é", "a b", String(repeating: "x", count: 33)] {
            #expect(!Profiles.isName(name), "\(name)")
        }
    }
}
