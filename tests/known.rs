//! Facts learned elsewhere (`Cache::insert`), the reconciler's list of UNKNOWN entries,
//! the cache's clock as callers see it, and fencing tokens across restarts.

mod common;

use std::time::{Duration, SystemTime};

use common::*;
use idemcache::{
    Bytes, Cache, Claim, EntryState, InsertError, ManualClock, Outcome, SetResultTtlError,
    Timestamp, MAX_DURATION,
};

fn at(s: u64) -> Timestamp {
    Timestamp::from_nanos(s * 1_000_000_000)
}

fn completed(body: &'static [u8], completed_at: Timestamp, expires_at: Timestamp) -> Outcome {
    Outcome::Completed { body: Some(Bytes::from_static(body)), completed_at, expires_at }
}

#[test]
fn an_inserted_result_is_replayed_with_its_original_times_and_counts_as_inserted() {
    let (cache, clock) = cache();
    clock.advance(secs(1000));
    cache.insert(&key("k"), fp("r"), completed(b"receipt", at(400), at(1100))).unwrap();
    let replay = replay(&cache, &key("k"), fp("r"));
    assert_eq!(replay.body.unwrap(), "receipt");
    assert_eq!((replay.completed_at, replay.expires_at), (at(400), at(1100)));
    assert!(matches!(cache.claim(&key("k"), fp("other")), Ok(Claim::Mismatch)));
    let stats = cache.stats();
    assert_eq!((stats.inserted, stats.acquired, stats.completions), (1, 0, 0));
    // It expires at its own deadline, not a TTL from now.
    clock.advance(secs(100));
    assert!(cache.claim(&key("k"), fp("r")).unwrap().is_acquired());
    cache.debug_validate();
}

#[test]
fn an_inserted_unknown_blocks_claims_until_resolved_and_is_listed() {
    let (cache, clock) = cache();
    clock.advance(secs(10));
    let known = Outcome::Unknown { marked_at: at(5), expires_at: at(40) };
    cache.insert(&key("u"), fp("r"), known).unwrap();
    assert!(matches!(
        cache.claim(&key("u"), fp("r")),
        Ok(Claim::Unknown { marked_at, expires_at }) if marked_at == at(5) && expires_at == at(40)
    ));
    let listed = cache.list_unknown(10);
    assert_eq!(listed.len(), 1);
    assert_eq!((&listed[0].key, listed[0].fingerprint), (&key("u"), fp("r")));
    cache.resolve(&key("u"), &b"checked"[..]).unwrap();
    assert!(cache.list_unknown(10).is_empty());
    assert_eq!(replay(&cache, &key("u"), fp("r")).body.unwrap(), "checked");
    cache.debug_validate();
}

#[test]
fn insert_never_displaces_a_live_entry_in_any_state() {
    let (cache, clock) = cache();
    let owner = acquire(&cache, &key("p"), fp("r"));
    let fact = || completed(b"from the store", Timestamp::ZERO, at(50));
    match cache.insert(&key("p"), fp("r"), fact()) {
        Err(InsertError::Occupied(snapshot)) => {
            assert!(
                matches!(snapshot.state, EntryState::Processing { token, .. } if token == owner.token())
            )
        }
        other => panic!("expected Occupied, got {other:?}"),
    }
    // The owner is not fenced out: its completion stands.
    owner.complete(&b"mine"[..]).unwrap();
    assert!(matches!(cache.insert(&key("p"), fp("r"), fact()), Err(InsertError::Occupied(_))));
    assert_eq!(replay(&cache, &key("p"), fp("r")).body.unwrap(), "mine");
    // A dead entry is no obstacle.
    clock.advance(COMPLETED_TTL);
    cache.insert(&key("p"), fp("r"), completed(b"later", clock_now(&cache), at(150))).unwrap();
    assert_eq!(replay(&cache, &key("p"), fp("r")).body.unwrap(), "later");
    cache.debug_validate();
}

fn clock_now(cache: &Cache) -> Timestamp {
    cache.now()
}

#[test]
fn insert_refuses_nonsense_times_and_changes_nothing() {
    let (cache, clock) = cache();
    clock.advance(secs(100));
    let k = key("t");
    assert_eq!(
        cache.insert(&k, fp("r"), completed(b"x", at(50), at(100))),
        Err(InsertError::Expired)
    );
    assert_eq!(
        cache.insert(&k, fp("r"), completed(b"x", at(101), at(200))),
        Err(InsertError::StartsInTheFuture)
    );
    let too_far = at(100).saturating_add(MAX_DURATION + Duration::from_nanos(1));
    assert_eq!(
        cache.insert(&k, fp("r"), completed(b"x", at(1), too_far)),
        Err(InsertError::TtlTooLong)
    );
    let stats = cache.stats();
    assert_eq!((stats.entries, stats.inserted), (0, 0));
    assert!(cache.claim(&k, fp("r")).unwrap().is_acquired());
}

#[test]
fn an_insert_living_exactly_max_duration_is_accepted() {
    let (cache, clock) = cache();
    clock.advance(secs(100));
    let exactly = at(100).saturating_add(MAX_DURATION);
    cache.insert(&key("t"), fp("r"), completed(b"x", at(1), exactly)).unwrap();
    assert_eq!(replay(&cache, &key("t"), fp("r")).expires_at, exactly);
}

/// Small results completed now share chunks with others expiring together; a fact with
/// the same deadline joins them, one with any other deadline is kept as given.
#[test]
fn a_fact_expiring_with_fresh_results_is_packed_and_any_other_is_kept_as_given() {
    let (cache, clock) = cache();
    clock.advance(secs(1000));
    let now = clock_now(&cache);
    let body = Bytes::from(vec![7u8; 8]);
    let fact = |expires_at| Outcome::Completed {
        body: Some(body.clone()),
        completed_at: at(900),
        expires_at,
    };
    cache.insert(&key("a"), fp("r"), fact(now.saturating_add(COMPLETED_TTL))).unwrap();
    cache.insert(&key("b"), fp("r"), fact(now.saturating_add(secs(50)))).unwrap();
    let packed = replay(&cache, &key("a"), fp("r")).body.unwrap();
    let as_given = replay(&cache, &key("b"), fp("r")).body.unwrap();
    assert_eq!((&packed[..], &as_given[..]), (&body[..], &body[..]));
    assert_ne!(packed.as_ptr(), body.as_ptr(), "copied into the shard's chunk");
    assert_eq!(as_given.as_ptr(), body.as_ptr(), "the caller's bytes, not a copy");
}

#[test]
fn an_inserted_result_over_the_size_limit_is_kept_without_its_body() {
    let (cache, _clock) = cache();
    let big = Outcome::Completed {
        body: Some(Bytes::from(vec![1u8; MAX_RESULT + 1])),
        completed_at: Timestamp::ZERO,
        expires_at: at(10),
    };
    cache.insert(&key("big"), fp("r"), big).unwrap();
    assert_eq!(replay(&cache, &key("big"), fp("r")).body, None);
    assert_eq!(cache.stats().oversized, 1);
}

#[test]
fn insert_fails_closed_when_the_shard_is_full_of_in_flight_work() {
    let clock = ManualClock::new();
    let cache = builder(&clock).shards(1).max_entries(64).build().unwrap();
    let held: Vec<_> = (0..64).map(|i| acquire(&cache, &key(&format!("k{i}")), fp("r"))).collect();
    let fact = completed(b"x", Timestamp::ZERO, at(10));
    assert_eq!(cache.insert(&key("new"), fp("r"), fact), Err(InsertError::CapacityExhausted));
    assert_eq!(cache.stats().entries, 64);
    drop(held);
}

#[test]
fn unknown_lists_the_oldest_marks_first_across_shards_and_skips_the_dead() {
    let clock = ManualClock::new();
    let cache = builder(&clock).shards(4).build().unwrap();
    for i in 0..20 {
        clock.advance(secs(1));
        acquire(&cache, &key(&format!("u{i}")), fp("r")).mark_unknown().unwrap();
    }
    let first = cache.list_unknown(5);
    let names: Vec<_> = first.iter().map(|e| e.key.client_key().to_owned()).collect();
    assert_eq!(names, ["u0", "u1", "u2", "u3", "u4"]);
    assert!(first.windows(2).all(|w| w[0].marked_at < w[1].marked_at));
    assert_eq!(first[0].expires_at, first[0].marked_at.saturating_add(UNKNOWN_TTL));
    // Settled ones leave the list; dead ones are never listed.
    cache.forget(&key("u0")).unwrap();
    cache.resolve(&key("u1"), &b"r"[..]).unwrap();
    clock.advance(UNKNOWN_TTL - secs(17)); // u0..u2 marked at 1..3 s: u2's mark ended at 53 s
    let next: Vec<_> =
        cache.list_unknown(3).into_iter().map(|e| e.key.client_key().to_owned()).collect();
    assert_eq!(next, ["u3", "u4", "u5"]);
    assert_eq!(cache.list_unknown(100).len(), 17);
    assert!(cache.list_unknown(0).is_empty());
}

#[test]
fn retry_after_and_wall_clock_times_come_from_the_cache_itself() {
    let (cache, clock) = cache();
    clock.advance(secs(7));
    assert_eq!(cache.now(), at(7));
    let _owner = acquire(&cache, &key("k"), fp("r"));
    let Ok(Claim::InProgress { lease_ends_at, .. }) = cache.claim(&key("k"), fp("r")) else {
        panic!("expected InProgress")
    };
    assert_eq!(cache.time_until(lease_ends_at), LEASE);
    clock.advance(secs(4));
    assert_eq!(cache.time_until(lease_ends_at), LEASE - secs(4));
    assert_eq!(cache.time_until(Timestamp::ZERO), Duration::ZERO);
    // Wall-clock mapping: a timestamp 3 s ahead is ~3 s after the system's now, and the
    // mapping round-trips (to within the time between the calls).
    let ahead = cache.now().saturating_add(secs(3));
    let wall = cache.system_time(ahead);
    let delta = wall.duration_since(SystemTime::now()).unwrap();
    assert!(delta <= secs(3) && delta > secs(2), "{delta:?}");
    let back = cache.timestamp_at(wall);
    assert!(
        back.saturating_duration_since(ahead) < secs(1)
            && ahead.saturating_duration_since(back) < secs(1)
    );
    let behind = cache.system_time(Timestamp::ZERO);
    let gap = SystemTime::now().duration_since(behind).unwrap();
    assert!(gap >= secs(11) && gap < secs(12), "{gap:?}");
    // A wall time in the past maps back before now (the clock reads 11 s here).
    let past = cache.timestamp_at(SystemTime::now() - secs(4));
    let expected = at(7); // 11 s less 4 s, written out: not computed by the code under test
    assert!(past <= expected && expected.saturating_duration_since(past) < secs(1), "{past:?}");
    // Before the clock's origin reads as the origin.
    assert_eq!(cache.timestamp_at(SystemTime::UNIX_EPOCH), Timestamp::ZERO);
}

#[test]
fn fencing_tokens_of_a_restarted_cache_are_larger_than_the_last_ones() {
    let wall_before =
        SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_nanos() as u64;
    let (first, _clock) = cache();
    let last =
        (0..100).map(|i| acquire(&first, &key(&format!("k{i}")), fp("r")).token()).max().unwrap();
    assert!(last.get() > wall_before, "tokens start from the wall clock");
    drop(first);
    let (restarted, _clock) = cache();
    let token = acquire(&restarted, &key("k0"), fp("r")).token();
    assert!(token > last, "{token:?} after a restart, {last:?} before");
}

#[test]
fn set_result_ttl_has_its_own_error_and_leaves_the_guard_unchanged() {
    let (cache, clock) = cache();
    let mut guard = acquire(&cache, &key("k"), fp("r"));
    assert_eq!(
        guard.set_result_ttl(Duration::ZERO),
        Err(SetResultTtlError::InvalidDuration(Duration::ZERO))
    );
    let absurd = MAX_DURATION + Duration::from_nanos(1);
    assert_eq!(guard.set_result_ttl(absurd), Err(SetResultTtlError::InvalidDuration(absurd)));
    assert!(SetResultTtlError::InvalidDuration(absurd).to_string().contains("result TTL"));
    guard.complete(&b"r"[..]).unwrap();
    clock.advance(COMPLETED_TTL - secs(1));
    assert_eq!(replay(&cache, &key("k"), fp("r")).expires_at, at(100));
}
