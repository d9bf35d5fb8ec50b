import Foundation
import Glibc
import NamespaceLab
import DesktopModel
import Testing
@testable import agent

/// `scripts/package`: the Debian package is built from the tested binary, unpacked into a
/// throwaway root, and what it installs works there: the binary, its man pages and completions,
/// /etc/roam owner-only, the network managers' drop-ins, units that `systemd-analyze verify`
/// accepts and rates at most 3.0.
struct PackageTests {
    static let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()

    /// The systemctl calls `postinst configure FROM` makes, with systemctl, groupadd and chmod
    /// standing in for the real ones and /run/systemd/system present (a mount namespace's).
    private func upgradeCalls(postinst: String, from: String, scratch: String) throws -> [String] {
        let bin = scratch + "/stubs"
        let log = scratch + "/systemctl.log"
        mkdir(bin, 0o755)
        unlink(log)
        for (tool, body) in [("systemctl", "echo \"$*\" >> \(log)"), ("groupadd", "true"), ("chmod", "true"), ("getent", "true")] {
            try "#!/bin/sh\n\(body)\n".write(toFile: "\(bin)/\(tool)", atomically: true, encoding: .utf8)
            chmod("\(bin)/\(tool)", 0o755)
        }
        let script = "mount -t tmpfs none /run && mkdir -p /run/systemd/system && PATH=\(bin):$PATH sh \(postinst) configure \(from)"
        let ran = try NamespaceLab.capture(URL(fileURLWithPath: "/usr/bin/unshare"), ["--mount", "--propagation", "private", "sh", "-c", script])
        try #require(ran.status == 0, "\(ran.output)")
        return ((try? String(contentsOfFile: log, encoding: .utf8)) ?? "").split(separator: "\n").map(String.init)
    }

    /// The keys of one section of an INI-style file (networkd.conf, NetworkManager.conf), comments
    /// and other sections left out.
    static func keys(_ text: String, section: String) -> [String: String] {
        var current = "", keys: [String: String] = [:]
        for line in text.split(separator: "\n").map({ $0.trimmingCharacters(in: .whitespaces) }) {
            if line.isEmpty || line.hasPrefix("#") || line.hasPrefix(";") { continue }
            if line.hasPrefix("[") && line.hasSuffix("]") { current = String(line.dropFirst().dropLast()); continue }
            guard current == section, let equals = line.firstIndex(of: "=") else { continue }
            keys[line[..<equals].trimmingCharacters(in: .whitespaces)] =
                line[line.index(after: equals)...].trimmingCharacters(in: .whitespaces)
        }
        return keys
    }

    @Test func thePackageInstallsAndWhatItInstallsWorks() throws {
        let work = FileManager.default.temporaryDirectory.appendingPathComponent("roam-package-\(getpid())").path
        mkdir(work, 0o700)
        defer { _ = try? FileManager.default.removeItem(atPath: work) }
        let tool = Self.repository.appendingPathComponent(".build/debug/generate-manual").path
        try #require(access(tool, X_OK) == 0, "no \(tool): scripts/setup builds it")

        let desktop = RoamingLab.builtAgent.deletingLastPathComponent().appendingPathComponent("roam-desktop").path
        let built = try NamespaceLab.capture(Self.repository.appendingPathComponent("scripts/package"),
                                             ["--binary", RoamingLab.builtAgent.path, "--desktop-binary", desktop,
                                              "--manual-tool", tool, "--output", work])
        try #require(built.status == 0, "\(built.output)")
        // The paths, among what the build said (its standard error, in the same capture).
        let debs = built.output.split(separator: "\n").map(String.init).filter { $0.hasPrefix("/") && $0.hasSuffix(".deb") }
        try #require(debs.count == 2, "\(built.output)")
        let (deb, desktopDeb) = (debs[0], debs[1])
        // Named for this release and for the machine's own architecture, as dpkg names it.
        let architecture = try NamespaceLab.capture(URL(fileURLWithPath: "/usr/bin/dpkg"), ["--print-architecture"])
            .output.trimmingCharacters(in: .whitespacesAndNewlines)
        try #require(!architecture.isEmpty)
        #expect(deb.hasSuffix("/roam_\(Release.version)_\(architecture).deb"), "\(deb)")
        #expect(desktopDeb.hasSuffix("/roam-desktop_\(Release.version)_\(architecture).deb"), "\(desktopDeb)")

        let dpkgDeb = URL(fileURLWithPath: "/usr/bin/dpkg-deb")
        let listing = try NamespaceLab.capture(dpkgDeb, ["--contents", deb]).output
        #expect(listing.contains("drwx------ root/root") && listing.contains("./etc/roam/"), "/etc/roam is 0700: \(listing)")
        let info = try NamespaceLab.capture(dpkgDeb, ["--info", deb]).output
        #expect(info.contains("Package: roam") && info.contains("Version: \(Release.version)") && info.contains("libsodium") && info.contains("libssl3"), "\(info)")
        // libpq only for gateways with users-from (loaded when one starts); the schema where the log says it is.
        #expect(info.contains("Suggests: libpq5") && !info.contains("Depends: libpq"), "\(info)")
        for migration in ["001-users.sql", "002-notify.sql", "003-sessions.sql"] {
            #expect(listing.contains("-rw-r--r-- root/root") && listing.contains("./usr/share/roam/sql/\(migration)"), "\(migration): \(listing)")
        }

        let root = work + "/root"
        let unpacked = try NamespaceLab.capture(dpkgDeb, ["-x", deb, root])
        try #require(unpacked.status == 0, "\(unpacked.output)")
        let agent = URL(fileURLWithPath: root + "/usr/bin/agent")

        // The drop-ins that keep systemd-networkd off the agent's rules and routes and
        // NetworkManager off its tunnel device: where each reads them, 0644, the keys in their sections.
        for (path, section, keys) in [
            ("/usr/lib/systemd/networkd.conf.d/roam.conf", "Network",
             ["ManageForeignRoutingPolicyRules": "no", "ManageForeignRoutes": "no"]),
            ("/usr/lib/NetworkManager/conf.d/roam.conf", "keyfile", ["unmanaged-devices": "interface-name:roam*"]),
        ] {
            var info = stat()
            try #require(stat(root + path, &info) == 0, "\(path) is not in the package")
            #expect(info.st_mode & 0o7777 == 0o644, "\(path): mode \(String(info.st_mode & 0o7777, radix: 8))")
            let text = try String(contentsOfFile: root + path, encoding: .utf8)
            #expect(Self.keys(text, section: section) == keys, "\(path): \(text)")
        }

        // The binary, and the maintainer's script that makes the group.
        let version = try NamespaceLab.capture(agent, ["--version"])
        #expect(version.status == 0 && version.output.trimmingCharacters(in: .whitespacesAndNewlines) == Release.version)
        let control = work + "/control"
        _ = try NamespaceLab.capture(dpkgDeb, ["--control", deb, control])
        let postinst = try String(contentsOfFile: control + "/postinst", encoding: .utf8)
        #expect(postinst.contains("groupadd --system roam"))
        #expect(try NamespaceLab.capture(URL(fileURLWithPath: "/bin/sh"), ["-n", control + "/postinst"]).status == 0)
        // What an upgrade asks of systemd: clients older than 0.14.0 (which took the lockdown
        // away on SIGTERM) end by SIGKILL, which leaves the table, before the restart; newer
        // ones are only restarted (SIGTERM keeps it). Run against a systemctl that records its
        // calls, in a mount namespace whose /run says systemd runs.
        if getuid() != 0 { print("skipping the upgrade's calls: a mount namespace needs root") }
        for (from, kills) in getuid() == 0 ? [("0.13.0", true), ("0.14.0", false), ("", false)] : [] {
            let calls = try upgradeCalls(postinst: control + "/postinst", from: from, scratch: work)
            let kill = calls.firstIndex { $0.hasPrefix("kill --kill-who=main --signal=KILL roam-client.service") }
            let restart = calls.firstIndex { $0.hasPrefix("try-restart roam-client.service") }
            #expect((kill != nil) == kills, "from \(from): \(calls)")
            #expect(restart != nil || from.isEmpty, "from \(from): \(calls)")
            if from.isEmpty { #expect(restart == nil, "a first install restarts nothing: \(calls)") }
            if let kill, let restart { #expect(kill < restart) }
            #expect(!calls.contains { $0.hasPrefix("kill") && $0.contains("roam-server") }, "the server keeps its drain on SIGTERM")
        }

        // Man pages for every command, and completions for three shells.
        for page in ["agent", "agent.up", "agent.status", "agent.down", "agent.check", "agent.profiles", "agent.install-profile", "agent.serve"] {
            #expect(access(root + "/usr/share/man/man8/\(page).8.gz", R_OK) == 0, "man page \(page)")
        }
        let status = try NamespaceLab.capture(URL(fileURLWithPath: "/bin/sh"),
                                              ["-c", "gzip -dc \(root)/usr/share/man/man8/agent.status.8.gz"]).output
        #expect(status.contains("watch") && status.contains(".Dt AGENT.STATUS 8"), "\(status.prefix(400))")
        for file in ["bash-completion/completions/agent", "zsh/vendor-completions/_agent", "fish/vendor_completions.d/agent.fish"] {
            let text = (try? String(contentsOfFile: root + "/usr/share/" + file, encoding: .utf8)) ?? ""
            #expect(text.contains("agent") && text.contains("status"), "completion \(file)")
        }

        // The installed binary checks a configuration.
        let (_, key) = try NamespaceLab.capture(agent, ["keygen", "--out", work + "/key"])
        try """
            server: 192.0.2.1:51820
            server-key: \(key.trimmingCharacters(in: .whitespacesAndNewlines))
            private-key-file: \(work)/key
            """.write(toFile: work + "/client.yaml", atomically: true, encoding: .utf8)
        let checked = try NamespaceLab.capture(agent, ["check", "--config", work + "/client.yaml"])
        #expect(checked.status == 0 && checked.output.contains("a client configuration"), "\(checked.output)")

        try desktopPackage(desktopDeb, into: work + "/desktop-root")

        // The units: accepted by systemd, and rated at most 3.0 by its security analysis.
        let analyze = URL(fileURLWithPath: "/usr/bin/systemd-analyze")
        try #require(access(analyze.path, X_OK) == 0, "systemd-analyze is needed (Debian's systemd package)")
        let units = root + "/usr/lib/systemd/system/"
        let shipped = ["roam-client.service", "roam-server.service", "roam-lockdown.service", "roam@.service"]
        // Verified where the agent is: the same units side by side (one requires another), pointing
        // into the throwaway root.
        func copyName(_ unit: String) -> String { unit == "roam@.service" ? "roam@vpn.service" : unit }
        for unit in shipped {
            let text = try String(contentsOfFile: units + unit, encoding: .utf8)
            #expect(text.contains("ExecStart=/usr/bin/agent "), "\(unit) runs the installed agent")
            try text.replacingOccurrences(of: "/usr/bin/agent", with: agent.path)
                .write(toFile: work + "/" + copyName(unit), atomically: true, encoding: .utf8)
        }
        for unit in shipped {
            let name = copyName(unit)
            let copy = work + "/" + name
            let verified = try NamespaceLab.capture(analyze, ["verify", copy])
            #expect(verified.status == 0 && !verified.output.contains(name + ":"), "\(unit): \(verified.output)")
            let security = try NamespaceLab.capture(analyze, ["security", "--offline=true", copy]).output
            let score = security.split(separator: "\n").first { $0.contains("Overall exposure level") }
                .flatMap { $0.split(separator: ":").last?.split(separator: " ").first }.flatMap { Double($0) }
            #expect(score.map { $0 <= 3.0 } == true, "\(unit): exposure \(score.map { "\($0)" } ?? "unknown")")
        }
    }

    /// roam-desktop's package: the app with its launcher, its autostart entry (hidden, in the
    /// tray), the state's icons; the agent's package and GTK's and libadwaita's as dependencies.
    private func desktopPackage(_ deb: String, into root: String) throws {
        let dpkgDeb = URL(fileURLWithPath: "/usr/bin/dpkg-deb")
        let info = try NamespaceLab.capture(dpkgDeb, ["--info", deb]).output
        #expect(info.contains("Package: roam-desktop") && info.contains("Depends: roam (= \(Release.version)), "), "\(info)")
        #expect(info.contains("libgtk-4-1") && info.contains("libadwaita-1-0"), "\(info)")
        let unpacked = try NamespaceLab.capture(dpkgDeb, ["-x", deb, root])
        try #require(unpacked.status == 0, "\(unpacked.output)")
        var app = stat()
        #expect(stat(root + "/usr/bin/roam-desktop", &app) == 0 && app.st_mode & 0o777 == 0o755, "the app")
        let launcher = try String(contentsOfFile: root + "/usr/share/applications/org.roam.Desktop.desktop", encoding: .utf8)
        #expect(Self.keys(launcher, section: "Desktop Entry")["Exec"] == "roam-desktop", "\(launcher)")
        #expect(Self.keys(launcher, section: "Desktop Entry")["Icon"] == "org.roam.Desktop")
        let autostart = try String(contentsOfFile: root + "/etc/xdg/autostart/roam-desktop.desktop", encoding: .utf8)
        #expect(Self.keys(autostart, section: "Desktop Entry")["Exec"] == "roam-desktop --hidden", "\(autostart)")
        // Every icon the app names (the tray's by state, the notifications') is there, as SVG.
        let icons = Set(TrayView.icons).union(["org.roam.Desktop-symbolic"])
        for icon in icons {
            let text = (try? String(contentsOfFile: root + "/usr/share/icons/hicolor/symbolic/apps/\(icon).svg", encoding: .utf8)) ?? ""
            #expect(text.hasPrefix("<svg") && text.contains("viewBox=\"0 0 16 16\""), "\(icon): \(text.prefix(80))")
        }
        #expect(access(root + "/usr/share/icons/hicolor/scalable/apps/org.roam.Desktop.svg", R_OK) == 0)
        // The import's polkit action: an administrator's, kept a while, for a program that runs
        // only `agent install-profile`.
        let policy = root + "/usr/share/polkit-1/actions/org.roam.install-profile.policy"
        let parsed = try NamespaceLab.capture(URL(fileURLWithPath: "/usr/bin/python3"), ["-c", """
            import sys, xml.dom.minidom as m
            action = m.parse(sys.argv[1]).getElementsByTagName("action")[0]
            print(action.getAttribute("id"), action.getElementsByTagName("allow_active")[0].firstChild.data,
                  [a.firstChild.data for a in action.getElementsByTagName("annotate")
                   if a.getAttribute("key") == "org.freedesktop.policykit.exec.path"][0])
            """, policy])
        #expect(parsed.status == 0 && parsed.output.trimmingCharacters(in: .whitespacesAndNewlines)
            == "org.roam.install-profile auth_admin_keep /usr/libexec/roam/install-profile", "\(parsed.output)")
        var helper = stat()
        #expect(stat(root + "/usr/libexec/roam/install-profile", &helper) == 0 && helper.st_mode & 0o777 == 0o755)
        let helperText = (try? String(contentsOfFile: root + "/usr/libexec/roam/install-profile", encoding: .utf8)) ?? ""
        #expect(helperText.contains("exec /usr/bin/agent install-profile \"$@\""), "\(helperText)")
    }
}
