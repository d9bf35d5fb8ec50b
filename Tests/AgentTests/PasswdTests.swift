import Foundation
import NamespaceLab
import Testing
import Tunnel
@testable import agent

/// `agent passwd` hashes only passwords that resist online guessing and fit in a handshake.
@Test(arguments: [
    ("a", "has 1 character; it needs at least 12"),
    ("elevenchars", "has 11 characters"),
    (String(repeating: "é", count: 128), "256 bytes of UTF-8; a handshake carries at most 255"),
])
func passwordsTooShortOrTooLongAreRefused(password: String, message: String) {
    let problem = PasswdCommand.problem(with: password) ?? ""
    #expect(problem.contains(message), "\(problem)")
}

@Test func passwordsOfTwelveCharactersUpTo255BytesAreHashed() {
    #expect(PasswdCommand.problem(with: "twelve chars") == nil)
    #expect(PasswdCommand.problem(with: "日本語のパスワードですね") == nil, "characters, not bytes, count towards the minimum")
    #expect(PasswdCommand.problem(with: String(repeating: "x", count: 255)) == nil)
}

/// The command itself: a short password on standard input prints no hash and says why.
@Test func passwdRefusesAShortPasswordOnStandardInput() throws {
    let process = Process()
    process.executableURL = RoamingLab.builtAgent
    process.arguments = ["passwd"]
    let input = Pipe()
    let output = Pipe()
    process.standardInput = input
    process.standardOutput = output
    process.standardError = output
    try process.run()
    input.fileHandleForWriting.write(Data("hunter2\n".utf8))
    try input.fileHandleForWriting.close()
    let text = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
    process.waitUntilExit()
    #expect(process.terminationStatus != 0)
    #expect(text.contains("at least 12") && !text.contains("$argon2id"), "\(text)")
}
