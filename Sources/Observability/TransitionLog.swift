public import Logging
public import Reconnector

extension Transition {
    /// The transition's fields as log metadata: the attempt and the coalesced inputs are numbers.
    public var metadata: Logger.Metadata {
        var out: Logger.Metadata = [:]
        for (key, value) in fields {
            out[key] = ["attempt", "coalesced"].contains(key) ? .stringConvertible(Int(value) ?? 0) : .string(value)
        }
        return out
    }
}
