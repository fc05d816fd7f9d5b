//! The crate's typed errors. Every error leaves the cache exactly as it was.

use std::fmt;
use std::time::Duration;

/// The one wording of a duration refused by `config::check_duration`.
pub(crate) fn invalid_duration(f: &mut fmt::Formatter<'_>, what: &str, d: Duration) -> fmt::Result {
    write!(f, "{what} of {d:?} refused: it must be positive and at most {:?}", crate::MAX_DURATION)
}

/// Why [`Cache::claim`](crate::Cache::claim) could not give an answer.
///
/// A claim error means "do not execute": the cache fails closed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClaimError {
    /// The cache is full of entries it may not evict (in-flight or unknown outcomes), so
    /// it cannot guard this key (HTTP 503).
    CapacityExhausted,
    /// The cache's clock reads so close to the end of its range (about 584 years after
    /// its origin) that a lease starting now could not run its length. Only a custom
    /// [`Clock`](crate::Clock) or a [`ManualClock`](crate::ManualClock) gets here.
    ClockOutOfRange {
        /// The clock's reading.
        now: crate::Timestamp,
    },
}

impl fmt::Display for ClaimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClaimError::CapacityExhausted => f.write_str(
                "idempotency cache is full of in-flight entries; refusing to execute unguarded",
            ),
            ClaimError::ClockOutOfRange { now } => write!(
                f,
                "the cache's clock reads {now:?}, too close to the end of its range for a lease \
                 to run its length; refusing to execute unguarded"
            ),
        }
    }
}

impl std::error::Error for ClaimError {}

/// A guard's key is no longer its own: its lease lapsed (and the key may have been taken
/// over by a new owner), or the entry was removed. Nothing was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseLost;

impl fmt::Display for LeaseLost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "lease lost: the lease lapsed or the key was removed; the outcome was not recorded",
        )
    }
}

impl std::error::Error for LeaseLost {}

/// Why [`ClaimGuard::extend_lease`](crate::ClaimGuard::extend_lease) refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ExtendLeaseError {
    /// The lease was already lost.
    LeaseLost,
    /// The requested lease is zero or longer than [`MAX_DURATION`](crate::MAX_DURATION).
    InvalidDuration(Duration),
}

impl fmt::Display for ExtendLeaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExtendLeaseError::LeaseLost => LeaseLost.fmt(f),
            ExtendLeaseError::InvalidDuration(d) => invalid_duration(f, "lease", *d),
        }
    }
}

impl std::error::Error for ExtendLeaseError {}

impl From<LeaseLost> for ExtendLeaseError {
    fn from(_: LeaseLost) -> Self {
        ExtendLeaseError::LeaseLost
    }
}

/// Why [`Cache::resolve`](crate::Cache::resolve) or [`Cache::forget`](crate::Cache::forget)
/// refused: they only act on entries in the UNKNOWN state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ResolveError {
    /// No live entry has this key.
    NotFound,
    /// The entry is processing or completed, not unknown.
    NothingToSettle,
}

impl fmt::Display for ResolveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ResolveError::NotFound => f.write_str("no live entry has this key"),
            ResolveError::NothingToSettle => f.write_str("the entry's outcome is not unknown"),
        }
    }
}

impl std::error::Error for ResolveError {}

/// A setting [`CacheBuilder::build`](crate::CacheBuilder::build) refused.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BuildError {
    /// The shard count is zero or above [`MAX_SHARDS`](crate::MAX_SHARDS).
    Shards(usize),
    /// A TTL or lease is zero or longer than [`MAX_DURATION`](crate::MAX_DURATION).
    Duration {
        /// Which setting: `"completed_ttl"`, `"lease"`, `"unknown_ttl"` or `"lapse_policy"`
        /// (the `ttl` of [`LapsePolicy::MarkUnknown`](crate::LapsePolicy::MarkUnknown)).
        setting: &'static str,
        /// The refused value.
        value: Duration,
    },
    /// `max_result_size` is zero or above [`MAX_RESULT_SIZE_LIMIT`](crate::MAX_RESULT_SIZE_LIMIT).
    MaxResultSize(usize),
    /// `max_result_size` is larger than `max_bytes`: no result that size could be kept.
    MaxResultSizeAboveMaxBytes {
        /// The refused `max_result_size`.
        max_result_size: usize,
        /// The cache's `max_bytes`.
        max_bytes: usize,
    },
    /// `max_entries` is zero.
    MaxEntries(usize),
    /// `max_bytes` is below 64 KiB, too small to hold one entry of the largest key.
    MaxBytes(usize),
    /// The wheel tick is outside [`MIN_TICK`](crate::MIN_TICK)..=[`MAX_TICK`](crate::MAX_TICK).
    Tick(Duration),
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::Shards(n) => {
                write!(f, "shard count {n} refused: it must be between 1 and {}", crate::MAX_SHARDS)
            }
            BuildError::Duration { setting, value } => invalid_duration(f, setting, *value),
            BuildError::MaxResultSize(n) => write!(
                f,
                "max_result_size {n} refused: it must be between 1 and {} bytes",
                crate::MAX_RESULT_SIZE_LIMIT
            ),
            BuildError::MaxResultSizeAboveMaxBytes { max_result_size, max_bytes } => write!(
                f,
                "max_result_size {max_result_size} refused: it is larger than max_bytes \
                 {max_bytes}, so no result that size could ever be kept"
            ),
            BuildError::MaxEntries(n) => {
                write!(f, "max_entries {n} refused: it must be at least 1")
            }
            BuildError::MaxBytes(n) => {
                write!(f, "max_bytes {n} refused: it must be at least 65536 (64 KiB)")
            }
            BuildError::Tick(d) => write!(
                f,
                "wheel tick of {d:?} refused: it must be between {:?} and {:?}",
                crate::MIN_TICK,
                crate::MAX_TICK
            ),
        }
    }
}

impl std::error::Error for BuildError {}

/// Why [`ClaimGuard::set_result_ttl`](crate::ClaimGuard::set_result_ttl) refused. The
/// guard is unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SetResultTtlError {
    /// The TTL is zero or longer than [`MAX_DURATION`](crate::MAX_DURATION).
    InvalidDuration(Duration),
}

impl fmt::Display for SetResultTtlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SetResultTtlError::InvalidDuration(d) => invalid_duration(f, "result TTL", *d),
        }
    }
}

impl std::error::Error for SetResultTtlError {}

/// Why [`Cache::insert`](crate::Cache::insert) refused. Nothing was inserted and nothing
/// else changed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum InsertError {
    /// The key has a live entry, shown here: a claim may be executing it, or the cache
    /// already knows its outcome. A fact from elsewhere never overrides a live entry.
    Occupied(crate::EntrySnapshot),
    /// `expires_at` is not after now: there is nothing left to remember.
    Expired,
    /// `completed_at` / `marked_at` is after now.
    StartsInTheFuture,
    /// `expires_at` is further from now than [`MAX_DURATION`](crate::MAX_DURATION).
    TtlTooLong,
    /// The key's shard is full of entries it may not evict.
    CapacityExhausted,
}

impl fmt::Display for InsertError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InsertError::Occupied(_) => f.write_str(
                "the key already has a live entry; a fact from elsewhere never replaces one",
            ),
            InsertError::Expired => {
                f.write_str("the fact expires at or before now; nothing inserted")
            }
            InsertError::StartsInTheFuture => {
                f.write_str("the fact's completion or mark time is after the cache's now")
            }
            InsertError::TtlTooLong => {
                write!(f, "the fact expires more than {:?} from now", crate::MAX_DURATION)
            }
            InsertError::CapacityExhausted => ClaimError::CapacityExhausted.fmt(f),
        }
    }
}

impl std::error::Error for InsertError {}
