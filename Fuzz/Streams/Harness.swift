import Basics
import Device
import Streams

/// libFuzzer's entry: every input is what a stream or a proxy could send. Its first byte says in
/// pieces of how many bytes the rest arrives. Cut into messages by the stream's reader, the
/// messages must be exactly the frames the bytes hold (each as long as its length says, taken
/// from the bytes in order, none past the end); read as a proxy's answer to CONNECT, only a 2xx
/// status line may open the tunnel.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOne(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    guard size > 0 else { return 0 }
    let piece = Int(data[0]) * 64 + 1
    let bytes = UnsafeBufferPointer(start: data + 1, count: size - 1)

    // The frames as the bytes define them, the reference the reader must match.
    var expected: [ArraySlice<UInt8>] = []
    var offset = 0
    while offset + 2 <= bytes.count {
        let length = Int(bytes[offset]) << 8 | Int(bytes[offset + 1])
        guard offset + 2 + length <= bytes.count else { break }
        if length > 0 { expected.append(Array(bytes)[(offset + 2)..<(offset + 2 + length)]) }
        offset += 2 + length
    }
    var reader = FrameReader()
    var got: [[UInt8]] = []
    var fed = 0
    while fed < bytes.count {
        let space = reader.space()
        guard space.count > 0 else { fatalError("the reader has no room with \(reader.buffered) bytes held") }
        let n = min(piece, bytes.count - fed, space.count)
        space.baseAddress!.copyMemory(from: bytes.baseAddress! + fed, byteCount: n)
        reader.received(n)
        fed += n
        while let message = reader.next() { got.append(Array(message)) }
    }
    guard got.count == expected.count, zip(got, expected).allSatisfy({ $0.elementsEqual($1) }) else {
        fatalError("the reader made \(got.count) messages of \(expected.count)")
    }

    let proxy = HTTPProxy(address: SocketAddress(IPAddress("192.0.2.8")!, port: 3128))
    if proxy.refusal(in: Array(bytes)) == nil {
        let line = String(decoding: bytes.prefix { $0 != UInt8(ascii: "\r") && $0 != UInt8(ascii: "\n") }, as: UTF8.self)
        let words = line.split(separator: " ")
        guard words.count >= 2, words[0].hasPrefix("HTTP/1."), words[1].count == 3, words[1].hasPrefix("2"),
              words[1].allSatisfy(\.isASCII), Int(words[1]) != nil else {
            fatalError("a proxy's answer that is no 2xx opened the tunnel: \(Array(line.utf8))")
        }
    }
    return 0
}
