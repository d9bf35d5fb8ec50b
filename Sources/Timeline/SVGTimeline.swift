import Basics

/// Draws a `TimelineModel` as one self-contained SVG document: no script, no external font or
/// image, colours readable on white. A span longer than ten minutes is drawn as a summary of
/// the whole and detail panels on its busy stretches (`TimelineLayout.details`), lettered in
/// the summary.
///
/// Every band and mark is a group with the class of what it stands for (`band state-connected`,
/// `band uplink-no-carrier`, `band outage`, `mark mark-handshake`) and a `<title>` with the whole
/// story, which viewers show on hover.
public enum SVGTimeline {
    public static func render(_ model: TimelineModel, width: Int = 1200) -> String {
        var canvas = Canvas(model: model, width: Double(width))
        return canvas.document()
    }
}

/// The drawing of one model: positions, colours, and the text written so far.
private struct Canvas {
    let model: TimelineModel
    let width: Double
    var out = ""
    var y = 0.0

    static let left = 124.0
    static let right = 18.0
    static let font = 11.0
    /// Wider than DejaVu Sans' average character at 11 px, so that estimated text never overruns.
    static let charWidth = 6.7
    static let laneHeight = 18.0
    static let rowGap = 4.0
    static let tierHeight = 13.0
    static let ink = "#1f2933"
    static let faint = "#7b8794"

    /// The mark rows, each named, with the kinds drawn on it.
    static let markRows: [(name: String, kinds: [TimelineModel.Mark.Kind])] = [
        ("attempts", [.attempt, .handshake, .handshakeFailed, .backoff]),
        ("sleep, wake", [.sleep, .wake]),
        ("portal, rules", [.portal, .onDemand]),
        ("scenario", [.world]),
    ]
    static let uplinkColours = ["#2563eb", "#c2410c", "#047857", "#7c3aed", "#0e7490", "#be123c", "#4d7c0f", "#a16207"]

    init(model: TimelineModel, width: Double) {
        self.model = model
        self.width = width
    }

    var plotLeft: Double { Self.left }
    var plotRight: Double { width - Self.right }

    mutating func document() -> String {
        y = 26
        text(at: 12, y, model.title, size: 16, weight: "bold")
        y += 18
        text(at: 12, y, model.subtitle, size: 11, fill: Self.faint)
        y += 16
        let details = TimelineLayout.details(of: model, width: plotRight - plotLeft)
        let whole = TimelineLayout.Window(from: model.start, to: model.end)
        let range = "\(clock(model.start, step: whole.length)) – \(clock(model.end, step: whole.length))"
        let labelled = whole.length <= TimelineLayout.labelledUpTo
        panel(whole, id: "whole", heading: details.isEmpty ? range : "Whole run, \(range)" + (labelled ? "" : ": bands and marks only")
              + "; the lettered stretches are drawn below", labels: labelled, zooms: details)
        for (i, window) in details.enumerated() {
            panel(window, id: Self.letter(i), heading: "\(Self.letter(i)) · \(clock(window.from, step: window.length)) – "
                  + "\(clock(window.to, step: window.length)) (\(window.length.short))", labels: true, zooms: [])
        }
        legend()
        let height = (y + 12).rounded()
        return "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"\(Int(width))\" height=\"\(Int(height))\" "
            + "viewBox=\"0 0 \(Int(width)) \(Int(height))\" font-family=\"DejaVu Sans, Verdana, Arial, sans-serif\" "
            + "font-size=\"\(SVGText.number(Self.font))\">\n"
            + "<title>\(SVGText.escaped(model.title))</title>\n"
            + "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n"
            + out + "</svg>\n"
    }

    static func letter(_ i: Int) -> String { String(UnicodeScalar(UInt8(65 + i % 26))) }

    // MARK: Panels

    /// One panel (`panel-<id>`): a heading, the time axis, every lane and the mark rows over `window`.
    /// `labels`: the marks' labels are drawn (else only their glyphs); `zooms`: stretches to
    /// letter, drawn in detail below.
    mutating func panel(_ window: TimelineLayout.Window, id: String, heading: String, labels: Bool, zooms: [TimelineLayout.Window]) {
        y += 8
        out += "<g class=\"panel\" id=\"panel-\(id)\">\n"
        text(at: 12, y + 11, heading, size: 12, weight: "bold")
        y += 18
        let x = Scale(from: window.from, span: max(Double(window.length.nanoseconds), 1), left: plotLeft, width: plotRight - plotLeft)
        if !zooms.isEmpty {
            let letters = TimelineLayout.place(zooms.enumerated().map { (x($0.element.from), Self.letter($0.offset)) },
                                               tiers: 1, left: plotLeft - 4, right: plotRight + 4, charWidth: Self.charWidth)
            for (i, zoom) in zooms.enumerated() {
                let placed = letters[i]?.text ?? Self.letter(i)
                text(at: x(zoom.from), y + 10, placed, weight: "bold", fill: "#1d4ed8")
            }
            y += 14
        }
        // The axis.
        let step = tickStep(window, width: plotRight - plotLeft)
        let axisTop = y
        y += 14
        let top = y
        var ticks: [Double] = []
        // A label kept inside the plot may run into the next: that one goes without.
        var labelledUpTo = -Double.infinity
        var tick = Instant(nanoseconds: (window.from.nanoseconds + step.nanoseconds - 1) / step.nanoseconds * step.nanoseconds)
        while tick <= window.to {
            ticks.append(x(tick))
            let label = clock(tick, step: step)
            let half = Double(label.count) * Self.charWidth / 2
            let at = min(max(x(tick), plotLeft + half), plotRight - half)
            if at - half >= labelledUpTo + 6 {
                text(at: at, axisTop + 10, label, size: 10, fill: Self.faint, anchor: "middle")
                labelledUpTo = at + half
            }
            tick = tick + step
        }
        // Lanes, then mark rows; grid lines go under them, drawn once their height is known.
        var body = ""
        swap(&body, &out)
        var outages: [(Double, Double)] = []
        for lane in model.lanes {
            drawLane(lane, x: x, window: window)
            if lane.kind == .outage {
                outages += lane.bands.compactMap { band in clip(band, window).map { (x($0.from), x($0.to)) } }
            }
        }
        for row in Self.markRows {
            let marks = model.marks.filter { row.kinds.contains($0.kind) }
            guard !marks.isEmpty else { continue }
            drawMarks(row.name, marks.filter { $0.at >= window.from && $0.at <= window.to }, x: x, tiers: labels ? 2 : 0)
        }
        let bottom = y
        swap(&body, &out)
        for tx in ticks { out += line(tx, top - 3, tx, bottom, stroke: "#e4e7eb") }
        out += body
        // Outages over every lane, so that the states they happened in stay readable under them.
        for (from, to) in outages {
            let w = max(to - from, 2)
            out += "<rect class=\"outage-shade\" x=\"\(SVGText.number(from))\" y=\"\(SVGText.number(top - 3))\" "
                + "width=\"\(SVGText.number(w))\" height=\"\(SVGText.number(bottom - top + 3))\" fill=\"#d92d20\" fill-opacity=\"0.12\"/>\n"
        }
        for (i, zoom) in zooms.enumerated() {
            let from = x(zoom.from)
            let w = max(x(zoom.to) - from, 3)
            out += "<rect class=\"zoom\" x=\"\(SVGText.number(from))\" y=\"\(SVGText.number(top - 3))\" width=\"\(SVGText.number(w))\" "
                + "height=\"\(SVGText.number(bottom - top + 3))\" fill=\"#1d4ed8\" fill-opacity=\"0.06\" stroke=\"#1d4ed8\" "
                + "stroke-width=\"1\"><title>\(Self.letter(i)): drawn below</title></rect>\n"
        }
        out += line(plotLeft, top - 3, plotRight, top - 3, stroke: "#9aa5b1")
        out += "</g>\n"
        y += 6
    }

    /// Where an instant of a panel's window lies across the page.
    struct Scale {
        let from: Instant
        let span: Double
        let left: Double
        let width: Double
        func callAsFunction(_ at: Instant) -> Double { left + Double((at - from).nanoseconds) / span * width }
    }

    /// The part of `band` inside `window`, if any.
    func clip(_ band: TimelineModel.Band, _ window: TimelineLayout.Window) -> (from: Instant, to: Instant)? {
        guard band.to >= window.from, band.from <= window.to else { return nil }
        return (max(band.from, window.from), min(band.to, window.to))
    }

    mutating func drawLane(_ lane: TimelineModel.Lane, x: Scale, window: TimelineLayout.Window) {
        let height = lane.kind == .session ? Self.laneHeight + 4 : Self.laneHeight
        let name = TimelineLayout.fit(lane.name, width: plotLeft - 30, charWidth: Self.charWidth) ?? ""
        out += "<g class=\"lane lane-\(lane.kind.rawValue)\"><title>\(SVGText.escaped(lane.name))</title>\n"
        text(at: plotLeft - 8, y + height / 2 + 4, name, weight: lane.kind == .session ? "bold" : "normal", anchor: "end")
        if lane.kind == .uplink {
            out += "<rect x=\"12\" y=\"\(SVGText.number(y + height / 2 - 5))\" width=\"10\" height=\"10\" fill=\"\(uplinkColour(lane.name))\"/>\n"
        }
        out += "<rect x=\"\(SVGText.number(plotLeft))\" y=\"\(SVGText.number(y))\" width=\"\(SVGText.number(plotRight - plotLeft))\" "
            + "height=\"\(SVGText.number(height))\" fill=\"#f5f7fa\"/>\n"
        // Bands narrower than a pixel that follow one another (a state that flips every few
        // seconds for hours) are drawn together, a few pixels at a time, in the colour of the
        // one that lasted longest.
        var thin: [(from: Instant, to: Instant, band: TimelineModel.Band)] = []
        func flush() {
            guard let first = thin.first, let last = thin.last else { return }
            defer { thin = [] }
            if thin.count == 1 { return drawBand(first.band, from: first.from, to: first.to, x: x, height: height) }
            var lasted: [TimelineModel.Paint: Duration] = [:]
            var labels: [(String, Duration)] = []
            for piece in thin {
                lasted[piece.band.paint, default: .zero] += piece.to - piece.from
                if let i = labels.firstIndex(where: { $0.0 == piece.band.label }) {
                    labels[i].1 += piece.to - piece.from
                } else {
                    labels.append((piece.band.label, piece.to - piece.from))
                }
            }
            let paint = lasted.max { $0.value < $1.value }?.key ?? first.band.paint
            let classes = thin.reduce(into: [String]()) { classes, piece in
                for name in style(piece.band.paint).className.split(separator: " ").map(String.init) where !classes.contains(name) {
                    classes.append(name)
                }
            }
            let detail = "\(thin.count) changes from \(first.from)s to \(last.to)s: "
                + labels.sorted { $0.1 > $1.1 }.map { "\($0.0) \($0.1.short)" }.joined(separator: ", ")
            drawBand(TimelineModel.Band(from: first.from, to: last.to, paint: paint, label: "", detail: detail),
                     from: first.from, to: last.to, x: x, height: height, classes: "mixed " + classes.joined(separator: " "))
        }
        for band in lane.bands {
            guard let (from, to) = clip(band, window) else { continue }
            if x(to) - x(from) < 1 {
                // Only bands that follow one another without a visible gap (outages do not).
                if let previous = thin.last, x(from) - x(previous.to) >= 1 { flush() }
                thin.append((from, to, band))
                if let first = thin.first, x(to) - x(first.from) >= 2 { flush() }
            } else {
                flush()
                drawBand(band, from: from, to: to, x: x, height: height)
            }
        }
        flush()
        out += "</g>\n"
        y += height + Self.rowGap
    }

    /// One band, `from` and `to` being its part inside the panel; `classes` replace the ones
    /// its paint gives.
    mutating func drawBand(_ band: TimelineModel.Band, from: Instant, to: Instant, x: Scale, height: Double, classes: String? = nil) {
        let x0 = x(from)
        let w = max(x(to) - x0, 1)
        let style = style(band.paint)
        out += "<g class=\"band \(classes ?? style.className)\"><title>\(SVGText.escaped(band.detail))</title>"
        out += "<rect x=\"\(SVGText.number(x0))\" y=\"\(SVGText.number(y))\" width=\"\(SVGText.number(w))\" "
            + "height=\"\(SVGText.number(height))\" fill=\"\(style.fill)\"" + (style.opacity < 1 ? " fill-opacity=\"\(style.opacity)\"" : "") + "/>"
        if let label = TimelineLayout.fit(band.label, width: w - 6, charWidth: Self.charWidth) {
            out += "<text x=\"\(SVGText.number(x0 + w / 2))\" y=\"\(SVGText.number(y + height / 2 + 4))\" text-anchor=\"middle\" "
                + "fill=\"\(style.text)\">\(SVGText.escaped(label))</text>"
        }
        out += "</g>\n"
    }

    mutating func drawMarks(_ name: String, _ marks: [TimelineModel.Mark], x: Scale, tiers: Int) {
        let glyphRow = y + 8
        out += "<g class=\"marks\">\n"
        text(at: plotLeft - 8, glyphRow + 4, name, fill: Self.faint, anchor: "end")
        let placements = TimelineLayout.place(marks.map { (x($0.at), $0.label) }, tiers: tiers, left: plotLeft - 40,
                                              right: plotRight + Self.right - 2, charWidth: Self.charWidth)
        for (mark, placed) in zip(marks, placements) {
            let mx = x(mark.at)
            let look = Self.glyph(mark.kind)
            out += "<g class=\"mark mark-\(mark.kind.rawValue)\"><title>\(SVGText.escaped(mark.detail))</title>"
            out += Self.shape(look.shape, x: mx, y: glyphRow, colour: look.colour)
            if let placed {
                let ty = glyphRow + 8 + Double(placed.tier + 1) * Self.tierHeight - 3
                out += "<text x=\"\(SVGText.number(placed.endsAtX ? mx + 2 : mx - 2))\" y=\"\(SVGText.number(ty))\" "
                    + "text-anchor=\"\(placed.endsAtX ? "end" : "start")\" fill=\"\(look.colour)\">\(SVGText.escaped(placed.text))</text>"
            }
            out += "</g>\n"
        }
        out += "</g>\n"
        y += 16 + Double(tiers) * Self.tierHeight + Self.rowGap
    }

    // MARK: Legend

    mutating func legend() {
        y += 10
        text(at: 12, y + 10, "Legend", size: 12, weight: "bold")
        y += 18
        var x = 12.0
        /// One entry: a swatch drawn at its top left corner, and its words.
        func entry(_ label: String, swatch: (Double, Double) -> String) {
            let w = 18 + Double(label.count) * Self.charWidth + 16
            if x + w > width - 12 {
                x = 12
                y += 18
            }
            out += "<g class=\"legend-entry\">" + swatch(x, y) + "<text x=\"\(SVGText.number(x + 18))\" "
                + "y=\"\(SVGText.number(y + 10))\" fill=\"\(Self.ink)\">\(SVGText.escaped(label))</text></g>\n"
            x += w
        }
        func newLine() {
            x = 12
            y += 18
        }
        func box(_ paint: TimelineModel.Paint) -> (Double, Double) -> String {
            let s = style(paint)
            return { x, y in
                "<rect x=\"\(SVGText.number(x))\" y=\"\(SVGText.number(y + 1))\" width=\"13\" height=\"11\" fill=\"\(s.fill)\""
                    + (s.opacity < 1 ? " fill-opacity=\"\(s.opacity)\"" : "") + " stroke=\"#cbd2d9\" stroke-width=\"0.5\"/>"
            }
        }
        var paints: [TimelineModel.Paint] = []
        for lane in model.lanes {
            for band in lane.bands where !paints.contains(band.paint) { paints.append(band.paint) }
        }
        let states = Self.stateOrder.filter { paints.contains(.state($0)) }
            + paints.compactMap { if case .state(let n) = $0, !Self.stateOrder.contains(n) { n } else { nil } }
        for name in states { entry("state: " + name, swatch: box(.state(name))) }
        newLine()
        if let uplink = model.lanes.first(where: { $0.kind == .uplink })?.name {
            entry("path: the session on \(uplink) (the uplink's colour)", swatch: box(.path(uplink, carrying: true)))
            entry("path: heading for it", swatch: box(.path(uplink, carrying: false)))
            if paints.contains(where: { if case .path(let name, _) = $0 { name.hasSuffix("/tls") } else { false } }) {
                entry("path: on the stream (TLS), darker", swatch: box(.path(uplink + "/tls", carrying: true)))
            }
        }
        for condition in TimelineModel.UplinkCondition.allCases where paints.contains(.uplink(condition)) {
            entry("uplink: " + style(.uplink(condition)).legend, swatch: box(.uplink(condition)))
        }
        entry("outage: no tunnel while an uplink could carry it", swatch: box(.outage))
        if paints.contains(.asleep) { entry("machine asleep", swatch: box(.asleep)) }
        newLine()
        for kind in TimelineModel.Mark.Kind.allCases where model.marks.contains(where: { $0.kind == kind }) {
            let look = Self.glyph(kind)
            entry(look.legend) { x, y in Self.shape(look.shape, x: x + 6.5, y: y + 6.5, colour: look.colour) }
        }
        newLine()
        text(at: 12, y + 8, "Hover over a band or a mark for its whole reason. Labels that do not fit are shortened or left out.",
             size: 10, fill: Self.faint)
        y += 12
    }

    // MARK: Styles

    struct Style {
        var fill: String
        var opacity = 1.0
        var text = Canvas.ink
        var className: String
        var legend = ""
    }

    static let stateOrder = ["offline", "connecting", "connected", "probing", "switching", "sleeping", "backing-off",
                             "failed", "paused", "portal", "disconnected"]

    func style(_ paint: TimelineModel.Paint) -> Style {
        switch paint {
        case .state(let name):
            let (fill, text): (String, String) = switch name {
            case "connected": ("#3fa34d", "#ffffff")
            case "connecting": ("#f6c344", Self.ink)
            case "probing": ("#7cc4f4", Self.ink)
            case "switching": ("#a78bfa", Self.ink)
            case "backing-off": ("#f59e4c", Self.ink)
            case "offline": ("#cbd2d9", Self.ink)
            case "sleeping": ("#3e4c59", "#ffffff")
            case "failed": ("#9b1c1c", "#ffffff")
            case "paused": ("#9aa5b1", Self.ink)
            case "portal": ("#e879c6", Self.ink)
            case "disconnected": ("#b6c2cf", Self.ink)
            default: ("#d3cec4", Self.ink)
            }
            return Style(fill: fill, text: text, className: "state-" + SVGText.token(name))
        case .path(let name, let carrying):
            // The stream (`wifi0/tls`) in a darker shade of its uplink's colour.
            let stream = name.hasSuffix("/tls")
            return Style(fill: stream ? SVGText.darker(uplinkColour(name)) : uplinkColour(name), opacity: carrying ? 1 : 0.35, text: carrying ? "#ffffff" : Self.ink,
                         className: "path path-\(SVGText.token(name))" + (carrying ? "" : " heading"))
        case .uplink(let condition):
            let (fill, legend): (String, String) = switch condition {
            case .usable: ("#b7e4c0", "up, a path to the server")
            case .noPath: ("#e3eee5", "up, no path to the server")
            case .noCarrier: ("#fcd9a8", "carrier lost")
            case .down: ("#d5dae0", "down")
            case .dropping: ("#d8b4fe", "drops everything")
            case .portal: ("#fbcfe8", "behind a captive portal")
            }
            return Style(fill: fill, className: "uplink-" + condition.rawValue, legend: legend)
        case .outage:
            return Style(fill: "#d92d20", text: "#ffffff", className: "outage")
        case .asleep:
            return Style(fill: "#52606d", text: "#ffffff", className: "asleep")
        }
    }

    /// The colour of the uplink a path named `name` (`wifi0`, `wifi0/tls`) runs on: the uplink
    /// lanes' order picks it.
    func uplinkColour(_ name: String) -> String {
        let interface = name.split(separator: "/").first.map(String.init) ?? name
        let uplinks = model.lanes.filter { $0.kind == .uplink }.map(\.name)
        guard let i = uplinks.firstIndex(of: interface) else { return "#64748b" }
        return Self.uplinkColours[i % Self.uplinkColours.count]
    }

    enum Shape { case diamond, cross, triangleUp, triangleDown, square, disc, ring, frame }

    static func glyph(_ kind: TimelineModel.Mark.Kind) -> (shape: Shape, colour: String, legend: String) {
        switch kind {
        case .handshake: (.diamond, "#15803d", "handshake completed")
        case .handshakeFailed: (.cross, "#b91c1c", "handshake failed, refused, session lost")
        case .attempt: (.triangleUp, "#a16207", "attempt (bind and handshake)")
        case .backoff: (.square, "#c2410c", "backoff, budget wait")
        case .sleep: (.disc, "#334e68", "sleep announced")
        case .wake: (.ring, "#334e68", "wake")
        case .portal: (.diamond, "#a21caf", "captive portal, portal window")
        case .onDemand: (.triangleDown, "#0f766e", "on-demand rule")
        case .world: (.frame, "#52606d", "scenario: server, operator, power, restart")
        }
    }

    /// A glyph centred on (x, y).
    static func shape(_ shape: Shape, x: Double, y: Double, colour: String) -> String {
        let r = 4.5
        func p(_ dx: Double, _ dy: Double) -> String { "\(SVGText.number(x + dx)),\(SVGText.number(y + dy))" }
        return switch shape {
        case .diamond: "<path d=\"M\(p(0, -r))L\(p(r, 0))L\(p(0, r))L\(p(-r, 0))Z\" fill=\"\(colour)\"/>"
        case .cross: "<path d=\"M\(p(-r, -r))L\(p(r, r))M\(p(r, -r))L\(p(-r, r))\" stroke=\"\(colour)\" stroke-width=\"2\"/>"
        case .triangleUp: "<path d=\"M\(p(0, -r))L\(p(r, r))L\(p(-r, r))Z\" fill=\"\(colour)\"/>"
        case .triangleDown: "<path d=\"M\(p(-r, -r))L\(p(r, -r))L\(p(0, r))Z\" fill=\"\(colour)\"/>"
        case .square: "<path d=\"M\(p(-r + 1, -r + 1))L\(p(r - 1, -r + 1))L\(p(r - 1, r - 1))L\(p(-r + 1, r - 1))Z\" fill=\"\(colour)\"/>"
        case .disc: "<path d=\"M\(p(-r, 0))A\(SVGText.number(r)),\(SVGText.number(r)) 0 1 0 \(p(r, 0))A\(SVGText.number(r)),\(SVGText.number(r)) 0 1 0 \(p(-r, 0))Z\" fill=\"\(colour)\"/>"
        case .ring: "<path d=\"M\(p(-r + 1, 0))A\(SVGText.number(r - 1)),\(SVGText.number(r - 1)) 0 1 0 \(p(r - 1, 0))A\(SVGText.number(r - 1)),\(SVGText.number(r - 1)) 0 1 0 \(p(-r + 1, 0))Z\" fill=\"#ffffff\" stroke=\"\(colour)\" stroke-width=\"2\"/>"
        case .frame: "<path d=\"M\(p(-r + 1, -r + 1))L\(p(r - 1, -r + 1))L\(p(r - 1, r - 1))L\(p(-r + 1, r - 1))Z\" fill=\"#ffffff\" stroke=\"\(colour)\" stroke-width=\"1.5\"/>"
        }
    }

    // MARK: Primitives

    mutating func text(at x: Double, _ y: Double, _ content: String, size: Double? = nil, weight: String = "normal",
                       fill: String = Canvas.ink, anchor: String = "start") {
        out += "<text x=\"\(SVGText.number(x))\" y=\"\(SVGText.number(y))\""
            + (size.map { " font-size=\"\(SVGText.number($0))\"" } ?? "")
            + (weight == "normal" ? "" : " font-weight=\"\(weight)\"")
            + (anchor == "start" ? "" : " text-anchor=\"\(anchor)\"")
            + " fill=\"\(fill)\">\(SVGText.escaped(content))</text>\n"
    }

    func line(_ x1: Double, _ y1: Double, _ x2: Double, _ y2: Double, stroke: String) -> String {
        "<line x1=\"\(SVGText.number(x1))\" y1=\"\(SVGText.number(y1))\" x2=\"\(SVGText.number(x2))\" y2=\"\(SVGText.number(y2))\" "
            + "stroke=\"\(stroke)\" stroke-width=\"1\"/>\n"
    }

    /// An instant on an axis whose ticks are `step` apart: as many decimals as the step needs.
    func clock(_ at: Instant, step: Duration) -> String {
        let ns = step.nanoseconds
        let decimals = ns >= 1_000_000_000 ? 0 : ns >= 100_000_000 ? 1 : ns >= 10_000_000 ? 2 : 3
        return SVGText.clock(at.nanoseconds, decimals: decimals)
    }

    /// The round step between ticks that leaves room for their labels (`clock` of the window's end).
    func tickStep(_ window: TimelineLayout.Window, width: Double) -> Duration {
        let steps: [Int64] = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10_000, 15_000, 30_000, 60_000, 120_000,
                              300_000, 600_000, 900_000, 1_800_000, 3_600_000, 7_200_000, 10_800_000, 21_600_000, 43_200_000, 86_400_000]
        let span = Double(window.length.nanoseconds)
        let ms = steps.first { ms in
            let step = Duration.milliseconds(ms)
            let label = Double(clock(window.to, step: step).count) * Self.charWidth * 10 / 11
            return Double(step.nanoseconds) / span * width >= max(label + 24, 70)
        } ?? 86_400_000
        return .milliseconds(ms)
    }
}
