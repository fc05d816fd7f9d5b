//! Time as the cache sees it: [`Timestamp`]s from a [`Clock`].
//!
//! Invariant: a clock never goes backwards. Every deadline in the cache is a `Timestamp`
//! from the cache's one clock, so comparing them is meaningful; the cache reads its clock
//! once per operation (reading it costs tens of nanoseconds) and uses that reading for
//! every check the operation makes.

use std::fmt;
use std::time::Duration;
#[cfg(not(target_os = "linux"))]
use std::time::Instant;

use crate::sync::{Arc, AtomicU64, Ordering};

/// A point in time on a [`Clock`]: nanoseconds since the clock's origin.
///
/// Monotonic, not wall time: it orders events and measures TTLs, it is not a date. For
/// [`SystemClock`] the origin is when the clock was made (usually when the cache was
/// built); for [`ManualClock`] it is zero.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(u64);

impl Timestamp {
    /// The clock's origin.
    pub const ZERO: Timestamp = Timestamp(0);

    /// A timestamp `nanos` nanoseconds after the origin.
    pub const fn from_nanos(nanos: u64) -> Timestamp {
        Timestamp(nanos)
    }

    /// Nanoseconds since the origin.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Time since the origin.
    pub const fn since_origin(self) -> Duration {
        Duration::from_nanos(self.0)
    }

    /// `self + d`, saturating at the far end of time (about 584 years after the origin).
    pub fn saturating_add(self, d: Duration) -> Timestamp {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        Timestamp(self.0.saturating_add(nanos))
    }

    /// `self - d`, saturating at the origin.
    pub fn saturating_sub(self, d: Duration) -> Timestamp {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        Timestamp(self.0.saturating_sub(nanos))
    }

    /// Time from `earlier` to `self`, or zero if `earlier` is later.
    pub fn saturating_duration_since(self, earlier: Timestamp) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl fmt::Debug for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Timestamp({:?})", self.since_origin())
    }
}

/// A source of monotonic time for one cache.
///
/// Implement it to put the cache on your own time source; it must never go backwards.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The current time.
    fn now(&self) -> Timestamp;
}

/// The real clock: the operating system's monotonic time.
///
/// On Linux it reads `CLOCK_MONOTONIC_COARSE`, the monotonic clock as of the last timer
/// tick: about 3 ns a read through the vDSO against about 24 ns for [`Instant::now`](std::time::Instant::now)
/// (measured on the project's 2-core machine), at a resolution of one tick (1 to 4 ms,
/// by the kernel's `HZ`). A replay hit costs a few tens of nanoseconds, so the precise
/// clock would be a third of it, while TTLs and leases are seconds long: a few
/// milliseconds of resolution is the better trade. Timestamps are therefore multiples of
/// the tick. Elsewhere it reads [`std::time::Instant`].
///
/// Implement [`Clock`] yourself if you need finer timestamps.
#[derive(Debug, Clone, Copy)]
pub struct SystemClock {
    /// [`monotonic_nanos`] at the origin.
    origin: u64,
}

impl SystemClock {
    /// A clock whose origin is now.
    pub fn new() -> SystemClock {
        SystemClock { origin: monotonic_nanos() }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        SystemClock::new()
    }
}

impl Clock for SystemClock {
    #[inline]
    fn now(&self) -> Timestamp {
        Timestamp(monotonic_nanos().saturating_sub(self.origin))
    }
}

/// Monotonic nanoseconds since an arbitrary fixed point (boot, on Linux). Plain integer
/// arithmetic: `Duration` and `u128` conversions here cost more than the clock read.
/// u64 nanoseconds last 584 years of uptime.
#[cfg(target_os = "linux")]
#[inline]
fn monotonic_nanos() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::MonotonicCoarse);
    // The kernel keeps both fields non-negative for monotonic clocks.
    (ts.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(ts.tv_nsec as u64)
}

#[cfg(not(target_os = "linux"))]
fn monotonic_nanos() -> u64 {
    use std::sync::OnceLock;
    static START: OnceLock<Instant> = OnceLock::new();
    u64::try_from(START.get_or_init(Instant::now).elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// A clock that moves only when told to: for tests, simulations and replaying logs.
///
/// Clones share one time, so a test keeps a clone and advances the cache's clock from
/// outside:
///
/// ```
/// use std::time::Duration;
/// use idemcache::{ManualClock, Clock};
///
/// let clock = ManualClock::new();
/// let handle = clock.clone();
/// handle.advance(Duration::from_secs(5));
/// assert_eq!(clock.now().since_origin(), Duration::from_secs(5));
/// ```
#[derive(Clone)]
pub struct ManualClock {
    nanos: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock standing at [`Timestamp::ZERO`].
    pub fn new() -> ManualClock {
        ManualClock { nanos: Arc::new(AtomicU64::new(0)) }
    }

    /// Moves time forward by `d` (saturating at the far end of time).
    pub fn advance(&self, d: Duration) {
        let step = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        // fetch_update never fails with a closure that always returns Some.
        let _ = self
            .nanos
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| Some(n.saturating_add(step)));
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock::new()
    }
}

impl fmt::Debug for ManualClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ManualClock").field(&self.now()).finish()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.nanos.load(Ordering::Acquire))
    }
}
