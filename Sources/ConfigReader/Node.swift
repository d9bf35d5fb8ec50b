/// A YAML node and the line it starts on, so that every error about it can point there.
public struct Node: Sendable {
    public enum Value: Sendable {
        /// Text as written, without its quotes and with escapes resolved. `key:` with nothing
        /// after it (and nothing indented below) is the empty scalar "".
        case scalar(String)
        /// Keys and values in file order; a duplicate key stays for `YAMLReader.fields` to refuse.
        case mapping([(key: Node, value: Node)])
        /// Items in file order.
        case sequence([Node])
    }

    public let value: Value
    /// 1-based; for a block scalar, the line of its `|` or `>`.
    public let line: Int
}

extension Node {
    /// What the node says, as text without its lines (scalars quoted, mappings and lists in file
    /// order): equal for two nodes that say the same wherever they stand in their files.
    public var content: String {
        switch value {
        case .scalar(let text): String(reflecting: text)
        case .mapping(let pairs): "{" + pairs.map { "\($0.key.content): \($0.value.content)" }.joined(separator: ", ") + "}"
        case .sequence(let items): "[" + items.map(\.content).joined(separator: ", ") + "]"
        }
    }
}
