public import Reconnector

extension Config {
    /// The keys of a `reconnect:` section (the client's configuration) or a scenario's
    /// `config:`, in kebab-case, each a field of `Config`.
    public static let fileKeys = [
        "debounce", "flap-hold-down", "flap-stable-after", "max-hold-down", "flap-window", "handshake-timeout",
        "probe-timeout", "probe-attempts", "liveness-timeout", "short-sleep", "session-lifetime", "stable-after",
        "dead-path-hold-down", "ac", "battery", "portal-check", "portal-recheck", "portal-recheck-cap",
        "portal-window-recheck", "portal-window", "handshake-resend", "max-probe-attempts", "rtt-stale-after",
        "path-mtu-discovery", "min-mtu", "mtu-raise-after", "stream",
    ]
    /// The keys of the `ac:` and `battery:` budgets.
    public static let budgetKeys = ["burst", "refill", "backoff-base", "backoff-cap"]
    /// The keys of `stream:` (`Config.StreamPolicy`); `stream: true` takes the defaults.
    public static let streamKeys = ["race-delay", "udp-retest", "udp-retest-cap"]
}

extension YAMLReader {
    /// Reads overrides of the decision core's settings from `node`, the section named `section`
    /// (`'reconnect'` in the client's configuration, `'config'` in a scenario): an unknown key, a
    /// value out of range or of the wrong kind is a line-numbered error naming that section.
    public func reconnectConfig(_ node: Node, section: String, into config: inout Config) throws(ConfigError) {
        let f = try fields(node, section, allowed: Config.fileKeys)
        if let n = f.optional("debounce") { config.debounce = try duration(n) }
        if let n = f.optional("flap-hold-down") { config.flapHoldDown = try duration(n) }
        if let n = f.optional("flap-stable-after") { config.flapStableAfter = try duration(n) }
        if let n = f.optional("max-hold-down") { config.maxHoldDown = try duration(n) }
        if let n = f.optional("flap-window") { config.flapWindow = try duration(n) }
        if let n = f.optional("handshake-timeout") { config.handshakeTimeout = try positiveDuration(n) }
        if let n = f.optional("probe-timeout") { config.probeTimeout = try positiveDuration(n) }
        if let n = f.optional("probe-attempts") { config.probeAttempts = try int(n, 1...100) }
        if let n = f.optional("max-probe-attempts") { config.maxProbeAttempts = try int(n, 1...100) }
        if let n = f.optional("handshake-resend") { config.handshakeResend = try positiveDuration(n) }
        if let n = f.optional("rtt-stale-after") { config.rttStaleAfter = try positiveDuration(n) }
        if let n = f.optional("path-mtu-discovery") { config.pathMTUDiscovery = try bool(n) }
        if let n = f.optional("min-mtu") { config.minMTU = try int(n, 576...9000) }
        if let n = f.optional("mtu-raise-after") { config.mtuRaiseAfter = try positiveDuration(n) }
        if let n = f.optional("liveness-timeout") { config.livenessTimeout = try positiveDuration(n) }
        if let n = f.optional("short-sleep") { config.shortSleep = try duration(n) }
        if let n = f.optional("session-lifetime") { config.sessionLifetime = try positiveDuration(n) }
        if let n = f.optional("stable-after") { config.stableAfter = try duration(n) }
        if let n = f.optional("dead-path-hold-down") { config.deadPathHoldDown = try duration(n) }
        if let n = f.optional("portal-check") { config.portalCheck = try bool(n) }
        if let n = f.optional("portal-recheck") { config.portalRecheck = try positiveDuration(n) }
        if let n = f.optional("portal-recheck-cap") { config.portalRecheckCap = try positiveDuration(n) }
        if let n = f.optional("portal-window-recheck") { config.portalWindowRecheck = try positiveDuration(n) }
        if let n = f.optional("portal-window") { config.portalWindow = try positiveDuration(n) }
        if config.portalRecheckCap < config.portalRecheck, let n = f.optional("portal-recheck-cap") ?? f.optional("portal-recheck") {
            throw fail(n, "'portal-recheck-cap' (\(config.portalRecheckCap.short)) is shorter than 'portal-recheck' (\(config.portalRecheck.short))")
        }
        if let n = f.optional("stream") {
            // `true`/`false`, or the timings (which turn it on): the server can be reached over
            // TLS on TCP as well as over UDP.
            if case .mapping = n.value {
                let t = try fields(n, "\(section.dropLast())/stream'", allowed: Config.streamKeys)
                var policy = config.stream ?? Config.StreamPolicy()
                if let v = t.optional("race-delay") { policy.raceDelay = try positiveDuration(v) }
                if let v = t.optional("udp-retest") { policy.retestAfter = try positiveDuration(v) }
                if let v = t.optional("udp-retest-cap") { policy.retestCap = try positiveDuration(v) }
                if policy.retestCap < policy.retestAfter {
                    throw fail(n, "'udp-retest-cap' (\(policy.retestCap.short)) is shorter than 'udp-retest' (\(policy.retestAfter.short))")
                }
                config.stream = policy
            } else {
                config.stream = try bool(n) ? config.stream ?? Config.StreamPolicy() : nil
            }
        }
        for (key, path) in [("ac", \Config.ac), ("battery", \Config.battery)] {
            guard let n = f.optional(key) else { continue }
            let b = try fields(n, "\(section.dropLast())/\(key)'", allowed: Config.budgetKeys)
            if let v = b.optional("burst") { config[keyPath: path].burst = try int(v, 1...10_000) }
            if let v = b.optional("refill") { config[keyPath: path].refill = try positiveDuration(v) }
            if let v = b.optional("backoff-base") { config[keyPath: path].backoffBase = try positiveDuration(v) }
            if let v = b.optional("backoff-cap") { config[keyPath: path].backoffCap = try positiveDuration(v) }
        }
    }
}
