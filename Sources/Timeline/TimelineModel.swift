public import Basics

/// What a timeline picture shows, as plain values: a span of time, lanes of coloured bands
/// (the session's states, the path in use, each uplink, the outages, the machine asleep), and
/// instants marked with a short label. `TimelineModel(report:scenario:)` makes one from a
/// replay; `SVGTimeline.render` draws one.
public struct TimelineModel: Sendable, Equatable {
    public var title: String
    /// One line under the title: the file, the verdict, the counts.
    public var subtitle: String
    public var start: Instant
    public var end: Instant
    /// Top to bottom.
    public var lanes: [Lane]
    /// In time order.
    public var marks: [Mark]

    public init(title: String, subtitle: String, start: Instant, end: Instant, lanes: [Lane], marks: [Mark]) {
        self.title = title
        self.subtitle = subtitle
        self.start = start
        self.end = end
        self.lanes = lanes
        self.marks = marks
    }

    /// A row of bands, named at its left.
    public struct Lane: Sendable, Equatable {
        public var kind: Kind
        public var name: String
        /// In time order, not overlapping.
        public var bands: [Band]

        public init(kind: Kind, name: String, bands: [Band]) {
            self.kind = kind
            self.name = name
            self.bands = bands
        }

        public enum Kind: String, Sendable {
            /// The session's states.
            case session
            /// The uplink the session runs on or heads for.
            case path
            /// One uplink's condition.
            case uplink
            /// The tunnel did not work while an uplink could have carried it.
            case outage
            /// The machine was asleep.
            case machine
        }
    }

    /// A stretch of one lane: `label` is drawn when it fits, `detail` is the hover text.
    public struct Band: Sendable, Equatable {
        public var from: Instant
        public var to: Instant
        public var paint: Paint
        public var label: String
        public var detail: String

        public init(from: Instant, to: Instant, paint: Paint, label: String, detail: String) {
            self.from = from
            self.to = to
            self.paint = paint
            self.label = label
            self.detail = detail
        }
    }

    /// What a band stands for; the renderer picks its colour and its legend entry.
    public enum Paint: Hashable, Sendable {
        /// The session in the state of this name (`State.name`).
        case state(String)
        /// The session runs on the uplink with this name, one of `uplinks` (`carrying`), or only
        /// heads for it (a handshake in flight, a backoff, a portal).
        case path(String, carrying: Bool)
        /// An uplink's condition.
        case uplink(UplinkCondition)
        case outage
        case asleep
    }

    /// What an uplink could do for the tunnel.
    public enum UplinkCondition: String, Hashable, Sendable, CaseIterable {
        /// Up, with a path to the server.
        case usable
        /// Up with its carrier, but no route or address reaches the server.
        case noPath = "no-path"
        /// Up, its carrier lost (a cable pulled, an association lost).
        case noCarrier = "no-carrier"
        /// Administratively down.
        case down
        /// Up and routed, but the network behind it drops everything.
        case dropping
        /// Up and routed, behind a closed captive portal.
        case portal
    }

    /// Something that happened at one instant.
    public struct Mark: Sendable, Equatable {
        public var at: Instant
        public var kind: Kind
        /// A few words, drawn when there is room.
        public var label: String
        /// The whole story, as hover text.
        public var detail: String

        public init(at: Instant, kind: Kind, label: String, detail: String) {
            self.at = at
            self.kind = kind
            self.label = label
            self.detail = detail
        }

        public enum Kind: String, Sendable, CaseIterable {
            /// A handshake completed.
            case handshake
            /// A handshake timed out, was refused, or the server lost the session.
            case handshakeFailed = "handshake-failed"
            /// An attempt started (a bind and a handshake on a path).
            case attempt
            /// The core waits before the next attempt.
            case backoff
            case sleep
            case wake
            /// A captive portal found or gone, a portal window opened or closed.
            case portal
            /// An on-demand rule decided, or waits for a fact.
            case onDemand = "on-demand"
            /// Something the scenario did to the world: the server, an operator, a restart.
            case world
        }
    }
}
