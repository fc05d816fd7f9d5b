//! [`Cache`]: the locked shards, and the claim-or-return API on top of them.
//!
//! Ground rules: each [`Shard`] sits behind its own reader-writer lock (padded to its own
//! cache line) with a condvar beside it. A public operation hashes the key once, locks
//! exactly one shard, reads the clock once (under the lock, so a shard's time follows
//! its lock order), calls one `Shard` method and unlocks; no operation holds two shard
//! locks, so there is no lock order to get wrong. Every write-locked section ends in
//! [`Cache::with_shard`]'s epilogue: the condvar is notified, under the lock, when an
//! entry left PROCESSING while someone waits; after the lock is released, a few results
//! of departed entries are dropped and the removal listener is called.
//!
//! What runs under a shard lock is the shard's own code and the cache's [`Clock`]:
//! nothing the caller supplied is dropped there (a `Bytes` may own the caller's value,
//! whose `Drop` could call back into the cache) and the listener is called outside it.
//! A listener's panic is caught and counted; it never changes what the cache did.
//!
//! The one read-locked section is a replay hit ([`Cache::claim`]'s first try): it
//! changes no entry, so replays of one shard run side by side, and it counts itself in
//! an atomic beside the lock. Anything else it finds (absent, dead, in progress, a
//! mismatch) is answered by the write-locked claim, which looks again.

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::task::Waker;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;

use crate::config::Config;
use crate::guard::ClaimGuard;
use crate::shard::{Limits, Listed, Shard, FREE_BATCH};
use crate::sync::{
    Arc, AtomicU64, CachePadded, Condvar, Mutex, Ordering, RwLock, RwLockWriteGuard,
};
use crate::wait::WaitForClaim;
use crate::{
    CacheBuilder, Claim, ClaimError, Clock, CorrelationId, EntrySnapshot, Fingerprint, InsertError,
    Key, Outcome, RemovalCause, Replay, ResolveError, Stats, Timestamp, UnknownEntry,
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

/// `repr(C)` with the first field padded to 128 bytes: an `Arc`'s reference counts sit
/// just before its value, and every claim that acquires writes them twice (the guard's
/// handle is cloned and dropped). Were `shards` and `hasher`, which every operation
/// reads, on the counts' cache line, each acquisition on one core would take that line
/// from the other core's next operation (false sharing, measured in the 2-thread mix).
#[repr(C)]
struct Inner {
    shards: CachePadded<Box<[CachePadded<ShardCell>]>>,
    hasher: ahash::RandomState,
    config: Config,
    clock: Box<dyn Clock>,
    /// Removal-listener calls that panicked (caught; see [`Cache::tell`]).
    listener_panics: AtomicU64,
}

/// `repr(C)` keeps the replay counter on the lock word's cache line, which a replay has
/// already taken exclusively to lock.
#[repr(C)]
struct ShardCell {
    /// Replays answered under the read lock (the shard counts the rest itself).
    replayed: AtomicU64,
    shard: RwLock<Shard>,
    /// What `claim_wait`ers sleep on: taken while the shard is still write-locked by a
    /// waiter about to sleep and by a notifier, so a wake-up cannot fall between a
    /// waiter's last look and its sleep.
    sleep: Mutex<()>,
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
        let n = config.shards;
        let limits = Limits {
            // Rounded down, so the shards together never hold more than the bounds;
            // `build` keeps each share at least its floor (512 entries, 64 KiB).
            max_entries: config.max_entries / n,
            max_bytes: config.max_bytes / n,
            // MIN_TICK keeps this at least 1000 ns; a tick of whole nanoseconds is exact.
            tick_nanos: config.tick.as_nanos() as u64,
        };
        let hasher = ahash::RandomState::new();
        // Tokens start at the wall clock, so a restarted process issues larger ones
        // than before (see `FencingToken`).
        let token_base = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX / 2));
        let shards = (0..n)
            .map(|i| {
                CachePadded(ShardCell {
                    replayed: AtomicU64::new(0),
                    shard: RwLock::new(Shard::new(
                        hasher.clone(),
                        i,
                        n,
                        token_base,
                        limits,
                        config.listener.is_some(),
                        config.lapse_policy.unknown_ttl(),
                    )),
                    sleep: Mutex::new(()),
                    changed: Condvar::new(),
                })
            })
            .collect();
        Cache {
            inner: Arc::new(Inner {
                shards: CachePadded(shards),
                hasher,
                config,
                clock,
                listener_panics: AtomicU64::new(0),
            }),
        }
    }

    /// The key's table hash and shard. Bits 40.. pick the shard, so they stay independent
    /// of bits 0–31, which the shard's table uses (see `shard::table_hash`).
    #[inline]
    fn locate(&self, key: &Key) -> (u64, usize) {
        let hash = self.inner.hasher.hash_one(key.as_bytes());
        let shard = (hash >> 40) as usize & (self.inner.shards.len() - 1);
        (crate::shard::table_hash(hash), shard)
    }

    /// The current time on the cache's clock: what [`Claim`]'s and [`Replay`](crate::Replay)'s
    /// timestamps are measured against.
    #[inline]
    pub fn now(&self) -> Timestamp {
        self.inner.clock.now()
    }

    /// How long from now until `at` on the cache's clock (zero if it has passed): e.g.
    /// a `Retry-After` from [`Claim::InProgress`]'s `lease_ends_at`.
    pub fn time_until(&self, at: Timestamp) -> Duration {
        at.saturating_duration_since(self.now())
    }

    /// The wall-clock time of a timestamp on the cache's clock, for logs and stored
    /// records: the system's time now, moved by the timestamp's distance from the
    /// cache's now. As exact as the two clocks agree on how much time passed.
    pub fn system_time(&self, at: Timestamp) -> SystemTime {
        let (now, wall) = (self.now(), SystemTime::now());
        let moved = if at >= now {
            wall.checked_add(at.saturating_duration_since(now))
        } else {
            wall.checked_sub(now.saturating_duration_since(at))
        };
        moved.unwrap_or(wall)
    }

    /// The timestamp on the cache's clock of a wall-clock time, the inverse of
    /// [`Cache::system_time`]: e.g. to [`insert`](Cache::insert) a record whose times a
    /// database kept. Times before the clock's origin read as its origin.
    pub fn timestamp_at(&self, at: SystemTime) -> Timestamp {
        let (now, wall) = (self.now(), SystemTime::now());
        match at.duration_since(wall) {
            Ok(ahead) => now.saturating_add(ahead),
            Err(behind) => now.saturating_sub(behind.duration()),
        }
    }

    /// The largest result kept with its body (`max_result_size`): a larger one is
    /// recorded as completed-without-body.
    pub fn max_result_size(&self) -> usize {
        self.inner.config.max_result_size
    }

    /// How long a completed result is replayed
    /// ([`completed_ttl`](crate::CacheBuilder::completed_ttl)): e.g. how long the
    /// consumer inbox's pre-filter remembers a committed message.
    pub fn completed_ttl(&self) -> Duration {
        self.inner.config.completed_ttl
    }

    /// The lease a claim takes ([`lease`](crate::CacheBuilder::lease)).
    pub fn lease(&self) -> Duration {
        self.inner.config.lease
    }

    /// How long an UNKNOWN a guard marked blocks its key
    /// ([`unknown_ttl`](crate::CacheBuilder::unknown_ttl)).
    pub fn unknown_ttl(&self) -> Duration {
        self.inner.config.unknown_ttl
    }

    /// What a [`ClaimGuard`] dropped without an outcome does ([`DropPolicy`](crate::DropPolicy)): for layers
    /// that settle an abandoned execution the way the cache would.
    pub fn drop_policy(&self) -> crate::DropPolicy {
        self.inner.config.drop_policy
    }

    /// What a lapsed lease becomes ([`LapsePolicy`](crate::LapsePolicy)).
    pub fn lapse_policy(&self) -> crate::LapsePolicy {
        self.inner.config.lapse_policy
    }

    pub(crate) fn config(&self) -> &Config {
        &self.inner.config
    }

    /// Runs `f` on one shard under its lock, with the time read after locking; then wakes
    /// `claim_wait`ers if an entry left PROCESSING, and after unlocking tells the removal
    /// listener what left. Every operation on a shard goes through here.
    #[inline]
    pub(crate) fn with_shard<T>(
        &self,
        shard: usize,
        f: impl FnOnce(&mut Shard, Timestamp, &Config) -> T,
    ) -> T {
        let cell = &self.inner.shards[shard];
        let mut guard = cell.shard.write();
        let now = self.now();
        let out = f(&mut guard, now, &self.inner.config);
        // An entry that left PROCESSING with nobody waiting on the shard wakes nobody:
        // cleared here, it spares the common completion the out-of-line epilogue. (A
        // waiter registers under this lock, after looking, so none can be missed.)
        if guard.deferred.left_processing && !guard.deferred.has_waiters() {
            guard.deferred.left_processing = false;
        }
        if guard.deferred.is_pending() {
            self.epilogue(guard, cell);
        }
        out
    }

    /// The end of a locked section that did more than answer: wake waiters if an entry
    /// left PROCESSING; then, unlocked, free a few departed results and tell the listener
    /// what left. Out of line, so the common path carries none of it.
    #[cold]
    #[inline(never)]
    fn epilogue(&self, mut guard: RwLockWriteGuard<'_, Shard>, cell: &ShardCell) {
        let mut woken = Vec::new();
        if std::mem::take(&mut guard.deferred.left_processing) {
            if guard.deferred.waiters > 0 {
                let _sleeping = cell.sleep.lock();
                cell.changed.notify_all();
            }
            woken = guard.deferred.wakers.take_all();
        }
        let freed: [Option<Bytes>; FREE_BATCH] =
            std::array::from_fn(|_| guard.deferred.graveyard.pop());
        let removed = std::mem::take(&mut guard.deferred.removed);
        drop(guard);
        drop(freed);
        for (_, waker) in woken {
            waker.wake();
        }
        self.tell(removed);
    }

    /// Hands removals to the listener; called with no lock held. A panicking call is
    /// caught and counted ([`Stats::listener_panics`]): the removal happened whatever
    /// the listener does, the caller still gets its answer (a guard it acquired is not
    /// dropped by someone else's panic), and the other removals are still told.
    fn tell(&self, removed: Vec<(Key, RemovalCause)>) {
        if let Some(listener) = &self.inner.config.listener {
            for (key, cause) in &removed {
                if let Err(payload) = catch_unwind(AssertUnwindSafe(|| listener(key, *cause))) {
                    self.inner.listener_panics.fetch_add(1, Ordering::Relaxed);
                    // Not dropped: a payload's own `Drop` may panic too (`panic_any`),
                    // and that would escape here. Leaking one small box per panic is
                    // the price of never unwinding out of `tell`.
                    std::mem::forget(payload);
                }
            }
        }
    }

    /// Claims `key` for a request with `fingerprint`, atomically.
    ///
    /// Exactly one of any number of concurrent callers gets [`Claim::Acquired`]; the
    /// others get the stored result, "in progress", "unknown" or a mismatch. A key whose
    /// owner's lease has lapsed is taken over with a new fencing token, or under
    /// [`LapsePolicy::MarkUnknown`](crate::LapsePolicy::MarkUnknown) answers
    /// [`Claim::Unknown`] (marked at the lease's end).
    ///
    /// Fails closed with [`ClaimError::CapacityExhausted`] when the key's shard is full
    /// and holds nothing evictable (only in-flight and unknown entries): do not execute.
    #[inline]
    pub fn claim(&self, key: &Key, fingerprint: Fingerprint) -> Result<Claim, ClaimError> {
        self.claim_correlated(key, fingerprint, None)
    }

    /// [`claim`](Cache::claim), keeping `correlation_id` with the entry if the claim
    /// acquires the key: what joins the entry to the request's logs and trace
    /// ([`CorrelationId::from_traceparent`]). It stays with the entry through completion
    /// and an UNKNOWN mark, until the entry leaves; [`peek`](Cache::peek) and snapshots
    /// show it. A claim answered from an entry already there changes nothing.
    ///
    /// Costs nothing when `None`; otherwise the id's length and a few bytes of the
    /// shard's table ([`CORRELATION_ID_OVERHEAD`](crate::CORRELATION_ID_OVERHEAD)),
    /// charged against the byte bound with the entry. An entry the bound has room for
    /// only without its id is kept without it: the id is never why a claim is refused.
    ///
    /// ```
    /// use idemcache::{Cache, Claim, CorrelationId, Fingerprint, Key};
    ///
    /// let cache = Cache::builder().build()?;
    /// let key = Key::without_tenant("POST /orders", "order-7")?;
    /// let trace = CorrelationId::new("4bf92f3577b34da6a3ce929d0e0e4736")?;
    /// let Claim::Acquired(guard) = cache.claim_correlated(&key, Fingerprint::of(b"r"), Some(&trace))?
    /// else { unreachable!() };
    /// guard.complete("done")?;
    /// assert_eq!(cache.peek(&key).unwrap().correlation_id, Some(trace));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn claim_correlated(
        &self,
        key: &Key,
        fingerprint: Fingerprint,
        correlation_id: Option<&CorrelationId>,
    ) -> Result<Claim, ClaimError> {
        let (hash, shard) = self.locate(key);
        if let Some(replay) = self.replay_at(hash, shard, key, fingerprint) {
            return Ok(Claim::Completed(replay));
        }
        self.claim_at(hash, shard, key, fingerprint, correlation_id)
    }

    /// [`claim_correlated`](Cache::claim_correlated) without asking the read lock first:
    /// for a caller that just did ([`Cache::replay_hit`]) and had no replay.
    #[cfg(feature = "tower")]
    pub(crate) fn claim_locked(
        &self,
        key: &Key,
        fingerprint: Fingerprint,
        correlation_id: Option<&CorrelationId>,
    ) -> Result<Claim, ClaimError> {
        let (hash, shard) = self.locate(key);
        self.claim_at(hash, shard, key, fingerprint, correlation_id)
    }

    /// The write lock's part of a claim of `key`, located at `hash` in `shard`.
    fn claim_at(
        &self,
        hash: u64,
        shard: usize,
        key: &Key,
        fingerprint: Fingerprint,
        correlation_id: Option<&CorrelationId>,
    ) -> Result<Claim, ClaimError> {
        self.with_shard(shard, |s, now, cfg| {
            s.claim(
                hash,
                key,
                fingerprint,
                correlation_id,
                now,
                cfg,
                |slot, token, lease_ends_at, took_over| {
                    self.guard(shard, slot, token, lease_ends_at, took_over)
                },
            )
        })
    }

    /// The claim answer that reads without writing: the stored result, if `key` has a
    /// live COMPLETED entry for this request and it can be shared under the read lock
    /// (counted as a replay); `None` leaves the answer to a claim. The layer asks this
    /// first when it would read a correlation id only for a claim that may acquire.
    #[cfg(feature = "tower")]
    #[inline]
    pub(crate) fn replay_hit(&self, key: &Key, fingerprint: Fingerprint) -> Option<Replay> {
        let (hash, shard) = self.locate(key);
        self.replay_at(hash, shard, key, fingerprint)
    }

    /// [`replay_hit`](Cache::replay_hit) of `key`, located at `hash` in `shard`.
    #[inline]
    fn replay_at(
        &self,
        hash: u64,
        shard: usize,
        key: &Key,
        fingerprint: Fingerprint,
    ) -> Option<Replay> {
        let cell = &self.inner.shards[shard];
        let s = cell.shard.read();
        let replay = s.replay(hash, key, fingerprint, || self.now())?;
        cell.replayed.fetch_add(1, Ordering::Relaxed);
        Some(replay)
    }

    fn guard(
        &self,
        shard: usize,
        slot: u32,
        token: u64,
        lease_ends_at: Timestamp,
        took_over: bool,
    ) -> Claim {
        let ticket = Ticket { shard, slot, token };
        Claim::Acquired(ClaimGuard::new(self.clone(), ticket, lease_ends_at, took_over))
    }

    /// Claims `key`, waiting up to `timeout` while another caller is executing it.
    ///
    /// Returns what a fresh claim would once the key leaves PROCESSING: the stored result,
    /// "unknown", or [`Claim::Acquired`] if the owner released the key or its lease
    /// lapsed (under [`LapsePolicy::MarkUnknown`](crate::LapsePolicy::MarkUnknown) a
    /// lapse answers "unknown"). If `timeout` passes first, returns [`Claim::InProgress`].
    ///
    /// **This blocks the calling thread** for up to `timeout`. Do not call it on an
    /// async runtime's worker thread: on a current-thread runtime the owner cannot run
    /// while the waiter holds the only thread, so the wait always times out. Async code
    /// uses [`Cache::claim_wait_async`].
    ///
    /// `timeout` is real time (the thread really sleeps); lease ends are read on the
    /// cache's clock. A waiter sleeps on its shard's condvar, so it costs nothing while it
    /// waits and cannot miss the wake-up: the state is re-checked under the same lock the
    /// owner's outcome is written under. One call counts one answer in [`Stats`], the
    /// one it returns, however often it woke.
    pub fn claim_wait(
        &self,
        key: &Key,
        fingerprint: Fingerprint,
        timeout: Duration,
    ) -> Result<Claim, ClaimError> {
        let give_up = Instant::now().checked_add(timeout);
        let (hash, shard) = self.locate(key);
        let cell = &self.inner.shards[shard];
        let mut guard = cell.shard.write();
        loop {
            let now = self.now();
            let claim = guard.claim(
                hash,
                key,
                fingerprint,
                None,
                now,
                &self.inner.config,
                |slot, token, lease_ends_at, took_over| {
                    self.guard(shard, slot, token, lease_ends_at, took_over)
                },
            );
            let lease_ends_at = match claim {
                Ok(Claim::InProgress { lease_ends_at, .. }) => lease_ends_at,
                _ => {
                    self.epilogue(guard, cell);
                    return claim;
                }
            };
            let left =
                give_up.map_or(Duration::MAX, |at| at.saturating_duration_since(Instant::now()));
            if left.is_zero() {
                self.epilogue(guard, cell);
                return claim;
            }
            // Not this call's answer: it counts the one it returns.
            guard.counters.in_progress -= 1;
            // Wake at the lease's end at the latest: a lapse is noticed by whoever looks.
            let nap = left.min(lease_ends_at.saturating_duration_since(now));
            // Registered and holding `sleep` before the shard unlocks: a notifier needs
            // both, so it cannot slip in before this thread sleeps.
            guard.deferred.waiters += 1;
            let sleeping = cell.sleep.lock();
            drop(guard);
            drop(cell.changed.wait_timeout(sleeping, nap));
            guard = cell.shard.write();
            guard.deferred.waiters -= 1;
        }
    }

    /// Claims `key`, waiting asynchronously while another caller is executing it: the
    /// async counterpart of [`Cache::claim_wait`], for async services.
    ///
    /// The future resolves to what a fresh claim returns once the key leaves PROCESSING
    /// (the owner completed, released or marked it unknown, or it was removed) or its
    /// owner's lease lapsed (the future then takes the key over: [`Claim::Acquired`]).
    /// It wakes on the same transitions as `claim_wait`, with no thread blocked.
    ///
    /// The core has no runtime: `sleep` is your runtime's sleep (`tokio::time::sleep`,
    /// or any `FnMut(Duration) -> impl Future`), used only to look again when the lease
    /// seen last should have lapsed: no transition announces a lapse, so with a sleep that
    /// never ends a lapse is noticed only when something else wakes the future. Bound the
    /// wait with your runtime's timeout; dropping the future there is safe (it withdraws
    /// its waker, and never holds a claim):
    ///
    /// ```ignore
    /// // with tokio:
    /// let waited = tokio::time::timeout(
    ///     Duration::from_secs(3),
    ///     cache.claim_wait_async(&key, fp, tokio::time::sleep),
    /// )
    /// .await;
    /// let claim = match waited {
    ///     Ok(claim) => claim?,
    ///     Err(_elapsed) => cache.claim(&key, fp)?, // still in progress: 409 + Retry-After
    /// };
    /// ```
    ///
    /// Counts in [`Stats`] the one answer it resolves to (none if dropped before), and is
    /// counted in [`Stats::waiting`] while its waker is filed (between a wake-up and its
    /// next poll it is not). Waking is per shard: a future is woken when any entry of its
    /// shard leaves PROCESSING, and looks again.
    pub fn claim_wait_async<F, S>(
        &self,
        key: &Key,
        fingerprint: Fingerprint,
        sleep: F,
    ) -> WaitForClaim<F, S>
    where
        F: FnMut(Duration) -> S,
        S: std::future::Future,
    {
        WaitForClaim::new(self.clone(), key.clone(), fingerprint, sleep)
    }

    /// [`WaitForClaim`]'s look: claims as [`Cache::claim`] does, under the write lock; if
    /// the key is still PROCESSING, files `waker` under that same lock (so the transition
    /// that ends PROCESSING wakes it) and un-counts the answer, which is not the last;
    /// otherwise withdraws the future's waker. Wakers replaced or withdrawn, and an
    /// unused clone, are dropped after unlocking.
    pub(crate) fn claim_or_file(
        &self,
        key: &Key,
        fingerprint: Fingerprint,
        correlation_id: Option<&CorrelationId>,
        filed: &mut Option<u64>,
        waker: Waker,
    ) -> Result<Claim, ClaimError> {
        let (hash, shard) = self.locate(key);
        let mut waker = Some(waker);
        let (claim, unfiled) = self.with_shard(shard, |s, now, cfg| {
            let acquired = |slot, token, lease_ends_at, took_over| {
                self.guard(shard, slot, token, lease_ends_at, took_over)
            };
            let claim = s.claim(hash, key, fingerprint, correlation_id, now, cfg, acquired);
            let unfiled = if let Ok(Claim::InProgress { .. }) = claim {
                s.counters.in_progress -= 1;
                s.deferred.wakers.file(filed, waker.take().expect("taken once"))
            } else {
                filed.take().and_then(|id| s.deferred.wakers.withdraw(id))
            };
            (claim, unfiled)
        });
        drop((waker, unfiled));
        claim
    }

    /// Takes a dropped [`WaitForClaim`]'s waker out of its shard's list.
    pub(crate) fn withdraw_waker(&self, key: &Key, id: u64) {
        let (_, shard) = self.locate(key);
        let unfiled = self.with_shard(shard, |s, _, _| s.deferred.wakers.withdraw(id));
        drop(unfiled);
    }

    /// Records the result of an UNKNOWN entry after checking the authority:
    /// UNKNOWN → COMPLETED. Repeats then replay `result`.
    pub fn resolve(&self, key: &Key, result: impl crate::IntoBytes) -> Result<(), ResolveError> {
        let (hash, shard) = self.locate(key);
        let mut body = Some(result.into_bytes());
        // What the shard does not keep is dropped here, after unlocking.
        self.with_shard(shard, |s, now, cfg| s.resolve(hash, key, None, &mut body, now, cfg))
    }

    /// [`Cache::resolve`] of the entry `listed` saw, with a body or none (completed without
    /// a body), for [`Cache::reconcile`]: refused as not UNKNOWN if the key's entry is
    /// another one by now.
    pub(crate) fn resolve_listed(
        &self,
        listed: &UnknownEntry,
        body: Option<Bytes>,
    ) -> Result<(), ResolveError> {
        let (hash, shard) = self.locate(&listed.key);
        let mut body = body;
        let seen = Listed { token: listed.token.get() };
        self.with_shard(shard, |s, now, cfg| {
            s.resolve(hash, &listed.key, Some(seen), &mut body, now, cfg)
        })
    }

    /// [`Cache::forget`] of the entry `listed` saw, as [`Cache::resolve_listed`].
    pub(crate) fn forget_listed(&self, listed: &UnknownEntry) -> Result<(), ResolveError> {
        let (hash, shard) = self.locate(&listed.key);
        let seen = Listed { token: listed.token.get() };
        self.with_shard(shard, |s, now, _| s.forget(hash, &listed.key, Some(seen), now))
    }

    /// Puts a fact learned elsewhere into the cache (warming it from a database,
    /// restoring it after a restart, remembering that a key belongs to one request),
    /// keeping its original times: absent → COMPLETED or UNKNOWN, no claim and no
    /// execution involved. Counted in [`Stats::inserted`], not as an acquisition or a
    /// completion.
    ///
    /// Fenced against claims: refused with [`InsertError::Occupied`] if the key has a
    /// live entry, whatever its state, so a fact never displaces an owner executing the
    /// key (or an outcome the cache already holds). A body over `max_result_size` is
    /// kept as completed-without-body, as [`ClaimGuard::complete`](crate::ClaimGuard::complete)
    /// does. For eviction an inserted result counts as completed when inserted.
    pub fn insert(
        &self,
        key: &Key,
        fingerprint: Fingerprint,
        known: Outcome,
    ) -> Result<(), InsertError> {
        self.insert_correlated(key, fingerprint, known, None)
    }

    /// [`insert`](Cache::insert), with the correlation id of the claim the fact came
    /// from (a store's record, a snapshot's entry) kept with the entry, as
    /// [`claim_correlated`](Cache::claim_correlated) keeps a claim's (and as it does,
    /// without the id if only the fact fits: a mark is never left out for its id).
    pub fn insert_correlated(
        &self,
        key: &Key,
        fingerprint: Fingerprint,
        known: Outcome,
        correlation_id: Option<&CorrelationId>,
    ) -> Result<(), InsertError> {
        let (hash, shard) = self.locate(key);
        let mut known = known;
        // What the shard does not keep of `known` is dropped here, after unlocking.
        self.with_shard(shard, |s, now, cfg| {
            s.insert_known(hash, key, fingerprint, &mut known, correlation_id, now, cfg)
        })
    }

    /// Up to `limit` live UNKNOWN entries, those marked longest ago first, for a
    /// reconciler to check against the authority and then
    /// [`resolve`](Cache::resolve) or [`forget`](Cache::forget).
    ///
    /// Takes each shard's read lock in turn and walks its list of UNKNOWN entries (it
    /// never scans the map) for the `limit` marked longest ago: `O(u log u)` for `u`
    /// UNKNOWN entries, sorted by `marked_at` (a fact [`insert`](Cache::insert)ed with
    /// an older mark is listed before entries marked since). Entries you cannot settle
    /// yet are listed again, first, on the next call.
    ///
    /// Under [`LapsePolicy::MarkUnknown`](crate::LapsePolicy::MarkUnknown) it lists the
    /// leases that lapsed too: each shard is first swept as
    /// [`run_pending`](Cache::run_pending) sweeps it (write-locked, in bounded steps),
    /// which turns them UNKNOWN and reclaims what is dead; its cost is what is due.
    pub fn list_unknown(&self, limit: usize) -> Vec<UnknownEntry> {
        let mut all = Vec::new();
        let lapses =
            matches!(self.inner.config.lapse_policy, crate::LapsePolicy::MarkUnknown { .. });
        for (i, cell) in self.inner.shards.iter().enumerate() {
            if lapses {
                // Listed under the lock that finished the sweep: nothing lapsed between.
                all.extend(self.swept(i, |s, now| s.list_unknown(limit, now)).1);
                continue;
            }
            let shard = cell.shard.read();
            all.extend(shard.list_unknown(limit, self.now()));
        }
        all.sort_by_key(|e| e.marked_at);
        all.truncate(limit);
        all
    }

    /// Drops an UNKNOWN entry after checking the authority found no effect:
    /// UNKNOWN → absent, so the next claim executes.
    pub fn forget(&self, key: &Key) -> Result<(), ResolveError> {
        let (hash, shard) = self.locate(key);
        self.with_shard(shard, |s, now, _| s.forget(hash, key, None, now))
    }

    /// Looks at a key's live entry without changing its state or any answer counter
    /// (under [`LapsePolicy::MarkUnknown`](crate::LapsePolicy::MarkUnknown) a lapsed
    /// lease shows, and is from then on kept, as the UNKNOWN it already is).
    pub fn peek(&self, key: &Key) -> Option<EntrySnapshot> {
        let (hash, shard) = self.locate(key);
        self.with_shard(shard, |s, now, _| s.peek(hash, key, now))
    }

    /// Removes a key's live entry in any state and returns what it was.
    ///
    /// Removing a PROCESSING entry fences its owner (its guard gets
    /// [`LeaseLost`](crate::LeaseLost)) and lets the next claim execute again: use it only
    /// when you know the owner is gone. Waiters in `claim_wait` are woken.
    pub fn remove(&self, key: &Key) -> Option<EntrySnapshot> {
        let (hash, shard) = self.locate(key);
        self.with_shard(shard, |s, now, _| s.remove(hash, key, now))
    }

    /// Reclaims every expired entry now, shard by shard, and returns how many; also frees
    /// the results of departed entries that operations have not freed yet. Each shard is
    /// swept in bounded steps, releasing its lock between them. For CLIs and tests;
    /// services may prefer [`Cache::spawn_sweeper`].
    pub fn run_pending(&self) -> usize {
        (0..self.inner.shards.len()).map(|shard| self.swept(shard, |_, _| ()).0).sum()
    }

    /// Sweeps one shard of everything due, in bounded write-locked steps, then runs
    /// `last` under the lock of the step that finished; returns how many entries it
    /// reclaimed and what `last` returned.
    fn swept<T>(&self, shard: usize, last: impl Fn(&mut Shard, Timestamp) -> T) -> (usize, T) {
        /// Wheel moves per locked step: short enough not to stall a shard's callers.
        const STEP: usize = 1024;
        let mut reclaimed = 0;
        loop {
            let (n, out, freed) = self.with_shard(shard, |s, now, _| {
                let (mut n, swept) = s.sweep(now, STEP);
                let out = swept.then(|| {
                    // What died since the current tick began, too: "every expired
                    // entry", not every one a whole tick ago.
                    n += s.reclaim_within_tick(now);
                    last(s, now)
                });
                (n, out, std::mem::take(&mut s.deferred.graveyard))
            });
            // Dropped unlocked: departed results may own the caller's values.
            drop(freed);
            reclaimed += n;
            if let Some(out) = out {
                return (reclaimed, out);
            }
        }
    }

    /// Starts a thread that calls [`Cache::run_pending`] every `interval` (real time),
    /// until the returned handle is dropped. Ordinary operations already reclaim expired
    /// entries a little at a time; the sweeper returns memory promptly in a cache that
    /// goes quiet.
    #[cfg(not(idemcache_loom))]
    pub fn spawn_sweeper(&self, interval: Duration) -> Result<Sweeper, SweeperError> {
        crate::config::check_duration(interval).map_err(SweeperError::InvalidInterval)?;
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let cache = self.clone();
        let thread = std::thread::Builder::new()
            .name("idemcache-sweeper".into())
            .spawn(move || loop {
                cache.run_pending();
                match stopped.recv_timeout(interval) {
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => continue,
                    _ => return,
                }
            })
            .map_err(SweeperError::Spawn)?;
        Ok(Sweeper { stop: Some(stop), thread: Some(thread) })
    }

    /// Counters since the cache was built, and what it holds now.
    pub fn stats(&self) -> Stats {
        let mut stats = Stats::default();
        for cell in self.inner.shards.iter() {
            let shard = cell.shard.read();
            let waiting = shard.deferred.waiters + shard.deferred.wakers.len();
            stats.add(&shard.counters, shard.entries(), shard.bytes(), waiting);
            stats.replayed += cell.replayed.load(Ordering::Relaxed);
        }
        stats.listener_panics = self.inner.listener_panics.load(Ordering::Relaxed);
        stats
    }

    /// Every live entry of shard `shard` as a fact [`Cache::insert_correlated`]
    /// restores, copied under that shard's lock alone (see `Shard::export`): for
    /// snapshots, one shard at a time while the others serve.
    pub(crate) fn export_shard(&self, shard: usize) -> Vec<crate::shard::Exported> {
        self.with_shard(shard, |s, now, cfg| {
            let mut out = Vec::new();
            s.export(now, cfg, &mut out);
            out
        })
    }

    /// The number of shards (a power of two).
    pub fn shard_count(&self) -> usize {
        self.inner.shards.len()
    }

    /// Re-counts every shard's entries and bytes, re-walks its wheel and age list, and
    /// panics if anything drifted. For tests and fuzzing; takes each shard lock in turn.
    #[doc(hidden)]
    pub fn debug_validate(&self) {
        for cell in self.inner.shards.iter() {
            cell.shard.read().validate();
        }
    }
}

/// A background sweeper from [`Cache::spawn_sweeper`]; dropping it stops the thread and
/// waits for it.
#[cfg(not(idemcache_loom))]
#[derive(Debug)]
pub struct Sweeper {
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[cfg(not(idemcache_loom))]
impl Drop for Sweeper {
    fn drop(&mut self) {
        // Disconnecting the channel wakes the thread at once.
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            // A panic in the sweeper is a bug already reported on stderr; do not panic
            // again in a destructor.
            let _ = thread.join();
        }
    }
}

/// Why [`Cache::spawn_sweeper`] could not start.
#[derive(Debug)]
#[non_exhaustive]
pub enum SweeperError {
    /// The interval is zero or longer than [`MAX_DURATION`](crate::MAX_DURATION).
    InvalidInterval(Duration),
    /// The operating system refused a thread.
    Spawn(std::io::Error),
}

impl fmt::Display for SweeperError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SweeperError::InvalidInterval(d) => {
                crate::error::invalid_duration(f, "sweeper interval", *d)
            }
            SweeperError::Spawn(e) => write!(f, "could not start the sweeper thread: {e}"),
        }
    }
}

impl std::error::Error for SweeperError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SweeperError::Spawn(e) => Some(e),
            SweeperError::InvalidInterval(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Slots freed anywhere in the slab (here in its second and third segments) are
    /// taken by new keys before the slab grows.
    #[test]
    fn freed_slots_are_reused_before_the_slab_grows() {
        const FULL: usize = 40_000;
        let cache = Cache::builder().shards(1).max_entries(2 * FULL).build().unwrap();
        let key = |i: usize| Key::new("POST /x", "t", format!("k{i}")).unwrap();
        let claim_complete = |i: usize| match cache.claim(&key(i), Fingerprint::of(b"r")) {
            Ok(Claim::Acquired(guard)) => guard.complete(bytes::Bytes::new()).unwrap(),
            other => panic!("k{i}: {other:?}"),
        };
        (0..FULL).for_each(claim_complete);
        let slab = || cache.inner.shards[0].shard.read().slab_len();
        assert_eq!(slab(), FULL);
        let removed = (17_000..39_000).step_by(7).filter(|&i| cache.remove(&key(i)).is_some());
        let removed = removed.count();
        assert_eq!(removed, 3_143);
        (FULL..FULL + removed).for_each(claim_complete);
        assert_eq!(slab(), FULL, "the new keys took the freed slots");
        claim_complete(FULL + removed);
        assert_eq!(slab(), FULL + 1, "and the next one grew the slab");
        cache.debug_validate();
    }
}
