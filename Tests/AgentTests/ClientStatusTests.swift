import Testing
import ControlWire
@testable import Control
@testable import Tunnel

/// The client's status as written: the keys in the order docs/CONTROL.md gives them, `null` for
/// what is missing, parts left out where the document says they appear only at times, and
/// durations as milliseconds to the microsecond.
struct ClientStatusTests {
    static let eth0 = ClientStatus.Path(interface: "eth0", kind: "ethernet", source: "10.31.2.2", transport: "udp")
    static let wifi0 = ClientStatus.Path(interface: "wifi0", kind: "wifi", source: "10.31.1.2", transport: "stream")

    /// docs/CONTROL.md's example: connected over Ethernet, with a lockdown and resolvers.
    static var connected: ClientStatus {
        var traffic = TrafficCounters()
        (traffic.packetsIn, traffic.packetsOut, traffic.bytesIn, traffic.bytesOut) = (1204, 1187, 118_320, 104_600)
        return ClientStatus(
            state: "connected", server: ClientStatus.Server(name: "fra1", address: "198.51.100.7:51820"), path: eth0, ssid: nil,
            profile: ClientStatus.Profile(name: "work", file: "/etc/roam/work.yaml"), profiles: ["home", "work"],
            roundTripTime: .microseconds(1051),
            mtu: ClientStatus.MTU(tunnel: 1340, configured: 1420, floor: 1280, searching: false, sizeProbes: 9),
            since: ClientStatus.Since(
                at: "2026-11-23T18:05:17Z", duration: .microseconds(5_310_200),
                transition: ClientStatus.Transition(at: "2026-11-23T18:05:17Z", from: "switching", to: "connected", trigger: "probe-reply",
                                                    reason: "switched(eth0 rtt 1ms)", path: eth0, attempt: 0, coalesced: 0)),
            attempts: 3, budgetLeft: 9, connectivityChecks: 0, power: "ac",
            dataPlane: ClientStatus.DataPlane(traffic: traffic, drops: DropCounters()), offload: "tso",
            session: SessionProtocol(version: 3, cipher: .aes256GCM),
            lockdown: ClientStatus.Lockdown(blocked: [("dns", 1), ("ipv6", 0), ("out", 12)], openOn: nil, exceptionsFor: "agent", refusedLoads: 0),
            dns: ClientStatus.DNS(manager: "resolv.conf", applied: (["10.77.0.1"], ["corp.example"]), problem: nil),
            excluded: [ClientStatus.Excluded(pid: 4242, name: "steam")], guestNetworks: ["docker0 172.17.0.0/16"],
            localNetworks: ["10.99.0.0/16"], widerClaims: ["10.0.0.0/8"],
            upkeep: [ClientStatus.Upkeep(holding: "routing", missing: nil, restores: 2, lastRemovedBy: "NetworkManager (pid 812)", heldFor: nil),
                     ClientStatus.Upkeep(holding: "lockdown", missing: "table", restores: 0, lastRemovedBy: nil, heldFor: .milliseconds(1500))])
    }

    @Test func aConnectedStatusIsWrittenFieldByFieldInOrder() {
        let expected = [
            #"{"role":"client","state":"connected","server":{"name":"fra1","address":"198.51.100.7:51820"},"#,
            #""path":{"interface":"eth0","kind":"ethernet","source":"10.31.2.2","transport":"udp"},"ssid":null,"#,
            #""profile":{"name":"work","file":"/etc/roam/work.yaml"},"profiles":["home","work"],"rtt_ms":1.051,"#,
            #""mtu":{"tunnel":1340,"configured":1420,"floor":1280,"searching":false,"size_probes":9},"#,
            #""since":"2026-11-23T18:05:17Z","for_ms":5310.2,"last_transition":{"at":"2026-11-23T18:05:17Z","from":"switching","#,
            #""to":"connected","trigger":"probe-reply","reason":"switched(eth0 rtt 1ms)","#,
            #""path":{"interface":"eth0","kind":"ethernet","source":"10.31.2.2","transport":"udp"},"attempt":0,"coalesced":0},"#,
            #""attempts":3,"budget_left":9,"connectivity_checks":0,"power":"ac","#,
            #""traffic":{"packets_in":1204,"packets_out":1187,"bytes_in":118320,"bytes_out":104600,"super_packets":0,"#,
            #""super_packets_written":0,"too_big":0,"too_big_answered":0},"drops":{"total":0,"no_session":0,"offload":0,"by_cause":{}},"#,
            #""offload":"tso","session":{"protocol":3,"cipher":"aes-256-gcm"},"#,
            #""lockdown":{"enabled":true,"blocked":{"dns":1,"ipv6":0,"out":12},"open_on":null,"exceptions_for":"agent","refused_loads":0},"#,
            #""dns":{"manager":"resolv.conf","resolvers":["10.77.0.1"],"search":["corp.example"],"problem":null},"#,
            #""diverting_routes":[],"excluded":[{"pid":4242,"name":"steam"}],"guest_networks":["docker0 172.17.0.0/16"],"#,
            #""local_networks":["10.99.0.0/16"],"wider_claims":["10.0.0.0/8"],"other_tunnels":[],"#,
            #""upkeep":{"routing":{"missing":null,"restores":2,"last_removed_by":"NetworkManager (pid 812)","held_for_ms":null},"#,
            #""lockdown":{"missing":"table","restores":0,"last_removed_by":null,"held_for_ms":1500.0}}}"#,
        ].joined()
        #expect(Self.connected.json.text == expected)
    }

    /// Behind a portal on a stream through a proxy named by host: the state's own fields and the
    /// transports appear, what is missing is `null` or left out as the document says.
    @Test func aPortalOnAStreamWritesItsOwnFieldsAndTheProxysAddresses() {
        var status = Self.connected
        status.state = "portal"
        status.server.handoverTo = "ams1"
        status.path = Self.wifi0
        status.ssid = "Hotel \"Lobby\""
        status.profile.name = nil
        status.profiles = nil
        status.roundTripTime = nil
        status.since = nil
        status.portal = ClientStatus.Portal(url: "https://login.hotel.example/", window: .milliseconds(291_000), nextCheck: .microseconds(28_000_500))
        var drops = DropCounters()
        drops.count(.replayed)
        drops.count(.replayed)
        status.dataPlane?.drops = drops
        status.dataPlane?.traffic.noSession = 5
        status.offload = nil
        status.transports = ClientStatus.Transports(
            stream: ClientStatus.Stream(port: 443, proxy: "proxy.corp.example:3128", dropped: 2,
                                        proxyAt: [ClientStatus.ProxyAddress(interface: "eth0", gateway: "10.31.2.1", address: "10.31.2.9:3128"),
                                                  ClientStatus.ProxyAddress(interface: "wifi0", gateway: "10.160.0.1", address: nil)]),
            networks: [ClientStatus.Network(interface: "wifi0", gateway: "10.160.0.1", udp: "blocked")])
        status.session = nil
        status.lockdown = nil
        status.dns = nil
        status.upkeep = []
        let text = status.json.text
        let head = [
            #"{"role":"client","state":"portal","server":{"name":"fra1","address":"198.51.100.7:51820","handover_to":"ams1"},"#,
            #""path":{"interface":"wifi0","kind":"wifi","source":"10.31.1.2","transport":"stream"},"ssid":"Hotel \"Lobby\"","#,
            #""profile":{"name":null,"file":"/etc/roam/work.yaml"},"profiles":null,"rtt_ms":null,"mtu":{"#,
        ].joined()
        #expect(text.hasPrefix(head), "\(text)")
        let portal = [
            #""size_probes":9},"portal":{"url":"https://login.hotel.example/","window_ms":291000.0,"next_check_ms":28000.5},"#,
            #""attempts":3,"#,
        ].joined()
        #expect(text.contains(portal), "\(text)")
        let transports = [
            #""drops":{"total":2,"no_session":5,"offload":0,"by_cause":{"replayed":2}},"offload":null,"#,
            #""transports":{"stream":{"port":443,"proxy":"proxy.corp.example:3128","dropped":2,"#,
            #""proxy_at":[{"interface":"eth0","gateway":"10.31.2.1","address":"10.31.2.9:3128"},"#,
            #"{"interface":"wifi0","gateway":"10.160.0.1","address":null}]},"#,
            #""networks":[{"interface":"wifi0","gateway":"10.160.0.1","udp":"blocked"}]},"#,
            #""session":null,"lockdown":{"enabled":false},"diverting_routes":[],"#,
        ].joined()
        #expect(text.contains(transports), "\(text)")
        #expect(text.hasSuffix(#""other_tunnels":[],"upkeep":{}}"#), "\(text)")
    }

    /// Kept down by an on-demand rule, without a data plane, on a stream with a plain proxy and no
    /// session on it: no `traffic`, `drops`, `dropped` or `proxy_at`.
    @Test func aStatusWithoutASessionLeavesItsCountersOut() {
        var status = Self.connected
        status.state = "disconnected"
        status.path = nil
        status.onDemand = ClientStatus.OnDemand(rule: "home", lockdownLifted: true)
        status.dataPlane = nil
        status.transports = ClientStatus.Transports(stream: ClientStatus.Stream(port: 443, proxy: nil), networks: [])
        status.dns?.applied = nil
        status.dns?.problem = "no resolvers given"
        let text = status.json.text
        #expect(text.contains(#""path":null,"ssid":null,"#), "\(text)")
        #expect(text.contains(#""coalesced":0},"on_demand":{"rule":"home","lockdown_lifted":true},"attempts":3,"#), "\(text)")
        #expect(text.contains(#""power":"ac","offload":"tso","transports":{"stream":{"port":443,"proxy":null},"networks":[]},"session":"#), "\(text)")
        #expect(text.contains(#""dns":{"manager":"resolv.conf","problem":"no resolvers given"},"#), "\(text)")
    }

    /// A transition while switching: the candidate after the path, the server, the retry's delay.
    @Test func aTransitionWritesItsOptionalFieldsInPlace() {
        let transition = ClientStatus.Transition(
            at: "2026-11-23T18:05:17Z", from: "connected", to: "switching", trigger: "paths", reason: "pathLost(eth0)", path: nil,
            candidate: Self.wifi0, server: "fra1", attempt: 2, nextRetry: .microseconds(1_250_125), coalesced: 1)
        let expected = [
            #"{"at":"2026-11-23T18:05:17Z","from":"connected","to":"switching","trigger":"paths","#,
            #""reason":"pathLost(eth0)","path":null,"candidate":{"interface":"wifi0","kind":"wifi","source":"10.31.1.2","transport":"stream"},"#,
            #""server":"fra1","attempt":2,"next_retry_ms":1250.125,"coalesced":1}"#,
        ].joined()
        #expect(transition.json.text == expected)
    }
}
