//! `Cache::claim_wait_async`: the future wakes on the transitions that end PROCESSING,
//! notices a lapse through the caller's sleep, withdraws its waker when dropped, counts
//! one answer, and (the case `claim_wait` cannot serve) lets an owner on the same
//! current-thread runtime finish.

mod common;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use common::*;
use idemcache::{Claim, EntryState, ManualClock};

/// A waker that counts its wake-ups.
#[derive(Default)]
struct Counter(AtomicUsize);

impl Wake for Counter {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl Counter {
    fn woken(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// A sleep the test ends by hand, recording the durations it was asked for.
#[derive(Clone, Default)]
struct HandSleep {
    over: Arc<AtomicBool>,
    asked: Arc<Mutex<Vec<Duration>>>,
}

struct Nap(Arc<AtomicBool>);

impl Future for Nap {
    type Output = ();
    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
        if self.0.load(Ordering::SeqCst) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

impl HandSleep {
    fn sleep(&self) -> impl FnMut(Duration) -> Nap {
        let (over, asked) = (self.over.clone(), self.asked.clone());
        move |d| {
            asked.lock().unwrap().push(d);
            Nap(over.clone())
        }
    }
}

fn never(_: Duration) -> std::future::Pending<()> {
    std::future::pending()
}

fn poll<F: Future + Unpin>(future: &mut F, waker: &Arc<Counter>) -> Poll<F::Output> {
    let waker = Waker::from(waker.clone());
    Pin::new(future).poll(&mut Context::from_waker(&waker))
}

#[test]
fn completion_wakes_the_future_and_it_replays() {
    let (cache, _clock) = cache();
    let k = key("k");
    let owner = acquire(&cache, &k, fp("a"));
    let waker = Arc::new(Counter::default());
    let mut waiting = cache.claim_wait_async(&k, fp("a"), never);
    assert!(poll(&mut waiting, &waker).is_pending());
    assert_eq!(cache.stats().waiting, 1);
    assert_eq!(cache.stats().in_progress, 0, "an intermediate look is not an answer");

    owner.complete(&b"done"[..]).unwrap();
    assert_eq!(waker.woken(), 1, "completion wakes the filed waker");
    assert_eq!(cache.stats().waiting, 0, "a wake-up takes the waker out");
    match poll(&mut waiting, &waker) {
        Poll::Ready(Ok(Claim::Completed(replay))) => assert_eq!(replay.body.unwrap(), "done"),
        other => panic!("expected the replay, got {other:?}"),
    }
    assert_eq!(cache.stats().replayed, 1);
}

#[test]
fn release_mark_unknown_and_remove_each_wake_it() {
    let (cache, _clock) = cache();
    type End = fn(&idemcache::Cache, &idemcache::Key, idemcache::ClaimGuard);
    let ends: [(End, &str); 3] = [
        (|_, _, g| g.release().unwrap(), "acquired"),
        (|_, _, g| g.mark_unknown().unwrap(), "unknown"),
        (
            |c, k, g| {
                c.remove(k).unwrap();
                drop(g);
            },
            "acquired",
        ),
    ];
    for (i, (end, expected)) in ends.into_iter().enumerate() {
        let k = key(&format!("k{i}"));
        let owner = acquire(&cache, &k, fp("a"));
        let waker = Arc::new(Counter::default());
        let mut waiting = cache.claim_wait_async(&k, fp("a"), never);
        assert!(poll(&mut waiting, &waker).is_pending());
        end(&cache, &k, owner);
        assert!(waker.woken() >= 1, "case {i}");
        let got = match poll(&mut waiting, &waker) {
            Poll::Ready(Ok(Claim::Acquired(_))) => "acquired",
            Poll::Ready(Ok(Claim::Unknown { .. })) => "unknown",
            other => panic!("case {i}: {other:?}"),
        };
        assert_eq!(got, expected, "case {i}");
    }
    cache.debug_validate();
}

#[test]
fn a_mismatch_and_an_absent_key_answer_at_once() {
    let (cache, _clock) = cache();
    let k = key("k");
    let _owner = acquire(&cache, &k, fp("a"));
    let waker = Arc::new(Counter::default());
    let mut other_request = cache.claim_wait_async(&k, fp("b"), never);
    assert!(matches!(poll(&mut other_request, &waker), Poll::Ready(Ok(Claim::Mismatch))));
    let mut fresh = cache.claim_wait_async(&key("fresh"), fp("a"), never);
    assert!(matches!(poll(&mut fresh, &waker), Poll::Ready(Ok(Claim::Acquired(_)))));
    assert_eq!(cache.stats().waiting, 0);
}

#[test]
fn dropping_the_future_withdraws_its_waker_and_counts_nothing() {
    let (cache, _clock) = cache();
    let k = key("k");
    let owner = acquire(&cache, &k, fp("a"));
    let waker = Arc::new(Counter::default());
    let mut waiting = cache.claim_wait_async(&k, fp("a"), never);
    assert!(poll(&mut waiting, &waker).is_pending());
    assert!(poll(&mut waiting, &waker).is_pending(), "a second poll refiles, not adds");
    assert_eq!(cache.stats().waiting, 1);
    drop(waiting);
    assert_eq!(cache.stats().waiting, 0);
    owner.complete(&b"done"[..]).unwrap();
    assert_eq!(waker.woken(), 0, "a dropped future is not woken");
    let stats = cache.stats();
    assert_eq!((stats.in_progress, stats.replayed, stats.acquired), (0, 0, 1));
}

#[test]
fn a_lapse_is_noticed_through_the_callers_sleep_and_taken_over() {
    let (cache, clock) = cache();
    let k = key("k");
    let mut stale = acquire(&cache, &k, fp("a"));
    let sleep = HandSleep::default();
    let waker = Arc::new(Counter::default());
    let mut waiting = cache.claim_wait_async(&k, fp("a"), sleep.sleep());
    assert!(poll(&mut waiting, &waker).is_pending());
    assert_eq!(*sleep.asked.lock().unwrap(), [LEASE], "sleeps until the lease ends");

    // The owner extends: the next look sleeps until the new end.
    clock.advance(secs(4));
    stale.extend_lease(secs(20)).unwrap();
    assert!(poll(&mut waiting, &waker).is_pending());
    assert_eq!(sleep.asked.lock().unwrap()[1], secs(20));

    clock.advance(secs(21));
    sleep.over.store(true, Ordering::SeqCst);
    match poll(&mut waiting, &waker) {
        Poll::Ready(Ok(Claim::Acquired(guard))) => guard.complete(&b"new"[..]).unwrap(),
        other => panic!("expected the takeover, got {other:?}"),
    }
    assert!(stale.release().is_err(), "the stale owner is fenced off");
    match cache.peek(&k).unwrap().state {
        EntryState::Completed(replay) => assert_eq!(replay.body.unwrap(), "new"),
        other => panic!("{other:?}"),
    }
    assert_eq!(cache.stats().takeovers, 1);
}

#[test]
fn under_mark_unknown_a_lapse_noticed_by_a_waiter_is_unknown_not_taken_over() {
    let clock = ManualClock::new();
    let cache = builder(&clock)
        .lapse_policy(idemcache::LapsePolicy::MarkUnknown { ttl: UNKNOWN_TTL })
        .build()
        .unwrap();
    let k = key("k");
    let stale = acquire(&cache, &k, fp("a"));
    let sleep = HandSleep::default();
    let waker = Arc::new(Counter::default());
    let mut waiting = cache.claim_wait_async(&k, fp("a"), sleep.sleep());
    assert!(poll(&mut waiting, &waker).is_pending());
    clock.advance(LEASE);
    sleep.over.store(true, Ordering::SeqCst);
    match poll(&mut waiting, &waker) {
        Poll::Ready(Ok(Claim::Unknown { marked_at, .. })) => {
            assert_eq!(marked_at, idemcache::Timestamp::from_nanos(0).saturating_add(LEASE));
        }
        other => panic!("a lapse under MarkUnknown must answer Unknown, got {other:?}"),
    }
    // The blocking wait answers the same at once.
    assert!(matches!(
        cache.claim_wait(&k, fp("a"), Duration::from_secs(1)).unwrap(),
        Claim::Unknown { .. }
    ));
    assert!(stale.release().is_err(), "the stale owner is fenced off");
    let stats = cache.stats();
    assert_eq!((stats.takeovers, stats.lapsed_unknown, stats.acquired), (0, 1, 1));
}

#[test]
#[should_panic(expected = "polled after it resolved")]
fn polling_after_the_answer_is_refused_not_counted_twice() {
    let (cache, _clock) = cache();
    let k = key("k");
    let waker = Arc::new(Counter::default());
    let mut waiting = cache.claim_wait_async(&k, fp("a"), never);
    let Poll::Ready(Ok(Claim::Acquired(_guard))) = poll(&mut waiting, &waker) else {
        panic!("a free key is acquired at once")
    };
    let _ = poll(&mut waiting, &waker);
}

/// Futures on one shard each keep their own place: a completion wakes every one of them
/// (two on one key, one on another key of the same shard).
#[test]
fn every_future_filed_on_a_shard_is_woken() {
    let clock = idemcache::ManualClock::new();
    let cache = builder(&clock).shards(1).build().unwrap();
    let (a, b) = (key("a"), key("b"));
    let (owner_a, _owner_b) = (acquire(&cache, &a, fp("r")), acquire(&cache, &b, fp("r")));
    let wakers: Vec<_> = (0..3).map(|_| Arc::new(Counter::default())).collect();
    let mut futures = [
        cache.claim_wait_async(&a, fp("r"), never),
        cache.claim_wait_async(&a, fp("r"), never),
        cache.claim_wait_async(&b, fp("r"), never),
    ];
    for (future, waker) in futures.iter_mut().zip(&wakers) {
        assert!(poll(future, waker).is_pending());
    }
    assert_eq!(cache.stats().waiting, 3);
    assert!(format!("{:?}", futures[2]).contains("WaitForClaim"));
    owner_a.complete(&b"done"[..]).unwrap();
    assert_eq!(wakers.iter().map(|w| w.woken()).collect::<Vec<_>>(), [1, 1, 1]);
    for future in &mut futures[..2] {
        assert!(matches!(poll(future, &wakers[0]), Poll::Ready(Ok(Claim::Completed(_)))));
    }
    assert!(poll(&mut futures[2], &wakers[2]).is_pending(), "b is still in progress: filed again");
}

// The edges of the contract an adversarial review found; each test failed before its
// fix, and the comment above it says how.

// Before: every wake-up of a waiter counted another "in progress" answer, including
// wake-ups for other keys of its shard.
#[test]
fn one_claim_wait_counts_one_answer_however_often_it_wakes() {
    let clock = ManualClock::new();
    let cache = builder(&clock).shards(1).build().unwrap();
    let owner = acquire(&cache, &key("slow"), fp("r"));
    let waiter = {
        let cache = cache.clone();
        std::thread::spawn(move || cache.claim_wait(&key("slow"), fp("r"), secs(60)).unwrap())
    };
    let give_up = std::time::Instant::now() + secs(30);
    while cache.stats().waiting == 0 {
        assert!(std::time::Instant::now() < give_up, "the waiter never slept");
        std::thread::yield_now();
    }
    // Other keys of the same (only) shard leave PROCESSING: each may wake the waiter,
    // which finds its own key still in progress and sleeps again.
    for i in 0..10 {
        acquire(&cache, &key(&format!("other{i}")), fp("r")).complete(&b"x"[..]).unwrap();
    }
    owner.complete(&b"done"[..]).unwrap();
    assert!(matches!(waiter.join().unwrap(), Claim::Completed(_)));
    // The call's one answer is the replay; its looks at the key in progress are not
    // answers (before: at least one, and one more per wake-up).
    let stats = cache.stats();
    assert_eq!((stats.in_progress, stats.replayed, stats.waiting), (0, 1, 0));
}

#[test]
fn a_claim_wait_that_times_out_counts_one_in_progress_answer() {
    let (cache, _clock) = cache();
    let _owner = acquire(&cache, &key("slow"), fp("r"));
    let claim = cache.claim_wait(&key("slow"), fp("r"), ms(1)).unwrap();
    assert!(matches!(claim, Claim::InProgress { .. }));
    assert_eq!(cache.stats().in_progress, 1);
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}
