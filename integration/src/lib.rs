//! Nothing here but doctests: the tests (`tests/`) and the examples (`examples/`) are the
//! package. See `Cargo.toml` for why it is one.

/// The guides whose code uses a store's crate, tokio, axum or the layer (feature
/// `tower`), compiled as doctests of this package, which depends on them (the other
/// guides are the core's doctests).
#[cfg(doctest)]
mod guides {
    #[doc = include_str!("../../docs/durable-tiers.md")]
    pub struct DurableTiers;
    #[doc = include_str!("../../docs/commit-boundary.md")]
    pub struct CommitBoundary;
    #[doc = include_str!("../../docs/outbox.md")]
    pub struct Outbox;
    #[doc = include_str!("../../docs/grpc.md")]
    pub struct Grpc;
}
