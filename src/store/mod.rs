//! Durable idempotency records behind the in-process [`Cache`](crate::Cache): the
//! [`Store`] trait, its object-safe form [`DynStore`] (and [`AnyStore`], a store chosen
//! at run time), and [`Tiered`], the cache in front of any store.
//!
//! The stores themselves are crates of their own, each tracking its driver's current
//! release: `idemcache-sqlite`, `idemcache-postgres`, `idemcache-redis`; and
//! `idemcache-any` opens one of them from a URL. [`encoding`] is what they share to
//! write records alike; `conformance` (feature `test-utils`) is the suite every store
//! passes, for a store of your own to prove the same contract.
//!
//! The contract is the cache's (absent → PROCESSING → COMPLETED or UNKNOWN, a lapsed
//! lease taken over under a new fencing token, or turned UNKNOWN under a store's
//! lapse setting of [`LapsePolicy::MarkUnknown`](crate::LapsePolicy::MarkUnknown),
//! a different fingerprint a mismatch), kept by the store across processes and restarts;
//! [`reconcile`] settles UNKNOWN records as a check of the authority says:
//!
//! - A claim is one atomic step judged by the **store's** clock, never the caller's.
//! - Tokens come from the store (a counter in the database), so they increase across
//!   processes and restarts; every write after the claim names its token and is refused
//!   with [`StoreError::LeaseLost`] if the key has moved on (the stale owner is fenced).
//! - Every error is typed; an unreachable store is [`StoreError::Backend`]: fail closed,
//!   never execute unguarded.
//!
//! Times are wall-clock (`SystemTime`) as the store saw them, in microseconds.
//!
//! This module uses the core's public API only, like any user of the crate.

#[cfg(feature = "test-utils")]
#[cfg_attr(docsrs, doc(cfg(feature = "test-utils")))]
pub mod conformance;
mod dynamic;
pub mod encoding;
mod lapse;
mod one_commit;
mod open_claim;
mod reconcile;
pub mod record;
mod tiered;
pub mod unique;
mod wait;

use std::fmt;
use std::future::Future;
use std::time::{Duration, SystemTime};

use bytes::Bytes;

pub use dynamic::{AnyStore, BoxFuture, DynStore};
pub use one_commit::{OneCommit, TransactionalStore};
pub use open_claim::OpenClaim;
pub use reconcile::{reconcile, ReconcileError};
pub use record::{Record, RecordFilter, RecordState};
#[cfg(feature = "tower")]
pub(crate) use tiered::{read_through_ttl, CLOCK_SLACK};
pub use tiered::{Tiered, TieredClaim, TieredError, TieredGuard, DEFAULT_LEASE};
pub use wait::claim_wait;
#[cfg(feature = "tower")]
pub(crate) use wait::look_while;

use crate::{CorrelationId, FencingToken, Fingerprint, Key, Replay, UnknownEntry};

/// What a store's claim found, as [`Claim`](crate::Claim) does for the cache, with the
/// store's wall-clock times.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreClaim {
    /// The key was absent (or dead, or its lease lapsed under `TakeOver`): the caller owns it and executes. Every later write
    /// must carry `token`.
    Acquired {
        /// The fencing token for this claim, from the store's counter.
        token: FencingToken,
        /// When the lease lapses on the store's clock unless the key completes first.
        lease_ends_at: SystemTime,
        /// Whether this claim took the key over from an earlier execution whose lease
        /// lapsed (under `LapsePolicy::TakeOver`), rather than finding it absent or
        /// expired: that execution may have had its effects, so check the authority
        /// before acting again where a second effect would matter.
        took_over: bool,
    },
    /// Completed before: replay.
    Completed(Replay<SystemTime>),
    /// Another caller holds the key.
    InProgress {
        /// When the holder's lease lapses (the store's clock).
        lease_ends_at: SystemTime,
    },
    /// An earlier execution's outcome is unknown: check the authority, then resolve or
    /// forget. Never re-run blindly.
    Unknown {
        /// When it was marked unknown.
        marked_at: SystemTime,
    },
    /// The key was used for a different request.
    Mismatch,
}

/// Why a store operation failed. Nothing was changed unless the variant says so.
#[derive(Debug)]
#[non_exhaustive]
pub enum StoreError {
    /// The token no longer owns the key named (its lease lapsed and it was taken over,
    /// or it was settled already): this write was refused.
    LeaseLost(Key),
    /// `resolve` or `forget` (or their fenced and listed forms) found nothing to settle:
    /// the key has no UNKNOWN record (it is absent, PROCESSING or COMPLETED), or the one
    /// it has is not the execution named. Nothing was changed.
    NothingToSettle(Key),
    /// A duration of zero or over [`MAX_DURATION`](crate::MAX_DURATION), or a body too
    /// large for the store.
    InvalidInput(String),
    /// The store failed or could not be reached: fail closed (do not execute).
    Backend(Box<dyn std::error::Error + Send + Sync>),
    /// A record the store holds could not be read back: a column holding another type
    /// or NULL where a value belongs, a missing field, a key of another type. The
    /// message names the record's key; the store answered, so this is not
    /// [`Backend`](StoreError::Backend), and retrying will not help: fix the record, or
    /// [`forget`](Store::forget) (an UNKNOWN one) or delete it. A record whose key bytes
    /// are not an idemcache key (another program's row) is named by those bytes, in hex.
    /// [`Store::list_unknown`] fails with it while the record is among those it lists (it
    /// never skips one silently); purging goes on past it.
    Corrupt(String),
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::LeaseLost(key) => write!(
                f,
                "the lease on {key:?} was lost: it lapsed, or the key was settled or has a \
                 newer owner"
            ),
            StoreError::NothingToSettle(key) => {
                write!(f, "{key:?} has no UNKNOWN record to settle (of the execution named)")
            }
            StoreError::InvalidInput(why) => write!(f, "invalid input: {why}"),
            StoreError::Backend(e) => write!(f, "the idempotency store failed: {e}"),
            StoreError::Corrupt(why) => write!(f, "an idempotency record is unreadable: {why}"),
        }
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StoreError::Backend(e) => Some(&**e),
            _ => None,
        }
    }
}

/// Durable idempotency records with the cache's contract (see the module docs).
///
/// Methods return `Send` futures that never block the runtime they run on; from
/// synchronous code, run them with [`block_on`] (for stores that need no runtime, such
/// as `idemcache-sqlite`'s). A store chosen at run time is a [`DynStore`]: every `Store`
/// is one. A store is `Debug` (what it connects to, as far as it knows, never a
/// password), so that errors and logs can say which store answered.
pub trait Store: Send + Sync + std::fmt::Debug + 'static {
    /// Claims `key` for the request `fingerprint` with a lease of `lease`, atomically:
    /// [`claim_correlated`](Store::claim_correlated) with no correlation id.
    fn claim(
        &self,
        key: &Key,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> impl Future<Output = Result<StoreClaim, StoreError>> + Send {
        self.claim_correlated(key, fingerprint, lease, None)
    }

    /// Claims `key` for the request `fingerprint` with a lease of `lease`, atomically;
    /// an acquired claim keeps `correlation_id` with the record (replacing the one a
    /// taken-over record held), for an operator to join the record to the request's logs
    /// and trace. Answers as [`claim`](Store::claim) does, whatever the id.
    fn claim_correlated(
        &self,
        key: &Key,
        fingerprint: Fingerprint,
        lease: Duration,
        correlation_id: Option<&CorrelationId>,
    ) -> impl Future<Output = Result<StoreClaim, StoreError>> + Send;

    /// PROCESSING → COMPLETED under `token`, kept for `ttl`; returns the stored record.
    fn complete(
        &self,
        key: &Key,
        token: FencingToken,
        body: Option<Bytes>,
        ttl: Duration,
    ) -> impl Future<Output = Result<Replay<SystemTime>, StoreError>> + Send;

    /// Renews the lease of the PROCESSING record under `token` to end `lease` from the
    /// store's now, for executions that run long; returns the new end. Refused with
    /// [`StoreError::LeaseLost`] if the lease already lapsed or the key moved on.
    fn extend_lease(
        &self,
        key: &Key,
        token: FencingToken,
        lease: Duration,
    ) -> impl Future<Output = Result<SystemTime, StoreError>> + Send;

    /// PROCESSING → absent under `token`: a retry executes again.
    fn release(
        &self,
        key: &Key,
        token: FencingToken,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// PROCESSING → UNKNOWN under `token`, kept for `ttl`.
    fn mark_unknown(
        &self,
        key: &Key,
        token: FencingToken,
        ttl: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// UNKNOWN → COMPLETED after checking the authority: the key's UNKNOWN record
    /// whichever execution it is (`execution: None`), or only if it is still the
    /// execution claimed under `execution`'s token, else [`StoreError::NothingToSettle`].
    ///
    /// The one fenced operation [`resolve`](Store::resolve) and
    /// [`resolve_listed`](Store::resolve_listed) are provided over. Required, with no
    /// default: the check and the write must be one atomic step of the store (a
    /// conditional write), which only the store can make. `conformance::run` checks
    /// it, including the case a fingerprint and a mark time cannot tell apart.
    fn resolve_fenced(
        &self,
        key: &Key,
        execution: Option<FencingToken>,
        body: Option<Bytes>,
        ttl: Duration,
    ) -> impl Future<Output = Result<Replay<SystemTime>, StoreError>> + Send;

    /// UNKNOWN → absent after checking the authority found no effect, fenced as
    /// [`resolve_fenced`](Store::resolve_fenced); [`forget`](Store::forget) and
    /// [`forget_listed`](Store::forget_listed) are provided over it.
    fn forget_fenced(
        &self,
        key: &Key,
        execution: Option<FencingToken>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// UNKNOWN → COMPLETED after checking the authority, whichever execution the key's
    /// UNKNOWN record is.
    fn resolve(
        &self,
        key: &Key,
        body: Option<Bytes>,
        ttl: Duration,
    ) -> impl Future<Output = Result<Replay<SystemTime>, StoreError>> + Send {
        self.resolve_fenced(key, None, body, ttl)
    }

    /// UNKNOWN → absent after checking the authority found no effect.
    fn forget(&self, key: &Key) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.forget_fenced(key, None)
    }

    /// [`resolve`](Store::resolve), only if the key's UNKNOWN record is still the one
    /// `listed` ([`list_unknown`](Store::list_unknown)'s) names: the execution claimed under
    /// `listed.token`. What a reconciler writes its verdict with, so that a verdict about
    /// one execution never settles another (the key forgotten, claimed again and marked
    /// again while the authority was being asked, perhaps by the same request within the
    /// same clock tick): [`StoreError::NothingToSettle`] then.
    fn resolve_listed(
        &self,
        listed: &UnknownEntry<SystemTime>,
        body: Option<Bytes>,
        ttl: Duration,
    ) -> impl Future<Output = Result<Replay<SystemTime>, StoreError>> + Send {
        self.resolve_fenced(&listed.key, Some(listed.token), body, ttl)
    }

    /// [`forget`](Store::forget), only if the key's UNKNOWN record is still the one
    /// `listed` names (its token), as [`resolve_listed`](Store::resolve_listed).
    fn forget_listed(
        &self,
        listed: &UnknownEntry<SystemTime>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.forget_fenced(&listed.key, Some(listed.token))
    }

    /// Up to `limit` live UNKNOWN records, oldest mark first (as
    /// [`Cache::list_unknown`](crate::Cache::list_unknown) lists the cache's).
    fn list_unknown(
        &self,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<UnknownEntry<SystemTime>>, StoreError>> + Send;

    /// Deletes up to `limit` expired records (lease lapsed, TTL passed); returns how many.
    /// Call it in a loop until it returns less than `limit`, to purge in bounded batches.
    /// A purge obeys its handle's [`LapsePolicy`](crate::LapsePolicy): under `MarkUnknown` a lapsed lease is
    /// UNKNOWN, and deleted only once that mark's TTL passed too.
    fn purge_expired(&self, limit: usize)
        -> impl Future<Output = Result<usize, StoreError>> + Send;

    /// The live record of `key` as a claim of this handle would find it (its lapse
    /// policy respected: see [`record`]), whatever its fingerprint, or `None`: a look
    /// that changes nothing. For tools and operators; a record that does not read is
    /// [`StoreError::Corrupt`].
    fn record(&self, key: &Key) -> impl Future<Output = Result<Option<Record>, StoreError>> + Send;

    /// Up to `limit` live records that `filter` selects, in key order ([`Key::as_bytes`],
    /// bytewise), after the key `after` (the next page: the last key of the previous
    /// one; `None`: from the start). For tools and operators, not for a request's path:
    /// unless the filter names a scope (whose records are one range of keys), a SQL
    /// store scans its table from `after`, and Redis SCANs every record key (every
    /// primary's, on a cluster) for each page; each store's docs say its cost. A record
    /// that does not read, among those scanned, fails the call with
    /// [`StoreError::Corrupt`] naming it (as [`list_unknown`](Store::list_unknown) does:
    /// never skipped silently).
    fn records(
        &self,
        filter: &RecordFilter,
        after: Option<&Key>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<Record>, StoreError>> + Send;

    /// Deletes the live record of `key` if it is in one of `states` (as
    /// [`record`](Store::record) would find it), looked at and deleted in one atomic step
    /// (a transaction, a script); returns what it was, or `None` if there was no live
    /// record in those states (nothing is deleted).
    ///
    /// For an operator who checked the authority: an UNKNOWN record (as
    /// [`forget`](Store::forget) does), a PROCESSING one stuck under a hung owner (whose
    /// own writes are then refused as [`LeaseLost`](StoreError::LeaseLost): the key may
    /// be claimed and executed again while that owner still runs), or a COMPLETED one to
    /// run it again.
    ///
    /// A record that does not read is [`StoreError::Corrupt`]. A store whose look and
    /// delete are one statement or script (PostgreSQL, Redis) has deleted it when it was
    /// in a state asked for, and says so in the message; SQLite and MySQL judge it first
    /// and keep it.
    fn remove_record(
        &self,
        key: &Key,
        states: &[RecordState],
    ) -> impl Future<Output = Result<Option<Record>, StoreError>> + Send;

    /// Creates the store's tables (or whatever it keeps records in) if they are missing;
    /// idempotent, and safe to run from several processes at once. A store that needs
    /// none (Redis) answers `Ok` at once, which is what this default does. Opening a
    /// store never creates a schema by itself: call this once at startup.
    fn ensure_schema(&self) -> impl Future<Output = Result<(), StoreError>> + Send {
        std::future::ready(Ok(()))
    }

    /// A short name for this kind of store, for the `store` label of the layer's metrics
    /// and for logs: by default its type's name without its path or generics
    /// (`PostgresStore`); [`AnyStore`] names the store it holds.
    fn name(&self) -> &'static str {
        let full = std::any::type_name::<Self>();
        let plain = full.split('<').next().unwrap_or(full);
        plain.rsplit("::").next().unwrap_or(plain)
    }
}

/// Runs a future to completion on the calling thread: for synchronous code (a CLI, a
/// script) using a store that needs no async runtime, such as `idemcache-sqlite`'s.
pub fn block_on<F: Future>(future: F) -> F::Output {
    use std::sync::Arc;
    use std::task::{Context, Poll, Wake, Waker};

    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::park();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_say_what_failed_and_keep_their_cause() {
        use std::error::Error;
        let cause = std::io::Error::other("connection reset");
        let backend = StoreError::Backend(Box::new(cause));
        assert_eq!(backend.to_string(), "the idempotency store failed: connection reset");
        assert_eq!(backend.source().unwrap().to_string(), "connection reset");
        let key = Key::new("POST /orders", "user:7", "k-9").unwrap();
        let lost = StoreError::LeaseLost(key.clone());
        assert!(lost.source().is_none());
        assert!(lost.to_string().contains("lease on") && lost.to_string().contains("k-9"));
        let not_unknown = StoreError::NothingToSettle(key).to_string();
        assert!(not_unknown.contains("k-9") && not_unknown.contains("no UNKNOWN record"));
        assert!(StoreError::Corrupt("x".into()).to_string().ends_with(": x"));
    }
}
