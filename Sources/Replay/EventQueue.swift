import Basics
import Reconnector
import Topology

/// Where the server last heard the agent from: the path, the agent's socket on it, and the NAT's
/// mapping of the link.
struct ClientEndpoint: Equatable {
    var path: Path.ID
    var socket: Int
    var mapping: Int
}

/// A min-heap of pending events, ordered by time and then by insertion.
struct EventQueue {
    enum What {
        case timeline(Int)
        /// A timer of the core's, armed for `at` on the agent's clock.
        case timer(TimerKind, at: Instant)
        case deliver(AgentEvent, generation: Int, via: Path.ID)
        /// A probe's echo (`size`: the tunnel packet a padded probe stood for, nil for a small
        /// one): the core knows which path its id went on.
        case echo(UInt64, rtt: Duration, size: Int?, via: Path.ID)
        /// What an effect produced after a while in the world (a connectivity check's result, a
        /// look-up's answer, a probe's), or a kernel notice of a network's facts, fed as it
        /// arrives. What the runner has at once is fed with the effects that asked (`perform`).
        case answer(AgentEvent)
        /// The application's next packet, of the stream's generation.
        case traffic(Int)
        /// The server's next packet, of its stream's generation.
        case serverTraffic(Int)
        /// A packet the server started arrives at that endpoint.
        case fromServer(ClientEndpoint)
        /// Time to look whether a persistent keepalive is due.
        case keepalive
        /// The agent's stream on the path, the connection `socket`, failed to open or broke.
        case streamBroke(Path.ID, socket: Int, why: String)
        /// Someone fighting the agent takes `Holding` away again.
        case retake(Holding)
        case checkpoint(Int)
        case stateCheck(Int)
        /// The agent restarts itself in place (`Effect.restart`).
        case restartAgent
    }
    struct Entry {
        var at: Instant
        var seq: Int
        var what: What
        func before(_ other: Entry) -> Bool { at != other.at ? at < other.at : seq < other.seq }
    }
    private var heap: [Entry] = []
    private var seq = 0

    mutating func push(_ at: Instant, _ what: What) {
        seq += 1
        heap.append(Entry(at: at, seq: seq, what: what))
        var i = heap.count - 1
        while i > 0 {
            let parent = (i - 1) / 2
            guard heap[i].before(heap[parent]) else { break }
            heap.swapAt(i, parent)
            i = parent
        }
    }

    mutating func pop() -> Entry? {
        guard !heap.isEmpty else { return nil }
        heap.swapAt(0, heap.count - 1)
        let top = heap.removeLast()
        var i = 0
        while true {
            let l = 2 * i + 1, r = l + 1
            var m = i
            if l < heap.count && heap[l].before(heap[m]) { m = l }
            if r < heap.count && heap[r].before(heap[m]) { m = r }
            guard m != i else { break }
            heap.swapAt(i, m)
            i = m
        }
        return top
    }
}
