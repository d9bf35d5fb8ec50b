import Basics
import Device
import Foundation
import Glibc
@testable import Observability
import Synchronization
import Testing

private func respond(_ request: String) -> String {
    MetricsEndpoint.response(to: Array(request.utf8)) { "roam_up 1\n" }
}

@Test func onlyGetMetricsIsAnswered() {
    let ok = respond("GET /metrics HTTP/1.1\r\nHost: gw\r\n\r\n")
    #expect(ok.hasPrefix("HTTP/1.1 200 OK\r\n") && ok.contains("Content-Type: text/plain; version=0.0.4") && ok.hasSuffix("\r\n\r\nroam_up 1\n"), "\(ok)")
    #expect(ok.contains("Content-Length: 10\r\n"))
    let head = respond("HEAD /metrics HTTP/1.0\r\n\r\n")
    #expect(head.hasPrefix("HTTP/1.1 200 OK") && head.hasSuffix("\r\n\r\n"), "no body: \(head)")
    #expect(respond("GET / HTTP/1.1\r\n\r\n").hasPrefix("HTTP/1.1 404 "))
    #expect(respond("POST /metrics HTTP/1.1\r\n\r\n").hasPrefix("HTTP/1.1 405 "))
    #expect(respond("GET /metrics?name[]=x HTTP/1.1\r\n\r\n").hasPrefix("HTTP/1.1 200 "))
    for garbage in ["", "\u{0}\u{1}\u{2}", "GET /metrics\r\n\r\n", "GET  /metrics HTTP/1.1\r\n\r\n", String(repeating: "A", count: 9000)] {
        #expect(respond(garbage).hasPrefix("HTTP/1.1 400 "), "\(garbage.prefix(20))")
    }
}

/// A scrape of `endpoint` over loopback: the whole answer, and how long it took from connecting
/// to the last byte.
private func scrape(_ endpoint: MetricsEndpoint) throws -> (answer: String, took: Duration) {
    let started = ContinuousClock.now
    let deadline = started + .seconds(5)
    let connection = try TCPConnection.connect(to: endpoint.listener.local, deadline: deadline)
    #expect(try connection.write(Array("GET /metrics HTTP/1.1\r\nHost: gw\r\n\r\n".utf8), deadline: deadline))
    let answer = try connection.read(until: [], limit: 1 << 20, deadline: deadline)
    return (String(decoding: answer, as: UTF8.self), .now - started)
}

/// Whether the endpoint closed (or reset) `connection` within half a second.
private func closed(_ connection: TCPConnection) -> Bool {
    guard (try? pollReadable([connection.fileDescriptor], timeout: .milliseconds(500))) != [] else { return false }
    do { return try connection.read(upTo: 16) == [] } catch { return true }
}

@Test func connectionsThatSendNothingDoNotHoldAScrapeBack() throws {
    let endpoint = try MetricsEndpoint(SocketAddress(IPAddress("127.0.0.1")!, port: 0)) { dropped in
        "roam_dropped \(dropped.evicted + dropped.timedOut)\n"
    }
    try endpoint.start()
    #expect(try scrape(endpoint).answer.hasSuffix("\r\n\r\nroam_dropped 0\n"), "answered once its thread runs")
    // More than the endpoint holds at once, each with a byte of a request that never ends.
    var stalled: [TCPConnection] = []
    let opening = ContinuousClock.now + .seconds(3)
    while stalled.count < 70, ContinuousClock.now < opening {
        guard let connection = try? TCPConnection.connect(to: endpoint.listener.local, deadline: opening) else { break }
        _ = try connection.write(someOf: [UInt8(ascii: "G")])
        stalled.append(connection)
    }
    try #require(stalled.count == 70, "the endpoint took \(stalled.count) connections in 3 s")
    let (answer, took) = try scrape(endpoint)
    #expect(answer.hasPrefix("HTTP/1.1 200 OK\r\n"), "\(answer)")
    #expect(took < .seconds(1), "a scrape behind 70 stalled connections took \(took)")
    // 71 taken, at most 64 held: 7 or more closed, by eviction (or by their deadline, were this slow).
    let dropped = answer.split(separator: "\n").last.flatMap { Int($0.split(separator: " ").last ?? "") }
    #expect((dropped ?? 0) >= 7, "\(answer)")
    #expect(closed(stalled[0]), "the oldest made room")
    #expect(!closed(stalled[69]), "the newest still waits for its request")
}

@Test func aClientThatNeverReadsDoesNotHoldAScrapeBack() throws {
    // An answer far bigger than the socket buffers hold, for the first scrape only.
    let big = String(repeating: "roam_padding 1\n", count: 1 << 20)
    let scrapes = Atomic(0)
    let endpoint = try MetricsEndpoint(SocketAddress(IPAddress("127.0.0.1")!, port: 0)) { _ in
        scrapes.add(1, ordering: .relaxed).newValue == 1 ? big : "roam_up 1\n"
    }
    try endpoint.start()
    let requested = ContinuousClock.now
    let deadline = requested + .seconds(5)
    let reader = try TCPConnection.connect(to: endpoint.listener.local, deadline: deadline)
    #expect(try reader.write(Array("GET /metrics HTTP/1.1\r\n\r\n".utf8), deadline: deadline))
    while scrapes.load(ordering: .relaxed) == 0, ContinuousClock.now < deadline { usleep(10_000) }
    #expect(scrapes.load(ordering: .relaxed) == 1)

    let (answer, took) = try scrape(endpoint)
    #expect(answer.hasSuffix("\r\n\r\nroam_up 1\n"), "\(answer.prefix(200))")
    #expect(took < .seconds(1), "a scrape behind a client that does not read took \(took)")
    // The answer it did not take in time is cut off: what the kernel had is all it gets.
    let cutOff = requested + MetricsEndpoint.requestTimeout + .milliseconds(500)
    while ContinuousClock.now < cutOff { usleep(50_000) }
    let rest = try reader.read(until: [], limit: big.utf8.count + 1024, deadline: ContinuousClock.now + .seconds(5))
    #expect(rest.count < big.utf8.count, "\(rest.count) bytes")
}

@Test func theMetricsFileIsReplacedWholeAndAFailureIsToldOnce() throws {
    let directory = FileManager.default.temporaryDirectory.appendingPathComponent("roam-metrics-\(getpid())").path
    try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(atPath: directory) }
    var file = MetricsFile(path: directory + "/roam.prom")
    #expect(file.write("roam_up 1\n") == nil)
    #expect(file.write("roam_up 2\n") == nil)
    #expect(try String(contentsOfFile: directory + "/roam.prom", encoding: .utf8) == "roam_up 2\n")
    var info = stat()
    stat(directory + "/roam.prom", &info)
    #expect(info.st_mode & 0o777 == 0o644, "the collector reads it as another user")
    #expect(try FileManager.default.contentsOfDirectory(atPath: directory) == ["roam.prom"], "no temporary left")

    var missing = MetricsFile(path: directory + "/nowhere/roam.prom")
    #expect(missing.write("roam_up 1\n")?.contains("No such file or directory") == true)
    #expect(missing.write("roam_up 1\n") == nil, "told once")
    try FileManager.default.createDirectory(atPath: directory + "/nowhere", withIntermediateDirectories: true)
    #expect(missing.write("roam_up 1\n") == nil && !missing.failing, "works again")
}
