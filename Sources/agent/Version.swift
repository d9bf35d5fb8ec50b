/// The release this build is: what `agent --version` says and the Debian package is named
/// (`scripts/package` reads it from here).
enum Release {
    static let version = "0.14.0"
}
