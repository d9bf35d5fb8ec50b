import Topology
@testable import Observability
import Basics
import PathMonitor
@testable import Reconnector
import Testing
import Tunnel

private func path(_ interface: String, _ source: String, link: Int32) -> Path {
    Path(linkIndex: link, interface: interface, kind: interface.hasPrefix("wifi") ? .wifi : .ethernet, source: IPAddress(source)!,
         gateway: nil, metric: 100, prefixLength: 0, mtu: 1500)
}

private let wifi = path("wifi0", "192.168.1.23", link: 2)
private let wifiMoved = path("wifi0", "192.168.1.99", link: 2)
private let eth = path("eth0", "10.20.0.57", link: 3)

private func at(_ ms: Int64) -> Instant { Instant(nanoseconds: ms * 1_000_000) }

private func transition(_ ms: Int64, _ from: State, _ to: State, _ reason: Reason, server: String? = nil) -> Transition {
    Transition(at: at(ms), from: from, to: to, trigger: "test", reason: reason, attempt: 0, coalesced: 0, server: server)
}

/// The value of one series in an exposition, or nil when it is not there.
func sample(_ exposition: String, _ series: String) -> Double? {
    exposition.split(separator: "\n").first { $0.hasPrefix(series + " ") }.flatMap { Double($0.split(separator: " ").last!) }
}

@Test func transitionsOutagesAndRoamsAreCounted() {
    let metrics = ClientMetrics()
    let timeline = [
        transition(0, .offline, .connecting(wifi), .pathAppeared("wifi0")),
        transition(40, .connecting(wifi), .connected(wifi), .handshakeSucceeded(rtt: .milliseconds(20))),
        // The Wi-Fi goes: 1.5 s without a tunnel, then the cable carries it.
        transition(1000, .connected(wifi), .offline, .pathLost("wifi0")),
        transition(2000, .offline, .connecting(eth), .pathAppeared("eth0")),
        transition(2500, .connecting(eth), .connected(eth), .handshakeSucceeded(rtt: .milliseconds(20))),
        // Back on the Wi-Fi with make-before-break: a roam with no outage.
        transition(3000, .connected(eth), .switching(from: eth, to: wifi, sent: 1), .pathAppeared("wifi0")),
        transition(3020, .switching(from: eth, to: wifi, sent: 1), .connected(wifi), .handshakeSucceeded(rtt: .milliseconds(20))),
        // The Wi-Fi's address changes, then the operator takes the tunnel down: not an outage.
        transition(4000, .connected(wifi), .connected(wifiMoved), .handshakeSucceeded(rtt: .milliseconds(20))),
        transition(5000, .connected(wifiMoved), .paused, .operatorDown),
        transition(9000, .paused, .connecting(wifiMoved), .operatorUp),
        transition(9030, .connecting(wifiMoved), .connected(wifiMoved), .handshakeSucceeded(rtt: .milliseconds(20))),
    ]
    for t in timeline { metrics.record(t) }
    let text = metrics.exposition()
    #expect(sample(text, #"roam_transitions_total{to="connected",reason="handshakeSucceeded"}"#) == 5, "\(text)")
    #expect(sample(text, #"roam_transitions_total{to="offline",reason="pathLost"}"#) == 1)
    #expect(sample(text, "roam_outage_seconds_count") == 1, "only the Wi-Fi's loss was an outage: \(text)")
    #expect(sample(text, "roam_outage_seconds_sum") == 1.5)
    #expect(sample(text, #"roam_outage_seconds_bucket{le="1.0"}"#) == 0)
    #expect(sample(text, #"roam_outage_seconds_bucket{le="2.5"}"#) == 1)
    #expect(sample(text, #"roam_roams_total{kind="interface"}"#) == 2)
    #expect(sample(text, #"roam_roams_total{kind="address"}"#) == 1)
    #expect(sample(text, #"roam_state{state="connected"}"#) == 1)
    #expect(sample(text, #"roam_state{state="paused"}"#) == 0)
    #expect(sample(text, "roam_connected") == 1)
}

@Test func aMoveToAnotherServerIsARoamOfItsOwnKind() {
    let metrics = ClientMetrics()
    metrics.record(transition(0, .connecting(eth), .connected(eth), .handshakeSucceeded(rtt: .milliseconds(20)), server: "gw1"))
    metrics.record(transition(900, .connected(eth), .connected(eth), .handshakeSucceeded(rtt: .milliseconds(20)), server: "gw2"))
    #expect(sample(metrics.exposition(), #"roam_roams_total{kind="server"}"#) == 1)
}

@Test func everySeriesAnOperatorGraphsIsThereFromTheStart() {
    let text = ClientMetrics().exposition()
    for series in [#"roam_bytes_total{direction="in"}"#, "roam_netlink_resyncs_total", "roam_probes_total",
                   #"roam_handshakes_total{result="completed"}"#, "roam_connected"] {
        #expect(sample(text, series) == 0, "\(series) in \(text)")
    }
}

@Test func theEndpointsDropsAreCarriedInAsIncreases() {
    let counts = ServerCounts()
    let evicted = #"roam_metrics_connections_dropped_total{cause="evicted"}"#
    let timedOut = #"roam_metrics_connections_dropped_total{cause="timeout"}"#
    #expect(sample(counts.exposition(), evicted) == 0 && sample(counts.exposition(), timedOut) == 0, "there from the start")
    counts.sync(endpoint: MetricsEndpoint.Drops(evicted: 3, timedOut: 1))
    counts.sync(endpoint: MetricsEndpoint.Drops(evicted: 5, timedOut: 1))
    #expect(sample(counts.exposition(), evicted) == 5)
    #expect(sample(counts.exposition(), timedOut) == 1)
}

@Test func probesResyncsAndHandshakesAreCounted() {
    let metrics = ClientMetrics()
    metrics.probed()
    metrics.probed()
    metrics.resynced()
    metrics.handshake("rejected")
    let text = metrics.exposition()
    #expect(sample(text, "roam_probes_total") == 2)
    #expect(sample(text, "roam_netlink_resyncs_total") == 1)
    #expect(sample(text, #"roam_handshakes_total{result="rejected"}"#) == 1)
}

/// The data plane's counts arrive as increases; another data plane's start from zero.
@Test func dataPlaneCountsAreCarriedInAsIncreases() {
    final class Plane {}
    let metrics = ClientMetrics()
    let first = Plane(), second = Plane()
    var traffic = TrafficCounters()
    traffic.bytesIn = 1000
    traffic.noSession = 3
    metrics.sync(traffic: traffic, drops: DropCounters(), source: ObjectIdentifier(first))
    traffic.bytesIn = 1500
    metrics.sync(traffic: traffic, drops: DropCounters(), source: ObjectIdentifier(first))
    traffic.bytesIn = 200
    traffic.noSession = 0
    metrics.sync(traffic: traffic, drops: DropCounters(), source: ObjectIdentifier(second))
    let text = metrics.exposition()
    #expect(sample(text, #"roam_bytes_total{direction="in"}"#) == 1700, "\(text)")
    #expect(sample(text, #"roam_drops_total{cause="no-session"}"#) == 3)
}

/// The session's version and cipher: one series at 1, the others at 0, all 0 without a session.
@Test func theSessionsProtocolIsOneSeries() {
    let metrics = ClientMetrics()
    metrics.sessionProtocol(SessionProtocol(version: 3, cipher: .aes256GCM))
    var text = metrics.exposition()
    #expect(sample(text, #"roam_session_protocol{version="3",cipher="aes-256-gcm"}"#) == 1, "\(text)")
    #expect(sample(text, #"roam_session_protocol{version="2",cipher="chacha20-poly1305"}"#) == 0)
    metrics.sessionProtocol(SessionProtocol(version: 2, cipher: .chacha20Poly1305))
    text = metrics.exposition()
    #expect(sample(text, #"roam_session_protocol{version="3",cipher="aes-256-gcm"}"#) == 0)
    #expect(sample(text, #"roam_session_protocol{version="2",cipher="chacha20-poly1305"}"#) == 1)
    metrics.sessionProtocol(nil)
    #expect(!metrics.exposition().split(separator: "\n").contains { $0.hasPrefix("roam_session_protocol{") && $0.hasSuffix(" 1") })
}
