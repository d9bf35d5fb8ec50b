import ConfigReader

extension ClientSettings {
    /// The keys a running tunnel takes as they change: the reconnect tunables, the keepalive, the
    /// portal check, the on-demand rules, the metrics file and who operates. Every other key
    /// describes the tunnel itself, so a key the reader learns later restarts the agent when it
    /// changes until it is listed here.
    public static let tunables: Set<String> = ["reconnect", "persistent-keepalive", "portal", "on-demand", "metrics-file", "operators"]

    /// Keys a reload names by the part of the tunnel they describe together with another.
    static let namedAs = ["server": "servers", "server-key": "servers", "routes": "mode", "never-local": "mode",
                          "protocol-fallback": "protocol"]

    /// What of the tunnel itself `other` describes differently, by the configuration's keys: each
    /// top-level key but the tunables whose text differs (set, removed or written otherwise), once.
    public func tunnelChanges(to other: ClientSettings) -> [String] {
        let order = YAMLReader.clientKeys
        let keys = Set(written.keys).union(other.written.keys).subtracting(Self.tunables)
            .sorted { (order.firstIndex(of: $0) ?? order.count, $0) < (order.firstIndex(of: $1) ?? order.count, $1) }
        var names: [String] = []
        for key in keys where written[key] != other.written[key] {
            let name = Self.namedAs[key] ?? key
            if !names.contains(name) { names.append(name) }
        }
        return names
    }

    /// The tunables `other` writes differently (for the log of a reload that keeps the tunnel), in
    /// the configuration's order.
    public func tunableChanges(to other: ClientSettings) -> [String] {
        YAMLReader.clientKeys.filter { Self.tunables.contains($0) && written[$0] != other.written[$0] }
    }
}
