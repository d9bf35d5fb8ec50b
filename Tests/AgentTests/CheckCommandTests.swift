import Foundation
import Glibc
import NamespaceLab
import Testing

/// `agent check`: the built binary on every malformed file of the corpus (each names the line
/// and words its error must have in its first line), and on good files. Needs no root.
struct CheckCommandTests {
    static let corpus = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Corpus/config")

    static var files: [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: corpus.path)) ?? []).filter { $0.hasSuffix(".yaml") }.sorted()
    }

    @Test(arguments: files)
    func aMalformedFileGivesItsLineAndExitTwo(_ name: String) throws {
        let path = Self.corpus.appendingPathComponent(name).path
        // The corpus is checked in without modes; the checks want the server's file owner-only.
        chmod(path, 0o600)
        let header = try String(contentsOfFile: path, encoding: .utf8).split(separator: "\n")[0]
        let expected = header.dropFirst("# expect: ".count).split(separator: " ", maxSplits: 1)
        let line = try #require(Int(expected[0]))
        let (status, output) = try NamespaceLab.capture(RoamingLab.builtAgent, ["check", "--config", path])
        #expect(status == 2, "\(output)")
        #expect(output.contains("\(path):\(line): "), "\(output)")
        if expected.count > 1 { #expect(output.contains(expected[1]), "\(output)") }
    }

    @Test func goodFilesPassAndSayWhatTheyAre() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("roam-check-\(getpid())").path
        mkdir(directory, 0o700)
        defer { _ = try? FileManager.default.removeItem(atPath: directory) }
        let (_, key) = try NamespaceLab.capture(RoamingLab.builtAgent, ["keygen", "--out", directory + "/key"])
        let client = directory + "/client.yaml"
        try """
            servers:
              - {address: 192.0.2.1:51820, key: \(key.trimmingCharacters(in: .whitespacesAndNewlines)), name: a}
            private-key-file: \(directory)/key
            reconnect: {flap-hold-down: 2s, battery: {burst: 2}}
            """.write(toFile: client, atomically: true, encoding: .utf8)
        let checked = try NamespaceLab.capture(RoamingLab.builtAgent, ["check", "--config", client])
        #expect(checked.status == 0 && checked.output.contains("a client configuration, 1 server"), "\(checked.output)")
        let server = directory + "/server.yaml"
        try """
            listen-port: 51820
            private-key-file: \(directory)/key
            tunnel: {addresses: [10.77.0.1/24]}
            workers: 2
            users:
              - {name: a, public-key: \(key.trimmingCharacters(in: .whitespacesAndNewlines)), addresses: [10.77.0.2]}
            """.write(toFile: server, atomically: true, encoding: .utf8)
        chmod(server, 0o600)
        let served = try NamespaceLab.capture(RoamingLab.builtAgent, ["check", "--config", server])
        #expect(served.status == 0 && served.output.contains("a server configuration, 1 users, port 51820, 2 workers"), "\(served.output)")
        // A key file others may read is the daemon's error, and so the check's.
        chmod(directory + "/key", 0o644)
        let loose = try NamespaceLab.capture(RoamingLab.builtAgent, ["check", "--config", server])
        #expect(loose.status == 2 && loose.output.contains("must be 0600"), "\(loose.output)")
    }
}

/// `agent monitor` read through a pipe shows each event as it happens, and when a service
/// manager or `timeout` stops it with SIGTERM it says so and loses nothing. Needs no root.
@Test func aPipedMonitorShowsEventsLiveAndSaysWhenItIsStopped() throws {
    let process = Process()
    process.executableURL = RoamingLab.builtAgent
    process.arguments = ["monitor", "--server", "127.0.0.1", "--seconds", "30"]
    let pipe = Pipe()
    process.standardOutput = pipe
    try process.run()
    defer { if process.isRunning { kill(process.processIdentifier, SIGKILL) } }
    // The first line arrives while the monitor runs: a block-buffered stdout would hold it.
    let fd = pipe.fileHandleForReading.fileDescriptor
    var ready = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
    #expect(poll(&ready, 1, 5_000) == 1, "a line within 5 s")
    var buffer = [UInt8](repeating: 0, count: 4096)
    let n = read(fd, &buffer, buffer.count)
    #expect(n > 0 && String(decoding: buffer[0..<max(n, 0)], as: UTF8.self).contains("event=start"))
    kill(process.processIdentifier, SIGTERM)
    let rest = String(decoding: pipe.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
    process.waitUntilExit()
    #expect(rest.contains("event=stop"), "\(rest)")
    #expect(process.terminationStatus == 0)
}
