import Testing
import ControlWire
@testable import Control
@testable import Tunnel

/// A gateway's status as written: the keys in docs/CONTROL.md's order, the directory's times in
/// whole milliseconds, the sessions by protocol sorted by version and cipher.
struct ServerStatusTests {
    static var serving: ServerStatus {
        var traffic = TrafficCounters()
        (traffic.packetsIn, traffic.packetsOut, traffic.superPackets, traffic.tooBig, traffic.initiationsOverflowed) = (2_198_290, 2_217_547, 46_393, 12, 1)
        var admissions = Admissions()
        (admissions.general, admissions.peer) = (40, 3)
        return ServerStatus(
            sessions: 2, draining: false, workers: 2, offload: "tso", traffic: traffic, drops: DropCounters(), admissions: admissions,
            users: 999, streams: ServerStatus.Streams(port: 443, open: 14, accepted: 212, refused: 0, sessions: 12),
            directory: ServerStatus.Directory(
                reachable: true, origin: "database", duration: .seconds(86400), users: 999, refused: 1, changes: 12, reconnects: 0,
                lastChange: .microseconds(5_000_900), error: nil, snapshot: "/var/lib/roam/users.snapshot", snapshotWritten: nil,
                snapshotError: "disk full", gateway: "fra1"),
            protocols: ProtocolPolicy(versions: [3, 2]),
            sessionsByProtocol: [SessionProtocol(version: 3, cipher: .aes256GCM): 1, SessionProtocol(version: 3, cipher: .chacha20Poly1305): 4,
                                 SessionProtocol(version: 2, cipher: .chacha20Poly1305): 2])
    }

    @Test func aServingGatewayIsWrittenFieldByFieldInOrder() {
        let expected = [
            #"{"role":"server","sessions":2,"draining":false,"workers":2,"offload":"tso","#,
            #""traffic":{"packets_in":2198290,"packets_out":2217547,"bytes_in":0,"bytes_out":0,"super_packets":46393,"#,
            #""super_packets_written":0,"too_big":12,"too_big_answered":0,"initiations_overflowed":1},"#,
            #""drops":{"total":0,"offload":0,"by_cause":{}},"admissions":{"general":40,"peer":3},"users":999,"#,
            #""streams":{"port":443,"open":14,"accepted":212,"refused":0,"sessions":12},"#,
            #""directory":{"state":"following","origin":"database","for_ms":86400000,"users":999,"refused":1,"changes":12,"#,
            #""reconnects":0,"last_change_ms_ago":5000,"error":null,"snapshot":"/var/lib/roam/users.snapshot","#,
            #""snapshot_written_ms_ago":null,"snapshot_error":"disk full","gateway":"fra1"},"#,
            #""protocols":{"allowed":[2,3],"cipher":"negotiated","sessions":[{"version":2,"cipher":"chacha20-poly1305","count":2},"#,
            #"{"version":3,"cipher":"chacha20-poly1305","count":4},{"version":3,"cipher":"aes-256-gcm","count":1}]}}"#,
        ].joined()
        #expect(Self.serving.json.text == expected)
    }

    /// Without streams or a directory, both are `null`; a pinned cipher is named.
    @Test func aGatewayWithoutStreamsOrADirectoryWritesNulls() {
        var status = Self.serving
        status.draining = true
        status.streams = nil
        status.directory = nil
        status.protocols = ProtocolPolicy(versions: [3], cipher: .aes256GCM)
        status.sessionsByProtocol = [:]
        let text = status.json.text
        #expect(text.hasPrefix(#"{"role":"server","sessions":2,"draining":true,"#), "\(text)")
        #expect(text.hasSuffix(#""users":999,"streams":null,"directory":null,"protocols":{"allowed":[3],"cipher":"aes-256-gcm","sessions":[]}}"#),
                "\(text)")
    }
}
