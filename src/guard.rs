//! [`ClaimGuard`]: the licence to execute one claimed key, and the only way to record
//! its outcome.
//!
//! Invariant: a guard acts on its entry only while the entry is still PROCESSING under
//! the guard's own fencing token and its lease has not lapsed. Every operation checks
//! that inside the shard's critical section, so a stale guard (lease lapsed, key taken
//! over or removed) gets [`LeaseLost`] and never touches the new owner's entry.

use std::fmt;
use std::time::Duration;

use crate::cache::{Cache, Ticket};
use crate::config::check_duration;
use crate::{DropPolicy, ExtendLeaseError, FencingToken, LeaseLost, SetResultTtlError, Timestamp};

/// Ownership of a claimed key: execute the intent, then call exactly one of
/// [`complete`](ClaimGuard::complete), [`release`](ClaimGuard::release) or
/// [`mark_unknown`](ClaimGuard::mark_unknown).
///
/// Dropped without an outcome (an early return, a panic), the guard applies the cache's
/// [`DropPolicy`]: release the key (default) or mark it UNKNOWN.
#[must_use = "dropping a guard at once releases the key (or marks it unknown)"]
pub struct ClaimGuard {
    cache: Cache,
    ticket: Ticket,
    lease_ends_at: Timestamp,
    /// How long `complete` keeps the result; the cache's `completed_ttl` unless overridden.
    result_ttl: Duration,
    finished: bool,
    /// Whether this claim took over an earlier execution whose lease lapsed.
    took_over: bool,
}

impl fmt::Debug for ClaimGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClaimGuard")
            .field("token", &self.token())
            .field("lease_ends_at", &self.lease_ends_at)
            .finish_non_exhaustive()
    }
}

impl ClaimGuard {
    pub(crate) fn new(
        cache: Cache,
        ticket: Ticket,
        lease_ends_at: Timestamp,
        took_over: bool,
    ) -> ClaimGuard {
        let result_ttl = cache.config().completed_ttl;
        ClaimGuard { cache, ticket, lease_ends_at, result_ttl, finished: false, took_over }
    }

    /// This claim's fencing token; pass it to the authority with the write.
    pub fn token(&self) -> FencingToken {
        FencingToken(self.ticket.token)
    }

    /// Whether this claim took the key over from an earlier execution whose lease lapsed
    /// (under `LapsePolicy::TakeOver`) rather than finding it absent or expired. That
    /// execution may have had its effects before it stopped: check the authority (by the
    /// key) before acting again where a second effect would matter.
    pub fn took_over(&self) -> bool {
        self.took_over
    }

    /// When the lease lapses unless extended (as of the last claim or extension).
    pub fn lease_ends_at(&self) -> Timestamp {
        self.lease_ends_at
    }

    /// Records the result: PROCESSING → COMPLETED. Repeats get `result` until the
    /// completed TTL ends. A result over `max_result_size` is recorded as
    /// completed-without-body.
    ///
    /// A result of up to 512 bytes kept for the cache's `completed_ttl` is copied into
    /// memory the cache shares among such results, and `result` is dropped before this
    /// returns; a larger one is kept as given, without a copy. Either way, what a repeat
    /// gets is the same bytes. `result` is never dropped under the cache's lock, so its
    /// owner's `Drop` may use the cache.
    pub fn complete(mut self, result: impl crate::IntoBytes) -> Result<(), LeaseLost> {
        self.finished = true;
        let Ticket { shard, slot, token } = self.ticket;
        let (mut body, ttl) = (Some(result.into_bytes()), self.result_ttl);
        // What the shard does not keep is dropped here, after unlocking.
        self.cache
            .with_shard(shard, |s, now, cfg| s.complete(slot, token, &mut body, ttl, now, cfg))
    }

    /// Overrides, for this claim only, how long [`complete`](ClaimGuard::complete) keeps
    /// the result (the cache's `completed_ttl` otherwise). Refused if zero or longer than
    /// [`MAX_DURATION`](crate::MAX_DURATION); the guard is unchanged then.
    pub fn set_result_ttl(&mut self, ttl: Duration) -> Result<(), SetResultTtlError> {
        self.result_ttl = check_duration(ttl).map_err(SetResultTtlError::InvalidDuration)?;
        Ok(())
    }

    /// Gives the key back without an outcome: PROCESSING → absent. The next claim
    /// executes. Use it when the execution had no effect.
    pub fn release(mut self) -> Result<(), LeaseLost> {
        self.finished = true;
        self.release_inner()
    }

    fn release_inner(&self) -> Result<(), LeaseLost> {
        let Ticket { shard, slot, token } = self.ticket;
        self.cache.with_shard(shard, |s, now, _| s.release(slot, token, now))
    }

    /// Records that the outcome is ambiguous: PROCESSING → UNKNOWN. Claims answer
    /// [`Claim::Unknown`](crate::Claim::Unknown) until the entry is resolved, forgotten
    /// or expires.
    pub fn mark_unknown(mut self) -> Result<(), LeaseLost> {
        self.finished = true;
        self.mark_unknown_inner()
    }

    fn mark_unknown_inner(&self) -> Result<(), LeaseLost> {
        let Ticket { shard, slot, token } = self.ticket;
        self.cache.with_shard(shard, |s, now, cfg| s.mark_unknown(slot, token, now, cfg))
    }

    /// Renews the lease to end `lease` from now, for executions that run long. Returns
    /// the new end. Refused if the lease was already lost, or `lease` is zero or absurd.
    pub fn extend_lease(&mut self, lease: Duration) -> Result<Timestamp, ExtendLeaseError> {
        check_duration(lease).map_err(ExtendLeaseError::InvalidDuration)?;
        let Ticket { shard, slot, token } = self.ticket;
        let ends =
            self.cache.with_shard(shard, |s, now, _| s.extend_lease(slot, token, now, lease))?;
        self.lease_ends_at = ends;
        Ok(ends)
    }
}

impl Drop for ClaimGuard {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        // A lost lease has nothing left to give back; the error is the expected outcome.
        let _ = match self.cache.config().drop_policy {
            DropPolicy::Release => self.release_inner(),
            DropPolicy::MarkUnknown => self.mark_unknown_inner(),
        };
    }
}
