import Basics

/// The client profiles of this machine: each `NAME.yaml` in `/etc/roam` is one, run by the
/// service `roam@NAME` (docs/USER-GUIDE.md). Names only: what lists them never reads a profile.
public enum Profiles {
    /// Where the profiles are installed.
    public static let directory = "/etc/roam"

    /// The most a profile may be: a configuration is a few kilobytes.
    public static let maxBytes = 256 << 10

    /// Whether `name` can be a profile's: a file name in the directory and a systemd instance
    /// name as it stands (letters, digits, `-` and `_`, at most 32, starting with a letter or
    /// digit).
    public static func isName(_ name: String) -> Bool {
        let bytes = Array(name.utf8)
        guard let first = bytes.first, bytes.count <= 32, isAlphanumeric(first) else { return false }
        return bytes.allSatisfy { isAlphanumeric($0) || $0 == UInt8(ascii: "-") || $0 == UInt8(ascii: "_") }
    }

    private static func isAlphanumeric(_ byte: UInt8) -> Bool {
        (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(byte) || (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains(byte)
            || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte)
    }

    /// The file a profile is installed as.
    public static func file(of name: String, in directory: String = Profiles.directory) -> String {
        directory + "/" + name + ".yaml"
    }

    /// The profiles' names in `directory`, sorted; nil when it cannot be listed.
    public static func names(in directory: String = Profiles.directory) -> [String]? {
        SystemFiles.names(in: directory).map { files in
            files.compactMap { file in
                guard !file.hasPrefix(".") else { return nil }
                return name(ofFile: file)
            }.sorted()
        }
    }

    /// The profile a configuration file is: its name without the directory and `.yaml`
    /// (`/etc/roam/work.yaml` is `work`); nil for a file that is not one (`notes.txt`, `.yaml`).
    public static func name(ofFile path: String) -> String? {
        let file = path.split(separator: "/", omittingEmptySubsequences: false).last.map(String.init) ?? path
        guard file.hasSuffix(".yaml"), file.count > 5 else { return nil }
        return String(file.dropLast(5))
    }
}
