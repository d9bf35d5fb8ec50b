import Glibc

import Basics
import Testing
import Tunnel
@testable import Lockdown

/// Stands in for nftables' answers only: the table the firewall believes it holds is what
/// these tests check, against every load the "kernel" took.
private final class Table {
    var refusing = false
    var held: LockdownPolicy
    var loads = 0
    init(_ policy: LockdownPolicy) { held = policy }
    func apply(_ policy: LockdownPolicy) throws(LockdownError) {
        loads += 1
        if refusing { throw LockdownError("apply", "Error: Could not process rule: Device or resource busy") }
        held = policy
    }
}

private func lockedFirewall() -> (Firewall, Table) {
    let policy = LockdownPolicy(scope: .full(mark: 0xca6c), tunnelInterface: "roam0")
    let table = Table(policy)
    return (Firewall(holding: policy, apply: table.apply), table)
}

@Test func aRefusedRestoreStaysWantedAndIsRetriedUntilItHolds() throws {
    let (firewall, table) = lockedFirewall()
    try firewall.lift(for: "eth0")
    #expect(table.held.trustedInterface == "eth0" && firewall.trustedInterface == "eth0")

    table.refusing = true
    #expect(throws: LockdownError.self) { try firewall.restore() }
    #expect(firewall.trustedInterface == "eth0", "the table still lets eth0 through, and says so")
    #expect(firewall.refusals == 1)

    // A change that opens something meanwhile is refused too, and forgotten; the restore is not.
    #expect(throws: LockdownError.self) { try firewall.serve([LockdownPolicy.Server(IPAddress("192.0.2.7")!, port: 51820)]) }
    #expect(firewall.retry() != nil)
    #expect(firewall.refusals == 3)

    table.refusing = false
    #expect(firewall.retry() == nil)
    #expect(table.held.trustedInterface == nil && table.held.servers.isEmpty, "the restore holds; the refused opening does not come back")
    #expect(firewall.trustedInterface == nil && firewall.refusals == 0)
    let loads = table.loads
    #expect(firewall.retry() == nil && table.loads == loads, "nothing left to load")
}

@Test func aLaterChangeCarriesARefusedClosingWithIt() throws {
    let (firewall, table) = lockedFirewall()
    try firewall.lift(for: "eth0")
    table.refusing = true
    #expect(throws: LockdownError.self) { try firewall.restore() }
    table.refusing = false
    // The next change loads the whole wanted policy: the lift does not come back with it.
    try firewall.serve([LockdownPolicy.Server(IPAddress("192.0.2.7")!, port: 51820)])
    #expect(table.held.trustedInterface == nil && table.held.servers.count == 1)
    #expect(firewall.refusals == 0)
}

@Test func aRefusedLiftIsNotTriedAgainButTheLockdownIsLoadedAgain() {
    let (firewall, table) = lockedFirewall()
    table.refusing = true
    #expect(throws: LockdownError.self) { try firewall.lift(for: "eth0") }
    // A refusal may have been reported after the kernel took the lift: until a load succeeds,
    // status says eth0 may be open, and the locked policy is loaded again.
    #expect(firewall.trustedInterface == "eth0" && firewall.refusals == 1)
    table.refusing = false
    table.held.trustedInterface = "eth0"  // as if the refused load had committed
    #expect(firewall.retry() == nil && table.held.trustedInterface == nil)
    #expect(firewall.trustedInterface == nil && firewall.refusals == 0)
}

@Test func aRefusedPortalWindowClosingIsRetried() throws {
    let (firewall, table) = lockedFirewall()
    let window = LockdownPolicy.PortalWindow(cgroup: "roam/portal", level: 2, interface: "wifi0", resolvers: [IPAddress("10.0.0.1")!])
    try firewall.portalWindow(window)
    table.refusing = true
    #expect(throws: LockdownError.self) { try firewall.portalWindow(nil) }
    #expect(table.held.portalWindow == window && firewall.refusals == 1)
    table.refusing = false
    #expect(firewall.retry() == nil && table.held.portalWindow == nil)
}

/// A change nobody is told the answer of (the local networks with allow-lan) stays wanted when
/// refused, and the retry loads it: the table comes to hold what the core decided.
@Test func aRefusedLocalNetworksChangeStaysWantedAndIsRetried() throws {
    var policy = LockdownPolicy(scope: .full(mark: 0xca6c), tunnelInterface: "roam0", allowLAN: true, localNetworks: [])
    policy.owner = .anyMarked
    let table = Table(policy)
    let firewall = Firewall(holding: policy, apply: table.apply)
    table.refusing = true
    #expect(throws: LockdownError.self) { try firewall.localNetworksChanged([Prefix("192.168.1.0/24")!]) }
    #expect(firewall.refusals == 1 && firewall.lastRefusal != nil)
    table.refusing = false
    #expect(firewall.retry() == nil)
    #expect(table.held.localNetworks == [Prefix("192.168.1.0/24")!] && firewall.lastRefusal == nil)
}

/// Opening the exclusion is answered, so a refused opening is forgotten; a change of what it lets
/// through (the network's resolvers) nobody is told of, so a refused one stays wanted and the
/// retry loads it. The count of refusals only grows: a refusal between two loads that succeed is
/// never missed by whoever compares it before and after.
@Test func aRefusedChangeOfTheExclusionsResolversIsRetriedAndEveryRefusalIsCounted() throws {
    let (firewall, table) = lockedFirewall()
    let before = LockdownPolicy.Exclusion(cgroup: "roam/excluded", level: 2, resolvers: [IPAddress("10.0.0.1")!])
    table.refusing = true
    #expect(throws: LockdownError.self) { try firewall.exclusion(before) }
    table.refusing = false
    #expect(firewall.retry() == nil && table.held.exclusion == nil, "a refused opening is forgotten")
    try firewall.exclusion(before)
    #expect(firewall.refusals == 0 && firewall.refusalsEver == 1)
    let after = LockdownPolicy.Exclusion(cgroup: "roam/excluded", level: 2, resolvers: [IPAddress("192.168.1.1")!])
    table.refusing = true
    #expect(throws: LockdownError.self) { try firewall.exclusion(after) }
    #expect(firewall.refusalsEver == 2)
    table.refusing = false
    #expect(firewall.retry() == nil && table.held.exclusion == after, "the new resolvers are loaded")
}
