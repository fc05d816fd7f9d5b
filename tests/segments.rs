//! One shard whose entries fill several of its slab's segments (16,384 slots each,
//! `src/shard/slab.rs`): guards, lapses, eviction, snapshots and expiry each reach the
//! entry they name across segment boundaries, and freed slots are reused. (Written by
//! an adversarial review of the segmented slab.)

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::*;
use idemcache::snapshot::{read_bytes, Load, SnapshotFile, SnapshotState};
use idemcache::{
    Claim, ClaimGuard, EntryState, Key, LapsePolicy, LeaseLost, ManualClock, RemovalCause,
};

const SEG: usize = 16_384;

fn k(i: usize) -> Key {
    key(&format!("k{i}"))
}

fn body(i: usize) -> bytes::Bytes {
    bytes::Bytes::from(format!("r{i}"))
}

fn boundaryish(i: usize) -> bool {
    let m = i % SEG;
    m <= 2 || m >= SEG - 2
}

/// Guards held on slots at every segment boundary while later segments fill, then
/// settled (complete / release / mark_unknown / extend) out of order.
#[test]
fn guards_on_boundary_slots_settle_their_own_entries() {
    let clock = ManualClock::new();
    let cache = roomy_builder(&clock).shards(1).lease(secs(10_000)).build().unwrap();
    const N: usize = 3 * SEG + 3;
    let mut held: Vec<(usize, ClaimGuard)> = Vec::new();
    for i in 0..N {
        let g = acquire(&cache, &k(i), fp("r"));
        if boundaryish(i) {
            held.push((i, g));
        } else {
            g.complete(body(i)).unwrap();
        }
    }
    cache.debug_validate();
    held.reverse();
    for (n, (i, mut g)) in held.into_iter().enumerate() {
        match n % 4 {
            0 => g.complete(body(i)).unwrap(),
            1 => g.release().unwrap(),
            2 => g.mark_unknown().unwrap(),
            _ => {
                g.extend_lease(secs(20_000)).unwrap();
                g.complete(body(i)).unwrap();
            }
        }
    }
    cache.debug_validate();
    for i in 0..N {
        match cache.peek(&k(i)) {
            Some(s) if matches!(s.state, EntryState::Completed(_)) => {
                assert_eq!(replay(&cache, &k(i), fp("r")).body, Some(body(i)), "k{i}");
            }
            Some(s) => assert!(matches!(s.state, EntryState::Unknown { .. }), "k{i}"),
            None => assert!(boundaryish(i), "k{i} vanished"),
        }
    }
}

/// Leases lapse on the wheel across segments; the slots are reused by new keys; every
/// stale guard (same slot, old token) is refused and does not touch the new entry.
#[test]
fn stale_guards_on_reused_slots_in_later_segments_are_refused() {
    let clock = ManualClock::new();
    let cache = roomy_builder(&clock).shards(1).build().unwrap();
    const N: usize = 2 * SEG + 10;
    let old: Vec<ClaimGuard> = (0..N).map(|i| acquire(&cache, &k(i), fp("old"))).collect();
    clock.advance(LEASE + secs(1));
    let reclaimed = cache.run_pending();
    assert_eq!(reclaimed, N);
    assert_eq!(cache.stats().entries, 0);
    cache.debug_validate();
    // New keys take the freed slots, in every segment.
    let fresh: Vec<ClaimGuard> = (0..N).map(|i| acquire(&cache, &k(N + i), fp("new"))).collect();
    cache.debug_validate();
    for (i, g) in old.into_iter().enumerate() {
        assert_eq!(g.complete(body(i)), Err(LeaseLost), "old guard {i} accepted");
    }
    for (i, g) in fresh.into_iter().enumerate() {
        g.complete(body(N + i)).unwrap();
    }
    cache.debug_validate();
    for i in 0..N {
        assert!(cache.peek(&k(i)).is_none());
        assert_eq!(replay(&cache, &k(N + i), fp("new")).body, Some(body(N + i)));
    }
    assert_eq!(cache.stats().entries as usize, N);
}

/// Eviction picks the oldest completed entry whichever segment it lives in: complete
/// in reverse slot order, so the oldest are in the last segment.
#[test]
fn eviction_takes_the_oldest_completed_even_from_the_last_segment() {
    const FULL: usize = 3 * SEG;
    let clock = ManualClock::new();
    let evicted = Arc::new(Mutex::new(Vec::new()));
    let sink = evicted.clone();
    let cache = roomy_builder(&clock)
        .shards(1)
        .max_entries(FULL)
        .lease(secs(100_000))
        .completed_ttl(secs(1_000_000))
        .removal_listener(move |k: &Key, cause| {
            if cause == RemovalCause::Evicted {
                sink.lock().unwrap().push(k.client_key().to_owned());
            }
        })
        .build()
        .unwrap();
    let guards: Vec<ClaimGuard> = (0..FULL).map(|i| acquire(&cache, &k(i), fp("r"))).collect();
    for (i, g) in guards.into_iter().enumerate().rev() {
        g.complete(body(i)).unwrap();
        clock.advance(Duration::from_millis(1));
    }
    cache.debug_validate();
    acquire(&cache, &k(FULL), fp("r")).complete(body(FULL)).unwrap();
    cache.debug_validate();
    let ev = evicted.lock().unwrap().clone();
    assert_eq!(ev.len(), FULL / 10);
    let expect: Vec<String> = (0..FULL).rev().take(FULL / 10).map(|i| format!("k{i}")).collect();
    assert_eq!(ev, expect);
    for i in 0..FULL - FULL / 10 {
        assert_eq!(replay(&cache, &k(i), fp("r")).body, Some(body(i)), "k{i}");
    }
}

fn wall() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(2_000_000_000)
}

/// A snapshot of one shard holding three segments (with holes, a PROCESSING entry
/// in each segment, UNKNOWN ones, a lapsed MarkUnknown lease) writes every entry once,
/// in slot order, and loads back whole.
#[test]
fn a_snapshot_of_a_shard_in_several_segments_round_trips() {
    let dir = std::env::temp_dir().join(format!("idemcache-slab-attack-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("s.snap");
    let clock = ManualClock::new();
    let cache = roomy_builder(&clock)
        .shards(1)
        .lapse_policy(LapsePolicy::MarkUnknown { ttl: UNKNOWN_TTL })
        .build()
        .unwrap();
    const N: usize = 3 * SEG + 100;
    let mut running = Vec::new();
    let mut lapsing = Vec::new();
    for i in 0..N {
        let g = acquire(&cache, &k(i), fp("r"));
        match i % 1000 {
            0 => lapsing.push(g),
            1 => running.push(g),
            2 => g.mark_unknown().unwrap(),
            _ => g.complete(body(i)).unwrap(),
        }
    }
    // leases of `lapsing` end; extend the others so they stay running
    for g in &mut running {
        g.extend_lease(secs(1000)).unwrap();
    }
    clock.advance(LEASE + secs(1));
    // holes in every segment, refilled by later keys
    for i in (5..N).step_by(997) {
        if i % 1000 > 2 {
            cache.remove(&k(i)).unwrap();
        }
    }
    let removed = |i: usize| i >= 5 && (i - 5).is_multiple_of(997) && i % 1000 > 2;
    let extra = 50;
    for i in N..N + extra {
        acquire(&cache, &k(i), fp("r")).complete(body(i)).unwrap();
    }
    cache.debug_validate();
    let saved = SnapshotFile::new(&path).wall_clock(wall).save(&cache).unwrap();
    cache.debug_validate();
    let live = (0..N + extra).filter(|&i| !removed(i)).count();
    assert_eq!(saved.entries as usize, live);
    let snap = read_bytes(&std::fs::read(&path).unwrap()).unwrap();
    let mut names: Vec<String> =
        snap.entries.iter().map(|e| e.key.client_key().to_owned()).collect();
    let n_before = names.len();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), n_before, "an entry written twice");
    // Entries never removed and never reused are in slot order = claim order.
    let order: Vec<usize> = snap
        .entries
        .iter()
        .map(|e| e.key.client_key()[1..].parse::<usize>().unwrap())
        .filter(|&i| i < N)
        .collect();
    assert!(order.windows(2).all(|w| w[0] < w[1]), "not in slot order");

    let clock2 = ManualClock::new();
    let restored = roomy_builder(&clock2).shards(1).build().unwrap();
    let loaded = SnapshotFile::new(&path).wall_clock(wall).load(&restored, Load::Strict).unwrap();
    assert_eq!(loaded.inserted, live);
    restored.debug_validate();
    for e in &snap.entries {
        let i: usize = e.key.client_key()[1..].parse().unwrap();
        match (&e.state, i % 1000) {
            (SnapshotState::Completed { body: b, .. }, m) if i >= N || m > 2 => {
                assert_eq!(b.as_ref(), Some(&body(i)), "k{i}");
                assert_eq!(replay(&restored, &k(i), fp("r")).body, Some(body(i)));
            }
            (SnapshotState::Unknown { .. }, 0..=2) if i < N => {
                assert!(matches!(restored.claim(&k(i), fp("r")).unwrap(), Claim::Unknown { .. }));
            }
            other => panic!("k{i}: {other:?}"),
        }
    }
    drop(running);
    drop(lapsing);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Completed TTLs expire across segments; the wheel reclaims every slot and the slab
/// refills them all without growing.
#[test]
fn expiry_across_segments_frees_every_slot_for_reuse() {
    let clock = ManualClock::new();
    let cache = roomy_builder(&clock).shards(1).max_entries(2 * SEG + 1).build().unwrap();
    const N: usize = 2 * SEG + 1;
    for round in 0..3 {
        for i in 0..N {
            acquire(&cache, &k(round * N + i), fp("r")).complete(body(i)).unwrap();
        }
        assert_eq!(cache.stats().entries as usize, N);
        cache.debug_validate();
        clock.advance(COMPLETED_TTL + secs(1));
        cache.run_pending();
        assert_eq!(cache.stats().entries, 0);
        cache.debug_validate();
    }
}
