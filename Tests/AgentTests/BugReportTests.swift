import Foundation
import Glibc
import NamespaceLab
import Testing

/// `agent bugreport`, the built binary: every kind of secret the agent handles is planted in
/// the configurations and the files they name, and none of it is anywhere in the archive, while
/// what a reader of the report needs is. Needs no root.
struct BugReportTests {
    /// An Argon2id hash as `agent passwd` makes it.
    static func hash(_ password: String) throws -> String {
        let process = Process()
        process.executableURL = RoamingLab.builtAgent
        process.arguments = ["passwd"]
        let input = Pipe(), output = Pipe()
        process.standardInput = input
        process.standardOutput = output
        try process.run()
        input.fileHandleForWriting.write(Data((password + "\n").utf8))
        try input.fileHandleForWriting.close()
        let data = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return String(decoding: data, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
    }

    @Test func theArchiveHoldsWhatHelpsAndNoSecret() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("roam-bugreport-\(getpid())").path
        mkdir(directory, 0o700)
        defer { _ = try? FileManager.default.removeItem(atPath: directory) }
        func write(_ name: String, _ text: String) throws {
            try text.write(toFile: directory + "/" + name, atomically: true, encoding: .utf8)
            chmod(directory + "/" + name, 0o600)
        }
        let (_, publicKey) = try NamespaceLab.capture(RoamingLab.builtAgent, ["keygen", "--out", directory + "/client.key"])
        _ = try NamespaceLab.capture(RoamingLab.builtAgent, ["keygen", "--out", directory + "/server.key"])
        let clientKey = try String(contentsOfFile: directory + "/client.key", encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
        let serverKey = try String(contentsOfFile: directory + "/server.key", encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
        let flowHash = try Self.hash("carols-long-password-1"), blockHash = try Self.hash("daves-long-password-22")
        #expect(flowHash.hasPrefix("$argon2id$") && blockHash.hasPrefix("$argon2id$"))
        // Each secret differs from every other, so each one found names its way out. The
        // client's password is also pasted where a name goes, where only the scrub finds it.
        let secrets = [
            "client private key": clientKey,
            "server private key": serverKey,
            "client password": "correct-horse-battery-staple",
            "proxy password": "proxy-pass-7f3a9",
            "database password": "db-passfile-secret-42",
            "hash in a flow mapping": flowHash,
            "hash in a block mapping": blockHash,
            "an old password in a comment": "commented-old-pw-31",
        ]
        try write("password", secrets["client password"]! + "\n")
        try write("proxy-password", secrets["proxy password"]! + "\n")
        try write("passfile", "db.example:5432:roam:gateway:\(secrets["database password"]!)\n")
        try write("client.yaml", """
            server: 192.0.2.1:51820   # the old one; old password \(secrets["an old password in a comment"]!)
            server-key: \(publicKey.trimmingCharacters(in: .whitespacesAndNewlines))
            private-key-file: \(directory)/client.key
            username: \(secrets["client password"]!)
            password-file: \(directory)/password
            tcp: {port: 443, proxy: {address: 192.0.2.8:3128, user: bob, password-file: \(directory)/proxy-password}}
            """)
        try write("server.yaml", """
            listen-port: 51820
            private-key-file: \(directory)/server.key
            tunnel: {addresses: [10.77.0.1/24]}
            users:
              - {name: carol, password-hash: "\(secrets["hash in a flow mapping"]!)", addresses: [10.77.0.3]}
              - name: dave
                password-hash: '\(secrets["hash in a block mapping"]!)'
                addresses: [10.77.0.4]
            """)
        try write("fleet.yaml", """
            listen-port: 51820
            private-key-file: \(directory)/server.key
            tunnel: {addresses: [10.77.0.1/24]}
            users-from: {url: "postgresql://gateway@db.example/roam", password-file: \(directory)/passfile}
            """)
        let archive = directory + "/report.tar"
        let made = try NamespaceLab.capture(RoamingLab.builtAgent, [
            "bugreport", "--config", directory + "/client.yaml", "--config", directory + "/server.yaml",
            "--config", directory + "/fleet.yaml", "--config", directory + "/client.key",
            "--control", directory + "/no-agent.sock", "--since", "1", "--out", archive,
        ])
        #expect(made.status == 0, "\(made.output)")
        #expect(made.output.contains("config/client.yaml") && made.output.contains("network.txt"), "it says what it wrote: \(made.output)")
        var info = stat()
        #expect(stat(archive, &info) == 0 && info.st_mode & 0o777 == 0o600, "owner-only")
        let bytes = try String(decoding: Data(contentsOf: URL(fileURLWithPath: archive)), as: UTF8.self)
        for (what, secret) in secrets {
            #expect(!bytes.contains(secret), "the \(what) is in the archive")
            // Nor any long piece of it (a hash cut at a comma, a key's first half).
            for piece in secret.split(separator: ",").map(String.init) + secret.split(separator: "$").map(String.init) where piece.count >= 12 {
                #expect(!bytes.contains(piece), "part of the \(what) is in the archive: \(piece)")
            }
        }
        // tar reads it; the configurations are there, with what is not secret; the key given as
        // a configuration is not.
        let tar = URL(fileURLWithPath: "/usr/bin/tar")
        let listing = try NamespaceLab.capture(tar, ["-tf", archive])
        #expect(listing.status == 0, "\(listing.output)")
        for name in ["README.txt", "version.txt", "config/client.yaml", "config/server.yaml", "config/fleet.yaml",
                     "config/client.key.not-included.txt", "status.json", "network.txt"] {
            #expect(listing.output.split(separator: "\n").contains { $0.hasSuffix("/" + name) }, "\(name) missing: \(listing.output)")
        }
        let client = try NamespaceLab.capture(tar, ["-xOf", archive, "--wildcards", "*/config/client.yaml"])
        #expect(client.output.contains("server: 192.0.2.1:51820") && client.output.contains("username: <removed>")
            && client.output.contains("password-file: \(directory)/password"), "\(client.output)")
        let server = try NamespaceLab.capture(tar, ["-xOf", archive, "--wildcards", "*/config/server.yaml"])
        #expect(server.output.contains("name: carol") && server.output.contains("password-hash: <removed>"), "\(server.output)")
        let fleet = try NamespaceLab.capture(tar, ["-xOf", archive, "--wildcards", "*/config/fleet.yaml"])
        #expect(fleet.output.contains("postgresql://gateway@db.example/roam"), "\(fleet.output)")
        #expect(bytes.contains("agent 0.") && bytes.contains("no answer from \(directory)/no-agent.sock"))
        // An existing file is never replaced.
        let again = try NamespaceLab.capture(RoamingLab.builtAgent, ["bugreport", "--config", directory + "/client.yaml", "--out", archive])
        #expect(again.status != 0 && again.output.contains("cannot create"), "\(again.output)")
    }
}

/// `agent timeline`, the built binary, on a saved log: a picture of its transitions, and a clear
/// error for a log that has none.
struct TimelineCommandTests {
    @Test func aSavedLogIsDrawnAndALogWithoutTransitionsIsRefused() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("roam-timeline-\(getpid())").path
        mkdir(directory, 0o700)
        defer { _ = try? FileManager.default.removeItem(atPath: directory) }
        try """
            ts=1796169000.000 level=info msg=starting server=198.51.100.7:51820 mode=full
            ts=1796169000.010 level=info msg=transition from=offline to=connecting trigger=paths reason=pathAppeared(eth0) path=eth0/10.20.0.57 attempt=1 coalesced=0
            ts=1796169000.030 level=info msg=transition from=connecting to=connected trigger=handshake-ok reason="handshakeSucceeded(rtt 20ms)" path=eth0/10.20.0.57 attempt=0 coalesced=0
            ts=1796169040.000 level=info msg=transition from=connected to=connecting trigger=paths reason=pathLost(eth0) path=wifi0/192.168.1.23 attempt=1 coalesced=0
            ts=1796169041.500 level=info msg=transition from=connecting to=connected trigger=handshake-ok reason="handshakeSucceeded(rtt 30ms)" path=wifi0/192.168.1.23 attempt=0 coalesced=0
            """.write(toFile: directory + "/agent.log", atomically: true, encoding: .utf8)
        let drawn = try NamespaceLab.capture(RoamingLab.builtAgent, ["timeline", "--log", directory + "/agent.log", directory + "/out.svg"])
        #expect(drawn.status == 0 && drawn.output.contains("4 transitions, 1 outages"), "\(drawn.output)")
        let svg = try String(contentsOfFile: directory + "/out.svg", encoding: .utf8)
        #expect(svg.hasPrefix("<svg") || svg.hasPrefix("<?xml"))
        #expect(svg.contains("What the agent did") && svg.contains("wifi0") && svg.contains("handshake 30ms"))
        try "ts=1796169000.000 level=info msg=starting\n".write(toFile: directory + "/quiet.log", atomically: true, encoding: .utf8)
        let refused = try NamespaceLab.capture(RoamingLab.builtAgent, ["timeline", "--log", directory + "/quiet.log", directory + "/no.svg"])
        #expect(refused.status != 0 && refused.output.contains("no transition"), "\(refused.output)")
        #expect(access(directory + "/no.svg", F_OK) != 0)
    }
}
