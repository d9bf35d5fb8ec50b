/// What `agent bugreport` puts in its archive, made safe to hand to someone else: the
/// configuration with every secret value and comment taken out, any text with the secrets the
/// agent reads from its files removed wherever they appear, and the files laid out as a tar
/// archive. Pure: texts in, texts and bytes out.
public enum ProblemReport {
    /// What stands where something was taken out.
    public static let removed = "<removed>"

    /// A configuration's text without its secrets: the value of every key that holds one
    /// (a password, a hash, a token, a secret, an inline private key; a `-file` key names a
    /// file, which stays), the password of any URL, and every comment (where people keep an
    /// old password). Flow mappings (`{name: a, password-hash: "..."}`) are read as well as
    /// block ones.
    public static func redactConfiguration(_ text: String) -> String {
        text.split(separator: "\n", omittingEmptySubsequences: false)
            .map { redactURLPasswords(redactValues(withoutComment(String($0)))) }
            .joined(separator: "\n")
    }

    /// Whether a configuration key's value is a secret.
    static func isSecret(_ key: String) -> Bool {
        let key = key.lowercased()
        guard !key.hasSuffix("-file") else { return false }
        return ["password", "secret", "token", "hash", "private-key", "psk"].contains { key.contains($0) }
    }

    /// The line up to its comment: a `#` at the line's start or after a blank, outside quotes.
    static func withoutComment(_ line: String) -> String {
        let characters = Array(line)
        var quote: Character?
        for (i, c) in characters.enumerated() {
            if let open = quote {
                if c == open { quote = nil }
            } else if c == "\"" || c == "'" {
                quote = c
            } else if c == "#", i == 0 || characters[i - 1] == " " || characters[i - 1] == "\t" {
                var kept = String(characters[..<i])
                while kept.last == " " || kept.last == "\t" { kept.removeLast() }
                return kept
            }
        }
        return line
    }

    /// Every `key: value` in the line whose key holds a secret, the value replaced: to the end
    /// of the line, or in a flow mapping to the next `,` or `}` outside quotes.
    static func redactValues(_ line: String) -> String {
        let characters = Array(line)
        var out: [Character] = []
        var i = 0
        var depth = 0  // inside how many `{` or `[`
        while i < characters.count {
            let c = characters[i]
            if c == "{" || c == "[" { depth += 1 }
            if c == "}" || c == "]" { depth = max(0, depth - 1) }
            // A key starts the line's content or follows `{`, `,` or `- `.
            let startsKey = isKeyCharacter(c) && (i == 0 || [" ", "\t", "{", ",", "-"].contains(characters[i - 1]))
            guard startsKey else {
                out.append(c)
                i += 1
                continue
            }
            var end = i
            while end < characters.count, isKeyCharacter(characters[end]) { end += 1 }
            let key = String(characters[i..<end])
            out.append(contentsOf: characters[i..<end])
            i = end
            guard i < characters.count, characters[i] == ":", i + 1 == characters.count || characters[i + 1] == " ",
                  isSecret(key) else { continue }
            out.append(":")
            i += 1
            while i < characters.count, characters[i] == " " { i += 1 }
            guard i < characters.count else { break }
            // Skip the value: a quoted string whole, else up to where the flow mapping goes on.
            if characters[i] == "\"" || characters[i] == "'" {
                let open = characters[i]
                i += 1
                while i < characters.count, characters[i] != open { i += characters[i] == "\\" && open == "\"" ? 2 : 1 }
                i = min(i + 1, characters.count)
            } else {
                // In a flow mapping a plain value ends at `}`, `]` or a `,` before a blank (an
                // Argon2 hash holds commas without one); elsewhere it runs to the line's end.
                while i < characters.count {
                    if depth > 0, characters[i] == "}" || characters[i] == "]" { break }
                    if depth > 0, characters[i] == ",", i + 1 == characters.count || characters[i + 1] == " " { break }
                    i += 1
                }
            }
            out.append(contentsOf: " " + removed)
        }
        return String(out)
    }

    private static func isKeyCharacter(_ c: Character) -> Bool {
        c.isLetter || c.isNumber || c == "-" || c == "_"
    }

    /// `scheme://user:password@host` becomes `scheme://user:<removed>@host`, anywhere in `text`.
    public static func redactURLPasswords(_ text: String) -> String {
        guard text.contains("://") else { return text }
        var out = ""
        var rest = Substring(text)
        while let scheme = rest.firstRange(of: "://") {
            out += rest[..<scheme.upperBound]
            rest = rest[scheme.upperBound...]
            // The authority ends at the first '/', '?', '#' or blank; a password sits between
            // the first ':' and the last '@' inside it.
            let authorityEnd = rest.firstIndex { "/?# \t\n\"'".contains($0) } ?? rest.endIndex
            let authority = rest[..<authorityEnd]
            if let at = authority.lastIndex(of: "@"), let colon = authority[..<at].firstIndex(of: ":") {
                out += authority[...colon] + removed + authority[at...]
            } else {
                out += authority
            }
            rest = rest[authorityEnd...]
        }
        return out + rest
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
        for line in text.split(separator: "\n") {
            let trimmed = String(line).trimmingBlanks
            values.append(trimmed)
            if trimmed.contains(":"), let last = trimmed.split(separator: ":").last { values.append(String(last).trimmingBlanks) }
        }
        return values.filter { !$0.isEmpty }
    }
}

extension String {
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
