import Basics
import COpenSSL
import Device
import Glibc
import Testing
@testable import Streams

// The stream's own TLS 1.3 record layer against libssl's: what one side seals the other opens,
// either way round, for each suite, across key updates and libssl's session tickets.

private let loopback = SocketAddress(IPAddress("127.0.0.1")!, port: 0)

/// Moves `channel`'s handshake on until it is done (5 s at most).
private func finishHandshake(_ channel: TLSChannel) throws {
    for _ in 0..<500 {
        switch channel.handshake() {
        case .done: return
        case .wantRead, .wantWrite: usleep(10_000)
        case .closed(let why): throw StreamError(why)
        }
    }
    throw StreamError("the handshake did not finish")
}

/// Messages that libssl's record layer reads on `channel` until `count` have come (5 s at most).
private func readThroughLibssl(_ channel: TLSChannel, count: Int) -> [[UInt8]] {
    var reader = FrameReader()
    var got: [[UInt8]] = []
    for _ in 0..<500 where got.count < count {
        while let message = reader.next() { got.append(Array(message)) }
        guard got.count < count else { break }
        switch channel.read(into: reader.space()) {
        case .done(let n): reader.received(n)
        case .wantRead, .wantWrite: usleep(10_000)
        case .closed(let why):
            Issue.record("libssl's side closed: \(why)")
            return got
        }
    }
    return got
}

/// `messages` framed and written through libssl's record layer on `channel`.
private func writeThroughLibssl(_ channel: TLSChannel, _ messages: [[UInt8]]) throws {
    var bytes: [UInt8] = []
    for message in messages { bytes += [UInt8(message.count >> 8), UInt8(message.count & 0xFF)] + message }
    var offset = 0
    for _ in 0..<500 where offset < bytes.count {
        switch bytes.withUnsafeBytes({ channel.write(UnsafeRawBufferPointer(rebasing: $0[offset...])) }) {
        case .done(let n): offset += n
        case .wantRead, .wantWrite: usleep(10_000)
        case .closed(let why): throw StreamError(why)
        }
    }
    #expect(offset == bytes.count)
}

/// Messages of every length class: tiny, a datagram's, and longer than a record.
private func messages(_ tag: UInt8) -> [[UInt8]] {
    [[tag], [UInt8](repeating: tag, count: 1_400), [UInt8](repeating: tag &+ 1, count: 20_000), [UInt8](repeating: tag, count: 65_535)]
}

/// Each message's length and first byte: what a failure prints instead of the bytes.
private func summary(_ messages: [[UInt8]]) -> [String] { messages.map { "\($0.count)×\($0.first ?? 0)" } }

/// `got` is `expected`, said briefly when it is not.
private func expectSame(_ got: [[UInt8]], _ expected: [[UInt8]], sourceLocation: SourceLocation = #_sourceLocation) {
    let same = got == expected
    #expect(same, "got \(summary(got)), wanted \(summary(expected))", sourceLocation: sourceLocation)
}

private func expectArrival(at carrier: StreamCarrier, of expected: [[UInt8]]) throws {
    var buffer = [UInt8](repeating: 0, count: 65_536)
    var got: [[UInt8]] = []
    for _ in 0..<500 where got.count < expected.count {
        if let (n, _, segment) = try buffer.withUnsafeMutableBytes({ try carrier.receiveJoined(into: $0, timeout: .milliseconds(10)) }) {
            for start in stride(from: 0, to: n, by: segment) { got.append(Array(buffer[start..<min(start + segment, n)])) }
        }
    }
    expectSame(got, expected)
}

@Test(arguments: ["TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256"])
func theClientsRecordsAreLibsslsRecords(suite: String) throws {
    let tcp = try TCPListener(bindingTo: loopback)
    let server = try TLSContext.server(name: "vpn.example.net")
    // libssl's own sessions tickets, sent after the handshake: the client's layer reads past them.
    #expect(server.api.pointee.SSL_CTX_set_num_tickets(server.context, 2) == 1)
    let client = try TLSContext.client(serverName: "vpn.example.net")
    #expect(client.api.pointee.SSL_CTX_set_ciphersuites(client.context, suite) == 1)
    let carrier = StreamCarrier.open(to: tcp.local, from: nil, device: nil, mark: nil, proxy: nil, context: client, told: { _, _ in })
    var connection: TCPConnection?
    for _ in 0..<200 where connection == nil { connection = try tcp.accept(timeout: .milliseconds(20)) }
    let channel = try TLSChannel(server, over: try #require(connection), accepting: true)
    try finishHandshake(channel)
    #expect(channel.suite == suite)

    // Client to libssl, then libssl to the client.
    let up = messages(1)
    _ = up.withUnsafeBufferPointers { pointers in pointers.map { try? carrier.send($0, to: loopback) } }
    expectSame(readThroughLibssl(channel, count: up.count), up)
    #expect(carrier.suite == suite)
    try writeThroughLibssl(channel, messages(5))
    try expectArrival(at: carrier, of: messages(5))

    // libssl updates its keys and asks for an update back: the client reads under the next key,
    // and its next records come under its own next key, which libssl opens.
    #expect(channel.updateKeys(requested: true))
    try writeThroughLibssl(channel, messages(9))
    try expectArrival(at: carrier, of: messages(9))
    let after = messages(11)
    _ = after.withUnsafeBufferPointers { pointers in pointers.map { try? carrier.send($0, to: loopback) } }
    expectSame(readThroughLibssl(channel, count: after.count), after)
    #expect(carrier.drops == 0)
}

@Test func theGatewaysRecordsAreLibsslsRecords() throws {
    let (gateway, channel, _) = try handshakenPair()
    var buffer = [UInt8](repeating: 0, count: 65_536)

    func gatewayReceives(_ count: Int) -> [[UInt8]] {
        var got: [[UInt8]] = []
        for _ in 0..<500 where got.count < count {
            switch buffer.withUnsafeMutableBytes({ gateway.advance(into: $0, now: .now()) }) {
            case .messages(let n, let segment):
                for start in stride(from: 0, to: n, by: segment) { got.append(Array(buffer[start..<min(start + segment, n)])) }
            case .waiting: usleep(10_000)
            case .closed(let why):
                Issue.record("the gateway's side closed: \(why)")
                return got
            }
        }
        return got
    }

    try writeThroughLibssl(channel, messages(3))
    expectSame(gatewayReceives(4), messages(3))
    #expect(messages(4).withUnsafeBufferPointers { gateway.send($0) } == 4)
    expectSame(readThroughLibssl(channel, count: 4), messages(4))
    // A key update from libssl's side, which asks for one back.
    #expect(channel.updateKeys(requested: true))
    try writeThroughLibssl(channel, messages(7))
    expectSame(gatewayReceives(4), messages(7))
    #expect(messages(8).withUnsafeBufferPointers { gateway.send($0) } == 4)
    expectSame(readThroughLibssl(channel, count: 4), messages(8))
    #expect(gateway.drops == 0)
}

@Test(arguments: [RecordSuite.aes128GCM, .aes256GCM, .chacha20Poly1305])
func aRecordOpensOnlyWholeAndInItsPlace(suite: RecordSuite) throws {
    let secret = [UInt8](repeating: 0x42, count: suite.hashLength)
    let sealer = try secret.withUnsafeBytes { try RecordProtection(suite, secret: $0) }
    let opener = try secret.withUnsafeBytes { try RecordProtection(suite, secret: $0) }
    let content: [UInt8] = Array("inner".utf8) + [Record.applicationData]
    func record() -> [UInt8] {
        var bytes = [Record.applicationData, 3, 3, 0, UInt8(content.count + Record.tagLength)] + content
            + [UInt8](repeating: 0, count: Record.tagLength)
        #expect(bytes.withUnsafeMutableBytes { sealer.seal(record: $0.baseAddress!, length: content.count) })
        return bytes
    }
    func opens(_ bytes: [UInt8]) -> [UInt8]? {
        var out = [UInt8](repeating: 0, count: bytes.count)
        let ok = bytes.withUnsafeBytes { raw in
            out.withUnsafeMutableBytes { opener.open(record: raw.baseAddress!, length: bytes.count - Record.headerLength, into: $0.baseAddress!) }
        }
        return ok ? Array(out.prefix(content.count)) : nil
    }
    let first = record()
    #expect(Array(first[5..<10]) != Array("inner".utf8), "sealed")
    #expect(opens(first) == content)
    // The same record again: its sequence number is spent.
    #expect(opens(first) == nil)
    // The next one with any bit flipped, in the header (authenticated) or the body.
    let second = record()
    for index in [2, 4, 6, second.count - 1] {
        var tampered = second
        tampered[index] ^= 0x01
        #expect(opens(tampered) == nil, "flipped byte \(index)")
    }
    // After a key update on both sides, records still open.
    try sealer.update()
    try opener.update()
    #expect(opens(record()) == content)
}

/// A gateway's stream and a client's libssl channel on loopback, both handshakes done.
private func handshakenPair() throws -> (GatewayStream, TLSChannel, TCPConnection) {
    let listener = try StreamListener(on: [loopback], context: try .server(name: "vpn.example.net"))
    let connection = try TCPConnection.connect(to: listener.sockets[0].local, deadline: .now + .seconds(2))
    let channel = try TLSChannel(try .client(serverName: "vpn.example.net"), over: connection, accepting: false)
    var stream: GatewayStream?
    for _ in 0..<200 where stream == nil { stream = try listener.accept(on: listener.sockets[0], now: .now()) }
    let gateway = try #require(stream)
    var buffer = [UInt8](repeating: 0, count: 65_536)
    var done = false
    for _ in 0..<500 where !done || !gateway.isOpen {
        if !done, case .done = channel.handshake() { done = true }
        _ = buffer.withUnsafeMutableBytes { gateway.advance(into: $0, now: .now()) }
        usleep(2_000)
    }
    try #require(done && gateway.isOpen)
    return (gateway, channel, connection)
}

/// Writes records of `type` with `content` sealed under `protection`, straight to the socket.
private func writeRecords(_ records: [(type: UInt8, content: [UInt8])], with protection: RecordProtection, to connection: TCPConnection) throws {
    var wire: [UInt8] = []
    for (type, content) in records {
        let length = content.count + 1 + Record.tagLength
        var record = [Record.applicationData, 3, 3, UInt8(length >> 8), UInt8(length & 0xFF)] + content + [type]
            + [UInt8](repeating: 0, count: Record.tagLength)
        #expect(record.withUnsafeMutableBytes { protection.seal(record: $0.baseAddress!, length: content.count + 1) })
        wire += record
    }
    #expect(try connection.write(wire, deadline: .now + .seconds(2)))
}

/// What the gateway's stream gives first that is not a wait, within 5 s; nil when only waits came.
private func firstProgress(of gateway: GatewayStream, into buffer: inout [UInt8]) -> GatewayStream.Progress? {
    for _ in 0..<500 {
        let got = buffer.withUnsafeMutableBytes { gateway.advance(into: $0, now: .now()) }
        if case .waiting = got { usleep(10_000) } else { return got }
    }
    return nil
}

/// How the gateway's stream ends within 5 s of reading; nil when it did not.
private func closing(_ gateway: GatewayStream) -> String? {
    var buffer = [UInt8](repeating: 0, count: 65_536)
    for _ in 0..<500 {
        switch buffer.withUnsafeMutableBytes({ gateway.advance(into: $0, now: .now()) }) {
        case .closed(let why): return why
        case .waiting: usleep(10_000)
        case .messages: break
        }
    }
    return nil
}

@Test func recordsThatCarryNothingCannotHoldTheGateway() throws {
    let (gateway, channel, connection) = try handshakenPair()
    let keys = try channel.recordProtection()
    // Empty records cost an open each and give nothing: a few are fine, a run of them is not.
    try writeRecords([(Record.applicationData, [])] + [(Record.applicationData, [0, 1, 7])], with: keys.sending, to: connection)
    var buffer = [UInt8](repeating: 0, count: 65_536)
    let got = firstProgress(of: gateway, into: &buffer)
    #expect(got == .messages(length: 1, segment: 1) && buffer[0] == 7)
    try writeRecords(Array(repeating: (Record.applicationData, []), count: 40), with: keys.sending, to: connection)
    let why = closing(gateway)
    #expect(why?.contains("in a row with no data") == true, "\(why ?? "still open")")
}

@Test func keyUpdatesInARowCloseTheGatewaysStream() throws {
    let (gateway, channel, connection) = try handshakenPair()
    let keys = try channel.recordProtection()
    let update: [UInt8] = [Record.keyUpdate, 0, 0, 1, 0]
    // The first one is taken: the next record comes under the next key.
    try writeRecords([(Record.handshake, update)], with: keys.sending, to: connection)
    try keys.sending.update()
    try writeRecords([(Record.applicationData, [0, 1, 9])], with: keys.sending, to: connection)
    var buffer = [UInt8](repeating: 0, count: 65_536)
    let got = firstProgress(of: gateway, into: &buffer)
    #expect(got == .messages(length: 1, segment: 1) && buffer[0] == 9)
    // Another at once: each costs key derivations, so a peer may not send them back to back.
    try writeRecords([(Record.handshake, update)], with: keys.sending, to: connection)
    let why = closing(gateway)
    #expect(why?.contains("key updates 2 records apart") == true, "\(why ?? "still open")")
}

@Test func theClientsOwnKeyUpdatesAreTakenByLibssl() throws {
    let tcp = try TCPListener(bindingTo: loopback)
    let server = try TLSContext.server(name: "vpn.example.net")
    let connection = try TCPConnection.connect(to: tcp.local, deadline: .now + .seconds(2))
    let client = try TLSChannel(try .client(serverName: "vpn.example.net"), over: connection, accepting: false)
    var accepted: TCPConnection?
    for _ in 0..<200 where accepted == nil { accepted = try tcp.accept(timeout: .milliseconds(20)) }
    let channel = try TLSChannel(server, over: try #require(accepted), accepting: true)
    var done = (false, false)
    for _ in 0..<500 where !(done.0 && done.1) {
        if !done.0, case .done = client.handshake() { done.0 = true }
        if !done.1, case .done = channel.handshake() { done.1 = true }
        usleep(2_000)
    }
    try #require(done.0 && done.1)
    // A key update every 3 records instead of every 2^23: libssl opens every record across them.
    let stream = try FramedStream(client, keyUpdateAfter: 3)
    var sent: [[UInt8]] = []
    for round in 0..<6 {
        let batch = messages(UInt8(round * 16))
        #expect(batch.withUnsafeBufferPointers { stream.send($0) } == batch.count)
        sent += batch
    }
    expectSame(readThroughLibssl(channel, count: sent.count), sent)
    #expect(stream.closed == nil)
}
