import Basics
import Device
import Testing
@testable import Streams

private let proxy = HTTPProxy(address: SocketAddress(IPAddress("192.0.2.8")!, port: 3128))

@Test func theRequestNamesTheGatewayAndCarriesCredentialsOnlyWhenGiven() {
    let target = SocketAddress(IPAddress("198.51.100.7")!, port: 443)
    let plain = String(decoding: proxy.request(to: target, host: "vpn.example.net"), as: UTF8.self)
    #expect(plain == "CONNECT vpn.example.net:443 HTTP/1.1\r\nHost: vpn.example.net:443\r\n\r\n")
    #expect(String(decoding: proxy.request(to: target, host: nil), as: UTF8.self).hasPrefix("CONNECT 198.51.100.7:443 HTTP/1.1\r\n"))
    let with = HTTPProxy(address: proxy.address, credentials: ("alice", "open sesame"))
    let text = String(decoding: with.request(to: target, host: nil), as: UTF8.self)
    #expect(text.contains("Proxy-Authorization: Basic YWxpY2U6b3BlbiBzZXNhbWU=\r\n"))
    #expect(!with.description.contains("sesame"), "the password is never shown")
}

@Test(arguments: [
    ("HTTP/1.1 200 Connection established\r\n\r\n", nil),
    ("HTTP/1.0 200 OK\r\nProxy-agent: x\r\n\r\n", nil),
    ("HTTP/1.1 407 Proxy Authentication Required\r\n\r\n", "asks for credentials"),
    ("HTTP/1.1 403 Forbidden\r\n\r\n", "refused the tunnel (403 Forbidden)"),
    ("SSH-2.0-OpenSSH\r\n", "not HTTP"),
    ("HTTP/1.1 abc\r\n\r\n", "not HTTP"),
    ("", "without an answer"),
] as [(String, String?)])
func theAnswerSaysWhetherTheTunnelIsOpen(answer: String, refusal: String?) {
    let said = proxy.refusal(in: Array(answer.utf8))
    if let refusal {
        #expect(said?.contains(refusal) == true, "\(said ?? "nil")")
    } else {
        #expect(said == nil)
    }
}

@Test func aProxyThatRefusesCredentialsItWasGivenSaysSo() {
    let with = HTTPProxy(address: proxy.address, credentials: ("alice", "wrong"))
    #expect(with.refusal(in: Array("HTTP/1.1 407 Nope\r\n\r\n".utf8))?.contains("refused the credentials") == true)
}

@Test func base64MatchesRFC4648() {
    #expect(HTTPProxy.base64(Array("".utf8)) == "")
    #expect(HTTPProxy.base64(Array("f".utf8)) == "Zg==")
    #expect(HTTPProxy.base64(Array("fo".utf8)) == "Zm8=")
    #expect(HTTPProxy.base64(Array("foobar".utf8)) == "Zm9vYmFy")
}
