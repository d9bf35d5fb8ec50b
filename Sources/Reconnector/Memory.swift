public import Topology
public import Basics

extension Reconnector {
    /// What outlives the agent's process: the reconnect budget, the backoff in force, the
    /// verdicts on dead paths and what is known of each network's UDP. Instants are on the agent's clock (CLOCK_BOOTTIME), which
    /// continues across processes of one boot.
    public struct Memory: Sendable, Equatable {
        public struct Verdict: Sendable, Equatable {
            public var until: Instant
            public var strikes: Int
        }

        public var tokens: Int
        public var refilledAt: Instant
        public var failures: Int
        /// No attempt before this.
        public var notBefore: Instant?
        public var dead: [Path.ID: Verdict]
        /// What is known of UDP on each network (the stream transport's rules).
        public var transports: TransportBook

        /// One fact per line, e.g. `tokens 3`, `refilled-at 81234567890`,
        /// `dead 3 10.20.0.57 81249567890 1` (link index, source, until, strikes; `tls` after
        /// them for a stream path), `udp blocked wlan0 192.168.1.1` (a network's UDP verdict).
        public var text: String {
            var lines = ["tokens \(tokens)", "refilled-at \(refilledAt.nanoseconds)", "failures \(failures)"]
            if let notBefore { lines.append("not-before \(notBefore.nanoseconds)") }
            for (id, verdict) in dead.sorted(by: { $0.value.until < $1.value.until }) {
                lines.append("dead \(id.linkIndex) \(id.source) \(verdict.until.nanoseconds) \(verdict.strikes)"
                    + (id.transport == .stream ? " tls" : ""))
            }
            for (key, verdict) in transports.entries {
                lines.append("udp \(verdict.rawValue) \(key.interface) \(key.gateway)")
            }
            return lines.joined(separator: "\n") + "\n"
        }

        /// Reads `text`; nil when any line is not one `text` writes (a damaged file is not trusted).
        public init?(text: String) {
            var tokens: Int?
            var refilledAt: Instant?
            var failures = 0
            var notBefore: Instant?
            var dead: [Path.ID: Verdict] = [:]
            var transports = TransportBook()
            for line in text.split(separator: "\n") {
                let words = line.split(separator: " ")
                switch (words.first, words.count) {
                case ("tokens", 2): tokens = Int(words[1])
                case ("refilled-at", 2): refilledAt = Int64(words[1]).map(Instant.init(nanoseconds:))
                case ("failures", 2):
                    guard let n = Int(words[1]), n >= 0 else { return nil }
                    failures = n
                case ("not-before", 2):
                    guard let n = Int64(words[1]) else { return nil }
                    notBefore = Instant(nanoseconds: n)
                case ("dead", 5), ("dead", 6):
                    guard dead.count < 1024, let index = Int32(words[1]), let source = IPAddress(String(words[2])),
                          let until = Int64(words[3]), let strikes = Int(words[4]), strikes > 0, strikes <= 64,
                          words.count == 5 || words[5] == "tls"
                    else { return nil }
                    let id = Path.ID(linkIndex: index, source: source, transport: words.count == 6 ? .stream : .udp)
                    dead[id] = Verdict(until: Instant(nanoseconds: until), strikes: strikes)
                case ("udp", 4):
                    guard transports.networks.count < TransportBook.capacity, let verdict = UDPVerdict(rawValue: String(words[1])),
                          let gateway = IPAddress(String(words[3])) else { return nil }
                    transports.learn(verdict, for: NetworkKey(interface: String(words[2]), gateway: gateway))
                default:
                    return nil
                }
            }
            guard let tokens, tokens >= 0, let refilledAt else { return nil }
            self.init(tokens: tokens, refilledAt: refilledAt, failures: failures, notBefore: notBefore, dead: dead,
                      transports: transports)
        }

        public init(tokens: Int, refilledAt: Instant, failures: Int, notBefore: Instant?, dead: [Path.ID: Verdict],
                    transports: TransportBook = TransportBook()) {
            self.tokens = tokens
            self.refilledAt = refilledAt
            self.failures = failures
            self.notBefore = notBefore
            self.dead = dead
            self.transports = transports
        }
    }
}
