import Basics

/// How a timeline is cut into panels and where labels go: pure decisions the renderer follows.
enum TimelineLayout {
    /// A stretch of the timeline drawn as one panel.
    struct Window: Equatable {
        var from: Instant
        var to: Instant
        var length: Duration { to - from }
    }

    /// A span this long or shorter is drawn whole with every label; a longer one is drawn whole
    /// as a summary, and in detail on its busy stretches, where a minute would otherwise be a pixel.
    static let labelledUpTo = Duration.seconds(600)
    static let maxDetails = 4
    /// A band narrower than this many pixels across the whole span calls for detail panels.
    static let narrowest = 4.0
    /// More state changes than this are chatter, not stretches to zoom on.
    static let chatter = 200

    /// The detail windows of a timeline drawn `width` pixels wide: none when the whole span is
    /// at most ten minutes and no state or path lasts less than a few pixels there. Else the
    /// stretches where things happen (marks and changes, the session's states unless they
    /// chatter), found as runs of instants no further apart than a
    /// sixtieth of the span, each padded by a quarter of its length (at least 250 ms), the
    /// closest merged until at most `maxDetails` are left. When those cover most of the span
    /// (things happen all along), the densest stretches of an eighth of it instead.
    static func details(of model: TimelineModel, width: Double) -> [Window] {
        let span = model.end - model.start
        guard span > .zero else { return [] }
        let perPixel = Double(span.nanoseconds) / width
        let narrow = model.lanes.contains { lane in
            [.session, .path].contains(lane.kind) && lane.bands.contains { band in
                band.to > band.from && Double((band.to - band.from).nanoseconds) < narrowest * perPixel
            }
        }
        guard span > labelledUpTo || narrow else { return [] }
        // Where things happen: marks, and bands' starts; but a session whose state changes
        // hundreds of times (probing on a lossy Wi-Fi all along) chatters, and the stretches
        // follow the rest.
        var instants = model.marks.map(\.at)
        for lane in model.lanes where lane.kind != .session || lane.bands.count <= chatter {
            instants += lane.bands.map(\.from).filter { $0 > model.start }
        }
        instants = instants.filter { $0 >= model.start && $0 <= model.end }.sorted()
        guard let first = instants.first else { return [] }

        let gap = span / 60
        var runs: [Window] = [Window(from: first, to: first)]
        for at in instants.dropFirst() {
            if at - runs[runs.count - 1].to <= gap { runs[runs.count - 1].to = at } else { runs.append(Window(from: at, to: at)) }
        }
        var windows = runs.map { run in
            let pad = max(run.length / 4, .milliseconds(250))
            return Window(from: max(model.start, run.from - pad), to: min(model.end, run.to + pad))
        }
        while windows.count > maxDetails || zip(windows, windows.dropFirst()).contains(where: { $0.to >= $1.from }) {
            // Merge the pair with the smallest gap (an overlap first).
            var best = 0
            for i in 1..<windows.count - 1 where windows[i + 1].from - windows[i].to < windows[best + 1].from - windows[best].to {
                best = i
            }
            windows[best].to = max(windows[best].to, windows[best + 1].to)
            windows.remove(at: best + 1)
        }
        let covered = windows.reduce(Duration.zero) { $0 + $1.length }
        guard covered * 5 > span * 3 else { return windows }
        return densest(instants, span: span, in: model)
    }

    /// The `maxDetails - 1` stretches of an eighth of the span holding the most instants, none
    /// overlapping another, in time order.
    private static func densest(_ instants: [Instant], span: Duration, in model: TimelineModel) -> [Window] {
        let length = span / 8
        var chosen: [Window] = []
        for _ in 0..<maxDetails - 1 {
            var best: (count: Int, window: Window)?
            var tail = 0
            for (head, at) in instants.enumerated() {
                // Windows that start at an instant: the one holding it and what follows within `length`.
                while tail < instants.count, instants[tail] - at <= length { tail += 1 }
                let window = Window(from: at, to: min(model.end, at + length))
                guard !chosen.contains(where: { $0.from < window.to && window.from < $0.to }) else { continue }
                let count = tail - head
                if count > best?.count ?? 0 { best = (count, window) }
            }
            guard let best else { break }
            chosen.append(best.window)
        }
        return chosen.sorted { $0.from < $1.from }
    }

    /// A label placed under a row: on which of the row's tiers, and whether it ends at `x`
    /// rather than starting there (near the right edge).
    struct Placement: Equatable {
        var text: String
        var tier: Int
        var endsAtX: Bool
    }

    /// Places labels of marks at `xs` (ascending) on `tiers` lines between `left` and `right`,
    /// each label `charWidth` per character, never two on a line closer than `spacing`: the full
    /// label if it fits, else its first word, else none (the mark keeps its hover text).
    static func place(_ labels: [(x: Double, text: String)], tiers: Int, left: Double, right: Double,
                      charWidth: Double, spacing: Double = 6) -> [Placement?] {
        var ends = Array(repeating: -Double.infinity, count: tiers)
        return labels.map { x, text in
            var candidates = [text]
            if let word = text.split(separator: " ").first, word.count < text.count { candidates.append(String(word)) }
            for candidate in candidates {
                let width = Double(candidate.count) * charWidth
                let endsAtX = x - 2 + width > right
                let start = endsAtX ? x + 2 - width : x - 2
                guard start >= left else { continue }
                if let tier = ends.indices.first(where: { start >= ends[$0] + spacing }) {
                    ends[tier] = start + width
                    return Placement(text: candidate, tier: tier, endsAtX: endsAtX)
                }
            }
            return nil
        }
    }

    /// `text` cut to fit `width` (with an ellipsis), or nil when not even three characters do.
    static func fit(_ text: String, width: Double, charWidth: Double) -> String? {
        let room = Int(width / charWidth)
        if text.count <= room { return text }
        guard room >= 4 else { return nil }
        return String(text.prefix(room - 1)) + "…"
    }
}
