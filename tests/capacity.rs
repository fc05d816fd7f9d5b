//! The size bound: the oldest tenth of completed entries goes in one step; in-flight and
//! unknown entries are never evicted; when nothing can go, claims fail closed.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use common::*;
use std::time::Duration;

use idemcache::{
    Cache, Claim, ClaimError, EntryState, Key, ManualClock, RemovalCause, ENTRY_OVERHEAD,
};
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

/// The byte bound is shared among the shards (each holds its share): results far under
/// the whole bound, spread over several shards, are all kept with their bodies.
#[test]
fn the_byte_bound_is_split_among_the_shards() {
    let clock = ManualClock::new();
    let cache = builder(&clock).shards(4).max_result_size(4096).max_bytes(4 << 20).build().unwrap();
    for i in 0..100 {
        acquire(&cache, &key(&format!("k{i}")), fp("r")).complete(vec![7u8; 1024]).unwrap();
    }
    assert_eq!((cache.stats().evictions, cache.stats().oversized), (0, 0));
    for i in 0..100 {
        let replay = replay(&cache, &key(&format!("k{i}")), fp("r"));
        assert!(replay.body_kept(), "k{i} lost its body under a bound 40x its size");
    }
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

// The edges of the contract an adversarial review found; each test failed before its
// fix, and the comment above it says how.

// Before: `make_room` swept to floor(now / tick) while a dead entry is due at
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

// Before: 50 small results were evicted to make room for a body that could not fit
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
    let long = |i: usize| Key::new("POST /v1/orders", &"t".repeat(1000), format!("k{i}")).unwrap();
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

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn one_shard(clock: &ManualClock) -> idemcache::CacheBuilder {
    Cache::builder().clock(clock.clone()).shards(1)
}

/// A shard's entries live in segments of 16,384 slots: slots freed by eviction and by
/// removal, in the first segment and in later ones, are reused by new keys, and every
/// key still reads back its own result (a slot mixed up across segments would answer
/// with another key's, or with none).
#[test]
fn slots_freed_across_segments_are_reused_and_every_key_keeps_its_own_result() {
    const FULL: usize = 40_000; // three segments
    let clock = ManualClock::new();
    let cache = bounded(&clock, FULL);
    let body = |i: usize| bytes::Bytes::from(format!("result {i}"));
    let claim_complete = |i: usize| {
        acquire(&cache, &key(&format!("k{i}")), fp("r")).complete(body(i)).unwrap();
        clock.advance(Duration::from_millis(1));
    };
    (0..FULL).for_each(claim_complete);
    // Full: the next claim evicts the oldest tenth (k0..k3999, first-segment slots).
    (FULL..FULL + 500).for_each(claim_complete);
    // Removals in the second and third segments, then keys to reuse their slots.
    let removed = |i: usize| (17_000..39_000).contains(&i) && (i - 17_000).is_multiple_of(7);
    for i in (17_000..39_000).filter(|&i| removed(i)) {
        assert!(cache.remove(&key(&format!("k{i}"))).is_some(), "k{i} was there");
    }
    (FULL + 500..FULL + 3_500).for_each(claim_complete);
    cache.debug_validate();
    let mut live = 0;
    for i in (FULL / 10..FULL + 3_500).filter(|&i| !removed(i)) {
        let r = replay(&cache, &key(&format!("k{i}")), fp("r"));
        assert_eq!(r.body, Some(body(i)), "k{i} answered another key's result");
        live += 1;
    }
    assert_eq!(cache.stats().entries, live, "nothing else is left");
}
