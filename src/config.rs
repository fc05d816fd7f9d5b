//! [`CacheBuilder`]: every setting of a cache, checked once at `build()`.
//!
//! Invariant: a [`Config`] that exists is valid (positive, bounded durations and sizes, a
//! power-of-two shard count), so nothing downstream re-checks or can overflow on it.

use std::fmt;
use std::time::Duration;

use crate::{BuildError, Cache, Clock, Key, LapsePolicy, RemovalCause, SystemClock};

/// A function told about every entry that leaves the cache, and why.
pub(crate) type Listener = std::sync::Arc<dyn Fn(&Key, RemovalCause) + Send + Sync>;

/// The finest wheel tick accepted.
pub const MIN_TICK: Duration = Duration::from_micros(1);

/// The coarsest wheel tick accepted: one hour.
pub const MAX_TICK: Duration = Duration::from_secs(3600);

/// A shard never gets fewer entries than this: the shard count is lowered for small caches.
pub(crate) const MIN_ENTRIES_PER_SHARD: usize = 512;

/// A shard never gets fewer bytes than this: the shard count is lowered for small caches.
pub(crate) const MIN_BYTES_PER_SHARD: usize = 64 * 1024;

/// A shard's byte share holds at least this many results of `max_result_size`: the shard
/// count is lowered until it does.
pub(crate) const MAX_RESULTS_PER_SHARD_AT_LEAST: usize = 4;

/// The longest TTL or lease the cache accepts: 100 years. Longer is a bug in the caller
/// (and would overflow deadline arithmetic).
pub const MAX_DURATION: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// The most shards a cache may have.
pub const MAX_SHARDS: usize = 1 << 16;

/// The largest `max_result_size` accepted: 1 GiB.
pub const MAX_RESULT_SIZE_LIMIT: usize = 1 << 30;

/// What a [`ClaimGuard`](crate::ClaimGuard) dropped without an outcome does to its key
/// (an early return, a `?`, a panic).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DropPolicy {
    /// Release the key so a retry can execute. Right when an abandoned execution had no
    /// external effect (or the effect is itself idempotent).
    #[default]
    Release,
    /// Mark the outcome UNKNOWN so nobody re-executes blindly. Right for operations with
    /// external effects (a charge, an email) that may have happened before the drop.
    MarkUnknown,
}

/// The validated settings of one cache.
#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) shards: usize,
    pub(crate) completed_ttl: Duration,
    pub(crate) lease: Duration,
    pub(crate) unknown_ttl: Duration,
    pub(crate) drop_policy: DropPolicy,
    pub(crate) lapse_policy: LapsePolicy,
    pub(crate) max_result_size: usize,
    pub(crate) tick: Duration,
    pub(crate) max_entries: usize,
    pub(crate) max_bytes: usize,
    pub(crate) listener: Option<Listener>,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("shards", &self.shards)
            .field("completed_ttl", &self.completed_ttl)
            .field("lease", &self.lease)
            .field("unknown_ttl", &self.unknown_ttl)
            .field("drop_policy", &self.drop_policy)
            .field("lapse_policy", &self.lapse_policy)
            .field("max_result_size", &self.max_result_size)
            .field("tick", &self.tick)
            .field("max_entries", &self.max_entries)
            .field("max_bytes", &self.max_bytes)
            .field("listener", &self.listener.is_some())
            .finish()
    }
}

/// Builds a [`Cache`]; start with [`Cache::builder`].
///
/// Defaults: `available_parallelism() * 4` shards (rounded up to a power of two),
/// completed results kept 24 h, leases of 60 s, unknown outcomes kept 24 h,
/// [`DropPolicy::Release`], [`LapsePolicy::TakeOver`], results up to 64 KiB kept, at most 1,000,000 entries and
/// 512 MiB, a 1 s wheel tick, no removal listener, [`SystemClock`].
///
/// The bounds are enforced per shard, each shard holding `max_entries / shards` entries
/// and `max_bytes / shards` bytes (rounded down, so the total never exceeds either
/// bound), as in quick_cache: that keeps eviction a shard-local step under one lock. For
/// small caches the shard count is lowered so each shard's share is at least 512
/// entries, 64 KiB and four times `max_result_size` (so that keeping one result of the
/// largest size never needs much more than a quarter of a shard evicted).
///
/// Keys do not spread over shards exactly evenly, so the fullest shard reaches its
/// share before the cache reaches `max_entries`, and a full shard evicts while others
/// have room. Measured with distinct keys on a 2-core machine (default: 8 shards, and
/// fewer for the smaller bounds; the figures move with the hash's random seed): a bound
/// of 4,000 (4 shards) first evicted at 3,808 to 3,961 entries and held 3,700 to 3,860
/// after 4,000 inserts; 10,000 (8 shards): 9,500 to 9,740 and ~9,400; 100,000: ~98,000
/// and ~96,000 to 97,500; a bound under 1,024 is one shard and holds exactly its bound.
/// Size `max_entries` a few percent above the entries you need kept, or build with
/// [`shards(1)`](CacheBuilder::shards) for an exact bound (one lock for every
/// operation).
///
/// ```
/// use std::time::Duration;
/// use idemcache::{Cache, DropPolicy};
///
/// let cache = Cache::builder()
///     .lease(Duration::from_secs(30))
///     .drop_policy(DropPolicy::MarkUnknown)
///     .build()?;
/// # Ok::<(), idemcache::BuildError>(())
/// ```
pub struct CacheBuilder {
    shards: Option<usize>,
    completed_ttl: Duration,
    lease: Duration,
    unknown_ttl: Duration,
    drop_policy: DropPolicy,
    lapse_policy: LapsePolicy,
    max_result_size: usize,
    tick: Duration,
    max_entries: usize,
    max_bytes: usize,
    listener: Option<Listener>,
    clock: Box<dyn Clock>,
}

impl fmt::Debug for CacheBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CacheBuilder")
            .field("shards", &self.shards)
            .field("completed_ttl", &self.completed_ttl)
            .field("lease", &self.lease)
            .field("unknown_ttl", &self.unknown_ttl)
            .field("drop_policy", &self.drop_policy)
            .field("lapse_policy", &self.lapse_policy)
            .field("max_result_size", &self.max_result_size)
            .field("tick", &self.tick)
            .field("max_entries", &self.max_entries)
            .field("max_bytes", &self.max_bytes)
            .field("listener", &self.listener.is_some())
            .field("clock", &self.clock)
            .finish()
    }
}

impl Default for CacheBuilder {
    fn default() -> Self {
        CacheBuilder {
            shards: None,
            completed_ttl: Duration::from_secs(24 * 3600),
            lease: Duration::from_secs(60),
            unknown_ttl: Duration::from_secs(24 * 3600),
            drop_policy: DropPolicy::Release,
            lapse_policy: LapsePolicy::TakeOver,
            max_result_size: 64 * 1024,
            tick: Duration::from_secs(1),
            max_entries: 1_000_000,
            max_bytes: 512 * 1024 * 1024,
            listener: None,
            clock: Box::new(SystemClock::new()),
        }
    }
}

impl CacheBuilder {
    /// Number of shards (independent locks); rounded up to a power of two.
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = Some(shards);
        self
    }

    /// How long a completed result is replayed.
    pub fn completed_ttl(mut self, ttl: Duration) -> Self {
        self.completed_ttl = ttl;
        self
    }

    /// How long an owner holds a key before it may be taken over, unless the owner
    /// extends it with [`ClaimGuard::extend_lease`](crate::ClaimGuard::extend_lease).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How long an UNKNOWN outcome a guard marked ([`ClaimGuard::mark_unknown`](crate::ClaimGuard::mark_unknown),
    /// or a drop under [`DropPolicy::MarkUnknown`]) blocks its key before the key becomes
    /// claimable again. A lapsed lease's UNKNOWN is kept for its
    /// [`LapsePolicy::MarkUnknown`]'s `ttl` instead.
    pub fn unknown_ttl(mut self, ttl: Duration) -> Self {
        self.unknown_ttl = ttl;
        self
    }

    /// What a guard dropped without an outcome does.
    pub fn drop_policy(mut self, policy: DropPolicy) -> Self {
        self.drop_policy = policy;
        self
    }

    /// What a PROCESSING entry whose lease lapsed becomes: taken over by the next claim
    /// ([`LapsePolicy::TakeOver`], the default) or UNKNOWN from the lease's end
    /// ([`LapsePolicy::MarkUnknown`]: marked at the lease's end and kept the policy's
    /// `ttl` from then, which `build` checks as it checks the other TTLs; a claim answers
    /// [`Claim::Unknown`](crate::Claim::Unknown), [`Cache::list_unknown`] lists it, it is
    /// never evicted). The lapsed guard gets [`LeaseLost`](crate::LeaseLost) either way.
    pub fn lapse_policy(mut self, policy: LapsePolicy) -> Self {
        self.lapse_policy = policy;
        self
    }

    /// The largest result body kept for replay; a larger result is recorded as
    /// completed-without-body (the work happened and must not be redone). At most
    /// `max_bytes`; see the shard rule above for how it lowers the shard count. A result
    /// is kept only if it fits, with its key and [`ENTRY_OVERHEAD`](crate::ENTRY_OVERHEAD),
    /// in its shard's share once every other completed entry is evicted: a result as
    /// large as the whole share is kept without its body.
    pub fn max_result_size(mut self, bytes: usize) -> Self {
        self.max_result_size = bytes;
        self
    }

    /// The timing wheel's resolution: an expired entry is reclaimed by the first sweep at
    /// least one tick after its deadline (it reads as absent from its deadline on, swept
    /// or not). Between [`MIN_TICK`] and [`MAX_TICK`].
    pub fn tick(mut self, tick: Duration) -> Self {
        self.tick = tick;
        self
    }

    /// The most entries the cache holds, split evenly across its shards. When a shard
    /// is full, it evicts the oldest tenth of its completed entries; if everything
    /// there is in flight or unknown, claims fail with
    /// [`ClaimError::CapacityExhausted`](crate::ClaimError::CapacityExhausted). A shard
    /// fills before the whole cache does (see [`CacheBuilder`]'s measured figures: a
    /// bound of 10,000 first evicts at about 9,600 entries).
    pub fn max_entries(mut self, entries: usize) -> Self {
        self.max_entries = entries;
        self
    }

    /// The most bytes the cache charges: key, result and
    /// [`ENTRY_OVERHEAD`](crate::ENTRY_OVERHEAD) per entry, and a kept correlation id's
    /// length and [`CORRELATION_ID_OVERHEAD`](crate::CORRELATION_ID_OVERHEAD). Enforced
    /// like `max_entries`; a result that does not fit even after evicting is kept without
    /// its body, and an entry that fits only without its correlation id without the id.
    pub fn max_bytes(mut self, bytes: usize) -> Self {
        self.max_bytes = bytes;
        self
    }

    /// Calls `listener` with every entry that leaves the cache and why, after the shard
    /// lock is released (so it may call back into the cache).
    pub fn removal_listener(
        mut self,
        listener: impl Fn(&Key, RemovalCause) + Send + Sync + 'static,
    ) -> Self {
        self.listener = Some(std::sync::Arc::new(listener));
        self
    }

    /// The clock the cache reads; [`ManualClock`](crate::ManualClock) in tests.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Box::new(clock);
        self
    }

    /// Checks every setting and builds the cache.
    pub fn build(self) -> Result<Cache, BuildError> {
        let requested = match self.shards {
            Some(n) if n == 0 || n > MAX_SHARDS => return Err(BuildError::Shards(n)),
            Some(n) => n,
            None => std::thread::available_parallelism().map_or(4, |n| n.get()) * 4,
        }
        .next_power_of_two()
        .min(MAX_SHARDS);
        if self.max_entries == 0 {
            return Err(BuildError::MaxEntries(self.max_entries));
        }
        if self.max_bytes < MIN_BYTES_PER_SHARD {
            return Err(BuildError::MaxBytes(self.max_bytes));
        }
        if self.tick < MIN_TICK || self.tick > MAX_TICK {
            return Err(BuildError::Tick(self.tick));
        }
        if self.max_result_size == 0 || self.max_result_size > MAX_RESULT_SIZE_LIMIT {
            return Err(BuildError::MaxResultSize(self.max_result_size));
        }
        if self.max_result_size > self.max_bytes {
            return Err(BuildError::MaxResultSizeAboveMaxBytes {
                max_result_size: self.max_result_size,
                max_bytes: self.max_bytes,
            });
        }
        let fit = |total: usize, floor: usize| prev_power_of_two((total / floor).max(1));
        let bytes_floor =
            MIN_BYTES_PER_SHARD.max(self.max_result_size * MAX_RESULTS_PER_SHARD_AT_LEAST);
        let shards = requested
            .min(fit(self.max_entries, MIN_ENTRIES_PER_SHARD))
            .min(fit(self.max_bytes, bytes_floor));
        for (setting, value) in [
            ("completed_ttl", self.completed_ttl),
            ("lease", self.lease),
            ("unknown_ttl", self.unknown_ttl),
        ]
        .into_iter()
        .chain(self.lapse_policy.unknown_ttl().map(|ttl| ("lapse_policy", ttl)))
        {
            check_duration(value).map_err(|value| BuildError::Duration { setting, value })?;
        }
        let config = Config {
            shards,
            completed_ttl: self.completed_ttl,
            lease: self.lease,
            unknown_ttl: self.unknown_ttl,
            drop_policy: self.drop_policy,
            lapse_policy: self.lapse_policy,
            max_result_size: self.max_result_size,
            tick: self.tick,
            max_entries: self.max_entries,
            max_bytes: self.max_bytes,
            listener: self.listener,
        };
        Ok(Cache::from_parts(config, self.clock))
    }
}

/// The largest power of two at most `n` (`n >= 1`).
fn prev_power_of_two(n: usize) -> usize {
    1 << (usize::BITS - 1 - n.leading_zeros())
}

/// A TTL or lease must be positive and at most [`MAX_DURATION`].
pub(crate) fn check_duration(d: Duration) -> Result<Duration, Duration> {
    if d.is_zero() || d > MAX_DURATION {
        Err(d)
    } else {
        Ok(d)
    }
}
