import Testing
@testable import Streams

/// Frames of `messages`, laid out as a stream carries them.
private func frames(_ messages: [[UInt8]]) -> [UInt8] {
    var out = [UInt8](repeating: 0, count: messages.reduce(0) { $0 + 2 + $1.count })
    out.withUnsafeMutableBytes { raw in
        var offset = 0
        for message in messages { offset = message.withUnsafeBytes { StreamFraming.write($0, into: raw, at: offset) } }
    }
    return out
}

/// What a reader makes of `bytes` delivered in pieces of `piece` bytes.
private func read(_ bytes: [UInt8], inPiecesOf piece: Int) -> [[UInt8]] {
    var reader = FrameReader()
    var messages: [[UInt8]] = []
    var offset = 0
    while offset < bytes.count {
        let space = reader.space()
        let n = min(piece, bytes.count - offset, space.count)
        bytes.withUnsafeBytes { space.baseAddress!.copyMemory(from: $0.baseAddress! + offset, byteCount: n) }
        reader.received(n)
        offset += n
        while let message = reader.next() { messages.append(Array(message)) }
    }
    return messages
}

@Test func framesCarryTheirLengthBigEndianFirst() {
    #expect(frames([[0xAA, 0xBB, 0xCC]]) == [0, 3, 0xAA, 0xBB, 0xCC])
    #expect(frames([[UInt8](repeating: 1, count: 300)]).prefix(2) == [1, 44])
}

@Test(arguments: [1, 2, 3, 7, 1500, 16_384, 70_000])
func messagesComeOutWholeHoweverTheBytesArrive(piece: Int) {
    let messages: [[UInt8]] = [[2, 1, 0, 0], [UInt8](repeating: 9, count: 1420), [], [3] + [UInt8](repeating: 4, count: 65_534),
                               [UInt8](repeating: 5, count: 18), (0..<1000).map { UInt8($0 & 0xFF) }]
    // The empty frame carries nothing and is skipped.
    #expect(read(frames(messages), inPiecesOf: piece) == messages.filter { !$0.isEmpty })
}

@Test func aPartialFrameWaitsForTheRest() {
    var reader = FrameReader()
    let bytes = frames([[1, 2, 3, 4, 5]])
    let space = reader.space()
    bytes.withUnsafeBytes { space.baseAddress!.copyMemory(from: $0.baseAddress!, byteCount: 4) }
    reader.received(4)
    #expect(reader.next() == nil)
    let waiting = reader.hasMessage
    #expect(!waiting)
    let more = reader.space()
    bytes.withUnsafeBytes { more.baseAddress!.copyMemory(from: $0.baseAddress! + 4, byteCount: 3) }
    reader.received(3)
    let whole = reader.hasMessage
    #expect(whole)
    #expect(reader.next().map { Array($0) } == [1, 2, 3, 4, 5])
}

@Test func aLongRunOfSmallFramesNeverRunsOutOfRoom() {
    // Many more bytes than the reader holds, drained as they come: `space` always has room.
    let messages = (0..<20_000).map { [UInt8](repeating: UInt8($0 & 0xFF), count: 1 + $0 % 97) }
    #expect(read(frames(messages), inPiecesOf: 16_384) == messages)
}
