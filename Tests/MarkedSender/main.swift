import Glibc

// A process that is not the agent borrows the session's mark: `MarkedSender MARK IPV4 PORT COUNT`
// sets MARK on a UDP socket and sends COUNT datagrams to IPV4:PORT. It prints its effective
// capabilities (as /proc/self/status gives them), whether the kernel let it set the mark, and the
// local port it sent from; exit 0 when the mark was set, 2 when not, 1 on a usage mistake.

let arguments = CommandLine.arguments
guard arguments.count == 5, let mark = UInt32(arguments[1].dropFirst(arguments[1].hasPrefix("0x") ? 2 : 0), radix: arguments[1].hasPrefix("0x") ? 16 : 10),
      let port = UInt16(arguments[3]), let count = Int(arguments[4]), count > 0, count <= 100 else {
    print("usage: MarkedSender MARK IPV4 PORT COUNT")
    exit(1)
}
var destination = sockaddr_in()
destination.sin_family = sa_family_t(AF_INET)
destination.sin_port = port.bigEndian
guard inet_pton(AF_INET, arguments[2], &destination.sin_addr) == 1 else {
    print("not an IPv4 address: \(arguments[2])")
    exit(1)
}
if let status = fopen("/proc/self/status", "r") {
    var line = [CChar](repeating: 0, count: 256)
    while fgets(&line, Int32(line.count), status) != nil {
        let text = String(decoding: line.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        if text.hasPrefix("CapEff:") { print("capabilities \(text.dropFirst(7).filter { !$0.isWhitespace })") }
    }
    fclose(status)
}
let fd = socket(AF_INET, Int32(SOCK_DGRAM.rawValue), 0)
guard fd >= 0 else {
    print("socket: \(String(cString: strerror(errno)))")
    exit(1)
}
var value = mark
guard setsockopt(fd, SOL_SOCKET, SO_MARK, &value, socklen_t(MemoryLayout<UInt32>.size)) == 0 else {
    print("mark refused: \(String(cString: strerror(errno)))")
    exit(2)
}
print("mark set")
var bound = sockaddr_in()
bound.sin_family = sa_family_t(AF_INET)
var length = socklen_t(MemoryLayout<sockaddr_in>.size)
_ = withUnsafeMutablePointer(to: &bound) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) } }
_ = withUnsafeMutablePointer(to: &bound) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) } }
print("port \(UInt16(bigEndian: bound.sin_port))")
let payload = Array("in clear".utf8)
for _ in 0..<count {
    let sent = withUnsafePointer(to: &destination) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { sendto(fd, payload, payload.count, 0, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
    }
    print(sent == payload.count ? "sent" : "send: \(String(cString: strerror(errno)))")
}
close(fd)
exit(0)
