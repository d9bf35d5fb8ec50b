/// Parses the YAML our configuration and scenario files use, with the standard library alone:
/// block mappings and lists by indentation, flow `[...]` and `{...}` (nested, across lines),
/// plain, single- and double-quoted scalars, `|` and `>` block scalars with `-`/`+` chomping,
/// comments, and an optional leading `---`. Anchors, aliases, tags, complex keys, directives
/// and several documents are refused by name.
///
/// Works on UTF-8 bytes: every character with a meaning in YAML is ASCII, and no byte of a
/// multi-byte character is, so text is only cut at ASCII characters.
struct YAMLParser {
    /// Deeper nesting is refused, so a hostile file cannot exhaust the stack.
    static let maxDepth = 64

    private let file: String
    private let text: [UInt8]
    private var pos = 0
    private var line = 1
    /// Where the current line starts, for columns: indentation counts bytes, all of them spaces.
    private var lineStart = 0

    init(_ source: String, file: String) {
        self.file = file
        // YAML reads CR LF and a lone CR as one line break; a byte order mark is not content.
        var bytes: [UInt8] = []
        bytes.reserveCapacity(source.utf8.count)
        var previous: UInt8 = 0
        for b in source.utf8 {
            if b == .return { bytes.append(.newline) } else if b != .newline || previous != .return { bytes.append(b) }
            previous = b
        }
        if bytes.starts(with: [0xEF, 0xBB, 0xBF]) { bytes.removeFirst(3) }
        text = bytes
    }

    /// The root node, or nil when the text holds no node at all (nothing, comments, or `---`).
    mutating func document() throws(ConfigError) -> Node? {
        try skipToContent()
        if byte == .percent && column == 0 { throw unsupported("directives (%YAML, %TAG) are not supported") }
        var root: Node?
        if atDocumentMarker(.dash) {
            pos += 3
            skipSpaces()
            if atLineEnd { try finishLine() } else { root = try blockNode(parent: -1, depth: 0, collections: false) }
            try skipToContent()
        }
        if root == nil && byte != nil && !atDocumentBoundary {
            root = try blockNode(parent: -1, depth: 0)
            try skipToContent()
        }
        let ended = atDocumentMarker(.dot)
        if ended {
            pos += 3
            try finishLine()
            try skipToContent()
        }
        if atDocumentBoundary || (ended && byte != nil) {
            throw unsupported("one document per file: a second '---' (or text after '...') is not supported")
        }
        if byte != nil { throw invalid("this line does not fit the structure above; check its indentation") }
        return root
    }

    // MARK: Block context

    /// The node at the cursor in block context: a list, a mapping or a single value.
    /// `parent` is the indentation of the enclosing block collection (-1 at the top);
    /// `collections` is false right after `key:`, where neither may start.
    private mutating func blockNode(parent: Int, depth: Int, collections: Bool = true) throws(ConfigError) -> Node {
        guard let first = byte else { return Node(value: .scalar(""), line: line) }
        let indent = column
        let startLine = line
        switch first {
        case .dash where isBlank(peek(1)):
            guard collections else {
                throw invalid("a list cannot start on the same line as its key; put its '- ' items on the lines below")
            }
            return try blockSequence(indent: indent, depth: depth)
        case .pipe, .greater:
            return try blockScalar(parent: parent)
        case .openBracket, .openBrace:
            let node = try flowCollection(parent: parent, depth: depth)
            skipSpaces()
            guard atLineEnd else {
                throw invalid("unexpected text after '\(first == .openBracket ? "]" : "}")': a value that starts with "
                    + "'[' or '{' is a list or mapping; quote it if it is one piece of text")
            }
            try finishLine()
            return node
        case .singleQuote, .doubleQuote:
            let node = try quoted(parent: parent)
            skipSpaces()
            if byte == .colon && isBlank(peek(1)) {
                guard node.line == line else { throw invalid("a key must fit on one line", line: node.line) }
                guard collections else { throw nestedMappingOnKeyLine() }
                return try blockMapping(indent: indent, firstKey: node, depth: depth)
            }
            try finishLine()
            return node
        default:
            try checkPlainStart(flow: false)
            let head = try plainLine(flow: false)
            if byte == .colon {
                guard collections else { throw nestedMappingOnKeyLine() }
                let key = Node(value: .scalar(String(decoding: text[head], as: UTF8.self)), line: startLine)
                return try blockMapping(indent: indent, firstKey: key, depth: depth)
            }
            let node = try plainContinued(head, line: startLine, parent: parent, flow: false)
            try finishLine()
            return node
        }
    }

    /// Entries `key: value` at column `indent`, the cursor on the `:` after the first key.
    private mutating func blockMapping(indent: Int, firstKey: Node, depth: Int) throws(ConfigError) -> Node {
        guard depth < Self.maxDepth else { throw tooDeep() }
        var pairs: [(key: Node, value: Node)] = []
        var key = firstKey
        while true {
            pos += 1
            pairs.append((key, try mappingValue(indent: indent, keyLine: key.line, depth: depth + 1)))
            try skipToContent()
            guard byte != nil, column >= indent, !atDocumentBoundary else { break }
            guard column == indent else {
                throw invalid("this line is indented more than the keys above it (column \(indent + 1))")
            }
            key = try mappingKey(indent: indent)
        }
        return Node(value: .mapping(pairs), line: firstKey.line)
    }

    /// A key of a block mapping and its `:`, on one line; the cursor is left on the `:`.
    private mutating func mappingKey(indent: Int) throws(ConfigError) -> Node {
        let startLine = line
        let key: Node
        switch byte {
        case .dash? where isBlank(peek(1)):
            throw invalid("a list item where a key was expected (at the indentation of the keys above)")
        case .openBracket?, .openBrace?:
            throw unsupported("lists and mappings as keys are not supported")
        case .question? where isBlank(peek(1)):
            throw unsupported("complex keys ('? ') are not supported")
        case .singleQuote?, .doubleQuote?:
            key = try quoted(parent: indent)
            guard key.line == line else { throw invalid("a key must fit on one line", line: key.line) }
            skipSpaces()
        default:
            try checkPlainStart(flow: false)
            let range = try plainLine(flow: false)
            key = Node(value: .scalar(String(decoding: text[range], as: UTF8.self)), line: startLine)
        }
        guard byte == .colon && isBlank(peek(1)) else {
            guard case .scalar(let name) = key.value, name.contains(":") else {
                throw invalid("expected 'key: value' at the indentation of the keys above")
            }
            throw invalid("expected 'key: value'; put a space after the ':' in \"\(name)\"")
        }
        return key
    }

    /// The value after `key:`: on the same line, or indented on the lines below, or a list at
    /// the key's own indentation (as YAML allows), or else the empty scalar.
    private mutating func mappingValue(indent: Int, keyLine: Int, depth: Int) throws(ConfigError) -> Node {
        skipSpaces()
        guard atLineEnd else { return try blockNode(parent: indent, depth: depth, collections: false) }
        try finishLine()
        try skipToContent()
        if byte != nil, !atDocumentBoundary {
            if column > indent { return try blockNode(parent: indent, depth: depth) }
            if column == indent && atEntry { return try blockSequence(indent: indent, depth: depth) }
        }
        return Node(value: .scalar(""), line: keyLine)
    }

    /// Items `- value` at column `indent`, the cursor on the first `-`.
    private mutating func blockSequence(indent: Int, depth: Int) throws(ConfigError) -> Node {
        guard depth < Self.maxDepth else { throw tooDeep() }
        let startLine = line
        var items: [Node] = []
        while true {
            let itemLine = line
            pos += 1
            let separator = pos
            skipSpaces()
            if atLineEnd {
                try finishLine()
                try skipToContent()
                if byte != nil, column > indent, !atDocumentBoundary {
                    items.append(try blockNode(parent: indent, depth: depth + 1))
                } else {
                    items.append(Node(value: .scalar(""), line: itemLine))
                }
            } else {
                // The blank after '-' indents what follows it: with a tab, that would depend on the editor.
                if text[separator..<pos].contains(.tab) {
                    throw invalid("a tab after '-'; separate a list item from its '-' with spaces")
                }
                items.append(try blockNode(parent: indent, depth: depth + 1))
            }
            try skipToContent()
            guard byte != nil, column >= indent, !atDocumentBoundary else { break }
            guard column == indent else {
                throw invalid("this line is indented more than the '- ' items above it (column \(indent + 1))")
            }
            // Anything else at this indentation belongs to the mapping around the list, if any.
            guard atEntry else { break }
        }
        return Node(value: .sequence(items), line: startLine)
    }

    /// A `|` (literal) or `>` (folded) block scalar, the cursor on its indicator.
    private mutating func blockScalar(parent: Int) throws(ConfigError) -> Node {
        let startLine = line
        let folded = byte == .greater
        pos += 1
        var chomping: UInt8?
        var increment: Int?
        while let b = byte {
            if (b == .dash || b == .plus) && chomping == nil {
                chomping = b
            } else if (UInt8(ascii: "1")...UInt8(ascii: "9")).contains(b) && increment == nil {
                increment = Int(b - UInt8(ascii: "0"))
            } else {
                break
            }
            pos += 1
        }
        guard isBlank(byte) else {
            throw invalid("after '\(folded ? ">" : "|")' only '-' or '+' (chomping) and a digit 1-9 "
                + "(indentation) may follow")
        }
        skipSpaces()
        try finishLine()

        // The indentation is given, or that of the first line with text, as libyaml finds it:
        // the deepest of the lines up to it, and at least one more than the parent's.
        let indent: Int
        if let increment {
            indent = max(parent, 0) + increment
        } else {
            var probe = pos
            var probeLine = line
            var deepest = 0
            while true {
                var end = probe
                while end < text.count && text[end] == .space { end += 1 }
                deepest = max(deepest, end - probe)
                if end < text.count && text[end] == .tab {
                    throw invalid("a tab in the indentation of a block scalar; indent with spaces", line: probeLine)
                }
                guard end < text.count, text[end] == .newline else { break }
                probe = end + 1
                probeLine += 1
            }
            indent = max(deepest, parent + 1, 1)
        }

        var out: [UInt8] = []
        var sawText = false
        var breakPending = false
        var emptyLines = 0
        var previousMoreIndented = false
        while pos < text.count {
            var spaces = 0
            while spaces < indent && peek(spaces) == .space { spaces += 1 }
            let next = peek(spaces)
            if next == .newline || next == nil {
                pos += spaces
                guard next == .newline else { break }
                newline()
                emptyLines += 1
                continue
            }
            guard spaces == indent else {
                if next == .tab { throw invalid("a tab in the indentation of a block scalar; indent with spaces") }
                break
            }
            let moreIndented = next == .space || next == .tab
            if sawText && breakPending {
                if folded && !previousMoreIndented && !moreIndented {
                    if emptyLines == 0 { out.append(.space) }
                } else {
                    out.append(.newline)
                }
            }
            out.append(contentsOf: repeatElement(.newline, count: emptyLines))
            emptyLines = 0
            pos += spaces
            let start = pos
            while let b = byte, b != .newline { pos += 1 }
            out.append(contentsOf: text[start..<pos])
            sawText = true
            previousMoreIndented = moreIndented
            breakPending = byte == .newline
            if breakPending { newline() }
        }
        if chomping != .dash && breakPending { out.append(.newline) }
        if chomping == .plus { out.append(contentsOf: repeatElement(.newline, count: emptyLines)) }
        return Node(value: .scalar(String(decoding: out, as: UTF8.self)), line: startLine)
    }

    // MARK: Flow context

    /// `[a, b]` or `{k: v}`, the cursor on the opening bracket; may span lines, each indented
    /// more than `parent`. In a list, `k: v` is a mapping of one pair, as in YAML.
    private mutating func flowCollection(parent: Int, depth: Int) throws(ConfigError) -> Node {
        guard depth < Self.maxDepth else { throw tooDeep() }
        let startLine = line
        let isList = byte == .openBracket
        let close: UInt8 = isList ? .closeBracket : .closeBrace
        pos += 1
        var items: [Node] = []
        var pairs: [(key: Node, value: Node)] = []
        while true {
            try skipFlowSpace(parent: parent, opened: startLine, isList: isList)
            if byte == close {
                pos += 1
                break
            }
            let entry = try flowNode(parent: parent, depth: depth + 1)
            try skipFlowSpace(parent: parent, opened: startLine, isList: isList)
            var value: Node?
            if byte == .colon {
                guard case .scalar = entry.value else {
                    throw unsupported("lists and mappings as keys are not supported", line: entry.line)
                }
                pos += 1
                try skipFlowSpace(parent: parent, opened: startLine, isList: isList)
                value = byte == .comma || byte == close
                    ? Node(value: .scalar(""), line: entry.line) : try flowNode(parent: parent, depth: depth + 1)
                try skipFlowSpace(parent: parent, opened: startLine, isList: isList)
            }
            if isList {
                items.append(value.map { Node(value: .mapping([(entry, $0)]), line: entry.line) } ?? entry)
            } else {
                guard case .scalar = entry.value else {
                    throw unsupported("lists and mappings as keys are not supported", line: entry.line)
                }
                pairs.append((entry, value ?? Node(value: .scalar(""), line: entry.line)))
            }
            if byte == .comma {
                pos += 1
            } else if byte == close {
                pos += 1
                break
            } else {
                throw invalid("expected ',' or '\(isList ? "]" : "}")' in the \(isList ? "list" : "mapping") "
                    + "opened on line \(startLine)")
            }
        }
        return Node(value: isList ? .sequence(items) : .mapping(pairs), line: startLine)
    }

    /// A value inside `[...]` or `{...}`.
    private mutating func flowNode(parent: Int, depth: Int) throws(ConfigError) -> Node {
        let startLine = line
        switch byte {
        case .openBracket?, .openBrace?:
            return try flowCollection(parent: parent, depth: depth)
        case .singleQuote?, .doubleQuote?:
            return try quoted(parent: parent)
        case .comma?:
            throw invalid("a value is missing before ','")
        case .pipe?, .greater?:
            throw invalid("block scalars ('|' and '>') cannot appear inside [ ] or { }; quote the value")
        default:
            try checkPlainStart(flow: true)
            return try plainContinued(try plainLine(flow: true), line: startLine, parent: parent, flow: true)
        }
    }

    /// Skips spaces, line breaks and comments inside `[...]` or `{...}`.
    private mutating func skipFlowSpace(parent: Int, opened: Int, isList: Bool) throws(ConfigError) {
        var crossedLine = false
        while true {
            switch byte {
            case nil:
                throw invalid("the \(isList ? "'['" : "'{'") on this line is never closed", line: opened)
            case .space?, .tab?:
                pos += 1
            case .newline?:
                newline()
                crossedLine = true
            case .hash?:
                while let b = byte, b != .newline { pos += 1 }
            default:
                if crossedLine && leadingSpaces <= parent {
                    throw invalid("the \(isList ? "'['" : "'{'") on this line is never closed (or the lines after it "
                        + "need more indentation)", line: opened)
                }
                return
            }
        }
    }

    // MARK: Scalars

    /// Refuses what cannot start a plain scalar, naming the feature where it is one we leave out.
    private func checkPlainStart(flow: Bool) throws(ConfigError) {
        guard let b = byte else { return }
        let next = peek(1)
        let ends = isBlank(next) || (flow && next.map(isFlowIndicator) == true)
        switch b {
        case .ampersand, .asterisk:
            throw unsupported("anchors and aliases (& and *) are not supported; write the value out, or quote it")
        case .exclamation:
            throw unsupported("tags (!) are not supported; quote a value that starts with '!'")
        case .question where ends:
            throw unsupported("complex keys ('? ') are not supported")
        case .question where flow:
            // YAML 1.2 allows this, libyaml reads a '?' there as a complex key: refuse both.
            throw unsupported("a value inside [ ] or { } cannot start with '?' (a complex key, not supported); quote it")
        case .colon where ends:
            throw invalid("a ':' without a key before it")
        case .colon where flow:
            // YAML 1.2 allows this, libyaml reads a ':' there as the start of a value: refuse both.
            throw invalid("a value inside [ ] or { } cannot start with ':'; quote it, e.g. \"::1\"")
        case .dash where ends:
            throw invalid(flow ? "'- ' list items cannot appear inside [ ] or { }" : "unexpected '- ' here")
        case .comma, .openBracket, .closeBracket, .openBrace, .closeBrace, .hash, .pipe, .greater,
             .singleQuote, .doubleQuote, .percent, .at, .backtick:
            throw invalid("a value cannot start with '\(Character(Unicode.Scalar(b)))'; quote it")
        default:
            return
        }
    }

    /// The plain text from the cursor to the end of the line, a comment, `: ` (the cursor is
    /// then on the `:`), or in flow context an indicator; without trailing blanks.
    private mutating func plainLine(flow: Bool) throws(ConfigError) -> Range<Int> {
        let start = pos
        var end = pos
        while let b = byte, b != .newline {
            if b == .space || b == .tab {
                if peek(1) == .hash { break }
                pos += 1
                continue
            }
            if b == .colon {
                let next = peek(1)
                if isBlank(next) { break }
                if flow, let next, isFlowIndicator(next) || next == .question {
                    throw invalid("a ':' right before '\(Character(Unicode.Scalar(next)))' inside [ ] or { } "
                        + "is ambiguous; quote the value")
                }
            }
            if flow && isFlowIndicator(b) { break }
            pos += 1
            end = pos
        }
        return start..<end
    }

    /// A plain scalar whose first line is `head`, with the lines that continue it: indented
    /// more than `parent`, folded into one space (or a line break per empty line between).
    private mutating func plainContinued(
        _ head: Range<Int>, line startLine: Int, parent: Int, flow: Bool
    ) throws(ConfigError) -> Node {
        var out = Array(text[head])
        while byte == .newline {
            let saved = (pos, line, lineStart)
            var breaks = 0
            var spaces = 0
            repeat {
                newline()
                breaks += 1
                spaces = 0
                while byte == .space {
                    pos += 1
                    spaces += 1
                }
                while byte == .space || byte == .tab { pos += 1 }
            } while byte == .newline
            guard let b = byte, spaces > parent, b != .hash, !(spaces == 0 && atDocumentMarker(at: lineStart)),
                  !(flow && isFlowIndicator(b)), !(b == .colon && isBlank(peek(1))) else {
                (pos, line, lineStart) = saved
                break
            }
            let more = try plainLine(flow: flow)
            if breaks == 1 {
                out.append(.space)
            } else {
                out.append(contentsOf: repeatElement(.newline, count: breaks - 1))
            }
            out.append(contentsOf: text[more])
            if !flow && byte == .colon {
                throw invalid("this line continues the value from line \(startLine) but holds 'key: value': "
                    + "check its indentation, or quote a value that contains ': '")
            }
        }
        return Node(value: .scalar(String(decoding: out, as: UTF8.self)), line: startLine)
    }

    /// A `'...'` or `"..."` scalar, the cursor on the opening quote. Line breaks fold as in a
    /// plain scalar; the lines they lead to must be indented more than `parent`.
    private mutating func quoted(parent: Int) throws(ConfigError) -> Node {
        let startLine = line
        let quote = byte ?? .doubleQuote
        pos += 1
        var out: [UInt8] = []
        while true {
            guard let b = byte else { throw unterminated(quote, line: startLine) }
            switch b {
            case .singleQuote where quote == .singleQuote:
                guard peek(1) == .singleQuote else {
                    pos += 1
                    return Node(value: .scalar(String(decoding: out, as: UTF8.self)), line: startLine)
                }
                out.append(.singleQuote)
                pos += 2
            case .doubleQuote where quote == .doubleQuote:
                pos += 1
                return Node(value: .scalar(String(decoding: out, as: UTF8.self)), line: startLine)
            case .backslash where quote == .doubleQuote:
                pos += 1
                if byte == .newline {
                    try foldQuoted(into: &out, escaped: true, parent: parent, quote: quote, startLine: startLine)
                } else {
                    try escape(into: &out)
                }
            case .space, .tab:
                let start = pos
                while byte == .space || byte == .tab { pos += 1 }
                // Blanks before a line break are not content.
                if byte != .newline { out.append(contentsOf: text[start..<pos]) }
            case .newline:
                try foldQuoted(into: &out, escaped: false, parent: parent, quote: quote, startLine: startLine)
            default:
                out.append(b)
                pos += 1
            }
        }
    }

    /// Folds the line breaks at the cursor inside a quoted scalar: one is a space (none after a
    /// `\`), each further one a line break.
    private mutating func foldQuoted(
        into out: inout [UInt8], escaped: Bool, parent: Int, quote: UInt8, startLine: Int
    ) throws(ConfigError) {
        var breaks = 0
        while byte == .newline {
            newline()
            breaks += 1
            var spaces = 0
            while byte == .space {
                pos += 1
                spaces += 1
            }
            while byte == .space || byte == .tab { pos += 1 }
            if let b = byte, b != .newline, spaces <= parent || (spaces == 0 && atDocumentMarker(at: lineStart)) {
                throw unterminated(quote, line: startLine)
            }
        }
        if escaped || breaks > 1 {
            out.append(contentsOf: repeatElement(.newline, count: breaks - 1))
        } else {
            out.append(.space)
        }
    }

    /// What `\0`, `\n`, ... stand for in a double-quoted scalar (`\x`, `\u`, `\U` take hex digits).
    private static let escapes: [UInt8: Unicode.Scalar] = [
        UInt8(ascii: "0"): "\0", UInt8(ascii: "a"): "\u{07}", UInt8(ascii: "b"): "\u{08}", UInt8(ascii: "t"): "\t",
        .tab: "\t", UInt8(ascii: "n"): "\n", UInt8(ascii: "v"): "\u{0B}", UInt8(ascii: "f"): "\u{0C}",
        UInt8(ascii: "r"): "\r", UInt8(ascii: "e"): "\u{1B}", .space: " ", .doubleQuote: "\"", .slash: "/",
        .backslash: "\\", UInt8(ascii: "N"): "\u{85}", UInt8(ascii: "_"): "\u{A0}", UInt8(ascii: "L"): "\u{2028}",
        UInt8(ascii: "P"): "\u{2029}",
    ]

    /// The character a `\` escape stands for, the cursor after the backslash.
    private mutating func escape(into out: inout [UInt8]) throws(ConfigError) {
        guard let e = byte else { return }
        pos += 1
        let digits: Int
        switch e {
        case UInt8(ascii: "x"): digits = 2
        case UInt8(ascii: "u"): digits = 4
        case UInt8(ascii: "U"): digits = 8
        default:
            guard let scalar = Self.escapes[e] else {
                throw invalid("unknown escape '\\\(Character(Unicode.Scalar(e)))' in a double-quoted value; "
                    + "write '\\\\' for a backslash")
            }
            UTF8.encode(scalar) { out.append($0) }
            return
        }
        var code: UInt32 = 0
        for _ in 0..<digits {
            guard let b = byte, let digit = hexValue(b) else {
                throw invalid("'\\\(Character(Unicode.Scalar(e)))' needs \(digits) hexadecimal digits")
            }
            code = code << 4 | UInt32(digit)
            pos += 1
        }
        guard let scalar = Unicode.Scalar(code) else {
            throw invalid("'\\\(Character(Unicode.Scalar(e)))' escapes no character "
                + "(\(String(code, radix: 16)) is not a Unicode scalar)")
        }
        UTF8.encode(scalar) { out.append($0) }
    }

    // MARK: Lines and blanks

    /// Skips blank lines, comment lines and indentation, the cursor at a line start; stops on
    /// the first character of content (or at the end).
    private mutating func skipToContent() throws(ConfigError) {
        while true {
            while byte == .space { pos += 1 }
            if byte == .tab {
                while byte == .space || byte == .tab { pos += 1 }
                guard atLineEnd else { throw invalid("a tab in the indentation; YAML indents with spaces only") }
            }
            switch byte {
            case .newline?:
                newline()
            case .hash?:
                while let b = byte, b != .newline { pos += 1 }
            default:
                return
            }
        }
    }

    /// Skips blanks and a comment to the end of the line and past its line break; anything
    /// else left on the line is an error.
    private mutating func finishLine() throws(ConfigError) {
        skipSpaces()
        if byte == .hash {
            while let b = byte, b != .newline { pos += 1 }
        }
        guard let b = byte else { return }
        guard b == .newline else {
            let rest = String(decoding: text[pos...].prefix { $0 != .newline }, as: UTF8.self)
            throw invalid("unexpected text after the value: \"\(rest.prefix(40))\"")
        }
        newline()
    }

    private mutating func skipSpaces() {
        while byte == .space || byte == .tab { pos += 1 }
    }

    private mutating func newline() {
        pos += 1
        line += 1
        lineStart = pos
    }

    private var byte: UInt8? { pos < text.count ? text[pos] : nil }
    private func peek(_ offset: Int) -> UInt8? { pos + offset < text.count ? text[pos + offset] : nil }
    private var column: Int { pos - lineStart }
    /// At the end of the line's content: its end, the end of the text, or a comment.
    private var atLineEnd: Bool { byte == nil || byte == .newline || byte == .hash }
    /// At `- `, a block list item.
    private var atEntry: Bool { byte == .dash && isBlank(peek(1)) }

    /// At `---` or `...` alone at the start of a line.
    private var atDocumentBoundary: Bool { column == 0 && atDocumentMarker(at: pos) }

    private func atDocumentMarker(_ b: UInt8) -> Bool { atDocumentBoundary && byte == b }

    /// `---` or `...` alone at `start`, a line start.
    private func atDocumentMarker(at start: Int) -> Bool {
        guard start + 3 <= text.count else { return false }
        let b = text[start]
        return (b == .dash || b == .dot) && text[start + 1] == b && text[start + 2] == b
            && (start + 3 == text.count || isBlank(text[start + 3]))
    }

    /// The number of spaces that indent the current line.
    private var leadingSpaces: Int {
        var n = 0
        while lineStart + n < text.count && text[lineStart + n] == .space { n += 1 }
        return n
    }

    private func isBlank(_ b: UInt8?) -> Bool { b == nil || b == .space || b == .tab || b == .newline }

    private func isFlowIndicator(_ b: UInt8) -> Bool {
        b == .comma || b == .openBracket || b == .closeBracket || b == .openBrace || b == .closeBrace
    }

    private func hexValue(_ b: UInt8) -> UInt8? {
        switch b {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): b - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): b - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): b - UInt8(ascii: "A") + 10
        default: nil
        }
    }

    // MARK: Errors

    private func invalid(_ message: String, line: Int? = nil) -> ConfigError {
        ConfigError(file: file, line: line ?? self.line, message: "not valid YAML: " + message)
    }

    private func unsupported(_ message: String, line: Int? = nil) -> ConfigError {
        ConfigError(file: file, line: line ?? self.line, message: message)
    }

    private func unterminated(_ quote: UInt8, line: Int) -> ConfigError {
        invalid("the \(quote == .singleQuote ? "'" : "\"") that opens a value on this line is never closed", line: line)
    }

    private func nestedMappingOnKeyLine() -> ConfigError {
        invalid("a mapping cannot start on the same line as its key; put it on the lines below, "
            + "or quote a value that contains ': '")
    }

    private func tooDeep() -> ConfigError {
        invalid("nested more than \(Self.maxDepth) levels deep")
    }
}

extension UInt8 {
    fileprivate static let newline = UInt8(ascii: "\n")
    fileprivate static let `return` = UInt8(ascii: "\r")
    fileprivate static let space = UInt8(ascii: " ")
    fileprivate static let tab = UInt8(ascii: "\t")
    fileprivate static let hash = UInt8(ascii: "#")
    fileprivate static let colon = UInt8(ascii: ":")
    fileprivate static let comma = UInt8(ascii: ",")
    fileprivate static let dash = UInt8(ascii: "-")
    fileprivate static let plus = UInt8(ascii: "+")
    fileprivate static let dot = UInt8(ascii: ".")
    fileprivate static let question = UInt8(ascii: "?")
    fileprivate static let pipe = UInt8(ascii: "|")
    fileprivate static let greater = UInt8(ascii: ">")
    fileprivate static let openBracket = UInt8(ascii: "[")
    fileprivate static let closeBracket = UInt8(ascii: "]")
    fileprivate static let openBrace = UInt8(ascii: "{")
    fileprivate static let closeBrace = UInt8(ascii: "}")
    fileprivate static let singleQuote = UInt8(ascii: "'")
    fileprivate static let doubleQuote = UInt8(ascii: "\"")
    fileprivate static let backslash = UInt8(ascii: "\\")
    fileprivate static let slash = UInt8(ascii: "/")
    fileprivate static let ampersand = UInt8(ascii: "&")
    fileprivate static let asterisk = UInt8(ascii: "*")
    fileprivate static let exclamation = UInt8(ascii: "!")
    fileprivate static let percent = UInt8(ascii: "%")
    fileprivate static let at = UInt8(ascii: "@")
    fileprivate static let backtick = UInt8(ascii: "`")
}
