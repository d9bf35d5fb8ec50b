import Foundation
import NamespaceLab
import Testing

/// The fuzz targets `scripts/fuzz` builds with sanitizers are type-checked against the modules of
/// this build: a target that no longer compiles protects nothing, and would go unnoticed until
/// someone fuzzes.
@Test func theFuzzTargetsCompileAgainstTheModules() throws {
    let repository = PackageTests.repository
    let build = RoamingLab.builtAgent.deletingLastPathComponent().path
    let fuzz = repository.appendingPathComponent("Fuzz").path
    let targets = try FileManager.default.contentsOfDirectory(atPath: fuzz).filter { $0.hasSuffix(".swift") }.sorted()
    try #require(!targets.isEmpty, "no fuzz targets in \(fuzz)")
    let sources = repository.appendingPathComponent("Sources").path
    var arguments = ["swiftc", "-typecheck", "-swift-version", "6", "-enable-upcoming-feature", "InternalImportsByDefault",
                     "-enable-upcoming-feature", "ExistentialAny", "-package-name", "roam", "-parse-as-library", "-I", build + "/Modules"]
    for module in ["CShims", "CBoring"] { arguments += ["-Xcc", "-fmodule-map-file=\(build)/\(module).build/module.modulemap"] }
    for library in ["CMnl", "COpenSSL", "CSodium", "CNftables", "CLibpq"] { arguments += ["-I", sources + "/" + library] }
    for target in targets {
        let checked = try NamespaceLab.capture(URL(fileURLWithPath: "/usr/bin/env"), arguments + [fuzz + "/" + target])
        #expect(checked.status == 0, "Fuzz/\(target) does not compile: \(checked.output)")
    }
}
