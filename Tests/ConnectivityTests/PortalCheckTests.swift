import Foundation
@testable import Connectivity
import Reconnector
import Testing

private func answer(_ text: String) -> [UInt8] { Array(text.replacingOccurrences(of: "\n", with: "\r\n").utf8) }

/// The answers the check's parser must read right, as networks give them: the first is what
/// nmcheck.gnome.org answers, the portals' are shaped after common hotel and train portals.
@Test(arguments: [
    ("""
    HTTP/1.1 200 OK
    Date: Mon, 23 Nov 2026 10:00:00 GMT
    Server: Apache
    X-NetworkManager-Status: online
    Content-Length: 25
    Connection: close
    Content-Type: text/plain; charset=UTF-8

    NetworkManager is online

    """, Connectivity.online),
    // A hotel portal's redirect to its login page.
    ("""
    HTTP/1.1 302 Found
    Location: https://login.hotel.example/guest/?url=http%3A%2F%2Fnmcheck.gnome.org%2F
    Content-Length: 0
    Connection: close


    """, .portal(url: "https://login.hotel.example/guest/?url=http%3A%2F%2Fnmcheck.gnome.org%2F")),
    // A redirect to a path on the same host (the portal rewrote the Host).
    ("HTTP/1.0 307 Temporary Redirect\nLocation: /login.html\n\n", .portal(url: "http://nmcheck.gnome.org/login.html")),
    // A portal that redirects to the check itself, without end: one request, still a portal.
    ("HTTP/1.1 302 Found\nLocation: http://nmcheck.gnome.org/check_network_status.txt\n\n",
     .portal(url: "http://nmcheck.gnome.org/check_network_status.txt")),
    // Its own page served in place, with a meta refresh, as many train portals do.
    ("""
    HTTP/1.1 200 OK
    Content-Type: text/html

    <html><head><meta http-equiv="refresh" content="0;url=http://wifi.train.example/"></head></html>
    """, .portal(url: "http://nmcheck.gnome.org/check_network_status.txt")),
    // RFC 6585's Network Authentication Required.
    ("HTTP/1.1 511 Network Authentication Required\nContent-Type: text/html\n\n<title>Login</title>",
     .portal(url: "http://nmcheck.gnome.org/check_network_status.txt")),
    // A Location that is no URL (control characters, another scheme): the portal, at the check's URL.
    ("HTTP/1.1 302 Found\nLocation: javascript:alert(1)\n\n", .portal(url: "http://nmcheck.gnome.org/check_network_status.txt")),
    ("HTTP/1.1 302 Found\nLocation: \u{1b}[31mhttp://x/\n\n", .portal(url: "http://nmcheck.gnome.org/check_network_status.txt")),
    // The check's own server failing is no portal.
    ("HTTP/1.1 503 Service Unavailable\n\n", .unknown("nmcheck.gnome.org answered 503")),
])
func theCheckReadsWhatNetworksAnswer(text: String, expected: Connectivity) {
    #expect(PortalCheck.standard.judge(answer(text)) == expected)
}

@Test(arguments: [
    [UInt8](), Array("SSH-2.0-OpenSSH_9.2\r\n".utf8), [0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03],
    Array("HTTP/1.1 2000 OK\r\n\r\n".utf8), Array("HTTP/9 200\r\n\r\n".utf8),
])
func garbageIsNeitherOnlineNorAPortal(bytes: [UInt8]) {
    guard case .unknown(let why) = PortalCheck.standard.judge(bytes) else { Issue.record("judged \(bytes) as known"); return }
    #expect(why.contains("not HTTP"))
}

@Test func aStatusCheckWantsItsStatus() {
    let check = PortalCheck(url: CheckURL("http://connectivitycheck.gstatic.com/generate_204")!, expect: .status(204))
    #expect(check.judge(answer("HTTP/1.1 204 No Content\nContent-Length: 0\n\n")) == .online)
    #expect(check.judge(answer("HTTP/1.1 200 OK\n\nwelcome")) == .portal(url: "http://connectivitycheck.gstatic.com/generate_204"))
}

@Test(arguments: [
    ("http://nmcheck.gnome.org/check_network_status.txt", "nmcheck.gnome.org", 80, "/check_network_status.txt"),
    ("http://192.0.2.1:8080", "192.0.2.1", 8080, "/"),
    ("http://[2001:db8::1]/x?y=1#frag", "2001:db8::1", 80, "/x?y=1"),
    ("http://example.com?q", "example.com", 80, "/?q"),
])
func checkURLs(text: String, host: String, port: Int, target: String) {
    let url = CheckURL(text)
    #expect(url?.host == host && url?.port == UInt16(port) && url?.target == target)
}

/// An `https://` URL is a pinned probe's: port 443 unless given, and the request's Host says
/// no port then.
@Test func anHTTPSURLIsAPinnedProbes() {
    let url = CheckURL("https://probe.corp.example/roam")
    #expect(url?.isHTTPS == true && url?.port == 443 && url?.target == "/roam")
    #expect(url?.request.hasPrefix("GET /roam HTTP/1.1\r\nHost: probe.corp.example\r\n") == true)
    #expect(CheckURL("https://10.20.0.1:8443/")?.request.contains("Host: 10.20.0.1:8443\r\n") == true)
    #expect(CheckURL("http://example.com/")?.isHTTPS == false)
}

@Test(arguments: ["https://", "ftp://x/", "http://", "http://user@host/", "http://a b/", "http://host:0/", "example.com"])
func checkURLsThatAreRefused(text: String) {
    #expect(CheckURL(text) == nil)
}

@Test func theRequestIsPlainHTTP11() {
    let request = CheckURL("http://[2001:db8::1]:8080/c")!.request
    #expect(request.hasPrefix("GET /c HTTP/1.1\r\nHost: [2001:db8::1]:8080\r\n"))
    #expect(request.hasSuffix("Connection: close\r\n\r\n"))
}
