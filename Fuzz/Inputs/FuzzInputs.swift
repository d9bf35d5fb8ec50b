import Glibc

/// Feeds each file of `paths` to `feed`, as libFuzzer would, for a fuzz target built plainly: a
/// crash the fuzzer found runs again anywhere. Returns the exit status (1: a file unreadable).
public func replayInputs(_ tool: String, _ paths: [String], _ feed: (UnsafeBufferPointer<UInt8>) -> Void) -> Int32 {
    for path in paths {
        guard let file = fopen(path, "rb") else {
            complain(tool, "cannot read \(path)")
            return 1
        }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        while true {
            let n = fread(&chunk, 1, chunk.count, file)
            if n <= 0 { break }
            bytes += chunk[0..<n]
        }
        fclose(file)
        bytes.withUnsafeBufferPointer { feed($0) }
    }
    print("\(tool): \(paths.count) inputs, nothing crashed")
    return 0
}

/// One line on standard error, without Foundation.
public func complain(_ tool: String, _ message: String) {
    let bytes = Array((tool + ": " + message + "\n").utf8)
    _ = write(STDERR_FILENO, bytes, bytes.count)
}
