import Topology
import Foundation
import Glibc
import Logging
import NamespaceLab
import Basics
import Synchronization
import Tunnel
import Device
import Netlink

// Handshake floods against a real `agent serve` while a real `agent up` (full tunnel) roams
// between its uplinks and two other users keep handshaking. Prints, per flood, the real
// handshakes that succeeded within a second, their times, the probes lost through the roaming
// client's tunnel, and the server's CPU. Needs root; run through bench/flood.sh.
//
// Floods come from an attacker namespace behind the server's router:
//   spoofed  raw IPv4 datagrams from random sources in 100.64.0.0/10 (replies go nowhere);
//   direct   from the attacker's own address, answering every cookie reply as a client would;
//   v6-56    from one address in each of the 256 /64s of one IPv6 /56, answering every cookie reply;
//   v4-24s   from 64 IPv4 /24s, four addresses each, answering every cookie reply;
//   users    not a flood: a burst of real handshakes, each from another configured user (--users,
//            10,000 by default), at the rate given, from 256 addresses of a neighbour namespace.
// Half the spoofed and direct floods' initiations are from unknown keys, half log in as `carol`
// with a wrong password; the v6-56 and v4-24s floods' are from unknown keys.
// Throughout, 16 users with sessions rekey once a second each from their own addresses: their
// completed handshakes per second are the gateway's for legitimate clients during the flood.
//
// Usage: FloodBenchmark [--rates 1000,10000] [--seconds 10] [--kinds none,spoofed,direct,v6-56,v4-24s,users] [--users N] [--still] [--logs]
// (--still: the laptop does not roam, to tell the flood's effect from the roams')

enum Kind: String {
    case none, spoofed, direct, users
    case v6Network = "v6-56"
    case v4Networks = "v4-24s"
}

struct Failure: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

var rates = [1000, 10_000]
var seconds = 10
var kinds: [Kind] = [.none, .spoofed, .direct, .v6Network, .v4Networks]
var showLogs = false
var roams = true
var burstUsers = 10_000
var arguments = CommandLine.arguments.dropFirst()
while let argument = arguments.popFirst() {
    if argument == "--logs" {
        showLogs = true
        continue
    }
    if argument == "--still" {
        roams = false
        continue
    }
    let value = arguments.popFirst() ?? ""
    switch argument {
    case "--rates": rates = value.split(separator: ",").compactMap { Int($0) }
    case "--seconds": seconds = Int(value) ?? seconds
    case "--kinds": kinds = value.split(separator: ",").compactMap { Kind(rawValue: String($0)) }
    case "--users": burstUsers = Int(value) ?? burstUsers
    default:
        say("usage: FloodBenchmark [--rates 1000,10000] [--seconds 10] [--kinds none,spoofed,direct,v6-56,v4-24s,users] [--users N] [--still] [--logs]")
        exit(2)
    }
}
guard NamespaceLab.isRoot else {
    say("FloodBenchmark: \(NamespaceLab.skipReason)")
    exit(2)
}

let serverAddress = SocketAddress(IPAddress("198.51.100.7")!, port: 51820)
let carolPassword = "correct horse battery staple"

func sysctl(_ lab: NamespaceLab, _ setting: String) throws {
    _ = try NamespaceLab.capture(NamespaceLab.ipTool, ["netns", "exec", lab.name, "sysctl", "-qw", setting])
}

/// A session index (u32 little-endian) in a message: a sender's at 4, a response's receiver at 8.
func index(in message: [UInt8], at offset: Int) -> UInt32 {
    UInt32(message[offset]) | UInt32(message[offset + 1]) << 8 | UInt32(message[offset + 2]) << 16 | UInt32(message[offset + 3]) << 24
}

/// An IPv4/UDP datagram from `source` for the raw socket (the kernel fills in the IP checksum).
func spoofedDatagram(_ payload: [UInt8], from source: UInt32, port: UInt16) -> [UInt8] {
    var packet = [UInt8](repeating: 0, count: 28) + payload
    let total = packet.count
    packet[0] = 0x45
    packet[2] = UInt8(total >> 8)
    packet[3] = UInt8(total & 0xff)
    packet[8] = 64
    packet[9] = 17
    packet.replaceSubrange(12..<16, with: IPAddress.v4(source).bytes)
    packet.replaceSubrange(16..<20, with: serverAddress.ip.bytes)
    packet[20] = UInt8(port >> 8)
    packet[21] = UInt8(port & 0xff)
    packet[22] = UInt8(serverAddress.port >> 8)
    packet[23] = UInt8(serverAddress.port & 0xff)
    packet[24] = UInt8((total - 20) >> 8)
    packet[25] = UInt8((total - 20) & 0xff)
    return packet  // UDP checksum 0: none, which IPv4 allows
}

/// Sends the flood at `rate` per second until `running` clears; returns how many went out.
final class Flood: @unchecked Sendable {  // the slots are guarded by `lock`; the rest is set once
    let kind: Kind
    let rate: Int
    private let lock = NSLock()
    private var slots: [[UInt8]]
    private var cores: [ClientCore]
    private let running = Atomic<Bool>(true)
    private let sent = Atomic<Int>(0)
    private let cookies = Atomic<Int>(0)
    private var threads: [OSThread] = []
    private var rawSocket: Int32 = -1
    private var socket: UDPSocket?

    init(kind: Kind, rate: Int, in attacker: NamespaceLab, server: PublicKey) throws {
        self.kind = kind
        self.rate = rate
        cores = try (0..<64).map { i in
            let credentials = i % 2 == 0 ? nil : Credentials(username: "carol", password: "guess \(i)")
            return try ClientCore(privateKey: .generate(), serverKey: server, credentials: credentials)
        }
        var made: [[UInt8]] = []
        for i in cores.indices { made.append(try cores[i].initiate(now: .now(), wallClock: .now())) }
        slots = made
        switch kind {
        case .none, .users, .v6Network, .v4Networks: return
        case .spoofed:
            rawSocket = try attacker.namespace.run { () throws(NetlinkError) -> Int32 in Glibc.socket(AF_INET, Int32(SOCK_RAW.rawValue), Int32(IPPROTO_RAW)) }
            guard rawSocket >= 0 else { throw Failure("raw socket: \(String(cString: strerror(errno)))") }
        case .direct:
            socket = try UDPSocket(bindingTo: SocketAddress(IPAddress("203.0.113.2")!, port: 0), namespace: attacker.namespace)
            threads.append(try OSThread { [self] in answerCookies() })
        }
        threads.append(try OSThread { [self] in send() })
    }

    var count: Int { sent.load(ordering: .relaxed) }
    var cookiesAnswered: Int { cookies.load(ordering: .relaxed) }

    func stop() {
        running.store(false, ordering: .relaxed)
        for thread in threads { thread.join() }
        if rawSocket >= 0 { close(rawSocket) }
    }

    private func send() {
        var target = sockaddr_in()
        target.sin_family = sa_family_t(AF_INET)
        target.sin_addr.s_addr = inet_addr("198.51.100.7")
        let start = LabClock.now
        var n = 0
        var random = SystemRandomNumberGenerator()
        while running.load(ordering: .relaxed) {
            let due = Int(Double((LabClock.now - start).nanoseconds) / 1e9 * Double(rate))
            while n < due, running.load(ordering: .relaxed) {
                let initiation = lock.withLock { slots[n % slots.count] }
                switch kind {
                case .none, .users, .v6Network, .v4Networks: break
                case .spoofed:
                    let source = 0x6440_0000 | UInt32.random(in: 1..<0x3F_FFFF, using: &random)  // 100.64.0.0/10
                    let packet = spoofedDatagram(initiation, from: source, port: UInt16.random(in: 1024...65535, using: &random))
                    _ = packet.withUnsafeBytes { bytes in
                        withUnsafePointer(to: &target) {
                            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                                sendto(rawSocket, bytes.baseAddress, bytes.count, 0, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
                            }
                        }
                    }
                case .direct:
                    _ = try? socket?.send(initiation, to: serverAddress)
                }
                n += 1
            }
            sent.store(n, ordering: .relaxed)
            usleep(500)
        }
    }

    /// What a determined attacker with a real address does: takes every cookie and sends its
    /// initiations again with it, so only the per-source and per-account budgets hold it.
    private func answerCookies() {
        while running.load(ordering: .relaxed) {
            guard let socket, let received = try? socket.receive(timeout: .milliseconds(100)) else { continue }
            var reply = received.bytes
            lock.withLock {
                guard reply.count >= 8 else { return }
                let receiver = index(in: reply, at: 4)
                guard let i = slots.firstIndex(where: { $0.count >= 8 && index(in: $0, at: 4) == receiver })
                else { return }
                if case .cookie(let resend) = cores[i].receive(&reply, now: .now()) {
                    slots[i] = resend
                    cookies.add(1, ordering: .relaxed)
                }
            }
        }
    }
}

/// Real users, each with a key the server knows, handshaking once each at `rate` per second from
/// 256 addresses, answering cookie replies and confirming their sessions, as clients do.
final class Burst: @unchecked Sendable {  // `cores` and `sentAt` are guarded by `lock`
    private let lock = NSLock()
    private var cores: [ClientCore]
    private var byIndex: [UInt32: Int] = [:]
    private var sentAt: [Int: LabInstant] = [:]
    private var times: [Duration] = []
    private let sockets: [UDPSocket]
    private let running = Atomic<Bool>(true)
    private let started = Atomic<Int>(0)
    private var threads: [OSThread] = []
    let rate: Int

    init(keys: [PrivateKey], server: PublicKey, rate: Int, in lab: NamespaceLab) throws {
        self.rate = rate
        cores = try keys.map { try ClientCore(privateKey: $0, serverKey: server) }
        sockets = try (0..<256).map { i in
            try UDPSocket(bindingTo: SocketAddress(IPAddress("10.40.\(i / 250).\(i % 250 + 2)")!, port: 0), namespace: lab.namespace)
        }
        threads.append(try OSThread { [self] in send() })
        threads.append(try OSThread { [self] in receive() })
    }

    var attempted: Int { started.load(ordering: .relaxed) }
    var completed: [Duration] { lock.withLock { times } }

    func stop() {
        running.store(false, ordering: .relaxed)
        for thread in threads { thread.join() }
    }

    private func send() {
        let start = LabClock.now
        var n = 0
        while running.load(ordering: .relaxed), n < cores.count {
            let due = min(cores.count, Int(Double((LabClock.now - start).nanoseconds) / 1e9 * Double(rate)))
            while n < due {
                let initiation: [UInt8]? = lock.withLock {
                    guard let datagram = try? cores[n].initiate(now: .now(), wallClock: .now()) else { return nil }
                    byIndex[index(in: datagram, at: 4)] = n
                    sentAt[n] = LabClock.now
                    return datagram
                }
                if let initiation { _ = try? sockets[n % sockets.count].send(initiation, to: serverAddress) }
                n += 1
                started.store(n, ordering: .relaxed)
            }
            usleep(500)
        }
    }

    private func receive() {
        var buffer = [UInt8](repeating: 0, count: PacketBatch.slotSize)
        while running.load(ordering: .relaxed) {
            guard let ready = try? pollReadable(sockets.map(\.fileDescriptor), timeout: .milliseconds(100)) else { continue }
            for socket in sockets where ready.contains(socket.fileDescriptor) {
                while let (length, _) = (try? buffer.withUnsafeMutableBytes({ try socket.receive(into: $0, timeout: .zero) })) ?? nil {
                    guard length >= 12 else { continue }
                    // A response names our index at 8, a cookie reply at 4.
                    let at = buffer[1] == 2 ? 8 : 4
                    let ours = index(in: buffer, at: at)
                    var datagram = Array(buffer[0..<length])
                    let reply: [UInt8]? = lock.withLock {
                        guard let n = byIndex[ours] else { return nil }
                        switch cores[n].receive(&datagram, now: .now()) {
                        case .cookie(let resend): return resend
                        case .established(let done):
                            if let sent = sentAt[n] { times.append(LabClock.now - sent) }
                            byIndex[ours] = nil
                            return done.confirmation
                        default: return nil
                        }
                    }
                    if let reply { _ = try? socket.send(reply, to: serverAddress) }
                }
            }
        }
    }
}

/// A user who keeps handshaking from the bystander namespace; every attempt gets one second.
final class Handshaker: @unchecked Sendable {  // `results` is guarded by `lock`
    let name: String
    private let client: TunnelClient
    private let lock = NSLock()
    private var results: [Duration?] = []

    init(name: String, key: PrivateKey, credentials: Credentials?, server: PublicKey, in lab: NamespaceLab, address: String) throws {
        self.name = name
        let core = try ClientCore(privateKey: key, serverKey: server, credentials: credentials)
        let socket = try UDPSocket(bindingTo: SocketAddress(IPAddress(address)!, port: 0), namespace: lab.namespace)
        client = try TunnelClient(core: core, socket: socket, server: serverAddress, answersHints: false,
                                     logger: Logger(label: "flood") { _ in SwiftLogNoOpLogHandler() })
    }

    /// One handshake: its time, or nil when it failed or took more than a second.
    @discardableResult
    func attempt() -> Duration? {
        let start = LabClock.now
        let ok = (try? client.handshake(timeout: .seconds(1))) != nil
        let took: Duration? = ok ? LabClock.now - start : nil
        lock.withLock { results.append(took) }
        return took
    }

    func reset() { lock.withLock { results.removeAll() } }
    var outcomes: [Duration?] { lock.withLock { results } }
}

/// Users with sessions, each rekeying once a second from an address of its own, as many clients
/// rekeying every two minutes do together: the handshakes per second they complete.
final class Rekeying: @unchecked Sendable {  // `done` and `tried` are guarded by `lock`
    private let rekeyers: [Rekeyer]
    private let lock = NSLock()
    private var done = 0
    private var tried = 0
    private let running = Atomic<Bool>(false)
    private var threads: [OSThread] = []

    init(keys: [PrivateKey], server: PublicKey, addresses: [IPAddress], in lab: NamespaceLab) throws {
        rekeyers = try keys.indices.map { try Rekeyer(key: keys[$0], serverKey: server, from: addresses[$0], in: lab, to: serverAddress) }
        for (i, rekeyer) in rekeyers.enumerated() where rekeyer.handshake(timeout: .seconds(3)) == nil {
            throw Failure("user \(i) of the rekeying ones cannot log in")
        }
    }

    /// Starts counting afresh: every user rekeys once a second until `stop()`.
    func start() throws {
        lock.withLock { (done, tried) = (0, 0) }
        running.store(true, ordering: .relaxed)
        for rekeyer in rekeyers {
            threads.append(try OSThread { [self] in
                while running.load(ordering: .relaxed) {
                    let began = LabClock.now
                    let ok = rekeyer.handshake(timeout: .seconds(1)) != nil
                    lock.withLock {
                        tried += 1
                        if ok { done += 1 }
                    }
                    let rest = .seconds(1) - (LabClock.now - began)
                    if rest > .zero { usleep(UInt32(rest.nanoseconds / 1000)) }
                }
            })
        }
    }

    func stop() -> (done: Int, tried: Int) {
        running.store(false, ordering: .relaxed)
        for thread in threads { thread.join() }
        threads.removeAll()
        return lock.withLock { (done, tried) }
    }
}

func ms(_ d: Duration) -> String { String(format: "%.1f", Double(d.nanoseconds) / 1e6) }

func run(kind: Kind, rate: Int, seconds: Int, roams: Bool, burstUsers: Int, showLogs: Bool) throws -> String {
    let lab = try RoamingLab(vpn: .roam, routing: .full)
    let bystander = try NamespaceLab()
    try bystander.attach(to: lab.server, device: "by0", peer: "by0-s", address: "10.30.0.2", gateway: "10.30.0.1")
    let rekeyingAddresses = (0..<16).map { IPAddress.v4(0x0A1E_0010 + UInt32($0)) }  // 10.30.0.16...
    try bystander.batch(rekeyingAddresses.map { "address add \($0)/32 dev by0" })
    // The floods from real networks come from a namespace of their own (203.0.113.2 too).
    var networks: (lab: NamespaceLab, v4: [IPAddress], v6: [IPAddress], v6Missing: String?)?
    if kind == .v6Network || kind == .v4Networks {
        networks = try NamespaceLab.flooder(attachedTo: lab.server, networks: 64, perNetwork: 4)
        if kind == .v6Network, let reason = networks?.v6Missing { throw Failure("skipped: \(reason)") }
    }
    let attacker = try networks?.lab ?? NamespaceLab()
    if networks == nil {
        try attacker.attach(to: lab.server, device: "atk0", peer: "atk0-s", address: "203.0.113.2", gateway: "203.0.113.1")
        // Replies to the spoofed sources leave toward the attacker, who drops them; the server's
        // router does not check sources, as most on the internet do not.
        try lab.server.ip("route add 100.64.0.0/10 via 203.0.113.2")
    }
    try sysctl(lab.server, "net.ipv4.conf.all.rp_filter=0")
    try sysctl(lab.server, "net.ipv4.conf.atk0-s.rp_filter=0")
    try sysctl(lab.server, "net.ipv4.ip_forward=1")

    let bobKey = try PrivateKey.generate()
    let carolHash = try PasswordHash.create(password: carolPassword)
    let rekeyingKeys = try rekeyingAddresses.map { _ in try PrivateKey.generate() }
    try lab.addServerUsers("""
          - {name: bob, public-key: \(bobKey.publicKey.base64), addresses: [10.77.0.3]}
          - {name: carol, password-hash: "\(carolHash.encoded)", addresses: [10.77.0.4]}
        """ + "\n" + rekeyingKeys.enumerated().map { i, key in
            "  - {name: rekeying\(i), public-key: \(key.publicKey.base64), addresses: [10.77.1.\(10 + i)]}"
        }.joined(separator: "\n"))
    // The burst's users: keys the server knows, inner addresses in 10.78.0.0/16 and beyond.
    var burstKeys: [PrivateKey] = []
    if kind == .users {
        burstKeys = try (0..<burstUsers).map { _ in try PrivateKey.generate() }
        try lab.addServerUsers(burstKeys.enumerated().map { i, key in
            "  - {name: u\(i), public-key: \(key.publicKey.base64), addresses: [10.\(78 + i / 65_000).\(i % 65_000 / 250).\(i % 250 + 2)]}"
        }.joined(separator: "\n"))
        var lines = (0..<256).map { "address add 10.40.\($0 / 250).\($0 % 250 + 2)/16 dev atk0" }
        lines.append("route replace default via 203.0.113.1")
        try attacker.batch(lines)
        try lab.server.ip("route add 10.40.0.0/16 via 203.0.113.2")
    }
    let launched = LabClock.now
    try lab.startServer()
    let startUp: Duration? = LabClock.now - launched
    guard let serverKey = lab.serverPublicKey else { throw Failure("no server key") }
    try lab.startClient()
    let probes = try ProbeStream(from: SocketAddress(lab.clientInner, port: 0), in: lab.laptop,
                                 to: SocketAddress(lab.serverInner, port: 5006), in: lab.server)
    defer { probes.stop() }
    guard lab.waitFor(seconds: 10, { probes.firstEcho(after: LabClock.now - .seconds(1)) != nil }) else {
        throw Failure("no echo through the tunnel: \(lab.log("client.log"))")
    }
    let bob = try Handshaker(name: "bob", key: bobKey, credentials: nil, server: serverKey, in: bystander, address: "10.30.0.2")
    let carol = try Handshaker(name: "carol", key: .generate(), credentials: Credentials(username: "carol", password: carolPassword),
                               server: serverKey, in: bystander, address: "10.30.0.2")
    guard bob.attempt() != nil else { throw Failure("bob cannot log in: \(lab.log("server.log"))") }
    bob.reset()
    let rekeying = try Rekeying(keys: rekeyingKeys, server: serverKey, addresses: rekeyingAddresses, in: bystander)

    let flood = try Flood(kind: kind == .users ? .none : kind, rate: rate, in: attacker, server: serverKey)
    let burst = kind == .users ? try Burst(keys: burstKeys, server: serverKey, rate: rate, in: attacker) : nil
    let fromNetworks: CookieFlood? = try networks.map { networks in
        kind == .v6Network
            ? try CookieFlood(from: networks.v6, in: networks.lab, to: SocketAddress(IPAddress("2001:db8:7::7")!, port: serverAddress.port),
                              serverKey: serverKey, rate: rate)
            : try CookieFlood(from: networks.v4, in: networks.lab, to: serverAddress, serverKey: serverKey, rate: rate)
    }
    let cpuBefore = lab.serverCPU()
    let start = LabClock.now
    try rekeying.start()
    // Carol's first login comes a second into the flood: a cookie round trip and an Argon2id
    // while wrong passwords for her pour in. Her later logins are remembered (one HMAC).
    usleep(1_000_000)
    let firstLogin = carol.attempt()
    let end = start + .seconds(Int64(seconds))
    var nextRoam = start + .seconds(2)
    var onWifi = false
    var step = 0
    while LabClock.now < end {
        // The laptop roams: eth0 goes down (the session moves to wifi0), then comes back.
        if roams, LabClock.now >= nextRoam {
            try lab.laptop.ip("link set eth0 \(onWifi ? "up" : "down")")
            if onWifi { try lab.laptop.ip("route replace default via 10.20.0.1 dev eth0 metric 100") }
            onWifi.toggle()
            nextRoam = nextRoam + .seconds(2)
        }
        (step % 2 == 0 ? bob : carol).attempt()
        step += 1
        usleep(200_000)
    }
    let elapsed = LabClock.now - start
    let cpu = lab.serverCPU() - cpuBefore
    let rekeys = rekeying.stop()
    flood.stop()
    fromNetworks?.stop()
    usleep(300_000)
    burst?.stop()
    let (lost, sent) = probes.lost(from: start, to: end)
    let rtts = probes.roundTrips(from: start, to: end)
    let rttP99 = rtts.isEmpty ? "-" : ms(rtts[min(rtts.count - 1, rtts.count * 99 / 100)])
    let outcomes = bob.outcomes + carol.outcomes
    let times = outcomes.compactMap { $0 }.sorted()
    let p50 = times.isEmpty ? "-" : ms(times[times.count / 2])
    let worst = times.last.map(ms) ?? "-"
    if showLogs {
        say(lab.log("server.log"))
        say(lab.log("client.log"))
    }
    let perSecond = Double(fromNetworks?.count ?? flood.count) / (Double(elapsed.nanoseconds) / 1e9)
    let rekeysPerSecond = Double(rekeys.done) / (Double(elapsed.nanoseconds) / 1e9)
    let cpuPercent = Double(cpu.nanoseconds) / Double(elapsed.nanoseconds) * 100
    let last: String
    if let burst {
        let times = burst.completed.sorted()
        let p99 = times.isEmpty ? "-" : ms(times[min(times.count - 1, times.count * 99 / 100)])
        last = "burst: \(times.count)/\(burst.attempted) handshakes done, p99 \(p99) ms; server up in \(startUp.map(ms) ?? "?") ms"
    } else if let fromNetworks {
        last = "\(fromNetworks.cookiesAnswered), \(fromNetworks.refused) let through"
    } else {
        last = "\(flood.cookiesAnswered)"
    }
    return [
        kind.rawValue.padding(toLength: 9, withPad: " ", startingAt: 0),
        String(format: "%7d", rate), String(format: "%8.0f", perSecond),
        "\(times.count)/\(outcomes.count)".padding(toLength: 11, withPad: " ", startingAt: 0),
        p50.padding(toLength: 7, withPad: " ", startingAt: 0), worst.padding(toLength: 7, withPad: " ", startingAt: 0),
        "\(lost)/\(sent)".padding(toLength: 10, withPad: " ", startingAt: 0),
        rttP99.padding(toLength: 8, withPad: " ", startingAt: 0),
        String(format: "%5.1f", cpuPercent).padding(toLength: 12, withPad: " ", startingAt: 0),
        (firstLogin.map(ms) ?? "failed").padding(toLength: 14, withPad: " ", startingAt: 0),
        String(format: "%5.1f", rekeysPerSecond).padding(toLength: 12, withPad: " ", startingAt: 0),
        "\(rekeys.done)/\(rekeys.tried)".padding(toLength: 11, withPad: " ", startingAt: 0),
        last,
    ].joined(separator: "  ")
}

say("flood      rate/s   sent/s  real_hs_ok  p50_ms   max_ms   lost/sent   rtt_p99   server_cpu_%  first_login_ms  peer_hs/s     peer_ok      cookies_answered")
for kind in kinds {
    for rate in kind == .none ? [0] : rates {
        do {
            say(try run(kind: kind, rate: rate, seconds: seconds, roams: roams, burstUsers: burstUsers, showLogs: showLogs))
        } catch {
            say("\(kind.rawValue) \(rate): failed: \(error)")
        }
    }
}

func say(_ line: String) {
    FileHandle.standardError.write(Data((line + "\n").utf8))
}
