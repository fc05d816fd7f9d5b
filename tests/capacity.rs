//! The size bound: the oldest tenth of completed entries goes in one step; in-flight and
//! unknown entries are never evicted; when nothing can go, claims fail closed.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use common::*;
use idemcache::{Cache, Claim, ClaimError, EntryState, Key, ManualClock, RemovalCause};
use proptest::prelude::*;

/// One shard, so the bound is exact and eviction order is global.
fn bounded(clock: &ManualClock, max_entries: usize) -> Cache {
    roomy_builder(clock).shards(1).max_entries(max_entries).build().unwrap()
}

#[test]
fn a_full_cache_evicts_the_oldest_tenth_of_completed_entries_in_one_step() {
    let clock = ManualClock::new();
    let evicted = Arc::new(Mutex::new(Vec::new()));
    let sink = evicted.clone();
    let cache = builder(&clock)
        .shards(1)
        .max_entries(100)
        .lease(secs(1000))
        .removal_listener(move |k: &Key, cause| {
            if cause == RemovalCause::Evicted {
                sink.lock().unwrap().push(k.client_key().to_owned());
            }
        })
        .build()
        .unwrap();
    // Completed in order k0, k1, ... one second apart; claimed in the reverse order, so
    // completion time, not insertion order, must decide.
    let guards: Vec<_> =
        (0..100).rev().map(|i| (i, acquire(&cache, &key(&format!("k{i}")), fp("r")))).collect();
    let mut guards: BTreeMap<_, _> = guards.into_iter().collect();
    for i in 0..100 {
        clock.advance(secs(1));
        guards.remove(&i).unwrap().complete(&b"r"[..]).unwrap();
    }
    let _new = acquire(&cache, &key("new"), fp("r"));
    let stats = cache.stats();
    assert_eq!((stats.evictions, stats.entries), (10, 91));
    let expected: Vec<String> = (0..10).map(|i| format!("k{i}")).collect();
    assert_eq!(*evicted.lock().unwrap(), expected);
    assert_eq!(cache.peek(&key("k9")), None);
    assert!(cache.peek(&key("k10")).is_some());
    // The next nine inserts fit without evicting again: the step made room for a tenth.
    for i in 0..9 {
        let _ = acquire(&cache, &key(&format!("more{i}")), fp("r")).complete(&b"r"[..]);
    }
    assert_eq!(cache.stats().evictions, 10);
    assert!(cache.stats().max_eviction_pause > std::time::Duration::ZERO);
    cache.debug_validate();
}

#[test]
fn evicted_results_are_freed_by_later_inserts_and_all_by_run_pending() {
    let clock = ManualClock::new();
    let cache = bounded(&clock, 100);
    let freed = Arc::new(AtomicUsize::new(0));
    for i in 0..100 {
        let body = tracked_body(&freed);
        acquire(&cache, &key(&format!("k{i}")), fp("r")).complete(body).unwrap();
    }
    // The 101st insert evicts ten entries in one step but frees only four of their
    // results, after unlocking; every later operation on the shard frees four more.
    let in_flight = acquire(&cache, &key("new"), fp("r"));
    assert_eq!((cache.stats().evictions, freed.load(Ordering::SeqCst)), (10, 4));
    let _ = cache.peek(&key("k50"));
    assert_eq!(freed.load(Ordering::SeqCst), 8);
    // A sweep frees the rest; the entries still in the cache keep theirs.
    cache.run_pending();
    assert_eq!(freed.load(Ordering::SeqCst), 10);
    drop((in_flight, cache)); // the guard holds the cache too
    assert_eq!(freed.load(Ordering::SeqCst), 100);
}

#[test]
fn a_small_result_is_copied_and_the_callers_buffer_let_go_at_once() {
    let cache = roomy_builder(&ManualClock::new()).build().unwrap();
    let freed = Arc::new(AtomicUsize::new(0));
    acquire(&cache, &key("small"), fp("r")).complete(tracked_body_of(128, &freed)).unwrap();
    assert_eq!(freed.load(Ordering::SeqCst), 1, "the cache kept the caller's small buffer");
    let body = replay(&cache, &key("small"), fp("r")).body.unwrap();
    assert_eq!(body, vec![b't'; 128], "the copy differs from what was completed");
    // A result over the packing size is kept as given, not copied.
    acquire(&cache, &key("large"), fp("r")).complete(tracked_body(&freed)).unwrap();
    assert_eq!(freed.load(Ordering::SeqCst), 1);
    cache.debug_validate();
}

#[test]
fn results_replayed_as_soon_as_they_complete_keep_their_bytes_as_more_are_packed() {
    // Each result is replayed (and looked at, and one removed) while its chunk is still
    // being filled: what was handed out must never change, across chunk boundaries.
    let cache = roomy_builder(&ManualClock::new()).shards(1).build().unwrap();
    let body_of = |i: usize| vec![(i % 251) as u8; 100 + i % 300];
    let mut handed_out = Vec::new();
    for i in 0..400 {
        let k = key(&format!("k{i}"));
        acquire(&cache, &k, fp("r")).complete(body_of(i)).unwrap();
        handed_out.push((i, replay(&cache, &k, fp("r")).body.unwrap()));
        let EntryState::Completed(seen) = cache.peek(&k).unwrap().state else {
            panic!("k{i} is not completed")
        };
        assert_eq!(seen.body.unwrap(), body_of(i));
        if i % 7 == 0 {
            let EntryState::Completed(removed) = cache.remove(&k).unwrap().state else {
                panic!("k{i} was not completed")
            };
            assert_eq!(removed.body.unwrap(), body_of(i));
        }
    }
    for (i, body) in &handed_out {
        assert_eq!(body, &body_of(*i), "the result handed out for k{i} changed");
        if i % 7 != 0 {
            assert_eq!(replay(&cache, &key(&format!("k{i}")), fp("r")).body.unwrap(), body_of(*i));
        }
    }
    cache.debug_validate();
}

#[test]
fn a_small_result_kept_for_its_own_ttl_is_not_packed() {
    // Only results kept for the default TTL share chunks (whose memory goes when their
    // last result does); one kept longer keeps its own buffer instead.
    let cache = roomy_builder(&ManualClock::new()).build().unwrap();
    let freed = Arc::new(AtomicUsize::new(0));
    let mut guard = acquire(&cache, &key("longer"), fp("r"));
    guard.set_result_ttl(secs(10 * 24 * 3600)).unwrap();
    guard.complete(tracked_body_of(128, &freed)).unwrap();
    assert_eq!(freed.load(Ordering::SeqCst), 0);
    cache.remove(&key("longer"));
    assert_eq!(freed.load(Ordering::SeqCst), 1);
}

#[test]
fn in_flight_and_unknown_survive_a_flood_of_new_keys() {
    let clock = ManualClock::new();
    let cache = bounded(&clock, 64);
    let owners: Vec<_> =
        (0..10).map(|i| acquire(&cache, &key(&format!("busy{i}")), fp("r"))).collect();
    for i in 0..5 {
        acquire(&cache, &key(&format!("unsure{i}")), fp("r")).mark_unknown().unwrap();
    }
    for i in 0..5000 {
        acquire(&cache, &key(&format!("flood{i}")), fp("r")).complete(&b"r"[..]).unwrap();
        assert!(cache.stats().entries <= 64);
    }
    for i in 0..10 {
        assert!(matches!(
            cache.peek(&key(&format!("busy{i}"))).unwrap().state,
            EntryState::Processing { .. }
        ));
    }
    for i in 0..5 {
        assert!(matches!(
            cache.claim(&key(&format!("unsure{i}")), fp("r")).unwrap(),
            Claim::Unknown { .. }
        ));
    }
    for owner in owners {
        owner.complete(&b"done"[..]).unwrap();
    }
    cache.debug_validate();
}

#[test]
fn a_cache_full_of_in_flight_work_refuses_claims_and_changes_nothing() {
    let clock = ManualClock::new();
    let cache = bounded(&clock, 64);
    let mut owners: Vec<_> =
        (0..64).map(|i| acquire(&cache, &key(&format!("busy{i}")), fp("r"))).collect();
    let before = cache.stats();
    assert_eq!(
        cache.claim(&key("one-too-many"), fp("r")).unwrap_err(),
        ClaimError::CapacityExhausted
    );
    assert_eq!(cache.peek(&key("one-too-many")), None);
    let after = cache.stats();
    assert_eq!(
        (after.entries, after.bytes, after.capacity_refusals),
        (before.entries, before.bytes, 1)
    );
    // Repeats of in-flight keys are still answered: a refusal only concerns new keys.
    assert!(matches!(cache.claim(&key("busy0"), fp("r")).unwrap(), Claim::InProgress { .. }));
    // Once one completes, it is evictable, and the new key gets in.
    owners.pop().unwrap().complete(&b"done"[..]).unwrap();
    let _in = acquire(&cache, &key("one-too-many"), fp("r"));
    assert_eq!(cache.stats().evictions, 1);
}

#[test]
fn lapsed_leases_do_not_keep_a_full_cache_refusing() {
    let clock = ManualClock::new();
    // A 100 s lease sits on the wheel's second level, so the bounded sweep that precedes
    // eviction only cascades; the cache must sweep fully before it may refuse.
    let cache = builder(&clock).shards(1).max_entries(64).lease(secs(100)).build().unwrap();
    let _stale: Vec<_> =
        (0..64).map(|i| acquire(&cache, &key(&format!("busy{i}")), fp("r"))).collect();
    clock.advance(secs(100));
    let _in = acquire(&cache, &key("after-the-lapse"), fp("r"));
    assert_eq!(cache.stats().capacity_refusals, 0);
}

#[test]
fn the_byte_bound_evicts_and_a_result_with_no_room_is_kept_without_its_body() {
    let clock = ManualClock::new();
    let cache =
        builder(&clock).shards(1).max_result_size(32 * 1024).max_bytes(64 * 1024).build().unwrap();
    // Under the bound nothing is evicted...
    for i in 0..3 {
        acquire(&cache, &key(&format!("small{i}")), fp("r")).complete(vec![0u8; 1024]).unwrap();
    }
    assert_eq!((cache.stats().evictions, cache.stats().oversized), (0, 0));
    // ...and over it, the oldest completed entries go.
    for i in 0..20 {
        acquire(&cache, &key(&format!("big{i}")), fp("r")).complete(vec![0u8; 16 * 1024]).unwrap();
        assert!(cache.stats().bytes <= 64 * 1024);
    }
    assert!(cache.stats().evictions > 0);
    // Fill the rest with in-flight work so nothing is evictable, then complete big.
    let mut owners = Vec::new();
    while let Ok(Claim::Acquired(g)) = cache.claim(&key(&format!("busy{}", owners.len())), fp("r"))
    {
        owners.push(g);
    }
    let last = owners.pop().unwrap();
    let k = key(&format!("busy{}", owners.len()));
    last.complete(vec![1u8; 30 * 1024]).unwrap();
    let replay = replay(&cache, &k, fp("r"));
    assert!(!replay.body_kept(), "no room: completed without body, never released");
    assert!(cache.stats().bytes <= 64 * 1024);
    cache.debug_validate();
}

#[derive(Debug, Clone)]
enum Op {
    Claim(u8),
    Complete(u8),
    MarkUnknown(u8),
    Release(u8),
    Advance(u8),
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Under any sequence, with a tiny bound: the bound holds; in-flight and unknown entries
    /// are there until their deadline; and a claim is refused only when every entry is live
    /// and in flight or unknown.
    #[test]
    fn the_bound_holds_and_never_costs_in_flight_work(ops in proptest::collection::vec(
        prop_oneof![
            4 => (0u8..40).prop_map(Op::Claim),
            3 => any::<u8>().prop_map(Op::Complete),
            1 => any::<u8>().prop_map(Op::MarkUnknown),
            1 => any::<u8>().prop_map(Op::Release),
            1 => (0u8..30).prop_map(Op::Advance),
        ],
        1..120,
    )) {
        const MAX: usize = 8;
        let clock = ManualClock::new();
        let cache = bounded(&clock, MAX);
        let mut guards = Vec::new();
        let mut next_id = 0u32;
        // Keys that must be present: key → (owning guard, or none once unknown; deadline).
        let mut protected: BTreeMap<u8, (Option<u32>, u64)> = BTreeMap::new();
        let mut now = 0u64;
        for op in ops {
            match op {
                Op::Claim(k) => match cache.claim(&key(&format!("k{k}")), fp("r")) {
                    Ok(Claim::Acquired(g)) => {
                        next_id += 1;
                        protected.insert(k, (Some(next_id), now + LEASE.as_secs()));
                        guards.push((k, next_id, g));
                    }
                    Ok(_) => {}
                    Err(ClaimError::CapacityExhausted) => {
                        let live = protected.values().filter(|&&(_, d)| d > now).count();
                        prop_assert_eq!(live, MAX, "refused with room for more");
                    }
                    Err(e) => panic!("unexpected {e:?}"),
                },
                Op::Complete(i) | Op::MarkUnknown(i) | Op::Release(i) if !guards.is_empty() => {
                    let (k, id, g) = guards.swap_remove(i as usize % guards.len());
                    let owned = protected.get(&k).is_some_and(|&(owner, d)| owner == Some(id) && d > now);
                    let result = match op {
                        Op::Complete(_) => g.complete(&b"r"[..]),
                        Op::MarkUnknown(_) => g.mark_unknown(),
                        _ => g.release(),
                    };
                    prop_assert_eq!(result.is_ok(), owned);
                    match op {
                        Op::MarkUnknown(_) if owned => {
                            protected.insert(k, (None, now + UNKNOWN_TTL.as_secs()));
                        }
                        _ if owned => {
                            protected.remove(&k);
                        }
                        _ => {}
                    }
                }
                Op::Advance(s) => {
                    clock.advance(secs(s.into()));
                    now += u64::from(s);
                }
                _ => {}
            }
            cache.debug_validate();
            prop_assert!(cache.stats().entries as usize <= MAX);
            for (k, &(_, deadline)) in &protected {
                if deadline > now {
                    prop_assert!(cache.peek(&key(&format!("k{k}"))).is_some(), "k{} was evicted", k);
                }
            }
        }
    }
}
