/// What `agent bugreport` puts in its archive, made safe to hand to someone else: the
/// configuration with every secret value and comment taken out, any text with the secrets the
/// agent reads from its files removed wherever they appear, and the files laid out as a tar
/// archive. Pure: texts in, texts and bytes out.
public enum ProblemReport {
    /// What stands where something was taken out.
    public static let removed = "<removed>"

    /// A configuration's text without its secrets. An allowlist: a `key: value` is kept only
    /// when the key is one the configuration readers know and holds no secret (`knownKeys`),
    /// and the value is whole on its line; a list item only when it is a plain word (an
    /// address, a prefix, a name). Anything else (a password hash, an unknown key, a block
    /// scalar and its lines, a quoted value continued on the next line, a line not understood)
    /// stands as `<removed>`. Flow mappings are read key by key, quoted keys too. Every
    /// comment goes (where people keep an old password), and so does the password of any URL.
    public static func redactConfiguration(_ text: String) -> String {
        var out: [String] = []
        var blockIndent: Int?  // inside a block scalar (`|`, `>`): lines indented deeper go
        for raw in text.split(omittingEmptySubsequences: false, whereSeparator: \.isNewline) {
            var line = String(raw)
            line = withoutComment(line)
            let indent = line.prefix { $0 == " " || $0 == "\t" }.count
            if line.count == indent {
                out.append("")
                continue
            }
            if let block = blockIndent {
                if indent > block { continue }
                blockIndent = nil
            }
            let (kept, opensBlock) = redactLine(line, indent: indent)
            if opensBlock { blockIndent = indent }
            out.append(redactURLPasswords(kept))
        }
        return out.joined(separator: "\n")
    }

    /// The keys the configuration readers accept whose values are no secret (a `-file` key
    /// names a file, which stays; `password-hash` is the one secret value). A test keeps this
    /// list equal to what the readers accept.
    public static let knownKeys: Set<String> = [
        "ac", "action", "address", "addresses", "allow-lan", "allow-versions", "backoff-base", "backoff-cap",
        "battery", "burst", "certificate", "certificate-key", "check", "cipher", "dead-path-hold-down", "debounce",
        "direct", "dns", "dns-domain", "drain-period", "exclusion", "expect", "flap-hold-down", "flap-stable-after",
        "flap-window", "gateway", "gateway-mac", "handshake-resend", "handshake-timeout", "interface",
        "interface-kind", "key", "listen-port", "liveness-timeout", "lockdown", "manager", "match", "max-hold-down",
        "max-probe-attempts", "metrics-file", "metrics-listen", "min-mtu", "mode", "mtu", "mtu-raise-after", "name",
        "never-local", "offload", "on-demand", "operators", "password-file", "path-mtu-discovery", "persistent-keepalive", "pin",
        "port", "portal", "portal-check", "portal-recheck", "portal-recheck-cap", "portal-window",
        "portal-window-recheck", "priority", "private-key-file", "probe", "probe-attempts", "probe-timeout",
        "protocol", "protocol-fallback", "proxy", "public-key", "race-delay", "recheck", "recheck-cap", "reconnect",
        "refill", "routes", "rtt-stale-after", "search", "server", "server-key", "servers", "session-lifetime",
        "short-sleep", "snapshot", "ssid", "stable-after", "stream", "subnet", "tcp", "tunnel", "udp-retest",
        "udp-retest-cap", "url", "user", "username", "users", "users-from", "window", "workers",
    ]

    /// One line without its secrets, and whether it opens a block scalar.
    static func redactLine(_ line: String, indent: Int) -> (String, opensBlock: Bool) {
        let head = String(line.prefix(indent))
        var rest = Substring(line.dropFirst(indent))
        var dash = ""
        while rest.hasPrefix("- ") {
            dash += "- "
            rest = rest.dropFirst(2)
        }
        if rest == "-" { return (line, false) }
        if let (key, value) = keyAndValue(rest) {
            let prefix = head + dash + key + ":"
            guard knownKeys.contains(key) else {
                return (prefix + " " + removed, value.first == "|" || value.first == ">")
            }
            if value.isEmpty { return (prefix, false) }
            if value.first == "|" || value.first == ">" { return (prefix + " " + removed, true) }
            guard let flow = redactFlow(value) else { return (prefix + " " + removed, false) }
            return (prefix + " " + flow, false)
        }
        // A list item, or a flow collection standing alone.
        if rest.first == "{" || rest.first == "[", let flow = redactFlow(rest) { return (head + dash + flow, false) }
        if !dash.isEmpty, rest.allSatisfy(isPlainWordCharacter) { return (line, false) }
        return (head + dash + removed, false)
    }

    /// `key: value` (the key plain or quoted, the `:` followed by a blank or the line's end).
    static func keyAndValue(_ text: Substring) -> (key: String, value: Substring)? {
        var key: String
        var rest: Substring
        if let quote = text.first, quote == "\"" || quote == "'" {
            guard let close = text.dropFirst().firstIndex(of: quote) else { return nil }
            key = String(text[text.index(after: text.startIndex)..<close])
            rest = text[text.index(after: close)...]
            while rest.first == " " || rest.first == "\t" { rest = rest.dropFirst() }
            guard rest.first == ":" else { return nil }
        } else {
            guard let colon = text.firstIndex(of: ":") else { return nil }
            key = String(text[..<colon])
            while key.last == " " || key.last == "\t" { key.removeLast() }
            guard !key.isEmpty, key.allSatisfy({ isKeyCharacter($0) }) else { return nil }
            rest = text[colon...]
        }
        rest = rest.dropFirst()  // the ':'
        guard rest.isEmpty || rest.first == " " || rest.first == "\t" else { return nil }
        while rest.first == " " || rest.first == "\t" { rest = rest.dropFirst() }
        return (key, rest)
    }

    /// A value that is whole on its line, with every flow mapping's unknown or secret key's
    /// value removed; nil when it is not whole (an unclosed quote or bracket: it goes on).
    static func redactFlow(_ value: Substring) -> String? {
        let characters = Array(value)
        var out = ""
        var i = 0
        var depth: [Character] = []  // the open `{` and `[`
        var expectKey = false       // right after `{` or a `,` inside a mapping
        func skipQuoted(_ from: Int) -> Int? {
            let quote = characters[from]
            var j = from + 1
            while j < characters.count {
                if characters[j] == "\\", quote == "\"" { j += 2; continue }
                if characters[j] == quote {
                    if quote == "'", j + 1 < characters.count, characters[j + 1] == "'" { j += 2; continue }
                    return j + 1
                }
                j += 1
            }
            return nil
        }
        while i < characters.count {
            let c = characters[i]
            if expectKey, c != " " {
                expectKey = false
                // The key up to its ':', quoted or plain.
                var j = i
                if c == "\"" || c == "'" {
                    guard let end = skipQuoted(i) else { return nil }
                    j = end
                } else {
                    while j < characters.count, characters[j] != ":", characters[j] != ",", characters[j] != "}" { j += 1 }
                }
                let keyText = String(characters[i..<j])
                let key = keyText.trimming(" \"'")
                // Skips a value to the `, ` or `}` that ends it at this depth (a comma without a
                // blank after it, as in an Argon2 hash, does not end it here).
                func skipValue(from start: Int) -> Int? {
                    var k = start
                    var inner = 0
                    while k < characters.count {
                        let d = characters[k]
                        if d == "\"" || d == "'" {
                            guard let end = skipQuoted(k) else { return nil }
                            k = end
                            continue
                        }
                        if d == "{" || d == "[" { inner += 1 }
                        if d == "}" || d == "]" {
                            if inner == 0 { break }
                            inner -= 1
                        }
                        if d == ",", inner == 0, k + 1 == characters.count || characters[k + 1] == " " { break }
                        k += 1
                    }
                    return k
                }
                if j < characters.count, characters[j] == ":", j + 1 == characters.count || characters[j + 1] == " " {
                    out += keyText + ":"
                    i = j + 1
                    if !knownKeys.contains(key) {
                        guard let end = skipValue(from: i) else { return nil }
                        out += " " + removed
                        i = end
                    }
                    continue
                }
                // Not a key where one was expected: something this reading does not know; removed.
                guard let end = skipValue(from: i) else { return nil }
                out += removed
                i = end
                continue
            }
            if c == "\"" || c == "'" {
                guard let end = skipQuoted(i) else { return nil }
                out += String(characters[i..<end])
                i = end
                continue
            }
            out.append(c)
            switch c {
            case "{": depth.append(c); expectKey = true
            case "[": depth.append(c)
            case "}", "]":
                guard !depth.isEmpty else { return nil }
                depth.removeLast()
            case ",": expectKey = depth.last == "{"
            default: break
            }
            i += 1
        }
        return depth.isEmpty ? out : nil
    }

    /// What a plain list item may hold to be kept: an address, a prefix, a name, a port.
    static func isPlainWordCharacter(_ c: Character) -> Bool {
        c.isLetter || c.isNumber || ".:/_@[]-".contains(c)
    }

    /// The line up to its comment: a `#` at the line's start or after a blank, wherever it is
    /// (inside quotes too: removing a little too much is harmless in a report).
    static func withoutComment(_ line: String) -> String {
        let characters = Array(line)
        for (i, c) in characters.enumerated() where c == "#" && (i == 0 || characters[i - 1] == " " || characters[i - 1] == "\t") {
            var kept = String(characters[..<i])
            while kept.last == " " || kept.last == "\t" { kept.removeLast() }
            return kept
        }
        return line
    }

    private static func isKeyCharacter(_ c: Character) -> Bool {
        c.isLetter || c.isNumber || c == "-" || c == "_"
    }

    /// `scheme://user:password@host` becomes `scheme://user:<removed>@host`, and the value of
    /// every `password=` (a URL's query, a libpq conninfo), anywhere in `text`. The user part
    /// runs to the last `@` before a blank or a quote: a password may hold `/`, `?` or `#`.
    public static func redactURLPasswords(_ text: String) -> String {
        var out = ""
        var rest = Substring(text)
        while let scheme = rest.firstRange(of: "://") {
            out += rest[..<scheme.upperBound]
            rest = rest[scheme.upperBound...]
            let tokenEnd = rest.firstIndex { " \t\n\"'".contains($0) } ?? rest.endIndex
            let token = rest[..<tokenEnd]
            if let at = token.lastIndex(of: "@"), let colon = token[..<at].firstIndex(of: ":") {
                out += token[...colon] + removed
                rest = rest[at...]
            }
        }
        out += rest
        return redactPasswordParameters(out)
    }

    /// The value of every `password=` (any case) replaced, up to `&`, a blank or a quote.
    static func redactPasswordParameters(_ text: String) -> String {
        let lower = Array(text.lowercased().utf8)
        let bytes = Array(text.utf8)
        guard lower.count == bytes.count else { return text }  // a case mapping that changed lengths: leave it
        let needle = Array("password=".utf8)
        var out: [UInt8] = []
        var i = 0
        while i < bytes.count {
            if i + needle.count <= bytes.count, Array(lower[i..<(i + needle.count)]) == needle {
                out += bytes[i..<(i + needle.count)]
                i += needle.count
                while i < bytes.count, !"& \t\n\"'".utf8.contains(bytes[i]) { i += 1 }
                out += Array(removed.utf8)
                continue
            }
            out.append(bytes[i])
            i += 1
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// `text` with every occurrence of each of `secrets` (values of six characters or more,
    /// so that removing one cannot wipe out ordinary words) replaced.
    public static func scrub(_ text: String, secrets: [String]) -> String {
        var out = text
        for secret in Set(secrets) where secret.count >= 6 {
            out = out.replacing(secret, with: removed)
        }
        return out
    }

    /// The values a secret file holds, as they could appear in text: the whole file trimmed,
    /// each line, and the last `:`-separated field of a line (libpq's passfile keeps the
    /// password there, after the host, port, database and user, which may stay).
    public static func secretValues(inFile text: String) -> [String] {
        var values = [text.trimmingBlanks]
        for line in text.split(whereSeparator: \.isNewline) {
            let trimmed = String(line).trimmingBlanks
            values.append(trimmed)
            if trimmed.contains(":"), let last = trimmed.split(separator: ":").last { values.append(String(last).trimmingBlanks) }
        }
        return values.filter { !$0.isEmpty }
    }
}

extension String {
    /// Without the characters of `set` at either end.
    fileprivate func trimming(_ set: String) -> String {
        var s = Substring(self)
        while let first = s.first, set.contains(first) { s.removeFirst() }
        while let last = s.last, set.contains(last) { s.removeLast() }
        return String(s)
    }

    fileprivate var trimmingBlanks: String {
        var s = Substring(self)
        while let first = s.first, first == " " || first == "\t" || first == "\r" || first == "\n" { s.removeFirst() }
        while let last = s.last, last == " " || last == "\t" || last == "\r" || last == "\n" { s.removeLast() }
        return String(s)
    }
}

/// A tar archive (POSIX ustar) of regular files, written whole in memory: what `tar -xf` and
/// every archive tool read, with no library.
public struct TarArchive: Sendable {
    public private(set) var bytes: [UInt8] = []
    /// When the files were written (seconds since 1970), the same for all.
    public let modified: Int

    public init(modified: Int) { self.modified = modified }

    /// Adds a file named `name` (at most 100 bytes, `/` for directories) holding `contents`,
    /// owner-only readable.
    public mutating func add(_ name: String, _ contents: [UInt8]) {
        var header = [UInt8](repeating: 0, count: 512)
        func put(_ text: String, at offset: Int, width: Int) {
            for (i, byte) in text.utf8.prefix(width).enumerated() { header[offset + i] = byte }
        }
        func octal(_ value: Int, at offset: Int, width: Int) {
            let digits = String(value, radix: 8)
            put(String(repeating: "0", count: max(0, width - 1 - digits.count)) + digits, at: offset, width: width - 1)
        }
        put(name, at: 0, width: 100)
        octal(0o600, at: 100, width: 8)
        octal(0, at: 108, width: 8)  // uid
        octal(0, at: 116, width: 8)  // gid
        octal(contents.count, at: 124, width: 12)
        octal(modified, at: 136, width: 12)
        header[156] = UInt8(ascii: "0")  // a regular file
        put("ustar", at: 257, width: 6)
        put("00", at: 263, width: 2)
        put("root", at: 265, width: 32)
        put("root", at: 297, width: 32)
        // The checksum is taken with its own field as eight blanks.
        for i in 148..<156 { header[i] = UInt8(ascii: " ") }
        let sum = header.reduce(0) { $0 + Int($1) }
        octal(sum, at: 148, width: 7)
        header[155] = UInt8(ascii: " ")
        bytes += header
        bytes += contents
        bytes += [UInt8](repeating: 0, count: (512 - contents.count % 512) % 512)
    }

    /// The archive with its end (two empty blocks).
    public var finished: [UInt8] { bytes + [UInt8](repeating: 0, count: 1024) }
}
