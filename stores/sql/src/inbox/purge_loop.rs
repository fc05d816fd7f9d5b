//! [`purge_loop`]: a consumer inbox's old records purged for as long as the program runs,
//! in the paced rounds of [`idemcache::purge`].
//!
//! Invariant: a round deletes nothing while the [`Purger`] gives no cutoff (the dedup
//! window and the startup wait are the purger's: see its docs); otherwise the loop is
//! `records_loop`'s, round for round (never ends on its own, never panics, a failed
//! batch reported and retried one interval later).

use std::convert::Infallible;
use std::future::Future;
use std::time::{Duration, SystemTime};

use idemcache::purge::{round, Round, Schedule};

use super::{InboxError, Purger};

/// Purges a consumer inbox forever: each round asks `purger` for the cutoff at
/// `SystemTime::now()`, and, when there is one, calls `purge(cutoff, limit)` (the
/// driver's `inbox::purge`) in paced batches until one comes back short; while there is
/// none, the round is [`Round::Waiting`]. Otherwise as `idemcache::purge::records_loop`:
/// a round at once, then one every interval, each handed to `report`, failures included,
/// for ever. See [`idemcache::purge`] for `sleep` and for stopping it.
///
/// `purge` is the driver's call on a connection the closure owns: over SQLite,
/// `move |cutoff, limit| std::future::ready(idemcache_sqlite::inbox::purge(&conn, cutoff,
/// limit))` (the driver's inbox docs show it whole); over a PostgreSQL pool, a future
/// that takes a client from the pool and calls `idemcache_postgres::inbox::purge`.
pub async fn purge_loop<P, PF, Z, ZF, R>(
    purger: Purger,
    mut purge: P,
    schedule: Schedule,
    mut sleep: Z,
    mut report: R,
) -> Infallible
where
    P: FnMut(SystemTime, usize) -> PF,
    PF: Future<Output = Result<usize, InboxError>>,
    Z: FnMut(Duration) -> ZF,
    ZF: Future<Output = ()>,
    R: FnMut(Round<InboxError>),
{
    loop {
        let done = match purger.cutoff(SystemTime::now()) {
            None => Round::Waiting,
            Some(cutoff) => round(&schedule, &mut sleep, |limit| purge(cutoff, limit)).await,
        };
        report(done);
        sleep(schedule.interval()).await;
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::sync::Arc;
    use std::task::{Context, Poll, Wake, Waker};

    use super::*;
    use crate::inbox::Retention;

    struct Nobody;
    impl Wake for Nobody {
        fn wake(self: Arc<Self>) {}
    }

    /// Pending once, then ready: a timer that has fired by the next poll.
    struct Tick(bool);
    impl Future for Tick {
        type Output = ();
        fn poll(mut self: std::pin::Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
            if std::mem::replace(&mut self.0, true) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        }
    }

    /// The rounds a loop reports over its first `polls` polls (one round per poll: each
    /// waits on a timer that has fired by the next), its purge answering `answer()`.
    fn rounds(
        purger: Purger,
        answer: impl Fn() -> Result<usize, InboxError>,
        polls: usize,
    ) -> Vec<String> {
        let reported = RefCell::new(Vec::new());
        let purge = |_cutoff, _limit| std::future::ready(answer());
        let schedule = Schedule::every(Duration::from_secs(60)).unwrap();
        let report = |round: Round<InboxError>| reported.borrow_mut().push(format!("{round:?}"));
        let looping = purge_loop(purger, purge, schedule, |_| Tick(false), report);
        let mut looping = std::pin::pin!(looping);
        let waker = Waker::from(Arc::new(Nobody));
        for _ in 0..polls {
            assert!(looping.as_mut().poll(&mut Context::from_waker(&waker)).is_pending());
        }
        let reported = reported.borrow().clone();
        reported
    }

    #[test]
    fn a_purger_without_a_cutoff_deletes_nothing_and_says_it_waits() {
        let hour = Duration::from_secs(3600);
        let started_now = Purger::new(Retention::new(hour, hour).unwrap(), SystemTime::now());
        let reported = rounds(started_now, || Ok(0), 2);
        assert_eq!(reported, ["Waiting", "Waiting"]);
    }

    #[test]
    fn a_purger_with_a_cutoff_purges_and_a_failure_is_reported_not_the_end() {
        let hour = Duration::from_secs(3600);
        let long_ago = SystemTime::now() - 10 * hour;
        let running = || Purger::new(Retention::new(hour, hour).unwrap(), long_ago);
        assert_eq!(rounds(running(), || Ok(3), 1), ["Purged(3)"]);
        let failing = rounds(running(), || Err(InboxError::Corrupt("row".into())), 3);
        assert_eq!(failing.len(), 3, "the loop goes on after a failed round: {failing:?}");
        assert!(failing.iter().all(|r| r.starts_with("Failed { deleted: 0")), "{failing:?}");
    }
}
