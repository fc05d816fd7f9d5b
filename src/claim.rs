//! What a claim hands back, and what a look at an entry shows.
//!
//! These are plain values: building one never touches the map, and holding one never
//! holds a lock. The one exception is [`Claim::Acquired`], whose guard is the only way
//! to record the outcome of the execution it licenses.

use bytes::Bytes;

use crate::{ClaimGuard, CorrelationId, Fingerprint, Key, Timestamp};

/// The answer to [`Cache::claim`](crate::Cache::claim): may the caller execute this intent?
#[derive(Debug)]
#[must_use = "a claim says whether to execute; an ignored Acquired guard releases the key at once"]
pub enum Claim {
    /// The caller owns the key: execute, then record the outcome on the guard.
    Acquired(ClaimGuard),
    /// The intent was executed before; here is its stored result. Do not execute.
    Completed(Replay),
    /// Another caller is executing the intent right now (HTTP 409, with a `Retry-After`
    /// of [`Cache::time_until`](crate::Cache::time_until)`(lease_ends_at)`). Retry later,
    /// or wait with [`Cache::claim_wait`](crate::Cache::claim_wait), which blocks the
    /// calling thread (not for an async runtime's worker threads), or with
    /// [`Cache::claim_wait_async`](crate::Cache::claim_wait_async), which does not.
    InProgress {
        /// When the current owner claimed the key.
        started_at: Timestamp,
        /// When the owner's lease lapses unless extended; after it, the key can be taken
        /// over.
        lease_ends_at: Timestamp,
    },
    /// An earlier execution's outcome is unknown (it may or may not have taken effect).
    /// Do not execute: check the authority, then [`Cache::resolve`](crate::Cache::resolve)
    /// or [`Cache::forget`](crate::Cache::forget).
    Unknown {
        /// When the outcome was marked unknown.
        marked_at: Timestamp,
        /// When the mark expires and the key becomes claimable again.
        expires_at: Timestamp,
    },
    /// The key was first used with a different request (HTTP 422). Never a replay of
    /// someone else's response.
    Mismatch,
}

impl Claim {
    /// Whether this claim licenses the caller to execute.
    pub fn is_acquired(&self) -> bool {
        matches!(self, Claim::Acquired(_))
    }
}

/// A stored result, handed to repeats of a completed intent.
///
/// One type for every tier, its times in the tier's own clock: the cache's
/// [`Timestamp`] (the default), a monotonic clock, so that a lease or TTL is never
/// stretched or cut short by the wall clock stepping; a durable store's `SystemTime`
/// (`Replay<SystemTime>`), the wall clock being the only one processes and restarts share.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Replay<At = Timestamp> {
    /// The result the first execution recorded, or `None` if it was larger than the
    /// cache's `max_result_size` and only the fact of completion was kept. A small
    /// result's `Bytes` shares its memory with other results of the cache: holding on
    /// to it long after its entry is gone keeps that memory in use.
    pub body: Option<Bytes>,
    /// When the first execution completed.
    pub completed_at: At,
    /// When the stored result expires.
    pub expires_at: At,
}

impl<At> Replay<At> {
    /// A replay of `body` (`None`: completed without a kept body), for a store
    /// implementation handing back what it read.
    pub fn new(body: Option<Bytes>, completed_at: At, expires_at: At) -> Replay<At> {
        Replay { body, completed_at, expires_at }
    }

    /// Whether the result body was kept (it was not if it exceeded `max_result_size`).
    pub fn body_kept(&self) -> bool {
        self.body.is_some()
    }
}

/// A fencing token: a number that grows with every successful claim of a key.
///
/// Pass it to the authority with the write ("`UPDATE ... WHERE fence < $token`") so that a
/// stale owner, whose lease lapsed and whose key was taken over, cannot overwrite the new
/// owner's effect there either.
///
/// - Within one cache, tokens are unique and increase per key.
/// - Across restarts of one process, a new cache's tokens are larger than any the old one
///   issued: they start from the wall clock (nanoseconds since the Unix epoch) at
///   `build()`. This holds as long as the wall clock did not step back between the two
///   runs and no shard averaged more than one claim per `shard_count` nanoseconds (with
///   16 shards, 62 million claims a second per shard).
/// - Tokens of two caches running at the same time (two processes, or two caches in
///   one) are **not** comparable: fencing across processes needs tokens from one shared
///   counter, which a durable store provides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(pub(crate) u64);

impl FencingToken {
    /// The token `n`: for a durable store handing out tokens from its own counter (a
    /// cache never takes a token back from its caller, so forging one gains nothing).
    pub const fn new(n: u64) -> FencingToken {
        FencingToken(n)
    }

    /// The token as a number.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl std::fmt::Display for FencingToken {
    /// The number, as it goes into a `WHERE fence < $token`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// A look at one entry, from [`Cache::peek`](crate::Cache::peek) or
/// [`Cache::remove`](crate::Cache::remove).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EntrySnapshot {
    /// The fingerprint of the request that claimed the key.
    pub fingerprint: Fingerprint,
    /// The entry's state.
    pub state: EntryState,
    /// The correlation id its claim was given
    /// ([`Cache::claim_correlated`](crate::Cache::claim_correlated)), kept through
    /// completion and an UNKNOWN mark: what joins the entry to the request's logs and
    /// trace. `None` when the claim was given none.
    pub correlation_id: Option<CorrelationId>,
}

/// The state of an entry; see the state table in the crate docs.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum EntryState {
    /// An owner is executing the intent.
    Processing {
        /// When the owner claimed the key.
        started_at: Timestamp,
        /// When the owner's lease lapses unless extended.
        lease_ends_at: Timestamp,
        /// The owner's fencing token.
        token: FencingToken,
    },
    /// The intent completed; repeats get this replay.
    Completed(Replay),
    /// The outcome is unknown.
    Unknown {
        /// When the outcome was marked unknown.
        marked_at: Timestamp,
        /// When the mark expires.
        expires_at: Timestamp,
    },
}

/// Why an entry left the cache, as told to a removal listener
/// ([`CacheBuilder::removal_listener`](crate::CacheBuilder::removal_listener)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RemovalCause {
    /// Its deadline passed: a completed result's or unknown mark's TTL ended, or a lease
    /// lapsed without an outcome.
    Expired,
    /// It was a completed entry, evicted to make room.
    Evicted,
    /// It was removed on purpose: `remove`, `forget`, or a release by its owner (an
    /// explicit `release` or a guard dropped under [`DropPolicy::Release`](crate::DropPolicy::Release)).
    Removed,
}

/// A fact about a key learned outside this cache — a durable store, a snapshot, a
/// database row — for [`Cache::insert`](crate::Cache::insert), with its original times
/// on the cache's clock (see [`Cache::timestamp_at`](crate::Cache::timestamp_at) to
/// convert wall-clock times).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// The intent completed. Repeats replay `body` (`None`: completed without a kept
    /// body, which also serves to remember that a key belongs to one fingerprint).
    Completed {
        /// The stored result, if kept.
        body: Option<Bytes>,
        /// When the intent completed: at or before now.
        completed_at: Timestamp,
        /// When the result stops being replayed: after now, within
        /// [`MAX_DURATION`](crate::MAX_DURATION) of it. (Within an hour of the end of a
        /// clock's range, ~584 years after its origin, it is kept shorter: until the
        /// last deadline the cache can reclaim.)
        expires_at: Timestamp,
    },
    /// The outcome is unknown: claims answer [`Claim::Unknown`] until it is resolved,
    /// forgotten or expires.
    Unknown {
        /// When the outcome was marked unknown: at or before now.
        marked_at: Timestamp,
        /// When the mark expires: after now, within
        /// [`MAX_DURATION`](crate::MAX_DURATION) of it.
        expires_at: Timestamp,
    },
}

/// An UNKNOWN entry, as listed for a reconciler by
/// [`Cache::list_unknown`](crate::Cache::list_unknown), and (`UnknownEntry<SystemTime>`, on the
/// store's clock) by a durable store's `list_unknown`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct UnknownEntry<At = Timestamp> {
    /// The entry's key.
    pub key: Key,
    /// The fingerprint of the request that claimed it.
    pub fingerprint: Fingerprint,
    /// The fencing token of the execution whose outcome is unknown: what identifies
    /// that execution, so that a verdict about it never settles a later one of the
    /// same key (forgotten, claimed and marked again while the authority was asked,
    /// with the same fingerprint and, on a coarse clock, the same mark time). An entry
    /// [`insert`](crate::Cache::insert)ed into a cache has a token of its own too.
    pub token: FencingToken,
    /// When its outcome was marked unknown.
    pub marked_at: At,
    /// When the mark expires and the key becomes claimable again.
    pub expires_at: At,
    /// The correlation id of the claim whose outcome is unknown: whose request it was,
    /// for the reconciler's log line. The cache lists it; a durable store's listing
    /// leaves it `None` (its record has it: `Store::record`).
    pub correlation_id: Option<CorrelationId>,
}

impl<At> UnknownEntry<At> {
    /// An UNKNOWN entry, for a store implementation listing what it holds: `token` is
    /// the token the record's execution was claimed under.
    pub fn new(
        key: Key,
        fingerprint: Fingerprint,
        token: FencingToken,
        marked_at: At,
        expires_at: At,
    ) -> Self {
        UnknownEntry { key, fingerprint, token, marked_at, expires_at, correlation_id: None }
    }
}
