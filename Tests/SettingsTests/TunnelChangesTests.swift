import ConfigReader
import Settings
import Testing

private let key = "DOhENSqkl0bz76f4V74zWBszpV8RtmtBNnLQvt8mvwM="
private let otherKey = "ZGAbODgn8RHe+xKVbjJ7T4zPxKvWKlUqT5M5RL0cZkw="

/// For each key the client's reader knows: two files that differ in it alone (with what it
/// needs beside it), and the name a reload gives its change; nil for a key a running tunnel
/// takes without a restart.
private let oneKeyApart: [String: (String, String, String?)] = [
    "server": ("server: a.example:1\nserver-key: \(key)", "server: b.example:1\nserver-key: \(key)", "servers"),
    "server-key": ("server: a.example:1\nserver-key: \(key)", "server: a.example:1\nserver-key: \(otherKey)", "servers"),
    "servers": ("servers: [{address: a.example:1, key: \(key)}]", "servers: [{address: b.example:1, key: \(key)}]", "servers"),
    "private-key-file": ("private-key-file: /etc/roam/a.key", "private-key-file: /etc/roam/b.key", "private-key-file"),
    "username": ("username: alice\npassword-file: /p", "username: bob\npassword-file: /p", "username"),
    "password-file": ("username: alice\npassword-file: /p", "username: alice\npassword-file: /q", "password-file"),
    "tunnel": ("tunnel: {mtu: 1400}", "tunnel: {mtu: 1380}", "tunnel"),
    "mode": ("mode: full", "mode: split\nroutes: [10.0.0.0/8]", "mode"),
    "routes": ("mode: split\nroutes: [10.0.0.0/8]", "mode: split\nroutes: [10.1.0.0/16]", "mode"),
    "never-local": ("never-local: [10.0.0.0/8]", "never-local: [10.1.0.0/16]", "mode"),
    "lockdown": ("lockdown: true", "lockdown: false", "lockdown"),
    "allow-lan": ("allow-lan: true", "allow-lan: [100.64.0.0/10]", "allow-lan"),
    "dns": ("dns: {manager: auto}", "dns: {manager: \"off\"}", "dns"),
    "exclusion": ("exclusion: allow", "exclusion: \"off\"", "exclusion"),
    "tcp": ("tcp: 443", "tcp: {port: 443, proxy: 192.0.2.8:3128}", "tcp"),
    "protocol": ("protocol: 3", "protocol: 2", "protocol"),
    "protocol-fallback": ("protocol-fallback: true", "protocol-fallback: false", "protocol"),
    "cipher": ("cipher: chacha20-poly1305", "cipher: aes-256-gcm", "cipher"),
    "reconnect": ("reconnect: {debounce: 500ms}", "reconnect: {debounce: 1s}", nil),
    "persistent-keepalive": ("persistent-keepalive: 25s", "persistent-keepalive: 30s", nil),
    "portal": ("portal: {check: true}", "portal: {check: false}", nil),
    "on-demand": ("on-demand: []", "on-demand:\n  - match: {interface-kind: wifi}\n    action: connect", nil),
    "metrics-file": ("metrics-file: /var/lib/a.prom", "metrics-file: /var/lib/b.prom", nil),
    "operators": ("operators: group", "operators: root", nil),
]

/// `text` with the server and the private key a file needs, unless it names its own.
private func file(_ text: String) -> String {
    var lines = [text]
    if !text.contains("server") { lines.append("server: a.example:1\nserver-key: \(key)") }
    if !text.contains("private-key-file") { lines.append("private-key-file: /etc/roam/client.key") }
    return lines.joined(separator: "\n")
}

private func settings(_ text: String) throws -> ClientSettings {
    let reader = YAMLReader(file: "test.yaml")
    return try reader.client(try reader.document(file(text)))
}

/// Every key the reader knows either changes the tunnel (a restart, named as before) or is a
/// tunable the running tunnel takes: a key added to the reader fails here until it is placed.
@Test(arguments: YAMLReader.clientKeys)
func everyKeyIsTheTunnelsOrATunable(key: String) throws {
    let pair = try #require(oneKeyApart[key], "'\(key)': give two files one key apart, and whether a running tunnel takes it")
    let before = try settings(pair.0)
    let after = try settings(pair.1)
    #expect(before.tunnelChanges(to: after) == (pair.2.map { [$0] } ?? []), "\(key)")
    #expect(after.tunnelChanges(to: before) == (pair.2.map { [$0] } ?? []), "\(key)")
    #expect(ClientSettings.tunables.contains(key) == (pair.2 == nil), "\(key)")
    // What a reload that keeps the tunnel logs: the tunable by its key, and nothing else.
    #expect(before.tunableChanges(to: after) == (pair.2 == nil ? [key] : []), "\(key)")
}

@Test func theTunablesAreKeysTheReaderKnows() {
    #expect(ClientSettings.tunables.isSubset(of: YAMLReader.clientKeys))
}

/// The same file read again, or with its keys moved and spaced otherwise, changes nothing; a key
/// added or taken away is a change like any other.
@Test func aFileThatSaysTheSameChangesNothing() throws {
    let text = "tunnel: {name: roam1, mtu: 1400}\nlockdown: true\nreconnect: {debounce: 1s}"
    let moved = "lockdown: true\n\nreconnect:\n  debounce: 1s\ntunnel:\n  name: roam1\n  mtu: 1400"
    #expect(try settings(text).tunnelChanges(to: try settings(text)).isEmpty)
    #expect(try settings(text).tunnelChanges(to: try settings(moved)).isEmpty)
    #expect(try settings(text).tunnelChanges(to: try settings("lockdown: true\nreconnect: {debounce: 1s}")) == ["tunnel"])
    #expect(try settings("mode: full").tunnelChanges(to: try settings("cipher: aes-256-gcm\ntcp: 443")) == ["mode", "cipher", "tcp"])
}
