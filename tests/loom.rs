//! Loom models of the shipping code: the cache compiled with `--cfg idemcache_loom` takes
//! every lock, condvar and atomic from loom (`src/sync.rs`), and loom runs each model
//! under every interleaving (no preemption bound is set: the models are small enough to
//! explore exhaustively, about ten seconds in all here).
//!
//! Run (CI does, see `.ci/run`):
//!
//! ```sh
//! RUSTFLAGS="--cfg idemcache_loom" cargo test --release --test loom
//! ```
//!
//! Each model asserts the invariant it is about, not just "no panic", and says which
//! deliberate bug it catches; each was checked against that bug once (2026-11-30, by
//! patching the bug into `src/` and watching the model fail: models 1 and 4 on a split
//! check-then-insert in `Cache::claim`, 2 on a two-step `complete`, 3 on `owned` without
//! the token check, 5 on a lookup reading a dead entry as live, 6 on evicting the oldest
//! entry of any state, 7 (as a loom deadlock) on `release` not waking waiters; 8 on an
//! insert split into a locked look and a locked write; 9, as a deadlock, on the async
//! wait filing its waker in a second locked section after its look); under
//! `LapsePolicy::MarkUnknown` (2026-12-01), 10 on `Shard::claim` taking a lapsed lease
//! for dead, 11 on it and on `Shard::sweep` reclaiming a lapsed lease as dead).
#![cfg(idemcache_loom)]

use std::time::Duration;

use bytes::Bytes;
use idemcache::{
    Cache, Claim, ClaimGuard, EntryState, Fingerprint, Key, LapsePolicy, LeaseLost, ManualClock,
};
use loom::thread;

const LEASE: Duration = Duration::from_secs(10);

/// One shard, so every key contends on the same lock; a manual clock made inside the
/// model, so its atomic is loom's.
fn cache(max_entries: usize) -> (Cache, ManualClock) {
    let clock = ManualClock::new();
    let cache = Cache::builder()
        .shards(1)
        .max_entries(max_entries)
        .lease(LEASE)
        .clock(clock.clone())
        .build()
        .unwrap();
    (cache, clock)
}

/// [`cache`] under `LapsePolicy::MarkUnknown`, keeping UNKNOWN marks for `UNKNOWN_TTL`.
fn marking_cache() -> (Cache, ManualClock) {
    let clock = ManualClock::new();
    let cache = Cache::builder()
        .shards(1)
        .lease(LEASE)
        .lapse_policy(LapsePolicy::MarkUnknown { ttl: UNKNOWN_TTL })
        .clock(clock.clone())
        .build()
        .unwrap();
    (cache, clock)
}

const UNKNOWN_TTL: Duration = Duration::from_secs(100);

fn key(k: &str) -> Key {
    Key::new("scope", "tenant", k).unwrap()
}

fn fp() -> Fingerprint {
    Fingerprint::of(b"request")
}

fn acquire(cache: &Cache, k: &Key) -> ClaimGuard {
    match cache.claim(k, fp()).unwrap() {
        Claim::Acquired(guard) => guard,
        other => panic!("expected Acquired, got {other:?}"),
    }
}

fn stored(cache: &Cache, k: &Key) -> Option<Bytes> {
    match cache.peek(k)?.state {
        EntryState::Completed(replay) => replay.body,
        _ => None,
    }
}

/// 1. Two threads claim one key: exactly one acquires and executes; the other sees it in
/// progress or the winner's exact bytes.
///
/// Catches: a check-then-insert split across two critical sections (look up under the
/// lock, release it, re-lock to insert): both threads see "absent" and both acquire.
#[test]
fn two_claims_one_winner() {
    loom::model(|| {
        let (cache, _clock) = cache(64);
        let k = key("k");
        let racers: Vec<_> = ["a", "b"]
            .into_iter()
            .map(|me| {
                let (cache, k) = (cache.clone(), k.clone());
                thread::spawn(move || match cache.claim(&k, fp()).unwrap() {
                    Claim::Acquired(guard) => {
                        guard.complete(Bytes::from(me)).unwrap();
                        (true, None)
                    }
                    Claim::InProgress { .. } => (false, None),
                    Claim::Completed(replay) => (false, replay.body),
                    other => panic!("unexpected {other:?}"),
                })
            })
            .collect();
        let results: Vec<_> = racers.into_iter().map(|t| t.join().unwrap()).collect();
        assert_eq!(results.iter().filter(|(won, _)| *won).count(), 1, "exactly one executes");
        let winner = stored(&cache, &k).expect("the winner's result is stored");
        for (_, seen) in results {
            if let Some(seen) = seen {
                assert_eq!(seen, winner, "a replay hands back the winner's bytes");
            }
        }
        cache.debug_validate();
    });
}

/// 2. A completion racing a claim: the claimer sees "in progress" or exactly the bytes
/// stored, never a half-written entry or another result.
///
/// Catches: publishing COMPLETED before the body (two critical sections in `complete`):
/// the claimer replays an empty body.
#[test]
fn complete_racing_a_claim() {
    loom::model(|| {
        let (cache, _clock) = cache(64);
        let k = key("k");
        let owner = acquire(&cache, &k);
        let completer = thread::spawn(move || owner.complete(&b"result"[..]).unwrap());
        let claimer = {
            let (cache, k) = (cache.clone(), k.clone());
            thread::spawn(move || cache.claim(&k, fp()).unwrap())
        };
        completer.join().unwrap();
        match claimer.join().unwrap() {
            Claim::InProgress { .. } => {}
            Claim::Completed(replay) => assert_eq!(replay.body.unwrap(), "result"),
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(stored(&cache, &k).unwrap(), "result");
    });
}

/// 3. A lease lapsing (time moves) while the stale owner completes and a new claimer
/// arrives: if the new claimer took the key over, the stale write was refused and the
/// new owner's result stands; if the stale write landed, nobody took over.
///
/// Catches: a `complete` that checks only the state and not the fencing token (the stale
/// owner overwrites the new owner's entry).
#[test]
fn takeover_fences_the_stale_owner() {
    loom::model(|| {
        let (cache, clock) = cache(64);
        let k = key("k");
        let stale = acquire(&cache, &k);
        let time = thread::spawn(move || clock.advance(LEASE));
        let stale_write = thread::spawn(move || stale.complete(&b"stale"[..]));
        let newcomer = {
            let (cache, k) = (cache.clone(), k.clone());
            thread::spawn(move || match cache.claim(&k, fp()).unwrap() {
                Claim::Acquired(guard) => {
                    guard.complete(&b"fresh"[..]).unwrap();
                    true
                }
                _ => false,
            })
        };
        time.join().unwrap();
        let stale_result = stale_write.join().unwrap();
        let took_over = newcomer.join().unwrap();
        if took_over {
            assert_eq!(stale_result, Err(LeaseLost), "the stale owner must be fenced");
            assert_eq!(stored(&cache, &k).unwrap(), "fresh");
        } else if stale_result.is_ok() {
            assert_eq!(stored(&cache, &k).unwrap(), "stale");
        }
        cache.debug_validate();
    });
}

/// 4. A guard dropped (released) while two claimers arrive: the key is re-acquired at
/// most once.
///
/// Catches: a claim that checks for a live entry in one critical section and inserts in
/// another: after the release both claimers see "absent" and both acquire.
#[test]
fn release_racing_claims_reacquires_at_most_once() {
    loom::model(|| {
        let (cache, _clock) = cache(64);
        let k = key("k");
        let owner = acquire(&cache, &k);
        let dropper = thread::spawn(move || drop(owner));
        let claimers: Vec<_> = (0..2)
            .map(|_| {
                let (cache, k) = (cache.clone(), k.clone());
                thread::spawn(move || match cache.claim(&k, fp()).unwrap() {
                    Claim::Acquired(guard) => {
                        guard.complete(&b"again"[..]).unwrap();
                        true
                    }
                    _ => false,
                })
            })
            .collect();
        dropper.join().unwrap();
        let acquired =
            claimers.into_iter().filter(|_| true).map(|t| t.join().unwrap()).filter(|&a| a).count();
        assert!(acquired <= 1, "re-acquired {acquired} times");
        cache.debug_validate();
    });
}

/// 5. A sweep reclaiming a lapsed lease while the key is claimed and the stale owner
/// completes: the claim acquires (a dead entry reads as absent, swept or not), the
/// stale completion is refused, and the lapse is counted exactly once.
///
/// Catches: a sweep that reclaims without re-checking under the lock, or a lookup that
/// treats a dead-but-unswept entry as live (the claim answers "in progress").
#[test]
fn sweep_racing_claim_and_complete() {
    loom::model(|| {
        let (cache, clock) = cache(64);
        let k = key("k");
        let stale = acquire(&cache, &k);
        clock.advance(LEASE);
        let sweeper = {
            let cache = cache.clone();
            thread::spawn(move || cache.run_pending())
        };
        let completer = thread::spawn(move || stale.complete(&b"late"[..]));
        let claimer = {
            let (cache, k) = (cache.clone(), k.clone());
            thread::spawn(move || cache.claim(&k, fp()).unwrap().is_acquired())
        };
        sweeper.join().unwrap();
        assert_eq!(completer.join().unwrap(), Err(LeaseLost));
        assert!(claimer.join().unwrap(), "a lapsed lease must be claimable");
        let stats = cache.stats();
        assert_eq!((stats.takeovers, stats.expirations), (1, 1), "the lapse is counted once");
        cache.debug_validate();
    });
}

/// 6. Eviction racing a completion and a claim, in a cache bounded at two entries: the
/// claim of a new key evicts only a completed entry, never the one in flight, even
/// though the in-flight one is older.
///
/// Catches: an eviction that picks the oldest entry of any state (it would evict the
/// in-flight key, letting its intent run twice).
#[test]
fn eviction_never_takes_in_flight_work() {
    loom::model(|| {
        let (cache, _clock) = cache(2);
        let (done, busy, new) = (key("done"), key("busy"), key("new"));
        let owner = acquire(&cache, &busy);
        acquire(&cache, &done).complete(&b"d"[..]).unwrap();
        let completer = thread::spawn(move || owner.complete(&b"b"[..]).unwrap());
        let claimer = {
            let (cache, new) = (cache.clone(), new.clone());
            thread::spawn(move || cache.claim(&new, fp()).unwrap().is_acquired())
        };
        completer.join().unwrap();
        assert!(claimer.join().unwrap(), "a completed entry was there to evict");
        assert_eq!(stored(&cache, &busy).unwrap(), "b", "the in-flight entry survived");
        assert!(cache.stats().entries <= 2);
        cache.debug_validate();
    });
}

/// 7. `claim_wait` racing a completion and, separately, a release: the waiter is always
/// woken (loom reports a deadlock otherwise, as its timed waits never time out) and
/// returns the stored result, or the key itself after a release; never a stale answer.
///
/// Catches: notifying before the state change is visible under the lock, or skipping the
/// notification (the waiter sleeps forever: a lost wake-up).
#[test]
fn claim_wait_is_woken_by_complete_and_release() {
    for release in [false, true] {
        loom::model(move || {
            let (cache, _clock) = cache(64);
            let k = key("k");
            let owner = acquire(&cache, &k);
            let waiter = {
                let (cache, k) = (cache.clone(), k.clone());
                thread::spawn(move || {
                    cache.claim_wait(&k, fp(), Duration::from_secs(3600)).unwrap()
                })
            };
            if release {
                owner.release().unwrap();
            } else {
                owner.complete(&b"result"[..]).unwrap();
            }
            match (release, waiter.join().unwrap()) {
                (false, Claim::Completed(replay)) => assert_eq!(replay.body.unwrap(), "result"),
                (true, Claim::Acquired(guard)) => drop(guard),
                (_, other) => panic!("release={release}: unexpected {other:?}"),
            }
        });
    }
}

/// 8. A fact inserted from elsewhere races a claim of the same key: exactly one of them
/// takes the key. Either the insert lands and the claim replays the fact's bytes, or the
/// claim acquires and the insert is refused as `Occupied` — never both, never neither.
///
/// Catches: an insert that checks for a live entry in one critical section and writes
/// in another (both would see the key absent; the fact would silently replace, or be
/// replaced by, an owner that is executing).
#[test]
fn insert_racing_a_claim_one_takes_the_key() {
    loom::model(|| {
        let (cache, _clock) = cache(64);
        let k = key("k");
        let inserter = {
            let (cache, k) = (cache.clone(), k.clone());
            thread::spawn(move || {
                let expires_at = idemcache::Timestamp::from_nanos(LEASE.as_nanos() as u64);
                let fact = idemcache::Outcome::Completed {
                    body: Some(Bytes::from_static(b"known")),
                    completed_at: idemcache::Timestamp::ZERO,
                    expires_at,
                };
                cache.insert(&k, fp(), fact)
            })
        };
        let claimed = match cache.claim(&k, fp()).unwrap() {
            Claim::Acquired(guard) => {
                guard.complete(Bytes::from_static(b"executed")).unwrap();
                true
            }
            Claim::Completed(replay) => {
                assert_eq!(replay.body.unwrap(), "known");
                false
            }
            other => panic!("unexpected {other:?}"),
        };
        let inserted = inserter.join().unwrap();
        assert_eq!(inserted.is_ok(), !claimed, "insert {inserted:?}, claimed {claimed}");
        let expected: &[u8] = if claimed { b"executed" } else { b"known" };
        assert_eq!(stored(&cache, &k).unwrap(), expected);
        cache.debug_validate();
    });
}

/// 9. `claim_wait_async` racing a completion and, separately, a release: the future is
/// always woken (loom's `block_on` parks on the waker; a lost wake-up is a deadlock loom
/// reports) and resolves to the stored result, or the key itself after a release. Its
/// sleep never ends, so only the cache's wake-up can finish it.
///
/// Catches: filing the waker after the shard lock is released (a completion between the
/// look and the filing wakes nobody), or not waking the shard's wakers on a transition.
#[test]
fn claim_wait_async_is_woken_by_complete_and_release() {
    for release in [false, true] {
        loom::model(move || {
            let (cache, _clock) = cache(64);
            let k = key("k");
            let owner = acquire(&cache, &k);
            let waiter = {
                let (cache, k) = (cache.clone(), k.clone());
                thread::spawn(move || {
                    let never = |_| std::future::pending::<()>();
                    loom::future::block_on(cache.claim_wait_async(&k, fp(), never)).unwrap()
                })
            };
            if release {
                owner.release().unwrap();
            } else {
                owner.complete(&b"result"[..]).unwrap();
            }
            match (release, waiter.join().unwrap()) {
                (false, Claim::Completed(replay)) => assert_eq!(replay.body.unwrap(), "result"),
                (true, Claim::Acquired(guard)) => drop(guard),
                (_, other) => panic!("release={release}: unexpected {other:?}"),
            }
            assert_eq!(cache.stats().waiting, 0, "no waker left filed");
        });
    }
}

/// 10. Under `LapsePolicy::MarkUnknown`, a lease lapsing (time moves) while the stale
/// owner completes and a claimer arrives: nobody acquires. Either the stale write landed
/// before the lapse (the key is COMPLETED with it) or it was refused and the key is
/// UNKNOWN, marked at the lease's end, and listed.
///
/// Catches: a lapsed lease taken for dead on any path (the claimer acquires and the
/// intent runs twice), or a stale owner's write landing after the lapse.
#[test]
fn lapse_under_mark_unknown_is_never_acquired() {
    loom::model(|| {
        let (cache, clock) = marking_cache();
        let k = key("k");
        let stale = acquire(&cache, &k);
        let lease_end = cache.now().saturating_add(LEASE);
        let time = thread::spawn(move || clock.advance(LEASE));
        let stale_write = thread::spawn(move || stale.complete(&b"stale"[..]));
        let claimer = {
            let (cache, k) = (cache.clone(), k.clone());
            thread::spawn(move || match cache.claim(&k, fp()).unwrap() {
                Claim::Acquired(_) => panic!("a lapsed lease under MarkUnknown was acquired"),
                other => other,
            })
        };
        time.join().unwrap();
        let stale_result = stale_write.join().unwrap();
        let seen = claimer.join().unwrap();
        match cache.peek(&k).expect("the key is never absent").state {
            EntryState::Completed(replay) => {
                assert_eq!(stale_result, Ok(()));
                assert_eq!(replay.body.unwrap(), "stale");
                assert!(!matches!(seen, Claim::Unknown { .. }), "{seen:?} before completing");
            }
            EntryState::Unknown { marked_at, .. } => {
                assert_eq!(stale_result, Err(LeaseLost), "the stale owner must be fenced");
                assert_eq!(marked_at, lease_end, "marked at the lease's end");
                let listed = cache.list_unknown(10);
                assert_eq!(listed.len(), 1);
                assert_eq!((&listed[0].key, listed[0].marked_at), (&k, lease_end));
                if let Claim::Unknown { marked_at, .. } = seen {
                    assert_eq!(marked_at, lease_end);
                }
            }
            other => panic!("{other:?}"),
        }
        cache.debug_validate();
    });
}

/// 11. Under `LapsePolicy::MarkUnknown`, a sweep racing a claim and a listing of a lease
/// that has lapsed: the sweep turns it UNKNOWN instead of reclaiming it, the claim
/// answers "unknown" whoever comes first, the listing lists it, and the lapse is
/// counted once, with nothing reclaimed.
///
/// Catches: a sweep that reclaims the lapsed entry as dead (the claim then acquires).
#[test]
fn sweep_racing_claim_turns_a_lapse_unknown() {
    loom::model(|| {
        let (cache, clock) = marking_cache();
        let k = key("k");
        let stale = acquire(&cache, &k);
        clock.advance(LEASE);
        let sweeper = {
            let cache = cache.clone();
            thread::spawn(move || cache.run_pending())
        };
        let claimer = {
            let (cache, k) = (cache.clone(), k.clone());
            thread::spawn(move || cache.claim(&k, fp()).unwrap())
        };
        let listed = cache.list_unknown(10);
        assert_eq!(sweeper.join().unwrap(), 0, "nothing is reclaimed");
        assert!(matches!(claimer.join().unwrap(), Claim::Unknown { .. }), "never acquired");
        assert_eq!(listed.len(), 1, "listed, whoever turned it");
        assert_eq!(stale.complete(&b"late"[..]), Err(LeaseLost));
        let stats = cache.stats();
        assert_eq!((stats.lapsed_unknown, stats.takeovers, stats.expirations), (1, 0, 0));
        cache.debug_validate();
    });
}
