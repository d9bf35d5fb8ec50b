import Testing
@testable import agent

@Test func networkAdminIsReadFromTheEffectiveCapabilities() {
    let root = "Name:\tagent\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\n"
    let service = "CapEff:\t0000000000003000\n"  // CAP_NET_ADMIN and CAP_NET_RAW, as the unit gives
    let nobody = "CapPrm:\t0000000000000000\nCapEff:\t0000000000000000\n"
    #expect(Preflight.hasNetworkAdmin(processStatus: root))
    #expect(Preflight.hasNetworkAdmin(processStatus: service))
    #expect(!Preflight.hasNetworkAdmin(processStatus: nobody))
    #expect(!Preflight.hasNetworkAdmin(processStatus: "garbage"))
}
