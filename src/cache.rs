//! [`Cache`]: the locked shards, and the claim-or-return API on top of them.
//!
//! Ground rules: each [`Shard`] sits behind its own mutex (padded to its own cache line)
//! with a condvar beside it. A public operation hashes the key once, reads the clock
//! once, locks exactly one shard, calls one `Shard` method and unlocks; no operation
//! holds two shard locks, so there is no lock order to get wrong. The condvar is
//! notified, under the lock, whenever an entry leaves PROCESSING while someone waits.

use std::fmt;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::config::Config;
use crate::guard::ClaimGuard;
use crate::shard::Shard;
use crate::sync::{Arc, CachePadded, Condvar, Mutex, MutexGuard};
use crate::{
    CacheBuilder, Claim, ClaimError, Clock, EntrySnapshot, Fingerprint, Key, ResolveError, Stats,
    Timestamp,
};

/// An idempotency cache: claim a key before executing an intent, replay its result after.
///
/// Cheap to clone (clones share one cache) and safe to share between threads.
///
/// ```
/// use idemcache::{Cache, Claim, Fingerprint, Key};
///
/// let cache = Cache::builder().build()?;
/// let key = Key::new("POST /v1/charges", "user:42", "retry-1").unwrap();
/// let fp = Fingerprint::of(b"amount=100");
///
/// match cache.claim(&key, fp)? {
///     Claim::Acquired(guard) => guard.complete("charge ch_1".as_bytes()).unwrap(),
///     other => panic!("first claim must acquire, got {other:?}"),
/// }
/// match cache.claim(&key, fp)? {
///     Claim::Completed(replay) => assert_eq!(replay.body.unwrap(), "charge ch_1"),
///     other => panic!("a repeat must replay, got {other:?}"),
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Cache {
    inner: Arc<Inner>,
}

struct Inner {
    shards: Box<[CachePadded<ShardCell>]>,
    hasher: ahash::RandomState,
    config: Config,
    clock: Box<dyn Clock>,
}

struct ShardCell {
    shard: Mutex<Shard>,
    /// Notified when an entry of this shard leaves PROCESSING and `waiters > 0`.
    changed: Condvar,
}

/// Where a guard's entry lives: enough to find it without the key.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ticket {
    pub(crate) shard: usize,
    pub(crate) slot: u32,
    pub(crate) token: u64,
}

impl fmt::Debug for Cache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cache")
            .field("config", &self.inner.config)
            .field("clock", &self.inner.clock)
            .finish_non_exhaustive()
    }
}

impl Cache {
    /// Starts building a cache; see [`CacheBuilder`] for the settings and defaults.
    pub fn builder() -> CacheBuilder {
        CacheBuilder::default()
    }

    pub(crate) fn from_parts(config: Config, clock: Box<dyn Clock>) -> Cache {
        let shards = (0..config.shards)
            .map(|i| {
                CachePadded(ShardCell {
                    shard: Mutex::new(Shard::new(i, config.shards)),
                    changed: Condvar::new(),
                })
            })
            .collect();
        Cache {
            inner: Arc::new(Inner {
                shards,
                hasher: ahash::RandomState::new(),
                config,
                clock,
            }),
        }
    }

    /// The shard a hash belongs to. Bits 40.. pick the shard, so they stay independent of
    /// the low bits hashbrown uses for its bucket and the top 7 it uses for its tags.
    #[inline]
    fn locate(&self, key: &Key) -> (u64, usize) {
        let hash = self.inner.hasher.hash_one(key.as_bytes());
        let shard = (hash >> 40) as usize & (self.inner.shards.len() - 1);
        (hash, shard)
    }

    #[inline]
    fn lock(&self, shard: usize) -> MutexGuard<'_, Shard> {
        self.inner.shards[shard].shard.lock()
    }

    #[inline]
    pub(crate) fn now(&self) -> Timestamp {
        self.inner.clock.now()
    }

    pub(crate) fn config(&self) -> &Config {
        &self.inner.config
    }

    /// Claims `key` for a request with `fingerprint`, atomically.
    ///
    /// Exactly one of any number of concurrent callers gets [`Claim::Acquired`]; the
    /// others get the stored result, "in progress", "unknown" or a mismatch. A key whose
    /// owner's lease has lapsed is taken over with a new fencing token.
    #[inline]
    pub fn claim(&self, key: &Key, fingerprint: Fingerprint) -> Result<Claim, ClaimError> {
        let (hash, shard) = self.locate(key);
        let now = self.now();
        let claim = self.lock(shard).claim(
            hash,
            key,
            fingerprint,
            now,
            &self.inner.config,
            |slot, token, lease_ends_at| self.guard(shard, slot, token, lease_ends_at),
        );
        Ok(claim)
    }

    fn guard(&self, shard: usize, slot: u32, token: u64, lease_ends_at: Timestamp) -> Claim {
        Claim::Acquired(ClaimGuard::new(
            self.clone(),
            Ticket { shard, slot, token },
            lease_ends_at,
        ))
    }

    /// Claims `key`, waiting up to `timeout` while another caller is executing it.
    ///
    /// Returns what a fresh claim would once the key leaves PROCESSING: the stored result,
    /// "unknown", or [`Claim::Acquired`] if the owner released the key or its lease
    /// lapsed. If `timeout` passes first, returns [`Claim::InProgress`].
    ///
    /// `timeout` is real time (the thread really sleeps); lease ends are read on the
    /// cache's clock. A waiter sleeps on its shard's condvar, so it costs nothing while it
    /// waits and cannot miss the wake-up: the state is re-checked under the same lock the
    /// owner's outcome is written under.
    pub fn claim_wait(
        &self,
        key: &Key,
        fingerprint: Fingerprint,
        timeout: Duration,
    ) -> Result<Claim, ClaimError> {
        let give_up = Instant::now().checked_add(timeout);
        let (hash, shard) = self.locate(key);
        let cell = &self.inner.shards[shard];
        let mut guard = cell.shard.lock();
        loop {
            let now = self.now();
            let claim = guard.claim(
                hash,
                key,
                fingerprint,
                now,
                &self.inner.config,
                |slot, token, lease_ends_at| self.guard(shard, slot, token, lease_ends_at),
            );
            let Claim::InProgress { lease_ends_at, .. } = claim else {
                return Ok(claim);
            };
            let left = match give_up {
                Some(at) => at.saturating_duration_since(Instant::now()),
                None => Duration::MAX,
            };
            if left.is_zero() {
                return Ok(claim);
            }
            // Wake at the lease's end at the latest: nobody notifies a lapse.
            let nap = left.min(lease_ends_at.saturating_duration_since(now));
            guard.waiters += 1;
            guard = cell.changed.wait_timeout(guard, nap);
            guard.waiters -= 1;
        }
    }

    /// Runs `f` on the guard's shard, and wakes `claim_wait`ers if it took the entry out
    /// of PROCESSING.
    pub(crate) fn with_owned<T>(
        &self,
        ticket: Ticket,
        f: impl FnOnce(&mut Shard, Timestamp, &Config) -> T,
        leaves_processing: impl FnOnce(&T) -> bool,
    ) -> T {
        let now = self.now();
        let cell = &self.inner.shards[ticket.shard];
        let mut shard = cell.shard.lock();
        let result = f(&mut shard, now, &self.inner.config);
        if shard.waiters > 0 && leaves_processing(&result) {
            cell.changed.notify_all();
        }
        result
    }

    /// Records the result of an UNKNOWN entry after checking the authority:
    /// UNKNOWN → COMPLETED. Repeats then replay `result`.
    pub fn resolve(&self, key: &Key, result: impl Into<Bytes>) -> Result<(), ResolveError> {
        let (hash, shard) = self.locate(key);
        let now = self.now();
        self.lock(shard)
            .resolve(hash, key, result.into(), now, &self.inner.config)
    }

    /// Drops an UNKNOWN entry after checking the authority found no effect:
    /// UNKNOWN → absent, so the next claim executes.
    pub fn forget(&self, key: &Key) -> Result<(), ResolveError> {
        let (hash, shard) = self.locate(key);
        let now = self.now();
        self.lock(shard).forget(hash, key, now)
    }

    /// Looks at a key's live entry without changing its state or any counter.
    pub fn peek(&self, key: &Key) -> Option<EntrySnapshot> {
        let (hash, shard) = self.locate(key);
        let now = self.now();
        self.lock(shard).peek(hash, key, now)
    }

    /// Removes a key's live entry in any state and returns what it was.
    ///
    /// Removing a PROCESSING entry fences its owner (its guard gets
    /// [`LeaseLost`](crate::LeaseLost)) and lets the next claim execute again: use it only
    /// when you know the owner is gone. Waiters in `claim_wait` are woken.
    pub fn remove(&self, key: &Key) -> Option<EntrySnapshot> {
        let (hash, shard) = self.locate(key);
        let now = self.now();
        let cell = &self.inner.shards[shard];
        let mut guard = cell.shard.lock();
        let removed = guard.remove(hash, key, now);
        if guard.waiters > 0 && removed.is_some() {
            cell.changed.notify_all();
        }
        removed
    }

    /// Counters since the cache was built, and what it holds now.
    pub fn stats(&self) -> Stats {
        let mut stats = Stats::default();
        for cell in self.inner.shards.iter() {
            let shard = cell.shard.lock();
            stats.add(&shard.counters, shard.entries(), shard.bytes());
        }
        stats
    }

    /// The number of shards (a power of two).
    pub fn shard_count(&self) -> usize {
        self.inner.shards.len()
    }

    /// Re-counts every shard's entries and bytes and panics if a running total drifted.
    /// For tests and fuzzing; takes each shard lock in turn.
    #[doc(hidden)]
    pub fn debug_validate(&self) {
        for cell in self.inner.shards.iter() {
            cell.shard.lock().validate();
        }
    }
}
