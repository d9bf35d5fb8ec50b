public import Foundation
import Glibc

/// An HTTPS server for the on-demand rules' pinned probe: Debian's `openssl s_server` inside a
/// namespace, with a key of its own made for it in `directory` (owner-only) and a self-signed
/// certificate, serving one file, `/roam`, whose text is `answer`. Its pin is worked out with
/// `openssl` as the README tells users to. Stopped, by its process id, on `stop()` or deinit.
public final class PinnedServer {
    /// `sha256//` and the base64 of the SHA-256 of the certificate's SubjectPublicKeyInfo.
    public let pin: String
    /// What `GET /roam` answers, after the headers.
    public let answer: String
    private let process: Process

    public static let openssl = URL(fileURLWithPath: "/usr/bin/openssl")
    public static var isAvailable: Bool { FileManager.default.isExecutableFile(atPath: openssl.path) }

    /// Listens on `accept` (`[address:]port`) inside `lab`; `name` keeps its files apart from
    /// another server's in the same directory.
    public init(in lab: NamespaceLab, directory: String, name: String, accept: String, answer: String = "roam-office") throws {
        let home = directory + "/tls-" + name
        try FileManager.default.createDirectory(atPath: home, withIntermediateDirectories: true,
                                                attributes: [.posixPermissions: 0o700])
        let key = home + "/key.pem", certificate = home + "/cert.pem"
        // The key file exists, owner-only, before anything is written to it.
        _ = FileManager.default.createFile(atPath: key, contents: nil, attributes: [.posixPermissions: 0o600])
        try Self.run(["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", key])
        try Self.run(["req", "-x509", "-new", "-key", key, "-out", certificate, "-days", "1", "-subj", "/CN=\(name).roam.test"])
        var mode = stat()
        guard stat(key, &mode) == 0, mode.st_mode & 0o077 == 0 else {
            throw NamespaceLab.Failure(description: "\(key) is not owner-only")
        }
        let hash = try Self.shell("\(Self.openssl.path) x509 -in '\(certificate)' -pubkey -noout | \(Self.openssl.path) pkey -pubin "
            + "-outform der | \(Self.openssl.path) dgst -sha256 -binary | base64")
        pin = "sha256//" + hash
        self.answer = answer
        let served = home + "/www"
        try FileManager.default.createDirectory(atPath: served, withIntermediateDirectories: true)
        try answer.write(toFile: served + "/roam", atomically: true, encoding: .utf8)

        let process = Process()
        process.executableURL = NamespaceLab.ipTool
        process.arguments = ["netns", "exec", lab.name, Self.openssl.path, "s_server", "-accept", accept, "-cert", certificate,
                             "-key", key, "-WWW", "-quiet", "-naccept", "1000"]
        process.currentDirectoryURL = URL(fileURLWithPath: served)
        let log = home + "/s_server.log"
        _ = FileManager.default.createFile(atPath: log, contents: nil)
        process.standardOutput = FileHandle(forWritingAtPath: log)
        process.standardError = FileHandle(forWritingAtPath: log)
        process.standardInput = FileHandle.nullDevice
        try process.run()
        self.process = process
        // Serving once it listens: a probe before that would be refused, and prove nothing.
        let port = accept.split(separator: ":").last.map(String.init) ?? accept
        for _ in 0..<200 {
            let (_, listening) = try NamespaceLab.capture(NamespaceLab.ipTool, ["netns", "exec", lab.name, "ss", "-Hltn", "sport = :\(port)"])
            if !listening.trimmingCharacters(in: .whitespacesAndNewlines).isEmpty { return }
            guard process.isRunning else { break }
            usleep(25_000)
        }
        stop()
        throw NamespaceLab.Failure(description: "openssl s_server never listened on \(accept): "
            + ((try? String(contentsOfFile: log, encoding: .utf8)) ?? ""))
    }

    deinit { stop() }

    /// Ends the server: KILL, since s_server lets SIGTERM pass and holds nothing to tidy.
    public func stop() {
        guard process.isRunning else { return }
        kill(process.processIdentifier, SIGKILL)
        let deadline = Date().addingTimeInterval(2)
        while process.isRunning && Date() < deadline { usleep(10_000) }
    }

    private static func run(_ arguments: [String]) throws {
        let (status, output) = try NamespaceLab.capture(openssl, arguments)
        guard status == 0 else { throw NamespaceLab.Failure(description: "openssl \(arguments.joined(separator: " ")): \(output)") }
    }

    private static func shell(_ command: String) throws -> String {
        let (status, output) = try NamespaceLab.capture(URL(fileURLWithPath: "/bin/sh"), ["-c", command])
        guard status == 0 else { throw NamespaceLab.Failure(description: "\(command): \(output)") }
        return output.trimmingCharacters(in: .whitespacesAndNewlines)
    }
}
