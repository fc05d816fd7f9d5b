//! [`Retention`]: the dedup window, and [`Purger`]: when a purge may delete what.
//!
//! Invariant: no cutoff is ever later than `now - window`, the window is never shorter
//! than the redelivery horizon the user stated, and no cutoff at all is given until the
//! purger has been running for that horizon (see [`Purger`] for why).
//!
//! The inbox's records are the dedup window: a redelivery finds its record only while
//! the record is kept. How long a broker may redeliver one message is the *redelivery
//! horizon*: for a JetStream consumer `max_deliver × ack_wait` (plus any backoff), for a
//! RabbitMQ quorum queue the delivery limit times the consumer timeout, for a publisher
//! that retries, its retry period. A window shorter than that lets a late redelivery
//! find no record and apply the message again, so [`Retention::new`] refuses it.

use std::fmt;
use std::time::{Duration, SystemTime};

/// How long inbox records are kept: at least `window`, which is at least the broker's
/// redelivery horizon.
///
/// ```
/// use idemcache_sql::inbox::Retention;
/// use std::time::Duration;
///
/// // JetStream: max_deliver 5 × ack_wait 30 s = 150 s; keep a day.
/// let horizon = Duration::from_secs(30) * 5;
/// let retention = Retention::new(Duration::from_secs(24 * 3600), horizon)?;
/// assert_eq!(retention.window(), Duration::from_secs(86_400));
/// assert!(Retention::new(Duration::from_secs(60), horizon).is_err());
/// # Ok::<(), idemcache_sql::inbox::RetentionError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    window: Duration,
    redelivery_horizon: Duration,
}

/// Why a [`Retention`] was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RetentionError {
    /// The window is zero: every record could be purged at once.
    ZeroWindow,
    /// The redelivery horizon is zero: every broker redelivers an unacknowledged
    /// message at some point; state how long it may take.
    ZeroHorizon,
    /// The window is shorter than the redelivery horizon: a late redelivery would find
    /// its record purged and apply the message again.
    WindowShorterThanHorizon {
        /// The window asked for.
        window: Duration,
        /// The redelivery horizon stated.
        redelivery_horizon: Duration,
    },
}

impl fmt::Display for RetentionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RetentionError::ZeroWindow => f.write_str("the inbox retention window is zero"),
            RetentionError::ZeroHorizon => f.write_str(
                "the redelivery horizon is zero; state how long the broker may redeliver \
                 a message (e.g. max_deliver × ack_wait)",
            ),
            RetentionError::WindowShorterThanHorizon { window, redelivery_horizon } => write!(
                f,
                "the inbox retention window {window:?} is shorter than the redelivery \
                 horizon {redelivery_horizon:?}: a late redelivery would be applied again"
            ),
        }
    }
}

impl std::error::Error for RetentionError {}

impl Retention {
    /// Records are kept at least `window`; `redelivery_horizon` is the longest a broker
    /// may take to redeliver an unacknowledged message (see the module docs). Refuses a
    /// zero window or horizon, and a window shorter than the horizon (equal is allowed).
    pub fn new(
        window: Duration,
        redelivery_horizon: Duration,
    ) -> Result<Retention, RetentionError> {
        if window.is_zero() {
            return Err(RetentionError::ZeroWindow);
        }
        if redelivery_horizon.is_zero() {
            return Err(RetentionError::ZeroHorizon);
        }
        if window < redelivery_horizon {
            return Err(RetentionError::WindowShorterThanHorizon { window, redelivery_horizon });
        }
        Ok(Retention { window, redelivery_horizon })
    }

    /// How long records are kept at least.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// The longest a broker may take to redeliver, as stated.
    pub fn redelivery_horizon(&self) -> Duration {
        self.redelivery_horizon
    }
}

/// When a purge may run and what it may delete: [`cutoff`](Purger::cutoff) gives the
/// time before which records may go, for the driver's `purge(conn, cutoff, limit)`.
/// [`purge_loop`](crate::inbox::purge_loop) asks it every round, for as long as the
/// program runs.
///
/// Why it waits after a start: messages committed but not acknowledged before a crash
/// (or a shutdown, or a lost connection) are redelivered only after the consumer is back,
/// within the redelivery horizon of its restart, however long it was down. Their records
/// were received before the downtime, so after a downtime longer than the window a
/// purge at start-up would find them all older than `now - window` and delete them, and
/// their redeliveries would be applied again (Wolverine shipped exactly this, its issue
/// #1725). So a purger answers `None` (purge nothing) until it has been running for the
/// redelivery horizon: by then every redelivery of a message pending at the restart has
/// come and found its record. After that, the cutoff is `now - window`.
///
/// The rule holds after every start, long downtime or not: the purger cannot know how
/// long the consumer was down, and waiting one horizon costs nothing but a delayed purge.
/// Start it when the consumer starts consuming. The cutoff is on the clock you pass in,
/// the records' times on the database's: keep the window well above any skew between
/// them. A backlog that takes longer than the horizon to drain after a restart needs a
/// longer stated horizon.
///
/// ```
/// use idemcache_sql::inbox::{Purger, Retention};
/// use std::time::{Duration, SystemTime};
///
/// let hour = Duration::from_secs(3600);
/// let retention = Retention::new(24 * hour, hour)?;
/// let started = SystemTime::UNIX_EPOCH + 1000 * hour;
/// let purger = Purger::new(retention, started);
/// assert_eq!(purger.cutoff(started), None); // just started: purge nothing
/// assert_eq!(purger.cutoff(started + hour), Some(started + hour - 24 * hour));
/// # Ok::<(), idemcache_sql::inbox::RetentionError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Purger {
    retention: Retention,
    started_at: SystemTime,
}

impl Purger {
    /// A purger for a consumer that started consuming at `started_at`.
    pub fn new(retention: Retention, started_at: SystemTime) -> Purger {
        Purger { retention, started_at }
    }

    /// The retention it keeps.
    pub fn retention(&self) -> Retention {
        self.retention
    }

    /// When it started.
    pub fn started_at(&self) -> SystemTime {
        self.started_at
    }

    /// The time before which records received may be purged at `now`, or `None` while
    /// nothing may be: until the purger has been running for the redelivery horizon
    /// (including when `now` is before `started_at`: a clock that went back), and when
    /// `now - window` is before the clock's range.
    pub fn cutoff(&self, now: SystemTime) -> Option<SystemTime> {
        let running = now.duration_since(self.started_at).ok()?;
        if running < self.retention.redelivery_horizon {
            return None;
        }
        now.checked_sub(self.retention.window)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn a_window_shorter_than_the_horizon_or_zero_is_refused() {
        assert_eq!(Retention::new(Duration::ZERO, S), Err(RetentionError::ZeroWindow));
        assert_eq!(Retention::new(S, Duration::ZERO), Err(RetentionError::ZeroHorizon));
        let e = Retention::new(149 * S, 150 * S).unwrap_err();
        assert_eq!(
            e,
            RetentionError::WindowShorterThanHorizon {
                window: 149 * S,
                redelivery_horizon: 150 * S
            }
        );
        assert!(e.to_string().contains("shorter than the redelivery horizon 150s"), "{e}");
        let equal = Retention::new(150 * S, 150 * S).unwrap();
        assert_eq!((equal.window(), equal.redelivery_horizon()), (150 * S, 150 * S));
    }

    #[test]
    fn nothing_is_purged_until_the_purger_ran_for_the_horizon_however_long_the_downtime() {
        let retention = Retention::new(600 * S, 150 * S).unwrap();
        // Records received just before a crash; the consumer was down ten windows.
        let crash = SystemTime::UNIX_EPOCH + 1_000_000 * S;
        let restart = crash + 6000 * S;
        let purger = Purger::new(retention, restart);
        assert_eq!(purger.cutoff(restart), None);
        assert_eq!(purger.cutoff(restart + 149 * S), None);
        // A clock that went back purges nothing either.
        assert_eq!(purger.cutoff(restart - S), None);
        // One horizon after the restart, the window applies as usual.
        let later = restart + 150 * S;
        assert_eq!(purger.cutoff(later), Some(later - 600 * S));
        assert!(purger.cutoff(later).unwrap() > crash, "the old records may go now");
        assert_eq!(purger.cutoff(later + 10 * S), Some(later + 10 * S - 600 * S));
    }

    #[test]
    fn a_cutoff_before_the_clocks_range_purges_nothing() {
        let retention = Retention::new(Duration::MAX, S).unwrap();
        let purger = Purger::new(retention, SystemTime::UNIX_EPOCH);
        assert_eq!(purger.cutoff(SystemTime::UNIX_EPOCH + 10 * S), None);
    }
}
