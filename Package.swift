// swift-tools-version: 6.0
import Foundation
import PackageDescription

/// GTK 4's and libadwaita's flags for the desktop shell, as pkg-config gives them, less those
/// SwiftPM refuses from a system library's pkg-config (`-pthread`, `-msse`...), which it warns of
/// at every build. Empty where pkg-config or libadwaita-1-dev is missing (scripts/setup installs
/// them): the shell then fails to compile, saying which header it lacks.
func adwaita(_ option: String) -> [String] {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: "/usr/bin/pkg-config")
    process.arguments = [option, "libadwaita-1"]
    let output = Pipe()
    process.standardOutput = output
    process.standardError = FileHandle.nullDevice
    guard (try? process.run()) != nil else { return [] }
    let data = output.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    guard process.terminationStatus == 0 else { return [] }
    return String(decoding: data, as: UTF8.self).split(whereSeparator: { $0 == " " || $0 == "\n" }).map(String.init)
}

let strict: [SwiftSetting] = [
    .enableUpcomingFeature("InternalImportsByDefault"),
    .enableUpcomingFeature("ExistentialAny"),
]

let package = Package(
    name: "Roam",
    platforms: [.macOS(.v14)],
    products: [
        .executable(name: "agent", targets: ["agent"]),
        .executable(name: "roam-desktop", targets: ["roam-desktop"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-metrics", from: "2.13.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus", from: "2.4.1"),
        // ML-KEM and the fast AEADs of the BoringSSL it vendors; exact, because CBoring calls that
        // BoringSSL's C functions by their prefixed names.
        .package(url: "https://github.com/apple/swift-crypto", exact: "4.5.2"),
    ],
    targets: [
        // C libraries from Debian packages, and the macros Swift cannot import.
        .systemLibrary(name: "CMnl", pkgConfig: "libmnl", providers: [.apt(["libmnl-dev"])]),
        .systemLibrary(name: "CSodium", pkgConfig: "libsodium", providers: [.apt(["libsodium-dev"])]),
        .systemLibrary(name: "CNftables", pkgConfig: "libnftables", providers: [.apt(["libnftables-dev"])]),
        .systemLibrary(name: "COpenSSL", providers: [.apt(["libssl-dev"])]),
        .systemLibrary(name: "CLibpq", providers: [.apt(["libpq-dev"])]),
        .target(name: "CShims"),
        // The AEADs of swift-crypto's BoringSSL, called in place with a context in the secret arena.
        .target(name: "CBoring", dependencies: [.product(name: "Crypto", package: "swift-crypto")]),

        // From the bottom. Shared value types: addresses and prefixes, the agent's clock, seeded
        // randomness, files, the DNS settings a server gives.
        .target(name: "Basics", swiftSettings: strict),
        // rtnetlink through libmnl: links, addresses and routes as values, the socket that reads
        // and writes them, and network namespaces.
        // The machine's network as values (links, addresses, routes, rules, the paths to a server
        // and the model that keeps them): what the pure core reads, with no I/O of its own.
        .target(name: "Topology", dependencies: ["Basics"], swiftSettings: strict),
        .target(name: "Netlink", dependencies: ["Basics", "Topology", "CShims", "CMnl"], swiftSettings: strict),
        // The kernel's devices and sockets: the TUN device and its offloads, UDP sockets and their
        // batches, the tunnel's routes.
        .target(name: "Device", dependencies: ["Basics", "Topology", "Netlink", "CShims"], swiftSettings: strict),
        // Facts from the kernel: the model of links, addresses and routes, the paths to the
        // server, Wi-Fi and neighbour facts.
        .target(name: "PathMonitor", dependencies: ["Basics", "Topology", "Netlink", "CShims", "CMnl"], swiftSettings: strict),
        // The pure decision core: events and time in, effects out.
        .target(name: "Reconnector", dependencies: ["Basics", "Topology"], swiftSettings: strict),
        // Line-numbered YAML, and the readers of the file formats built on it (the core's settings
        // and on-demand rules among them).
        .target(
            name: "ConfigReader", dependencies: ["Basics", "Topology", "Reconnector"],
            swiftSettings: strict),
        // The lockdown firewall: Roam's own nftables table, so nothing leaves outside the tunnel, and
        // the portal windows' cgroups it lets through.
        .target(name: "Lockdown", dependencies: ["Basics", "Topology", "Netlink", "CNftables"], swiftSettings: strict),
        // The tunnel's resolvers, given to systemd-resolved over D-Bus or written to resolv.conf,
        // and name look-ups.
        .target(name: "SystemDNS", dependencies: ["Basics", "Device"], swiftSettings: strict),
        // The stream transport for networks that drop UDP: the protocol's messages framed on TLS
        // over TCP (libssl, loaded on first use), directly or through an HTTP proxy.
        .target(name: "Streams", dependencies: ["Basics", "Topology", "Netlink", "Device", "CShims", "COpenSSL", "CBoring"], swiftSettings: strict),
        // The data plane: the Noise IK protocol, the client's and the server's packet threads.
        .target(
            name: "Tunnel",
            dependencies: [
                "Basics", "Topology", "Netlink", "Reconnector", "Device", "Streams", "CShims", "CSodium", "CBoring",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strict),
        // Captive portals from the user's side: the HTTP connectivity check that finds one, and the
        // network's resolvers for the program that logs in through a portal window; the pinned
        // HTTPS probe of the on-demand rules (libssl).
        .target(
            name: "Connectivity",
            dependencies: ["Basics", "Topology", "Device", "PathMonitor", "Reconnector", "SystemDNS", "Tunnel", "CShims", "COpenSSL"],
            swiftSettings: strict),
        // The client's and the server's settings, their YAML reader, and the trusted-file reader for
        // the secrets and configurations: made of the types of the modules below.
        .target(
            name: "Settings",
            dependencies: ["Basics", "Device", "Reconnector", "ConfigReader", "Lockdown", "Tunnel", "Connectivity"],
            swiftSettings: strict),
        // The gateways' shared user directory in PostgreSQL, through libpq loaded when a gateway
        // reads its users from there.
        .target(name: "Directory", dependencies: ["Basics", "Tunnel", "CLibpq"], swiftSettings: strict),
        // The control socket's protocol and its JSON, the socket and the client that asks it: all a
        // program that only talks to an agent needs (the desktop app), without the data plane.
        .target(name: "ControlWire", dependencies: ["Basics"], swiftSettings: strict),
        // Control and status: the control socket's server, the status's data-plane counters, the
        // mailbox.
        .target(name: "Control", dependencies: ["Basics", "Device", "Tunnel", "ControlWire"], swiftSettings: strict),
        // What an operator reads and graphs: the log handler and the metrics, served over HTTP or
        // written to a file.
        .target(
            name: "Observability",
            dependencies: [
                "Basics", "Topology", "Device", "PathMonitor", "Reconnector", "Tunnel",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
            ],
            swiftSettings: strict),
        // Timelines replayed through the real core on a virtual clock, in a simulated world.
        .target(
            name: "Replay",
            dependencies: ["Basics", "Topology", "Netlink", "Reconnector", "ConfigReader"],
            swiftSettings: strict),
        // A replay drawn as a picture: a timeline model made from its report, and that model
        // written as SVG text (no Foundation, no plotting library).
        .target(
            name: "Timeline", dependencies: ["Basics", "Topology", "Netlink", "PathMonitor", "Reconnector", "Replay"],
            swiftSettings: strict),
        // What `agent doctor` says of the machine: gathered facts in, findings out (pure).
        .target(name: "Diagnosis", dependencies: ["Basics", "Topology", "Netlink", "Device", "PathMonitor"], swiftSettings: strict),
        .executableTarget(
            name: "agent",
            dependencies: [
                "Basics", "Topology", "Netlink", "Device", "PathMonitor", "Reconnector", "ConfigReader", "Lockdown",
                "SystemDNS", "Streams", "Tunnel", "Connectivity", "Settings", "Control", "ControlWire", "Observability", "Replay", "Timeline", "Directory",
                "Diagnosis", "CShims",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strict),
        // The desktop app, a client of the control socket like `agent status`: the pure view model
        // (status in; the window, the tray and the notifications out), the GTK 4 and libadwaita
        // shell in C behind a narrow API (the only code that sees GTK), and the executable that
        // joins them. Nothing here is linked into the agent.
        .target(name: "DesktopModel", dependencies: ["ControlWire"], swiftSettings: strict),
        .target(name: "DesktopShell", cSettings: [.unsafeFlags(adwaita("--cflags-only-I"))],
                linkerSettings: [.unsafeFlags(adwaita("--libs"))]),
        .executableTarget(
            name: "roam-desktop", dependencies: ["Basics", "ControlWire", "DesktopModel", "DesktopShell"],
            swiftSettings: strict),
        .executableTarget(
            name: "ReplayBenchmark", dependencies: ["Basics", "Topology", "PathMonitor", "Reconnector", "Replay"],
            path: "Benchmarks/ReplayBenchmark", swiftSettings: strict),
        .executableTarget(
            name: "RoamingBenchmark", dependencies: ["Basics", "Device", "Tunnel", "Reconnector", "NamespaceLab"],
            path: "Benchmarks/RoamingBenchmark", swiftSettings: strict),
        .executableTarget(
            name: "FloodBenchmark",
            dependencies: [
                "Basics", "Topology", "Netlink", "Device", "Tunnel", "NamespaceLab",
                .product(name: "Logging", package: "swift-log"),
            ],
            path: "Benchmarks/FloodBenchmark", swiftSettings: strict),
        .executableTarget(
            name: "GatewayBenchmark", dependencies: ["Basics", "NamespaceLab"],
            path: "Benchmarks/GatewayBenchmark", swiftSettings: strict),
        .executableTarget(
            name: "SessionBenchmark", dependencies: ["Basics", "Device", "Tunnel"],
            path: "Benchmarks/SessionBenchmark", swiftSettings: strict),
        .executableTarget(
            name: "PortalBenchmark", dependencies: ["Basics", "Topology", "PathMonitor", "Reconnector", "NamespaceLab"],
            path: "Benchmarks/PortalBenchmark", swiftSettings: strict),
        .executableTarget(
            name: "MonitorBenchmark", dependencies: ["Basics", "Topology", "Netlink", "PathMonitor"],
            path: "Benchmarks/MonitorBenchmark", swiftSettings: strict),

        // The protocol cores under libFuzzer (scripts/fuzz protocol); built plainly, it replays
        // the inputs it is given, so a crash the fuzzer found can be run again anywhere.
        .executableTarget(
            name: "ProtocolFuzz", dependencies: ["Basics", "Device", "Tunnel", "FuzzInputs"],
            path: "Fuzz/Protocol", swiftSettings: strict),
        // What a stream to the gateway and a proxy's answer could hold, under libFuzzer (scripts/fuzz
        // streams); built plainly, it replays the inputs it is given.
        .executableTarget(
            name: "StreamsFuzz", dependencies: ["Basics", "Device", "Streams", "FuzzInputs"],
            path: "Fuzz/Streams", swiftSettings: strict),
        // The fuzz targets' plain runner: each input file fed to the entry, as libFuzzer would.
        .target(name: "FuzzInputs", path: "Fuzz/Inputs", swiftSettings: strict),

        // A process that is not the agent but sets the session's mark, for the lockdown's lab tests.
        .executableTarget(name: "MarkedSender", path: "Tests/MarkedSender", swiftSettings: strict),
        // Throwaway network namespaces for the integration tests.
        .target(name: "NamespaceLab", dependencies: ["Basics", "Topology", "Netlink", "Device", "Streams", "Tunnel"], path: "Tests/NamespaceLab", swiftSettings: strict),
        .testTarget(name: "PathMonitorTests", dependencies: ["Basics", "Topology", "Netlink", "PathMonitor", "NamespaceLab"], swiftSettings: strict),
        .testTarget(name: "ReconnectorTests", dependencies: ["Basics", "Topology", "Netlink", "PathMonitor", "Reconnector", "ConfigReader"], swiftSettings: strict),
        .testTarget(name: "DiagnosisTests", dependencies: ["Basics", "Topology", "Netlink", "Device", "PathMonitor", "Diagnosis"], swiftSettings: strict),
        .testTarget(name: "DesktopModelTests", dependencies: ["ControlWire", "DesktopModel"], swiftSettings: strict),
        // roam-desktop's window under Xvfb through AT-SPI (a Python helper beside it); it runs the
        // built binaries, which `swift build` makes with every product, so it links none of GTK. Its
        // lab test runs a real gateway and client in namespaces (NamespaceLab).
        .testTarget(name: "DesktopAppTests", dependencies: ["NamespaceLab"], exclude: ["desktop_session.py"], swiftSettings: strict),
        .testTarget(name: "ReplayTests", dependencies: ["Reconnector", "Replay"], swiftSettings: strict),
        .testTarget(name: "TimelineTests", dependencies: ["Basics", "Reconnector", "Replay", "Timeline"], swiftSettings: strict),
        .testTarget(
            name: "AgentTests",
            dependencies: [
                "Basics", "Device", "Tunnel", "Control", "ControlWire", "SystemDNS", "agent", "NamespaceLab", "MarkedSender",
                "DesktopModel", .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            swiftSettings: strict),
        .testTarget(name: "LockdownTests", dependencies: ["Basics", "Topology", "Netlink", "Device", "Lockdown", "Tunnel", "NamespaceLab"], swiftSettings: strict),
        .testTarget(
            name: "SettingsTests", dependencies: ["Basics", "Topology", "Device", "Netlink", "Reconnector", "ConfigReader", "Tunnel", "Connectivity", "Settings"],
            swiftSettings: strict),
        .testTarget(
            name: "ConnectivityTests", dependencies: ["Basics", "Topology", "Device", "PathMonitor", "Reconnector", "Connectivity", "NamespaceLab"],
            swiftSettings: strict),
        .testTarget(name: "DirectoryTests", dependencies: ["Basics", "Device", "Directory", "Tunnel", "NamespaceLab"], swiftSettings: strict),
        .testTarget(name: "SystemDNSTests", dependencies: ["Basics", "SystemDNS", "Tunnel", "NamespaceLab"], swiftSettings: strict),
        .testTarget(name: "StreamsTests", dependencies: ["Basics", "Device", "Streams"], swiftSettings: strict),
        .testTarget(name: "ConfigReaderTests", dependencies: ["Basics", "ConfigReader", "Reconnector"], swiftSettings: strict),
        .testTarget(
            name: "TunnelTests", dependencies: ["Basics", "Topology", "Netlink", "Device", "Streams", "Tunnel", "NamespaceLab", .product(name: "Logging", package: "swift-log")],
            swiftSettings: strict),
        .testTarget(
            name: "ObservabilityTests",
            dependencies: [
                "Basics", "Topology", "Device", "PathMonitor", "Reconnector", "Tunnel", "Observability",
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strict),
    ],
    swiftLanguageModes: [.v6]
)
