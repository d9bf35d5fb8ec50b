import Basics
@testable import SystemDNS

/// libFuzzer's entry: every input is the resolv.conf the system had before the tunnel came up.
/// Saved inside the agent's own file and read back, it must come back byte for byte (with a line
/// end after its last line), whatever it holds: combining marks, carriage returns, the agent's
/// own markers, any script.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOne(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let text = String(decoding: UnsafeBufferPointer(start: data, count: size), as: UTF8.self)
    let written = ResolvConfFile.render(.none, tunnel: "roam0", keeping: .text(text))
    let expected = text.isEmpty || text.utf8.last == UInt8(ascii: "\n") ? text : text + "\n"
    guard case .text(let saved)? = ResolvConfFile.original(in: written), saved.utf8.elementsEqual(expected.utf8) else {
        fatalError("the saved resolv.conf did not come back byte for byte: \(Array(text.unicodeScalars))")
    }
    return 0
}
