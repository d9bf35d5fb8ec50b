import Glibc

/// Small files and directories read and written with plain system calls: sysfs attributes,
/// configuration files, keys. Nothing here needs more than the C library.
public enum SystemFiles {
    /// The bytes of the file at `path`, at most `limit` of them; nil when it cannot be read.
    public static func bytes(_ path: String, limit: Int = 16 << 20) -> [UInt8]? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var result: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while result.count < limit {
            let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, min($0.count, limit - result.count)) }
            if n < 0 && errno == EINTR { continue }
            guard n >= 0 else { return nil }
            if n == 0 { break }
            result += chunk[0..<n]
        }
        return result
    }

    /// The file's text with surrounding whitespace removed (sysfs attributes end in a newline).
    public static func text(_ path: String) -> String? {
        bytes(path, limit: 1 << 20).map { String(decoding: $0, as: UTF8.self).trimmed }
    }

    /// The names in `directory` (without `.` and `..`); nil when it cannot be listed.
    public static func names(in directory: String) -> [String]? {
        guard let dir = opendir(directory) else { return nil }
        defer { closedir(dir) }
        var names: [String] = []
        while let entry = readdir(dir) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
            }
            if name != "." && name != ".." { names.append(name) }
        }
        return names.sorted()
    }

    public static func isDirectory(_ path: String) -> Bool {
        var info = stat()
        return stat(path, &info) == 0 && info.st_mode & S_IFMT == S_IFDIR
    }

    /// Writes `text` to `path` through a temporary file and a rename, so a reader never sees
    /// half a file. Returns the errno on failure.
    public static func write(_ text: String, to path: String, mode: UInt32 = 0o644) -> Int32? {
        let temporary = path + ".tmp-\(getpid())"
        let fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode_t(mode))
        guard fd >= 0 else { return errno }
        if let failure = writeAll(text, to: fd) {
            close(fd)
            unlink(temporary)
            return failure
        }
        close(fd)
        guard rename(temporary, path) == 0 else {
            let failure = errno
            unlink(temporary)
            return failure
        }
        return nil
    }
}

extension String {
    /// The text without leading and trailing whitespace and newlines.
    public var trimmed: String {
        let scalars = unicodeScalars
        guard let first = scalars.firstIndex(where: { !$0.properties.isWhitespace }),
              let last = scalars.lastIndex(where: { !$0.properties.isWhitespace }) else { return "" }
        return String(scalars[first...last])
    }

    /// The text up to the last `/` (empty when there is none), as `dirname` without the dots.
    public var parentDirectory: String {
        guard let slash = lastIndex(of: "/") else { return "" }
        return String(self[..<slash])
    }
}

/// Writes all of `text` to `fd`, retrying short writes and signals; returns the errno on failure.
@discardableResult
public func writeAll(_ text: String, to fd: Int32) -> Int32? {
    let bytes = Array(text.utf8)
    var offset = 0
    while offset < bytes.count {
        let n = bytes.withUnsafeBytes { Glibc.write(fd, $0.baseAddress! + offset, $0.count - offset) }
        if n < 0 && errno == EINTR { continue }
        guard n > 0 else { return errno }
        offset += n
    }
    return nil
}

/// Writes to standard error with one system call for a short line, so lines from several
/// threads never mix.
public func writeStandardError(_ text: String) { writeAll(text, to: 2) }
