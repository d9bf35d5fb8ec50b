import Basics
@testable import Connectivity
import Testing

private let hotel = [IPAddress("192.168.1.1")!]
/// Debian's nsswitch.conf with systemd-resolved's NSS module, as libnss-resolve installs it.
private let resolvedSwitch = """
    passwd:         files systemd
    group:          files systemd
    hosts:          files mymachines resolve [!UNAVAIL=return] dns myhostname
    networks:       files
    """

@Test func theStubOrItsModuleGetTheNetworksResolversInstead() throws {
    let plan = try #require(PortalResolution.plan(resolvers: hotel, resolvConf: "nameserver 127.0.0.53\noptions edns0 trust-ad\n",
                                                  nsswitch: resolvedSwitch))
    #expect(plan.resolvConf.contains("\nnameserver 192.168.1.1\n") && !plan.resolvConf.contains("127.0.0.53"))
    let switched = try #require(plan.nsswitch)
    #expect(PortalResolution.hostsSources(switched) == ["files", "dns"])
    #expect(switched.contains("passwd:         files systemd\n") && switched.contains("networks:       files"), "the rest as it was")
}

@Test func aFileThatNamesTheNetworksResolversAlreadyNeedsNothing() {
    #expect(PortalResolution.plan(resolvers: hotel, resolvConf: "nameserver 192.168.1.1\nsearch hotel.example\n",
                                  nsswitch: "hosts: files dns\n") == nil)
    // The tunnel's resolvers (the agent's own resolv.conf) are not the network's.
    let tunnel = PortalResolution.plan(resolvers: hotel, resolvConf: "nameserver 10.88.0.1\n", nsswitch: "hosts: files dns\n")
    #expect(tunnel?.resolvConf.contains("nameserver 192.168.1.1") == true && tunnel?.nsswitch == nil)
    // No resolver known for the network: nothing to give.
    #expect(PortalResolution.plan(resolvers: [], resolvConf: "nameserver 127.0.0.53\n", nsswitch: resolvedSwitch) == nil)
}

@Test func hostsSourcesLeaveOutActions() {
    #expect(PortalResolution.hostsSources("hosts: files resolve [!UNAVAIL=return] dns # local") == ["files", "resolve", "dns"])
    #expect(PortalResolution.hostsSources("passwd: files\n") == nil)
}
