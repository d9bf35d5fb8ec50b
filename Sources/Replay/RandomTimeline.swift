import Topology
import Basics
import Reconnector

extension Scenario {
    /// A seeded random life of a laptop: uplinks losing carrier, going down, renumbering,
    /// turning lossy, container links churning, silent drops, server restarts, suspends, power
    /// changes.
    ///
    /// Events come as raw model changes, the way a recording does, so nothing can fail to
    /// resolve. Used by the invariant tests and the benchmark; the same seed gives the same life.
    /// `clockJumps: false` keeps the timeline exactly `count × spacing` long.
    public static func random(seed: UInt64, events count: Int, spacing: Duration, clockJumps: Bool = true,
                              name: String = "random") -> Scenario
    {
        var rng = SeededRandom(seed: seed)
        func pick(_ n: Int) -> Int { Int(rng.next() % UInt64(n)) }
        func chance(_ percent: Int) -> Bool { pick(100) < percent }

        struct Uplink {
            var link: Link
            var subnet: UInt32
            var host: UInt32
            var metric: UInt32
        }
        var uplinks = [
            Uplink(link: Link(index: 2, name: "eth0", kind: .ethernet), subnet: 0x0A14_0000, host: 57, metric: 100),
            Uplink(link: Link(index: 3, name: "wifi0", kind: .wifi), subnet: 0xC0A8_0100, host: 23, metric: 600),
            Uplink(link: Link(index: 4, name: "wwan0", kind: .wwan), subnet: 0x0A40_0000, host: 9, metric: 700),
        ]
        func address(_ u: Uplink) -> Address {
            Address(linkIndex: u.link.index, prefix: Prefix(.v4(u.subnet | u.host), length: 24)!)
        }
        func routes(_ u: Uplink) -> [Route] {
            [Route(destination: Prefix(.v4(u.subnet), length: 24)!, nextHops: [NextHop(linkIndex: u.link.index)],
                   metric: u.metric, preferredSource: .v4(u.subnet | u.host)),
             Route(destination: .any(.v4), nextHops: [NextHop(gateway: .v4(u.subnet | 1), linkIndex: u.link.index)],
                   metric: u.metric)]
        }

        var network: [TimedEvent] = []
        func initial(_ change: NetworkChange) { network.append(TimedEvent(at: .zero, line: 0, event: .change(change))) }
        for u in uplinks {
            initial(.linkChanged(u.link))
            initial(.addressAdded(address(u)))
            for r in routes(u) { initial(.routeAdded(r)) }
        }

        var timeline: [TimedEvent] = []
        var t = Instant.zero
        var sleeping = false
        var dropped: Set<String> = []
        var containers = 0
        func add(_ event: ScenarioEvent) { timeline.append(TimedEvent(at: t, line: 0, event: event)) }
        for _ in 0..<count {
            t = t + spacing
            if sleeping {
                add(.wake)
                sleeping = false
                continue
            }
            let i = pick(uplinks.count)
            switch pick(100) {
            case 0..<30:  // carrier lost or back: routes stay
                uplinks[i].link.hasCarrier.toggle()
                add(.change(.linkChanged(uplinks[i].link)))
            case 30..<40:  // administratively down (routes flushed) or up with DHCP redoing routes
                uplinks[i].link.isUp.toggle()
                add(.change(.linkChanged(uplinks[i].link)))
                if uplinks[i].link.isUp { for r in routes(uplinks[i]) { add(.change(.routeAdded(r))) } }
            case 40..<50:  // renumbered by DHCP
                add(.change(.addressRemoved(address(uplinks[i]).key)))
                uplinks[i].host = uplinks[i].host % 250 + 2
                add(.change(.addressAdded(address(uplinks[i]))))
                for r in routes(uplinks[i]) { add(.change(.routeAdded(r))) }
            case 50..<62:  // a container's veth comes or goes
                if containers > 0 && chance(50) {
                    add(.change(.linkRemoved(index: Int32(100 + containers))))
                    containers -= 1
                } else {
                    containers += 1
                    let veth = Link(index: Int32(100 + containers), name: "veth\(containers)", kind: .virtual)
                    add(.change(.linkChanged(veth)))
                    add(.change(.addressAdded(Address(linkIndex: veth.index,
                                                      prefix: Prefix(.v4(0xAC11_0000 | UInt32(containers)), length: 16)!))))
                }
            case 62..<70:  // the uplink silently drops everything, or recovers
                let name = uplinks[i].link.name
                if dropped.contains(name) { dropped.remove(name); add(.restore(name)) } else { dropped.insert(name); add(.drop(name)) }
            case 70..<74: add(.server(chance(50) ? .restart : (chance(40) ? .down : (chance(60) ? .up : .moved))))
            case 74..<80:
                add(.sleep)
                sleeping = true
            case 80..<83 where clockJumps:
                let jump = Duration.seconds(Int64(pick(4 * 3600)))
                add(.clockJump(jump))
                t = t + jump
            case 80..<88: add(.power(chance(50) ? .battery : .ac))
            case 88..<89: add(.auth(accepts: chance(70)))
            case 89..<91: add(.reconnect)
            case 91..<95:  // the uplink turns lossy (up to half of everything, one way or both) or clean
                let share = chance(30) ? 0 : Double(pick(50)) / 100
                let direction = pick(3)  // 0 up, 1 down, 2 both
                add(.link(LinkSpec(name: uplinks[i].link.name, lossUp: direction == 1 ? nil : share,
                                   lossDown: direction == 0 ? nil : share, jitter: .milliseconds(Int64(pick(80))))))
            default:  // a duplicate notification: the kernel repeats itself
                add(.change(.linkChanged(uplinks[i].link)))
            }
        }
        if sleeping {
            t = t + spacing
            add(.wake)
        }
        return Scenario(
            file: "<\(name) seed \(seed)>", name: name, about: "", server: .v4(0xC633_6407), serverAddresses: [.v4(0xC633_6407)],
            tunnelInterface: "roam0", config: Config(), power: .ac, seed: seed, traffic: .milliseconds(500),
            rtt: .milliseconds(20), network: network, timeline: timeline, until: t + .seconds(60),
            expect: Expectations())
    }
}
