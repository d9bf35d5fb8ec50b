import Topology
import Foundation
import Glibc
import NamespaceLab
import Testing
import Basics
@testable import PathMonitor

extension NamespaceLab {
    /// A laptop: eth0 (10.20.0.57/24, default metric 100) and wifi0 (192.168.1.23/24, metric
    /// 600), each a veth whose peer stays in the namespace to give it carrier.
    func laptop() throws {
        for (dev, address, gateway, metric) in [("eth0", "10.20.0.57/24", "10.20.0.1", 100),
                                                ("wifi0", "192.168.1.23/24", "192.168.1.1", 600)] {
            try ip("link add \(dev) type veth peer name \(dev)-peer")
            try ip("link set \(dev)-peer up")
            try ip("link set \(dev) up")
            try ip("address add \(address) dev \(dev)")
            try ip("route add default via \(gateway) dev \(dev) metric \(metric)")
        }
    }
}

extension LiveMonitor {
    /// Collects events until `done` says so or `limit` passes; bounded in time and count.
    func events(within limit: Duration = .seconds(3), until done: ([MonitorEvent]) -> Bool) -> [MonitorEvent] {
        var seen: [MonitorEvent] = []
        let deadline = ContinuousClock.now + limit
        for _ in 0..<10_000 {
            let left = deadline - ContinuousClock.now
            guard left > .zero, !done(seen) else { break }
            seen += next(timeout: left)
        }
        return seen
    }
}

extension MonitorEvent {
    var paths: [Path]? {
        switch self {
        case .paths(let p, _, _): p
        case .resynced(_, let p): p
        default: nil
        }
    }
}
