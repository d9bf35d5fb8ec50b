import Glibc
public import Basics
import Device

/// Makes the tunnel's resolvers the system's, and takes them back: through systemd-resolved
/// when it runs (per-link DNS on the tunnel device, so nothing else is touched and the setting
/// goes with the device), else by writing /etc/resolv.conf (see `ResolvConfFile`).
public final class TunnelDNS {
    /// Who is told.
    public enum Manager: String, Sendable {
        case resolved = "systemd-resolved"
        case resolvConf = "resolv.conf"
    }

    public let manager: Manager
    /// What is in place now.
    public private(set) var applied: DNSSettings?
    private let file: ResolvConfFile
    private var link: (index: Int32, name: String)?

    /// `manager` nil picks systemd-resolved when it holds its name on the system bus and
    /// resolv.conf sends applications to its stub; with resolv.conf another way (resolved in
    /// "foreign" mode), what resolved is told would reach nobody, so the file is written.
    public init(manager: Manager?, file: ResolvConfFile = ResolvConfFile()) {
        self.file = file
        self.manager = manager ?? (Self.resolvedRuns() && Self.usesStub(file) ? .resolved : .resolvConf)
    }

    /// Whether every resolver the system's resolv.conf names is systemd-resolved's stub.
    static func usesStub(_ file: ResolvConfFile) -> Bool {
        let servers = ResolvConfFile.nameservers(in: ResolvConfFile.systemText(at: file.path) ?? "")
        return !servers.isEmpty && servers.allSatisfy { $0 == "127.0.0.53" || $0 == "127.0.0.54" }
    }

    /// Whether systemd-resolved answers on the system bus.
    public static func resolvedRuns() -> Bool {
        (try? DBusConnection.systemBus(timeout: .seconds(2)).hasOwner(Resolved.service)) ?? false
    }

    /// Sends names to `settings`' resolvers through the tunnel device `interface`; with
    /// `routeAll` (full mode) every name, else those of the search domains (and, for resolv.conf,
    /// which has no per-domain routing, every name as well).
    public func apply(_ settings: DNSSettings, interface: (index: Int32, name: String), routeAll: Bool) throws(DNSManagerError) {
        switch manager {
        case .resolved:
            do {
                try Resolved(try DBusConnection.systemBus()).configure(link: interface.index, settings, routeAll: routeAll)
            } catch {
                throw DNSManagerError(manager: manager, reason: "\(error)")
            }
        case .resolvConf:
            do {
                try file.apply(settings, tunnel: interface.name)
            } catch {
                throw DNSManagerError(manager: manager, reason: "\(error)")
            }
        }
        applied = settings
        link = interface
    }

    /// What someone else took away of the tunnel's resolvers: nil while they are in place, or
    /// none were applied. resolv.conf is read; systemd-resolved keeps a link's setting itself
    /// (across its own restarts too), and the link is the agent's.
    public var missing: String? {
        guard manager == .resolvConf, let applied, let link else { return nil }
        return file.holds(applied, tunnel: link.name) ? nil : "\(file.path) rewritten"
    }

    /// Writes resolv.conf again when someone else replaced it (a DHCP client renewing its lease),
    /// keeping theirs as the file to put back; true when it had to. systemd-resolved keeps a
    /// link's setting by itself.
    @discardableResult
    public func reassert() throws(DNSManagerError) -> Bool {
        guard manager == .resolvConf, let applied, let link else { return false }
        do {
            return try file.apply(applied, tunnel: link.name)
        } catch {
            throw DNSManagerError(manager: manager, reason: "\(error)")
        }
    }

    /// Takes the tunnel's resolvers back: the previous resolv.conf, or the link's setting in
    /// systemd-resolved (which also drops it by itself when the device goes).
    public func revert() throws(DNSManagerError) {
        defer { applied = nil }
        do {
            switch manager {
            case .resolved:
                guard let link else { return }
                try Resolved(try DBusConnection.systemBus()).revert(link: link.index)
            case .resolvConf:
                try file.restore()
            }
        } catch {
            throw DNSManagerError(manager: manager, reason: "\(error)")
        }
    }
}

/// A DNS setting the system did not take.
public struct DNSManagerError: Error, CustomStringConvertible {
    public var manager: TunnelDNS.Manager
    public var reason: String
    public var description: String { "\(manager.rawValue): \(reason)" }
}

/// systemd-resolved's link settings, `org.freedesktop.resolve1.Manager` (see its D-Bus API in
/// org.freedesktop.resolve1(5)). Root is allowed these calls without polkit.
struct Resolved {
    static let service = "org.freedesktop.resolve1"
    let bus: DBusConnection

    init(_ bus: DBusConnection) { self.bus = bus }

    /// The resolvers and domains of `link`: `~.` with the default route in full mode, so every
    /// name goes to them and none to another link's resolvers unless a more specific domain says
    /// so; in split mode only the names of the search domains.
    func configure(link: Int32, _ settings: DNSSettings, routeAll: Bool) throws(DBusError) {
        for call in Self.calls(link: link, settings, routeAll: routeAll) {
            try self.call(call.member, call.signature, call.body)
        }
    }

    /// One method call of resolved's manager: its name, its D-Bus signature, and its body.
    struct Call {
        var member: String
        var signature: String
        var body: DBusWriter
    }

    /// What `configure` asks of resolved, in order (pure: the translation tests read it).
    static func calls(link: Int32, _ settings: DNSSettings, routeAll: Bool) -> [Call] {
        var servers = DBusWriter()
        servers.int32(link)
        servers.array(alignment: 8) { list in
            for resolver in settings.resolvers {
                list.structure()
                list.int32(resolver.family == .v4 ? AF_INET : AF_INET6)
                list.array(alignment: 1) { bytes in for byte in resolver.bytes { bytes.byte(byte) } }
            }
        }
        var domains = DBusWriter()
        domains.int32(link)
        domains.array(alignment: 8) { list in
            for domain in settings.searchDomains {
                list.structure()
                list.string(domain)
                list.bool(false)
            }
            if routeAll {
                list.structure()
                list.string(".")
                list.bool(true)
            }
        }
        // Said either way: left to itself, resolved makes a link without a routing-only domain
        // a default route, and split mode's other names would go to both sides at once.
        var route = DBusWriter()
        route.int32(link)
        route.bool(routeAll)
        var calls = [Call(member: "SetLinkDNS", signature: "ia(iay)", body: servers),
                     Call(member: "SetLinkDomains", signature: "ia(sb)", body: domains),
                     Call(member: "SetLinkDefaultRoute", signature: "ib", body: route)]
        // A layer-3 tunnel has no neighbours to ask by multicast.
        for member in ["SetLinkLLMNR", "SetLinkMulticastDNS"] {
            var off = DBusWriter()
            off.int32(link)
            off.string("no")
            calls.append(Call(member: member, signature: "is", body: off))
        }
        return calls
    }

    func revert(link: Int32) throws(DBusError) {
        var body = DBusWriter()
        body.int32(link)
        do {
            try call("RevertLink", "i", body)
        } catch .remote(name: "org.freedesktop.resolve1.NoSuchLink", _) {
            // The device is gone, and its settings with it.
        }
    }

    private func call(_ member: String, _ signature: String, _ body: DBusWriter) throws(DBusError) {
        try bus.call(destination: Self.service, path: "/org/freedesktop/resolve1", interface: "org.freedesktop.resolve1.Manager",
                     member: member, signature: signature, body: body.bytes)
    }
}
