import Glibc
import Logging
@testable import Observability
import Basics
@testable import Reconnector
import Synchronization
import Testing

/// A handler whose lines are kept, on a clock the test moves.
final class CapturedLog: Sendable {
    let lines = Mutex<[String]>([])
    let clock = Mutex<Duration>(.seconds(1_763_900_000))

    func logger(format: OperatorLogHandler.Format = .logfmt, journal: Bool = false, level: Logger.Level = .info,
                limiter: LogLimiter = LogLimiter()) -> Logger {
        let handler = OperatorLogHandler(format: format, level: level, journal: journal, limiter: limiter,
                                         clock: { [self] in let t = self.clock.withLock { $0 }; return (t, t) },
                                         write: { [self] line in self.lines.withLock { $0.append(line) } })
        return Logger(label: "test") { _ in handler }
    }

    func advance(_ by: Duration) { clock.withLock { $0 += by } }
    var all: [String] { lines.withLock { $0 } }
}

@Test func aLineIsLogfmtWithThePriorityForTheJournal() {
    let log = CapturedLog()
    log.logger(journal: true).warning("eth0 is flapping", metadata: ["losses": "3", "interface": "eth0"])
    log.logger(journal: false).warning("eth0 is flapping")
    #expect(log.all == [
        "<4>ts=1763900000.000 level=warning msg=\"eth0 is flapping\" interface=eth0 losses=3\n",
        "ts=1763900000.000 level=warning msg=\"eth0 is flapping\"\n",
    ])
}

@Test func jsonLinesHaveNumbersForNumbers() {
    let log = CapturedLog()
    log.advance(.milliseconds(2500))
    log.logger(format: .json, journal: true).error("giving up", metadata: ["attempt": .stringConvertible(3), "reason": "rejected"])
    #expect(log.all == ["<3>{\"ts\":1763900002.500,\"level\":\"error\",\"msg\":\"giving up\",\"reason\":\"rejected\",\"attempt\":3}\n"])
}

/// A transition's fields come in the order every transition line has, whatever the dictionary's.
@Test func aTransitionKeepsItsFieldOrder() {
    let log = CapturedLog()
    let transition = Transition(at: Instant(nanoseconds: 0), from: .offline, to: .offline, trigger: "paths",
                                reason: .pathLost("eth0"), attempt: 0, coalesced: 2)
    log.logger().info("transition", metadata: transition.metadata)
    #expect(log.all.first?.hasSuffix("msg=transition from=offline to=offline trigger=paths reason=pathLost(eth0) path=none attempt=0 coalesced=2\n")
        == true, "\(log.all)")
    log.logger(format: .json).info("transition", metadata: transition.metadata)
    #expect(log.all.last?.contains("\"attempt\":0,\"coalesced\":2}") == true, "\(log.all)")
}

@Test func theLevelHidesLessSevereLines() {
    let log = CapturedLog()
    let warnings = log.logger(level: .warning)
    warnings.debug("d")
    warnings.info("i")
    warnings.warning("w")
    warnings.error("e")
    #expect(log.all.map { $0.split(separator: " ")[1] } == ["level=warning", "level=error"])
    #expect([Logger.Level.error, .warning, .notice, .info, .debug].map(\.syslogPriority) == [3, 4, 5, 6, 7])
}

struct Refused: Error, CustomStringConvertible { var description: String { "connection refused" } }

@Test func anErrorIsAField() {
    let log = CapturedLog()
    log.logger().warning("send failed", error: Refused())
    #expect(log.all == ["ts=1763900000.000 level=warning msg=\"send failed\" error=\"connection refused\"\n"])
}

/// A flood of one cause makes one line per interval, and the next says how many were left out;
/// causes are counted apart, and lines without a cause are never held back.
@Test func aFloodOfOneCauseMakesOneLinePerInterval() {
    let log = CapturedLog()
    let logger = log.logger(limiter: LogLimiter(interval: .seconds(10)))
    for i in 0..<10_000 {
        log.advance(.milliseconds(2))  // 500 a second for 20 s
        let reason = i % 2 == 0 ? "unknown-user" : "bad-password"
        logger.warning("handshake rejected", metadata: ["cause": "rejected:\(reason)", "reason": "\(reason)"])
    }
    logger.info("handshake")
    logger.info("handshake")
    let lines = log.all
    #expect(lines.count == 6, "\(lines)")
    #expect(lines.filter { $0.contains("reason=unknown-user") }.count == 2)
    #expect(lines[2].contains("suppressed=2499"), "\(lines)")
    #expect(lines.filter { $0.contains("msg=handshake\n") }.count == 2)
}

@Test func theLimiterForgetsOldCausesWhenFull() {
    let limiter = LogLimiter(interval: .seconds(10))
    for i in 0..<1000 { #expect(limiter.admit(cause: "cause-\(i)", now: .seconds(i)) == .write(notWritten: 0)) }
    #expect(limiter.admit(cause: "cause-999", now: .seconds(1000)) == .suppress)
}

@Test func theJournalIsRecognisedByTheStreamItNames() {
    var info = stat()
    fstat(2, &info)
    #expect(OperatorLogHandler.standardErrorIsJournal("\(info.st_dev):\(info.st_ino)"))
    #expect(!OperatorLogHandler.standardErrorIsJournal("\(info.st_dev):\(info.st_ino + 1)"), "inherited, but not this stream")
    #expect(!OperatorLogHandler.standardErrorIsJournal(nil) && !OperatorLogHandler.standardErrorIsJournal("garbage"))
}
