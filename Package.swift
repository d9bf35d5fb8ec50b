// swift-tools-version: 6.0
import PackageDescription

let strict: [SwiftSetting] = [
    .enableUpcomingFeature("InternalImportsByDefault"),
    .enableUpcomingFeature("ExistentialAny"),
]

let package = Package(
    name: "Roam",
    platforms: [.macOS(.v14)],
    products: [
        .executable(name: "agent", targets: ["agent"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-metrics", from: "2.13.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus", from: "2.4.1"),
    ],
    targets: [
        // C libraries from Debian packages, and the macros Swift cannot import.
        .systemLibrary(name: "CMnl", pkgConfig: "libmnl", providers: [.apt(["libmnl-dev"])]),
        .systemLibrary(name: "CSodium", pkgConfig: "libsodium", providers: [.apt(["libsodium-dev"])]),
        .systemLibrary(name: "CNftables", pkgConfig: "libnftables", providers: [.apt(["libnftables-dev"])]),
        .target(name: "CShims"),

        // Shared value types: addresses and prefixes, the agent's clock, seeded randomness, files.
        .target(name: "Basics", swiftSettings: strict),
        // Facts from the kernel: links, addresses, routes, and the path to the server; the machine's power
        // and its suspends.
        .target(name: "PathMonitor", dependencies: ["Basics", "CMnl", "CShims"], swiftSettings: strict),
        // The pure decision core: inputs and time in, actions out.
        .target(name: "Reconnector", dependencies: ["PathMonitor"], swiftSettings: strict),
        // Line-numbered YAML, and the readers of the file formats built on it (the core's settings
        // and on-demand rules among them).
        .target(
            name: "ConfigReader", dependencies: ["PathMonitor", "Reconnector"],
            swiftSettings: strict),
        // Timelines replayed through the real model and state machine on a virtual clock.
        .target(
            name: "Replay",
            dependencies: ["PathMonitor", "Reconnector", "ConfigReader"],
            swiftSettings: strict),
        // The data plane: TUN device, UDP session, wire protocol.
        .target(
            name: "Tunnel",
            dependencies: ["CSodium", "CShims", "PathMonitor", .product(name: "Logging", package: "swift-log")],
            swiftSettings: strict),
        // What an operator reads and graphs: the log handler and the metrics, served over HTTP or written to a file.
        .target(
            name: "Observability",
            dependencies: [
                "Reconnector", "Tunnel",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
            ],
            swiftSettings: strict),
        // The lockdown firewall: Roam's own nftables table, so nothing leaves outside the tunnel, and the
        // portal windows' cgroups it lets through.
        .target(name: "Lockdown", dependencies: ["CNftables", "PathMonitor"], swiftSettings: strict),
        // Control and status: the control socket, its server and client, the protocol, JSON.
        .target(name: "Control", dependencies: ["Basics", "Tunnel"], swiftSettings: strict),
        // The tunnel's resolvers, given to systemd-resolved over D-Bus or written to resolv.conf.
        .target(name: "SystemDNS", dependencies: ["PathMonitor", "Tunnel"], swiftSettings: strict),
        // Captive portals from the user's side: the HTTP connectivity check that finds one, and the network's
        // resolvers for the program that logs in through a portal window.
        .target(
            name: "Connectivity", dependencies: ["Basics", "CShims", "PathMonitor", "Reconnector", "SystemDNS", "Tunnel"],
            swiftSettings: strict),
        // The client's and the server's settings, their YAML reader, and the trusted-file reader for the
        // secrets and configurations: made of the types of the modules below.
        .target(
            name: "Settings",
            dependencies: ["Basics", "ConfigReader", "Connectivity", "Lockdown", "Reconnector", "Tunnel"],
            swiftSettings: strict),
        .executableTarget(
            name: "agent",
            dependencies: [
                "PathMonitor", "Reconnector", "Replay", "Tunnel", "ConfigReader", "CShims", "Lockdown", "SystemDNS",
                "Observability", "Control", "Connectivity", "Settings",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strict),
        .executableTarget(
            name: "ReplayBenchmark", dependencies: ["PathMonitor", "Reconnector", "Replay"],
            path: "Benchmarks/ReplayBenchmark", swiftSettings: strict),
        .executableTarget(
            name: "RoamingBenchmark", dependencies: ["NamespaceLab", "PathMonitor", "Tunnel"],
            path: "Benchmarks/RoamingBenchmark", swiftSettings: strict),
        .executableTarget(
            name: "FloodBenchmark",
            dependencies: ["NamespaceLab", "PathMonitor", "Tunnel", .product(name: "Logging", package: "swift-log")],
            path: "Benchmarks/FloodBenchmark", swiftSettings: strict),
        .executableTarget(
            name: "GatewayBenchmark", dependencies: ["NamespaceLab", "PathMonitor"],
            path: "Benchmarks/GatewayBenchmark", swiftSettings: strict),
        .executableTarget(
            name: "SessionBenchmark", dependencies: ["PathMonitor", "Tunnel"],
            path: "Benchmarks/SessionBenchmark", swiftSettings: strict),
        .executableTarget(
            name: "PortalBenchmark", dependencies: ["NamespaceLab", "PathMonitor", "Reconnector"],
            path: "Benchmarks/PortalBenchmark", swiftSettings: strict),
        .executableTarget(
            name: "MonitorBenchmark", dependencies: ["PathMonitor"],
            path: "Benchmarks/MonitorBenchmark", swiftSettings: strict),

        // Throwaway network namespaces for the integration tests.
        .target(name: "NamespaceLab", dependencies: ["PathMonitor", "Tunnel"], path: "Tests/NamespaceLab", swiftSettings: strict),
        .testTarget(name: "PathMonitorTests", dependencies: ["PathMonitor", "NamespaceLab"], swiftSettings: strict),
        .testTarget(name: "ReconnectorTests", dependencies: ["Reconnector", "ConfigReader", "PathMonitor"], swiftSettings: strict),
        .testTarget(name: "ReplayTests", dependencies: ["Replay", "Reconnector", "PathMonitor"], swiftSettings: strict),
        .testTarget(
            name: "AgentTests",
            dependencies: ["agent", "Control", "Tunnel", "PathMonitor", "NamespaceLab",
                           .product(name: "ArgumentParser", package: "swift-argument-parser")],
            swiftSettings: strict),
        .testTarget(name: "LockdownTests", dependencies: ["Lockdown", "PathMonitor", "Tunnel", "NamespaceLab"], swiftSettings: strict),
        .testTarget(
            name: "SettingsTests", dependencies: ["Settings", "ConfigReader", "Connectivity", "Basics", "Tunnel"],
            swiftSettings: strict),
        .testTarget(name: "ConnectivityTests", dependencies: ["Connectivity", "Reconnector", "Basics"], swiftSettings: strict),
        .testTarget(name: "SystemDNSTests", dependencies: ["SystemDNS", "PathMonitor", "Tunnel", "NamespaceLab"], swiftSettings: strict),
        .testTarget(name: "ConfigReaderTests", dependencies: ["ConfigReader", "PathMonitor"], swiftSettings: strict),
        .testTarget(
            name: "TunnelTests", dependencies: ["Tunnel", "PathMonitor", "NamespaceLab", .product(name: "Logging", package: "swift-log")],
            swiftSettings: strict),
        .testTarget(
            name: "ObservabilityTests",
            dependencies: ["Observability", "Reconnector", "PathMonitor", .product(name: "Logging", package: "swift-log")],
            swiftSettings: strict),
    ],
    swiftLanguageModes: [.v6]
)
