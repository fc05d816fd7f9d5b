//! Regression tests for the contract defects an adversarial review found (issue 10),
//! one per reproduction, each named for the promise it checks. Each failed before its
//! fix; the comment above it says how.

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use common::*;
use idemcache::{
    Bytes, Cache, Claim, ClaimError, DropPolicy, Key, ManualClock, RemovalCause, ENTRY_OVERHEAD,
    MAX_TICK,
};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn one_shard(clock: &ManualClock) -> idemcache::CacheBuilder {
    Cache::builder().clock(clock.clone()).shards(1)
}

// D1. Before: `make_room` swept to floor(now / tick) while a dead entry is due at
// ceil(deadline / tick), so 64 lapsed leases inside the current tick still filled the
// shard and the claim was refused.
#[test]
fn entries_dead_within_the_current_tick_do_not_count_against_the_bound() {
    let clock = ManualClock::new();
    let cache = one_shard(&clock).max_entries(64).lease(secs(10)).build().unwrap();
    clock.advance(ms(500));
    let guards: Vec<_> =
        (0..64).map(|i| acquire(&cache, &key(&format!("k{i}")), fp("r"))).collect();
    clock.advance(secs(10) + ms(200)); // every lease ended at 10.5 s; now 10.7 s
    let _new = acquire(&cache, &key("new"), fp("r"));
    let stats = cache.stats();
    assert_eq!((stats.capacity_refusals, stats.evictions, stats.takeovers), (0, 0, 64));
    assert_eq!(stats.entries, 1);
    drop(guards);
    cache.debug_validate();
}

// D1, second form. Before: 54 lapsed in-flight entries kept their room, so the new claim
// evicted a live completed result instead.
#[test]
fn a_live_completed_result_is_not_evicted_while_dead_entries_hold_room() {
    let clock = ManualClock::new();
    let cache = one_shard(&clock)
        .max_entries(64)
        .lease(secs(10))
        .completed_ttl(secs(3600))
        .build()
        .unwrap();
    clock.advance(ms(500));
    for i in 0..10 {
        acquire(&cache, &key(&format!("done{i}")), fp("r")).complete(&b"ok"[..]).unwrap();
    }
    let stale: Vec<_> = (0..54).map(|i| acquire(&cache, &key(&format!("k{i}")), fp("r"))).collect();
    clock.advance(secs(10) + ms(200));
    let _new = acquire(&cache, &key("new"), fp("r"));
    assert_eq!(cache.stats().evictions, 0);
    for i in 0..10 {
        assert_eq!(replay(&cache, &key(&format!("done{i}")), fp("r")).body.unwrap(), "ok");
    }
    drop(stale);
    cache.debug_validate();
}

// D1 on the system clock's default settings, with time driven by hand: a 100 ms lease
// and the 1 s tick. Before: refused until the next whole second.
#[test]
fn a_short_lease_frees_its_room_at_its_end_not_at_the_next_tick() {
    let clock = ManualClock::new();
    let cache = one_shard(&clock).max_entries(64).lease(ms(100)).build().unwrap();
    clock.advance(ms(10));
    let stale: Vec<_> = (0..64).map(|i| acquire(&cache, &key(&format!("k{i}")), fp("r"))).collect();
    assert_eq!(cache.claim(&key("early"), fp("r")).unwrap_err(), ClaimError::CapacityExhausted);
    clock.advance(ms(100)); // 110 ms: every lease ended at 110 ms
    let _new = acquire(&cache, &key("new"), fp("r"));
    drop(stale);
    // `run_pending` reclaims what died inside the tick too: "every expired entry".
    clock.advance(ms(150));
    assert_eq!(cache.run_pending(), 1, "the new claim's own lease ended at 210 ms");
    assert_eq!(cache.stats().entries, 0);
    cache.debug_validate();
}

// D2. Before: 50 small results were evicted to make room for a body that could not fit
// even in an empty shard, and the body was dropped anyway.
#[test]
fn a_body_that_cannot_fit_evicts_nothing_and_is_kept_without_its_body() {
    let clock = ManualClock::new();
    let cache = one_shard(&clock).max_bytes(64 * 1024).build().unwrap();
    for i in 0..50 {
        acquire(&cache, &key(&format!("done{i}")), fp("r")).complete(&b"receipt"[..]).unwrap();
    }
    acquire(&cache, &key("big"), fp("r")).complete(vec![7u8; 64 * 1024]).unwrap();
    let stats = cache.stats();
    assert_eq!((stats.evictions, stats.oversized, stats.entries), (0, 1, 51));
    assert_eq!(replay(&cache, &key("big"), fp("r")).body, None);
    assert_eq!(replay(&cache, &key("done0"), fp("r")).body.unwrap(), "receipt");
    cache.debug_validate();
}

// D2, second form. Before: the refused claim evicted the one completed entry first.
#[test]
fn a_claim_refused_for_lack_of_room_evicts_nothing() {
    let clock = ManualClock::new();
    let cache = one_shard(&clock).max_bytes(64 * 1024).lease(secs(1000)).build().unwrap();
    let long = |i: usize| Key::new("POST /v1/orders", &"t".repeat(1000), &format!("k{i}")).unwrap();
    let per_entry = long(0).as_bytes().len() + ENTRY_OVERHEAD;
    acquire(&cache, &key("done"), fp("r")).complete(&b"kept"[..]).unwrap();
    let room = 64 * 1024 - (key("done").as_bytes().len() + 4 + ENTRY_OVERHEAD);
    let fill = room / per_entry;
    let held: Vec<_> = (0..fill).map(|i| acquire(&cache, &long(i), fp("r"))).collect();
    // One completed entry's room is less than a long-keyed entry's: evicting it cannot help.
    assert!(key("done").as_bytes().len() + 4 + ENTRY_OVERHEAD + room % per_entry < per_entry);
    let before = cache.stats();
    assert_eq!(cache.claim(&long(fill), fp("r")).unwrap_err(), ClaimError::CapacityExhausted);
    let after = cache.stats();
    assert_eq!(after.evictions, 0);
    assert_eq!((after.entries, after.bytes), (before.entries, before.bytes));
    assert_eq!(replay(&cache, &key("done"), fp("r")).body.unwrap(), "kept");
    drop(held);
    cache.debug_validate();
}

#[test]
fn the_builder_refuses_results_larger_than_the_whole_byte_bound_and_shards_for_large_ones() {
    let err = Cache::builder().max_bytes(64 * 1024).max_result_size(64 * 1024 + 1).build();
    assert_eq!(
        err.unwrap_err(),
        idemcache::BuildError::MaxResultSizeAboveMaxBytes {
            max_result_size: 64 * 1024 + 1,
            max_bytes: 64 * 1024
        }
    );
    // 1 MiB over 16 shards would leave 64 KiB a shard, a single default-size result: the
    // shard count is lowered until each shard holds four.
    let cache = Cache::builder().shards(16).max_bytes(1024 * 1024).build().unwrap();
    assert_eq!(cache.shard_count(), 4);
    let cache = Cache::builder().shards(16).max_bytes(1024 * 1024).max_result_size(1024).build();
    assert_eq!(cache.unwrap().shard_count(), 16);
}

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

// D3. Before: the listener's panic dropped the new owner's guard while unwinding, whose
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

// D4. Before: `now + lease` saturated to `now`, so a fresh guard was born dead (its
// `complete` got `LeaseLost`) and its entry, due at a tick no clock reaches, was never
// reclaimed.
#[test]
fn a_clock_at_the_end_of_time_refuses_claims_and_changes_nothing() {
    let clock = ManualClock::new();
    let cache = builder(&clock).build().unwrap();
    clock.advance(Duration::from_nanos(u64::MAX - 5_000_000_000));
    match cache.claim(&key("late"), fp("r")) {
        Err(ClaimError::ClockOutOfRange { now }) => assert_eq!(now, cache.now()),
        other => panic!("expected ClockOutOfRange, got {other:?}"),
    }
    assert_eq!(cache.stats().entries, 0);
}

#[test]
fn entries_made_near_the_end_of_time_live_their_lease_and_are_always_reclaimed() {
    let clock = ManualClock::new();
    let cache = builder(&clock).tick(MAX_TICK).build().unwrap();
    // The latest start a lease of LEASE can run its length from.
    let latest = u64::MAX - MAX_TICK.as_nanos() as u64 - LEASE.as_nanos() as u64;
    clock.advance(Duration::from_nanos(latest - 1));
    let guards: Vec<_> =
        (0..11).map(|i| acquire(&cache, &key(&format!("k{i}")), fp("r"))).collect();
    let mut guards = guards.into_iter();
    clock.advance(LEASE - Duration::from_nanos(1));
    guards.next().unwrap().complete(&b"r"[..]).unwrap();
    guards.next().unwrap().mark_unknown().unwrap();
    let mut extended = guards.next().unwrap();
    extended.extend_lease(secs(3600)).unwrap();
    clock.advance(Duration::from_nanos(u64::MAX)); // saturates at the end of time
    cache.run_pending();
    let stats = cache.stats();
    assert_eq!((stats.entries, stats.bytes), (0, 0));
    drop((guards, extended));
}

// D5. Before: every wake-up of a waiter counted another "in progress" answer, including
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

// D6. Before: a packed small body, an oversized body, a refused completion's body and the
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

// Found by the adversarial review of the fixes above.

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

// `max_entries / shards` was rounded up: eight shards of 65 held 520 > 513 entries.
// (Shards now hold at least 512 entries: eight of 513 hold 4,104 > 4,097.)
#[test]
fn the_shards_together_never_hold_more_than_max_entries() {
    let clock = ManualClock::new();
    let cache = builder(&clock).shards(8).max_entries(4097).lease(secs(1000)).build().unwrap();
    assert_eq!(cache.shard_count(), 8);
    let mut held = Vec::new();
    for i in 0..12_000 {
        if let Ok(Claim::Acquired(guard)) = cache.claim(&key(&format!("k{i}")), fp("r")) {
            held.push(guard);
        }
    }
    assert!(held.len() <= 4097, "{} entries held", held.len());
    assert_eq!(held.len(), 8 * (4097 / 8));
}

// A fact inserted within an hour of the end of time was refused as `TtlTooLong`; it is
// kept until the last deadline, as a completion that late is.
#[test]
fn a_fact_inserted_near_the_end_of_time_is_kept_until_the_last_deadline() {
    let clock = ManualClock::new();
    let cache = builder(&clock).build().unwrap();
    clock.advance(Duration::from_nanos(u64::MAX - 2 * MAX_TICK.as_nanos() as u64));
    let now = cache.now();
    let fact =
        idemcache::Known::Unknown { marked_at: now, expires_at: now.saturating_add(secs(7200)) };
    cache.insert(&key("late"), fp("r"), fact).unwrap();
    let Ok(Claim::Unknown { expires_at, .. }) = cache.claim(&key("late"), fp("r")) else {
        panic!("expected the inserted mark")
    };
    assert_eq!(expires_at, now.saturating_add(MAX_TICK));
    clock.advance(MAX_TICK);
    let too_late = idemcache::Known::Unknown {
        marked_at: cache.now(),
        expires_at: cache.now().saturating_add(secs(5)),
    };
    assert_eq!(
        cache.insert(&key("later"), fp("r"), too_late),
        Err(idemcache::InsertError::Expired)
    );
    cache.run_pending();
    assert_eq!(cache.stats().entries, 0);
}

// The wheel's validator rejected a state the wheel allows: a bounded sweep stopping part
// way through cascading a higher slot (a false failure for every test that validates).
#[test]
fn a_sweep_stopped_mid_cascade_leaves_a_valid_wheel_and_finishes_later() {
    let clock = ManualClock::new();
    let cache = builder(&clock).shards(1).completed_ttl(secs(100)).build().unwrap();
    for i in 0..40 {
        acquire(&cache, &key(&format!("k{i}")), fp("r")).complete(&b"x"[..]).unwrap();
    }
    clock.advance(secs(300));
    // This claim's bounded sweep (16 moves) stops among the 40 due entries.
    acquire(&cache, &key("sweeper"), fp("r")).release().unwrap();
    assert!(cache.stats().entries > 0, "the sweep was meant to stop part way");
    cache.debug_validate();
    cache.run_pending();
    assert_eq!((cache.stats().entries, cache.stats().bytes), (0, 0));
    cache.debug_validate();
}

// D4's boundary: the last deadline is reachable. A lease that ends exactly there is
// granted; one nanosecond later it could not run its length.
#[test]
fn a_lease_ending_exactly_at_the_last_deadline_is_granted_and_not_a_nanosecond_later() {
    let clock = ManualClock::new();
    let cache = builder(&clock).build().unwrap();
    let latest = u64::MAX - MAX_TICK.as_nanos() as u64 - LEASE.as_nanos() as u64;
    clock.advance(Duration::from_nanos(latest));
    let guard = acquire(&cache, &key("a"), fp("r"));
    assert_eq!(guard.lease_ends_at().as_nanos(), u64::MAX - MAX_TICK.as_nanos() as u64);
    clock.advance(Duration::from_nanos(1));
    assert!(matches!(cache.claim(&key("b"), fp("r")), Err(ClaimError::ClockOutOfRange { .. })));
    guard.complete(&b"r"[..]).unwrap();
    cache.debug_validate();
}
