import CSodium
import CShims
import Glibc
import Synchronization

/// Where secrets live: pages of their own that are locked in RAM (never swapped out, where
/// they could outlive the process) and left out of core dumps (`MADV_DONTDUMP`), cut into
/// fixed slots that are wiped when given back. Keys are made at handshakes, not per packet,
/// so one lock over the free list costs nothing on the data path.
///
/// Pages are taken in chunks as the number of live secrets grows and kept for reuse. A
/// machine whose locked-memory limit is spent still gets the pages (with `MADV_DONTDUMP`),
/// and `unlockedChunks` says so.
final class SecretArena: Sendable {
    let slotSize: Int
    private let chunkSize = 64 * 1024
    private let state = Mutex(State())

    private struct State {
        /// Free slots' addresses (as numbers: a raw pointer is not Sendable).
        var free: [UInt] = []
        var chunks = 0
        var unlocked = 0
        var live = 0
    }

    /// 32-byte keys; up to 1024 bytes for passwords and the payloads that carry them.
    static let keys = SecretArena(slotSize: 32)
    static let buffers = SecretArena(slotSize: 1024)

    /// The shared arenas above serve the process; tests make their own.
    init(slotSize: Int) { self.slotSize = slotSize }

    /// A zeroed slot; nil only when the system has no memory to map.
    func allocate() -> UnsafeMutableRawPointer? {
        let address = state.withLock { s -> UInt? in
            if s.free.isEmpty {
                let chunk = mmap(nil, chunkSize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
                guard let chunk, chunk != MAP_FAILED else { return nil }
                _ = madvise(chunk, chunkSize, MADV_DONTDUMP)
                _ = madvise(chunk, chunkSize, MADV_DONTFORK)
                if mlock(chunk, chunkSize) != 0 { s.unlocked += 1 }
                s.chunks += 1
                let slots = chunkSize / slotSize
                s.free.reserveCapacity(s.free.count + slots)
                let base = UInt(bitPattern: chunk)
                for i in stride(from: slots - 1, through: 0, by: -1) { s.free.append(base + UInt(i * slotSize)) }
            }
            s.live += 1
            return s.free.removeLast()
        }
        return address.flatMap { UnsafeMutableRawPointer(bitPattern: $0) }
    }

    /// Wipes the slot and takes it back.
    func release(_ slot: UnsafeMutableRawPointer) {
        sodium_memzero(slot, slotSize)
        let address = UInt(bitPattern: slot)
        state.withLock { s in
            s.live -= 1
            s.free.append(address)
        }
    }

    /// Slots in use, chunks mapped, and chunks the kernel would not lock.
    var usage: (live: Int, chunks: Int, unlockedChunks: Int) {
        state.withLock { ($0.live, $0.chunks, $0.unlocked) }
    }
}

/// One slot of a secret arena, or of the heap when the arena cannot map another chunk, for a
/// secret its owner writes in place (an expanded key, a private key); wiped and given back when
/// the last reference goes, after the owner's own `deinit` has run.
final class SecretSlot: @unchecked Sendable {  // its owner writes the bytes in its init and only reads them after
    let pointer: UnsafeMutableRawPointer
    /// Where it came from; nil for the heap.
    private let arena: SecretArena?
    private let size: Int

    init(from arena: SecretArena) {
        size = arena.slotSize
        if let slot = arena.allocate() {
            pointer = slot
            self.arena = arena
        } else {
            pointer = .allocate(byteCount: size, alignment: 64)
            self.arena = nil
        }
    }

    deinit {
        if let arena {
            arena.release(pointer)
        } else {
            sodium_memzero(pointer, size)
            pointer.deallocate()
        }
    }
}

/// Variable-length secret bytes (a password, a decrypted payload that holds one), up to 1024,
/// in the secret arena. A class, so that every holder shares the one buffer: `wipe()` clears
/// what everyone sees, and no copy-on-write duplicate is left behind in the heap.
final class SecretBuffer: @unchecked Sendable {  // written in init and zeroed by wipe(): a racing reader sees the secret or zeros
    // Safe to share: the bytes are written in `init` and by `wipe()`, which only zeroes them;
    // a reader racing a wipe sees zeros or the secret, never memory it does not own.
    static let capacity = 1024
    private let slot: UnsafeMutableRawPointer
    private let owned: Bool
    let count: Int

    /// Copies `bytes` (at most 1024 of them); nil when there are more.
    init?(copying bytes: UnsafeRawBufferPointer) {
        guard bytes.count <= Self.capacity else { return nil }
        if let slot = SecretArena.buffers.allocate() {
            self.slot = slot
            owned = false
        } else {
            slot = .allocate(byteCount: Self.capacity, alignment: 16)
            owned = true
        }
        count = bytes.count
        if let base = bytes.baseAddress { slot.copyMemory(from: base, byteCount: bytes.count) }
    }

    /// Moves `bytes` in and wipes the array it came from (which must be its only holder).
    convenience init?(taking bytes: inout [UInt8]) {
        defer { Primitives.wipe(&bytes) }
        self.init(copying: bytes.withUnsafeBytes { $0 })
    }

    deinit {
        if owned {
            sodium_memzero(slot, Self.capacity)
            slot.deallocate()
        } else {
            SecretArena.buffers.release(slot)
        }
    }

    /// Zeroes the bytes for every holder; the length stays.
    func wipe() { sodium_memzero(slot, count) }

    /// True when every byte is zero (after `wipe()`).
    var isWiped: Bool { withBytes { $0.allSatisfy { $0 == 0 } } }

    func withBytes<R>(_ body: (UnsafeRawBufferPointer) throws -> R) rethrows -> R {
        try body(UnsafeRawBufferPointer(start: slot, count: count))
    }

    /// A new buffer holding `range` of this one.
    func slice(_ range: Range<Int>) -> SecretBuffer? {
        withBytes { SecretBuffer(copying: UnsafeRawBufferPointer(rebasing: $0[range])) }
    }
}

/// Process-wide protections for a daemon that holds keys.
public enum ProcessHardening {
    /// No core dumps, no ptrace by other users' processes: a crash must not write the
    /// server's private key or a password to disk. Returns false when the kernel refused.
    @discardableResult
    public static func forbidCoreDumps() -> Bool {
        prctl_set_dumpable_zero() == 0
    }

    /// Whether this process may dump core (false after `forbidCoreDumps()`).
    public static var isDumpable: Bool { prctl_get_dumpable() != 0 }
}
