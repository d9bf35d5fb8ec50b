// libFuzzer's entry and, built plainly, a runner for its inputs:
//   ProtocolFuzz --seeds DIR     writes the real messages (selector byte first) into DIR, the
//                                fuzzer's starting corpus
//   ProtocolFuzz FILE...         feeds each file to the harness, as the fuzzer would
// Under libFuzzer (scripts/fuzz protocol builds with -DFUZZING) only the entry below is compiled
// in; libFuzzer brings its own main.
import Basics
import FuzzInputs
import Glibc

nonisolated(unsafe) var harness: Harness?  // libFuzzer calls the entry from one thread

func complain(_ message: String) { complain("ProtocolFuzz", message) }

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOne(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    // A fresh pair of cores every 100,000 inputs (100 s of their clock): the session never gets
    // old enough to expire, so every input meets a live one.
    if harness == nil || harness!.inputs >= 100_000 {
        do { harness = try Harness() } catch { preconditionFailure("the harness could not start: \(error)") }
    }
    harness!.feed(UnsafeBufferPointer(start: data, count: size))
    return 0
}

#if !FUZZING
@main
struct Runner {
    static func main() {
        let arguments = Array(CommandLine.arguments.dropFirst())
        if arguments.first == "--seeds", arguments.count == 2 {
            let seeds: [(selector: UInt8, datagram: [UInt8])]
            do {
                seeds = try Harness().seeds
            } catch {
                complain("the harness could not start: \(error)")
                exit(1)
            }
            for (i, seed) in seeds.enumerated() {
                let path = arguments[1] + "/seed-\(i)"
                guard let file = fopen(path, "wb") else {
                    complain("cannot write \(path)")
                    exit(1)
                }
                let bytes = [seed.selector] + seed.datagram
                fwrite(bytes, 1, bytes.count, file)
                fclose(file)
            }
            print("ProtocolFuzz: \(seeds.count) seeds in \(arguments[1])")
        } else if arguments.isEmpty || arguments.first?.hasPrefix("-") == true {
            complain("usage: ProtocolFuzz --seeds DIR | ProtocolFuzz FILE...")
            exit(2)
        } else {
            exit(replayInputs("ProtocolFuzz", arguments) { input in
                if let base = input.baseAddress { _ = fuzzOne(base, input.count) }
            })
        }
    }
}
#endif
