import Basics
public import Device

/// `/metrics` over HTTP for Prometheus, on a thread of its own: one request per connection,
/// answered and closed. The thread polls the listener and up to `capacity` connections, each
/// non-blocking with a deadline of its own: its request must arrive whole within
/// `requestTimeout` and in `requestLimit` bytes, then its answer must be taken within
/// `requestTimeout`. A new connection when all are taken closes the oldest; a scraper sends its
/// request at once, so it is answered however many clients sit silent, trickle or never read.
/// Nobody's stall holds back another, nor the data plane.
public final class MetricsEndpoint: Sendable {
    public let listener: TCPListener
    private let exposition: @Sendable (Drops) -> String

    /// Connections closed before their answer was out, since the endpoint started.
    public struct Drops: Sendable, Equatable {
        /// Closed to make room for a newer one, all being taken.
        public var evicted = 0
        /// Their request did not arrive whole in time, or their answer was not taken in time.
        public var timedOut = 0
    }

    static let requestTimeout = Duration.seconds(2)
    static let requestLimit = 8192
    /// Connections held at once, waiting for their request or writing their answer.
    static let capacity = 64
    /// Connections taken from the listener per wake-up: those already taken are read between
    /// batches, so a flood of connections pushes a scraper out only if it fills the table
    /// before the scraper's request is read.
    static let acceptsPerWake = 16
    /// How long the listener rests after a failed accept (out of descriptors), so the thread
    /// does not spin on it.
    static let acceptPause = Duration.milliseconds(100)
    private static let endOfHead = Array("\r\n\r\n".utf8)

    /// `exposition`: the metrics, given the endpoint's own drops so far; called on its thread.
    public init(_ address: SocketAddress, exposition: @escaping @Sendable (_ dropped: Drops) -> String) throws(DeviceError) {
        // A burst of connections, twice what the table holds, waits in the kernel's queue rather
        // than being dropped there (a dropped connection costs a scraper a second).
        listener = try TCPListener(bindingTo: address, backlog: Int32(2 * Self.capacity))
        self.exposition = exposition
    }

    public func start() throws(DeviceError) {
        try OSThread.detach { [self] in serve() }
    }

    /// One connection from accept to close: its request so far, then the rest of its answer.
    private struct Exchange {
        let connection: TCPConnection
        /// When the request must be in; once it is, when the answer must be out.
        var deadline: ContinuousClock.Instant
        var request: [UInt8] = []
        /// What is left to write of the answer; nil while the request is coming.
        var unwritten: ArraySlice<UInt8>?
    }

    private func serve() {
        var exchanges: [Exchange] = []  // the oldest first
        var listening = ContinuousClock.now  // when the listener is polled again
        var drops = Drops()
        while true {
            var now = ContinuousClock.now
            let held = exchanges.count
            exchanges.removeAll { $0.deadline <= now }
            drops.timedOut += held - exchanges.count
            let waits = (listening <= now ? [(listener.fileDescriptor, Readiness.readable)] : [])
                + exchanges.map { ($0.connection.fileDescriptor, $0.unwritten == nil ? .readable : .writable) }
            let wake = (exchanges.map(\.deadline) + (listening > now ? [listening] : [])).min()
            guard let ready = try? Set(pollReady(waits, timeout: wake.map { $0 - now })) else { continue }
            now = .now
            exchanges = exchanges.compactMap { ready.contains($0.connection.fileDescriptor) ? advanced($0, now: now, drops: drops) : $0 }
            guard ready.contains(listener.fileDescriptor) else { continue }
            for _ in 0..<Self.acceptsPerWake {
                let connection: TCPConnection?
                do throws(DeviceError) { connection = try listener.accept(timeout: .zero) } catch {
                    listening = now + Self.acceptPause
                    break
                }
                guard let connection else { break }
                if exchanges.count == Self.capacity {
                    exchanges.removeFirst()
                    drops.evicted += 1
                }
                exchanges.append(Exchange(connection: connection, deadline: now + Self.requestTimeout))
            }
        }
    }

    /// `exchange` moved on as far as its socket lets it now; nil when it is over (answered,
    /// or the peer gone).
    private func advanced(_ exchange: Exchange, now: ContinuousClock.Instant, drops: Drops) -> Exchange? {
        var exchange = exchange
        do throws(DeviceError) {
            if exchange.unwritten == nil {
                let before = exchange.request.count
                guard let bytes = try exchange.connection.read(upTo: Self.requestLimit - before) else { return exchange }
                exchange.request += bytes
                // Only the new bytes (and the three before them) can end the head: a request that
                // trickles in costs no more to look through than one sent at once.
                let whole = bytes.isEmpty || exchange.request.count == Self.requestLimit
                    || exchange.request[max(before - 3, 0)...].firstRange(of: Self.endOfHead) != nil
                guard whole else { return exchange }
                exchange.unwritten = Array(Self.response(to: exchange.request) { exposition(drops) }.utf8)[...]
                exchange.deadline = now + Self.requestTimeout
            }
            guard let unwritten = exchange.unwritten else { return exchange }
            let rest = unwritten.dropFirst(try exchange.connection.write(someOf: unwritten))
            exchange.unwritten = rest
            return rest.isEmpty ? nil : exchange
        } catch {
            return nil
        }
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
