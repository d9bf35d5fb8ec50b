import ControlWire

extension ClientStatus {
    /// The stream transport, and what each network the agent has met showed of UDP.
    public struct Transports: Sendable {
        public var stream: Stream
        public var networks: [Network]

        public init(stream: Stream, networks: [Network]) {
            self.stream = stream
            self.networks = networks
        }

        var json: JSON { .object([("stream", stream.json), ("networks", .array(networks.map(\.json)))]) }
    }

    public struct Stream: Sendable {
        public var port: Int
        public var proxy: String?
        /// The messages the stream dropped rather than queue, while the session is on one.
        public var dropped: Int?
        /// A proxy named by host: where its name put it on each network asked.
        public var proxyAt: [ProxyAddress]?

        public init(port: Int, proxy: String?, dropped: Int? = nil, proxyAt: [ProxyAddress]? = nil) {
            self.port = port
            self.proxy = proxy
            self.dropped = dropped
            self.proxyAt = proxyAt
        }

        var json: JSON {
            var fields: [(String, JSON)] = [("port", .count(port)), ("proxy", .optional(proxy))]
            if let dropped { fields.append(("dropped", .count(dropped))) }
            if let proxyAt { fields.append(("proxy_at", .array(proxyAt.map(\.json)))) }
            return .object(fields)
        }
    }

    /// The address a proxy's name gave on a network (nil: none yet).
    public struct ProxyAddress: Sendable {
        public var interface: String
        public var gateway: String
        public var address: String?

        public init(interface: String, gateway: String, address: String?) {
            self.interface = interface
            self.gateway = gateway
            self.address = address
        }

        var json: JSON { .object([("interface", .string(interface)), ("gateway", .string(gateway)), ("address", .optional(address))]) }
    }

    /// A network met, and what it showed of UDP (`answers`, `blocked`).
    public struct Network: Sendable {
        public var interface: String
        public var gateway: String
        public var udp: String

        public init(interface: String, gateway: String, udp: String) {
            self.interface = interface
            self.gateway = gateway
            self.udp = udp
        }

        var json: JSON { .object([("interface", .string(interface)), ("gateway", .string(gateway)), ("udp", .string(udp))]) }
    }

    /// An enabled lockdown: what it blocked, by cause and in the causes' order; the interface it
    /// is open on, whose exceptions it holds, and the loads the kernel refused.
    public struct Lockdown: Sendable {
        public var blocked: [(cause: String, count: UInt64)]
        public var openOn: String?
        public var exceptionsFor: String?
        public var refusedLoads: Int

        public init(blocked: [(cause: String, count: UInt64)], openOn: String?, exceptionsFor: String?, refusedLoads: Int) {
            self.blocked = blocked
            self.openOn = openOn
            self.exceptionsFor = exceptionsFor
            self.refusedLoads = refusedLoads
        }

        /// The fields after `enabled`.
        var fields: [(String, JSON)] {
            [("blocked", .object(blocked.map { ($0.cause, .count($0.count)) })), ("open_on", .optional(openOn)),
             ("exceptions_for", .optional(exceptionsFor)), ("refused_loads", .count(refusedLoads))]
        }
    }

    /// The tunnel's resolvers: who is given them, what was applied (nil: nothing yet), and why
    /// the tunnel has none of its own.
    public struct DNS: Sendable {
        public var manager: String
        public var applied: (resolvers: [String], search: [String])?
        public var problem: String?

        public init(manager: String, applied: (resolvers: [String], search: [String])?, problem: String?) {
            self.manager = manager
            self.applied = applied
            self.problem = problem
        }

        var json: JSON {
            var fields: [(String, JSON)] = [("manager", .string(manager))]
            if let applied { fields += [("resolvers", .strings(applied.resolvers)), ("search", .strings(applied.search))] }
            return .object(fields + [("problem", .optional(problem))])
        }
    }

    /// A process kept outside the tunnel.
    public struct Excluded: Sendable {
        public var pid: Int32
        public var name: String

        public init(pid: Int32, name: String) {
            self.pid = pid
            self.name = name
        }

        var json: JSON { .object([("pid", .count(pid)), ("name", .string(name))]) }
    }

    /// One of the agent's holdings (`routing`, `resolvers`, `lockdown`): what is missing now (nil:
    /// whole), how often it was put back, who removed it last, and how long the agent holds off.
    public struct Upkeep: Sendable {
        public var holding: String
        public var missing: String?
        public var restores: Int
        public var lastRemovedBy: String?
        public var heldFor: Duration?

        public init(holding: String, missing: String?, restores: Int, lastRemovedBy: String?, heldFor: Duration?) {
            self.holding = holding
            self.missing = missing
            self.restores = restores
            self.lastRemovedBy = lastRemovedBy
            self.heldFor = heldFor
        }

        var json: JSON {
            .object([("missing", .optional(missing)), ("restores", .count(restores)), ("last_removed_by", .optional(lastRemovedBy)),
                     ("held_for_ms", heldFor?.milliseconds ?? .null)])
        }
    }
}

extension JSON {
    /// A string, or `null`.
    static func optional(_ string: String?) -> JSON { string.map(JSON.string) ?? .null }

    static func strings(_ strings: [String]) -> JSON { .array(strings.map(JSON.string)) }
}
