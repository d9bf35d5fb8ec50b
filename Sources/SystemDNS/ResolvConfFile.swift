import Glibc
public import Basics

/// /etc/resolv.conf written for the tunnel, on machines without systemd-resolved.
///
/// The file it replaces is kept inside the new one, as comment lines, and put back on stop: one
/// file holds all the state, so the original survives a crash, a `kill -9` or a reboot, and an
/// agent that starts over its predecessor's file adopts what it saved. A file someone else
/// writes meanwhile (a DHCP client renewing its lease) becomes the new original at the next
/// `apply`; a file someone else wrote is never "restored" over.
public struct ResolvConfFile: Sendable {
    public let path: String

    public init(path: String = "/etc/resolv.conf") { self.path = path }

    static let header = "# Written by roam for its tunnel"
    /// A saved line of the previous file.
    static let savedLine = "#roam-saved: "
    /// The previous file was a symbolic link to this target.
    static let savedLink = "#roam-saved-link: "
    /// There was no previous file.
    static let savedNothing = "#roam-saved-nothing"

    /// What was at `path` before the agent wrote it.
    enum Original: Equatable {
        case text(String)
        case link(String)
        case nothing
    }

    /// Writes the tunnel's resolvers, saving what was there first; false when the file already said it.
    @discardableResult
    public func apply(_ settings: DNSSettings, tunnel: String) throws(SystemError) -> Bool {
        let original: Original
        switch try current() {
        case .link(let target): original = .link(target)
        case .text(let text): original = Self.original(in: text) ?? .text(text)
        case .nothing: original = .nothing
        }
        let text = Self.render(settings, tunnel: tunnel, keeping: original)
        if case .text(text) = try current() { return false }
        try replace(with: text)
        return true
    }

    /// Whether the file says what `apply` would write now: nobody replaced it since.
    public func holds(_ settings: DNSSettings, tunnel: String) -> Bool {
        guard case .text(let text)? = try? current(), let original = Self.original(in: text) else { return false }
        return text == Self.render(settings, tunnel: tunnel, keeping: original)
    }

    /// Puts the previous file back, when the file is still the agent's; false when there was nothing to do.
    @discardableResult
    public func restore() throws(SystemError) -> Bool {
        guard case .text(let text) = try current(), let original = Self.original(in: text) else { return false }
        switch original {
        case .text(let saved): try replace(with: saved)
        case .link(let target):
            // symlink() never follows what is there: a name planted in advance only makes it fail.
            let temporary = SystemFiles.temporaryName(beside: path)
            guard symlink(target, temporary) == 0 else {
                // Only the file itself writable (its directory read-only): give it the link's text.
                guard errno == EROFS else { throw SystemError("symlink \(temporary)", errno) }
                try overwrite(with: Self.untrimmedText(Self.resolve(target, from: path)) ?? "")
                return true
            }
            if rename(temporary, path) != 0 {
                let error = errno
                unlink(temporary)
                // A file mounted over (a container's, `ip netns exec`'s) cannot become a link: give it the link's text.
                guard error == EBUSY else { throw SystemError("rename \(temporary)", error) }
                try overwrite(with: Self.untrimmedText(Self.resolve(target, from: path)) ?? "")
            }
        case .nothing:
            if unlink(path) != 0 {
                guard errno == EBUSY else { throw SystemError("unlink \(path)", errno) }
                try overwrite(with: "")
            }
        }
        return true
    }

    /// The system's own configuration: the saved original while the agent's file is in place.
    public static func systemText(at path: String) -> String? {
        guard let text = untrimmedText(path) else { return nil }
        switch original(in: text) {
        case nil: return text
        case .text(let saved)?: return saved
        case .link(let target)?: return untrimmedText(resolve(target, from: path))
        case .nothing?: return ""
        }
    }

    // MARK: The file's text

    /// The resolvers a resolv.conf's text names, in order (its `nameserver` lines).
    public static func nameservers(in text: String) -> [String] {
        text.split(separator: "\n").compactMap { line in
            let words = line.split(whereSeparator: { $0 == " " || $0 == "\t" })
            return words.count >= 2 && words[0] == "nameserver" ? String(words[1]) : nil
        }
    }

    static func render(_ settings: DNSSettings, tunnel: String, keeping original: Original) -> String {
        var lines = ["\(header) \(tunnel); the previous file is kept below and put back when roam stops."]
        lines += settings.resolvers.map { "nameserver \($0)" }
        if !settings.searchDomains.isEmpty { lines.append("search " + settings.searchDomains.joined(separator: " ")) }
        switch original {
        case .text(let text): lines += lineList(text).map { savedLine + $0 }
        case .link(let target): lines.append(savedLink + target)
        case .nothing: lines.append(savedNothing)
        }
        return lines.joined(separator: "\n") + "\n"
    }

    /// The lines of `text`, split at every line feed: a `\r\n` (one Character in Swift) must not
    /// hide a line of the saved file inside the one before it, where it would be live.
    private static func lineList(_ text: String) -> [Substring] {
        var lines = text.unicodeScalars.split(separator: "\n", omittingEmptySubsequences: false).map(Substring.init)
        if lines.last == "" { lines.removeLast() }
        return lines
    }

    /// What a file the agent wrote saved; nil for anyone else's file. Its lines are read by their
    /// bytes: a saved line that starts with a combining mark would otherwise join the marker's
    /// last space into one character and be lost.
    static func original(in text: String) -> Original? {
        guard text.startsExactly(with: header) else { return nil }
        var saved: [Substring] = []
        for line in lineList(text) {
            if line.startsExactly(with: savedLink) { return .link(String(line.droppingExactly(savedLink))) }
            if line.isExactly(savedNothing) { return .nothing }
            if line.startsExactly(with: savedLine) { saved.append(line.droppingExactly(savedLine)) }
        }
        return .text(saved.map { $0 + "\n" }.joined())
    }

    // MARK: The file system

    private enum Current { case text(String), link(String), nothing }

    private func current() throws(SystemError) -> Current {
        var info = stat()
        guard lstat(path, &info) == 0 else {
            guard errno == ENOENT else { throw SystemError("stat \(path)", errno) }
            return .nothing
        }
        if info.st_mode & S_IFMT == S_IFLNK {
            var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
            let length = readlink(path, &buffer, buffer.count - 1)
            guard length >= 0 else { throw SystemError("readlink \(path)", errno) }
            return .link(String(decoding: buffer[0..<length].map { UInt8(bitPattern: $0) }, as: UTF8.self))
        }
        guard let text = Self.untrimmedText(path) else { throw SystemError("read \(path)", errno) }
        return .text(text)
    }

    /// Swaps in a new file whole, so a reader never sees half of one; in place when `path` is
    /// mounted over (rename gives EBUSY), as in containers and `ip netns exec`, or when only the
    /// file itself may be written (its directory read-only: EROFS, as under the service's
    /// `ProtectSystem=strict` with `ReadWritePaths=/etc/resolv.conf`).
    private func replace(with text: String) throws(SystemError) {
        do throws(FileWriteError) {
            // resolv.conf is read by every program: world-readable whatever the umask.
            try SystemFiles.write(text, to: path, mode: 0o644)
        } catch where (error.step == .rename && error.code == EBUSY) || (error.step == .create && error.code == EROFS) {
            try overwrite(with: text)
        } catch {
            throw SystemError(error.operation, error.code)
        }
    }

    private func overwrite(with text: String) throws(SystemError) {
        let fd = open(path, O_WRONLY | O_CLOEXEC | O_TRUNC | O_NOFOLLOW)
        guard fd >= 0 else { throw SystemError("open \(path)", errno) }
        defer { close(fd) }
        guard fchmod(fd, 0o644) == 0 else { throw SystemError("chmod \(path)", errno) }
        if let failure = writeAll(text, to: fd) { throw SystemError("write \(path)", failure) }
        guard fsync(fd) == 0 else { throw SystemError("fsync \(path)", errno) }
    }

    /// A file's text exactly as it is (`SystemFiles.text` trims).
    private static func untrimmedText(_ path: String) -> String? {
        SystemFiles.bytes(path, limit: 1 << 20).map { String(decoding: $0, as: UTF8.self) }
    }

    /// A link target as a path: relative targets count from the link's directory.
    private static func resolve(_ target: String, from link: String) -> String {
        target.startsExactly(with: "/") ? target : link.parentDirectory + "/" + target
    }
}

/// A system call that failed, named with its errno.
public struct SystemError: Error, CustomStringConvertible {
    public var operation: String
    public var code: Int32

    public init(_ operation: String, _ code: Int32) {
        self.operation = operation
        self.code = code
    }

    public var description: String { "\(operation): \(String(cString: strerror(code)))" }
}
