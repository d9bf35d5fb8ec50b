public import Foundation
import Glibc

/// An HTTPS server for the on-demand rules' pinned probe: Debian's `socat` serving TLS (through
/// OpenSSL) inside a namespace, with a key of its own made for it in `directory` (owner-only) and
/// a self-signed certificate. Every request gets `200` and `answer`, and (unless `seen` says
/// otherwise) a `Roam-Seen` header with the address and port it saw the connection come from,
/// as docs/USER-GUIDE.md asks of a probe server. Its pin is worked out with `openssl` as that guide
/// tells users to. Stopped, by its process id, on `stop()` or deinit.
public final class PinnedServer {
    /// `sha256//` and the base64 of the SHA-256 of the certificate's SubjectPublicKeyInfo.
    public let pin: String
    /// What every request is answered, after the headers.
    public let answer: String
    private let process: Process

    public static let openssl = URL(fileURLWithPath: "/usr/bin/openssl")
    public static let socat = URL(fileURLWithPath: "/usr/bin/socat")
    public static var isAvailable: Bool {
        FileManager.default.isExecutableFile(atPath: openssl.path) && FileManager.default.isExecutableFile(atPath: socat.path)
    }

    /// What the server says it saw the connection come from.
    public enum Seen: Sendable {
        /// The peer's address and port, as a web server configured as docs/USER-GUIDE.md says would.
        case peer
        /// Nothing: a server that does not say.
        case nothing
        /// This text, whatever the peer: a server behind a relay says the relay's.
        case claimed(String)
    }

    /// Listens on `accept` (`[address:]port`) inside `lab` (in this process's namespace when nil);
    /// `name` keeps its files apart from another server's in the same directory.
    public init(in lab: NamespaceLab?, directory: String, name: String, accept: String, answer: String = "roam-office",
                seen: Seen = .peer) throws {
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

        let colon = accept.lastIndex(of: ":")
        let address = colon.map { String(accept[..<$0]) }, port = colon.map { String(accept[accept.index(after: $0)...]) } ?? accept
        let seenLine: String
        switch seen {
        case .peer: seenLine = "printf 'Roam-Seen: %s:%s\\r\\n' \"$SOCAT_PEERADDR\" \"$SOCAT_PEERPORT\""
        case .nothing: seenLine = ""
        case .claimed(let text): seenLine = "printf 'Roam-Seen: %s\\r\\n' '\(text)'"
        }
        // Each connection: the request's head read to its blank line (an answer to a request not
        // yet read would end in a reset), then the answer. socat forks and runs it with the
        // peer's address and port in its environment.
        let answerScript = home + "/answer.sh"
        try """
            cr=$(printf '\\r')
            while IFS= read -r line && [ "$line" != "$cr" ] && [ -n "$line" ]; do :; done
            printf 'HTTP/1.1 200 OK\\r\\n'
            \(seenLine)
            printf 'Content-Length: %d\\r\\nConnection: close\\r\\n\\r\\n' \(answer.utf8.count)
            cat '\(home)/answer'

            """.write(toFile: answerScript, atomically: true, encoding: .utf8)
        try answer.write(toFile: home + "/answer", atomically: true, encoding: .utf8)
        let listen = "OPENSSL-LISTEN:\(port)" + (address.map { ",bind=\($0)" } ?? "") + ",reuseaddr,fork,cert=\(certificate),key=\(key),verify=0"
        let run = "EXEC:/bin/sh \(answerScript)"
        let process = Process()
        if let lab {
            process.executableURL = NamespaceLab.ipTool
            process.arguments = ["netns", "exec", lab.name, Self.socat.path, listen, run]
        } else {
            process.executableURL = Self.socat
            process.arguments = [listen, run]
        }
        let log = home + "/socat.log"
        _ = FileManager.default.createFile(atPath: log, contents: nil)
        process.standardOutput = FileHandle(forWritingAtPath: log)
        process.standardError = FileHandle(forWritingAtPath: log)
        process.standardInput = FileHandle.nullDevice
        try process.run()
        self.process = process
        // Serving once it listens: a probe before that would be refused, and prove nothing.
        let ss = ["ss", "-Hltn", "sport = :\(port)"]
        let (tool, arguments) = lab.map { (NamespaceLab.ipTool, ["netns", "exec", $0.name] + ss) }
            ?? (URL(fileURLWithPath: "/usr/bin/ss"), Array(ss.dropFirst()))
        for _ in 0..<200 {
            let (_, listening) = try NamespaceLab.capture(tool, arguments)
            if !listening.trimmingCharacters(in: .whitespacesAndNewlines).isEmpty { return }
            guard process.isRunning else { break }
            usleep(25_000)
        }
        stop()
        throw NamespaceLab.Failure(description: "socat never listened on \(accept): "
            + ((try? String(contentsOfFile: log, encoding: .utf8)) ?? ""))
    }

    deinit { stop() }

    /// Ends the server (and the connections it forked): KILL, it holds nothing to tidy.
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
