import Basics

/// The client profiles of this machine: each `NAME.yaml` in `/etc/roam` is one, run by the
/// service `roam@NAME` (docs/USER-GUIDE.md). Names only: what lists them never reads a profile.
public enum Profiles {
    /// Where the profiles are installed.
    public static let directory = "/etc/roam"

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
