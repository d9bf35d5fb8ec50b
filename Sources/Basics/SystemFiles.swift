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

    /// The values of field `name` (`Uid`, `Tgid`, ...) in /proc/PID/status, split at blanks;
    /// nil when the process is gone or has no such field.
    public static func processStatus(_ pid: Int32, _ name: String) -> [Substring]? {
        let key = name + ":"
        return (text("/proc/\(pid)/status") ?? "").split(whereSeparator: \.isNewline).first { $0.hasPrefix(key) }
            .map { $0.dropFirst(key.count).split(whereSeparator: { $0 == " " || $0 == "\t" }) }
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

    /// The host's name as the kernel has it (gethostname); nil when it cannot be read.
    public static func hostName() -> String? {
        var buffer = [CChar](repeating: 0, count: 256)
        guard gethostname(&buffer, buffer.count - 1) == 0 else { return nil }
        return String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    public static func isDirectory(_ path: String) -> Bool {
        var info = stat()
        return stat(path, &info) == 0 && info.st_mode & S_IFMT == S_IFDIR
    }

    /// Writes `text` to `path` through a temporary file, fsync and a rename, so a reader never
    /// sees half a file. The temporary is `temporaryFile(beside:)`; a symbolic link at `path`
    /// itself is replaced, not followed. The file gets `mode`, whatever the umask.
    public static func write(_ text: String, to path: String, mode: UInt32 = 0o644) throws(FileWriteError) {
        let (temporary, fd) = try temporaryFile(beside: path)
        var closed = false
        do throws(FileWriteError) {
            guard fchmod(fd, mode_t(mode)) == 0 else { throw FileWriteError(.write, temporary, errno) }
            if let failure = writeAll(text, to: fd) { throw FileWriteError(.write, temporary, failure) }
            guard fsync(fd) == 0 else { throw FileWriteError(.write, temporary, errno) }
            close(fd)
            closed = true
            guard rename(temporary, path) == 0 else { throw FileWriteError(.rename, temporary, errno, to: path) }
        } catch {
            if !closed { close(fd) }
            unlink(temporary)
            throw error
        }
    }

    /// Writes `text` into the file at `path` in place, with no temporary and rename: a kernel's
    /// file (in /proc, in a cgroup), or with `create` a new file of `mode` where nobody else
    /// writes. A symbolic link at `path` is not followed. Returns the errno on failure.
    public static func overwrite(_ text: String, at path: String, create: Bool = false, mode: UInt32 = 0o644) -> Int32? {
        let fd = open(path, O_WRONLY | O_TRUNC | O_CLOEXEC | O_NOFOLLOW | (create ? O_CREAT : 0), mode_t(mode))
        guard fd >= 0 else { return errno }
        defer { close(fd) }
        return writeAll(text, to: fd)
    }

    /// A new, empty, owner-only file in `path`'s directory, open for writing, under a random
    /// name: nobody can plant a symbolic link at it beforehand to have a privileged writer
    /// follow it (O_EXCL and O_NOFOLLOW refuse whatever is there), and a rename from the same
    /// directory cannot cross file systems.
    static func temporaryFile(beside path: String) throws(FileWriteError) -> (path: String, fileDescriptor: Int32) {
        // A handful of tries: a clash of 64 random bits means someone is guessing, not chance.
        for _ in 0..<4 {
            let temporary = temporaryName(beside: path)
            let fd = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
            if fd >= 0 { return (temporary, fd) }
            guard errno == EEXIST || errno == EINTR else { throw FileWriteError(.create, temporary, errno) }
        }
        throw FileWriteError(.create, temporaryName(beside: path), EEXIST)
    }

    /// A random name in `path`'s directory, for a file or link that replaces `path` by a rename.
    public static func temporaryName(beside path: String) -> String {
        let directory = path.contains("/") ? path.parentDirectory + "/" : ""
        let random = String(UInt64.random(in: .min ... .max), radix: 16)
        return directory + ".roam-" + String(repeating: "0", count: 16 - random.count) + random + ".tmp"
    }
}

/// A file that could not be written: the step that failed, on which file, and the errno.
public struct FileWriteError: Error, CustomStringConvertible, Sendable {
    /// Creating the temporary file, writing it (mode, bytes, fsync), or renaming it into place.
    public enum Step: Sendable { case create, write, rename }
    public var step: Step
    /// The temporary file.
    public var file: String
    public var code: Int32
    /// The file a rename was to replace.
    public var target: String?

    public init(_ step: Step, _ file: String, _ code: Int32, to target: String? = nil) {
        self.step = step
        self.file = file
        self.code = code
        self.target = target
    }

    /// What failed, e.g. `rename /etc/.roam-0123456789abcdef.tmp to /etc/resolv.conf`.
    public var operation: String {
        switch step {
        case .create: return "create \(file)"
        case .write: return "write \(file)"
        case .rename: return "rename \(file) to \(target ?? "its place")"
        }
    }

    public var description: String { "cannot \(operation): \(String(cString: strerror(code)))" }
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
