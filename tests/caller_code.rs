//! Caller code (a removal listener, the owner of a result's buffer) never runs under a
//! shard lock, and its panics change nothing: the removal happened, the caller gets its
//! answer, every other removal is still told. Each test failed before its fix; the
//! comment above it says how.

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use common::*;
use idemcache::{Bytes, Cache, Claim, DropPolicy, Key, ManualClock, RemovalCause};

/// A removal listener that panics on every call, as `tx.send(..).unwrap()` does once its
/// receiver is gone.
fn panicking_listener(clock: &ManualClock, policy: DropPolicy) -> Cache {
    let (tx, rx) = mpsc::channel::<String>();
    drop(rx);
    let tx = Mutex::new(tx);
    Cache::builder()
        .clock(clock.clone())
        .lease(secs(10))
        .drop_policy(policy)
        .removal_listener(move |k: &Key, _| tx.lock().unwrap().send(k.client_key().into()).unwrap())
        .build()
        .unwrap()
}

// Before: the listener's panic dropped the new owner's guard while unwinding, whose
// release called the listener again: a panic during a panic, and the process aborted.
// (Run in this process: if it regresses, the test binary aborts.)
#[test]
fn a_panicking_listener_is_caught_counted_and_changes_nothing() {
    for policy in [DropPolicy::Release, DropPolicy::MarkUnknown] {
        let clock = ManualClock::new();
        let cache = panicking_listener(&clock, policy);
        let stale = acquire(&cache, &key("a"), fp("r"));
        clock.advance(secs(11));
        let claim = catch_unwind(AssertUnwindSafe(|| cache.claim(&key("a"), fp("r"))));
        let guard = match claim {
            Ok(Ok(Claim::Acquired(guard))) => guard,
            other => panic!("{policy:?}: expected the takeover to reach its caller, got {other:?}"),
        };
        assert_eq!(cache.stats().listener_panics, 1);
        // The new owner still owns the key: nobody executed it, so it is not UNKNOWN.
        assert!(matches!(cache.claim(&key("a"), fp("r")), Ok(Claim::InProgress { .. })));
        guard.complete(&b"done"[..]).unwrap();
        assert_eq!(replay(&cache, &key("a"), fp("r")).body.unwrap(), "done");
        drop(stale);
        cache.debug_validate();
    }
}

#[test]
fn every_removal_is_told_even_when_the_listener_panics_on_some() {
    let clock = ManualClock::new();
    let heard = Arc::new(Mutex::new(Vec::new()));
    let sink = heard.clone();
    let cache = builder(&clock)
        .shards(1)
        .max_entries(64)
        .removal_listener(move |k: &Key, cause| {
            let first = {
                let mut heard = sink.lock().unwrap();
                heard.push((k.client_key().to_owned(), cause));
                heard.len() == 1
            };
            assert!(!first, "the listener panics on the first removal it hears");
        })
        .build()
        .unwrap();
    for i in 0..64 {
        acquire(&cache, &key(&format!("k{i}")), fp("r")).complete(&b"r"[..]).unwrap();
    }
    let _new = acquire(&cache, &key("new"), fp("r")); // evicts the oldest six
    let heard = heard.lock().unwrap();
    assert_eq!(heard.len(), 6);
    assert!(heard.iter().all(|(_, cause)| *cause == RemovalCause::Evicted));
    assert_eq!(cache.stats().listener_panics, 1);
}

/// A body whose owner's `Drop` reads the cache's stats, which takes every shard's lock:
/// dropped under a shard's write lock, it deadlocks.
fn body_reading_stats(cache: &Cache, len: usize, dropped: &Arc<AtomicUsize>) -> Bytes {
    struct Owner(Vec<u8>, Cache, Arc<AtomicUsize>);
    impl AsRef<[u8]> for Owner {
        fn as_ref(&self) -> &[u8] {
            &self.0
        }
    }
    impl Drop for Owner {
        fn drop(&mut self) {
            let _ = self.1.stats();
            self.2.fetch_add(1, Ordering::SeqCst);
        }
    }
    Bytes::from_owner(Owner(vec![b'b'; len], cache.clone(), dropped.clone()))
}

// Before: a packed small body, an oversized body, a refused completion's body and the
// bodies of departed entries were dropped under the shard's write lock: deadlock.
#[test]
fn caller_bodies_are_never_dropped_under_the_shard_lock() {
    let clock = ManualClock::new();
    let cache = roomy_builder(&clock).shards(1).max_entries(64).build().unwrap();
    let dropped = Arc::new(AtomicUsize::new(0));
    // Packed (copied) at once, oversized, and kept as given.
    let packed = acquire(&cache, &key("small"), fp("r"));
    packed.complete(body_reading_stats(&cache, 16, &dropped)).unwrap();
    assert_eq!(dropped.load(Ordering::SeqCst), 1);
    acquire(&cache, &key("huge"), fp("r"))
        .complete(body_reading_stats(&cache, KEPT_AS_GIVEN + 1, &dropped))
        .unwrap();
    assert_eq!(dropped.load(Ordering::SeqCst), 2);
    // A stale guard's body is dropped too, unlocked.
    let stale = acquire(&cache, &key("stale"), fp("r"));
    clock.advance(LEASE);
    assert!(stale.complete(body_reading_stats(&cache, 16, &dropped)).is_err());
    assert_eq!(dropped.load(Ordering::SeqCst), 3);
    // Kept as given: dropped when the entry leaves, by expiry, eviction and removal.
    for i in 0..70 {
        let body = body_reading_stats(&cache, KEPT_AS_GIVEN, &dropped);
        acquire(&cache, &key(&format!("kept{i}")), fp("r")).complete(body).unwrap();
    }
    let _ = cache.remove(&key("kept69"));
    clock.advance(COMPLETED_TTL);
    cache.run_pending();
    assert_eq!(dropped.load(Ordering::SeqCst), 73);
    cache.debug_validate();
}

// A listener panicking with a payload whose own `Drop` panics: dropping the caught
// payload panicked again, out of `tell`, losing the rest of the batch.
#[test]
fn a_listener_panic_payload_that_panics_when_dropped_is_contained_too() {
    struct Bomb;
    impl Drop for Bomb {
        fn drop(&mut self) {
            if !std::thread::panicking() {
                panic!("the payload's drop panics");
            }
        }
    }
    let clock = ManualClock::new();
    let heard = Arc::new(AtomicUsize::new(0));
    let count = heard.clone();
    let cache = builder(&clock)
        .shards(1)
        .max_entries(64)
        .removal_listener(move |_, _| {
            count.fetch_add(1, Ordering::SeqCst);
            std::panic::panic_any(Bomb)
        })
        .build()
        .unwrap();
    for i in 0..65 {
        acquire(&cache, &key(&format!("k{i}")), fp("r")).complete(&b"x"[..]).unwrap();
    }
    assert_eq!(heard.load(Ordering::SeqCst), 6);
    assert_eq!(cache.stats().listener_panics, 6);
}
