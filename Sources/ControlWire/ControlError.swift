/// A control socket that cannot be served or reached, said in one line.
public struct ControlError: Error, CustomStringConvertible, Sendable {
    public var message: String
    public init(_ message: String) { self.message = message }
    public var description: String { message }
}
