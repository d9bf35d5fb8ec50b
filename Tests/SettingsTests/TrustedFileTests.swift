import ConfigReader
import Foundation
import Glibc
@testable import Settings
import Testing
import Tunnel

/// Keys, passwords and configurations are read only from files nobody else can have changed
/// (or, for secrets, read), checked on the descriptor that is read.
@Suite struct TrustedFileTests {
    let directory: String
    let key: PrivateKey
    var keyFile: String { directory + "/client.key" }
    var serverConfiguration: String { directory + "/server.yaml" }
    var clientConfiguration: String { directory + "/client.yaml" }

    init() throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("roam-trusted-\(getpid())-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        key = try PrivateKey.generate()
        try write(key.revealBase64() + "\n", to: keyFile, mode: 0o600)
        try write("listen-port: 51820\nprivate-key-file: \(keyFile)\ntunnel: {addresses: [10.77.0.1/24]}\n"
                  + "users: [{name: alice, public-key: \(key.publicKey.base64), addresses: [10.77.0.2]}]\n",
                  to: serverConfiguration, mode: 0o600)
        try write("server: 198.51.100.7:51820\nserver-key: \(key.publicKey.base64)\nprivate-key-file: \(keyFile)\n",
                  to: clientConfiguration, mode: 0o644)
    }

    func cleanUp() { try? FileManager.default.removeItem(atPath: directory) }

    func write(_ text: String, to path: String, mode: mode_t) throws {
        try text.write(toFile: path, atomically: false, encoding: .utf8)
        chmod(path, mode)
    }

    /// The message of the error `body` throws, or nil when it throws none.
    func refusal(_ body: () throws -> Void) -> String? {
        do {
            try body()
            return nil
        } catch {
            return "\(error)"
        }
    }

    @Test func goodFilesAreAccepted() throws {
        defer { cleanUp() }
        #expect(try loadPrivateKey(keyFile).publicKey == key.publicKey)
        let (server, serverRoot) = try YAMLReader.load(serverConfiguration, as: .serverConfiguration)
        #expect(try server.server(serverRoot).listenPort == 51820)
        let (client, clientRoot) = try YAMLReader.load(clientConfiguration, as: .clientConfiguration)
        #expect(try client.client(clientRoot).privateKeyFile == keyFile)
    }

    /// A link could lead the agent (root) to any file root may read; it is refused, with the way out.
    @Test func aSymbolicLinkToASecretIsRefused() throws {
        defer { cleanUp() }
        let link = directory + "/link.key"
        symlink(keyFile, link)
        let message = try #require(refusal { _ = try loadPrivateKey(link) })
        #expect(message.contains("link.key: is a symbolic link (to \(keyFile))") && message.contains("name the real file"), "\(message)")
        symlink(serverConfiguration, directory + "/link.yaml")
        let server = try #require(refusal { _ = try YAMLReader.load(directory + "/link.yaml", as: .serverConfiguration) })
        #expect(server.contains("symbolic link") && server.contains("--config"), "\(server)")
    }

    @Test func groupReadableSecretsAndServerConfigurationsAreRefused() throws {
        defer { cleanUp() }
        chmod(keyFile, 0o640)
        #expect(refusal { _ = try readSecretFile(keyFile) } == "\(keyFile): mode is 640; a secret file must be 0600 (run: chmod 600 \(keyFile))")
        chmod(serverConfiguration, 0o644)
        let message = try #require(refusal { _ = try YAMLReader.load(serverConfiguration, as: .serverConfiguration) })
        #expect(message.contains("password hashes and must be 0600 (run: chmod 600 \(serverConfiguration))"), "\(message)")
    }

    /// The client's configuration may be read by all (it has no secrets), written by its owner alone.
    @Test func aClientConfigurationOthersCanChangeIsRefused() throws {
        defer { cleanUp() }
        chmod(clientConfiguration, 0o664)
        let message = try #require(refusal { _ = try YAMLReader.load(clientConfiguration, as: .clientConfiguration) })
        #expect(message.contains("must not be writable by group or others (run: chmod go-w \(clientConfiguration))"), "\(message)")
        chmod(clientConfiguration, 0o646)
        #expect(refusal { _ = try YAMLReader.load(clientConfiguration, as: .clientConfiguration) } != nil)
    }

    /// Decided from fstat alone: an owner other than root or the agent's user could have swapped the file.
    @Test func anotherOwnerIsRefused() {
        let mine = TrustedFile.Status(isRegular: true, permissions: 0o600, owner: 1000, size: 45)
        #expect(TrustedFile.problem(mine, kind: .secret, path: "k", user: 1000) == nil)
        var root = mine
        root.owner = 0
        #expect(TrustedFile.problem(root, kind: .secret, path: "k", user: 1000) == nil, "root's files may be used by anyone")
        let theirs = TrustedFile.Status(isRegular: true, permissions: 0o600, owner: 65534, size: 45)
        let asRoot = TrustedFile.problem(theirs, kind: .secret, path: "k", user: 0) ?? ""
        #expect(asRoot.hasPrefix("is owned by uid 65534") && asRoot.contains("only root may own") && asRoot.hasSuffix("(run: chown root k)"),
                "\(asRoot)")
        let asUser = TrustedFile.problem(theirs, kind: .clientConfiguration, path: "c", user: 1000) ?? ""
        #expect(asUser.contains("only root or uid 1000") && asUser.contains("the user running the agent"), "\(asUser)")
        #expect(TrustedFile.problem(TrustedFile.Status(isRegular: false, permissions: 0o600, owner: 0, size: 0), kind: .secret,
                                    path: "k", user: 0)?.contains("not a regular file") == true)
        #expect(TrustedFile.problem(TrustedFile.Status(isRegular: true, permissions: 0o600, owner: 0, size: 1 << 20), kind: .secret,
                                    path: "k", user: 0) == "is larger than 64 KiB, too big for a key or password file")
    }

    /// Whoever may write in a directory on the way to the file can put another file in its place:
    /// such directories are refused, as sshd's StrictModes refuses them; a sticky one (/tmp) is fine.
    @Test func aDirectoryOthersCanWriteToIsRefused() throws {
        defer { cleanUp() }
        chmod(directory, 0o777)
        let message = try #require(refusal { _ = try loadPrivateKey(keyFile) })
        #expect(message.contains("is in \(directory), which group or others may write to (mode 777)")
                && message.contains("chmod go-w \(directory)"), "\(message)")
        #expect(refusal { _ = try YAMLReader.load(clientConfiguration, as: .clientConfiguration) } != nil)
        // Through a link to the directory: the real one is judged.
        let link = directory + "-link"
        symlink(directory, link)
        defer { unlink(link) }
        #expect(refusal { _ = try loadPrivateKey(link + "/client.key") }?.contains("may write to") == true)
        chmod(directory, 0o1777)
        #expect(try loadPrivateKey(keyFile).publicKey == key.publicKey, "sticky, as /tmp is")
        chmod(directory, 0o755)
        #expect(try loadPrivateKey(keyFile).publicKey == key.publicKey)
        // The rule itself, for owners the test cannot make.
        let other = TrustedFile.Status(isRegular: false, permissions: 0o755, owner: 1000, size: 0)
        #expect(TrustedFile.directoryProblem("/home/x", other, user: 0)?.contains("owned by uid 1000") == true)
        #expect(TrustedFile.directoryProblem("/home/x", other, user: 1000) == nil, "the agent's own user may own it")
    }

    @Test(.enabled(if: getuid() == 0, "needs root to give a file to another user (chown to nobody); run the suite as root (CI does)"))
    func aFileOwnedByAnotherUserIsRefused() throws {
        defer { cleanUp() }
        let nobody = uid_t(65534)
        try #require(chown(keyFile, nobody, gid_t(65534)) == 0)
        let key = try #require(refusal { _ = try loadPrivateKey(keyFile) })
        #expect(key.contains("is owned by uid 65534") && key.contains("(run: chown root \(keyFile))"), "\(key)")
        try #require(chown(clientConfiguration, nobody, gid_t(65534)) == 0)
        #expect(refusal { _ = try YAMLReader.load(clientConfiguration, as: .clientConfiguration) }?.contains("is owned by uid 65534") == true)
    }

    /// Whatever sits at the path, the agent neither hangs nor reads a device.
    @Test func onlyRegularFilesAreRead() throws {
        defer { cleanUp() }
        let fifo = directory + "/fifo.key"
        try #require(mkfifo(fifo, 0o600) == 0)
        #expect(refusal { _ = try readSecretFile(fifo) }?.contains("not a regular file") == true)
        #expect(refusal { _ = try readSecretFile(directory + "/none.key") }?.contains("cannot read the file: No such file") == true)
    }
}
