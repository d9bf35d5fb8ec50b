// Built plainly, a runner for the fuzzer's inputs: `StreamsFuzz FILE...` feeds each file to the
// entry (Harness.swift), as libFuzzer would. Under libFuzzer (scripts/fuzz streams builds with
// -DFUZZING) only the entry is compiled in; libFuzzer brings its own main.
#if !FUZZING
import FuzzInputs
import Glibc

@main
struct Runner {
    static func main() {
        let paths = Array(CommandLine.arguments.dropFirst())
        guard !paths.isEmpty, paths.first?.hasPrefix("-") == false else {
            complain("StreamsFuzz", "usage: StreamsFuzz FILE...")
            exit(2)
        }
        exit(replayInputs("StreamsFuzz", paths) { input in
            if let base = input.baseAddress { _ = fuzzOne(base, input.count) }
        })
    }
}
#endif
