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

/// `scripts/fuzz` builds the modules a target needs one by one, each after the ones it imports:
/// every module of the project a listed module's sources import is listed before it, or the
/// build fails only when someone fuzzes (as it did once a module was split out).
@Test func theFuzzScriptBuildsEveryModuleAfterTheOnesItImports() throws {
    let repository = PackageTests.repository
    let script = try String(contentsOf: repository.appendingPathComponent("scripts/fuzz"), encoding: .utf8)
    let lists = script.split(separator: "\n").compactMap { line -> [String]? in
        guard let open = line.range(of: "modules=("), let close = line.range(of: ")", range: open.upperBound..<line.endIndex) else { return nil }
        return line[open.upperBound..<close.lowerBound].split(separator: " ").map(String.init)
    }
    try #require(!lists.isEmpty, "the script's module lists: \(lists)")
    let sources = repository.appendingPathComponent("Sources")
    let swiftModules = Set(try FileManager.default.contentsOfDirectory(atPath: sources.path).filter { name in
        (try? FileManager.default.contentsOfDirectory(atPath: sources.appendingPathComponent(name).path))?
            .contains { $0.hasSuffix(".swift") } ?? false
    })
    for list in lists {
        for (position, module) in list.enumerated() {
            let directory = sources.appendingPathComponent(module)
            let files = try FileManager.default.contentsOfDirectory(atPath: directory.path).filter { $0.hasSuffix(".swift") }
            var imported: Set<String> = []
            for file in files {
                let text = try String(contentsOf: directory.appendingPathComponent(file), encoding: .utf8)
                for line in text.split(separator: "\n") {
                    let words = line.split(separator: " ").map(String.init)
                    guard let at = words.firstIndex(of: "import"), at + 1 < words.count,
                          words[..<at].allSatisfy({ ["public", "package", "internal", "@testable"].contains($0) }) else { continue }
                    if swiftModules.contains(words[at + 1]) { imported.insert(words[at + 1]) }
                }
            }
            let missing = imported.subtracting(list[..<position]).subtracting([module])
            #expect(missing.isEmpty, "scripts/fuzz builds \(module) before \(missing.sorted()), which it imports: \(list)")
        }
    }
}
