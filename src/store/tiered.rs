//! [`Tiered`]: the in-process [`Cache`] in front of a durable [`Store`].
//!
//! Invariants: the store is the authority and the cache only ever holds what the store
//! committed. A repeat of a key completed here is answered from memory without touching
//! the store; everything else reads through. A completion is written to the store first
//! and cached only after it committed, with a TTL no longer than the store's; a cache
//! problem never changes the durable fact; the store failing is a typed error and the
//! caller does not execute (fail closed).
//!
//! The cache also holds a claim while the store's is taken, so concurrent duplicates in
//! this process are answered "in progress" from memory instead of each asking the store.

use std::time::{Duration, SystemTime};

use bytes::Bytes;

use super::{Store, StoreClaim, StoreError, StoredResult};
use crate::{Cache, Claim, ClaimError, ClaimGuard, Fingerprint, Key, Known, Timestamp};

/// A [`Cache`] in front of a [`Store`]. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct Tiered<S> {
    cache: Cache,
    store: S,
    lease: Duration,
    completed_ttl: Duration,
    unknown_ttl: Duration,
}

/// What [`Tiered::claim`] found.
#[derive(Debug)]
pub enum TieredClaim<'a, S: Store> {
    /// Absent in the store too: execute, then [`TieredGuard::complete`].
    Acquired(TieredGuard<'a, S>),
    /// Completed before (from memory or from the store): replay.
    Completed(StoredResult),
    /// Executing, here or in another process.
    InProgress {
        /// When the holder's lease lapses.
        lease_ends_at: SystemTime,
    },
    /// Outcome unknown: never re-run blindly.
    Unknown {
        /// When it was marked unknown.
        marked_at: SystemTime,
    },
    /// The key was used for a different request.
    Mismatch,
}

/// Why a tiered claim failed: do not execute.
#[derive(Debug)]
#[non_exhaustive]
pub enum TieredError {
    /// The hot tier refused (full of in-flight work).
    Cache(ClaimError),
    /// The store failed or refused.
    Store(StoreError),
}

impl std::fmt::Display for TieredError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TieredError::Cache(e) => write!(f, "the in-process cache refused: {e}"),
            TieredError::Store(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for TieredError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TieredError::Cache(e) => Some(e),
            TieredError::Store(e) => Some(e),
        }
    }
}

impl From<StoreError> for TieredError {
    fn from(e: StoreError) -> Self {
        TieredError::Store(e)
    }
}

impl<S: Store> Tiered<S> {
    /// The cache in front of `store`, with a 60 s lease and 24 h TTLs for results and
    /// unknown outcomes (the store's TTLs; the cache keeps results no longer).
    pub fn new(cache: Cache, store: S) -> Self {
        let day = Duration::from_secs(24 * 3600);
        Tiered {
            cache,
            store,
            lease: Duration::from_secs(60),
            completed_ttl: day,
            unknown_ttl: day,
        }
    }

    /// The lease a claim takes in the store.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How long the store keeps a completed result.
    pub fn completed_ttl(mut self, ttl: Duration) -> Self {
        self.completed_ttl = ttl;
        self
    }

    /// How long the store keeps an UNKNOWN outcome.
    pub fn unknown_ttl(mut self, ttl: Duration) -> Self {
        self.unknown_ttl = ttl;
        self
    }

    /// The store behind the cache (for resolving, listing, purging).
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The cache in front.
    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    /// Claims `key`: from memory if it completed here, else through the store.
    ///
    /// The store's part runs in a boxed future of its own, so the memory answer does not
    /// build (and move) the store's future, which can be kilobytes.
    pub async fn claim(
        &self,
        key: &Key,
        fingerprint: Fingerprint,
    ) -> Result<TieredClaim<'_, S>, TieredError> {
        match self.answer_in_memory(key, fingerprint)? {
            Ok(answer) => Ok(answer),
            Err(local) => Box::pin(self.read_through(key, fingerprint, local)).await,
        }
    }

    /// The cache's answer, or its claim held while the store is asked.
    #[allow(clippy::type_complexity)]
    fn answer_in_memory(
        &self,
        key: &Key,
        fingerprint: Fingerprint,
    ) -> Result<Result<TieredClaim<'_, S>, ClaimGuard>, TieredError> {
        Ok(Ok(match self.cache.claim(key, fingerprint).map_err(TieredError::Cache)? {
            Claim::Acquired(local) => return Ok(Err(local)),
            Claim::Completed(replay) => {
                // The hot path: one reading of each clock for both times.
                let (now, wall) = (self.cache.now(), SystemTime::now());
                let on_wall = |at: Timestamp| {
                    let moved = if at >= now {
                        wall.checked_add(at.saturating_duration_since(now))
                    } else {
                        wall.checked_sub(now.saturating_duration_since(at))
                    };
                    moved.unwrap_or(wall)
                };
                TieredClaim::Completed(StoredResult {
                    body: replay.body,
                    completed_at: on_wall(replay.completed_at),
                    expires_at: on_wall(replay.expires_at),
                })
            }
            Claim::InProgress { lease_ends_at, .. } => {
                TieredClaim::InProgress { lease_ends_at: self.cache.system_time(lease_ends_at) }
            }
            Claim::Unknown { marked_at, .. } => {
                TieredClaim::Unknown { marked_at: self.cache.system_time(marked_at) }
            }
            Claim::Mismatch => TieredClaim::Mismatch,
        }))
    }

    /// Asks the store, holding the cache's claim `local` so local duplicates wait on
    /// memory, and settles `local` by the store's answer.
    async fn read_through(
        &self,
        key: &Key,
        fingerprint: Fingerprint,
        local: ClaimGuard,
    ) -> Result<TieredClaim<'_, S>, TieredError> {
        let durable = match self.store.claim(key, fingerprint, self.lease).await {
            Ok(durable) => durable,
            Err(e) => {
                let _ = local.release();
                return Err(e.into());
            }
        };
        Ok(match durable {
            StoreClaim::Acquired { token, lease_ends_at } => TieredClaim::Acquired(TieredGuard {
                tiered: self,
                key: key.clone(),
                token,
                lease_ends_at,
                local: Some(local),
            }),
            StoreClaim::Completed(record) => {
                let _ = local.release();
                self.remember(key, fingerprint, &record);
                TieredClaim::Completed(record)
            }
            StoreClaim::InProgress { lease_ends_at } => {
                let _ = local.release();
                TieredClaim::InProgress { lease_ends_at }
            }
            StoreClaim::Unknown { marked_at } => {
                let _ = local.release();
                TieredClaim::Unknown { marked_at }
            }
            StoreClaim::Mismatch => {
                let _ = local.release();
                TieredClaim::Mismatch
            }
        })
    }

    /// Whether the hot tier can hold `record` whole: one it would keep without its body
    /// stays in the store only (a repeat reads it through, body and all).
    fn fits(&self, record: &StoredResult) -> bool {
        record.body.as_ref().is_some_and(|b| b.len() <= self.cache.max_result_size())
    }

    /// Puts a committed record into the hot tier with its own times (so never longer
    /// than the store keeps it). A refusal (the key got busy, the cache is full) only
    /// means the next repeat reads through.
    fn remember(&self, key: &Key, fingerprint: Fingerprint, record: &StoredResult) {
        if !self.fits(record) {
            return;
        }
        let known = Known::Completed {
            body: record.body.clone(),
            completed_at: self.cache.timestamp_at(record.completed_at),
            expires_at: self.cache.timestamp_at(record.expires_at),
        };
        let _ = self.cache.insert(key, fingerprint, known);
    }

    /// Completes the cache's claim with a record the store committed, for no longer than
    /// the store keeps it; or lets it go if the record does not fit.
    fn keep(&self, local: Option<ClaimGuard>, record: &StoredResult) {
        let Some(mut local) = local else { return };
        let left = record.expires_at.duration_since(SystemTime::now()).unwrap_or_default();
        match &record.body {
            Some(body) if self.fits(record) && local.set_result_ttl(left).is_ok() => {
                let _ = local.complete(body.clone());
            }
            _ => {
                let _ = local.release();
            }
        }
    }
}

/// A claim held in the store (and in the cache, for local duplicates). Settle it with
/// [`complete`](TieredGuard::complete), [`release`](TieredGuard::release) or
/// [`mark_unknown`](TieredGuard::mark_unknown).
///
/// Dropped unsettled (an early return, a panic), it lets go of the cache's claim only:
/// the store's record stays PROCESSING until its lease lapses, so nobody re-executes
/// before then (a drop cannot wait for the store).
#[derive(Debug)]
pub struct TieredGuard<'a, S> {
    tiered: &'a Tiered<S>,
    key: Key,
    token: u64,
    lease_ends_at: SystemTime,
    local: Option<ClaimGuard>,
}

impl<S: Store> TieredGuard<'_, S> {
    /// The store's fencing token for this claim: carry it into your own writes.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// When the store's lease lapses.
    pub fn lease_ends_at(&self) -> SystemTime {
        self.lease_ends_at
    }

    /// PROCESSING → COMPLETED: written to the store first, then cached. A store error
    /// leaves the outcome to the store (the write may have committed): the cache lets the
    /// key go, so the next claim asks the store.
    pub async fn complete(mut self, result: impl Into<Bytes>) -> Result<StoredResult, TieredError> {
        let tiered = self.tiered;
        let body = Some(result.into());
        let outcome =
            tiered.store.complete(&self.key, self.token, body, tiered.completed_ttl).await;
        let local = self.local.take();
        match &outcome {
            Ok(record) => tiered.keep(local, record),
            Err(_) => drop(local),
        }
        Ok(outcome?)
    }

    /// PROCESSING → absent in the store and here: a retry executes again.
    pub async fn release(mut self) -> Result<(), TieredError> {
        drop(self.local.take());
        Ok(self.tiered.store.release(&self.key, self.token).await?)
    }

    /// PROCESSING → UNKNOWN in the store; repeats read it through.
    pub async fn mark_unknown(mut self) -> Result<(), TieredError> {
        let tiered = self.tiered;
        let outcome = tiered.store.mark_unknown(&self.key, self.token, tiered.unknown_ttl).await;
        drop(self.local.take());
        Ok(outcome?)
    }
}
