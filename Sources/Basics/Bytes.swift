/// Integers at any offset of a packet, in the byte order its format gives.
extension UnsafeRawBufferPointer {
    @inlinable @inline(__always)
    package func loadLittleEndian<T: FixedWidthInteger>(_ type: T.Type, at offset: Int) -> T {
        T(littleEndian: loadUnaligned(fromByteOffset: offset, as: T.self))
    }

    @inlinable @inline(__always)
    package func loadBigEndian<T: FixedWidthInteger>(_ type: T.Type, at offset: Int) -> T {
        T(bigEndian: loadUnaligned(fromByteOffset: offset, as: T.self))
    }
}
