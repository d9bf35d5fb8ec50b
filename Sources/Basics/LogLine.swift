/// The two line formats every operator log line of the agent uses.
public enum LogLine {
    /// `key=value key="value with spaces"`.
    public static func logfmt(_ fields: [(String, String)]) -> String {
        fields.map { key, value in
            let needsQuotes = value.isEmpty || value.contains { $0 == " " || $0 == "\"" || $0 == "=" || $0 == "\n" }
            return "\(key)=" + (needsQuotes ? quoted(value) : value)
        }.joined(separator: " ")
    }

    /// One JSON object; keys in `numbers` are written unquoted.
    public static func json(_ fields: [(String, String)], numbers: Set<String> = ["t"]) -> String {
        "{" + fields.map { key, value in
            quoted(key) + ":" + (numbers.contains(key) ? value : quoted(value))
        }.joined(separator: ",") + "}"
    }

    /// `s` as a JSON string literal, quotes included.
    public static func quotedJSON(_ s: String) -> String { quoted(s) }

    public static func quoted(_ s: String) -> String {
        var out = "\""
        for c in s.unicodeScalars {
            switch c {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            default:
                if c.value < 0x20 { out += "\\u" + String(String(c.value + 0x10000, radix: 16).dropFirst()) } else {
                    out.unicodeScalars.append(c)
                }
            }
        }
        return out + "\""
    }
}
