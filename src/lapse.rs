//! [`LapsePolicy`]: what a lapsed lease means, for the cache and for the stores.
//!
//! Invariant: under [`LapsePolicy::MarkUnknown`] no claim ever acquires a key whose
//! PROCESSING record's lease lapsed within the policy's `ttl`: from the lease's end the
//! record *is* UNKNOWN (marked at the lease's end, kept `ttl` from then),
//! whoever reads it and whether or not anything has written it so yet.

use std::time::Duration;

/// What a PROCESSING entry whose lease lapsed (its owner crashed, hung, or ran past the
/// lease without [`extend_lease`](crate::ClaimGuard::extend_lease)) becomes.
///
/// Either way the lapsed owner is fenced: its guard's every operation gets
/// [`LeaseLost`](crate::LeaseLost), and it never overwrites what the key became.
///
/// Set it where the records live: on the cache when the cache alone keeps them
/// ([`CacheBuilder::lapse_policy`](crate::CacheBuilder::lapse_policy)), on the store
/// (each store's `with_lapse_policy`) under `Tiered`, whose claims the store decides; a
/// `MarkUnknown` cache in front of a `TakeOver` store does not stop the store's takeover.
/// The same value is the setting everywhere: the cache, every store, and
/// `idemcache_any::open_with`.
///
/// # In a durable store
///
/// What every store does under `MarkUnknown` (the conformance suite's `run_mark_unknown`
/// checks it): a claim that finds a PROCESSING record whose lease lapsed less than `ttl`
/// ago turns it UNKNOWN in the same atomic step (marked at the lease's end, expiring
/// `ttl` after it) and answers `StoreClaim::Unknown` (or `Mismatch` for another
/// request); such a record is UNKNOWN to `resolve` and `forget` too; `purge_expired`
/// never deletes it; the lapsed token's writes are refused with `StoreError::LeaseLost`
/// as under `TakeOver`.
///
/// The policy is the handle's, not the record's: handles sharing one store should use
/// one policy. A record once UNKNOWN is UNKNOWN to every handle; a PROCESSING record
/// whose lease lapsed is taken over (or purged) by a `TakeOver` handle that reaches it
/// before a `MarkUnknown` handle turns it.
///
/// ```
/// use idemcache::{Cache, LapsePolicy};
///
/// // For a payment API call or a shell command: an execution that ran past its lease may
/// // have had its effect, so a retry must never run it again blindly.
/// let day = std::time::Duration::from_secs(24 * 3600);
/// let cache = Cache::builder().lapse_policy(LapsePolicy::MarkUnknown { ttl: day }).build()?;
/// # Ok::<(), idemcache::BuildError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum LapsePolicy {
    /// The next claimer takes the key over under a new fencing token and executes again.
    /// Right when nothing outside a transaction happened: the lapsed execution's
    /// business change either committed with its record or not at all.
    ///
    /// The claim that takes over answers `took_over` (a durable store's
    /// `StoreClaim::Acquired`, `Tiered`'s guard, the layer's `Claimed`), so that a handler
    /// with an effect outside the transaction can ask the authority before acting again.
    /// A durable store keeps a lapsed lease for at least as long as it was held (one
    /// lease, or more after renewals) for a claim to find and say so; `purge_expired`
    /// deletes it after that, and a claim after the purge is a new execution, as one
    /// after a result's TTL is.
    #[default]
    TakeOver,
    /// The key turns UNKNOWN at the lease's end, and stays so for `ttl` from then: a
    /// claim answers "unknown" (never acquires), the entry is listed for a reconciler,
    /// and `resolve` or `forget` settle it after checking the authority. Right for
    /// external effects (a charge, an email, a command whose orphaned child finished its
    /// work) that may have happened.
    MarkUnknown {
        /// How long a lapsed lease stays UNKNOWN, from the lease's end: more than zero and
        /// at most [`MAX_DURATION`](crate::MAX_DURATION), checked where the policy is set.
        ttl: Duration,
    },
}

impl LapsePolicy {
    /// How long a lapsed lease stays UNKNOWN under `MarkUnknown`; `None` under `TakeOver`.
    pub fn unknown_ttl(&self) -> Option<Duration> {
        match self {
            LapsePolicy::MarkUnknown { ttl } => Some(*ttl),
            LapsePolicy::TakeOver => None,
        }
    }
}
