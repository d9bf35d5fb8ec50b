public import Topology
public import Basics

/// What an on-demand rule does on the networks it matches.
public enum OnDemandAction: String, Equatable, Sendable, CaseIterable {
    /// The tunnel comes up (the always-on default).
    case connect
    /// The session ends with a goodbye and nothing is tried while the network stays; the
    /// lockdown stays too, unless the rule lifts it.
    case disconnect
    /// Keep what is: a session stays, a disconnect stays.
    case ignore
}

/// One rule of the client's `on-demand` list: the first whose every criterion holds for the
/// network the tunnel's path is on decides.
public struct OnDemandRule: Equatable, Sendable {
    /// The name operators read in the log: the rule's `name`, else "rule N".
    public var name: String
    /// Where it is written, for errors and the log.
    public var line: Int
    public var match: Match
    public var action: OnDemandAction
    /// With `disconnect`: the lockdown, the tunnel's routes and its resolvers step aside while
    /// the network stays, so the machine talks to it directly. Only ever with proof: a rule
    /// whose match has no pinned probe (`Match.isProven`) keeps the lockdown whatever this says.
    public var liftsLockdown: Bool

    public init(name: String, line: Int = 0, match: Match = Match(), action: OnDemandAction, liftsLockdown: Bool = false) {
        self.name = name
        self.line = line
        self.match = match
        self.action = action
        self.liftsLockdown = liftsLockdown
    }

    /// Criteria that must all hold; each holds when any of its values does. No criterion at all
    /// matches every network.
    public struct Match: Equatable, Sendable {
        public var interfaceKinds: [LinkKind] = []
        /// Interface names; a trailing `*` matches any name that starts with what precedes it.
        public var interfaces: [String] = []
        /// Wi-Fi network names, as nl80211 reports them (see `NetworkFacts.ssid`), matched byte for byte.
        public var ssids: [String] = []
        /// The default gateway's hardware address, lowercase `aa:bb:cc:dd:ee:ff`.
        public var gatewayMACs: [String] = []
        /// Subnets one of the uplink's addresses lies in.
        public var subnets: [Prefix] = []
        /// DNS search domains the network gives; `corp.example` also matches `eu.corp.example`.
        public var dnsDomains: [String] = []
        /// A request over the uplink that answers as expected only on a trusted network; with a
        /// pin, over TLS to a server that must prove it holds the pinned key.
        public var probe: Probe?

        public init(interfaceKinds: [LinkKind] = [], interfaces: [String] = [], ssids: [String] = [],
                    gatewayMACs: [String] = [], subnets: [Prefix] = [], dnsDomains: [String] = [], probe: Probe? = nil) {
            self.interfaceKinds = interfaceKinds
            self.interfaces = interfaces
            self.ssids = ssids
            self.gatewayMACs = gatewayMACs
            self.subnets = subnets
            self.dnsDomains = dnsDomains
            self.probe = probe
        }

        /// No criterion: every network matches.
        public var isEmpty: Bool { self == Match() }

        /// Whether matching takes proof the network cannot forge: a probe whose server must show
        /// the pinned key. Hardware addresses, Wi-Fi names, subnets and search domains are
        /// whatever the network says they are.
        public var isProven: Bool { probe?.pin != nil }
    }

    /// A request that answers as expected only where the network is trusted.
    public struct Probe: Hashable, Sendable, CustomStringConvertible {
        /// A plain `http://` URL, or an `https://` one with a pin.
        public var url: String
        public var expect: HTTPExpectation
        /// The key the `https://` server must hold: its answer counts only over a TLS session
        /// whose certificate carries this public key.
        public var pin: KeyPin?
        /// With a pin: the server must also say, in that session, which address and port it saw
        /// the connection come from (`Roam-Seen`), and they must be the ones the laptop sent
        /// from; a network that relays the connection to the server elsewhere, or translates
        /// it, proves nothing. Off only where a NAT stands between the laptop and the server.
        public var direct: Bool

        public init(url: String, expect: HTTPExpectation, pin: KeyPin? = nil, direct: Bool = true) {
            self.url = url
            self.expect = expect
            self.pin = pin
            self.direct = direct
        }

        public var description: String { url }
    }
}

/// A server's public key, pinned: the SHA-256 of the DER SubjectPublicKeyInfo of its
/// certificate, written `sha256//` and the hash in base64 (HPKP's and curl's
/// `--pinnedpubkey` form, what `openssl x509 -pubkey | openssl pkey -pubin -outform der |
/// openssl dgst -sha256 -binary | base64` prints after `sha256//`).
public struct KeyPin: Hashable, Sendable, CustomStringConvertible {
    /// The hash's 32 bytes.
    public let hash: [UInt8]

    public init?(hash: [UInt8]) {
        guard hash.count == 32 else { return nil }
        self.hash = hash
    }

    /// From its text, `sha256//` and 44 characters of standard base64; nil for anything else.
    public init?(_ text: String) {
        guard text.startsExactly(with: "sha256//"), let bytes = Self.decode(text.utf8.dropFirst(8)) else { return nil }
        self.init(hash: bytes)
    }

    public var description: String { "sha256//" + Self.encode(hash) }

    // A codec of its own: the core imports no C library, and a pin is public (secret keys'
    // text goes through libsodium's constant-time one, in Tunnel).
    private static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)

    /// 32 bytes from their 44 characters of base64 (43 and one '='), the only way they are written.
    private static func decode(_ text: some Collection<UInt8>) -> [UInt8]? {
        let chars = Array(text)
        guard chars.count == 44, chars[43] == UInt8(ascii: "=") else { return nil }
        var bits: UInt32 = 0, count = 0
        var out: [UInt8] = []
        for c in chars[..<43] {
            guard let value = alphabet.firstIndex(of: c) else { return nil }
            bits = bits << 6 | UInt32(value)
            count += 6
            if count >= 8 {
                count -= 8
                out.append(UInt8(truncatingIfNeeded: bits >> UInt32(count)))
            }
        }
        // The last character's two spare bits are zero when the text is the bytes' own.
        guard out.count == 32, bits & 0b11 == 0 else { return nil }
        return out
    }

    private static func encode(_ bytes: [UInt8]) -> String {
        var out: [UInt8] = []
        var i = 0
        while i < bytes.count {
            let chunk = bytes[i..<min(i + 3, bytes.count)]
            var n: UInt32 = 0
            for (k, b) in chunk.enumerated() { n |= UInt32(b) << UInt32(16 - 8 * k) }
            for k in 0..<4 {
                out.append(k <= chunk.count ? alphabet[Int((n >> UInt32(18 - 6 * k)) & 63)] : UInt8(ascii: "="))
            }
            i += 3
        }
        return String(decoding: out, as: UTF8.self)
    }
}

/// What a probe's answer showed.
public enum ProbeResult: Equatable, Sendable {
    /// It answered as its rule expects. `proof`: over TLS, from a server that holds the pinned
    /// key (nil for plain HTTP, which proves nothing about who answered).
    case expected(proof: KeyProof?)
    /// Any other answer, or none; for a pinned probe also a wrong key, a failed handshake, a
    /// time-out.
    case unexpected
}

/// A TLS server showed a certificate with the pinned key, and answered over that session, on
/// one path: the network can only show it by reaching the server that holds the private key.
public struct KeyProof: Hashable, Sendable {
    public var pin: KeyPin
    /// The path the probe went over (the uplink and the address it left from).
    public var path: Path.ID
    /// Where the connection left from (its local address and port), and where the server said,
    /// inside the session, it saw it come from; nil when it did not say.
    public var local: SocketEndpoint?
    public var seen: SocketEndpoint?

    public init(pin: KeyPin, path: Path.ID, local: SocketEndpoint? = nil, seen: SocketEndpoint? = nil) {
        self.pin = pin
        self.path = path
        self.local = local
        self.seen = seen
    }

    /// The server saw the connection come from where it left: nothing between relayed it to
    /// the server from elsewhere or translated it on the way.
    public var isDirect: Bool { local != nil && seen == local }
}

/// One end of a TCP connection: an address and a port.
public struct SocketEndpoint: Hashable, Sendable, CustomStringConvertible {
    public var address: IPAddress
    public var port: UInt16

    public init(_ address: IPAddress, port: UInt16) {
        self.address = Self.unmapped(address)
        self.port = port
    }

    /// Parses `address:port` as web servers write a peer: `192.0.2.5:41234`,
    /// `[2001:db8::5]:41234`, or IPv6 without brackets (`2001:db8::5:41234`, nginx's
    /// `$remote_addr:$remote_port`); an IPv4-mapped IPv6 address (a dual-stack listener's) is
    /// the IPv4 address it maps. Nil for anything else.
    public init?(parsing text: some StringProtocol) {
        let blank: (Character) -> Bool = { $0 == " " || $0 == "\t" }
        var text = Substring(text).drop(while: blank)
        while let last = text.last, blank(last) { text = text.dropLast() }
        let host: Substring
        let portText: Substring
        if text.hasPrefix("[") {
            guard let close = text.firstIndex(of: "]"), text[text.index(after: close)...].hasPrefix(":") else { return nil }
            host = text[text.index(after: text.startIndex)..<close]
            portText = text[text.index(close, offsetBy: 2)...]
        } else {
            guard let colon = text.lastIndex(of: ":") else { return nil }
            host = text[..<colon]
            portText = text[text.index(after: colon)...]
        }
        guard !host.isEmpty, host.allSatisfy({ $0.isHexDigit || $0 == "." || $0 == ":" }), let address = IPAddress(String(host)), !portText.isEmpty, portText.allSatisfy({ $0.isASCII && $0.isNumber }), let port = UInt16(portText), port > 0 else { return nil }
        self.init(address, port: port)
    }

    /// `::ffff:a.b.c.d` as `a.b.c.d`.
    static func unmapped(_ address: IPAddress) -> IPAddress {
        if case .v6(0, let low) = address, low >> 32 == 0xffff { return .v4(UInt32(truncatingIfNeeded: low)) }
        return address
    }

    public var description: String { address.family == .v6 ? "[\(address)]:\(port)" : "\(address):\(port)" }
}

/// What a plain HTTP answer must be to count as expected: the connectivity check's, and an
/// on-demand probe's.
public enum HTTPExpectation: Hashable, Sendable {
    /// This status code, any body.
    case status(Int)
    /// Status 200 and a body that starts with this text.
    case body(String)
}

/// A fact about a network that takes a lookup: known, known to be missing, or still looked up.
public enum Fact<Value: Equatable & Sendable>: Equatable, Sendable {
    case known(Value)
    /// Nothing to find: no Wi-Fi on a cable, no gateway in the neighbour table after a while,
    /// no search domain given.
    case absent
    /// Being looked up: a rule that needs it waits.
    case pending

    var value: Value? { if case .known(let v) = self { v } else { nil } }
}

/// What the rules can know of the network the tunnel's best path is on.
public struct NetworkFacts: Equatable, Sendable {
    public var path: Path.ID
    public var interface: String
    public var kind: LinkKind
    /// The uplink's usable addresses.
    public var addresses: [IPAddress]
    public var ssid: Fact<String>
    /// The default gateway's hardware address, lowercase.
    public var gatewayMAC: Fact<String>
    public var dnsDomains: Fact<[String]>
    /// Probes that answered; one missing is still out.
    public var probes: [OnDemandRule.Probe: ProbeResult]

    public init(path: Path, ssid: Fact<String> = .absent, gatewayMAC: Fact<String> = .absent,
                dnsDomains: Fact<[String]> = .absent, addresses: [IPAddress]? = nil,
                probes: [OnDemandRule.Probe: ProbeResult] = [:]) {
        self.path = path.id
        self.interface = path.interface
        self.kind = path.kind
        self.addresses = addresses ?? [path.source]
        self.ssid = ssid
        self.gatewayMAC = gatewayMAC
        self.dnsDomains = dnsDomains
        self.probes = probes
    }
}

/// What the rules decided for one network.
public struct OnDemandVerdict: Equatable, Sendable, CustomStringConvertible {
    public var action: OnDemandAction
    /// The rule that matched ("default" when none did: always on).
    public var rule: String
    public var liftsLockdown: Bool
    /// The path whose network it was decided for.
    public var path: Path.ID
    public var interface: String

    public init(action: OnDemandAction, rule: String, liftsLockdown: Bool = false, path: Path.ID, interface: String) {
        self.action = action
        self.rule = rule
        self.liftsLockdown = liftsLockdown
        self.path = path
        self.interface = interface
    }

    public var description: String {
        "\(rule) on \(interface): \(action.rawValue)" + (liftsLockdown ? ", lockdown lifted" : "")
    }
}

/// A fact a rule is waiting for.
public enum WantedFact: Hashable, Sendable, CustomStringConvertible {
    case ssid, gatewayMAC, dnsDomains
    case probe(OnDemandRule.Probe)

    public var description: String {
        switch self {
        case .ssid: "ssid"
        case .gatewayMAC: "gateway-mac"
        case .dnsDomains: "dns-domain"
        case .probe(let p): "probe \(p.url)"
        }
    }
}

/// The outcome of the rules for one network.
public enum OnDemandDecision: Equatable, Sendable {
    case decided(OnDemandVerdict)
    /// The first rule that may still match needs facts being looked up; the rules after it wait.
    case waiting(rule: String, for: [WantedFact], path: Path.ID)

    public var path: Path.ID {
        switch self {
        case .decided(let v): v.path
        case .waiting(_, _, let path): path
        }
    }
}

/// The client's on-demand rules, in order. Pure: the agent gathers the facts, the rules decide.
public struct OnDemandRules: Equatable, Sendable {
    public var rules: [OnDemandRule]

    public init(_ rules: [OnDemandRule] = []) { self.rules = rules }

    /// The first rule that matches `facts` decides; none matching means connect (always on).
    /// A rule that needs a fact still looked up stops the evaluation there, unless another of
    /// its criteria already fails.
    public func evaluate(_ facts: NetworkFacts) -> OnDemandDecision {
        for rule in rules {
            switch Self.matches(rule.match, facts) {
            case .no: continue
            case .pending(let wanted): return .waiting(rule: rule.name, for: wanted, path: facts.path)
            case .yes:
                // Matching a pinned probe took its proof on this path (`matches`); a rule
                // without one never lifts, however it came to say so.
                return .decided(OnDemandVerdict(action: rule.action, rule: rule.name,
                                                liftsLockdown: rule.liftsLockdown && rule.match.isProven,
                                                path: facts.path, interface: facts.interface))
            }
        }
        return .decided(OnDemandVerdict(action: .connect, rule: "default", path: facts.path, interface: facts.interface))
    }

    enum Outcome: Equatable { case yes, no, pending([WantedFact]) }

    static func matches(_ match: OnDemandRule.Match, _ facts: NetworkFacts) -> Outcome {
        var wanted: [WantedFact] = []
        func check<V>(_ wants: Bool, _ fact: Fact<V>, _ name: WantedFact, _ holds: (V) -> Bool) -> Bool {
            guard wants else { return true }
            switch fact {
            case .known(let value): return holds(value)
            case .absent: return false
            case .pending: wanted.append(name); return true
            }
        }
        if !match.interfaceKinds.isEmpty, !match.interfaceKinds.contains(facts.kind) { return .no }
        if !match.interfaces.isEmpty, !match.interfaces.contains(where: { Self.name(facts.interface, matches: $0) }) { return .no }
        if !match.subnets.isEmpty, !facts.addresses.contains(where: { a in match.subnets.contains { $0.contains(a) } }) { return .no }
        guard check(!match.ssids.isEmpty, facts.ssid, .ssid, { ssid in match.ssids.contains { $0.isExactly(ssid) } }),
              check(!match.gatewayMACs.isEmpty, facts.gatewayMAC, .gatewayMAC, { match.gatewayMACs.contains($0.lowercased()) }),
              check(!match.dnsDomains.isEmpty, facts.dnsDomains, .dnsDomains, { given in
                  given.contains { d in match.dnsDomains.contains { Self.domain(d, isWithin: $0) } }
              })
        else { return .no }
        if let probe = match.probe {
            switch facts.probes[probe] {
            case .expected(let proof)?:
                // A pinned probe holds only with its key shown over this very path, and (unless
                // the rule allows a NAT between) to a server that saw the laptop's own address.
                if let pin = probe.pin {
                    guard let proof, proof.pin == pin, proof.path == facts.path, !probe.direct || proof.isDirect else { return .no }
                }
            case .unexpected?: return .no
            case nil: wanted.append(.probe(probe))
            }
        }
        return wanted.isEmpty ? .yes : .pending(wanted)
    }

    /// `pattern` is a name, or a prefix followed by `*`.
    static func name(_ name: String, matches pattern: String) -> Bool {
        pattern.endsExactly(with: "*") ? name.startsExactly(with: pattern.dropLast()) : name.isExactly(pattern)
    }

    /// `corp.example` holds itself and `eu.corp.example`, not `notcorp.example`; ASCII case and a
    /// trailing dot do not count, and nothing else is taken as the same (compared by bytes).
    static func domain(_ domain: String, isWithin zone: String) -> Bool {
        let d = Self.normalized(domain), z = Self.normalized(zone)
        return d.isExactly(z) || d.endsExactly(with: "." + z)
    }

    public static func normalized(_ domain: String) -> String {
        let lower = domain.asciiLowercased
        return lower.endsExactly(with: ".") ? String(decoding: lower.utf8.dropLast(), as: UTF8.self) : lower
    }

    // MARK: Checks at load

    /// A rule that can never decide: an earlier one matches every network it matches, so the
    /// later one is dead (and, with another action, says the opposite of what runs).
    public struct Conflict: Equatable, Sendable {
        public var line: Int
        public var message: String
    }

    /// The rules that can never match, each with why.
    public var conflicts: [Conflict] {
        var found: [Conflict] = []
        for (i, later) in rules.enumerated() {
            guard let earlier = rules[..<i].first(where: { Self.covers($0.match, later.match) }) else { continue }
            let what = earlier.match.isEmpty ? "matches every network" : "matches every network this one does"
            let verdict = earlier.action == later.action
                ? "; remove it"
                : ", and says '\(earlier.action.rawValue)' where this one says '\(later.action.rawValue)'"
            found.append(Conflict(line: later.line,
                                  message: "\(later.name) can never match: \(earlier.name) (line \(earlier.line)) \(what)\(verdict)"))
        }
        return found
    }

    /// Whether every network `narrow` matches is matched by `wide` as well.
    static func covers(_ wide: OnDemandRule.Match, _ narrow: OnDemandRule.Match) -> Bool {
        func within<T>(_ w: [T], _ n: [T], _ holds: (T, T) -> Bool) -> Bool {
            w.isEmpty || (!n.isEmpty && n.allSatisfy { x in w.contains { holds($0, x) } })
        }
        return within(wide.interfaceKinds, narrow.interfaceKinds, ==)
            && within(wide.interfaces, narrow.interfaces) { pattern, name in
                // A pattern covers a name, or a narrower pattern.
                Self.name(name.hasSuffix("*") ? String(name.dropLast()) : name, matches: pattern)
                    && (!name.hasSuffix("*") || pattern.hasSuffix("*"))
            }
            && within(wide.ssids, narrow.ssids) { $0.isExactly($1) }
            && within(wide.gatewayMACs, narrow.gatewayMACs, ==)
            && within(wide.subnets, narrow.subnets) { $0.contains($1) }
            && within(wide.dnsDomains, narrow.dnsDomains) { w, n in Self.domain(n, isWithin: w) }
            && (wide.probe == nil || wide.probe == narrow.probe)
    }
}
