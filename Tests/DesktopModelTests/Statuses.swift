import ControlWire
@testable import DesktopModel
import Testing

/// Status lines as the agent writes them: the fields and their order are `ClientStatus.json`'s
/// (Sources/Control/ClientStatus.swift), the values docs/CONTROL.md's examples.
enum Statuses {
    static let path = #"{"interface":"eth0","kind":"ethernet","source":"10.31.2.2","transport":"udp"}"#
    static let wifi = #"{"interface":"wifi0","kind":"wifi","source":"10.31.1.2","transport":"udp"}"#
    static let mtu = #"{"tunnel":1340,"configured":1420,"floor":1280,"searching":false,"size_probes":9}"#
    static let traffic = #""traffic":{"packets_in":1204,"packets_out":1187,"bytes_in":118320,"bytes_out":104600,"super_packets":0,"super_packets_written":0,"too_big":0,"too_big_answered":0},"drops":{"total":0,"no_session":0,"offload":0,"by_cause":{}},"#
    static let upkeep = #""upkeep":{"routing":{"missing":null,"restores":2,"last_removed_by":"NetworkManager (pid 812)","held_for_ms":null},"resolvers":{"missing":null,"restores":0,"last_removed_by":null,"held_for_ms":null},"lockdown":{"missing":null,"restores":0,"last_removed_by":null,"held_for_ms":null}}"#

    static func lockdown(out: Int = 12, openOn: String? = nil) -> String {
        #"{"enabled":true,"blocked":{"dns":1,"ipv6":0,"out":\#(out),"in":0,"forward":0,"inner":0},"open_on":\#(openOn.map { "\"\($0)\"" } ?? "null"),"exceptions_for":"agent","refused_loads":0}"#
    }

    /// A client's status answer; `extra` goes where the agent puts the state's own fields.
    static func client(state: String, path: String? = Statuses.path, rtt: String = "1.051", extra: String = "",
                       transition: String? = nil, session: String = #"{"protocol":3,"cipher":"aes-256-gcm"}"#,
                       lockdown: String = Statuses.lockdown(), excluded: String = #"[{"pid":4242,"name":"steam"}]"#,
                       ssid: String? = nil, profiles: String? = Statuses.profiles) -> String {
        let last = transition ?? #"{"at":"2026-11-23T18:05:17Z","from":"switching","to":"\#(state)","trigger":"probe-reply","reason":"switched(eth0 rtt 1ms)","path":\#(path ?? "null"),"attempt":0,"coalesced":0}"#
        return #"{"version":1,"ok":true,"status":{"role":"client","state":"\#(state)","server":{"name":"fra1","address":"198.51.100.7:51820"},"path":\#(path ?? "null"),\#(profiles.map { #""ssid":\#(ssid.map { "\"\($0)\"" } ?? "null"),\#($0)"# } ?? "")"rtt_ms":\#(rtt),"mtu":\#(mtu),"since":"2026-11-23T18:05:17Z","for_ms":5310.2,"last_transition":\#(last),\#(extra)"attempts":3,"budget_left":9,"connectivity_checks":0,"power":"ac",\#(traffic)"offload":"tso","session":\#(session),"lockdown":\#(lockdown),"dns":{"manager":"resolv.conf","resolvers":["10.77.0.1"],"search":["corp.example"],"problem":null},"diverting_routes":[],"excluded":\#(excluded),"guest_networks":["docker0 172.17.0.0/16"],"local_networks":["10.99.0.0/16"],"wider_claims":[],"other_tunnels":[],\#(upkeep)}}"#
    }

    /// The profile the agent runs and the ones it sees installed (left out: an agent before them).
    static let profiles = #""profile":{"name":"work","file":"/etc/roam/work.yaml"},"profiles":["home","work"],"#

    static let connected = client(state: "connected")
    static let connectedOnWifi = client(state: "connected", path: wifi, rtt: "23.4", ssid: "Hotel \\\"Lobby\\\"")
    /// An agent from before the status named the Wi-Fi network and the profiles.
    static let connectedOlder = client(state: "connected", profiles: nil)
    static let probing = client(state: "probing", path: wifi)
    static let portal = client(state: "portal", path: wifi, rtt: "null",
                               extra: #""portal":{"url":"https://login.hotel.example/","window_ms":291000.0,"next_check_ms":28000.0},"#,
                               session: "null")
    static let paused = client(state: "paused", path: nil, rtt: "null", session: "null")
    static func pausedBlocking(_ out: Int) -> String { client(state: "paused", path: nil, rtt: "null", session: "null", lockdown: lockdown(out: out)) }
    static func offlineBlocking(_ out: Int) -> String { client(state: "offline", path: nil, rtt: "null", session: "null", lockdown: lockdown(out: out)) }
    static let failed = client(state: "failed", path: nil, rtt: "null",
                               transition: #"{"at":"2026-11-23T18:05:17Z","from":"connecting","to":"failed","trigger":"handshake-failed","reason":"rejected(unknown key)","path":null,"attempt":3,"coalesced":0}"#,
                               session: "null")
    static let backingOff = client(state: "backing-off", rtt: "null",
                                   transition: #"{"at":"2026-11-23T18:05:17Z","from":"connecting","to":"backing-off","trigger":"timer:handshake","reason":"handshakeTimedOut","path":\#(path),"attempt":2,"next_retry_ms":4000.0,"coalesced":0}"#,
                                   session: "null")
    static let disconnected = client(state: "disconnected", path: nil, rtt: "null",
                                     extra: #""on_demand":{"rule":"home","lockdown_lifted":true},"#, session: "null",
                                     lockdown: lockdown(out: 0, openOn: "wifi0"), excluded: "[]")
    static let server = #"{"version":1,"ok":true,"status":{"role":"server","sessions":2,"draining":false,"workers":2,"offload":"tso","users":999,"streams":null,"directory":null}}"#

    /// A watch's transition line (the status it led to follows the transition).
    static func transition(to status: String) throws -> JSON {
        let inner = try #require(try JSON.parse(status)["status"])
        return .object([("version", .int(1)), ("event", .string("transition")),
                        ("transition", .object([("from", .string("connected")), ("to", inner["state"] ?? .null)])), ("status", inner)])
    }

    static func report(_ line: String) throws -> AgentReport {
        try #require(try AgentReport(line: try JSON.parse(line)))
    }

    static func status(_ line: String) throws -> AgentStatus {
        try AgentStatus(answer: try JSON.parse(line))
    }
}
