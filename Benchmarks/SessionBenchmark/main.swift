// The server's protocol core at gateway scale, in one process, no network: a users database of
// N key users, a handshake for every one of them (the client's side made beforehand, so only
// the server's work is timed), then the memory the live sessions hold and the cost of an
// established session's packet while the handshakes go on.
//
// Usage: swift run -c release SessionBenchmark [users]   (bench/sessions.sh builds and runs it)
import Foundation
import Basics
import Tunnel
import Device

let users = CommandLine.arguments.dropFirst().first.flatMap(Int.init) ?? 10_000

func seconds(_ d: Duration) -> Double { Double(d.components.seconds) + Double(d.components.attoseconds) / 1e18 }

/// Resident and anonymous memory of this process, in kB.
func memory() -> (rss: Int, anonymous: Int) {
    let text = (try? String(contentsOfFile: "/proc/self/status", encoding: .utf8)) ?? ""
    func field(_ name: String) -> Int {
        text.split(separator: "\n").first { $0.hasPrefix(name + ":") }
            .flatMap { Int($0.split(separator: " ").dropLast().last ?? "") } ?? 0
    }
    return (field("VmRSS"), field("RssAnon"))
}

let serverKey = try PrivateKey.generate()
var clientKeys: [PrivateKey] = []
clientKeys.reserveCapacity(users)
for _ in 0..<users { clientKeys.append(try PrivateKey.generate()) }
let people = clientKeys.enumerated().map { i, key in
    User(publicKey: key.publicKey, addresses: [.v4(0x0A40_0000 + UInt32(i) + 2)])  // 10.64.0.2 onwards
}
// A gateway's budgets are for the internet; here every handshake is a real client's.
let open = ServerLimits.Rate(perSecond: 1e9, burst: 1e9)
let limits = ServerLimits(handshakesPerSource: open, handshakesPerNetwork: open, handshakes: open)

let before = memory()
let start = ContinuousClock.now
let database = try UserDatabase(people)
var server = try ServerCore(privateKey: serverKey, users: database, limits: limits)
let startUp = ContinuousClock.now - start
let configured = memory()
print(String(format: "users: %d; database and core built in %.1f ms; memory for them: %d kB (%.0f bytes per user)",
             users, seconds(startUp) * 1000, configured.rss - before.rss, Double((configured.rss - before.rss) * 1024) / Double(users)))

// The clients' initiations, made before the clock starts.
var clients: [ClientCore] = []
var initiations: [[UInt8]] = []
let wall = TAI64N.now()
for key in clientKeys {
    var client = try ClientCore(privateKey: key, serverKey: serverKey.publicKey)
    initiations.append(try client.initiate(now: .now(), wallClock: wall))
    clients.append(client)
}

// One established session whose packets are timed while the handshakes go on.
let firstSource = SocketAddress(.v4(0xC000_0201), port: 40_000)
func source(_ i: Int) -> SocketAddress { SocketAddress(.v4(0x6440_0000 + UInt32(i)), port: UInt16(1024 + i % 60_000)) }

let sessionsBefore = memory()
var responseTime = Duration.zero
var confirmed = 0
for i in clients.indices {
    var initiation = initiations[i]
    let t0 = ContinuousClock.now
    let event = server.receive(&initiation, from: i == 0 ? firstSource : source(i), now: .now())
    responseTime += ContinuousClock.now - t0
    guard case .handshake(_, var response, _) = event,
          case .established(let done) = clients[i].receive(&response, now: .now()) else { continue }
    var confirmation = done.confirmation
    if case .keepalive = server.receive(&confirmation, from: i == 0 ? firstSource : source(i), now: .now()) { confirmed += 1 }
}
let sessions = memory()
print(String(format: "handshakes: %d of %d confirmed; the server's side took %.3f s: %.0f handshakes/s on one core",
             confirmed, users, seconds(responseTime), Double(users) / seconds(responseTime)))
print(String(format: "sessions held: %d; memory for them: %d kB RSS, %d kB anonymous (%.0f bytes per session, %.0f kB per 1,000)",
             server.sessionCount, sessions.rss - sessionsBefore.rss, sessions.anonymous - sessionsBefore.anonymous,
             Double((sessions.rss - sessionsBefore.rss) * 1024) / Double(max(server.sessionCount, 1)),
             Double(sessions.rss - sessionsBefore.rss) / Double(max(server.sessionCount, 1)) * 1000))

// Version 3, on a core of its own: the same users, each sending the initiation's two parts and,
// once answered, its identity. Only the server's side is timed (its X25519 operations and the
// ML-KEM encapsulation); the clients' keys and messages are made outside the clock.
do {
    var gateway = try ServerCore(privateKey: serverKey, users: database, limits: limits)
    var time = Duration.zero
    var done = 0
    for (i, key) in clientKeys.enumerated() {
        var client = try ClientCore(privateKey: key, serverKey: serverKey.publicKey, version: 3)
        var parts = try client.initiation(now: .now(), wallClock: wall)
        let from = source(i)
        let t0 = ContinuousClock.now
        _ = gateway.receive(&parts[0], from: from, now: .now())
        let answer = gateway.receive(&parts[1], from: from, now: .now())
        time += ContinuousClock.now - t0
        guard case .reply(var response, _) = answer, case .send(let identity) = client.receive(&response, now: .now()) else { continue }
        var message = identity[0]
        let t1 = ContinuousClock.now
        let verdict = gateway.receive(&message, from: from, now: .now())
        time += ContinuousClock.now - t1
        guard case .handshake(_, var sealed, _) = verdict, case .established = client.receive(&sealed, now: .now()) else { continue }
        done += 1
    }
    print(String(format: "version 3 handshakes: %d of %d; the server's side took %.3f s: %.0f handshakes/s on one core",
                 done, users, seconds(time), Double(users) / seconds(time)))
}

// An established session's data packet: open at the server, with 10,000 sessions in the tables.
var packet = [UInt8](repeating: 0, count: 20 + 1380)
packet[0] = 0x45
packet.replaceSubrange(12..<16, with: IPAddress.v4(0x0A40_0002).bytes)
packet.replaceSubrange(16..<20, with: IPAddress.v4(0x0A40_0001).bytes)
let rounds = 200_000
var opened = 0
let t0 = ContinuousClock.now
for _ in 0..<rounds {
    var framed = DataPacket.frame(packet)
    try clients[0].seal(&framed, now: .now())
    if case .packet = server.receive(&framed, from: firstSource, now: .now()) { opened += 1 }
}
let perPacket = seconds(ContinuousClock.now - t0) / Double(rounds)
print(String(format: "data: %d of %d packets of 1400 bytes sealed by the client and opened by the server, %.2f µs per packet (both sides)",
             opened, rounds, perPacket * 1e6))
