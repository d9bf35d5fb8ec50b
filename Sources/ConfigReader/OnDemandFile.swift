import Topology
public import Reconnector
import Basics

extension YAMLReader {
    /// Reads an `on-demand:` list (the client's configuration, a scenario's `config`):
    /// ```
    /// on-demand:
    ///   - name: office
    ///     match:
    ///       gateway-mac: "52:54:00:12:34:56"
    ///       probe: {url: "https://probe.corp.example/roam", expect: 204,
    ///               pin: "sha256//47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU="}
    ///     action: disconnect
    ///     lockdown: lift
    ///   - match: {interface-kind: wifi}
    ///     action: connect
    /// ```
    /// A value out of place, a rule that contradicts the rules before it (it could never
    /// match), and a lift without proof (no pinned probe) are line-numbered errors.
    public func onDemandRules(_ node: Node) throws(ConfigError) -> OnDemandRules {
        var rules: [OnDemandRule] = []
        for (i, item) in try list(node).enumerated() {
            let f = try fields(item, "an 'on-demand' rule", allowed: ["name", "match", "action", "lockdown"])
            let name = try f.optional("name").map { n throws(ConfigError) in
                let text = try string(n)
                guard !text.isEmpty, text.count <= 64, text.allSatisfy({ $0.isLetter || $0.isNumber || "-_. ".contains($0) })
                else { throw fail(n, "'name' is up to 64 letters, digits, spaces, '-', '_' or '.', got \"\(text)\"") }
                return text
            } ?? "rule \(i + 1)"
            let actionNode = try f.required("action")
            let actionText = try string(actionNode)
            guard let action = OnDemandAction(rawValue: actionText) else {
                throw fail(actionNode, "'action' is connect, disconnect or ignore, got \"\(actionText)\"")
            }
            let match = try f.optional("match").map { n throws(ConfigError) in try onDemandMatch(n) } ?? OnDemandRule.Match()
            var lifts = false
            if let n = f.optional("lockdown") {
                guard try string(n) == "lift" else { throw fail(n, "'lockdown' can only be 'lift' (the lockdown stays otherwise)") }
                guard action == .disconnect else {
                    throw fail(n, "'lockdown: lift' goes with 'action: disconnect' only: a tunnel that is up keeps its lockdown")
                }
                guard match.isProven else { throw fail(n, Self.liftNeedsProof) }
                guard match.probe?.direct != true || !match.subnets.isEmpty else { throw fail(n, Self.liftNeedsSubnet) }
                lifts = true
            }
            rules.append(OnDemandRule(name: name, line: item.line, match: match, action: action, liftsLockdown: lifts))
        }
        var seen: [String: Int] = [:]
        for rule in rules {
            if let line = seen[rule.name] {
                throw ConfigError(file: file, line: rule.line, message: "two rules are named '\(rule.name)' (the other at line \(line))")
            }
            seen[rule.name] = rule.line
        }
        let result = OnDemandRules(rules)
        if let conflict = result.conflicts.first {
            throw ConfigError(file: file, line: conflict.line, message: conflict.message)
        }
        return result
    }

    /// Why a lift without a pinned probe is refused.
    static let liftNeedsProof = "'lockdown: lift' needs proof the network cannot forge: a 'probe' with an https:// url "
        + "and the 'pin' of its server's key (a gateway-mac, ssid, subnet or dns-domain is whatever the network "
        + "says it is, and any network can say the office's)"

    /// Why a lift whose probe's server must see the laptop itself needs the network's subnet too.
    static let liftNeedsSubnet = "'lockdown: lift' needs the trusted network's 'subnet' beside its probe: the probe's server "
        + "sees the laptop's own address, and only an address in the network's own subnet has the network's answers come "
        + "back to this laptop, not to whoever relays its packets there ('direct: false' in the probe accepts any relay)"

    private func onDemandMatch(_ node: Node) throws(ConfigError) -> OnDemandRule.Match {
        let f = try fields(node, "'match'", allowed: ["interface-kind", "interface", "ssid", "gateway-mac", "subnet",
                                                      "dns-domain", "probe"])
        var m = OnDemandRule.Match()
        /// A scalar or a list of them, none empty.
        func values<T>(_ key: String, _ read: (Node) throws(ConfigError) -> T) throws(ConfigError) -> [T] {
            guard let n = f.optional(key) else { return [] }
            let items = try oneOrMore(n)
            guard !items.isEmpty else { throw fail(n, "'\(key)' lists no value") }
            var out: [T] = []
            for item in items { out.append(try read(item)) }
            return out
        }
        m.interfaceKinds = try values("interface-kind") { n throws(ConfigError) in
            let text = try string(n)
            let kinds: [LinkKind] = [.wifi, .ethernet, .wwan, .virtual, .other]
            guard let kind = LinkKind(rawValue: text), kinds.contains(kind) else {
                throw fail(n, "'interface-kind' is \(kinds.map(\.rawValue).joined(separator: ", ")), got \"\(text)\"")
            }
            return kind
        }
        m.interfaces = try values("interface") { n throws(ConfigError) in
            let text = try string(n)
            let name = text.hasSuffix("*") ? text.dropLast() : Substring(text)
            guard !name.isEmpty || text == "*", name.utf8.count < 16, !name.contains("*"), !name.contains("/"),
                  name.allSatisfy({ !$0.isWhitespace })
            else { throw fail(n, "'interface' is an interface name (or a prefix and '*'), got \"\(text)\"") }
            return text
        }
        m.ssids = try values("ssid") { n throws(ConfigError) in
            let text = try string(n)
            // As nl80211 names it: a byte that is not UTF-8 written \xNN.
            guard let ssid = SSID(text), !ssid.bytes.isEmpty else {
                throw fail(n, "'ssid' is 1 to 32 bytes (\\xNN for a byte that is not text), got \"\(text)\"")
            }
            return ssid.description
        }
        m.gatewayMACs = try values("gateway-mac") { n throws(ConfigError) in try gatewayMAC(n) }
        m.subnets = try values("subnet") { n throws(ConfigError) in try prefix(n).network }
        m.dnsDomains = try values("dns-domain") { n throws(ConfigError) in
            let text = try string(n)
            let labels = OnDemandRules.normalized(text).split(separator: ".", omittingEmptySubsequences: false)
            guard !labels.isEmpty, text.utf8.count <= 253,
                  labels.allSatisfy({ (1...63).contains($0.utf8.count) && $0.allSatisfy { $0.isLetter || $0.isNumber || $0 == "-" || $0 == "_" } })
            else { throw fail(n, "'dns-domain' is a domain name like corp.example, got \"\(text)\"") }
            return OnDemandRules.normalized(text)
        }
        if let n = f.optional("probe") {
            let p = try fields(n, "'probe'", allowed: ["url", "expect", "pin", "direct"])
            let urlNode = try p.required("url")
            let url = try string(urlNode)
            let https = url.hasPrefix("https://")
            guard https || url.hasPrefix("http://"), url.count > (https ? 8 : 7), url.count <= 2048,
                  url.allSatisfy({ $0.isASCII && !$0.isWhitespace })
            else { throw fail(urlNode, "'probe' url is an http:// URL, or an https:// one with a 'pin', got \"\(url)\"") }
            var pin: KeyPin?
            if let pinNode = p.optional("pin") {
                let text = try string(pinNode)
                guard let key = KeyPin(text) else {
                    throw fail(pinNode, "'pin' is sha256// and the base64 of the SHA-256 of the server's public key "
                        + "(its DER SubjectPublicKeyInfo, 32 bytes: 44 characters ending in '='), got \"\(text)\"")
                }
                guard https else {
                    throw fail(urlNode, "a 'pin' needs an https:// url: a key is only shown over TLS, got \"\(url)\"")
                }
                pin = key
            } else if https {
                throw fail(urlNode, "an https:// probe needs the 'pin' of its server's key (sha256//...): the probe "
                    + "checks no certificate authority, only the key")
            }
            var direct = true
            if let n = p.optional("direct") {
                guard pin != nil else { throw fail(n, "'direct' is for a pinned https:// probe: only its server can say where it saw the laptop") }
                direct = try bool(n)
            }
            m.probe = OnDemandRule.Probe(url: url, expect: try httpExpectation(p.required("expect")), pin: pin, direct: direct)
        }
        return m
    }

    /// An `expect`: a status code from 200 to 299, or the text the body starts with (up to 512
    /// characters).
    public func httpExpectation(_ node: Node) throws(ConfigError) -> HTTPExpectation {
        let text = try string(node)
        if let code = Int(text) {
            guard (200...299).contains(code) else { throw fail(node, "'expect' as a status code is 200 to 299, got \(code)") }
            return .status(code)
        }
        guard !text.isEmpty, text.count <= 512 else { throw fail(node, "'expect' is a status code or up to 512 characters of body") }
        return .body(text)
    }

    /// A gateway's hardware address (Ethernet's six bytes), in the lowercase form the neighbour
    /// table's is compared in.
    public func gatewayMAC(_ node: Node) throws(ConfigError) -> String {
        let text = try string(node)
        guard let mac = HardwareAddress(text), mac.bytes.count == 6 else {
            throw fail(node, "'gateway-mac' is a hardware address like 52:54:00:12:34:56, got \"\(text)\"")
        }
        return mac.description
    }
}
