public import Topology

/// Every duration and limit the state machine uses, with the defaults an always-on laptop
/// VPN should start from.
public struct Config: Sendable, Equatable {
    /// How fast reconnects may come, for one power source.
    public struct Budget: Sendable, Equatable {
        /// Attempts that may be spent at once (token bucket capacity).
        public var burst: Int
        /// One token comes back every `refill`: the sustained rate.
        public var refill: Duration
        /// First backoff step after a failed attempt; it doubles per consecutive failure.
        public var backoffBase: Duration
        /// Longest backoff; full jitter draws the actual wait from zero up to the step.
        public var backoffCap: Duration

        public init(burst: Int, refill: Duration, backoffBase: Duration, backoffCap: Duration) {
            self.burst = burst
            self.refill = refill
            self.backoffBase = backoffBase
            self.backoffCap = backoffCap
        }
    }

    /// The stream transport's timings, for a server the client may also reach over TLS on TCP
    /// (the gateway has TCP enabled in the client's configuration).
    public struct StreamPolicy: Sendable, Equatable {
        /// UDP first: a handshake or probe unanswered this long (or the path's patience, if
        /// longer, at most `handshakeResend`) sends the attempt to the stream over the same
        /// uplink. Short, so that a network that blocks UDP costs well under a second before the
        /// stream is opened; a UDP answer that was only late is won back by the re-test.
        public var raceDelay: Duration = .milliseconds(300)
        /// On the stream, UDP over the same uplink is tried again (a make-before-break probe)
        /// this long after landing there; each try that goes unanswered doubles the wait, up to
        /// `retestCap`. Both are doubled on battery.
        public var retestAfter: Duration = .seconds(30)
        public var retestCap: Duration = .seconds(600)

        public init() {}
    }

    /// Quiet time a new better path must stay before it is probed: long enough to coalesce the
    /// burst of address and route messages one configuration change makes, short enough that a
    /// docked laptop moves to Ethernet at once. A lost path with an alternative does not wait.
    public var debounce: Duration = .milliseconds(2)
    /// A better path whose interface was lost within `flapWindow` waits this instead, doubled
    /// for every further recent loss: a cable that is flapping must stay up longer each time.
    public var flapHoldDown: Duration = .seconds(1)
    /// The longest that a dead path's hold-down makes a path wait.
    public var maxHoldDown: Duration = .seconds(60)
    /// An interface that stayed up this long after its last loss counts as stable again: flap
    /// damping never makes its path wait longer (and the operator log says it stopped flapping).
    public var flapStableAfter: Duration = .seconds(10)
    /// Losses of one interface closer together than this count as flapping.
    public var flapWindow: Duration = .seconds(60)
    /// How long a handshake may take before the attempt counts as failed.
    public var handshakeTimeout: Duration = .seconds(5)
    /// A handshake unanswered this long (or the path's patience, if longer) is sent again
    /// within the attempt, then after twice as long, as TCP resends a SYN: one lost datagram
    /// costs this, not the handshake timeout and a backoff.
    public var handshakeResend: Duration = .seconds(1)
    /// Shortest wait for a probe echo; on slow paths the wait is the path's patience (twice the
    /// smoothed RTT plus four deviations), and it doubles for each further unanswered probe.
    public var probeTimeout: Duration = .milliseconds(250)
    /// Unanswered probes in a row before a path counts as dead, on a path that has lost none
    /// of its recent probes. A path that loses some needs more, so that a run of losses that
    /// long would happen by chance less than once in a hundred (`maxProbeAttempts` at most).
    public var probeAttempts: Int = 3
    /// The most unanswered probes in a row a lossy path is given before it counts as dead.
    public var maxProbeAttempts: Int = 8
    /// An RTT estimate with no sample for this long is stale: while traffic flows a probe
    /// refreshes it before then, when three quarters of this have passed (none while idle), so
    /// a busy session's estimate never goes stale; meanwhile waits for
    /// answers start from the path's lowest recent RTT (a queue that drained), and a "session
    /// unknown" hint's check waits longer (the RTT may have risen).
    public var rttStaleAfter: Duration = .seconds(10)
    /// Data sent and nothing received for this long makes the path suspect: the shortest such
    /// wait; on slow paths it is twice the path's patience, and it doubles (up to 32 times) each
    /// time a probe proves the path works while the application hears nothing back.
    public var livenessTimeout: Duration = .milliseconds(500)
    /// After this long without hearing from the server, its session is gone and only a
    /// handshake helps (the server drops idle sessions after the same time).
    public var sessionLifetime: Duration = .seconds(180)
    /// Connected this long, the connection counts as stable and backoff starts over.
    public var stableAfter: Duration = .seconds(30)
    /// A path that failed its probes is avoided this long, doubling per repeat failure up to
    /// `maxHoldDown`, before it is tried again as a better path.
    public var deadPathHoldDown: Duration = .seconds(15)
    /// A sleep shorter than this keeps the verdicts about dead paths whose link and address
    /// stayed: the laptop most likely woke on the same network.
    public var shortSleep: Duration = .seconds(120)
    /// Budget on mains power.
    public var ac = Budget(burst: 10, refill: .seconds(6), backoffBase: .milliseconds(250), backoffCap: .seconds(60))
    /// Budget on battery: fewer radio wake-ups during a long outage.
    public var battery = Budget(burst: 4, refill: .seconds(30), backoffBase: .milliseconds(500),
                                backoffCap: .seconds(300))

    /// When every path's handshakes go unanswered on a path with a default route, check the
    /// network with a plain HTTP request (`Effect.checkConnectivity`) for a captive portal.
    public var portalCheck = true
    /// Behind a portal, the first recheck comes after this; each further one waits twice as
    /// long (on battery four times this to begin with), up to `portalRecheckCap`.
    public var portalRecheck: Duration = .seconds(30)
    /// The longest wait between two rechecks behind a portal.
    public var portalRecheckCap: Duration = .seconds(600)
    /// While a portal window is open the user is logging in: the check runs this often, so the
    /// tunnel comes up as soon as the portal opens.
    public var portalWindowRecheck: Duration = .milliseconds(500)
    /// The longest a portal window stays open.
    public var portalWindow: Duration = .seconds(300)

    /// The tunnel's MTU as configured: the largest tunnel packet, and the size path MTU
    /// discovery starts from and never goes above.
    public var maxMTU: Int = 1420
    /// The smallest tunnel MTU the tunnel can work with, when the operator set one (`min-mtu`);
    /// else it follows what the tunnel carries (`mtuFloor`). A path that cannot carry a tunnel
    /// packet this big is broken for the tunnel.
    public var minMTU: Int?
    /// Discover each path's MTU with padded probes when the server echoes them.
    public var pathMTUDiscovery = true
    /// On a path found smaller than `maxMTU`, how often to see whether it grew.
    public var mtuRaiseAfter: Duration = .seconds(600)

    /// The stream transport, when the current server can be reached over it; nil (the default):
    /// UDP only, as before the stream existed.
    public var stream: StreamPolicy?

    public init() {}

    /// The wait before the next UDP re-test from the stream, after `failed` re-tests that went
    /// unanswered: `retestAfter` doubled per failure up to `retestCap` (both doubled on battery).
    public func udpRetest(after failed: Int, on power: PowerSource) -> Duration {
        guard let stream else { return .zero }
        let factor = power == .battery ? 2 : 1
        return min(stream.retestCap * factor, stream.retestAfter * factor * (1 << min(failed, 20)))
    }

    /// The smallest tunnel MTU for a tunnel that carries IPv6 or not: 1,280 with IPv6 (its
    /// minimum; the kernel takes IPv6 off a device below it), else 1,200 (RFC 8899's base for
    /// packetization-layer probing, and what a 1,280-byte path carries inside the tunnel over
    /// either family: 1,200 + 80 for IPv6 outside). `min-mtu` overrides it, never below
    /// IPv6's minimum with IPv6 inside, never above `maxMTU`.
    public func mtuFloor(ipv6: Bool) -> Int {
        let family = ipv6 ? 1280 : 1200
        return min(max(minMTU ?? family, ipv6 ? 1280 : 576), maxMTU)
    }

    /// The budget in force for `power`.
    public func budget(on power: PowerSource) -> Budget { power == .battery ? battery : ac }
}
