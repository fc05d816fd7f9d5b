//! One test per transition of the contract (the state table in the crate docs), each driven by a manual clock.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use idemcache::{
    BuildError, Cache, Claim, DropPolicy, EntryState, ExtendLeaseError, Key, KeyError, LeaseLost,
    ManualClock, ResolveError, Timestamp, ENTRY_OVERHEAD,
};

fn at(s: u64) -> Timestamp {
    Timestamp::from_nanos(s * 1_000_000_000)
}

#[test]
fn first_claim_acquires_and_repeats_replay_the_exact_bytes() {
    let (cache, clock) = cache();
    let k = key("a");
    clock.advance(secs(1));
    acquire(&cache, &k, fp("r")).complete(&b"order o_1"[..]).unwrap();
    clock.advance(secs(2));
    let replay = replay(&cache, &k, fp("r"));
    assert_eq!(replay.body, Some(Bytes::from_static(b"order o_1")));
    assert_eq!(replay.completed_at, at(1));
    assert_eq!(replay.expires_at, at(1).saturating_add(COMPLETED_TTL));
    assert!(replay.body_kept());
    let stats = cache.stats();
    assert_eq!((stats.acquired, stats.replayed, stats.completions), (1, 1, 1));
}

#[test]
fn concurrent_duplicate_sees_in_progress_with_lease_times() {
    let (cache, clock) = cache();
    let k = key("a");
    let _guard = acquire(&cache, &k, fp("r"));
    clock.advance(secs(3));
    match cache.claim(&k, fp("r")).unwrap() {
        Claim::InProgress { started_at, lease_ends_at } => {
            assert_eq!(started_at, at(0));
            assert_eq!(lease_ends_at, at(0).saturating_add(LEASE));
        }
        other => panic!("expected InProgress, got {other:?}"),
    }
    assert_eq!(cache.stats().in_progress, 1);
}

#[test]
fn same_key_with_another_request_is_a_mismatch_in_every_state() {
    let (cache, _clock) = cache();
    let (k1, k2, k3) = (key("processing"), key("completed"), key("unknown"));
    let _owner = acquire(&cache, &k1, fp("r"));
    acquire(&cache, &k2, fp("r")).complete(&b"x"[..]).unwrap();
    acquire(&cache, &k3, fp("r")).mark_unknown().unwrap();
    for k in [&k1, &k2, &k3] {
        assert!(matches!(cache.claim(k, fp("other")).unwrap(), Claim::Mismatch), "{k:?}");
    }
    assert_eq!(cache.stats().mismatches, 3);
    // The mismatch changed nothing: the rightful request still gets its answer.
    assert_eq!(replay(&cache, &k2, fp("r")).body.unwrap(), "x");
}

#[test]
fn release_lets_the_next_claim_execute() {
    let (cache, _clock) = cache();
    let k = key("a");
    acquire(&cache, &k, fp("r")).release().unwrap();
    assert_eq!(cache.peek(&k), None);
    let _next = acquire(&cache, &k, fp("other request is fine after release"));
    assert_eq!(cache.stats().releases, 1);
}

#[test]
fn dropped_guard_releases_by_default() {
    let (cache, _clock) = cache();
    let k = key("a");
    drop(acquire(&cache, &k, fp("r")));
    assert_eq!(cache.peek(&k), None);
    let _next = acquire(&cache, &k, fp("r"));
    assert_eq!(cache.stats().releases, 1);
}

#[test]
fn dropped_guard_marks_unknown_under_mark_unknown_policy() {
    let clock = ManualClock::new();
    let cache = builder(&clock).drop_policy(DropPolicy::MarkUnknown).build().unwrap();
    let k = key("a");
    clock.advance(secs(2));
    drop(acquire(&cache, &k, fp("r")));
    match cache.claim(&k, fp("r")).unwrap() {
        Claim::Unknown { marked_at, expires_at } => {
            assert_eq!(marked_at, at(2));
            assert_eq!(expires_at, at(2).saturating_add(UNKNOWN_TTL));
        }
        other => panic!("expected Unknown, got {other:?}"),
    }
    assert_eq!(cache.stats().releases, 0);
}

#[test]
fn panicking_executor_releases_its_key() {
    let (cache, _clock) = cache();
    let k = key("a");
    let c = cache.clone();
    let k2 = k.clone();
    let executor = std::thread::spawn(move || {
        let _guard = acquire(&c, &k2, fp("r"));
        panic!("executor failed");
    });
    assert!(executor.join().is_err(), "the executor thread panicked");
    assert!(cache.claim(&k, fp("r")).unwrap().is_acquired());
}

#[test]
fn unknown_blocks_claims_until_resolved_then_replays_the_resolution() {
    let (cache, clock) = cache();
    let k = key("a");
    acquire(&cache, &k, fp("r")).mark_unknown().unwrap();
    assert!(matches!(cache.claim(&k, fp("r")).unwrap(), Claim::Unknown { .. }));
    clock.advance(secs(5));
    cache.resolve(&k, &b"found it"[..]).unwrap();
    let replay = replay(&cache, &k, fp("r"));
    assert_eq!(replay.body.unwrap(), "found it");
    assert_eq!(replay.completed_at, at(5));
    let stats = cache.stats();
    assert_eq!((stats.unknown, stats.completions, stats.replayed), (1, 1, 1));
}

#[test]
fn forget_makes_an_unknown_key_claimable() {
    let (cache, _clock) = cache();
    let k = key("a");
    acquire(&cache, &k, fp("r")).mark_unknown().unwrap();
    cache.forget(&k).unwrap();
    assert_eq!(cache.peek(&k), None);
    assert!(cache.claim(&k, fp("r")).unwrap().is_acquired());
}

#[test]
fn resolve_and_forget_refuse_other_states_and_change_nothing() {
    let (cache, _clock) = cache();
    let (absent, processing, completed) = (key("absent"), key("p"), key("c"));
    let _owner = acquire(&cache, &processing, fp("r"));
    acquire(&cache, &completed, fp("r")).complete(&b"kept"[..]).unwrap();
    assert_eq!(cache.resolve(&absent, &b"x"[..]), Err(ResolveError::NotFound));
    assert_eq!(cache.forget(&absent), Err(ResolveError::NotFound));
    for k in [&processing, &completed] {
        let before = cache.peek(k);
        assert_eq!(cache.resolve(k, &b"x"[..]), Err(ResolveError::NothingToSettle));
        assert_eq!(cache.forget(k), Err(ResolveError::NothingToSettle));
        assert_eq!(cache.peek(k), before);
    }
    assert_eq!(cache.peek(&absent), None);
    assert_eq!(replay(&cache, &completed, fp("r")).body.unwrap(), "kept");
}

#[test]
fn lapsed_lease_is_taken_over_with_a_new_fencing_token() {
    let (cache, clock) = cache();
    let k = key("a");
    let stale = acquire(&cache, &k, fp("r"));
    clock.advance(LEASE);
    let fresh = acquire(&cache, &k, fp("r"));
    assert!(fresh.token() > stale.token());
    assert_eq!(fresh.lease_ends_at(), at(0).saturating_add(LEASE + LEASE));
    assert_eq!(cache.stats().takeovers, 1);
    drop(fresh);
}

#[test]
fn stale_owner_cannot_complete_after_takeover() {
    let (cache, clock) = cache();
    let k = key("a");
    let stale = acquire(&cache, &k, fp("r"));
    clock.advance(LEASE + secs(1));
    let fresh = acquire(&cache, &k, fp("r"));
    assert_eq!(stale.complete(&b"stale"[..]), Err(LeaseLost));
    // The new owner's entry is untouched: still in progress under the new token.
    match cache.peek(&k).unwrap().state {
        EntryState::Processing { token, .. } => assert_eq!(token, fresh.token()),
        other => panic!("expected Processing, got {other:?}"),
    }
    fresh.complete(&b"fresh"[..]).unwrap();
    assert_eq!(replay(&cache, &k, fp("r")).body.unwrap(), "fresh");
    assert_eq!(cache.stats().leases_lost, 1);
}

#[test]
fn stale_owner_cannot_release_mark_unknown_or_extend_after_takeover() {
    let (cache, clock) = cache();
    let k = key("a");
    let mut stale1 = acquire(&cache, &k, fp("r"));
    clock.advance(LEASE);
    let fresh = acquire(&cache, &k, fp("r"));
    assert_eq!(stale1.extend_lease(secs(5)), Err(ExtendLeaseError::LeaseLost));
    assert_eq!(stale1.release(), Err(LeaseLost));
    clock.advance(LEASE);
    let fresher = acquire(&cache, &k, fp("r"));
    assert_eq!(fresh.mark_unknown(), Err(LeaseLost));
    // A stale guard's drop does not release the new owner's key either.
    assert!(matches!(cache.claim(&k, fp("r")).unwrap(), Claim::InProgress { .. }));
    fresher.complete(&b"ok"[..]).unwrap();
    assert_eq!(replay(&cache, &k, fp("r")).body.unwrap(), "ok");
}

#[test]
fn lapsed_lease_without_takeover_is_still_lost() {
    let (cache, clock) = cache();
    let k = key("a");
    let guard = acquire(&cache, &k, fp("r"));
    clock.advance(LEASE);
    assert_eq!(guard.complete(&b"late"[..]), Err(LeaseLost));
    assert_eq!(cache.peek(&k), None, "a lapsed lease reads as absent");
}

#[test]
fn extended_lease_keeps_the_key_past_the_original_end() {
    let (cache, clock) = cache();
    let k = key("a");
    let mut guard = acquire(&cache, &k, fp("r"));
    clock.advance(secs(8));
    assert_eq!(guard.extend_lease(secs(30)).unwrap(), at(38));
    assert_eq!(guard.lease_ends_at(), at(38));
    clock.advance(secs(20));
    assert!(matches!(
        cache.claim(&k, fp("r")).unwrap(),
        Claim::InProgress { lease_ends_at, .. } if lease_ends_at == at(38)
    ));
    guard.complete(&b"done"[..]).unwrap();
    assert_eq!(cache.stats().takeovers, 0);
}

#[test]
fn extend_lease_refuses_zero_and_absurd_durations() {
    let (cache, _clock) = cache();
    let k = key("a");
    let mut guard = acquire(&cache, &k, fp("r"));
    for bad in [Duration::ZERO, Duration::MAX] {
        assert_eq!(guard.extend_lease(bad), Err(ExtendLeaseError::InvalidDuration(bad)));
    }
    assert_eq!(guard.lease_ends_at(), at(0).saturating_add(LEASE));
    guard.complete(&b"x"[..]).unwrap();
}

#[test]
fn oversize_result_is_completed_without_body_never_released() {
    let (cache, _clock) = cache();
    let k = key("a");
    let big = vec![7u8; MAX_RESULT + 1];
    acquire(&cache, &k, fp("r")).complete(big).unwrap();
    let replay = replay(&cache, &k, fp("r"));
    assert_eq!(replay.body, None);
    assert!(!replay.body_kept());
    assert_eq!(cache.stats().oversized, 1);
    // Exactly at the limit is kept.
    let k2 = key("b");
    acquire(&cache, &k2, fp("r")).complete(vec![1u8; MAX_RESULT]).unwrap();
    assert!(replay_body_kept(&cache, &k2));
}

fn replay_body_kept(cache: &Cache, k: &Key) -> bool {
    replay(cache, k, fp("r")).body_kept()
}

#[test]
fn completed_result_expires_at_its_ttl_and_is_never_returned_after() {
    let (cache, clock) = cache();
    let k = key("a");
    acquire(&cache, &k, fp("r")).complete(&b"x"[..]).unwrap();
    clock.advance(COMPLETED_TTL - Duration::from_nanos(1));
    assert!(cache.peek(&k).is_some());
    replay(&cache, &k, fp("r"));
    clock.advance(Duration::from_nanos(1));
    assert_eq!(cache.peek(&k), None);
    // An expired key is free, even for a different request.
    assert!(cache.claim(&k, fp("new")).unwrap().is_acquired());
}

#[test]
fn unknown_mark_expires_at_its_ttl() {
    let (cache, clock) = cache();
    let k = key("a");
    acquire(&cache, &k, fp("r")).mark_unknown().unwrap();
    clock.advance(UNKNOWN_TTL - Duration::from_nanos(1));
    assert!(matches!(cache.claim(&k, fp("r")).unwrap(), Claim::Unknown { .. }));
    clock.advance(Duration::from_nanos(1));
    assert_eq!(cache.forget(&k), Err(ResolveError::NotFound));
    assert!(cache.claim(&k, fp("r")).unwrap().is_acquired());
}

#[test]
fn peek_changes_neither_state_nor_counters() {
    let (cache, _clock) = cache();
    let k = key("a");
    let guard = acquire(&cache, &k, fp("r"));
    let before = cache.stats();
    let snap = cache.peek(&k).unwrap();
    assert_eq!(snap.fingerprint, fp("r"));
    assert!(matches!(snap.state, EntryState::Processing { token, .. } if token == guard.token()));
    assert_eq!(cache.peek(&k), Some(snap));
    assert_eq!(cache.stats(), before);
    assert_eq!(cache.peek(&key("absent")), None);
    guard.complete(&b"x"[..]).unwrap();
}

#[test]
fn remove_returns_the_entry_and_fences_a_processing_owner() {
    let (cache, _clock) = cache();
    let (done, busy) = (key("done"), key("busy"));
    acquire(&cache, &done, fp("r")).complete(&b"x"[..]).unwrap();
    let removed = cache.remove(&done).unwrap();
    assert!(
        matches!(removed.state, EntryState::Completed(ref r) if r.body.as_deref() == Some(&b"x"[..]))
    );
    assert_eq!(cache.remove(&done), None);
    let owner = acquire(&cache, &busy, fp("r"));
    assert!(cache.remove(&busy).is_some());
    let next = acquire(&cache, &busy, fp("r"));
    assert_eq!(owner.complete(&b"stale"[..]), Err(LeaseLost));
    next.complete(&b"new"[..]).unwrap();
    assert_eq!(replay(&cache, &busy, fp("r")).body.unwrap(), "new");
}

#[test]
fn fencing_tokens_increase_for_each_claim_of_a_key() {
    let (cache, _clock) = cache();
    let k = key("a");
    let mut last = None;
    for _ in 0..5 {
        let guard = acquire(&cache, &k, fp("r"));
        assert!(Some(guard.token()) > last);
        last = Some(guard.token());
        guard.release().unwrap();
    }
}

#[test]
fn fencing_tokens_are_unique_across_the_whole_cache() {
    let clock = ManualClock::new();
    let cache = builder(&clock).shards(8).build().unwrap();
    assert_eq!(cache.shard_count(), 8);
    let mut tokens = std::collections::BTreeSet::new();
    for i in 0..2000 {
        let guard = acquire(&cache, &key(&format!("k{i}")), fp("r"));
        assert!(tokens.insert(guard.token()), "token {:?} issued twice", guard.token());
        guard.release().unwrap();
    }
}

#[test]
fn entries_and_bytes_follow_the_documented_formula() {
    let (cache, _clock) = cache();
    let k = key("a");
    let guard = acquire(&cache, &k, fp("r"));
    let stats = cache.stats();
    assert_eq!(stats.entries, 1);
    assert_eq!(stats.bytes as usize, k.as_bytes().len() + ENTRY_OVERHEAD);
    guard.complete(&b"12345"[..]).unwrap();
    assert_eq!(cache.stats().bytes as usize, k.as_bytes().len() + 5 + ENTRY_OVERHEAD);
    cache.remove(&k);
    assert_eq!((cache.stats().entries, cache.stats().bytes), (0, 0));
    cache.debug_validate();
}

#[test]
fn builder_refuses_zero_and_absurd_settings() {
    let d = |setting, value| Err(BuildError::Duration { setting, value });
    let absurd = Duration::from_secs(u64::MAX);
    let cases: Vec<(idemcache::CacheBuilder, Result<(), BuildError>)> = vec![
        (Cache::builder().shards(0), Err(BuildError::Shards(0))),
        (Cache::builder().shards(1 << 20), Err(BuildError::Shards(1 << 20))),
        (Cache::builder().lease(Duration::ZERO), d("lease", Duration::ZERO)),
        (Cache::builder().lease(absurd), d("lease", absurd)),
        (Cache::builder().completed_ttl(Duration::ZERO), d("completed_ttl", Duration::ZERO)),
        (Cache::builder().unknown_ttl(absurd), d("unknown_ttl", absurd)),
        (Cache::builder().max_result_size(0), Err(BuildError::MaxResultSize(0))),
        (Cache::builder().max_result_size(usize::MAX), Err(BuildError::MaxResultSize(usize::MAX))),
    ];
    for (builder, expected) in cases {
        let shown = format!("{builder:?}");
        assert_eq!(builder.build().map(drop), expected, "{shown}");
    }
    assert_eq!(Cache::builder().shards(3).build().unwrap().shard_count(), 4);
    assert!(Cache::builder().build().is_ok());
}

#[test]
fn bad_keys_get_typed_errors() {
    let long = "x".repeat(256);
    let wide = "s".repeat(1000);
    assert_eq!(Key::new("", "t", "k"), Err(KeyError::EmptyScope));
    assert_eq!(Key::new("s", "", "k"), Err(KeyError::EmptyTenant));
    assert_eq!(Key::new("s", "t", ""), Err(KeyError::EmptyClientKey));
    assert_eq!(Key::new("s", "t", &long), Err(KeyError::ClientKeyTooLong { len: 256 }));
    assert_eq!(
        Key::new(&wide, &"t".repeat(25), "k"),
        Err(KeyError::ScopeAndTenantTooLong { len: 1025 })
    );
    assert_eq!(
        Key::new("s", "t", "ab c"),
        Err(KeyError::ClientKeyNotVisibleAscii { at: 2, byte: b' ' })
    );
    assert_eq!(
        Key::new("s", "t", "é"),
        Err(KeyError::ClientKeyNotVisibleAscii { at: 0, byte: 0xc3 })
    );
    assert!(Key::new(&wide, &"t".repeat(24), "k".repeat(255)).is_ok());
    assert!(Key::without_tenant("s", "~").is_ok());
    // Errors explain themselves.
    assert!(KeyError::EmptyTenant.to_string().contains("without_tenant"));
}
