import Glibc
import Basics

/// Tells when the system's resolver configuration may have changed: /etc/resolv.conf, every
/// file its symbolic links lead to (systemd-resolved's, NetworkManager's), and the file the
/// agent's own resolv.conf keeps as the original, each written or replaced. inotify watches
/// their directories, since these files are mostly replaced by a rename.
public final class ResolvConfWatch {
    private let descriptor: Int32
    private let path: String
    /// The names looked for in each watched directory.
    private var names: [Int32: Set<String>] = [:]
    /// Watches on the files themselves: a file bind-mounted elsewhere (as `ip netns exec` does)
    /// or written in place tells its own watch, not its directory's.
    private var files: Set<Int32> = []

    public init(path: String = "/etc/resolv.conf") throws(SystemError) {
        descriptor = inotify_init1(Int32(IN_NONBLOCK | IN_CLOEXEC))
        guard descriptor >= 0 else { throw SystemError("inotify_init1", errno) }
        self.path = path
        rearm()
    }

    deinit { close(descriptor) }

    /// The descriptor to poll for readiness.
    public var fileDescriptor: Int32 { descriptor }

    /// Reads what is queued, without waiting; true when something happened to one of the files
    /// (or the queue overflowed, which may have hidden that).
    public func changed() -> Bool {
        var buffer = [UInt8](repeating: 0, count: 4096)
        var changed = false
        for _ in 0..<64 {
            let n = buffer.withUnsafeMutableBytes { read(descriptor, $0.baseAddress, $0.count) }
            guard n > 0 else { break }
            for event in Self.events(buffer[0..<n]) {
                if event.overflow || names[event.watch]?.contains(event.name) == true
                    || (files.contains(event.watch) && !event.ignored) { changed = true }
            }
        }
        // A link may point elsewhere now.
        if changed { rearm() }
        return changed
    }

    /// Watches the directory of every file the configuration comes from now.
    private func rearm() {
        var files: [String] = []
        var next: String? = path
        for _ in 0..<8 {
            guard let file = next, !files.contains(file) else { break }
            files.append(file)
            next = Self.linkTarget(of: file)
        }
        if let text = SystemFiles.text(path), case .link(let target)? = ResolvConfFile.original(in: text) {
            files.append(target.startsExactly(with: "/") ? target : path.parentDirectory + "/" + target)
        }
        var directories: [Int32: Set<String>] = [:]
        var own: Set<Int32> = []
        for file in files {
            let directory = file.parentDirectory.isEmpty ? "/" : file.parentDirectory
            let mask = UInt32(IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_MOVED_FROM)
            let watch = inotify_add_watch(descriptor, directory, mask)
            if watch >= 0 { directories[watch, default: []].insert(String(file.split(separator: "/").last ?? "")) }
            let fileWatch = inotify_add_watch(descriptor, file, UInt32(IN_CLOSE_WRITE | IN_MOVE_SELF | IN_DELETE_SELF))
            if fileWatch >= 0 { own.insert(fileWatch) }
        }
        // Where the links led before and lead no more.
        for watch in Set(names.keys).union(self.files) where directories[watch] == nil && !own.contains(watch) {
            inotify_rm_watch(descriptor, watch)
        }
        names = directories
        self.files = own
    }

    /// Whether the file (what its links lead to) was last written before this boot: what it
    /// says is about the network of an earlier one.
    public static func writtenBeforeBoot(path: String = "/etc/resolv.conf") -> Bool {
        var info = stat()
        var now = timespec(), sinceBoot = timespec()
        guard stat(path, &info) == 0, clock_gettime(CLOCK_REALTIME, &now) == 0,
              clock_gettime(CLOCK_BOOTTIME, &sinceBoot) == 0 else { return false }
        return info.st_mtim.tv_sec < now.tv_sec - sinceBoot.tv_sec
    }

    private static func linkTarget(of file: String) -> String? {
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX))
        let n = readlink(file, &buffer, buffer.count - 1)
        guard n > 0 else { return nil }
        let target = String(decoding: buffer[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
        return target.startsExactly(with: "/") ? target : file.parentDirectory + "/" + target
    }

    /// One `struct inotify_event`: its watch, and the name it carries (empty for none).
    struct Event: Equatable {
        var watch: Int32
        var name: String
        var overflow: Bool
        /// The watch is gone (its file was removed): no change by itself.
        var ignored: Bool
    }

    /// Splits what one `read` returned into its events (`wd`, `mask`, `cookie`, `len`, then
    /// `len` bytes of NUL-padded name); a truncated one ends the list.
    static func events(_ bytes: ArraySlice<UInt8>) -> [Event] {
        let b = Array(bytes)
        func u32(_ at: Int) -> UInt32 { b.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: at, as: UInt32.self) } }
        var events: [Event] = []
        var offset = 0
        while offset + 16 <= b.count {
            let length = Int(u32(offset + 12))
            guard offset + 16 + length <= b.count else { break }
            let name = b[offset + 16..<offset + 16 + length].prefix { $0 != 0 }
            let mask = u32(offset + 4)
            events.append(Event(watch: Int32(bitPattern: u32(offset)), name: String(decoding: name, as: UTF8.self),
                                overflow: mask & UInt32(IN_Q_OVERFLOW) != 0, ignored: mask & UInt32(IN_IGNORED) != 0))
            offset += 16 + length
        }
        return events
    }
}
