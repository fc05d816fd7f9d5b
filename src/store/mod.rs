//! Durable idempotency records behind the in-process [`Cache`](crate::Cache): the
//! [`Store`] trait, its SQLite implementation (feature `sqlite`), and [`Tiered`], the
//! cache in front of any store.
//!
//! The contract is the cache's (absent → PROCESSING → COMPLETED or UNKNOWN, a lapsed
//! lease taken over under a new fencing token, a different fingerprint a mismatch), kept
//! by the store across processes and restarts:
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

#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "sqlite")]
mod sqlite;
mod tiered;
pub mod unique;

use std::fmt;
use std::future::Future;
use std::time::{Duration, SystemTime};

use bytes::Bytes;

#[cfg(feature = "postgres")]
pub use postgres::{PostgresStore, POSTGRES_SCHEMA};
#[cfg(feature = "redis")]
pub use redis::RedisStore;
#[cfg(feature = "sqlite")]
pub use sqlite::{SqliteStore, SQLITE_SCHEMA};
pub use tiered::{Tiered, TieredClaim, TieredError, TieredGuard};

use crate::{Fingerprint, Key};

/// What a store's claim found, as [`Claim`](crate::Claim) does for the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreClaim {
    /// The key was absent (or dead): the caller owns it and executes. Every later write
    /// must carry `token`.
    Acquired {
        /// The fencing token for this claim, from the store's counter.
        token: u64,
        /// When the lease lapses on the store's clock unless the key completes first.
        lease_ends_at: SystemTime,
    },
    /// Completed before: replay.
    Completed(StoredResult),
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

/// A completed record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResult {
    /// The stored result; `None` if it was recorded without one.
    pub body: Option<Bytes>,
    /// When it completed (the store's clock).
    pub completed_at: SystemTime,
    /// When the record expires (the store's clock).
    pub expires_at: SystemTime,
}

/// An UNKNOWN record, for a reconciler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownRecord {
    /// The record's key.
    pub key: Key,
    /// The request it was claimed for.
    pub fingerprint: Fingerprint,
    /// When it was marked unknown.
    pub marked_at: SystemTime,
}

/// Why a store operation failed. Nothing was changed unless the variant says so.
#[derive(Debug)]
#[non_exhaustive]
pub enum StoreError {
    /// The token no longer owns the key (its lease lapsed and it was taken over, or it
    /// was settled already): this write was refused.
    LeaseLost,
    /// `resolve` or `forget` on a key that is not UNKNOWN.
    NotUnknown,
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
    /// [`Store::unknown`] fails with it while the record is among those it lists (it
    /// never skips one silently); purging goes on past it.
    Corrupt(String),
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::LeaseLost => f.write_str("the lease was lost: the key has a newer owner"),
            StoreError::NotUnknown => f.write_str("the key has no UNKNOWN record"),
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
/// as [`SqliteStore`]).
pub trait Store: Send + Sync + 'static {
    /// Claims `key` for the request `fingerprint` with a lease of `lease`, atomically.
    fn claim(
        &self,
        key: &Key,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> impl Future<Output = Result<StoreClaim, StoreError>> + Send;

    /// PROCESSING → COMPLETED under `token`, kept for `ttl`; returns the stored record.
    fn complete(
        &self,
        key: &Key,
        token: u64,
        body: Option<Bytes>,
        ttl: Duration,
    ) -> impl Future<Output = Result<StoredResult, StoreError>> + Send;

    /// Renews the lease of the PROCESSING record under `token` to end `lease` from the
    /// store's now, for executions that run long; returns the new end. Refused with
    /// [`StoreError::LeaseLost`] if the lease already lapsed or the key moved on.
    fn extend_lease(
        &self,
        key: &Key,
        token: u64,
        lease: Duration,
    ) -> impl Future<Output = Result<SystemTime, StoreError>> + Send;

    /// PROCESSING → absent under `token`: a retry executes again.
    fn release(&self, key: &Key, token: u64)
        -> impl Future<Output = Result<(), StoreError>> + Send;

    /// PROCESSING → UNKNOWN under `token`, kept for `ttl`.
    fn mark_unknown(
        &self,
        key: &Key,
        token: u64,
        ttl: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// UNKNOWN → COMPLETED after checking the authority.
    fn resolve(
        &self,
        key: &Key,
        body: Option<Bytes>,
        ttl: Duration,
    ) -> impl Future<Output = Result<StoredResult, StoreError>> + Send;

    /// UNKNOWN → absent after checking the authority found no effect.
    fn forget(&self, key: &Key) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Up to `limit` live UNKNOWN records, oldest mark first.
    fn unknown(
        &self,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<UnknownRecord>, StoreError>> + Send;

    /// Deletes up to `limit` expired records (lease lapsed, TTL passed); returns how many.
    /// Call it in a loop until it returns less than `limit`, to purge in bounded batches.
    fn purge_expired(&self, limit: usize)
        -> impl Future<Output = Result<usize, StoreError>> + Send;
}

/// Checks a lease or TTL as the cache does: more than zero, at most
/// [`MAX_DURATION`](crate::MAX_DURATION).
pub(crate) fn check_duration(what: &str, d: Duration) -> Result<(), StoreError> {
    if d.is_zero() || d > crate::MAX_DURATION {
        return Err(StoreError::InvalidInput(format!(
            "{what} must be more than zero and at most {:?}, got {d:?}",
            crate::MAX_DURATION
        )));
    }
    Ok(())
}

/// Runs a future to completion on the calling thread: for synchronous code (a CLI, a
/// script) using a store that needs no async runtime, such as [`SqliteStore`].
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

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "redis"))]
/// A stored fingerprint's 16 bytes, or [`StoreError::Corrupt`].
pub(crate) fn fingerprint_of(bytes: Vec<u8>) -> Result<Fingerprint, StoreError> {
    let raw: [u8; 16] = bytes
        .try_into()
        .map_err(|_| StoreError::Corrupt("a fingerprint is not 16 bytes".into()))?;
    Ok(Fingerprint::from_bytes(raw))
}

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "redis"))]
/// A record the store holds that cannot be read, named by its key (so an operator can
/// find it, and [`Store::forget`] or fix it).
pub(crate) fn corrupt(stored_key: &[u8], why: impl fmt::Display) -> StoreError {
    match Key::from_stored(stored_key) {
        Ok(key) => StoreError::Corrupt(format!("the record of {key:?}: {why}")),
        Err(_) => {
            let hex = hex(stored_key);
            StoreError::Corrupt(format!("the record stored under key bytes {hex}: {why}"))
        }
    }
}

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "redis"))]
/// `bytes` in lowercase hex, two digits a byte.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(feature = "redis")]
/// `e`, naming `key` if it is [`StoreError::Corrupt`] (which then did not name it).
pub(crate) fn named(key: &Key, e: StoreError) -> StoreError {
    match e {
        StoreError::Corrupt(why) => corrupt(key.as_bytes(), why),
        other => other,
    }
}

/// Microseconds since the Unix epoch, as stores keep times.
pub(crate) fn from_micros(us: i64) -> SystemTime {
    if us >= 0 {
        SystemTime::UNIX_EPOCH + Duration::from_micros(us as u64)
    } else {
        SystemTime::UNIX_EPOCH - Duration::from_micros(us.unsigned_abs())
    }
}

/// Microseconds since the Unix epoch of `at` (the inverse of [`from_micros`]).
pub(crate) fn micros_since_epoch(at: SystemTime) -> i64 {
    match at.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_micros()).unwrap_or(i64::MAX),
        Err(before) => i64::try_from(before.duration().as_micros()).map_or(i64::MIN, |us| -us),
    }
}

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "redis"))]
/// A duration in whole microseconds (rounded up, so a lease never shrinks to zero).
pub(crate) fn micros(d: Duration) -> i64 {
    let us = d.as_nanos().div_ceil(1000);
    i64::try_from(us).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_before_and_after_the_epoch_round_trip_through_micros() {
        for us in [-1_000_000_007, -1, 0, 1, 1_700_000_000_000_000] {
            assert_eq!(micros_since_epoch(from_micros(us)), us);
        }
        assert!(from_micros(-1) < SystemTime::UNIX_EPOCH);
    }

    #[test]
    fn durations_are_checked_as_the_cache_checks_them() {
        assert!(check_duration("lease", crate::MAX_DURATION).is_ok());
        assert!(check_duration("lease", Duration::from_nanos(1)).is_ok());
        for bad in [Duration::ZERO, crate::MAX_DURATION + Duration::from_nanos(1)] {
            let err = check_duration("lease", bad).unwrap_err();
            assert!(matches!(err, StoreError::InvalidInput(ref why) if why.starts_with("lease")));
        }
    }

    #[test]
    fn errors_say_what_failed_and_keep_their_cause() {
        use std::error::Error;
        let cause = std::io::Error::other("connection reset");
        let backend = StoreError::Backend(Box::new(cause));
        assert_eq!(backend.to_string(), "the idempotency store failed: connection reset");
        assert_eq!(backend.source().unwrap().to_string(), "connection reset");
        assert!(StoreError::LeaseLost.source().is_none());
        assert!(StoreError::LeaseLost.to_string().contains("lease was lost"));
        assert!(StoreError::NotUnknown.to_string().contains("no UNKNOWN record"));
        assert!(StoreError::Corrupt("x".into()).to_string().ends_with(": x"));
    }
}
