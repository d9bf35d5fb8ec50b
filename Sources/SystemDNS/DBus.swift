import Glibc
public import Basics

/// Just enough of D-Bus to call methods on the system bus: a Unix socket, the EXTERNAL
/// authentication (the kernel vouches for our uid), and the marshalling of the few types the
/// calls need. The agent asks systemd-resolved a handful of questions per tunnel; a D-Bus
/// library (and the memory it brings) would be more than the job.
public final class DBusConnection {
    private let fd: Int32
    private var serial: UInt32 = 0
    private var buffer: [UInt8] = []
    /// How long a call may take before it fails.
    private let timeout: Duration
    /// When everything on this connection must be over, whatever the calls' own time-outs.
    private let deadline: Instant?

    /// Connects to the system bus: `$DBUS_SYSTEM_BUS_ADDRESS` when it names a `unix:path=`,
    /// else /run/dbus/system_bus_socket.
    /// With `deadline`, the connection, its authentication and every call end by then at the
    /// latest (a caller that cannot wait long, such as the deciding loop).
    public static func systemBus(timeout: Duration = .seconds(5), deadline: Instant? = nil) throws(DBusError) -> DBusConnection {
        var path = "/run/dbus/system_bus_socket"
        if let address = getenv("DBUS_SYSTEM_BUS_ADDRESS").map({ String(cString: $0) }) {
            for part in address.split(separator: ";") where part.hasPrefix("unix:") {
                for pair in part.dropFirst(5).split(separator: ",") where pair.hasPrefix("path=") {
                    path = String(pair.dropFirst(5))
                }
            }
        }
        return try DBusConnection(path: path, timeout: timeout, deadline: deadline)
    }

    public init(path: String, timeout: Duration = .seconds(5), deadline: Instant? = nil) throws(DBusError) {
        self.timeout = timeout
        self.deadline = deadline
        // Non-blocking: a bus whose backlog is full (a hung daemon) refuses at once instead of
        // keeping connect waiting; every wait after it polls until its deadline.
        fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
        guard fd >= 0 else { throw .system("socket", errno) }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else {
            close(fd)
            throw .protocolError("bus path too long: \(path)")
        }
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: bytes) }
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard connected == 0 else {
            let code = errno
            close(fd)
            throw .noBus(path, code)
        }
        do {
            try authenticate()
            _ = try call(destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus",
                         interface: "org.freedesktop.DBus", member: "Hello")
        } catch {
            close(fd)
            throw error
        }
    }

    deinit { close(fd) }

    /// Whether a service holds `name` on the bus now.
    public func hasOwner(_ name: String) throws(DBusError) -> Bool {
        var body = DBusWriter()
        body.string(name)
        let reply = try call(destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus",
                             member: "NameHasOwner", signature: "s", body: body.bytes)
        var reader = DBusReader(reply)
        return try reader.bool()
    }

    /// Property `name` of `interface` on `path`: its variant's signature and the bytes that
    /// hold its value, for `DBusReader` to read.
    public func property(destination: String, path: String, interface: String, name: String) throws(DBusError) -> DBusVariant {
        var body = DBusWriter()
        body.string(interface)
        body.string(name)
        let reply = try call(destination: destination, path: path, interface: "org.freedesktop.DBus.Properties",
                             member: "Get", signature: "ss", body: body.bytes)
        return try DBusVariant(reply)
    }

    /// Calls `member` and waits for its answer: the reply's body, or the error the service returned.
    @discardableResult
    public func call(destination: String, path: String, interface: String, member: String,
                     signature: String = "", body: [UInt8] = []) throws(DBusError) -> [UInt8] {
        serial += 1
        let sent = serial
        var message = DBusWriter()
        message.bytes = [UInt8(ascii: "l"), 1 /* METHOD_CALL */, 0, 1]
        message.uint32(UInt32(body.count))
        message.uint32(sent)
        message.array(alignment: 8) { fields in
            fields.field(1, "o", path)
            fields.field(2, "s", interface)
            fields.field(3, "s", member)
            fields.field(6, "s", destination)
            if !signature.isEmpty { fields.field(8, "g", signature) }
        }
        message.align(8)
        message.bytes += body
        try send(message.bytes)
        let deadline = due()
        while true {
            let reply = try receive(until: deadline)
            guard reply.replySerial == sent else { continue }  // signals, such as NameAcquired
            switch reply.type {
            case 2: return reply.body
            case 3:
                var reader = DBusReader(reply.body)
                let text = reply.signature.hasPrefix("s") ? (try? reader.string()) ?? "" : ""
                throw .remote(name: reply.errorName ?? "?", message: text)
            default: continue
            }
        }
    }

    // MARK: The wire

    private func authenticate() throws(DBusError) {
        let uid = String(getuid()).utf8.map { String($0, radix: 16) }.joined()
        try send([0] + Array("AUTH EXTERNAL \(uid)\r\n".utf8))
        let deadline = due()
        while !buffer.contains(UInt8(ascii: "\n")) { try fill(until: deadline) }
        let end = buffer.firstIndex(of: UInt8(ascii: "\n"))!
        let line = String(decoding: buffer[..<end], as: UTF8.self)
        buffer.removeSubrange(...end)
        guard line.hasPrefix("OK ") else { throw .protocolError("the bus refused EXTERNAL authentication: \(line)") }
        try send(Array("BEGIN\r\n".utf8))
    }

    /// When what starts now must be over: the call's own time-out, or the connection's deadline.
    private func due() -> Instant {
        let own = Instant.now() + timeout
        return deadline.map { min($0, own) } ?? own
    }

    private func send(_ bytes: [UInt8]) throws(DBusError) {
        var done = 0
        let deadline = due()
        while done < bytes.count {
            let n = bytes[done...].withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if n < 0, errno == EINTR { continue }
            if n < 0, errno == EAGAIN {
                try wait(for: POLLOUT, until: deadline)
                continue
            }
            guard n > 0 else { throw .system("send", errno) }
            done += n
        }
    }

    /// Waits until the socket is ready for `events`, or throws `timedOut` at `deadline`.
    private func wait(for events: Int32, until deadline: Instant) throws(DBusError) {
        while true {
            let left = deadline - Instant.now()
            guard left > .zero else { throw .timedOut }
            var poller = pollfd(fd: fd, events: Int16(events), revents: 0)
            let milliseconds = Int32(min(left.components.seconds * 1000 + left.components.attoseconds / 1_000_000_000_000_000 + 1, 60_000))
            let ready = poll(&poller, 1, milliseconds)
            if ready < 0, errno == EINTR { continue }
            guard ready >= 0 else { throw .system("poll", errno) }
            guard ready > 0 else { throw .timedOut }
            return
        }
    }

    private func fill(until deadline: Instant) throws(DBusError) {
        try wait(for: POLLIN, until: deadline)
        var chunk = [UInt8](repeating: 0, count: 4096)
        let n = recv(fd, &chunk, chunk.count, 0)
        if n < 0, errno == EINTR || errno == EAGAIN { return }
        guard n > 0 else { throw n == 0 ? .protocolError("the bus closed the connection") : .system("recv", errno) }
        buffer += chunk[0..<n]
    }

    private struct Message {
        var type: UInt8
        var replySerial: UInt32?
        var errorName: String?
        var signature = ""
        var body: [UInt8]
    }

    /// The next whole message: 16 fixed bytes, the header fields, padding to 8, the body.
    private func receive(until deadline: Instant) throws(DBusError) -> Message {
        while buffer.count < 16 { try fill(until: deadline) }
        guard buffer[0] == UInt8(ascii: "l") else { throw .protocolError("big-endian messages are not spoken here") }
        var fixed = DBusReader(Array(buffer[0..<16]))
        fixed.offset = 4
        let bodyLength = Int(try fixed.uint32())
        fixed.offset = 12
        let fieldsLength = Int(try fixed.uint32())
        let headerLength = (16 + fieldsLength + 7) / 8 * 8
        guard fieldsLength < 1 << 20, bodyLength < 1 << 24 else { throw .protocolError("a message too large") }
        while buffer.count < headerLength + bodyLength { try fill(until: deadline) }
        let bytes = Array(buffer[0..<(headerLength + bodyLength)])
        buffer.removeSubrange(0..<(headerLength + bodyLength))
        var message = Message(type: bytes[1], body: Array(bytes[headerLength...]))
        var reader = DBusReader(Array(bytes[0..<(16 + fieldsLength)]))
        reader.offset = 16
        while reader.offset < 16 + fieldsLength {
            reader.align(8)
            let code = try reader.byte()
            let signature = try reader.signature()
            switch (code, signature) {
            case (5, "u"): message.replySerial = try reader.uint32()
            case (4, "s"): message.errorName = try reader.string()
            case (8, "g"): message.signature = try reader.signature()
            case (_, "s"), (_, "o"): _ = try reader.string()
            case (_, "g"): _ = try reader.signature()
            case (_, "u"): _ = try reader.uint32()
            default: throw .protocolError("a header field of type \(signature)")
            }
        }
        return message
    }
}

/// Why a call on the bus failed.
public enum DBusError: Error, Equatable, CustomStringConvertible {
    /// No bus listens at the path (no D-Bus on this machine, or not started yet).
    case noBus(String, Int32)
    case system(String, Int32)
    case timedOut
    case protocolError(String)
    /// The service answered with an error.
    case remote(name: String, message: String)

    public var description: String {
        switch self {
        case .noBus(let path, let code): "no D-Bus system bus at \(path): \(String(cString: strerror(code)))"
        case .system(let call, let code): "D-Bus \(call): \(String(cString: strerror(code)))"
        case .timedOut: "D-Bus: no answer in time"
        case .protocolError(let what): "D-Bus: \(what)"
        case .remote(let name, let message): message.isEmpty ? name : "\(name): \(message)"
        }
    }
}

/// Marshals values in the D-Bus little-endian wire format; alignment counts from the message's
/// start, so a body is written in a writer of its own (the body starts 8-aligned).
public struct DBusWriter {
    public var bytes: [UInt8] = []

    public init() {}

    mutating func align(_ n: Int) {
        while bytes.count % n != 0 { bytes.append(0) }
    }

    public mutating func byte(_ value: UInt8) { bytes.append(value) }

    public mutating func uint32(_ value: UInt32) {
        align(4)
        withUnsafeBytes(of: value.littleEndian) { bytes += $0 }
    }

    public mutating func int32(_ value: Int32) { uint32(UInt32(bitPattern: value)) }

    public mutating func bool(_ value: Bool) { uint32(value ? 1 : 0) }

    /// A string or an object path.
    public mutating func string(_ value: String) {
        uint32(UInt32(value.utf8.count))
        bytes += value.utf8
        bytes.append(0)
    }

    public mutating func signature(_ value: String) {
        bytes.append(UInt8(value.utf8.count))
        bytes += value.utf8
        bytes.append(0)
    }

    /// An array whose elements align to `alignment` (8 for structs), written by `elements`.
    public mutating func array(alignment: Int, _ elements: (inout DBusWriter) -> Void) {
        uint32(0)
        let lengthAt = bytes.count - 4
        align(alignment)
        let start = bytes.count
        elements(&self)
        let length = UInt32(bytes.count - start).littleEndian
        withUnsafeBytes(of: length) { bytes.replaceSubrange(lengthAt..<lengthAt + 4, with: $0) }
    }

    /// The start of a struct.
    public mutating func structure() { align(8) }

    /// A header field: a struct of a code and a variant holding a string-like value.
    mutating func field(_ code: UInt8, _ type: String, _ value: String) {
        structure()
        byte(code)
        signature(type)
        if type == "g" { signature(value) } else { string(value) }
    }
}

/// A value a reply holds: a property's variant as `Properties.Get` returns it, or a method's
/// answer, read as the types systemd's take (a string or object path, a number and a path).
public struct DBusVariant: Sendable {
    /// The value's D-Bus signature (`s`, `o`, `(uo)`...).
    public let signature: String
    private let bytes: [UInt8]
    private let offset: Int

    /// Reads the variant that a reply's body holds.
    public init(_ body: [UInt8]) throws(DBusError) {
        var reader = DBusReader(body)
        signature = try reader.signature()
        bytes = body
        offset = reader.offset
    }

    /// A reply's body that holds one value of type `signature` as it is (a method's answer).
    public init(_ body: [UInt8], signature: String) {
        self.signature = signature
        bytes = body
        offset = 0
    }

    private var reader: DBusReader {
        var reader = DBusReader(bytes)
        reader.offset = offset
        return reader
    }

    /// A string or an object path; nil for another type.
    public var string: String? {
        guard signature == "s" || signature == "o" else { return nil }
        var reader = reader
        return try? reader.string()
    }

    /// A struct of a number and an object path (a unit's `Job`); nil for another type.
    public var numberAndPath: (UInt32, String)? {
        guard signature == "(uo)" else { return nil }
        var reader = reader
        reader.align(8)
        guard let number = try? reader.uint32(), let path = try? reader.string() else { return nil }
        return (number, path)
    }
}

/// Reads values in the D-Bus little-endian wire format.
struct DBusReader {
    let bytes: [UInt8]
    var offset = 0

    init(_ bytes: [UInt8]) { self.bytes = bytes }

    mutating func align(_ n: Int) { offset = (offset + n - 1) / n * n }

    mutating func byte() throws(DBusError) -> UInt8 {
        guard offset < bytes.count else { throw .protocolError("a message ended early") }
        defer { offset += 1 }
        return bytes[offset]
    }

    mutating func uint32() throws(DBusError) -> UInt32 {
        align(4)
        guard offset + 4 <= bytes.count else { throw .protocolError("a message ended early") }
        defer { offset += 4 }
        return bytes[offset..<offset + 4].reversed().reduce(0) { $0 << 8 | UInt32($1) }
    }

    mutating func bool() throws(DBusError) -> Bool { try uint32() != 0 }

    mutating func string() throws(DBusError) -> String {
        let length = Int(try uint32())
        guard length < bytes.count, offset + length < bytes.count else { throw .protocolError("a message ended early") }
        defer { offset += length + 1 }
        return String(decoding: bytes[offset..<offset + length], as: UTF8.self)
    }

    mutating func signature() throws(DBusError) -> String {
        let length = Int(try byte())
        guard offset + length < bytes.count else { throw .protocolError("a message ended early") }
        defer { offset += length + 1 }
        return String(decoding: bytes[offset..<offset + length], as: UTF8.self)
    }
}
