//! [`CacheBuilder`]: every setting of a cache, checked once at `build()`.
//!
//! Invariant: a [`Config`] that exists is valid (positive, bounded durations and sizes, a
//! power-of-two shard count), so nothing downstream re-checks or can overflow on it.

use std::fmt;
use std::time::Duration;

use crate::{BuildError, Cache, Clock, SystemClock};

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
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) shards: usize,
    pub(crate) completed_ttl: Duration,
    pub(crate) lease: Duration,
    pub(crate) unknown_ttl: Duration,
    pub(crate) drop_policy: DropPolicy,
    pub(crate) max_result_size: usize,
}

/// Builds a [`Cache`]; start with [`Cache::builder`].
///
/// Defaults: `available_parallelism() * 4` shards (rounded up to a power of two),
/// completed results kept 24 h, leases of 60 s, unknown outcomes kept 24 h,
/// [`DropPolicy::Release`], results up to 64 KiB kept, [`SystemClock`].
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
    max_result_size: usize,
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
            .field("max_result_size", &self.max_result_size)
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
            max_result_size: 64 * 1024,
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

    /// How long an UNKNOWN outcome blocks its key before the key becomes claimable again.
    pub fn unknown_ttl(mut self, ttl: Duration) -> Self {
        self.unknown_ttl = ttl;
        self
    }

    /// What a guard dropped without an outcome does.
    pub fn drop_policy(mut self, policy: DropPolicy) -> Self {
        self.drop_policy = policy;
        self
    }

    /// The largest result body kept for replay; a larger result is recorded as
    /// completed-without-body (the work happened and must not be redone).
    pub fn max_result_size(mut self, bytes: usize) -> Self {
        self.max_result_size = bytes;
        self
    }

    /// The clock the cache reads; [`ManualClock`](crate::ManualClock) in tests.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Box::new(clock);
        self
    }

    /// Checks every setting and builds the cache.
    pub fn build(self) -> Result<Cache, BuildError> {
        let shards = match self.shards {
            Some(n) if n == 0 || n > MAX_SHARDS => return Err(BuildError::Shards(n)),
            Some(n) => n,
            None => std::thread::available_parallelism().map_or(4, |n| n.get()) * 4,
        }
        .next_power_of_two()
        .min(MAX_SHARDS);
        for (setting, value) in [
            ("completed_ttl", self.completed_ttl),
            ("lease", self.lease),
            ("unknown_ttl", self.unknown_ttl),
        ] {
            check_duration(value).map_err(|value| BuildError::Duration { setting, value })?;
        }
        if self.max_result_size == 0 || self.max_result_size > MAX_RESULT_SIZE_LIMIT {
            return Err(BuildError::MaxResultSize(self.max_result_size));
        }
        let config = Config {
            shards,
            completed_ttl: self.completed_ttl,
            lease: self.lease,
            unknown_ttl: self.unknown_ttl,
            drop_policy: self.drop_policy,
            max_result_size: self.max_result_size,
        };
        Ok(Cache::from_parts(config, self.clock))
    }
}

/// A TTL or lease must be positive and at most [`MAX_DURATION`].
pub(crate) fn check_duration(d: Duration) -> Result<Duration, Duration> {
    if d.is_zero() || d > MAX_DURATION {
        Err(d)
    } else {
        Ok(d)
    }
}
