//! [`purge_loop`]: the outbox's delivered rows purged for as long as the program runs,
//! in the paced rounds of [`idemcache::purge`].
//!
//! Invariant: a round deletes only rows delivered more than `keep` before the clock's
//! now (the driver's `purge_delivered` never deletes an undelivered row); otherwise the
//! loop is the inbox's, round for round (never ends on its own, never panics, a failed
//! batch reported and retried one interval later).

use std::convert::Infallible;
use std::future::Future;
use std::time::{Duration, SystemTime};

use idemcache::purge::{round, Round, Schedule};

use super::OutboxError;

/// Purges delivered rows forever: each round deletes, in paced batches until one comes
/// back short, the rows delivered before `clock() - keep`, by calling `purge(cutoff,
/// limit)` (the driver's `purge_delivered` on a connection the closure owns). A round
/// at once, then one every interval, each handed to `report`. Choose `keep` by the
/// guide's rule (docs/outbox.md, "Retention"): the consumers' inbox must keep its
/// records longer than this plus the retry span.
pub async fn purge_loop<P, PF, C, Z, ZF, R>(
    keep: Duration,
    mut clock: C,
    mut purge: P,
    schedule: Schedule,
    mut sleep: Z,
    mut report: R,
) -> Infallible
where
    C: FnMut() -> SystemTime,
    P: FnMut(SystemTime, usize) -> PF,
    PF: Future<Output = Result<usize, OutboxError>>,
    Z: FnMut(Duration) -> ZF,
    ZF: Future<Output = ()>,
    R: FnMut(Round<OutboxError>),
{
    loop {
        let now = clock();
        let done = match now.checked_sub(keep) {
            // A clock before the epoch plus `keep`: nothing can be old enough.
            None => Round::Purged(0),
            Some(cutoff) => round(&schedule, &mut sleep, |limit| purge(cutoff, limit)).await,
        };
        report(done);
        sleep(schedule.interval()).await;
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::pin::pin;
    use std::sync::Arc;
    use std::task::{Context, Poll, Wake, Waker};

    use super::*;

    struct Nobody;
    impl Wake for Nobody {
        fn wake(self: Arc<Self>) {}
    }

    /// Pending once, then ready.
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

    #[test]
    fn each_round_purges_what_was_delivered_before_now_less_keep() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(10_000);
        let keep = Duration::from_secs(3600);
        let cutoffs = RefCell::new(Vec::new());
        let reported = RefCell::new(Vec::new());
        let purge = |cutoff, _limit| {
            cutoffs.borrow_mut().push(cutoff);
            std::future::ready(Ok(2))
        };
        let schedule = Schedule::every(Duration::from_secs(60)).unwrap();
        let looping = purge_loop(
            keep,
            || now,
            purge,
            schedule,
            |_| Tick(false),
            |r: Round<OutboxError>| reported.borrow_mut().push(format!("{r:?}")),
        );
        let mut looping = pin!(looping);
        let waker = Waker::from(Arc::new(Nobody));
        for _ in 0..2 {
            assert!(looping.as_mut().poll(&mut Context::from_waker(&waker)).is_pending());
        }
        assert_eq!(*reported.borrow(), ["Purged(2)", "Purged(2)"], "a round per interval");
        assert_eq!(*cutoffs.borrow(), [now - keep, now - keep]);
    }
}
