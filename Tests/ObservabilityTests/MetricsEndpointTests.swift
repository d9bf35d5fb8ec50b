import Foundation
import Glibc
@testable import Observability
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
