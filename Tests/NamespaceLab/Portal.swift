import Foundation
import Glibc
import Synchronization
public import Basics
import Tunnel
public import Device

/// A captive portal on the router's side of one uplink, as hotels run them: while closed it
/// drops the uplink's UDP (the tunnel's handshakes vanish) and sends every plain HTTP request
/// to its own server, which redirects to a login page; a POST to that page opens it. Beside it
/// stands "the internet's" connectivity check, an HTTP server that answers `expected`.
public final class LabPortal: @unchecked Sendable {  // every mutable field is read and written under `lock`
    /// Where the portal's server listens, on the router's address on that uplink.
    public let login: SocketAddress
    /// The connectivity check's address ("on the internet") and the body it answers.
    public let check: SocketAddress
    public static let expected = "Roam lab online"
    private let router: NamespaceLab
    private let uplink: String
    private let running = Atomic<Bool>(true)
    private let done = DispatchGroup()
    private let lock = NSLock()
    private var openedAt: LabInstant?
    private var requests: [String] = []

    /// Closes the portal on the router's `uplink` (its address there: `routerAddress`).
    public init(router: NamespaceLab, uplink: String, routerAddress: IPAddress,
                checkAddress: IPAddress = IPAddress("198.51.100.80")!) throws {
        self.router = router
        self.uplink = uplink
        login = SocketAddress(routerAddress, port: 8080)
        check = SocketAddress(checkAddress, port: 80)
        try router.ip("address add \(checkAddress)/32 dev lo")
        let internet = try TCPListener(bindingTo: check, namespace: router.namespace)
        let portal = try TCPListener(bindingTo: login, namespace: router.namespace)
        serve(internet) { _ in "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n\(Self.expected)\n" }
        serve(portal) { [unowned self] request in
            if request.hasPrefix("POST /login") {
                open()
                return "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nConnection: close\r\n\r\n<h1>Welcome</h1>\n"
            }
            return "HTTP/1.1 302 Found\r\nLocation: http://\(login)/login\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        }
        try nft("add table inet lab_portal")
        try nft("add chain inet lab_portal intercept { type nat hook prerouting priority -100 ; }")
        try nft("add rule inet lab_portal intercept iifname \(uplink) tcp dport 80 redirect to :8080")
        try nft("add chain inet lab_portal held { type filter hook input priority 0 ; }")
        // Name look-ups to the network's own resolver pass, as at every portal.
        try nft("add rule inet lab_portal held iifname \(uplink) udp dport 53 accept")
        try nft("add rule inet lab_portal held iifname \(uplink) meta l4proto udp counter drop")
        // A router that is not the server forwards the uplink's traffic instead.
        try nft("add chain inet lab_portal held_forwarded { type filter hook forward priority 0 ; }")
        try nft("add rule inet lab_portal held_forwarded iifname \(uplink) meta l4proto udp counter drop")
    }

    deinit { stop() }

    /// Someone logged in: UDP passes and HTTP reaches the internet again.
    public func open() {
        lock.withLock {
            guard openedAt == nil else { return }
            // Its rules go, its chains stay: connections it redirected keep their translation.
            try? nft("flush table inet lab_portal")
            openedAt = LabClock.now
        }
    }

    /// When the portal opened, if it did.
    public var opened: LabInstant? { lock.withLock { openedAt } }

    /// The first line of every request its servers answered, in order.
    public var requestLines: [String] { lock.withLock { requests } }

    public func stop() {
        guard running.exchange(false, ordering: .relaxed) else { return }
        _ = done.wait(timeout: .now() + 3)
        try? nft("delete table inet lab_portal")
    }

    /// Answers each connection on `listener` with `respond(request)`, one at a time.
    private func serve(_ listener: TCPListener, _ respond: @escaping @Sendable (String) -> String) {
        done.enter()
        Thread { [self] in
            while running.load(ordering: .relaxed) {
                guard let connection = (try? listener.accept(timeout: .milliseconds(100))) ?? nil else { continue }
                let deadline = ContinuousClock.now + .seconds(2)
                var bytes = (try? connection.read(until: [13, 10, 13, 10], limit: 8192, deadline: deadline)) ?? []
                let head = String(decoding: bytes, as: UTF8.self)
                // The body: what came with the head, and the rest.
                let headLength = (bytes.firstRange(of: [13, 10, 13, 10])?.upperBound ?? bytes.count)
                if let length = head.split(separator: "\r\n").first(where: { $0.lowercased().hasPrefix("content-length:") })
                    .flatMap({ Int($0.split(separator: ":")[1].trimmingCharacters(in: .whitespaces)) }),
                   case let missing = min(length, 8192) - (bytes.count - headLength), missing > 0 {
                    bytes += (try? connection.read(until: [], limit: missing, deadline: deadline)) ?? []
                }
                let line = head.split(separator: "\r\n").first.map(String.init) ?? ""
                lock.withLock { requests.append(line) }
                _ = try? connection.write(Array(respond(line).utf8), deadline: deadline)
            }
            done.leave()
        }.start()
    }

    private func nft(_ command: String) throws {
        let (status, output) = try NamespaceLab.capture(NamespaceLab.ipTool, ["netns", "exec", router.name, "nft", command])
        guard status == 0 else { throw NamespaceLab.Failure(description: "nft \(command): \(output)") }
    }
}
