import Basics

/// Text for SVG (XML), written without Foundation: escaped text, coordinates, instants, colours.
enum SVGText {
    /// `text` safe inside an element or a quoted attribute: the five characters XML gives
    /// meaning escaped, and the control characters XML 1.0 forbids replaced by `?`.
    static func escaped(_ text: String) -> String {
        var out = ""
        out.reserveCapacity(text.utf8.count)
        for scalar in text.unicodeScalars {
            switch scalar {
            case "&": out += "&amp;"
            case "<": out += "&lt;"
            case ">": out += "&gt;"
            case "\"": out += "&quot;"
            case "'": out += "&apos;"
            case "\t", "\n", "\r": out.unicodeScalars.append(scalar)
            default:
                if scalar.value < 0x20 || (0xFFFE...0xFFFF).contains(scalar.value) {
                    out += "?"
                } else {
                    out.unicodeScalars.append(scalar)
                }
            }
        }
        return out
    }

    /// A coordinate with at most one decimal: `12.5`, `-3`, `0`.
    static func number(_ value: Double) -> String {
        guard value.isFinite else { return "0" }
        let tenths = Int((value * 10).rounded())
        let sign = tenths < 0 ? "-" : ""
        let magnitude = tenths.magnitude
        return sign + "\(magnitude / 10)" + (magnitude % 10 == 0 ? "" : ".\(magnitude % 10)")
    }

    /// A class name made of `text`: letters, digits, `-` and `_` kept, anything else `_`.
    static func token(_ text: String) -> String {
        String(text.unicodeScalars.map { scalar -> Character in
            switch scalar {
            case "a"..."z", "A"..."Z", "0"..."9", "-", "_": Character(scalar)
            default: "_"
            }
        })
    }

    /// An instant on a time axis: `45s`, `2m30s`, `10h30m`, `1m05.250s`, with `decimals`
    /// digits after the seconds' point.
    static func clock(_ nanoseconds: Int64, decimals: Int) -> String {
        let sign = nanoseconds < 0 ? "-" : ""
        let ns = nanoseconds.magnitude
        let hours = ns / 3_600_000_000_000
        let minutes = ns / 60_000_000_000 % 60
        let rest = ns % 60_000_000_000
        var out = sign
        if hours > 0 { out += "\(hours)h" }
        if minutes > 0 || (hours > 0 && rest > 0) { out += (hours > 0 && minutes < 10 ? "0" : "") + "\(minutes)m" }
        if rest > 0 || out == sign {
            var seconds = Duration.nanoseconds(Int64(rest)).seconds(decimals: decimals)
            if out != sign && rest < 10_000_000_000 { seconds = "0" + seconds }
            out += seconds + "s"
        }
        return out
    }

    /// `#rrggbb` at 60 % of its brightness.
    static func darker(_ colour: String) -> String {
        let digits = Array(colour.utf8.dropFirst())
        guard digits.count == 6 else { return colour }
        let hex = Array("0123456789abcdef".utf8)
        func value(_ c: UInt8) -> Int { hex.firstIndex(of: c | 0x20) ?? 0 }
        var out = "#"
        for i in stride(from: 0, to: 6, by: 2) {
            let channel = (value(digits[i]) * 16 + value(digits[i + 1])) * 6 / 10
            out += String(UnicodeScalar(hex[channel / 16])) + String(UnicodeScalar(hex[channel % 16]))
        }
        return out
    }
}
