//! Correlation ids in the cache, attacked from what the docs promise: an entry shows its
//! own claim's id (or its fact's) and no other, through every way a slot is vacated and
//! reused; the byte bound charges an id exactly while its entry is there; and an id is
//! never the reason a claim is refused or a fact is left out.

mod common;

use common::*;
use idemcache::{
    Cache, Claim, ClaimError, CorrelationId, InsertError, Key, LapsePolicy, ManualClock, Outcome,
    Verdict, CORRELATION_ID_OVERHEAD, ENTRY_OVERHEAD,
};

fn id(s: &str) -> CorrelationId {
    CorrelationId::new(s).unwrap()
}

#[track_caller]
fn acquire_with(cache: &Cache, k: &Key, id: Option<&CorrelationId>) -> idemcache::ClaimGuard {
    match cache.claim_correlated(k, fp("r"), id).unwrap() {
        Claim::Acquired(guard) => guard,
        other => panic!("expected Acquired, got {other:?}"),
    }
}

fn shown(cache: &Cache, k: &Key) -> Option<String> {
    cache.peek(k).expect("a live entry").correlation_id.map(|c| c.as_str().to_owned())
}

/// What the docs say an entry of `k` is charged, with `body` bytes kept and its claim's
/// id `id`.
fn charge(k: &Key, body: usize, id: Option<&CorrelationId>) -> u64 {
    let id = id.map_or(0, |c| c.as_str().len() + CORRELATION_ID_OVERHEAD);
    (k.as_bytes().len() + body + ENTRY_OVERHEAD + id) as u64
}

/// One shard and one slot in play: every way an entry leaves hands its slot to the next
/// entry, which must show its own id (or none), never the one before it.
#[test]
fn a_reused_slot_never_shows_the_id_of_the_entry_that_left_it() {
    let clock = ManualClock::new();
    let cache = builder(&clock)
        .shards(1)
        .lapse_policy(LapsePolicy::MarkUnknown { ttl: secs(30) })
        .build()
        .unwrap();
    let k = key("k");
    let a = id("a-1");

    // Released: the next claim, given none, shows none.
    acquire_with(&cache, &k, Some(&a)).release().unwrap();
    acquire_with(&cache, &k, None).release().unwrap();
    // Removed while executing, then claimed with another id.
    let fenced = acquire_with(&cache, &k, Some(&a));
    assert_eq!(cache.remove(&k).unwrap().correlation_id, Some(a.clone()));
    let guard = acquire_with(&cache, &k, Some(&id("b-2")));
    assert_eq!(shown(&cache, &k).as_deref(), Some("b-2"));
    assert!(fenced.complete(&b"late"[..]).is_err(), "the fenced owner writes nothing");
    assert_eq!(shown(&cache, &k).as_deref(), Some("b-2"));
    guard.complete(&b"r"[..]).unwrap();
    // Expired, then inserted as a fact without an id.
    clock.advance(COMPLETED_TTL + secs(1));
    let known = Outcome::Unknown {
        marked_at: cache.now(),
        expires_at: cache.now().saturating_add(secs(5)),
    };
    cache.insert(&k, fp("r"), known).unwrap();
    assert_eq!(shown(&cache, &k), None, "the dead entry's id went with it");
    // Forgotten, claimed with an id; its lease lapses to UNKNOWN (keeps it); a claim
    // with another id is answered, changing nothing; reconciled as happened: kept.
    cache.forget(&k).unwrap();
    let lapsed = acquire_with(&cache, &k, Some(&id("c-3")));
    clock.advance(LEASE + secs(1));
    let other = cache.claim_correlated(&k, fp("r"), Some(&id("d-4"))).unwrap();
    assert!(matches!(other, Claim::Unknown { .. }), "{other:?}");
    assert_eq!(shown(&cache, &k).as_deref(), Some("c-3"));
    drop(lapsed);
    let done = cache.reconcile(10, |_| Verdict::Happened(Some("ok".into())));
    assert_eq!(done.resolved, 1);
    assert_eq!(shown(&cache, &k).as_deref(), Some("c-3"));
    // Past its TTL, a correlated insert over the dead entry shows the fact's id.
    clock.advance(COMPLETED_TTL + secs(1));
    let fact = Outcome::Completed {
        body: Some("f".into()),
        completed_at: cache.now(),
        expires_at: cache.now().saturating_add(secs(5)),
    };
    cache.insert_correlated(&k, fp("r"), fact, Some(&id("e-5"))).unwrap();
    assert_eq!(shown(&cache, &k).as_deref(), Some("e-5"));
    // An insert over it is refused and names the occupant's id, not the fact's.
    let again = Outcome::Unknown {
        marked_at: cache.now(),
        expires_at: cache.now().saturating_add(secs(5)),
    };
    match cache.insert_correlated(&k, fp("r"), again, Some(&id("f-6"))) {
        Err(InsertError::Occupied(occupant)) => {
            assert_eq!(occupant.correlation_id, Some(id("e-5")));
        }
        other => panic!("{other:?}"),
    }
    // A lapse reconciled as not happened: the next claim is a new execution, its own id.
    clock.advance(secs(6));
    let lapsing = acquire_with(&cache, &k, Some(&id("g-7")));
    clock.advance(LEASE + secs(1));
    assert_eq!(cache.reconcile(10, |_| Verdict::DidNotHappen).forgotten, 1);
    drop(lapsing);
    acquire_with(&cache, &k, None).release().unwrap();
    assert_eq!(cache.stats().bytes, 0, "every id's charge went with its entry");
    cache.debug_validate();
}

/// Under the default policy a lapsed lease is taken over: the new owner's id, not the
/// lapsed one's, even when the new claim is given none.
#[test]
fn a_takeover_shows_the_new_owners_id() {
    let (cache, clock) = cache();
    let k = key("k");
    let lapsed = acquire_with(&cache, &k, Some(&id("old")));
    clock.advance(LEASE + secs(1));
    let owner = acquire_with(&cache, &k, None);
    assert_eq!(shown(&cache, &k), None);
    assert!(lapsed.complete(&b"late"[..]).is_err());
    owner.complete(&b"r"[..]).unwrap();
    assert_eq!(shown(&cache, &k), None);
    assert_eq!(cache.stats().bytes, charge(&k, 1, None));
}

/// `Stats::bytes` is what the docs say, entry by entry, through completion and through
/// evictions of correlated entries (the reference model bounds entries, not bytes).
#[test]
fn the_byte_charge_follows_each_id_through_completion_and_eviction() {
    let clock = ManualClock::new();
    let cache = builder(&clock).shards(1).max_bytes(64 * 1024).build().unwrap();
    let mut keys = Vec::new();
    for i in 0..400 {
        let k = key(&format!("k{i:03}"));
        // Ids of many lengths, and every third entry none.
        let trace = (i % 3 != 0).then(|| id(&"t".repeat(1 + i % 128)));
        let guard = acquire_with(&cache, &k, trace.as_ref());
        assert_eq!(shown(&cache, &k), trace.as_ref().map(|t| t.as_str().to_owned()));
        guard.complete(&b"result"[..]).unwrap();
        keys.push((k, trace));
        let expected: u64 = keys
            .iter()
            .filter(|(k, _)| cache.peek(k).is_some())
            .map(|(k, trace)| charge(k, 6, trace.as_ref()))
            .sum();
        assert_eq!(cache.stats().bytes, expected, "after {i}");
        assert!(cache.stats().bytes <= 64 * 1024);
    }
    assert!(cache.stats().evictions > 0, "the bound was reached");
    for (k, _) in &keys {
        cache.remove(k);
    }
    assert_eq!(cache.stats().bytes, 0);
    cache.debug_validate();
}

/// A shard of one bound filled with work that is never evicted (UNKNOWN marks) until
/// exactly `free` bytes are left.
fn filled_to(free: u64) -> Cache {
    const MAX: u64 = 64 * 1024;
    let clock = ManualClock::new();
    let cache =
        builder(&clock).shards(1).max_bytes(MAX as usize).unknown_ttl(secs(1000)).build().unwrap();
    let mark = |client: &str| {
        let known = Outcome::Unknown {
            marked_at: cache.now(),
            expires_at: cache.now().saturating_add(secs(500)),
        };
        cache.insert(&key(client), fp("m"), known).unwrap();
    };
    // The cheapest mark, and the most a mark's key can be padded by.
    let smallest = charge(&key("m0000-"), 0, None);
    const PAD: u64 = 240;
    assert!(smallest < PAD && free < MAX - 4 * smallest);
    let mut n = 0;
    loop {
        let excess = MAX - cache.stats().bytes - free;
        if excess == 0 {
            break;
        }
        n += 1;
        let prefix = format!("m{n:04}-");
        // The cheapest mark while that leaves enough for two; then the excess in one
        // padded mark, or in two (the first leaving room for exactly the cheapest).
        let cost = if excess >= 2 * smallest + PAD {
            smallest
        } else if excess <= smallest + PAD {
            excess
        } else {
            excess - smallest
        };
        let pad = usize::try_from(cost - smallest).unwrap();
        mark(&format!("{prefix}{}", "x".repeat(pad)));
    }
    assert_eq!(MAX - cache.stats().bytes, free);
    cache
}

/// The layer's docs promise a request is never refused for its correlation id, and the
/// snapshot docs that a mark is left out only when the cache is full of live work. With
/// room for the entry but not its id, the claim is refused and a mark is not loaded.
#[test]
fn an_id_is_never_why_a_claim_is_refused_or_a_mark_is_left_out() {
    let k = key("target");
    let trace = id("4bf92f3577b34da6a3ce929d0e0e4736");
    let free = charge(&k, 0, None) + 10;
    assert!(free < charge(&k, 0, Some(&trace)), "room for the entry, not its id");

    let cache = filled_to(free);
    assert!(matches!(cache.claim(&k, fp("r")), Ok(Claim::Acquired(_))), "fits without an id");
    let cache = filled_to(free);
    match cache.claim_correlated(&k, fp("r"), Some(&trace)) {
        Ok(Claim::Acquired(guard)) => {
            // Kept without the id it had no room for: the entry is what matters.
            assert_eq!(cache.peek(&k).unwrap().correlation_id, None);
            assert!(cache.stats().bytes <= 64 * 1024);
            drop(guard);
        }
        other => panic!("refused for its correlation id: {other:?}"),
    }
    assert_eq!(cache.stats().capacity_refusals, 0);

    // A mark (from a snapshot or a store) that may have run: kept, id or not.
    let cache = filled_to(free);
    let mark = Outcome::Unknown {
        marked_at: cache.now(),
        expires_at: cache.now().saturating_add(secs(50)),
    };
    match cache.insert_correlated(&k, fp("r"), mark, Some(&trace)) {
        Ok(()) => assert!(matches!(cache.claim(&k, fp("r")), Ok(Claim::Unknown { .. }))),
        Err(e) => panic!("a mark left out for its correlation id: {e:?}"),
    }
    cache.debug_validate();

    // Still refused when even the entry alone has no room.
    let cache = filled_to(charge(&k, 0, None) - 1);
    let refused = cache.claim_correlated(&k, fp("r"), Some(&trace));
    assert!(matches!(refused, Err(ClaimError::CapacityExhausted)), "{refused:?}");
}

/// The overhead counts what its docs say on a 64-bit target: the slot index and the
/// boxed id (24 bytes with padding) and the table's control byte.
#[test]
#[cfg(target_pointer_width = "64")]
fn an_ids_overhead_is_25_bytes_on_a_64_bit_target() {
    assert_eq!(CORRELATION_ID_OVERHEAD, 25);
}

/// Threads racing on a few keys, each claim with an id of its own: whoever
/// holds a key sees its own id on the entry, however often the slot changed hands
/// before; a completed key keeps its completer's id; the charge ends at the entries'.
#[test]
fn racing_claims_each_see_their_own_id_while_they_hold_the_key() {
    let (cache, _clock) = cache();
    let keys: Vec<Key> = (0..6).map(|i| key(&format!("k{i}"))).collect();
    let completed = std::sync::Mutex::new(std::collections::HashMap::new());
    std::thread::scope(|s| {
        for t in 0..4 {
            let (cache, keys, completed) = (&cache, &keys, &completed);
            s.spawn(move || {
                for i in 0..3000 {
                    let k = &keys[(i * 7 + t) % keys.len()];
                    let mine = id(&format!("t{t}-{i}"));
                    let Ok(Claim::Acquired(guard)) =
                        cache.claim_correlated(k, fp("r"), Some(&mine))
                    else {
                        continue;
                    };
                    assert_eq!(cache.peek(k).unwrap().correlation_id.as_ref(), Some(&mine));
                    if i % 500 == 499 {
                        guard.complete(&b"r"[..]).unwrap();
                        completed.lock().unwrap().insert(k.clone(), mine);
                    } else {
                        guard.release().unwrap();
                    }
                }
            });
        }
    });
    let completed = completed.into_inner().unwrap();
    for (k, by) in &completed {
        assert_eq!(cache.peek(k).unwrap().correlation_id.as_ref(), Some(by));
    }
    let expected: u64 = completed.iter().map(|(k, by)| charge(k, 1, Some(by))).sum();
    assert_eq!(cache.stats().bytes, expected);
    cache.debug_validate();
}
