import Basics
import Tunnel
public import Device

/// `/metrics` over HTTP for Prometheus, on a thread of its own: one request per connection,
/// answered and closed. A request must arrive whole within `requestTimeout` and in
/// `requestLimit` bytes; connections are served one at a time, so a client that stalls holds
/// the others back for at most that long, and never the data plane.
public final class MetricsEndpoint: Sendable {
    public let listener: TCPListener
    private let exposition: @Sendable () -> String

    static let requestTimeout = Duration.seconds(2)
    static let requestLimit = 8192

    public init(_ address: SocketAddress, exposition: @escaping @Sendable () -> String) throws(DeviceError) {
        listener = try TCPListener(bindingTo: address)
        self.exposition = exposition
    }

    public func start() throws(DeviceError) {
        try OSThread.detach { [self] in
            while true {
                guard let connection = try? listener.accept(timeout: nil) else { continue }
                serve(connection)
            }
        }
    }

    private func serve(_ connection: TCPConnection) {
        let deadline = ContinuousClock.now + Self.requestTimeout
        guard let request = try? connection.read(until: Array("\r\n\r\n".utf8), limit: Self.requestLimit, deadline: deadline) else {
            return
        }
        let response = Self.response(to: request, exposition: exposition)
        _ = try? connection.write(Array(response.utf8), deadline: ContinuousClock.now + Self.requestTimeout)
    }

    /// The answer to one request's bytes: the metrics for `GET /metrics`, an error otherwise.
    static func response(to request: [UInt8], exposition: () -> String) -> String {
        guard let end = request.firstRange(of: Array("\r\n".utf8)) else {
            return answer(400, "Bad Request", "the request line did not end\n")
        }
        let line = request[..<end.lowerBound].split(separator: UInt8(ascii: " "), omittingEmptySubsequences: false)
        guard line.count == 3, line[2].starts(with: Array("HTTP/1.".utf8)) else {
            return answer(400, "Bad Request", "not an HTTP/1 request line\n")
        }
        let method = String(decoding: line[0], as: UTF8.self)
        let target = String(decoding: line[1], as: UTF8.self)
        guard target == "/metrics" || target.hasPrefix("/metrics?") else { return answer(404, "Not Found", "only /metrics is here\n") }
        guard method == "GET" || method == "HEAD" else { return answer(405, "Method Not Allowed", "GET /metrics\n", allow: true) }
        let body = exposition()
        return method == "HEAD" ? head(200, "OK", body) : head(200, "OK", body) + body
    }

    private static func answer(_ code: Int, _ text: String, _ body: String, allow: Bool = false) -> String {
        head(code, text, body, allow: allow) + body
    }

    private static func head(_ code: Int, _ text: String, _ body: String, allow: Bool = false) -> String {
        let type = code == 200 ? "text/plain; version=0.0.4; charset=utf-8" : "text/plain; charset=utf-8"
        return "HTTP/1.1 \(code) \(text)\r\nContent-Type: \(type)\r\nContent-Length: \(body.utf8.count)\r\n"
            + (allow ? "Allow: GET, HEAD\r\n" : "") + "Connection: close\r\n\r\n"
    }
}

/// The client's metrics in node_exporter's textfile format, written whole through
/// `SystemFiles.write` (a temporary beside it, renamed over it, mode 0644 so the collector
/// reads it as another user). A path that cannot be written is one warning, then another only
/// after it worked again.
public struct MetricsFile {
    let path: String
    private(set) var failing = false

    public init(path: String) { self.path = path }

    /// Writes `text`; the error when it could not, once per spell of failures.
    public mutating func write(_ text: String) -> String? {
        var error: String?
        do throws(FileWriteError) {
            try SystemFiles.write(text, to: path, mode: 0o644)
        } catch let failure {
            error = failure.description
        }
        defer { failing = error != nil }
        return failing ? nil : error
    }
}
