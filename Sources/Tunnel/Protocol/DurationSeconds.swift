extension Duration {
    /// Seconds as a floating-point number, for token-bucket arithmetic.
    var inSeconds: Double { Double(nanoseconds) / 1e9 }
}
