import Topology
import CNftables
import Glibc
import Basics
import Netlink

/// Why the lockdown firewall could not be loaded, read or removed: what was done and what
/// nftables said, with what an operator can do about it.
public struct LockdownError: Error, Equatable, Sendable, CustomStringConvertible {
    public var operation: String
    /// nftables' own words (its error buffer), trimmed to one line.
    public var message: String

    public init(_ operation: String, _ message: String) {
        self.operation = operation
        self.message = message.split(whereSeparator: \.isNewline).map { $0.trimmingCharacters() }
            .filter { !$0.isEmpty && !$0.allSatisfy { $0 == "^" || $0 == " " } }.joined(separator: " / ")
    }

    public var help: String {
        let text = message.lowercased()
        if text.contains("operation not permitted") || text.contains("permission denied") {
            return "run the agent as root or give it CAP_NET_ADMIN"
        }
        if text.contains("not supported") || text.contains("no such file") || text.contains("protocol not supported") {
            return "this kernel has no nf_tables support (load the nf_tables module, CONFIG_NF_TABLES)"
        }
        return "the kernel or libnftables refused the ruleset"
    }

    public var description: String { "\(operation): \(message.isEmpty ? "failed" : message); \(help)" }
}

/// One libnftables context (`nft_ctx`), its output and errors buffered; the one owner of the C
/// object, freed in deinit. Commands run inside `namespace` when one is given.
final class Nftables {
    private let context: OpaquePointer
    private let namespace: NetworkNamespace?

    init(namespace: NetworkNamespace? = nil) throws(LockdownError) {
        self.namespace = namespace
        let made: OpaquePointer?
        do {
            made = try Self.inside(namespace) { nft_ctx_new(0 /* NFT_CTX_DEFAULT */) }
        } catch {
            throw LockdownError("enter network namespace", "\(error)")
        }
        guard let made else { throw LockdownError("create an nftables context", String(cString: strerror(errno))) }
        context = made
        nft_ctx_buffer_output(context)
        nft_ctx_buffer_error(context)
    }

    deinit { nft_ctx_free(context) }

    /// Runs `commands` (nftables' language) as one transaction: all or nothing. Returns what
    /// nftables printed.
    @discardableResult
    func run(_ commands: String, _ operation: String) throws(LockdownError) -> String {
        let (status, output, error): (Int32, String, String)
        do {
            (status, output, error) = try Self.inside(namespace) {
                let status = nft_run_cmd_from_buffer(context, commands)
                let output = nft_ctx_get_output_buffer(context).map { String(cString: $0) } ?? ""
                let error = nft_ctx_get_error_buffer(context).map { String(cString: $0) } ?? ""
                return (status, output, error)
            }
        } catch {
            throw LockdownError(operation, "\(error)")
        }
        guard status == 0 else { throw LockdownError(operation, error) }
        return output
    }

    private static func inside<T>(_ namespace: NetworkNamespace?, _ body: () -> T) throws(NetlinkError) -> T {
        guard let namespace else { return body() }
        return try namespace.run { () throws(NetlinkError) -> T in body() }
    }
}

extension Substring {
    fileprivate func trimmingCharacters() -> String {
        String(drop { $0 == " " || $0 == "\t" }.reversed().drop { $0 == " " || $0 == "\t" }.reversed())
    }
}
