import Topology

/// The probes out and the path each went on: an echo names only its probe's id, and an echo of
/// an id not here (stale, from before the server moved, or made up) proves nothing.
struct ProbesInFlight: Sendable {
    private var sent: [UInt64: (path: Path.ID, size: Int?)] = [:]
    private var next: UInt64 = 1
    /// At most this many probes are remembered; the oldest is forgotten first.
    static let kept = 64

    /// A new probe's id, remembered with the path it goes on and its size (nil: a small probe).
    mutating func remember(_ path: Path.ID, size: Int?) -> UInt64 {
        let id = next
        next += 1
        sent[id] = (path, size)
        if sent.count > Self.kept, let oldest = sent.keys.min() { sent[oldest] = nil }
        return id
    }

    /// The path and size probe `id` went with, if it is still out; it is out no longer.
    mutating func answered(_ id: UInt64) -> (path: Path.ID, size: Int?)? {
        sent.removeValue(forKey: id)
    }

    /// Forgets the probes sent on `path`.
    mutating func forget(on path: Path.ID) {
        sent = sent.filter { $0.value.path != path }
    }

    mutating func removeAll() {
        sent.removeAll()
    }
}
