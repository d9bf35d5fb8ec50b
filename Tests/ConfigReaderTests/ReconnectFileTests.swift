import ConfigReader
import Reconnector
import Testing

private func reconnect(_ text: String) throws(ConfigError) -> Config {
    let reader = YAMLReader(file: "t.yaml")
    var config = Config()
    try reader.reconnectConfig(try reader.document(text), section: "'reconnect'", into: &config)
    return config
}

@Test func theStreamIsOffUnlessSaid() throws {
    #expect(Config().stream == nil)
    #expect(try reconnect("debounce: 5ms").stream == nil)
    #expect(try reconnect("stream: false").stream == nil)
    #expect(try reconnect("stream: true").stream == Config.StreamPolicy())
}

@Test func theStreamsTimingsTurnItOn() throws {
    let policy = try #require(try reconnect("stream: {race-delay: 200ms, udp-retest: 1m, udp-retest-cap: 20m}").stream)
    #expect(policy.raceDelay == .milliseconds(200))
    #expect(policy.retestAfter == .seconds(60) && policy.retestCap == .seconds(1200))
}

@Test(arguments: [
    ("stream: {race-delay: 200ms, udp-retset: 1m}", "unknown key 'udp-retset'"),
    ("stream: {udp-retest: 5m, udp-retest-cap: 1m}", "'udp-retest-cap' (1m) is shorter than 'udp-retest' (5m)"),
    ("stream: sometimes", "true or false"),
])
func aWrongStreamSettingIsRefusedAtItsLine(text: String, message: String) {
    #expect {
        try reconnect(text)
    } throws: { error in
        guard let error = error as? ConfigError else { return false }
        return error.line == 1 && error.message.contains(message)
    }
}
