import Topology
import Foundation
import Glibc
import Basics
import Device
import PathMonitor
import Reconnector
import NamespaceLab
import Testing
@testable import Connectivity

/// The pinned probe against real TLS servers on loopback: Debian's `openssl s_server` with keys
/// made for the test (owner-only, in a directory of its own), a plain HTTP server where TLS is
/// expected, and one that accepts and never says a word. Each failure is a reason, never a proof.
@Suite(.enabled(if: PinnedServer.isAvailable, "needs openssl and socat (scripts/setup installs them)"),
       .serialized)
struct PinnedProbeTests {
    static let loopback = Path(linkIndex: 1, interface: "lo", kind: .other, source: IPAddress("127.0.0.1")!, gateway: nil,
                               metric: 0, prefixLength: 8, mtu: 65536)
    /// Ports of this process's own, apart from another test run's.
    static let basePort = UInt16(20_000 + Int(getpid()) % 20_000)

    /// A TLS server on loopback `port` with a fresh key (`PinnedServer`), its files in a
    /// directory of its own.
    final class Server {
        let directory: String
        let server: PinnedServer
        var pin: String { server.pin }

        init(port: UInt16, answer: String, seen: PinnedServer.Seen = .peer) throws {
            directory = NSTemporaryDirectory() + "roam-pinned-\(getpid())-\(port)"
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true,
                                                    attributes: [.posixPermissions: 0o700])
            server = try PinnedServer(in: nil, directory: directory, name: "probe", accept: "127.0.0.1:\(port)", answer: answer, seen: seen)
        }

        deinit {
            server.stop()
            try? FileManager.default.removeItem(atPath: directory)
        }
    }

    private func probe(port: UInt16, pin: String, expect: HTTPExpectation = .body("roam-office"), direct: Bool = true) -> PinnedProbe {
        PinnedProbe(OnDemandRule.Probe(url: "https://127.0.0.1:\(port)/roam", expect: expect, pin: KeyPin(pin), direct: direct))!
    }

    @Test func thePinnedKeyAnsweringAsExpectedIsAProofOfThatPath() throws {
        let port = Self.basePort
        let server = try Server(port: port, answer: "roam-office")
        let result = probe(port: port, pin: server.pin).run(via: Self.loopback, mark: nil, avoiding: [])
        guard case .success(let proof) = result else { Issue.record("\(result)"); return }
        #expect(proof.pin == KeyPin(server.pin)! && proof.path == Self.loopback.id, "\(proof)")
        // The server saw the connection come from where it left: the probe's own port on loopback.
        #expect(proof.isDirect && proof.local?.address == IPAddress("127.0.0.1")! && proof.local?.port != port, "\(proof)")
        // The right key with another answer proves nothing.
        let other = probe(port: port, pin: server.pin, expect: .body("something else")).run(via: Self.loopback, mark: nil, avoiding: [])
        guard case .failure(let why) = other else { Issue.record("\(other)"); return }
        #expect(why.description.contains("not as the rule expects"), "\(why)")
    }

    /// The real server's key reached through a relay: the server says it saw the relay, and the
    /// probe proves nothing; a server that does not say proves nothing either, unless the rule
    /// allows a NAT between (`direct: false`).
    @Test func aServerThatSawSomeoneElseOrSaysNothingProvesNothing() throws {
        let port = Self.basePort + 3
        let relayed = try Server(port: port, answer: "roam-office", seen: .claimed("203.0.113.9:41000"))
        let result = probe(port: port, pin: relayed.pin).run(via: Self.loopback, mark: nil, avoiding: [])
        guard case .failure(let why) = result else { Issue.record("a relayed probe proved: \(result)"); return }
        #expect(why.description.contains("saw the connection come from 203.0.113.9:41000, not from 127.0.0.1:"), "\(why)")
        let allowed = probe(port: port, pin: relayed.pin, direct: false).run(via: Self.loopback, mark: nil, avoiding: [])
        guard case .success(let proof) = allowed else { Issue.record("\(allowed)"); return }
        #expect(!proof.isDirect && proof.seen == SocketEndpoint(IPAddress("203.0.113.9")!, port: 41000), "\(proof)")

        let silent = try Server(port: port + 1, answer: "roam-office", seen: .nothing)
        let unsaid = probe(port: port + 1, pin: silent.pin).run(via: Self.loopback, mark: nil, avoiding: [])
        guard case .failure(let none) = unsaid else { Issue.record("a server that did not say proved: \(unsaid)"); return }
        #expect(none.description.contains("did not say where it saw the connection come from"), "\(none)")
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

    /// The header is read from a whole head only, in any case, and counted: a second one, or a
    /// head cut short, says nothing the probe can use.
    @Test func theSeenHeaderIsReadFromAWholeHeadOnly() {
        func seen(_ text: String) -> [String] { PinnedProbe.seenHeaders(in: Array(text.utf8)) }
        #expect(seen("HTTP/1.1 204 No Content\r\nroam-SEEN:  10.0.0.5:40000 \r\n\r\n") == ["10.0.0.5:40000"])
        #expect(seen("HTTP/1.1 204 No Content\r\nRoam-Seen: 10.0.0.5:40000\r\nRoam-Seen: 10.0.0.6:1\r\n\r\n").count == 2)
        #expect(seen("HTTP/1.1 204 No Content\r\nRoam-Seen: 10.0.0.5:40000\r\n").isEmpty, "no blank line: the head was cut short")
        #expect(seen("HTTP/1.1 200 OK\r\n\r\nRoam-Seen: 10.0.0.5:40000\r\n").isEmpty, "a body is not a header")
        #expect(seen("HTTP/1.1 204 No Content\r\n X-Other: a\r\n Roam-Seen: 10.0.0.5:40000\r\n\r\n").isEmpty, "a folded line names no header")
    }
}
