//! `LapsePolicy`: under `TakeOver` (the default) a lapsed lease is taken over; under
//! `MarkUnknown` it is UNKNOWN from the lease's end on every path that reads it (claim,
//! peek, listing, the wheel, a full shard) until resolved, forgotten or expired; and
//! `Cache::reconcile` settles UNKNOWN entries as its check says. Time moves only by a
//! manual clock.

mod common;

use bytes::Bytes;
use common::*;
use idemcache::{
    Cache, Claim, ClaimError, EntryState, Key, LapsePolicy, LeaseLost, ManualClock, Timestamp,
    Verdict,
};

fn marking(clock: &ManualClock) -> Cache {
    builder(clock).lapse_policy(LapsePolicy::MarkUnknown { ttl: UNKNOWN_TTL }).build().unwrap()
}

#[test]
fn the_default_takes_a_lapsed_lease_over() {
    let (cache, clock) = cache();
    assert_eq!(cache.lapse_policy(), LapsePolicy::TakeOver);
    let k = key("a");
    let stale = acquire(&cache, &k, fp("r"));
    assert!(!stale.took_over(), "an absent key is acquired, not taken over");
    clock.advance(LEASE);
    let Claim::Acquired(taker) = cache.claim(&k, fp("r")).unwrap() else { panic!("taken over") };
    assert!(taker.took_over(), "the answer says the key was taken over");
    assert_eq!(stale.complete(&b"late"[..]), Err(LeaseLost));
    assert_eq!(cache.stats().lapsed_unknown, 0);
    // A completed result that expired is no takeover: its execution finished.
    taker.complete(&b"done"[..]).unwrap();
    clock.advance(COMPLETED_TTL);
    let Claim::Acquired(again) = cache.claim(&k, fp("r")).unwrap() else { panic!("acquired") };
    assert!(!again.took_over());
}

#[test]
fn a_lapsed_lease_is_unknown_from_its_end_and_never_re_run() {
    let clock = ManualClock::new();
    let cache = marking(&clock);
    let k = key("a");
    clock.advance(secs(1));
    let mut stale = acquire(&cache, &k, fp("r"));
    let lease_end = Timestamp::from_nanos(0).saturating_add(secs(1) + LEASE);
    clock.advance(LEASE - secs(1) / 2);
    assert!(matches!(cache.claim(&k, fp("r")).unwrap(), Claim::InProgress { .. }));
    clock.advance(secs(5));
    let expires = lease_end.saturating_add(UNKNOWN_TTL);
    for _ in 0..2 {
        match cache.claim(&k, fp("r")).unwrap() {
            Claim::Unknown { marked_at, expires_at } => {
                assert_eq!((marked_at, expires_at), (lease_end, expires));
            }
            other => panic!("a lapsed lease must never be acquired, got {other:?}"),
        }
    }
    assert!(matches!(cache.claim(&k, fp("other")).unwrap(), Claim::Mismatch));
    match cache.peek(&k).unwrap().state {
        EntryState::Unknown { marked_at, expires_at } => {
            assert_eq!((marked_at, expires_at), (lease_end, expires));
        }
        other => panic!("{other:?}"),
    }
    // The lapsed owner is fenced from every operation.
    assert!(stale.extend_lease(LEASE).is_err());
    assert_eq!(stale.complete(&b"late"[..]), Err(LeaseLost));
    let stats = cache.stats();
    assert_eq!((stats.lapsed_unknown, stats.takeovers, stats.unknown), (1, 0, 2));
    cache.debug_validate();
    // Resolved, it replays.
    cache.resolve(&k, &b"charged"[..]).unwrap();
    assert_eq!(replay(&cache, &k, fp("r")).body.unwrap(), "charged");
}

#[test]
fn a_lapse_nobody_claimed_is_listed_and_survives_the_wheel() {
    let clock = ManualClock::new();
    let cache = marking(&clock);
    let (a, b) = (key("a"), key("b"));
    let _a = acquire(&cache, &a, fp("r"));
    clock.advance(secs(2));
    let _b = acquire(&cache, &b, fp("r"));
    clock.advance(LEASE + secs(3));
    // Swept: turned, not reclaimed.
    assert_eq!(cache.run_pending(), 0);
    assert_eq!(cache.stats().entries, 2);
    let listed: Vec<(Key, Timestamp)> =
        cache.list_unknown(10).into_iter().map(|e| (e.key, e.marked_at)).collect();
    let at = |s| Timestamp::from_nanos(0).saturating_add(secs(s));
    assert_eq!(listed, vec![(a.clone(), at(10)), (b.clone(), at(12))]);
    assert_eq!(cache.list_unknown(1).len(), 1, "bounded");
    // Forgotten, a retry runs again.
    cache.forget(&a).unwrap();
    assert!(cache.claim(&a, fp("r")).unwrap().is_acquired());
    // Its UNKNOWN mark expires unknown_ttl after the lease's end, then the key is free.
    clock.advance(UNKNOWN_TTL);
    assert!(cache.claim(&b, fp("r")).unwrap().is_acquired());
    cache.debug_validate();
}

#[test]
fn a_listing_turns_a_lapse_within_the_current_wheel_tick() {
    let clock = ManualClock::new();
    // A tick far longer than the lease: the wheel has not reached the lapse yet.
    let cache = builder(&clock)
        .tick(secs(3600))
        .lapse_policy(LapsePolicy::MarkUnknown { ttl: UNKNOWN_TTL })
        .build()
        .unwrap();
    let k = key("a");
    let _stale = acquire(&cache, &k, fp("r"));
    clock.advance(LEASE);
    let listed = cache.list_unknown(10);
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].key, k);
}

#[test]
fn a_full_shard_of_lapsed_leases_refuses_and_evicts_none() {
    let clock = ManualClock::new();
    let cache = builder(&clock)
        .shards(1)
        .max_entries(512)
        .lapse_policy(LapsePolicy::MarkUnknown { ttl: UNKNOWN_TTL })
        .build()
        .unwrap();
    let guards: Vec<_> =
        (0..512).map(|i| acquire(&cache, &key(&format!("k{i}")), fp("r"))).collect();
    clock.advance(LEASE);
    // Every entry is a lapsed lease: UNKNOWN, never evicted, never reclaimed.
    assert!(matches!(cache.claim(&key("new"), fp("r")), Err(ClaimError::CapacityExhausted)));
    assert_eq!(cache.stats().evictions, 0);
    assert_eq!(cache.list_unknown(1000).len(), 512);
    drop(guards);
    assert!(matches!(cache.claim(&key("k7"), fp("r")).unwrap(), Claim::Unknown { .. }));
    cache.debug_validate();
}

#[test]
fn insert_never_displaces_a_lapse_turned_unknown() {
    let clock = ManualClock::new();
    let cache = marking(&clock);
    let k = key("a");
    let _stale = acquire(&cache, &k, fp("r"));
    clock.advance(LEASE);
    let now = cache.now();
    let known = idemcache::Outcome::Completed {
        body: Some(Bytes::from_static(b"x")),
        completed_at: now,
        expires_at: now.saturating_add(COMPLETED_TTL),
    };
    match cache.insert(&k, fp("r"), known) {
        Err(idemcache::InsertError::Occupied(snapshot)) => {
            assert!(matches!(snapshot.state, EntryState::Unknown { .. }));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn reconcile_resolves_forgets_and_leaves_as_the_check_says() {
    let clock = ManualClock::new();
    let cache = marking(&clock);
    let [paid, unpaid, pending] = ["paid", "unpaid", "pending"].map(key);
    // Marked a millisecond apart: entries marked at one instant may be listed in either
    // order.
    for k in [&paid, &unpaid] {
        acquire(&cache, k, fp("r")).mark_unknown().unwrap();
        clock.advance(std::time::Duration::from_millis(1));
    }
    let _lapsing = acquire(&cache, &pending, fp("r"));
    clock.advance(LEASE);
    let mut checked = Vec::new();
    let done = cache.reconcile(10, |entry| {
        checked.push(entry.key.clone());
        match entry.key.client_key() {
            "paid" => Verdict::Happened(Some(Bytes::from_static(b"receipt"))),
            "unpaid" => Verdict::DidNotHappen,
            _ => Verdict::Undecided,
        }
    });
    assert_eq!((done.resolved, done.forgotten, done.left, done.checked()), (1, 1, 1, 3));
    assert_eq!(checked, vec![paid.clone(), unpaid.clone(), pending.clone()], "oldest first");
    assert_eq!(replay(&cache, &paid, fp("r")).body.unwrap(), "receipt");
    assert!(cache.claim(&unpaid, fp("r")).unwrap().is_acquired());
    assert!(matches!(cache.claim(&pending, fp("r")).unwrap(), Claim::Unknown { .. }));
    // Happened without a body: completed without one.
    let done = cache.reconcile(10, |_| Verdict::Happened(None));
    assert_eq!(done.resolved, 1);
    assert_eq!(replay(&cache, &pending, fp("r")).body, None);
}

#[test]
fn reconcile_leaves_an_entry_settled_while_it_was_checked() {
    let clock = ManualClock::new();
    let cache = marking(&clock);
    let k = key("a");
    acquire(&cache, &k, fp("r")).mark_unknown().unwrap();
    let done = cache.reconcile(10, |entry| {
        // Someone else resolved it meanwhile: the verdict must not overwrite that.
        cache.resolve(&entry.key, &b"theirs"[..]).unwrap();
        Verdict::DidNotHappen
    });
    assert_eq!((done.resolved, done.forgotten, done.left), (0, 0, 1));
    assert_eq!(replay(&cache, &k, fp("r")).body.unwrap(), "theirs");
}

/// As above with no tick between the listing and the retry's mark (the coarse
/// monotonic clock ticks every 1-4 ms): the retry has the listed entry's fingerprint and
/// mark time, and only its fencing token tells the two executions apart. A stale verdict
/// used to forget the retry's mark, and a third claim executed.
#[test]
fn reconcile_never_settles_a_retry_marked_within_the_same_tick() {
    let clock = ManualClock::new();
    let cache = marking(&clock);
    let k = key("same-tick");
    acquire(&cache, &k, fp("r")).mark_unknown().unwrap();
    for verdict in [Verdict::DidNotHappen, Verdict::Happened(None)] {
        let done = cache.reconcile(10, |entry| {
            cache.forget(&entry.key).unwrap();
            acquire(&cache, &entry.key, fp("r")).mark_unknown().unwrap();
            verdict.clone()
        });
        assert_eq!((done.resolved, done.forgotten, done.left), (0, 0, 1), "{verdict:?}");
        assert!(matches!(cache.claim(&k, fp("r")).unwrap(), Claim::Unknown { .. }));
    }
    // The entry listed now is settled as usual.
    let done = cache.reconcile(10, |_| Verdict::DidNotHappen);
    assert_eq!(done.forgotten, 1);
    assert!(cache.claim(&k, fp("r")).unwrap().is_acquired());
}

/// A verdict is about the entry that was listed: forgotten, claimed again (by another
/// request, or the same one) and marked again while it was being checked, the key's new
/// UNKNOWN entry is left, never settled by the stale verdict.
#[test]
fn reconcile_never_settles_an_execution_it_did_not_list() {
    let clock = ManualClock::new();
    let cache = marking(&clock);
    let k = key("aba");
    acquire(&cache, &k, fp("r")).mark_unknown().unwrap();
    for (request, verdict) in [("other", Verdict::DidNotHappen), ("r", Verdict::Happened(None))] {
        let done = cache.reconcile(10, |entry| {
            cache.forget(&entry.key).unwrap();
            clock.advance(std::time::Duration::from_millis(1));
            acquire(&cache, &entry.key, fp(request)).mark_unknown().unwrap();
            verdict.clone()
        });
        assert_eq!((done.resolved, done.forgotten, done.left), (0, 0, 1), "{request}");
        assert!(matches!(cache.claim(&k, fp(request)).unwrap(), Claim::Unknown { .. }));
    }
}
