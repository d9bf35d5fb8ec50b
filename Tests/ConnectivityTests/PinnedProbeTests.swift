import Foundation
import Glibc
import Basics
import Device
import PathMonitor
import Reconnector
import Testing
@testable import Connectivity

/// The pinned probe against real TLS servers on loopback: Debian's `openssl s_server` with keys
/// made for the test (owner-only, in a directory of its own), a plain HTTP server where TLS is
/// expected, and one that accepts and never says a word. Each failure is a reason, never a proof.
@Suite(.enabled(if: FileManager.default.isExecutableFile(atPath: "/usr/bin/openssl"), "needs openssl (scripts/setup installs it)"),
       .serialized)
struct PinnedProbeTests {
    static let loopback = Path(linkIndex: 1, interface: "lo", kind: .other, source: IPAddress("127.0.0.1")!, gateway: nil,
                               metric: 0, prefixLength: 8, mtu: 65536)
    /// Ports of this process's own, apart from another test run's.
    static let basePort = UInt16(20_000 + Int(getpid()) % 20_000)

    /// A TLS server on `port` with a fresh key; its pin, and a way to stop it.
    final class Server {
        let pin: String
        let process = Process()
        let directory: String

        init(port: UInt16, answer: String) throws {
            directory = NSTemporaryDirectory() + "roam-pinned-\(getpid())-\(port)"
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true,
                                                    attributes: [.posixPermissions: 0o700])
            let key = directory + "/key.pem", certificate = directory + "/cert.pem"
            _ = FileManager.default.createFile(atPath: key, contents: nil, attributes: [.posixPermissions: 0o600])
            try Self.shell("openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out '\(key)' 2>&1 && "
                + "openssl req -x509 -new -key '\(key)' -out '\(certificate)' -days 1 -subj /CN=probe.roam.test 2>&1")
            pin = "sha256//" + (try Self.shell("openssl x509 -in '\(certificate)' -pubkey -noout | openssl pkey -pubin -outform der "
                + "| openssl dgst -sha256 -binary | base64"))
            try FileManager.default.createDirectory(atPath: directory + "/www", withIntermediateDirectories: true)
            try answer.write(toFile: directory + "/www/roam", atomically: true, encoding: .utf8)
            process.executableURL = URL(fileURLWithPath: "/usr/bin/openssl")
            process.arguments = ["s_server", "-accept", "127.0.0.1:\(port)", "-cert", certificate, "-key", key, "-WWW", "-quiet"]
            process.currentDirectoryURL = URL(fileURLWithPath: directory + "/www")
            process.standardInput = FileHandle.nullDevice
            process.standardOutput = FileHandle.nullDevice
            process.standardError = FileHandle.nullDevice
            try process.run()
            // Up once it accepts (at most 5 s).
            let deadline = ContinuousClock.now + .seconds(5)
            while ContinuousClock.now < deadline {
                if (try? TCPConnection.connect(to: SocketAddress(IPAddress("127.0.0.1")!, port: port),
                                               deadline: ContinuousClock.now + .milliseconds(200))) != nil { break }
                usleep(20_000)
            }
        }

        deinit {
            // KILL: s_server lets SIGTERM pass, and holds nothing to tidy. A bounded wait, and no
            // run loop (which waitUntilExit would need and the test's threads have none of).
            if process.isRunning { kill(process.processIdentifier, SIGKILL) }
            let deadline = ContinuousClock.now + .seconds(2)
            while process.isRunning && ContinuousClock.now < deadline { usleep(10_000) }
            try? FileManager.default.removeItem(atPath: directory)
        }

        @discardableResult
        static func shell(_ command: String) throws -> String {
            let process = Process()
            process.executableURL = URL(fileURLWithPath: "/bin/sh")
            process.arguments = ["-c", command]
            let pipe = Pipe()
            process.standardOutput = pipe
            try process.run()
            let output = pipe.fileHandleForReading.readDataToEndOfFile()
            process.waitUntilExit()
            let text = String(decoding: output, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
            guard process.terminationStatus == 0 else { throw CocoaError(.fileReadUnknown, userInfo: ["output": text]) }
            return text
        }
    }

    private func probe(port: UInt16, pin: String, expect: HTTPExpectation = .body("roam-office")) -> PinnedProbe {
        PinnedProbe(OnDemandRule.Probe(url: "https://127.0.0.1:\(port)/roam", expect: expect, pin: KeyPin(pin)))!
    }

    @Test func thePinnedKeyAnsweringAsExpectedIsAProofOfThatPath() throws {
        let port = Self.basePort
        let server = try Server(port: port, answer: "roam-office")
        let result = probe(port: port, pin: server.pin).run(via: Self.loopback, mark: nil, avoiding: [])
        #expect(result == .success(KeyProof(pin: KeyPin(server.pin)!, path: Self.loopback.id)), "\(result)")
        // The right key with another answer proves nothing.
        let other = probe(port: port, pin: server.pin, expect: .body("something else")).run(via: Self.loopback, mark: nil, avoiding: [])
        guard case .failure(let why) = other else { Issue.record("\(other)"); return }
        #expect(why.description.contains("not as the rule expects"), "\(why)")
    }

    @Test func anotherKeyIsRefusedBeforeAnythingIsAsked() throws {
        let port = Self.basePort + 1
        let server = try Server(port: port, answer: "roam-office")
        let pinned = "sha256//BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc="
        let result = probe(port: port, pin: pinned).run(via: Self.loopback, mark: nil, avoiding: [])
        guard case .failure(let why) = result else { Issue.record("a wrong key proved: \(result)"); return }
        #expect(why.description.contains("showed the key \(server.pin), not the pinned \(pinned)"), "\(why)")
    }

    @Test func noTLSAndSilenceAndRefusalAreFailuresInBoundedTime() throws {
        let port = Self.basePort + 2
        let address = SocketAddress(IPAddress("127.0.0.1")!, port: port)
        let pin = "sha256//BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc="
        // Nobody listening.
        guard case .failure(let refused) = probe(port: port, pin: pin).run(via: Self.loopback, mark: nil, avoiding: []) else {
            Issue.record("no server proved something"); return
        }
        #expect(refused.description.contains("connect"), "\(refused)")

        // A listener that accepts and says nothing: the handshake gives up at the probe's time limit.
        let silent = try TCPListener(bindingTo: address)
        let started = ContinuousClock.now
        let result = probe(port: port, pin: pin).run(via: Self.loopback, mark: nil, avoiding: [])
        let took = ContinuousClock.now - started
        guard case .failure(let why) = result else { Issue.record("silence proved something"); return }
        #expect(why.description.contains("TLS handshake: no answer in time"), "\(why)")
        #expect(took >= .seconds(4) && took < .seconds(7), "bounded by the probe's time limit: \(took)")

        withExtendedLifetime(silent) {}

        // Plain HTTP where TLS is expected: the handshake fails at once.
        let web = try TCPListener(bindingTo: SocketAddress(IPAddress("127.0.0.1")!, port: port + 1))
        let plain = Thread {
            if let connection = try? web.accept(timeout: .seconds(5)) {
                _ = try? connection.write(Array("HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\nroam-office".utf8),
                                          deadline: ContinuousClock.now + .seconds(1))
                usleep(500_000)
            }
        }
        plain.start()
        let answered = ContinuousClock.now
        let http = probe(port: port + 1, pin: pin).run(via: Self.loopback, mark: nil, avoiding: [])
        guard case .failure(let notTLS) = http else { Issue.record("plain HTTP proved something"); return }
        #expect(notTLS.description.contains("TLS handshake") && ContinuousClock.now - answered < .seconds(2), "\(notTLS)")
    }
}
