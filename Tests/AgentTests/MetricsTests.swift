import Foundation
import Glibc
import NamespaceLab
import Testing
import Tunnel

@Test func metricsSettingsAreChecked() throws {
    let directory = FileManager.default.temporaryDirectory.appendingPathComponent("roam-metrics-check-\(getpid())").path
    try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(atPath: directory) }
    try writeSecret(try PrivateKey.generate().revealBase64(), to: directory + "/client.key")
    let client = """
        server: 198.51.100.7:51820
        server-key: \(try PrivateKey.generate().publicKey.base64)
        private-key-file: \(directory)/client.key
        """
    for (extra, line) in [("metrics-file: roam.prom", 4), ("metrics-file: /var/lib/roam.txt", 4)] {
        try (client + "\n" + extra + "\n").write(toFile: directory + "/c.yaml", atomically: true, encoding: .utf8)
        let result = try NamespaceLab.capture(RoamingLab.builtAgent, ["check", "--config", directory + "/c.yaml"])
        #expect(result.status == 2 && result.output.contains("c.yaml:\(line):") && result.output.contains("'metrics-file'"), "\(result.output)")
    }
    try (client + "\nmetrics-file: /var/lib/prometheus/node-exporter/roam.prom\n").write(toFile: directory + "/c.yaml", atomically: true, encoding: .utf8)
    #expect(try NamespaceLab.capture(RoamingLab.builtAgent, ["check", "--config", directory + "/c.yaml"]).status == 0)
}

@Suite(.enabled(if: NamespaceLab.isRoot, Comment(rawValue: NamespaceLab.skipReason)), .serialized)
struct MetricsLabTests {
    /// The value of one series in an exposition.
    func sample(_ text: String, _ series: String) -> Double? {
        text.split(separator: "\n").first { $0.hasPrefix(series + " ") }.flatMap { Double($0.split(separator: " ").last!) }
    }

    /// A scrape over real HTTP inside the server's namespace, with bash's /dev/tcp.
    func scrape(_ lab: RoamingLab, _ target: String = "/metrics") throws -> String {
        let request = "exec 3<>/dev/tcp/127.0.0.1/9586 && printf 'GET \(target) HTTP/1.1\\r\\nHost: gw\\r\\n\\r\\n' >&3 && timeout 5 cat <&3"
        return try NamespaceLab.capture(NamespaceLab.ipTool, ["netns", "exec", lab.server.name, "/bin/bash", "-c", request]).output
    }

    @Test func theServerIsScrapedAndTheClientWritesItsFile() throws {
        let lab = try RoamingLab(vpn: .roam, routing: .split)
        try lab.configure("server", "metrics-listen: 127.0.0.1:9586")
        let textfile = lab.directory + "/node-exporter/roam.prom"
        try lab.configure("client", "metrics-file: \(textfile)")
        try lab.startServer()
        // The collector's directory is not there yet: one warning, and the agent runs on.
        try lab.startClient()
        #expect(lab.log("client.log").components(separatedBy: "cannot write the metrics file").count == 2, "\(lab.log("client.log"))")
        try FileManager.default.createDirectory(atPath: lab.directory + "/node-exporter", withIntermediateDirectories: true)

        // A roam: the cable goes, the Wi-Fi carries the tunnel.
        try lab.laptop.ip("link set eth0 down")
        #expect(lab.waitFor(seconds: 5) { lab.status()["path.interface"] == "wifi0" && lab.status()["state"] == "connected" })
        #expect(lab.waitFor(seconds: 5) { FileManager.default.fileExists(atPath: textfile) }, "written at the next transition")
        let client = (try? String(contentsOfFile: textfile, encoding: .utf8)) ?? ""
        #expect(sample(client, #"roam_state{state="connected"}"#) == 1, "\(client)")
        #expect(sample(client, #"roam_handshakes_total{result="completed"}"#) == 1, "\(client)")
        #expect(sample(client, #"roam_roams_total{kind="interface"}"#) == 1, "\(client)")
        #expect((sample(client, #"roam_transitions_total{to="connected",reason="handshakeSucceeded"}"#) ?? 0) >= 1, "\(client)")
        #expect(client.contains("roam_outage_seconds_bucket"), "\(client)")

        // Traffic through the tunnel, for the server's byte counts.
        _ = try NamespaceLab.capture(NamespaceLab.ipTool, ["netns", "exec", lab.laptop.name, "ping", "-c", "2", "-i", "0.2", "-W", "1",
                                                           lab.serverInner.description])
        let answer = try scrape(lab)
        #expect(answer.hasPrefix("HTTP/1.1 200 OK\r\n"), "\(answer)")
        #expect(sample(answer, "roam_server_sessions") == 1, "\(answer)")
        #expect(sample(answer, #"roam_server_handshakes_total{result="accepted"}"#) == 1, "\(answer)")
        #expect((sample(answer, #"roam_bytes_total{direction="in"}"#) ?? 0) > 0, "\(answer)")
        #expect(try scrape(lab, "/").hasPrefix("HTTP/1.1 404 "))
        #expect(lab.log("server.log").contains("msg=metrics url=http://127.0.0.1:9586/metrics"), "\(lab.log("server.log"))")
    }
}
