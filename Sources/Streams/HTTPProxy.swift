import Basics
public import Device

/// An HTTP proxy that the stream to the gateway goes through (`CONNECT`, RFC 9110 9.3.6), for
/// networks that let out nothing else.
public struct HTTPProxy: Equatable, Sendable, CustomStringConvertible {
    /// Where the proxy listens.
    public var address: SocketAddress
    /// Basic credentials, when the proxy asks for them: the user and the password (read from a
    /// file, never from the command line).
    public var credentials: (user: String, password: String)?

    public init(address: SocketAddress, credentials: (user: String, password: String)? = nil) {
        self.address = address
        self.credentials = credentials
    }

    public static func == (a: HTTPProxy, b: HTTPProxy) -> Bool {
        a.address == b.address && a.credentials?.user == b.credentials?.user && a.credentials?.password == b.credentials?.password
    }

    /// The proxy's address and user, never the password.
    public var description: String { credentials.map { "\($0.user)@\(address)" } ?? "\(address)" }

    /// The request that asks the proxy for a tunnel to `target` (`host` names it when given, as
    /// a browser names the site; the address otherwise).
    public func request(to target: SocketAddress, host: String?) -> [UInt8] {
        let authority = host.map { "\($0):\(target.port)" } ?? target.description
        var text = "CONNECT \(authority) HTTP/1.1\r\nHost: \(authority)\r\n"
        if let credentials {
            text += "Proxy-Authorization: Basic \(Self.base64(Array("\(credentials.user):\(credentials.password)".utf8)))\r\n"
        }
        return Array((text + "\r\n").utf8)
    }

    /// What the proxy's answer to `CONNECT` says: nil when it opened the tunnel (a 2xx status),
    /// else why not, in words for the log. Reads the status line only; `answer` holds the bytes
    /// up to the blank line that ends the headers.
    public func refusal(in answer: [UInt8]) -> String? {
        guard let end = answer.firstIndex(of: UInt8(ascii: "\r")) ?? answer.firstIndex(of: UInt8(ascii: "\n")) else {
            return answer.isEmpty ? "the proxy closed the connection without an answer" : "the proxy's answer is not HTTP"
        }
        let line = String(decoding: answer[..<min(end, 200)], as: UTF8.self)
        let parts = line.split(separator: " ", maxSplits: 2)
        guard parts.count >= 2, parts[0].hasPrefix("HTTP/1."), parts[1].utf8.count == 3,
              parts[1].utf8.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }), let status = Int(parts[1]), (100...599).contains(status) else {
            return "the proxy's answer is not HTTP"
        }
        let said = parts.count > 2 ? " \(Self.printable(parts[2]))" : ""
        switch status {
        case 200...299: return nil
        case 407 where credentials == nil: return "the proxy asks for credentials (407\(said)); give the proxy's user and password file"
        case 407: return "the proxy refused the credentials (407\(said))"
        default: return "the proxy refused the tunnel (\(status)\(said))"
        }
    }

    /// Asks the proxy on `connection` for a tunnel to `target`, by `deadline`.
    public func open(_ connection: TCPConnection, to target: SocketAddress, host: String?,
                     deadline: ContinuousClock.Instant) throws(StreamError) {
        do {
            guard try connection.write(request(to: target, host: host), deadline: deadline) else {
                throw StreamError("the proxy at \(address) took no request in time")
            }
            let answer = try connection.read(until: Array("\r\n\r\n".utf8), limit: Self.answerLimit, deadline: deadline)
            guard answer.firstRange(of: Array("\r\n\r\n".utf8)) != nil || refusal(in: answer) != nil else {
                throw StreamError("the proxy at \(address) gave no whole answer in time")
            }
            if let refusal = refusal(in: answer) { throw StreamError("\(refusal) at \(address)") }
        } catch let error as DeviceError {
            throw StreamError("the proxy at \(address): \(error)")
        } catch let error as StreamError {
            throw error
        } catch {
            throw StreamError("the proxy at \(address): \(error)")
        }
    }

    /// The most of a proxy's answer read: a status line and headers.
    static let answerLimit = 8_192

    /// A proxy's words as the log may show them: printable ASCII, cut short.
    private static func printable(_ text: Substring) -> String {
        String(text.unicodeScalars.prefix(80).map { $0.isASCII && $0.value >= 0x20 && $0.value < 0x7F ? Character($0) : "?" })
    }

    private static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)

    /// Standard base64 with padding (RFC 4648 4).
    public static func base64(_ bytes: [UInt8]) -> String {
        var out: [UInt8] = []
        out.reserveCapacity((bytes.count + 2) / 3 * 4)
        var i = 0
        while i < bytes.count {
            let n = min(3, bytes.count - i)
            let chunk = UInt32(bytes[i]) << 16 | (n > 1 ? UInt32(bytes[i + 1]) << 8 : 0) | (n > 2 ? UInt32(bytes[i + 2]) : 0)
            for k in 0..<4 { out.append(k <= n ? alphabet[Int(chunk >> UInt32(18 - 6 * k) & 63)] : UInt8(ascii: "=")) }
            i += 3
        }
        return String(decoding: out, as: UTF8.self)
    }
}
