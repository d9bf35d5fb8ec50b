import ArgumentParser
import ConfigReader
import Foundation
import PathMonitor
import Tunnel

/// `agent up`: bring the tunnel up over the current path and keep it until stopped.
struct UpCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "up",
        abstract: "Bring the tunnel up over the path the kernel uses to reach the server now.",
        discussion: "The session's UDP socket is bound to that path's interface and source address; the TUN device is configured once.")

    @OptionGroup var daemon: DaemonOptions

    func run() throws {
        let log = daemon.log
        let (reader, root) = try YAMLReader.load(daemon.config)
        let settings = try reader.client(root)
        let key = try loadPrivateKey(settings.privateKeyFile)
        var credentials: Credentials?
        if let username = settings.username, let file = settings.passwordFile {
            guard let c = Credentials(username: username, password: try readSecretFile(file)) else {
                throw AgentError("the username or password is longer than \(Credentials.maxLength) bytes")
            }
            credentials = c
        }
        let address = try resolve(settings.server.description)
        guard let port = settings.server.port else { throw AgentError("the server needs a port") }
        let server = SocketAddress(address, port: port)
        if case .split(let prefixes) = settings.mode, let loop = prefixes.first(where: { $0.contains(address) }) {
            throw AgentError("the split route \(loop) contains the server \(address): the tunnel would carry its own packets; narrow it")
        }

        let path: Path
        do {
            guard let best = try LiveMonitor(endpoint: address, tunnelInterface: settings.tunnel.name).paths.first else {
                throw AgentError("no usable path to \(address): no uplink with a route and an address (check `ip route get \(address)`)")
            }
            path = best
        } catch let error as NetlinkError {
            throw AgentError("cannot read the routing tables: \(error)")
        }
        do {
            let socket = try UDPSocket(bindingTo: SocketAddress(path.source, port: 0), device: path.interface,
                                       mark: settings.mode.socketMark)
            let core = try ClientCore(privateKey: key, serverKey: settings.serverKey, credentials: credentials)
            let client = try TunnelClient(core: core, socket: socket, server: server) { message in log("info", message) }
            log("info", "handshaking", ["server": "\(server)", "path": "\(path.interface)/\(path.source)"])
            let completion = try client.handshake(timeout: .seconds(10))
            let prefixes = completion.addresses.compactMap { Prefix($0, length: $0.family.bitWidth) }
            let tun = try TunDevice(name: settings.tunnel.name, mtu: settings.tunnel.mtu, addresses: prefixes)
            let routes = try TunnelRoutes(settings.mode, device: tun)
            onTerminationSignal { signal in
                log("info", "stopping", ["signal": "\(signal)"])
                client.stop()
            }
            log("info", "up", ["tunnel": tun.name, "addresses": prefixes.map(\.description).joined(separator: ","),
                               "rtt": completion.rtt.short, "path": "\(path.interface)/\(path.source)"])
            client.run(with: tun)
            try? routes.remove()
            let traffic = client.traffic
            log("info", "down", ["packets_in": "\(traffic.packetsIn)", "packets_out": "\(traffic.packetsOut)"])
        } catch let error as ClientError {
            throw AgentError("\(error)")
        } catch let error as DeviceError {
            throw AgentError("\(error)")
        } catch let error as CryptoError {
            throw AgentError("\(error)")
        }
    }
}
