import Foundation
import Testing

/// The README's Layout names every module under Sources/ and none that is gone: a newcomer reads
/// it to find where things live.
@Test func theReadmesLayoutNamesEveryModuleAndNoOther() throws {
    let repository = PackageTests.repository
    let readme = try String(contentsOf: repository.appendingPathComponent("README.md"), encoding: .utf8)
    let start = try #require(readme.range(of: "## Layout\n\n```\n"))
    let end = try #require(readme.range(of: "```", range: start.upperBound..<readme.endIndex))
    let layout = readme[start.upperBound..<end.lowerBound]
    // "Sources/Name" at a line's start; "Sources/A, B, C" names several.
    var named = Set<String>()
    for line in layout.split(separator: "\n") where line.hasPrefix("Sources/") {
        var tokens = line.dropFirst("Sources/".count).split(separator: " ")[...]
        while let token = tokens.popFirst() {
            named.insert(String(token.prefix { $0 != "," }))
            guard token.hasSuffix(",") else { break }
        }
    }
    let modules = Set(try FileManager.default.contentsOfDirectory(atPath: repository.appendingPathComponent("Sources").path)
        .filter { !$0.hasPrefix(".") })
    #expect(named == modules, "in the README only: \(named.subtracting(modules).sorted()); in Sources only: \(modules.subtracting(named).sorted())")
}
