import Topology
import Foundation
import Glibc
import NamespaceLab
import Basics
import PathMonitor
import Reconnector

// Captive portals, measured. In the namespace lab (root): a router that holds the laptop's Wi-Fi
// behind a portal (UDP dropped, HTTP redirected to a login page) and a real `agent up` with the
// lockdown on. Each round: how long the agent takes to report the portal, then a login with
// `agent portal --run curl` and the time from the portal opening to the first echo through the
// tunnel, once with curl ending (the window closes and the agent checks at once) and once with a
// "browser" that stays open (the window's frequent rechecks find the portal open). Then the
// rechecks a laptop left idle behind a closed portal makes per hour, on mains and on battery,
// from the decision core's own schedule.
//
// Usage: PortalBenchmark [--rounds 3]
//        PortalBenchmark --serve NAMESPACE UPLINK ADDRESS   (the demo's portal: until SIGTERM)

func say(_ line: String) { FileHandle.standardError.write(Data((line + "\n").utf8)) }

struct Failure: Error, CustomStringConvertible {
    var description: String
}

var rounds = 3
var arguments = CommandLine.arguments.dropFirst()
while let argument = arguments.popFirst() {
    switch argument {
    case "--rounds": rounds = Int(arguments.popFirst() ?? "") ?? rounds
    case "--serve":
        guard let name = arguments.popFirst(), let uplink = arguments.popFirst(),
              let address = arguments.popFirst().flatMap(IPAddress.init) else {
            say("usage: PortalBenchmark --serve NAMESPACE UPLINK ADDRESS")
            exit(2)
        }
        serve(in: name, uplink: uplink, address: address)
    default:
        say("usage: PortalBenchmark [--rounds 3] | --serve NAMESPACE UPLINK ADDRESS")
        exit(2)
    }
}

/// The demo's portal, on the router `name`'s side of `uplink`: closed until a POST to its login
/// page, then open until SIGTERM or SIGINT.
func serve(in name: String, uplink: String, address: IPAddress) -> Never {
    do {
        let portal = try LabPortal(router: NamespaceLab(adopting: name), uplink: uplink, routerAddress: address)
        var signals = sigset_t()
        sigemptyset(&signals)
        sigaddset(&signals, SIGTERM)
        sigaddset(&signals, SIGINT)
        pthread_sigmask(SIG_BLOCK, &signals, nil)
        FileHandle.standardOutput.write(Data("portal: closed on \(uplink); login page http://\(portal.login)/login; check http://\(portal.check)/check\n".utf8))
        var signal: Int32 = 0
        sigwait(&signals, &signal)
        portal.stop()
        _ = try? NamespaceLab(adopting: name).ip("address del \(portal.check.ip)/32 dev lo")
        exit(0)
    } catch {
        say("portal: \(error)")
        exit(1)
    }
}

guard NamespaceLab.isRoot else {
    say("PortalBenchmark: \(NamespaceLab.skipReason)")
    exit(2)
}

/// One round: the time to find the portal and from its opening to an echo through the tunnel.
func round(browserStaysOpen: Bool) throws -> (found: Duration, traffic: Duration, checks: Int) {
    let lab = try RoamingLab(vpn: .roam, routing: .full)
    try lab.laptop.ip("link set eth0 down")
    let portal = try LabPortal(router: lab.server, uplink: "wifi-l", routerAddress: IPAddress("192.168.1.1")!)
    defer { portal.stop() }
    try lab.configure("client", "portal: {url: \"http://\(portal.check)/check\", expect: \"\(LabPortal.expected)\"}")
    try lab.startServer()
    let started = LabClock.now
    try lab.startClient(waitForTunnel: false)
    guard lab.waitFor(seconds: 30, { lab.status()["state"] == "portal" }) else {
        throw Failure(description: "no portal reported: \(lab.log("client.log"))")
    }
    let found = LabClock.now - started
    let login = "curl -sS --max-time 5 -d user=guest http://\(portal.login)/login"
    let command = browserStaysOpen ? ["sh", "-c", "\(login) && sleep 3"] : login.split(separator: " ").map(String.init)
    let browser = Process()
    browser.executableURL = NamespaceLab.ipTool
    browser.arguments = ["netns", "exec", lab.laptop.name, RoamingLab.builtAgent.path, "portal", "--control", lab.controlSocket, "--run"] + command
    browser.standardOutput = FileHandle.nullDevice
    browser.standardError = FileHandle.nullDevice
    try browser.run()
    defer { if browser.isRunning { kill(browser.processIdentifier, SIGKILL) }; browser.waitUntilExit() }
    guard lab.waitFor(seconds: 10, { portal.opened != nil }), let opened = portal.opened else {
        throw Failure(description: "the login did not open the portal: \(lab.log("client.log"))")
    }
    var echoed: LabInstant?
    for _ in 0..<200 where echoed == nil {
        let ping = try NamespaceLab.capture(NamespaceLab.ipTool, ["netns", "exec", lab.laptop.name, "ping", "-c", "1", "-W", "0.1",
                                                                  lab.serverInner.description])
        if ping.status == 0 { echoed = LabClock.now }
    }
    guard let echoed else { throw Failure(description: "no echo through the tunnel: \(lab.log("client.log"))") }
    usleep(3_500_000)  // the "browser" ends and the window closes before the lab goes
    return (found, echoed - opened, Int(lab.status()["connectivity_checks"] ?? "") ?? -1)
}

func ms(_ d: Duration) -> String { String(format: "%.0f ms", Double(d.components.seconds) * 1000 + Double(d.components.attoseconds) / 1e15) }

say("portal: \(ProcessInfo.processInfo.activeProcessorCount) cores, \(rounds) rounds each")
for staysOpen in [false, true] {
    var traffic: [Duration] = []
    for i in 1...rounds {
        do {
            let r = try round(browserStaysOpen: staysOpen)
            traffic.append(r.traffic)
            print("round \(i) (\(staysOpen ? "browser stays open: the window's rechecks" : "curl ends: the window closes, a check at once")): "
                + "portal reported \(ms(r.found)) after start, echo through the tunnel \(ms(r.traffic)) after the portal opened, "
                + "\(r.checks) connectivity checks")
        } catch {
            print("round \(i): FAILED: \(error)")
        }
    }
    if let worst = traffic.max(), let best = traffic.min() {
        print("portal opening to traffic (\(staysOpen ? "browser open" : "browser ends")): best \(ms(best)), worst \(ms(worst)) of \(traffic.count)")
    }
}

/// The rechecks an idle laptop behind a closed portal makes, from the decision core's schedule.
func rechecks(on power: PowerSource, hours: Int) -> (perHour: [Int], handshakesBehindPortal: Int) {
    let path = Path(linkIndex: 2, interface: "wifi0", kind: .wifi, source: IPAddress("10.99.4.23")!,
                    gateway: IPAddress("10.99.0.1"), metric: 600, prefixLength: 0, mtu: 1500)
    var reconnector = Reconnector(power: power)
    var perHour = [Int](repeating: 0, count: hours)
    var handshakes = 0
    var now = Instant.zero
    var pending: [Effect] = reconnector.handle(.paths([path]), now: now)
    let end = Instant.zero + .seconds(3600 * hours)
    while now < end {
        for effect in pending {
            if case .handshake = effect, reconnector.connectivityChecks > 0 { handshakes += 1 }
            if case .checkConnectivity = effect {
                let hour = Int((now - .zero).components.seconds / 3600)
                if hour < hours { perHour[hour] += 1 }
            }
        }
        // Every check finds the portal a round trip later; every handshake goes unanswered.
        if pending.contains(where: { if case .checkConnectivity = $0 { true } else { false } }) {
            now = now + .milliseconds(30)
            pending = reconnector.handle(.connectivity(.portal(url: "http://portal.example/"), on: path.id), now: now)
            continue
        }
        guard let (kind, due) = reconnector.timers.min(by: { $0.value < $1.value }) else { break }
        now = due
        pending = reconnector.handle(.timerFired(kind), now: now)
    }
    return (perHour, handshakes)
}

for power in [PowerSource.ac, .battery] {
    let (hours, handshakes) = rechecks(on: power, hours: 24)
    print("idle behind a closed portal on \(power.rawValue): connectivity checks in hour 1: \(hours[0]), hour 2: \(hours[1]), "
        + "per hour after: \(hours[23]), in 24 h: \(hours.reduce(0, +)); handshakes after the portal was found: \(handshakes)")
}
