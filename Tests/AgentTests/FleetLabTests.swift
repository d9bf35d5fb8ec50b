import Foundation
import NamespaceLab
import Basics
import Tunnel
import Testing
import Device

/// Two gateways reading their users from one real PostgreSQL (`users-from`), clients spread over
/// them: users added and disabled in SQL arrive without a reload, a disabled user is cut off on
/// both within a second, and the gateways outlive the database (sessions kept, handshakes
/// accepted, a restart served from the snapshot, changes made meanwhile arriving once it is back).
@Suite(.enabled(if: NamespaceLab.isRoot && LabPostgres.available,
                Comment(rawValue: NamespaceLab.isRoot ? LabPostgres.skipReason : NamespaceLab.skipReason)), .serialized)
struct FleetLabTests {
    static let sql = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("contrib/sql")

    @Test func twoGatewaysFollowOneDirectoryAndOutliveIt() throws {
        let database = try LabPostgres()
        defer { database.stop() }
        for migration in ["001-users.sql", "002-notify.sql", "003-sessions.sql"] { try database.psql(file: Self.sql.appendingPathComponent(migration).path) }
        let lab = try GatewayLab(clients: 3, gateways: 2, usersFrom: database.url(), spread: true)
        func insert(_ n: Int) -> String {
            "INSERT INTO roam_users (name, public_key, addresses) VALUES ('user\(n)', '\(lab.clientKeys[n].base64)', '{\(lab.inner(n))}');"
        }
        func logs() -> String { (0..<2).map { "gateway \($0):\n" + lab.log(GatewayLab.serverLog($0)) }.joined(separator: "\n") }
        func count(_ text: String, in g: Int) -> Int { lab.log(GatewayLab.serverLog(g)).components(separatedBy: text).count - 1 }
        func probe(_ n: Int) throws -> ProbeStream {
            try ProbeStream(from: SocketAddress(lab.inner(n), port: 0), in: lab.laptops[n],
                            to: SocketAddress(GatewayLab.serverInner, port: UInt16(5006 + n)), in: lab.server, interval: .milliseconds(10))
        }
        try database.psql(insert(0) + insert(1))
        try lab.start(only: [0, 1])
        #expect(count("user=user0", in: 0) > 0 && count("user=user1", in: 1) > 0, "each client on the gateway it prefers\n\(logs())")

        // A user added in SQL connects without a reload; a row that claims an address outside the
        // tunnel (the metadata service's) is refused by name on both gateways, the rest load.
        try database.psql(insert(2) + "INSERT INTO roam_users (name, public_key, addresses) VALUES ('mallory', "
            + "'\(try PrivateKey.generate().publicKey.base64)', '{169.254.169.254}');")
        try lab.startClient(2)
        #expect(count("msg=\"users changed\"", in: 0) >= 1 && count("msg=\"users changed\"", in: 1) >= 1, "\(logs())")
        #expect(count("users reloaded", in: 0) + count("users reloaded", in: 1) == 0)
        #expect((0..<2).allSatisfy { count("msg=\"user refused\" user=mallory", in: $0) == 1 }, "\(logs())")
        // `agent check` reads the directory as the gateway would, and names the refused row.
        let check = try NamespaceLab.capture(RoamingLab.builtAgent, ["check", "--config", lab.directory + "/server.yaml"])
        #expect(check.status == 0 && check.output.contains("3 users from the directory")
                && check.output.contains("note: user mallory refused: its address 169.254.169.254 is outside the gateway's tunnel"),
                "\(check.output)")

        // A database that answers slowly never stalls handshakes: while a transaction holds
        // roam_users locked, gateway 0 reads it again (SIGHUP) and waits; user2 connects meanwhile.
        let blocker = try database.psqlInBackground("BEGIN; LOCK TABLE roam_users IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(4); COMMIT;")
        usleep(300_000)
        lab.signalGateway(0, SIGHUP)
        usleep(200_000)
        let reconnecting = LabClock.now
        lab.stopClient(2)
        try lab.startClient(2, seconds: 3)
        print("fleet: user2 connected again in \(LabClock.now - reconnecting) while the directory's read waited on a lock")
        #expect(blocker.isRunning, "the lock was held while user2 connected")
        blocker.waitUntilExit()
        #expect(labWait(seconds: 3) { count("why=SIGHUP", in: 0) > 0 }, "the read went on once the lock went\n\(logs())")

        let probes = try (0..<3).map(probe)
        defer { for p in probes { p.stop() } }
        usleep(1_000_000)

        // Disabled in SQL: cut off on both gateways within a second.
        let changesBefore = (0..<2).map { count("msg=\"users changed\"", in: $0) }
        let issued = LabClock.now
        try database.psql("UPDATE roam_users SET enabled = false WHERE name = 'user0'")
        let committed = LabClock.now
        var applied: [Duration?] = [nil, nil]
        _ = labWait(seconds: 3) {
            for g in 0..<2 where applied[g] == nil && count("msg=\"users changed\"", in: g) > changesBefore[g] { applied[g] = LabClock.now - committed }
            return applied.allSatisfy { $0 != nil }
        }
        print("fleet: psql took \(committed - issued); from its return to applied on gateway 0 \(applied[0].map { "\($0)" } ?? "never"), "
            + "gateway 1 \(applied[1].map { "\($0)" } ?? "never")")
        for g in 0..<2 { #expect(applied[g].map { $0 < .seconds(1) } == true, "gateway \(g) applied the change \(String(describing: applied[g]))\n\(logs())") }
        #expect(lab.log(GatewayLab.serverLog(0)).contains("sessions_ended=1"), "user0's session ended on its gateway\n\(logs())")
        usleep(3_000_000)
        let cutOff = probes[0].lastEcho.map { $0 - committed }
        print("fleet: user0's last echo \(cutOff.map { "\($0)" } ?? "none") after the UPDATE")
        #expect(cutOff.map { $0 < .seconds(1) } ?? false, "user0's probes stop within a second: \(String(describing: cutOff))")
        let later = probes[0].lost(from: committed + .seconds(1), to: LabClock.now - .milliseconds(500))
        #expect(later.sent > 100 && later.lost == later.sent, "no probe of user0 gets through, on either gateway: \(later)\n\(logs())")
        #expect(count("user=user0", in: 1) == 0, "gateway 1 never took user0\n\(logs())")

        // The database stops: every session stays, and a known user's new handshake is accepted.
        try database.pause()
        #expect(labWait(seconds: 5) { (0..<2).allSatisfy { count("user directory unreachable", in: $0) > 0 } }, "\(logs())")
        let down = LabClock.now
        usleep(2_000_000)
        for n in 1...2 {
            let (lost, sent) = probes[n].lost(from: down, to: LabClock.now - .milliseconds(500))
            #expect(sent > 100 && lost == 0, "client \(n) kept its session: \(lost) of \(sent) probes lost\n\(logs())")
        }
        let handshakesBefore = count("user=user1", in: 1)
        lab.stopClient(1)
        try lab.startClient(1)
        #expect(count("user=user1", in: 1) > handshakesBefore, "a new handshake from user1 while the database is down\n\(logs())")

        // Gateway 1 restarted while the database is down: it serves from its snapshot.
        lab.signalGateway(1, SIGTERM)
        #expect(labWait(seconds: 5) { !lab.gatewayRuns(1) })
        try lab.startGateway(1)
        #expect(count("serving the snapshot", in: 1) == 1, "\(logs())")
        let restarted = LabClock.now
        #expect(labWait(seconds: 10) { probes[1].firstEcho(after: restarted) != nil }, "client 1 is served again\n\(logs())")
        usleep(1_000_000)
        #expect(count("user=user0", in: 1) == 0, "the snapshot does not bring user0 back\n\(logs())")

        // The database is back, and a change made before the gateways reconnect arrives.
        try database.start()
        try database.psql("UPDATE roam_users SET enabled = false WHERE name = 'user2'")
        let second = LabClock.now
        #expect(labWait(seconds: 40) { (0..<2).allSatisfy { count("user directory reachable again", in: $0) > 0 } }, "\(logs())")
        usleep(2_000_000)
        let gone = probes[2].lost(from: LabClock.now - .seconds(1), to: LabClock.now - .milliseconds(300))
        #expect(gone.sent > 50 && gone.lost == gone.sent, "user2 disabled meanwhile is cut off: \(gone)\n\(logs())")
        print("fleet: database back; reconnected within \(LabClock.now - second - .seconds(2)) at most")
        let kept = probes[1].lost(from: LabClock.now - .seconds(1), to: LabClock.now - .milliseconds(300))
        #expect(kept.sent > 50 && kept.lost == 0, "user1 stays: \(kept)\n\(logs())")

        // Each gateway records who is connected to it: user1 on one, nobody disabled anywhere. A
        // gateway renews its records every 10 s, so a row it wrote just before it applied the
        // change may stand until its next renewal: waited for, within two renewals.
        var fleet = ""
        #expect(labWait(seconds: 25) {
            fleet = (try? database.psql("SELECT user_name || ' ' || gateway || ' ' || array_to_string(addresses, ',') || ' ' || (bytes_in > 0) "
                + "|| ' ' || (since <= now()) FROM roam_fleet ORDER BY 1"))?.trimmingCharacters(in: .newlines) ?? ""
            return fleet.hasPrefix("user1 gw") && fleet.split(separator: "\n").count == 1
        }, "the fleet: \(fleet)\n\(logs())")
        #expect(fleet.split(separator: "\n").count == 1 && fleet.hasSuffix("\(lab.inner(1)) true true"), "\(fleet.debugDescription)")
        if ProcessInfo.processInfo.environment["FLEET_LOGS"] != nil { print(logs()) }
    }
}
