//! [`LapsePolicy`]: what a lapsed lease means, for the cache and for the stores.
//!
//! Invariant: under [`LapsePolicy::MarkUnknown`] no claim ever acquires a key whose
//! PROCESSING record's lease lapsed within the unknown TTL: from the lease's end the
//! record *is* UNKNOWN (marked at the lease's end, kept the unknown TTL from then),
//! whoever reads it and whether or not anything has written it so yet.

/// What a PROCESSING entry whose lease lapsed (its owner crashed, hung, or ran past the
/// lease without [`extend_lease`](crate::ClaimGuard::extend_lease)) becomes.
///
/// Either way the lapsed owner is fenced: its guard's every operation gets
/// [`LeaseLost`](crate::LeaseLost), and it never overwrites what the key became.
///
/// Set it where the records live: on the cache when the cache alone keeps them, on the
/// store (`store.lapse_policy(..)`) under `Tiered`, whose claims the store decides; a
/// `MarkUnknown` cache in front of a `TakeOver` store does not stop the store's takeover.
///
/// ```
/// use idemcache::{Cache, LapsePolicy};
///
/// // For a payment API call or a shell command: an execution that ran past its lease may
/// // have had its effect, so a retry must never run it again blindly.
/// let cache = Cache::builder().lapse_policy(LapsePolicy::MarkUnknown).build()?;
/// # Ok::<(), idemcache::BuildError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum LapsePolicy {
    /// The next claimer takes the key over under a new fencing token and executes again.
    /// Right when nothing outside a transaction happened: the lapsed execution's
    /// business change either committed with its record or not at all.
    #[default]
    TakeOver,
    /// The key turns UNKNOWN at the lease's end: a claim answers "unknown" (never
    /// acquires), the entry is listed for a reconciler, and `resolve` or `forget` settle
    /// it after checking the authority. Right for external effects (a charge, an email, a
    /// command whose orphaned child finished its work) that may have happened.
    MarkUnknown,
}
