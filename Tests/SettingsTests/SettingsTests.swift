import Topology
import Basics
import ConfigReader
import Connectivity
import Foundation
@testable import Settings
import Testing
import Tunnel
import Device
import Netlink
import Reconnector

private let serverKey = "DOhENSqkl0bz76f4V74zWBszpV8RtmtBNnLQvt8mvwM="

private func parse<T>(_ text: String, _ read: (YAMLReader, Node) throws -> T) throws -> T {
    let reader = YAMLReader(file: "test.yaml")
    return try read(reader, try reader.document(text))
}

@Test func clientSettingsParse() throws {
    let settings = try parse("""
        server: vpn.example.com:51820
        server-key: \(serverKey)
        private-key-file: /etc/roam/client.key
        mode: split
        routes: [10.77.0.0/16, fd77::/48]
        tunnel: {name: roam9, mtu: 1400}
        reconnect: {debounce: 500ms}
        persistent-keepalive: 25s
        """) { try $0.client($1) }
    #expect(settings.server.description == "vpn.example.com:51820")
    #expect(settings.serverKey.base64 == serverKey)
    #expect(settings.mode == .split([Prefix("10.77.0.0/16")!, Prefix("fd77::/48")!]))
    #expect(settings.tunnel.name == "roam9" && settings.tunnel.mtu == 1400)
    #expect(settings.reconnect.debounce == .milliseconds(500))
    #expect(settings.persistentKeepalive == .seconds(25))
}

@Test func pathMTUDiscoverySearchesUpToTheTunnelsMTU() throws {
    let base = "server: a:1\nserver-key: \(serverKey)\nprivate-key-file: k"
    let settings = try parse(base + "\ntunnel: {mtu: 1400}") { try $0.client($1) }
    #expect(settings.reconnect.maxMTU == 1400 && settings.reconnect.minMTU == nil)
    // The floor follows what the tunnel carries: IPv6's minimum with IPv6 inside, 1,200 without.
    #expect(settings.reconnect.mtuFloor(ipv6: true) == 1280 && settings.reconnect.mtuFloor(ipv6: false) == 1200)
    // A tunnel below the minimum has nothing to search.
    let small = try parse(base + "\ntunnel: {mtu: 1200}") { try $0.client($1) }
    #expect(small.reconnect.maxMTU == 1200 && small.reconnect.mtuFloor(ipv6: false) == 1200)
    // An operator's minimum stands for IPv4, and never goes below IPv6's with IPv6 inside.
    let asked = try parse(base + "\nreconnect: {min-mtu: 1000}") { try $0.client($1) }
    #expect(asked.reconnect.mtuFloor(ipv6: false) == 1000 && asked.reconnect.mtuFloor(ipv6: true) == 1280)
}

@Test func persistentKeepaliveIsOffUnlessAsked() throws {
    let base = "server: a:1\nserver-key: \(serverKey)\nprivate-key-file: k"
    #expect(try parse(base) { try $0.client($1) }.persistentKeepalive == nil)
    #expect(try parse(base + "\npersistent-keepalive: 0") { try $0.client($1) }.persistentKeepalive == nil)
}

@Test(arguments: [
    ("server: vpn.example.com\nserver-key: \(serverKey)\nprivate-key-file: k", 1, "host:port"),
    ("server: a:1\nserver-key: nope\nprivate-key-file: k", 2, "public key"),
    ("server: a:1\nserver-key: \(serverKey)\nprivate-key-file: k\nmode: split", 1, "needs 'routes'"),
    ("server: a:1\nserver-key: \(serverKey)\nprivate-key-file: k\nmode: sideways", 4, "full or split"),
    ("server: a:1\nserver-key: \(serverKey)\nprivate-key-file: k\nusername: alice", 1, "password-file"),
    ("server: a:1\nserver-key: \(serverKey)\nprivate-key-file: k\ntunnel: {mtu: 20}", 4, "576...9000"),
    ("server: a:1\nserver-key: \(serverKey)\nprivate-key-file: k\ncolour: blue", 4, "unknown key 'colour'"),
    ("server-key: \(serverKey)\nprivate-key-file: k", 1, "needs 'server' (host:port) or 'servers'"),
    ("server: a:1\nserver-key: \(serverKey)\nprivate-key-file: k\npersistent-keepalive: 10ms", 4, "1s to 1h"),
    ("server: a:1\nserver-key: \(serverKey)\nprivate-key-file: k\npersistent-keepalive: often", 4, "a duration"),
    ("server: a:1\nserver-key: \(serverKey)\nprivate-key-file: k\ntunnel: {mtu: 1200}\nreconnect:\n  min-mtu: 1280", 6,
     "above the tunnel's 'mtu' (1200)"),
    ("server: a:1\nserver-key: \(serverKey)\nprivate-key-file: k\nprotocol: 4", 4, "2...3"),
    ("server: a:1\nserver-key: \(serverKey)\nprivate-key-file: k\nprotocol: 2\nprotocol-fallback: true", 5, "nothing to fall back to"),
    ("server: a:1\nserver-key: \(serverKey)\nprivate-key-file: k\nprotocol: 2\ncipher: aes-256-gcm", 5,
     "always uses chacha20-poly1305"),
    ("server: a:1\nserver-key: \(serverKey)\nprivate-key-file: k\ncipher: des", 4, "one of chacha20-poly1305, aes-256-gcm"),
])
func badClientSettingsPointAtTheLine(text: String, line: Int, message: String) {
    expectClientRefusal(text, line: line, message: message)
}

@Test func serverSettingsBuildTheUserDatabase() throws {
    let hash = try PasswordHash.create(password: "correct horse", cost: .minimum).encoded
    let settings = try parse("""
        listen-port: 51820
        private-key-file: /etc/roam/server.key
        tunnel: {addresses: [10.77.0.1/16]}
        users:
          - {name: alice, public-key: \(serverKey), addresses: [10.77.0.2]}
          - {name: bob, password-hash: "\(hash)", addresses: [10.77.0.3, "fd77::3"]}
        """) { try $0.server($1) }
    #expect(settings.listenPort == 51820)
    #expect(settings.tunnel.addresses == [Prefix("10.77.0.1/16")!])
    #expect(settings.users.peer(named: "bob") != nil)
    #expect(settings.users.peer(owning: IPAddress("10.77.0.2")!) != nil)
    #expect((1...16).contains(settings.workers), "one worker per core by default")
}

@Test func serverWorkersAreOneToSixtyFour() throws {
    let base = "listen-port: 1\nprivate-key-file: k\ntunnel: {addresses: [10.77.0.1/16]}\nusers:\n  - {name: a, public-key: \(serverKey), addresses: [10.77.0.2]}\n"
    #expect(try parse(base + "workers: 3") { try $0.server($1) }.workers == 3)
    for bad in ["0", "65", "many"] {
        #expect { try parse(base + "workers: \(bad)") { try $0.server($1) } } throws: { error in
            (error as? ConfigError)?.line == 6
        }
    }
}

@Test func serverSettingsRefuseUsersWithoutCredentialsOrWithClashingAddresses() {
    #expect {
        try parse("listen-port: 1\nprivate-key-file: k\ntunnel: {addresses: [10.77.0.1/16]}\nusers:\n  - {name: eve, addresses: [10.77.0.9]}") { try $0.server($1) }
    } throws: { error in
        (error as? ConfigError).map { $0.line == 5 && $0.message.contains("needs 'public-key' or 'password-hash'") } ?? false
    }
    #expect {
        try parse("""
            listen-port: 1
            private-key-file: k
            tunnel: {addresses: [10.77.0.1/16]}
            users:
              - {name: a, public-key: \(serverKey), addresses: [10.77.0.2]}
              - {name: b, public-key: \(serverKey), addresses: [10.77.0.2]}
            """) { try $0.server($1) }
    } throws: { error in
        (error as? ConfigError)?.line == 5
    }
}

@Test func secretFilesMustBeOwnerOnly() throws {
    let path = FileManager.default.temporaryDirectory.appendingPathComponent("roam-secret-\(getpid())").path
    defer { unlink(path) }
    let key = try PrivateKey.generate()
    try (key.revealBase64() + "\n").write(toFile: path, atomically: false, encoding: .utf8)
    chmod(path, 0o644)
    #expect { try loadPrivateKey(path) } throws: { error in "\(error)".contains("must be 0600") }
    chmod(path, 0o600)
    #expect(try loadPrivateKey(path).publicKey == key.publicKey)
    try "not a key".write(toFile: path, atomically: false, encoding: .utf8)
    chmod(path, 0o600)
    #expect { try loadPrivateKey(path) } throws: { error in "\(error)".contains("not a private key") }
}

@Test func serversAreTriedByPriorityThenAsListed() throws {
    let other = "ZGAbODgn8RHe+xKVbjJ7T4zPxKvWKlUqT5M5RL0cZkw="
    let settings = try parse("""
        server-key: \(serverKey)
        private-key-file: k
        servers:
          - {address: fra.example.com:51820, name: fra}
          - {address: 203.0.113.9:51820, key: \(other), priority: 10}
          - {address: "[2001:db8::9]:443", name: v6}
        """) { try $0.client($1) }
    #expect(settings.servers.map(\.name) == ["203.0.113.9", "fra", "v6"])
    #expect(settings.servers[0].key.base64 == other && settings.servers[1].key.base64 == serverKey)
    #expect(settings.server.description == "203.0.113.9:51820")
}

/// `allow-lan` is a bool, or a list of ranges that count as local besides the private ones
/// (and turn allow-lan on); the lockdown the client loads carries them.
@Test func allowLANTakesAListOfRangesThatCountAsLocal() throws {
    let base = "server: a:1\nserver-key: \(serverKey)\nprivate-key-file: k\n"
    let off = try parse(base) { try $0.client($1) }
    #expect(!off.allowLAN && off.lanRanges.isEmpty)
    let on = try parse(base + "allow-lan: true") { try $0.client($1) }
    #expect(on.allowLAN && on.lanRanges.isEmpty)
    let flow = try parse(base + "allow-lan: [100.64.0.0/10, 192.168.50.0/24]") { try $0.client($1) }
    #expect(flow.allowLAN && flow.lanRanges == [Prefix("100.64.0.0/10")!, Prefix("192.168.50.0/24")!])
    #expect(flow.lockdownPolicy.allowLAN && flow.lockdownPolicy.lanRanges == flow.lanRanges)
    let block = try parse(base + "allow-lan:\n  - 100.72.0.0/16\n  - fd12:3456::/48\n  - fe80::/64\n  - 169.254.0.0/16") { try $0.client($1) }
    #expect(block.allowLAN && block.lanRanges.map(\.description) == ["100.72.0.0/16", "fd12:3456::/48", "fe80::/64", "169.254.0.0/16"])
}

/// `never-local`: subnets no network may claim, full mode only; the routing and the lockdown
/// the client loads carry them.
@Test func neverLocalListsTheSubnetsNoNetworkMayClaim() throws {
    let base = "server: a:1\nserver-key: \(serverKey)\nprivate-key-file: k\n"
    let settings = try parse(base + "never-local: [10.0.0.0/8, fd00:c0::/48]") { try $0.client($1) }
    guard case .full(let full) = settings.mode else { Issue.record("not full mode"); return }
    #expect(full.neverLocal.map(\.description) == ["10.0.0.0/8", "fd00:c0::/48"])
    #expect(settings.lockdownPolicy.neverLocal == full.neverLocal)
    #expect(settings.mode.plan(linkIndex: 7).rules.contains(RoutingRule(family: .v4, priority: 32761, table: 51820, destination: Prefix("10.0.0.0/8")!)))
    expectClientRefusal(base + "never-local: [10.0.0.1/8]", line: 4, message: "bits set past /8: did you mean 10.0.0.0/8?")
    expectClientRefusal(base + "never-local: [0.0.0.0/0]", line: 4, message: "which is not a subnet")
    expectClientRefusal(base + "never-local: [intranet]", line: 4, message: "which is not a subnet")
    expectClientRefusal(base + "mode: split\nroutes: [10.77.0.0/16]\nnever-local: [10.0.0.0/8]", line: 6, message: "'never-local' is for mode: full")
}

/// A listed range outside the private, shared and link-local ones, or one that is not a range,
/// is refused at its own line, in both list forms; split mode refuses allow-lan in every form.
@Test(arguments: [
    ("allow-lan: [100.64.0.0/10, 8.8.8.0/24]", 4, "lists 8.8.8.0/24, which is not a private, shared or link-local range; only ranges inside 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, 100.64.0.0/10, 169.254.0.0/16, fc00::/7, fe80::/10 can count as local"),
    ("allow-lan:\n  - 192.168.50.0/24\n  - 0.0.0.0/0", 6, "lists 0.0.0.0/0, which is not a private, shared or link-local range"),
    ("allow-lan:\n  - 2001:db8::/32", 5, "lists 2001:db8::/32, which is not a private"),
    ("allow-lan: [192.0.2.0/24]", 4, "lists 192.0.2.0/24, which is not a private"),
    ("allow-lan: [100.0.0.0/8]", 4, "lists 100.0.0.0/8, which is not a private"),
    ("allow-lan: [fc00::/6]", 4, "lists fc00::/6, which is not a private"),
    ("allow-lan:\n  - 100.64.0.0/33", 5, "lists \"100.64.0.0/33\", which is not a range: write address/length, e.g. 100.64.0.0/10"),
    ("allow-lan: [lan]", 4, "lists \"lan\", which is not a range"),
    ("allow-lan: [100.64.0.1]", 4, "lists \"100.64.0.1\", which is not a range"),
    ("allow-lan: [100.64.0.1/10]", 4, "bits set past /10: did you mean 100.64.0.0/10?"),
    ("allow-lan: [[10.0.0.0/8]]", 4, "expected a single value"),
    ("allow-lan: []", 4, "lists no range: write 'allow-lan: true'"),
    ("allow-lan: maybe", 4, "expected true or false"),
    ("mode: split\nroutes: [10.77.0.0/16]\nallow-lan: [100.64.0.0/10]", 6, "'allow-lan' is for mode: full"),
    ("mode: split\nroutes: [10.77.0.0/16]\nallow-lan: true", 6, "'allow-lan' is for mode: full"),
])
func badLANRangesPointAtTheirLine(text: String, line: Int, message: String) {
    expectClientRefusal("server: a:1\nserver-key: \(serverKey)\nprivate-key-file: k\n" + text, line: line, message: message)
}

/// Applications kept outside the tunnel: only `allow` or `off`, and only where the tunnel and the
/// lockdown would otherwise hold them.
@Test(arguments: [
    ("exclusion: yes", 4, "'exclusion' is allow or off (the default), got \"yes\""),
    ("exclusion: [allow]", 4, "expected a single value"),
    ("mode: split\nroutes: [10.77.0.0/16]\nexclusion: allow", 6, "'exclusion' is for mode: full with the lockdown on"),
    ("lockdown: false\nexclusion: allow", 5, "'exclusion' is for mode: full with the lockdown on"),
])
func badExclusionsPointAtTheirLine(text: String, line: Int, message: String) {
    expectClientRefusal("server: a:1\nserver-key: \(serverKey)\nprivate-key-file: k\n" + text, line: line, message: message)
}

/// Who besides root turns the tunnel on and off: the `roam` group unless `operators: root`.
@Test func operatorsAreTheGroupUnlessRootAlone() throws {
    let base = "server: a:1\nserver-key: \(serverKey)\nprivate-key-file: k\n"
    #expect(try parse(base) { try $0.client($1) }.groupOperates)
    #expect(try parse(base + "operators: group") { try $0.client($1) }.groupOperates)
    #expect(try !parse(base + "operators: root") { try $0.client($1) }.groupOperates)
    expectClientRefusal(base + "operators: everyone", line: 4, message: "'operators' is group (the default")
}

@Test(arguments: [
    ("private-key-file: k\nserver-key: \(serverKey)\nservers:\n  - {address: a:1}\n  - {address: A:1}", 5, "lists A:1 twice (first on line 4)"),
    ("private-key-file: k\nserver-key: \(serverKey)\nservers:\n  - {address: a:1, name: x}\n  - {address: b:1, name: x}", 5, "two servers x (first on line 4)"),
    ("private-key-file: k\nserver-key: \(serverKey)\nservers: []", 3, "lists no server"),
    ("private-key-file: k\nservers:\n  - {address: a:1}", 3, "needs 'key'"),
    ("private-key-file: k\nserver-key: \(serverKey)\nserver: a:1\nservers:\n  - {address: b:1}", 3, "cannot both be set"),
    ("private-key-file: k\nserver-key: \(serverKey)\nservers:\n  - {address: nowhere}", 4, "host:port"),
    ("private-key-file: k\nserver: a:1", 1, "needs 'server-key'"),
])
func badServerListsPointAtTheLine(text: String, line: Int, message: String) {
    expectClientRefusal(text, line: line, message: message)
}

/// A client configuration refused on `line` with words that contain `message`.
private func expectClientRefusal(_ text: String, line: Int, message: String,
                                 sourceLocation: SourceLocation = #_sourceLocation) {
    #expect(sourceLocation: sourceLocation) {
        try parse(text) { try $0.client($1) }
    } throws: { error in
        guard let error = error as? ConfigError else { return false }
        return error.line == line && error.message.contains(message)
    }
}

@Test func thePortalSectionSetsTheCheckAndItsTiming() throws {
    let base = "server: a:1\nserver-key: \(serverKey)\nprivate-key-file: k\n"
    let standard = try parse(base) { try $0.client($1) }
    #expect(standard.portal == PortalCheck.standard && standard.reconnect.portalCheck)
    let settings = try parse(base + """
        portal:
          url: http://connectivitycheck.gstatic.com/generate_204
          expect: 204
          recheck: 1m
          recheck-cap: 20m
          window: 2m
        """) { try $0.client($1) }
    #expect(settings.portal.url.host == "connectivitycheck.gstatic.com" && settings.portal.expect == .status(204))
    #expect(settings.reconnect.portalRecheck == .seconds(60) && settings.reconnect.portalRecheckCap == .seconds(1200))
    #expect(settings.reconnect.portalWindow == .seconds(120))
    #expect(try parse(base + "portal: {check: off}") { try $0.client($1) }.reconnect.portalCheck == false)
}

@Test(arguments: [
    ("portal: {url: \"https://example.com/\", expect: 204}", 4, "plain http:// URL"),
    ("portal: {url: \"http://example.com/x\"}", 4, "'url' needs 'expect'"),
    ("portal: {expect: 302}", 4, "200 to 299"),
    ("portal:\n  recheck: 5m\n  recheck-cap: 1m", 6, "'recheck-cap' is shorter than 'recheck'"),
    ("portal: {window: 2h}", 4, "at most 1h"),
    ("portal: {check: maybe}", 4, "true or false"),
    ("portal: {login: x}", 4, "login"),
])
func badPortalSettingsPointAtTheLine(text: String, line: Int, message: String) {
    expectClientRefusal("server: a:1\nserver-key: \(serverKey)\nprivate-key-file: k\n" + text, line: line, message: message)
}

@Test func theUserGuidesOnDemandExampleLoadsAndItsProbeIsLetThrough() throws {
    let base = "server: a:1\nserver-key: \(serverKey)\nprivate-key-file: k\n"
    let settings = try parse(base + """
        on-demand:
          - name: office
            match:
              gateway-mac: "52:54:00:0f:f1:ce"
              subnet: 10.20.0.0/24
              probe:
                url: "https://roam-probe.corp.example/trusted"
                expect: 204
                pin: "sha256//YLh1dUR9y6Kja30RrAn7JKnbQG/uEtLMkBgFF2Fuihg="
            action: disconnect
            lockdown: lift
          - name: lab
            match: {interface-kind: ethernet, subnet: 10.20.0.0/16}
            action: disconnect
          - name: intranet
            match: {dns-domain: corp.example, probe: {url: "http://intranet.corp.example:8080/health", expect: 204}}
            action: disconnect
          - name: home
            match: {ssid: [Home, "Home 5G"]}
            action: ignore
          - action: connect
        """) { try $0.client($1) }
    #expect(settings.onDemand.rules.map(\.name) == ["office", "lab", "intranet", "home", "rule 5"])
    #expect(settings.onDemand.rules[0].line == 5)
    // The check's port and the probe's: the lockdown lets the agent's own marked sockets reach both.
    #expect(settings.checkPorts == [80, 443, 8080])
    var off = settings
    off.reconnect.portalCheck = false
    #expect(off.checkPorts == [443, 8080])
}

@Test func aContradictingRuleSetIsRefusedAtItsLine() {
    expectClientRefusal("server: a:1\nserver-key: \(serverKey)\nprivate-key-file: k\n"
        + "on-demand:\n  - match: {interface-kind: wifi}\n    action: connect\n  - match: {interface-kind: wifi, ssid: Office}\n    action: disconnect\n",
        line: 7, message: "can never match")
}

/// Version 3 by default with the cipher negotiated; an operator may ask for 2, for a fallback,
/// or pin a cipher; a gateway serves both versions unless told otherwise.
@Test func protocolVersionsAndCiphersAreSettings() throws {
    let base = "server: a:1\nserver-key: \(serverKey)\nprivate-key-file: k"
    let plain = try parse(base) { try $0.client($1) }
    #expect(plain.protocolVersion == 3 && !plain.protocolFallback && plain.cipher == nil)
    let pinned = try parse(base + "\nprotocol: 3\nprotocol-fallback: true\ncipher: aes-256-gcm") { try $0.client($1) }
    #expect(pinned.protocolVersion == 3 && pinned.protocolFallback && pinned.cipher == .aes256GCM)
    #expect(try parse(base + "\nprotocol: 2") { try $0.client($1) }.protocolVersion == 2)

    let server = "listen-port: 1\nprivate-key-file: k\ntunnel: {addresses: [10.77.0.1/16]}\nusers:\n  - {name: a, public-key: \(serverKey), addresses: [10.77.0.2]}\n"
    #expect(try parse(server) { try $0.server($1) }.protocols == ProtocolPolicy(versions: [2, 3]))
    let closed = try parse(server + "allow-versions: [3]\ncipher: chacha20-poly1305") { try $0.server($1) }
    #expect(closed.protocols == ProtocolPolicy(versions: [3], cipher: .chacha20Poly1305))
    for (bad, line, message) in [("allow-versions: [1]", 6, "2...3"), ("allow-versions: []", 6, "2, 3 or both"),
                                 ("allow-versions: [2]\ncipher: aes-256-gcm", 7, "closes"), ("cipher: rot13", 6, "one of chacha20-poly1305")] {
        #expect { try parse(server + bad) { try $0.server($1) } } throws: { error in
            (error as? ConfigError).map { $0.line == line && $0.message.contains(message) } ?? false
        }
    }
}

/// `users-from`: a URL alone or a mapping; never with `users`, never with a password in the URL.
@Test func serverUsersComeFromAFileOrFromTheDirectoryNotBoth() throws {
    let base = "listen-port: 51820\nprivate-key-file: /etc/roam/server.key\ntunnel: {addresses: [10.77.0.1/16]}\n"
    let short = try parse(base + "users-from: postgresql://roam@db.example/roam?sslmode=verify-full") { try $0.server($1) }
    #expect(short.usersFrom?.url == "postgresql://roam@db.example/roam?sslmode=verify-full")
    #expect(short.usersFrom?.snapshot == UserSource.defaultSnapshot && short.usersFrom?.passwordFile == nil)
    #expect(short.users.users.isEmpty)
    let long = try parse(base + """
        users-from:
          url: "postgres://gateway@10.0.0.5:5432/roam"
          password-file: /etc/roam/db.pass
          snapshot: /var/lib/roam/fleet.snapshot
          gateway: fra1
        """) { try $0.server($1) }
    #expect(long.usersFrom == UserSource(url: "postgres://gateway@10.0.0.5:5432/roam", passwordFile: "/etc/roam/db.pass",
                                         snapshot: "/var/lib/roam/fleet.snapshot", gateway: "fra1"))
    let refusals: [(String, Int, String)] = [
        ("users-from: postgresql://roam:sesame@db/roam", 4, "holds a password"),
        ("users-from: postgresql://db/roam?sslmode=require&password=sesame", 4, "holds a password"),
        ("users-from: mysql://db/roam", 4, "is a PostgreSQL URL"),
        ("users-from: {url: postgresql://db/roam, snapshot: users.snapshot}", 4, "absolute path"),
        ("users-from: {url: postgresql://db/roam, gateway: two words}", 4, "one word"),
        ("users-from: postgresql://db/roam\nusers: []", 4, "both give the users"),
        ("dns: {servers: [10.77.0.1]}", 1, "missing 'users' (the list) or 'users-from'"),
    ]
    for (text, line, words) in refusals {
        #expect { try parse(base + text) { try $0.server($1) } } throws: { error in
            (error as? ConfigError).map { $0.line == line && $0.message.contains(words) } ?? false
        }
    }
}

@Test func theStreamTransportIsOffUnlessTCPIsSet() throws {
    let client = "server: vpn.example.net:51820\nserver-key: \(serverKey)\nprivate-key-file: k\n"
    let plain = try parse(client) { try $0.client($1) }
    #expect(plain.stream == nil && plain.lockdownPolicy.streamPort == nil && plain.reconnect.stream == nil)
    let short = try parse(client + "tcp: 8443") { try $0.client($1) }
    #expect(short.stream?.port == 8443 && short.stream?.proxy == nil)
    #expect(short.reconnect.stream == Config.StreamPolicy(), "the core races the stream with its default timings")
    let timed = try parse(client + "tcp: 443\nreconnect: {stream: {race-delay: 500ms}}") { try $0.client($1) }
    #expect(timed.reconnect.stream?.raceDelay == .milliseconds(500))
    #expect(short.lockdownPolicy.streamPort == 8443 && short.lockdownPolicy.proxy == nil)
    let full = try parse(client + """
        tcp:
          name: www.example.net
          proxy: {address: 192.0.2.8:3128, user: alice, password-file: /etc/roam/proxy.password}
        """) { try $0.client($1) }
    #expect(full.stream?.port == 443 && full.stream?.serverName == "www.example.net")
    #expect(full.stream?.proxy == ProxySettings(endpoint: Endpoint("192.0.2.8:3128")!, user: "alice",
                                                passwordFile: "/etc/roam/proxy.password"))
    #expect(full.stream?.proxy?.address == SocketAddress(IPAddress("192.0.2.8")!, port: 3128))
    #expect(full.lockdownPolicy.proxy == .init(addresses: [IPAddress("192.0.2.8")!], port: 3128))
    // A proxy named by host: no address, and the lockdown opens to none until a network's look-up gives one.
    let named = try parse(client + "tcp: {proxy: proxy.corp.example:3128}") { try $0.client($1) }
    #expect(named.stream?.proxy?.endpoint.host == "proxy.corp.example" && named.stream?.proxy?.port == 3128)
    #expect(named.stream?.proxy?.address == nil)
    #expect(named.lockdownPolicy.proxy == .init(addresses: [], port: 3128))

    let server = "listen-port: 51820\nprivate-key-file: k\ntunnel: {addresses: [10.77.0.1/16]}\nusers:\n  - {name: a, public-key: \(serverKey), addresses: [10.77.0.2]}\n"
    #expect(try parse(server) { try $0.server($1) }.stream == nil)
    let gateway = try parse(server + "tcp: {name: vpn.example.net, certificate: /etc/roam/tls.pem, certificate-key: /etc/roam/tls.key}") {
        try $0.server($1)
    }
    #expect(gateway.stream?.port == 443 && gateway.stream?.name == "vpn.example.net")
    #expect(gateway.stream?.certificate?.chain == "/etc/roam/tls.pem" && gateway.stream?.certificate?.key == "/etc/roam/tls.key")
    #expect(gateway.stream?.addresses == nil, "every address unless said")
    let bound = try parse(server + "tcp: {port: 8443, addresses: [198.51.100.7, \"2001:db8::7\"]}") { try $0.server($1) }
    #expect(bound.stream?.addresses == [IPAddress("198.51.100.7")!, IPAddress("2001:db8::7")!])
    let one = try parse(server + "tcp: {addresses: 198.51.100.7}") { try $0.server($1) }
    #expect(one.stream?.addresses == [IPAddress("198.51.100.7")!])
    for (text, message) in [("tcp: {addresses: [198.51.100.7, 198.51.100.7]}", "twice"), ("tcp: {addresses: [vpn.example]}", "address"),
                            ("tcp: {addresses: []}", "empty")] {
        do {
            _ = try parse(server + text) { try $0.server($1) }
            Issue.record("\(text) was taken")
        } catch {
            #expect("\(error)".contains(message), "\(text): \(error)")
        }
    }
}

@Test(arguments: [
    ("tcp: {proxy: proxy.example}", 4, "a host name or an IP address, and a port"),
    ("tcp: {proxy: \"proxy_1.example:3128\"}", 4, "a host name or an IP address, and a port"),
    ("tcp: {proxy: 0.0.0.0:3128}", 4, "a host name or an IP address, and a port"),
    ("tcp: {proxy: \"127.1:3128\"}", 4, "a host name or an IP address, and a port"),
    ("tcp: {proxy: 0x7f000001:3128}", 4, "a host name or an IP address, and a port"),
    ("tcp: {proxy: {address: 192.0.2.8:3128, user: alice}}", 4, "needs 'password-file'"),
    ("tcp: {proxy: {address: 192.0.2.8:3128, password-file: /p}}", 4, "needs 'user'"),
    ("tcp: {name: \"a b\"}", 4, "a host name"),
    ("tcp: 0", 4, "1...65535"),
    ("reconnect: {stream: true}", 4, "needs 'tcp'"),
])
func badStreamSettingsPointAtTheLine(text: String, line: Int, message: String) {
    expectClientRefusal("server: a:1\nserver-key: \(serverKey)\nprivate-key-file: k\n" + text, line: line, message: message)
}
