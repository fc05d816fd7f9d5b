//! The one-commit design as every SQL driver runs it: the claim, the handler's business
//! writes and the completion in one transaction of the driver's, behind the HTTP layer's
//! one-commit mode (`IdempotencyLayer::one_commit`, over a driver's
//! `TransactionalStore`). What is shared is its suite, [`testing`] (feature
//! `test-utils`): one set of scenarios each driver's `tests/` runs once per engine.
//!
//! Invariant: a scenario asserts only what the one-commit contract promises on every
//! engine; what an engine does otherwise (how long a duplicate's wait can be, what can
//! be observed of it) is the engine's fixture's to say, never a missing scenario.

#[cfg(feature = "test-utils")]
pub mod testing;
