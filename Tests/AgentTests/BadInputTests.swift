import Foundation
import Glibc
import NamespaceLab
import Testing
import Tunnel

/// What a user can get wrong when starting the client: each is one line saying what to do, a
/// non-zero exit, and nothing left behind (no tunnel device, routes, rules or control socket)
/// but, once the agent got as far as loading it, the lockdown: a give-up is no reason to open
/// the machine (systemd starts the agent again).
@Suite(.enabled(if: NamespaceLab.isRoot, Comment(rawValue: NamespaceLab.skipReason)), .serialized)
struct BadInputTests {
    /// Runs `agent up` on the lab's client configuration (or `config`) and checks the common part.
    private func up(_ lab: RoamingLab, config: String? = nil, _ extra: [String] = [], wrapper: [String] = [],
                    inside: [String] = [], lockdownStays: Bool = false) throws -> (status: Int32, line: String)
    {
        let (status, output) = try lab.runAgent(
            ["up", "--config", config ?? lab.directory + "/client.yaml", "--control", lab.controlSocket] + extra,
            wrapper: wrapper, inside: inside)
        let last = output.split(separator: "\n").last.map(String.init) ?? ""
        #expect(last.hasPrefix("agent: "), "the last line is the one for the user: \(output)")
        #expect((try? lab.laptop.ip("link show roam0")) == nil, "no tunnel device left: \(output)")
        #expect(try !lab.laptop.ip("rule show").contains("51820"), "no policy rules left")
        #expect(try lab.laptop.ip("route show table all").contains("roam0") == false, "no routes left")
        #expect(access(lab.controlSocket, F_OK) != 0, "no control socket left")
        let tables = try NamespaceLab.capture(NamespaceLab.ipTool, ["netns", "exec", lab.laptop.name, "nft", "list", "tables"]).output
        #expect(tables.contains("table inet roam") == lockdownStays, "lockdown \(lockdownStays ? "kept" : "never loaded"): \(tables)")
        _ = try NamespaceLab.capture(NamespaceLab.ipTool, ["netns", "exec", lab.laptop.name, "nft", "delete", "table", "inet", "roam"])
        return (status, last)
    }

    @Test func configurationMissingOrMalformed() throws {
        let lab = try RoamingLab(vpn: .roam, routing: .full)
        let missing = try up(lab, config: lab.directory + "/nope.yaml")
        #expect(missing.status == 2 && missing.line.contains("nope.yaml: cannot read the file"), "\(missing)")
        try "server: [10.0.0.1\n".write(toFile: lab.directory + "/bad.yaml", atomically: true, encoding: .utf8)
        let malformed = try up(lab, config: lab.directory + "/bad.yaml")
        #expect(malformed.status == 2 && malformed.line.contains("bad.yaml:1:"), "\(malformed)")
    }

    @Test func serverNotRunningOrWrongServerKey() throws {
        let lab = try RoamingLab(vpn: .roam, routing: .full)
        let down = try up(lab, ["--wait-for-server", "2s"], lockdownStays: true)
        #expect(down.status == 1 && down.line.contains("no answer from the server 198.51.100.7:51820 in 2s"), "\(down)")

        try lab.startServer()
        let configuration = lab.directory + "/client.yaml"
        let original = try String(contentsOfFile: configuration, encoding: .utf8)
        let other = try PrivateKey.generate().publicKey.base64
        let wrongKey = original.split(separator: "\n").map { $0.hasPrefix("server-key:") ? "server-key: \(other)" : String($0) }
        try wrongKey.joined(separator: "\n").write(toFile: configuration, atomically: true, encoding: .utf8)
        let unanswered = try up(lab, ["--wait-for-server", "2s"], lockdownStays: true)
        #expect(unanswered.status == 1 && unanswered.line.contains("'server-key' is its public key"), "\(unanswered)")
    }

    @Test func rejectedPassword() throws {
        let lab = try RoamingLab(vpn: .roam, routing: .full)
        let hash = try PasswordHash.create(password: "right", cost: .minimum).encoded
        let server = lab.directory + "/server.yaml"
        try (try String(contentsOfFile: server, encoding: .utf8) + "\n  - {name: bob, password-hash: \"\(hash)\", addresses: [10.77.0.3]}\n")
            .write(toFile: server, atomically: false, encoding: .utf8)  // in place: it stays 0600
        try lab.startServer()
        let password = lab.directory + "/password"
        _ = FileManager.default.createFile(atPath: password, contents: Data("wrong\n".utf8), attributes: [.posixPermissions: 0o600])
        let client = lab.directory + "/client.yaml"
        try (try String(contentsOfFile: client, encoding: .utf8) + "\nusername: bob\npassword-file: \(password)\n")
            .write(toFile: client, atomically: true, encoding: .utf8)
        let rejected = try up(lab, lockdownStays: true)
        #expect(rejected.status == 1 && rejected.line.contains("the server rejected this client"), "\(rejected)")
        #expect(!lab.log("run-0.log").contains("wrong"), "the password is never logged")
    }

    /// A rule that lifts the lockdown on what the network says of itself (its router's hardware
    /// address, its Wi-Fi name) is refused at its line before anything is set up, as `agent
    /// check` refuses it; so is a pin that is not a key's hash.
    @Test func aLiftWithoutProofIsRefusedAtItsLine() throws {
        let lab = try RoamingLab(vpn: .roam, routing: .full)
        let configuration = lab.directory + "/client.yaml"
        let original = try String(contentsOfFile: configuration, encoding: .utf8)
        try lab.configure("client", "on-demand:\n  - name: office\n    match: {gateway-mac: \"52:54:00:0f:f1:ce\", ssid: Office}\n"
            + "    action: disconnect\n    lockdown: lift")
        let line = original.split(separator: "\n", omittingEmptySubsequences: false).count + 5
        let unproven = try up(lab)
        #expect(unproven.status == 2 && unproven.line.contains("client.yaml:\(line): 'lockdown: lift' needs proof the network cannot forge"),
                "\(unproven)")
        let checked = try NamespaceLab.capture(RoamingLab.builtAgent, ["check", "--config", configuration])
        #expect(checked.status == 2 && checked.output.contains("client.yaml:\(line): 'lockdown: lift' needs proof"), "\(checked.output)")

        try lab.editConfiguration("client") { _ in
            original + "\non-demand:\n  - name: office\n    match:\n      probe:\n        url: \"https://10.20.0.1/roam\"\n"
                + "        expect: 204\n        pin: \"sha256//not-a-hash\"\n    action: disconnect\n    lockdown: lift\n"
        }
        let badPin = try up(lab)
        #expect(badPin.status == 2 && badPin.line.contains("client.yaml:\(line + 2): 'pin' is sha256//"), "\(badPin)")
    }

    @Test func noTunDriver() throws {
        let lab = try RoamingLab(vpn: .roam, routing: .full)
        // A mount namespace of its own where /dev/net is empty: the machine without the driver.
        let hidden = ["/usr/bin/unshare", "-m", "/bin/sh", "-c", "mount -t tmpfs none /dev/net && exec \"$@\"", "sh"]
        let result = try up(lab, wrapper: hidden)
        #expect(result.status == 1 && result.line.contains("/dev/net/tun") && result.line.contains("modprobe tun"), "\(result)")
    }

    @Test func notRoot() throws {
        let lab = try RoamingLab(vpn: .roam, routing: .full)
        // `ip netns exec` needs root itself; the agent behind it runs as nobody, with no capabilities.
        let nobody = ["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all",
                      "--bounding-set=-all"]
        // A file this user cannot read is said first: the file comes before the privilege.
        let unreadable = try up(lab, inside: nobody)
        #expect(unreadable.status == 2 && unreadable.line.contains("cannot read the file"), "\(unreadable)")
        // A readable, well-formed one gets as far as the privilege check.
        let readable = "/run/roam-notroot-\(getpid()).yaml"
        _ = try? FileManager.default.removeItem(atPath: readable)
        try FileManager.default.copyItem(atPath: lab.directory + "/client.yaml", toPath: readable)
        defer { unlink(readable) }
        chmod(readable, 0o644)
        let result = try up(lab, config: readable, inside: nobody)
        #expect(result.status == 1 && result.line.contains("needs root (or CAP_NET_ADMIN)"), "\(result)")
    }
}
