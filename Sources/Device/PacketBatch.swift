import Topology
import CShims
import Glibc
public import Basics
import Netlink

/// Preallocated room for a batch of packets, read or sent with one system call
/// (`recvmmsg`/`sendmmsg` on a UDP socket; one read or write per packet on the TUN device):
/// `capacity` slots of `slotSize` bytes, each with its length and, for UDP, its peer.
/// Allocated once and reused, so the data path allocates nothing per packet.
public final class PacketBatch {
    /// Bytes per slot: a full-size tunnel packet (MTU 1420 plus headers) with room to spare.
    public static let slotSize = 2048
    /// The most slots one `sendmmsg`/`recvmmsg` call takes (`UIO_MAXIOV`).
    public static let maximumCapacity = 1024

    public let capacity: Int
    /// Bytes per slot of this batch: `slotSize`, or up to 64 KB for datagrams the kernel joins
    /// (UDP_GRO).
    public let slotBytes: Int
    /// Slots in use, from the front.
    public private(set) var count = 0

    private let data: UnsafeMutableRawPointer
    // The kernel's view of each slot. A slot's length lives in its iovec, and its peer in its
    // name (msg_name nil: no peer), so a batch received can be sent on as it is.
    let messages: UnsafeMutablePointer<CShims_mmsghdr>
    private let vectors: UnsafeMutablePointer<iovec>
    private let names: UnsafeMutablePointer<sockaddr_in6>
    /// Each slot's control message: where a received datagram was sent to, or the address to
    /// send one from (IP_PKTINFO).
    private let controls: UnsafeMutableRawPointer
    /// The address each slot is to be sent from (`setSource`), as given.
    private var sources: [IPAddress?]
    /// Which packets go to a stream's far end (`SocketAddress.overStream`), which the kernel's
    /// address cannot say; and how many do.
    private var overStream: [Bool]
    public private(set) var streamPeers = 0
    /// Runs of slots sent as one message each with UDP segmentation offload (`prepareRuns`):
    /// their messages, control messages and datagram counts.
    let runs: UnsafeMutablePointer<CShims_mmsghdr>
    private let runControls: UnsafeMutableRawPointer
    private(set) var runLengths: [Int]
    /// The most datagrams one segmented send may carry (the kernel's UDP_MAX_SEGMENTS is 64 or more).
    static let maxSegments = 64
    /// The most bytes one segmented send may carry: a UDP datagram's.
    static let maxRunBytes = 65_000

    /// A batch of `capacity` slots, clamped to 1...`maximumCapacity`.
    public init(capacity: Int = 32, slotBytes: Int = PacketBatch.slotSize) {
        self.capacity = min(max(capacity, 1), Self.maximumCapacity)
        self.slotBytes = min(max(slotBytes, Self.slotSize), 65_536)
        data = .allocate(byteCount: self.capacity * self.slotBytes, alignment: 16)
        messages = .allocate(capacity: self.capacity)
        vectors = .allocate(capacity: self.capacity)
        names = .allocate(capacity: self.capacity)
        controls = .allocate(byteCount: self.capacity * Int(CSHIMS_OFFLOAD_SPACE), alignment: 16)
        sources = [IPAddress?](repeating: nil, count: self.capacity)
        overStream = [Bool](repeating: false, count: self.capacity)
        runs = .allocate(capacity: self.capacity)
        runControls = .allocate(byteCount: self.capacity * Int(CSHIMS_OFFLOAD_SPACE), alignment: 16)
        runLengths = [Int](repeating: 0, count: self.capacity)
        for i in 0..<self.capacity {
            vectors[i] = iovec(iov_base: data + i * self.slotBytes, iov_len: 0)
            names[i] = sockaddr_in6()
            messages[i] = CShims_mmsghdr(msg_hdr: msghdr(), msg_len: 0)
            messages[i].msg_hdr.msg_iov = vectors + i
            messages[i].msg_hdr.msg_iovlen = 1
        }
    }

    deinit {
        data.deallocate()
        messages.deallocate()
        vectors.deallocate()
        names.deallocate()
        controls.deallocate()
        runs.deallocate()
        runControls.deallocate()
    }

    /// Groups the batch into runs of datagrams for one peer, from one source, of one length (the
    /// last of a run may be shorter), each to go as one message that the kernel cuts into
    /// datagrams (UDP_SEGMENT); returns how many runs. `runLengths` says how many datagrams each has.
    func prepareRuns() -> Int {
        var runCount = 0
        var i = 0
        while i < count {
            let size = vectors[i].iov_len
            var j = i + 1
            var bytes = size
            while j < count, j - i < Self.maxSegments, bytes + vectors[j].iov_len <= Self.maxRunBytes,
                  vectors[j].iov_len <= size, sameDestination(i, j) {
                bytes += vectors[j].iov_len
                j += 1
                if vectors[j - 1].iov_len < size { break }  // a shorter one ends the run
            }
            let n = j - i
            runs[runCount] = CShims_mmsghdr(msg_hdr: messages[i].msg_hdr, msg_len: 0)
            runs[runCount].msg_hdr.msg_iov = vectors + i
            runs[runCount].msg_hdr.msg_iovlen = n
            let control = runControls + runCount * Int(CSHIMS_OFFLOAD_SPACE)
            if let source = sources[i] {
                source.withNetworkBytes { family, address in
                    CShims_write_offload(&runs[runCount].msg_hdr, control, n > 1 ? UInt16(size) : 0, family, address)
                }
            } else {
                CShims_write_offload(&runs[runCount].msg_hdr, control, n > 1 ? UInt16(size) : 0, 0, nil)
            }
            runLengths[runCount] = n
            runCount += 1
            i = j
        }
        return runCount
    }

    /// Whether slots `i` and `j` go to the same peer from the same source.
    private func sameDestination(_ i: Int, _ j: Int) -> Bool {
        let a = messages[i].msg_hdr, b = messages[j].msg_hdr
        guard a.msg_namelen == b.msg_namelen, sources[i] == sources[j] else { return false }
        guard let x = a.msg_name, let y = b.msg_name else { return a.msg_name == nil && b.msg_name == nil }
        return memcmp(x, y, Int(a.msg_namelen)) == 0
    }

    public var isFull: Bool { count == capacity }

    /// The bytes of packet `index` (< `count`), valid until the batch is next filled.
    public func packet(at index: Int) -> UnsafeRawBufferPointer {
        precondition(index < count, "packet \(index) of a batch of \(count)")
        return UnsafeRawBufferPointer(start: vectors[index].iov_base, count: vectors[index].iov_len)
    }

    /// The whole slot of packet `index` (< `count`), writable: the packet is its first
    /// `packet(at:).count` bytes, and a decryption in place stays inside it.
    public func slot(at index: Int) -> UnsafeMutableRawBufferPointer {
        precondition(index < count, "slot \(index) of a batch of \(count)")
        return UnsafeMutableRawBufferPointer(start: vectors[index].iov_base, count: slotBytes)
    }

    /// Where packet `index` (< `count`) came from or goes to; nil for TUN packets.
    public func peer(at index: Int) -> SocketAddress? {
        precondition(index < count, "peer \(index) of a batch of \(count)")
        let header = messages[index].msg_hdr
        guard header.msg_name != nil, var peer = SocketAddress(reading: names + index, length: header.msg_namelen) else { return nil }
        peer.overStream = overStream[index]
        return peer
    }

    /// The address packet `index` (< `count`) was sent to, when the socket reports it (a server's
    /// socket does: a reply must come from the address the client used).
    public func local(at index: Int) -> IPAddress? {
        precondition(index < count, "local \(index) of a batch of \(count)")
        // On the stack: this runs for every datagram a server receives.
        var raw: (UInt64, UInt64) = (0, 0)
        let family = withUnsafeMutableBytes(of: &raw) { out in
            withUnsafePointer(to: &messages[index].msg_hdr) { CShims_read_pktinfo($0, out.baseAddress!.assumingMemoryBound(to: UInt8.self)) }
        }
        return withUnsafeBytes(of: &raw) { bytes in
            switch family {
            case AF_INET: .v4(bytes.loadBigEndian(UInt32.self, at: 0))
            case AF_INET6: .v6(bytes.loadBigEndian(UInt64.self, at: 0), bytes.loadBigEndian(UInt64.self, at: 8))
            default: nil
            }
        }
    }

    /// The size of each datagram in slot `index` (< `count`) when the kernel joined several
    /// into it (UDP_GRO); nil when it holds one.
    public func segmentSize(at index: Int) -> Int? {
        precondition(index < count, "segment size \(index) of a batch of \(count)")
        let size = withUnsafePointer(to: &messages[index].msg_hdr) { CShims_read_gro_size($0) }
        return size > 0 && size < vectors[index].iov_len ? Int(size) : nil
    }

    /// Sends packet `index` (< `count`) from `source` rather than the address the kernel's
    /// route would pick; nil leaves the choice to the kernel.
    public func setSource(_ source: IPAddress?, at index: Int) {
        precondition(index < count, "source \(index) of a batch of \(count)")
        sources[index] = source
        guard let source else {
            messages[index].msg_hdr.msg_control = nil
            messages[index].msg_hdr.msg_controllen = 0
            return
        }
        source.withNetworkBytes { family, address in
            CShims_write_pktinfo(&messages[index].msg_hdr, controls + index * Int(CSHIMS_OFFLOAD_SPACE), family, address)
        }
    }

    /// The address packet `index` (< `count`) is to be sent from, as `setSource` gave it.
    public func source(at index: Int) -> IPAddress? {
        precondition(index < count, "source \(index) of a batch of \(count)")
        return sources[index]
    }

    /// Appends a copy of `packet`, to go to `peer`; false when the batch is full or the
    /// packet is longer than a slot.
    @discardableResult
    public func append(_ packet: UnsafeRawBufferPointer, to peer: SocketAddress? = nil) -> Bool {
        append(to: peer) { slot in
            guard packet.count <= slot.count else { return nil }
            slot.copyMemory(from: packet)
            return packet.count
        }
    }

    /// Appends a packet that `fill` writes straight into the next slot (an encryption, say),
    /// returning its length, or nil to append nothing; false when the batch is full or `fill`
    /// gave nil or a length beyond the slot.
    @discardableResult
    public func append(to peer: SocketAddress? = nil, _ fill: (UnsafeMutableRawBufferPointer) -> Int?) -> Bool {
        append { slot in fill(slot).map { ($0, peer) } }
    }

    /// Appends a packet that `fill` writes into the next slot and addresses itself (a server
    /// learns the destination only from the packet): its length and peer, or nil for nothing.
    @discardableResult
    public func append(_ fill: (UnsafeMutableRawBufferPointer) -> (length: Int, peer: SocketAddress?)?) -> Bool {
        guard count < capacity else { return false }
        let slot = UnsafeMutableRawBufferPointer(start: vectors[count].iov_base, count: slotBytes)
        guard let (length, peer) = fill(slot), (0...slotBytes).contains(length) else { return false }
        vectors[count].iov_len = length
        sources[count] = nil
        overStream[count] = peer?.overStream ?? false
        if overStream[count] { streamPeers += 1 }
        messages[count].msg_hdr.msg_control = nil
        messages[count].msg_hdr.msg_controllen = 0
        if let peer {
            messages[count].msg_hdr.msg_name = UnsafeMutableRawPointer(names + count)
            messages[count].msg_hdr.msg_namelen = peer.write(to: names + count)
        } else {
            messages[count].msg_hdr.msg_name = nil
            messages[count].msg_hdr.msg_namelen = 0
        }
        count += 1
        return true
    }

    /// Empties the batch; the slots stay allocated.
    public func removeAll() {
        count = 0
        streamPeers = 0
    }

    /// Readies every slot to receive a datagram and its sender; `received(_:)` follows.
    func prepareToReceive() {
        streamPeers = 0
        for i in 0..<capacity {
            overStream[i] = false
            vectors[i].iov_len = slotBytes
            messages[i].msg_hdr.msg_name = UnsafeMutableRawPointer(names + i)
            messages[i].msg_hdr.msg_namelen = socklen_t(MemoryLayout<sockaddr_in6>.size)
            messages[i].msg_hdr.msg_control = controls + i * Int(CSHIMS_OFFLOAD_SPACE)
            messages[i].msg_hdr.msg_controllen = Int(CSHIMS_OFFLOAD_SPACE)
            messages[i].msg_hdr.msg_flags = 0
        }
        count = 0
    }

    /// Records that the kernel filled the first `received` slots (`msg_len`, `msg_namelen`).
    func received(_ received: Int) {
        for i in 0..<received { vectors[i].iov_len = Int(messages[i].msg_len) }
        count = received
    }
}

extension IPAddress {
    /// Runs `body` with the address family (AF_INET, AF_INET6) and the address's network-order
    /// bytes, kept on the stack: for a control message on every datagram sent.
    func withNetworkBytes<R>(_ body: (Int32, UnsafePointer<UInt8>) -> R) -> R {
        var raw: (UInt64, UInt64) = (0, 0)
        let family: Int32
        switch self {
        case .v4(let address):
            withUnsafeMutableBytes(of: &raw) { $0.storeBytes(of: address.bigEndian, as: UInt32.self) }
            family = AF_INET
        case .v6(let high, let low):
            raw = (high.bigEndian, low.bigEndian)
            family = AF_INET6
        }
        return withUnsafeBytes(of: &raw) { body(family, $0.baseAddress!.assumingMemoryBound(to: UInt8.self)) }
    }
}
