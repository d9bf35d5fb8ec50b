import ConfigReader
import Basics
import Testing

private func parse(_ text: String) throws(ConfigError) -> Node {
    try YAMLReader(file: "t.yaml").document(text)
}

/// `{"a": ["x", "y"]}`: scalars quoted as Swift writes them; `@line` after every node with `lines`.
private func render(_ node: Node, lines: Bool = false) -> String {
    let at = lines ? "@\(node.line)" : ""
    switch node.value {
    case .scalar(let text):
        return text.debugDescription + at
    case .sequence(let items):
        return "[" + items.map { render($0, lines: lines) }.joined(separator: ", ") + "]" + at
    case .mapping(let pairs):
        return "{" + pairs.map { render($0.key, lines: lines) + ": " + render($0.value, lines: lines) }
            .joined(separator: ", ") + "}" + at
    }
}

private func rendered(_ text: String, lines: Bool = false) throws -> String { render(try parse(text), lines: lines) }

private let repository = String(#filePath).split(separator: "/", omittingEmptySubsequences: false).dropLast(3)
    .joined(separator: "/")

// MARK: Block collections

@Test func blockMappingsAndListsNestByIndentation() throws {
    let text = """
        name: test
        network:
          links:
            - eth0
            - wifi0
          mtu: 1500
        until: 60s
        """
    #expect(try rendered(text, lines: true) == """
        {"name"@1: "test"@1, "network"@2: {"links"@3: ["eth0"@4, "wifi0"@5]@4, "mtu"@6: "1500"@6}@3, \
        "until"@7: "60s"@7}@1
        """)
}

@Test func listItemsCarryMappingsThatContinueBelow() throws {
    let text = """
        - at: 1s
          link: {name: eth0}
        - at: 2s
          nested:
            - - a
              - b
            - c
        -
        - last
        """
    #expect(try rendered(text, lines: true) == """
        [{"at"@1: "1s"@1, "link"@2: {"name"@2: "eth0"@2}@2}@1, {"at"@3: "2s"@3, "nested"@4: [["a"@5, "b"@6]@5, \
        "c"@7]@5}@3, ""@8, "last"@9]@1
        """)
}

@Test func aListMayStandAtItsKeysIndentation() throws {
    #expect(try rendered("a:\n- 1\n- 2\nb:\n  - x: 1\n  - y\nc: 3") == #"{"a": ["1", "2"], "b": [{"x": "1"}, "y"], "c": "3"}"#)
}

@Test func aKeyWithNothingAfterItIsTheEmptyScalar() throws {
    #expect(try rendered("a:\nb: # comment\nc:\n\nd: 1\ne:", lines: true)
        == #"{"a"@1: ""@1, "b"@2: ""@2, "c"@3: ""@3, "d"@5: "1"@5, "e"@6: ""@6}@1"#)
    #expect(try rendered("a: ''\nb: \"\"") == #"{"a": "", "b": ""}"#)
}

// MARK: Flow collections

@Test func flowCollectionsNestAndSpanLines() throws {
    #expect(try rendered("{a: 1, b: [x, y], c: {d: [e, {f: g}]}, 'h': \"i\"}")
        == #"{"a": "1", "b": ["x", "y"], "c": {"d": ["e", {"f": "g"}]}, "h": "i"}"#)
    #expect(try rendered("routes: [a,\n  b, # the second\n\n  c]\nmap: {x: 1,\n  y: 2,}\nnext: [[]]", lines: true)
        == #"{"routes"@1: ["a"@1, "b"@2, "c"@4]@1, "map"@5: {"x"@5: "1"@5, "y"@6: "2"@6}@5, "next"@7: [[]@7]@7}@1"#)
    #expect(try rendered("[a: 1, {}, b]") == #"[{"a": "1"}, {}, "b"]"#)
    #expect(try rendered("{a, b: }") == #"{"a": "", "b": ""}"#)
}

// MARK: Scalars

@Test func plainScalarsKeepTheirText() throws {
    let hex = String(repeating: "0a1b2c3d", count: 1000)
    let text = """
        addr: 10.0.0.1/24
        rtt: 250ms
        key: DOhENSqkl0bz76f4V74zWBszpV8RtmtBNnLQvt8mvwM=
        route: {to: default, via: fe80::1, addr: 2001:db8::7/64}
        sequence: [connecting:pathAppeared(wifi0), connected]
        url: http://example.com/a#b
        spaced: a  b   # comment
        odd: -1, ?x, :y
        netlink: \(hex)
        """
    #expect(try rendered(text) == """
        {"addr": "10.0.0.1/24", "rtt": "250ms", "key": "DOhENSqkl0bz76f4V74zWBszpV8RtmtBNnLQvt8mvwM=", \
        "route": {"to": "default", "via": "fe80::1", "addr": "2001:db8::7/64"}, \
        "sequence": ["connecting:pathAppeared(wifi0)", "connected"], "url": "http://example.com/a#b", \
        "spaced": "a  b", "odd": "-1, ?x, :y", "netlink": \(hex.debugDescription)}
        """)
}

@Test func plainScalarsContinueOnMoreIndentedLines() throws {
    #expect(try rendered("about: a long\n  sentence\n\n  and more\nnext: 1", lines: true)
        == #"{"about"@1: "a long sentence\nand more"@1, "next"@5: "1"@5}@1"#)
    #expect(try rendered("- a\n  b\n- c") == #"["a b", "c"]"#)
}

@Test func quotedScalarsUnescape() throws {
    let text = #"""
        single: 'it''s # not a comment'
        double: "q\" b\\ n\n t\t e\u00e9 x\x41 U\U0001F600 s\/"
        server: "[2001:db8::7]:51820"
        folded: "one
          two

          three"
        joined: "ab\
          cd"
        """#
    #expect(try rendered(text, lines: true) == #"""
        {"single"@1: "it\'s # not a comment"@1, "double"@2: "q\" b\\ n\n t\t eé xA U😀 s/"@2, \#
        "server"@3: "[2001:db8::7]:51820"@3, "folded"@4: "one two\nthree"@4, "joined"@8: "abcd"@8}@1
        """#)
}

@Test func blockScalarsKeepOrFoldLines() throws {
    let text = """
        literal: |
          line one
            indented

          line three
        folded: >
          folded
          text

          new paragraph
            kept as is
          end
        strip: |-
          no newline

        keep: |+
          all newlines


        indicator: |2
            two extra
        last: >-
          x
          y
        """
    #expect(try rendered(text, lines: true) == #"""
        {"literal"@1: "line one\n  indented\n\nline three\n"@1, \#
        "folded"@6: "folded text\nnew paragraph\n  kept as is\nend\n"@6, "strip"@13: "no newline"@13, \#
        "keep"@16: "all newlines\n\n\n"@16, "indicator"@20: "  two extra\n"@20, "last"@22: "x y"@22}@1
        """#)
    #expect(try rendered("- |\n  in a list\n- >\n\n  leading blank\n") == #"["in a list\n", "\nleading blank\n"]"#)
}

// MARK: Comments, documents, line ends

@Test func commentsAndDocumentMarkersAreSkipped() throws {
    let text = """
        # a scenario
        --- # the only document
        a: 1 # trailing
          # indented comment
        b: [x]# right after
        c: 'y' # after a quote
        ...
        # the end
        """
    #expect(try rendered(text, lines: true) == #"{"a"@3: "1"@3, "b"@5: ["x"@5]@5, "c"@6: "y"@6}@3"#)
}

@Test func lineEndsAndByteOrderMarkAreNormalised() throws {
    #expect(try rendered("\u{FEFF}a: 1\r\nb: |\r\n  x\r\n", lines: true) == #"{"a"@1: "1"@1, "b"@2: "x\n"@2}@1"#)
}

@Test func anEmptyFileIsAnError() {
    for text in ["", "\n\n# only a comment\n", "---\n"] {
        #expect(message(of: text) == "t.yaml:1: the file is empty")
    }
}

@Test func duplicateKeysAreLeftToTheReader() throws {
    let reader = YAMLReader(file: "t.yaml")
    let node = try reader.document("a: 1\nb: 2\na: 3")
    #expect(render(node) == #"{"a": "1", "b": "2", "a": "3"}"#)
    #expect {
        try reader.fields(node, "the test", allowed: ["a", "b"])
    } throws: { error in
        (error as? ConfigError)?.description == "t.yaml:3: 'a' appears twice"
    }
}

// MARK: Errors

private func message(of text: String) -> String? {
    do {
        _ = try parse(text)
        return nil
    } catch {
        return error.description
    }
}

@Test(arguments: [
    ("a: 1\nb: \"open\nc: 2", 2, "never closed"),
    ("a: 'open", 1, "never closed"),
    ("a: \"ok\"\nb: \"x\\q\"", 2, "unknown escape '\\q'"),
    ("a: \"\\u12\"", 1, "4 hexadecimal digits"),
    ("a: \"\\uD800\"", 1, "not a Unicode scalar"),
    ("a:\n    b: 1\n  c: 2", 3, "indented more than the keys above"),
    ("a: 1\n  b: 2", 2, "continues the value from line 1"),
    ("- - a\n - b", 2, "indented more than the '- ' items above"),
    ("- a\nb: 1", 2, "does not fit the structure above"),
    ("a:\n\tb: 1", 2, "a tab in the indentation"),
    ("-\ta: 1", 1, "a tab after '-'"),
    ("a: [1, 2\nb: 3", 1, "'[' on this line is never closed"),
    ("a: {x: 1, y: [2]", 1, "'{' on this line is never closed"),
    ("a:\n  b: [1,\n  2]", 2, "'[' on this line is never closed"),
    ("a: [1 2] x", 1, "unexpected text after ']'"),
    ("server: [2001:db8::7]:51820", 1, "quote it"),
    ("a: [1; 2}", 1, "expected ',' or ']'"),
    ("a: [1, , 2]", 1, "a value is missing before ','"),
    ("a: [::1]", 1, "cannot start with ':'"),
    ("a: &anchor 1\nb: *anchor", 1, "anchors and aliases"),
    ("a: 1\nb: [*x]", 2, "anchors and aliases"),
    ("a: !!str 1", 1, "tags (!) are not supported"),
    ("? a\n: b", 1, "complex keys"),
    ("[a]: b", 1, "unexpected text after ']'"),
    ("a: 1\n---\nb: 2", 2, "one document per file"),
    ("a: 1\n...\n\nb: 2", 4, "one document per file"),
    ("%YAML 1.2\n---\na: 1", 1, "directives"),
    ("a: b: c", 1, "a mapping cannot start on the same line as its key"),
    ("a: - b", 1, "a list cannot start on the same line as its key"),
    ("a: 1\nkey:value", 2, "put a space after the ':'"),
    ("a: 1\njust text", 2, "expected 'key: value'"),
    ("a: |x\n  text", 1, "after '|' only"),
    ("a: @home", 1, "cannot start with '@'"),
    ("a: {b: |\n  x}", 1, "block scalars ('|' and '>') cannot appear inside"),
    ("\"a\nb\": 1", 1, "a key must fit on one line"),
])
func malformedYAMLPointsAtItsLine(text: String, line: Int, message: String) {
    #expect {
        try parse(text)
    } throws: { error in
        guard let error = error as? ConfigError else { return false }
        return error.file == "t.yaml" && error.line == line && error.message.contains(message)
    }
}

@Test func nestingIsBounded() throws {
    let deepest = 64
    #expect(try rendered(String(repeating: "[", count: deepest) + String(repeating: "]", count: deepest)).count == 2 * deepest)
    for text in [
        String(repeating: "[", count: deepest + 1) + String(repeating: "]", count: deepest + 1),
        String(repeating: "[", count: 100_000),
        String(repeating: "{a: ", count: 1000),
        String(repeating: "- ", count: 1000) + "x",
        (0..<1000).map { String(repeating: " ", count: $0) + "k:\n" }.joined(),
    ] {
        #expect(message(of: text)?.contains("nested more than \(deepest) levels deep") == true)
    }
}

// MARK: Fuzz

@Test func randomMutationsOfARealFileParseOrFailWithALine() throws {
    let path = repository + "/Scenarios/ethernet-plugged-in-on-wifi.yaml"
    let original = try #require(SystemFiles.bytes(path), "cannot read \(path)")
    let pieces: [[UInt8]] = ["\n", " ", "  ", "\t", ":", ": ", "- ", "-", "[", "]", "{", "}", ",", "#", "'", "\"", "\\",
                             "|", ">", "|-", ">+", "&a ", "*a", "!", "? ", "%", "---", "...", "\n  ", "\n- ", "a: ",
                             "\"\\u", "\r", "\u{FEFF}", "é"].map { Array($0.utf8) }
    var random = SeededRandom(seed: 2024)  // seeded, so a failure can be replayed
    var parsed = 0
    for _ in 0..<5000 {
        var bytes = original
        for _ in 0..<Int.random(in: 1...4, using: &random) {
            let at = Int.random(in: 0..<bytes.count, using: &random)
            let piece = pieces.randomElement(using: &random) ?? []
            switch Int.random(in: 0..<4, using: &random) {
            case 0: bytes.removeSubrange(at..<min(bytes.count, at + Int.random(in: 1...8, using: &random)))
            case 1: bytes.insert(contentsOf: piece, at: at)
            case 2: bytes.replaceSubrange(at..<min(bytes.count, at + piece.count), with: piece)
            default: bytes.insert(contentsOf: bytes[at..<min(bytes.count, at + 40)], at: Int.random(in: 0...bytes.count, using: &random))
            }
            if bytes.isEmpty { bytes = original }
        }
        let text = String(decoding: bytes, as: UTF8.self)
        let lines = bytes.filter { $0 == UInt8(ascii: "\n") || $0 == UInt8(ascii: "\r") }.count + 1
        do {
            _ = try parse(text)
            parsed += 1
        } catch {
            #expect((1...lines + 1).contains(error.line), "\(error)")
        }
    }
    // Most mutations of a real file still parse; many do not.
    #expect(parsed > 500 && parsed < 4900)
}
