import Foundation
#if canImport(FoundationXML)
import FoundationXML
#endif
import Testing
import Basics
import Reconnector
import Replay
@testable import Timeline

/// A scenario of the library replayed with its trace, and its picture parsed back.
private func picture(_ name: String) throws -> (report: ReplayReport, model: TimelineModel, svg: String, root: SVGNode) {
    let scenario = try Scenario.load(Scenario.libraryPath + "/" + name)
    var replay = Replay(scenario, keepTrace: true)
    let report = try replay.run()
    let model = TimelineModel(report: report, scenario: scenario)
    let svg = SVGTimeline.render(model)
    return (report, model, svg, try SVGNode.parse(svg))
}

/// Every state the transitions went through, the first (offline) included.
private func states(_ report: ReplayReport) -> Set<String> {
    Set(report.transitions.flatMap { [$0.from.name, $0.to.name] })
}

@Test func aShortReplayShowsItsStatesUplinksOutageAndHandshake() throws {
    let (report, _, _, root) = try picture("ethernet-unplugged-wifi-up.yaml")
    #expect(report.maxOutage > .zero)
    // The whole 90 s, and two stretches zoomed: the start's 8 ms handshake and the move at 40 s,
    // where the 25 ms of probing become wide enough to see.
    #expect(root.all { $0.classes.contains("lane-session") }.count == 3)
    #expect(root.texts().contains { $0.hasPrefix("A · 0.0s") } && root.texts().contains { $0.hasPrefix("B · 39.") })
    #expect(root.all { $0.classes == ["panel"] }.map { $0.attributes["id"] } == ["panel-whole", "panel-A", "panel-B"])
    let whole = try #require(root.all { $0.attributes["id"] == "panel-whole" }.first)
    let probing = root.all { $0.name == "rect" && $0.parent?.classes.contains("state-probing") == true }
    #expect(probing.contains { Double($0.attributes["width"] ?? "") ?? 0 >= 40 })

    // A band for every state the session went through, each with its name where it fits.
    for state in states(report) {
        let bands = root.all { $0.classes.contains("state-" + state) }
        #expect(!bands.isEmpty, "no band for \(state)")
    }
    #expect(root.all { $0.classes.contains("state-switching") }.isEmpty, "the session never switched")
    #expect(root.texts(in: { $0.classes.contains("state-connected") }).contains("connected"))

    // One lane per uplink, named; eth0 loses its carrier at 40 s, wifi0 stays up.
    let lanes = whole.all { $0.classes.contains("lane-uplink") }
    #expect(lanes.map(\.title) == ["eth0", "wifi0"])
    let eth0 = try #require(lanes.first { $0.title == "eth0" })
    let wifi0 = try #require(lanes.first { $0.title == "wifi0" })
    #expect(!eth0.all { $0.classes.contains("uplink-no-carrier") }.isEmpty)
    #expect(wifi0.all { $0.classes.contains("band") }.map(\.classes) == [["band", "uplink-usable"]])
    #expect(root.texts().contains("eth0") && root.texts().contains("wifi0"))

    // The session runs on eth0, then on wifi0.
    let paths = whole.all { $0.classes.contains("path") && !$0.classes.contains("heading") }.map(\.classes)
    #expect(paths.contains { $0.contains("path-eth0") } && paths.contains { $0.contains("path-wifi0") })

    // Each outage is a red band; the handshake a mark with its reason as hover text.
    let outages = whole.all { $0.classes == ["band", "outage"] }
    #expect(outages.count == report.outages.count)
    let handshakes = whole.all { $0.classes.contains("mark-handshake") }
    #expect(handshakes.count == report.transitions.filter { if case .handshakeSucceeded = $0.reason { true } else { false } }.count)
    #expect(handshakes.allSatisfy { $0.title?.contains("handshakeSucceeded") == true })
}

@Test func aTenHourReplayGetsASummaryAndZoomedPanels() throws {
    let (report, model, _, root) = try picture("ten-hour-suspend.yaml")
    let details = TimelineLayout.details(of: model, width: 1000)
    // The evening's connection, the sleep, the morning's reconnection.
    #expect(details.count == 3)
    #expect(details.allSatisfy { $0.length < .seconds(60) })
    // The summary and each detail panel draw the session's lane.
    #expect(root.all { $0.classes.contains("lane-session") }.count == 1 + details.count)
    // The summary's marks have no labels (an hour is 100 px), the details' have.
    #expect(root.texts().contains { $0.hasPrefix("Whole run") && $0.contains("bands and marks only") })
    for state in states(report) {
        #expect(!root.all { $0.classes.contains("state-" + state) }.isEmpty, "no band for \(state)")
    }
    #expect(!root.all { $0.classes.contains("asleep") }.isEmpty)
    #expect(report.maxOutage > .zero)
    #expect(!root.all { $0.classes == ["band", "outage"] }.isEmpty)
    #expect(Set(root.all { $0.classes.contains("lane-uplink") }.map(\.title)) == ["wifi0"])
    // The wake is marked with how long the machine slept.
    #expect(root.texts(in: { $0.classes.contains("mark-wake") }).contains("wake 10h"))
    #expect(root.texts().contains { $0.hasPrefix("A · ") } && root.texts().contains { $0.hasPrefix("C · ") })
}

@Test func anHourBehindAPortalIsDrawnInReadablePanels() throws {
    let (report, _, _, root) = try picture("captive-portal-idle-hour.yaml")
    let panels = root.all { $0.classes.contains("lane-session") }.count
    #expect((2...1 + TimelineLayout.maxDetails).contains(panels))
    for state in states(report) {
        #expect(!root.all { $0.classes.contains("state-" + state) }.isEmpty, "no band for \(state)")
    }
    #expect(!root.all { $0.classes.contains("mark-portal") }.isEmpty)
    #expect(root.all { $0.classes == ["band", "outage"] }.isEmpty == (report.maxOutage == .zero))
}

/// Two hours of a state flipping every few seconds: the summary draws the flips in bins of a
/// few pixels (and stays small), outages keep their place, and the detail panels zoom on the
/// outages, not on the chatter.
@Test func aChatteringStateStaysReadableAndSmall() throws {
    let (report, _, svg, root) = try picture("lossy-train-wifi-on-battery.yaml")
    #expect(report.transitions.count > 1000)
    #expect(svg.utf8.count < 400_000, "\(svg.utf8.count) bytes")
    let whole = try #require(root.all { $0.attributes["id"] == "panel-whole" }.first)
    let mixed = whole.all { $0.classes.contains("mixed") }
    #expect(!mixed.isEmpty)
    #expect(mixed.allSatisfy { $0.classes.contains("state-connected") || $0.classes.contains("state-probing") })
    // Each outage lasts less than a pixel of the whole: a pixel or two each, not the gaps between.
    let outageWidth = whole.all { $0.name == "rect" && $0.parent?.classes.contains("outage") == true }
        .reduce(0.0) { $0 + (Double($1.attributes["width"] ?? "") ?? 0) }
    #expect(outageWidth > 0 && outageWidth <= Double(report.outages.count) * 2)
    // The longest outage is drawn wide enough to carry its label in a detail panel.
    #expect(root.texts(in: { $0.classes.contains("outage") }).contains("outage " + report.maxOutage.short))
}

/// On every row, no two drawn labels overlap, however dense the marks.
@Test(arguments: ["flap-storm-beside-healthy-wifi.yaml", "captive-portal-idle-hour.yaml", "battery-vs-ac-long-outage.yaml",
                   "all-gateways-down.yaml", "captive-portal-restart-loop.yaml"])
func labelsNeverOverlap(_ name: String) throws {
    let (_, _, _, root) = try picture(name)
    var lines: [String: [(from: Double, to: Double, text: String)]] = [:]
    for text in root.all({ $0.name == "text" && $0.parent?.classes.contains("mark") == true }) {
        let x = Double(text.attributes["x"] ?? "") ?? 0
        let width = Double(text.content.count) * 6.7
        let from = text.attributes["text-anchor"] == "end" ? x - width : x
        lines[text.attributes["y"] ?? "", default: []].append((from, from + width, text.content))
    }
    #expect(!lines.isEmpty)
    for (y, labels) in lines {
        let sorted = labels.sorted { $0.from < $1.from }
        for (a, b) in zip(sorted, sorted.dropFirst()) {
            #expect(a.to <= b.from, "'\(a.text)' overlaps '\(b.text)' at y \(y)")
        }
    }
}

@Test func textIsEscaped() throws {
    let nasty = "a <&> \"b\" 'c'"
    let model = TimelineModel(
        title: "title " + nasty, subtitle: nasty, start: .zero, end: Instant.zero + .seconds(10),
        lanes: [.init(kind: .session, name: "lane " + nasty, bands: [
            .init(from: .zero, to: Instant.zero + .seconds(10), paint: .state(nasty), label: "band " + nasty, detail: "detail " + nasty),
        ])],
        marks: [.init(at: Instant.zero + .seconds(5), kind: .world, label: "<&>", detail: "mark " + nasty)])
    let svg = SVGTimeline.render(model)
    #expect(!svg.contains("<&>"))
    #expect(svg.contains("&lt;&amp;&gt;"))
    let root = try SVGNode.parse(svg)
    let texts = root.texts()
    #expect(texts.contains("title " + nasty))
    #expect(texts.contains("band " + nasty))
    #expect(texts.contains("<&>"))
    #expect(root.all { $0.name == "title" }.map(\.content).contains("mark " + nasty))
    #expect(root.all { $0.classes.contains("state-" + SVGText.token(nasty)) }.count == 1)
    #expect(SVGText.token(nasty) == "a______b___c_")
    #expect(SVGText.escaped("x\u{1}y") == "x?y")
}

/// The stream is told from UDP on the same uplink by a darker shade of the uplink's colour.
@Test func theStreamIsDarker() throws {
    let (_, _, _, root) = try picture("stream-roam-onto-a-udp-blocking-network-and-back.yaml")
    func fills(_ path: String) -> Set<String> {
        Set(root.all { $0.name == "rect" && $0.parent?.classes.contains(path) == true && $0.parent?.classes.contains("heading") == false }
            .compactMap { $0.attributes["fill"] })
    }
    #expect(fills("path-wifi0") == ["#2563eb"])
    #expect(fills("path-wifi0_tls") == ["#163b8d"])
    #expect(SVGText.darker("#2563eb") == "#163b8d")
}

@Test func theAxisReadsInSecondsMinutesAndHours() {
    #expect(SVGText.clock(0, decimals: 0) == "0s")
    #expect(SVGText.clock(45_000_000_000, decimals: 0) == "45s")
    #expect(SVGText.clock(150_000_000_000, decimals: 0) == "2m30s")
    #expect(SVGText.clock(65_250_000_000, decimals: 3) == "1m05.250s")
    #expect(SVGText.clock(37_800_000_000_000, decimals: 0) == "10h30m")
    #expect(SVGText.clock(37_803_100_000_000, decimals: 1) == "10h30m03.1s")
    #expect(SVGText.number(12.345) == "12.3" && SVGText.number(-0.04) == "0" && SVGText.number(-3) == "-3")
}

/// The picture as rsvg-convert draws it: a PNG of the SVG's size.
@Test(.enabled(if: Rasterizer.path != nil || getuid() == 0,
               "rsvg-convert is missing (Debian package librsvg2-bin, which scripts/setup installs)"))
func rsvgDrawsThePictureAtItsSize() throws {
    let tool = try #require(Rasterizer.path, "rsvg-convert is missing: run scripts/setup")
    for name in ["ethernet-unplugged-wifi-up.yaml", "ten-hour-suspend.yaml"] {
        let (_, _, svg, root) = try picture(name)
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("timeline-\(getpid())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let input = directory.appendingPathComponent("t.svg")
        let output = directory.appendingPathComponent("t.png")
        try svg.write(to: input, atomically: true, encoding: .utf8)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: tool)
        process.arguments = ["-o", output.path, input.path]
        try process.run()
        process.waitUntilExit()
        #expect(process.terminationStatus == 0)
        let png = try Data(contentsOf: output)
        #expect(png.count > 0)
        // The IHDR chunk follows the 8-byte signature: width and height, big-endian, at 16 and 20.
        try #require(png.count > 24 && png.prefix(8) == Data([0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A]))
        let width = png[16..<20].reduce(0) { $0 << 8 | Int($1) }
        let height = png[20..<24].reduce(0) { $0 << 8 | Int($1) }
        #expect("\(width)" == root.attributes["width"])
        #expect("\(height)" == root.attributes["height"])
    }
}

private enum Rasterizer {
    static let path: String? = (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin")
        .split(separator: ":").map { "\($0)/rsvg-convert" }.first { FileManager.default.isExecutableFile(atPath: $0) }
}

/// An element of a parsed SVG document, enough to ask what the picture holds.
final class SVGNode {
    let name: String
    let attributes: [String: String]
    weak var parent: SVGNode?
    var children: [SVGNode] = []
    /// Its own character data.
    var content = ""

    init(name: String, attributes: [String: String], parent: SVGNode?) {
        self.name = name
        self.attributes = attributes
        self.parent = parent
    }

    var classes: [String] { (attributes["class"] ?? "").split(separator: " ").map(String.init) }
    /// The text of its `<title>` child: the hover text.
    var title: String? { children.first { $0.name == "title" }?.content }

    /// It and every element under it that `matches`, in document order.
    func all(_ matches: (SVGNode) -> Bool) -> [SVGNode] {
        (matches(self) ? [self] : []) + children.flatMap { $0.all(matches) }
    }

    /// The content of every `<text>` under the elements that `matches` (any element when nil).
    func texts(in matches: ((SVGNode) -> Bool)? = nil) -> [String] {
        let scopes = matches.map { all($0) } ?? [self]
        return scopes.flatMap { $0.all { $0.name == "text" }.map(\.content) }
    }

    /// Parses `svg` with Foundation's XMLParser; throws when it is not well-formed XML.
    static func parse(_ svg: String) throws -> SVGNode {
        let builder = Builder()
        let parser = XMLParser(data: Data(svg.utf8))
        parser.delegate = builder
        guard parser.parse(), let root = builder.root else {
            throw ParseError(message: "\(parser.parserError.map { "\($0)" } ?? "no root") at line \(parser.lineNumber)")
        }
        #expect(root.name == "svg")
        return root
    }

    struct ParseError: Error { var message: String }

    private final class Builder: NSObject, XMLParserDelegate {
        var root: SVGNode?
        var current: SVGNode?

        func parser(_ parser: XMLParser, didStartElement name: String, namespaceURI: String?, qualifiedName: String?,
                    attributes: [String: String] = [:]) {
            let node = SVGNode(name: name, attributes: attributes, parent: current)
            if let current { current.children.append(node) } else { root = node }
            current = node
        }

        func parser(_ parser: XMLParser, didEndElement name: String, namespaceURI: String?, qualifiedName: String?) {
            current = current?.parent
        }

        func parser(_ parser: XMLParser, foundCharacters string: String) {
            current?.content += string
        }
    }
}
