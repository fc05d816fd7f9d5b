//! Maintenance loops: a store's expired records (`records_loop`, feature `store`) purged
//! for as long as the program runs, in paced batches, as one future to spawn; and the
//! [`round`] every such loop is made of, for a loop of another table (the consumer
//! inbox's is `idemcache_sql::inbox::purge_loop`).
//!
//! ```ignore
//! use idemcache::purge::{self, Round, Schedule};
//!
//! let every_minute = Schedule::every(Duration::from_secs(60))?; // batches of 1000, 50 ms apart
//! tokio::spawn(purge::records_loop(store.clone(), every_minute, tokio::time::sleep, |round| {
//!     if let Round::Failed { error, .. } = round {
//!         tracing::warn!("purging idempotency records failed: {error}");
//!     }
//! }));
//! ```
//!
//! Invariants: a loop never ends on its own and never panics (only `sleep`, `report`
//! or the store can): a failed batch ends its round, is handed to `report`, and the
//! loop tries again one interval later. A round deletes in batches of at most the
//! schedule's `batch`, the next one after the schedule's `pause` (with no pause, after
//! a yield to the executor: never two batches in one poll), until a batch comes back
//! short; the next round starts one interval after a round ends.
//!
//! # Why the timer is a parameter
//!
//! A loop needs a timer, and a timer is a runtime's. The `store` feature has no
//! dependencies and needs no runtime (SQLite's store needs none at all), and tokio comes
//! only with the `tower` feature. So each loop takes the one thing it needs from a
//! runtime, a `sleep(duration)` function: `tokio::time::sleep` as it is, another
//! runtime's, or a thread's (below). The alternatives were worse: a feature that adds
//! tokio to the store for one function, or a copy of the loop in every driver crate
//! (six, one of which, sqlx's, has no runtime of its own to take a timer from). And a
//! timer passed in is one a test controls: the loops' tests tick it by hand instead of
//! waiting for time to pass.
//!
//! Without an async runtime (a program over `SqliteStore` alone), run a loop on a thread
//! of its own:
//!
//! ```ignore
//! std::thread::spawn(move || {
//!     let sleep = |pause| {
//!         std::thread::sleep(pause);
//!         std::future::ready(())
//!     };
//!     idemcache::store::block_on(purge::records_loop(store, every_minute, sleep, report))
//! });
//! ```
//!
//! A loop is stopped by dropping its future: abort its task (`JoinHandle::abort`), or let
//! the runtime shut down. A batch is one statement (or script), so a loop dropped in the
//! middle of one leaves that batch done or not done, never half done.

#[cfg(feature = "store")]
use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::task::Poll;
use std::time::Duration;

#[cfg(feature = "store")]
use crate::store::{Store, StoreError};

/// Records deleted per batch unless told otherwise: with [`DEFAULT_PAUSE`] between
/// batches, PostgreSQL deleted ~17,000 rows/s from a 10-million-record table while the
/// claims' p99 stayed at about 2x its idle value (flat out: ~90,000 rows/s, at 9x;
/// BENCHMARKS.md, "PostgreSQL at volume").
pub const DEFAULT_BATCH: usize = 1000;

/// The pause between two batches of one round unless told otherwise: it leaves the
/// database (SQLite's one write lock, PostgreSQL's CPU and WAL) to the requests in
/// between; see [`DEFAULT_BATCH`] for what it was measured at.
pub const DEFAULT_PAUSE: Duration = Duration::from_millis(50);

/// How often a loop purges and how: a round every [`interval`](Schedule::interval), in
/// batches of [`batch`](Schedule::batch) records, [`pause`](Schedule::pause) apart.
///
/// ```
/// use idemcache::purge::{Schedule, DEFAULT_BATCH};
/// use std::time::Duration;
///
/// let schedule = Schedule::every(Duration::from_secs(60))?;
/// assert_eq!(schedule.batch(), DEFAULT_BATCH);
/// let gentle = schedule.with_batch(200)?.with_pause(Duration::from_millis(200));
/// assert_eq!((gentle.batch(), gentle.pause()), (200, Duration::from_millis(200)));
/// assert!(Schedule::every(Duration::ZERO).is_err());
/// assert!(schedule.with_batch(0).is_err());
/// # Ok::<(), idemcache::purge::ScheduleError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    every: Duration,
    batch: usize,
    pause: Duration,
}

impl Schedule {
    /// A round every `every` (from the end of one round to the start of the next), in
    /// batches of [`DEFAULT_BATCH`], [`DEFAULT_PAUSE`] apart. Refuses an interval of zero
    /// (the loop would never yield to its timer) or over
    /// [`MAX_DURATION`](crate::MAX_DURATION).
    pub fn every(every: Duration) -> Result<Schedule, ScheduleError> {
        let every = crate::config::check_duration(every).map_err(ScheduleError::InvalidInterval)?;
        Ok(Schedule { every, batch: DEFAULT_BATCH, pause: DEFAULT_PAUSE })
    }

    /// At most `batch` records deleted by one statement. Refuses zero (nothing would
    /// ever be deleted).
    pub fn with_batch(self, batch: usize) -> Result<Schedule, ScheduleError> {
        match batch {
            0 => Err(ScheduleError::ZeroBatch),
            batch => Ok(Schedule { batch, ..self }),
        }
    }

    /// The pause between two batches of one round; zero runs them back to back (each
    /// batch still gives the executor its turn before the next).
    pub fn with_pause(self, pause: Duration) -> Schedule {
        Schedule { pause, ..self }
    }

    /// The interval between rounds.
    pub fn interval(&self) -> Duration {
        self.every
    }

    /// The most records one batch deletes.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// The pause between two batches of one round.
    pub fn pause(&self) -> Duration {
        self.pause
    }
}

/// Why a [`Schedule`] was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ScheduleError {
    /// The interval is zero or longer than [`MAX_DURATION`](crate::MAX_DURATION).
    InvalidInterval(Duration),
    /// A batch of zero records.
    ZeroBatch,
}

impl fmt::Display for ScheduleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScheduleError::InvalidInterval(d) => {
                crate::error::invalid_duration(f, "purge interval", *d)
            }
            ScheduleError::ZeroBatch => f.write_str("a purge batch of zero records refused"),
        }
    }
}

impl std::error::Error for ScheduleError {}

/// How one round of a loop went, as handed to its `report`.
#[derive(Debug)]
#[must_use = "a round may have failed"]
pub enum Round<E> {
    /// The round deleted this many records, batch after batch, until one came back short.
    Purged(usize),
    /// The loop did not know yet what it may delete, so it deleted nothing: the consumer
    /// inbox's `Purger` gave no cutoff (it has not run for its redelivery horizon since
    /// it started). Never from `records_loop`.
    Waiting,
    /// A batch failed with `error` after the round's earlier batches deleted `deleted`
    /// records. The loop goes on: the next round comes one interval later.
    Failed {
        /// What the round's earlier batches deleted.
        deleted: usize,
        /// Why the batch failed: the store's or the inbox driver's error.
        error: E,
    },
}

/// Purges `store`'s expired records ([`Store::purge_expired`]) forever: a round at once,
/// then one every [`Schedule::interval`] after the last ended, each in paced batches
/// until a batch comes back short. Every round is handed to `report`, a failed one
/// ([`Round::Failed`], the store down, say) included: log it there; the loop goes on.
/// Spawn it (`tokio::spawn(purge::records_loop(store.clone(), schedule, tokio::time::sleep,
/// report))`); it ends only when dropped. See the module docs for `sleep`.
///
/// One loop per database is enough, and one per instance is safe: a purge deletes only
/// records that have expired, whichever loop runs it (PostgreSQL's batches skip each
/// other's rows; SQLite's take turns on its write lock).
#[cfg(feature = "store")]
#[cfg_attr(docsrs, doc(cfg(feature = "store")))]
pub async fn records_loop<S, Z, ZF, R>(
    store: S,
    schedule: Schedule,
    mut sleep: Z,
    mut report: R,
) -> Infallible
where
    S: Store,
    Z: FnMut(Duration) -> ZF,
    ZF: Future<Output = ()>,
    R: FnMut(Round<StoreError>),
{
    let store = &store;
    loop {
        report(round(&schedule, &mut sleep, |limit| store.purge_expired(limit)).await);
        sleep(schedule.every).await;
    }
}

/// One round of a loop: `batch(limit)` called with the schedule's batch size, the
/// schedule's pause apart (`sleep(pause)`; with no pause, after a yield to the executor,
/// so never two batches in one poll), until a batch deletes fewer than asked
/// ([`Round::Purged`], the total) or fails ([`Round::Failed`], with what the round
/// deleted before). The building block of `records_loop`, public for a loop over
/// another table (the consumer inbox's is `idemcache_sql::inbox::purge_loop`).
pub async fn round<E, B, BF, Z, ZF>(schedule: &Schedule, sleep: &mut Z, mut batch: B) -> Round<E>
where
    B: FnMut(usize) -> BF,
    BF: Future<Output = Result<usize, E>>,
    Z: FnMut(Duration) -> ZF,
    ZF: Future<Output = ()>,
{
    let mut deleted = 0usize;
    loop {
        match batch(schedule.batch).await {
            Ok(n) => {
                deleted = deleted.saturating_add(n);
                if n < schedule.batch {
                    return Round::Purged(deleted);
                }
            }
            Err(error) => return Round::Failed { deleted, error },
        }
        if schedule.pause.is_zero() {
            // Back to back, but never in one poll: a purge that answers at once (SQLite's)
            // would otherwise hold the executor's thread until the backlog drained, and
            // an abort waits for a yield.
            YieldNow(false).await;
        } else {
            sleep(schedule.pause).await;
        }
    }
}

/// Pending once, waking its task at once: the executor's turn to run other tasks (and
/// to drop this one, if it was aborted).
struct YieldNow(bool);

impl Future for YieldNow {
    type Output = ();

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::task::{Context, Poll, Wake, Waker};

    use super::*;

    /// `future`'s output, when it waits on nothing: each time it is pending, it has
    /// woken itself (a yield between batches), so it is polled again at once.
    fn now_or_never<F: Future>(future: F) -> F::Output {
        use std::sync::atomic::{AtomicBool, Ordering};
        struct Woken(AtomicBool);
        impl Wake for Woken {
            fn wake(self: Arc<Self>) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let woken = Arc::new(Woken(AtomicBool::new(false)));
        let waker = Waker::from(woken.clone());
        let mut future = std::pin::pin!(future);
        loop {
            match future.as_mut().poll(&mut Context::from_waker(&waker)) {
                Poll::Ready(out) => return out,
                Poll::Pending if woken.0.swap(false, Ordering::SeqCst) => {}
                Poll::Pending => panic!("waiting on something that never comes"),
            }
        }
    }

    const MINUTE: Duration = Duration::from_secs(60);

    #[test]
    fn a_schedule_refuses_what_would_spin_or_delete_nothing() {
        let every = Schedule::every(MINUTE).unwrap();
        assert_eq!((every.interval(), every.batch()), (MINUTE, DEFAULT_BATCH));
        assert_eq!(every.pause(), DEFAULT_PAUSE);
        let zero = Schedule::every(Duration::ZERO).unwrap_err();
        assert_eq!(zero, ScheduleError::InvalidInterval(Duration::ZERO));
        assert!(zero.to_string().starts_with("purge interval of 0ns refused"), "{zero}");
        let over = crate::MAX_DURATION + Duration::from_nanos(1);
        assert_eq!(Schedule::every(over), Err(ScheduleError::InvalidInterval(over)));
        assert_eq!(Schedule::every(crate::MAX_DURATION).unwrap().interval(), crate::MAX_DURATION);
        assert_eq!(every.with_batch(0), Err(ScheduleError::ZeroBatch));
        assert_eq!(ScheduleError::ZeroBatch.to_string(), "a purge batch of zero records refused");
        assert_eq!(every.with_batch(1).unwrap().batch(), 1);
    }

    /// Runs one round over `answers` (one per batch), returning it, the limits asked and
    /// the pauses slept.
    fn one_round(
        schedule: Schedule,
        answers: Vec<Result<usize, &'static str>>,
    ) -> (Round<&'static str>, Vec<usize>, Vec<Duration>) {
        let (mut answers, mut asked, mut slept) = (answers.into_iter(), vec![], vec![]);
        let batch = |limit| {
            asked.push(limit);
            std::future::ready(answers.next().expect("a batch more than expected"))
        };
        let mut sleep = |pause| {
            slept.push(pause);
            std::future::ready(())
        };
        let done = now_or_never(round(&schedule, &mut sleep, batch));
        (done, asked, slept)
    }

    #[test]
    fn a_round_deletes_in_paced_batches_until_one_comes_back_short() {
        let schedule = Schedule::every(MINUTE).unwrap().with_batch(2).unwrap();
        let (done, asked, slept) = one_round(schedule, vec![Ok(2), Ok(2), Ok(1)]);
        assert!(matches!(done, Round::Purged(5)), "{done:?}");
        assert_eq!((asked, slept), (vec![2, 2, 2], vec![DEFAULT_PAUSE; 2]));
        let (done, asked, _) = one_round(schedule, vec![Ok(0)]);
        assert!(matches!(done, Round::Purged(0)), "{done:?}");
        assert_eq!(asked, [2]);
        // No pause: the batches run back to back, the timer never asked.
        let (done, _, slept) = one_round(schedule.with_pause(Duration::ZERO), vec![Ok(2), Ok(0)]);
        assert!(matches!(done, Round::Purged(2)), "{done:?}");
        assert!(slept.is_empty());
    }

    /// A schedule without a pause still gives the executor its turn between batches: a
    /// purge that answers at once (SQLite's inbox, as its docs call it), full batch
    /// after full batch, ran the whole round inside one poll. The loop's task then held
    /// its thread for as long as expired records came back full, and could not be
    /// aborted (`JoinHandle::abort` takes effect at a yield) until the table drained.
    #[test]
    fn a_round_without_a_pause_still_yields_between_batches() {
        use std::cell::Cell;
        use std::task::{Context, Poll, Waker};

        struct Nobody;
        impl Wake for Nobody {
            fn wake(self: Arc<Self>) {}
        }
        let schedule =
            Schedule::every(MINUTE).unwrap().with_batch(10).unwrap().with_pause(Duration::ZERO);
        // Full batches for a thousand, then a short one: a backlog of 10,000 records.
        let batches = Cell::new(0usize);
        let purge = |limit: usize| {
            batches.set(batches.get() + 1);
            std::future::ready(Ok::<_, ()>(if batches.get() <= 1000 { limit } else { 0 }))
        };
        let mut sleep = |_| std::future::pending();
        let purging = round(&schedule, &mut sleep, purge);
        let waker = Waker::from(Arc::new(Nobody));
        let polled = std::pin::pin!(purging).poll(&mut Context::from_waker(&waker));
        assert!(matches!(polled, Poll::Pending));
        assert_eq!(batches.get(), 1, "batches run in one poll, never yielding");
    }

    #[test]
    fn a_failed_batch_ends_its_round_saying_what_was_deleted_before_it() {
        let schedule = Schedule::every(MINUTE).unwrap().with_batch(2).unwrap();
        let (done, asked, _) = one_round(schedule, vec![Ok(2), Err("database gone")]);
        assert!(matches!(done, Round::Failed { deleted: 2, error: "database gone" }), "{done:?}");
        assert_eq!(asked, [2, 2]);
    }
}
