import Foundation
import Glibc
import Testing
@testable import Basics

/// A privileged writer in a directory someone else can write to (a recording's `--out`) must
/// never write through a name planted there.
@Suite struct SystemFilesTests {
    let directory: String
    var path: String { directory + "/out.yaml" }
    /// A file that stands for one root owns (/etc/shadow): no write may reach it.
    var victim: String { directory + "/victim" }

    init() throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("roam-files-\(getpid())-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        try "precious\n".write(toFile: victim, atomically: false, encoding: .utf8)
    }

    func cleanUp() { try? FileManager.default.removeItem(atPath: directory) }

    func read(_ file: String) -> String? { try? String(contentsOfFile: file, encoding: .utf8) }

    func isLink(_ file: String) -> Bool {
        var info = stat()
        return lstat(file, &info) == 0 && info.st_mode & S_IFMT == S_IFLNK
    }

    @Test func aLinkPlantedAtTheOldTemporaryNameIsNotFollowed() throws {
        defer { cleanUp() }
        // The name the writer used to take: the target plus the process ID, easy to guess.
        symlink(victim, path + ".tmp-\(getpid())")
        try SystemFiles.write("recorded\n", to: path)
        #expect(read(victim) == "precious\n")
        #expect(read(path) == "recorded\n")
        #expect(!isLink(path))
    }

    @Test func aLinkAtTheTargetIsReplacedNotFollowed() throws {
        defer { cleanUp() }
        symlink(victim, path)
        try SystemFiles.write("recorded\n", to: path, mode: 0o640)
        #expect(read(victim) == "precious\n")
        #expect(!isLink(path))
        #expect(read(path) == "recorded\n")
        var info = stat()
        #expect(stat(path, &info) == 0 && info.st_mode & 0o777 == 0o640, "the mode asked for, whatever the umask")
    }

    @Test func theTemporaryIsNewOwnerOnlyAndBesideTheTarget() throws {
        defer { cleanUp() }
        let (temporary, fd) = try SystemFiles.temporaryFile(beside: path)
        defer {
            close(fd)
            unlink(temporary)
        }
        #expect(temporary.parentDirectory == directory)
        var info = stat()
        #expect(fstat(fd, &info) == 0 && info.st_mode & 0o777 == 0o600)
        #expect(SystemFiles.temporaryName(beside: path) != SystemFiles.temporaryName(beside: path))
        #expect(SystemFiles.temporaryName(beside: "out.yaml").hasPrefix(".roam-"), "a bare name stays in the current directory")
    }

    @Test func aFailedWriteLeavesNothingAndSaysWhere() throws {
        defer { cleanUp() }
        let missing = directory + "/missing/out.yaml"
        #expect {
            try SystemFiles.write("x", to: missing)
        } throws: { error in
            guard let error = error as? FileWriteError else { return false }
            return error.step == .create && error.code == ENOENT && "\(error)".contains(directory + "/missing/.roam-")
        }
        // A rename onto a directory fails after the temporary was written: it must go.
        mkdir(path, 0o700)
        #expect(throws: FileWriteError.self) { try SystemFiles.write("x", to: path) }
        #expect(SystemFiles.names(in: directory) == ["out.yaml", "victim"])
    }
}
