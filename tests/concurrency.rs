//! Real threads against one cache: claim_wait hand-offs and a many-thread stress run.
//!
//! No test sleeps: a thread that must be waiting before the owner acts is detected by the
//! counters (see `waiting_claim`).

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use idemcache::{Cache, Claim, Key};

const LONG: Duration = Duration::from_secs(60);

/// Starts a thread in `claim_wait` on `k` and returns once it is asleep in the wait.
fn waiting_claim(cache: &Cache, k: &Key) -> thread::JoinHandle<Claim> {
    let waiting = cache.stats().waiting;
    let waiter = {
        let (cache, k) = (cache.clone(), k.clone());
        thread::spawn(move || cache.claim_wait(&k, fp("r"), LONG).unwrap())
    };
    // The waiter registers itself under the shard lock and releases the lock only by
    // going to sleep (holding the sleep mutex a notifier needs), so once the count moves
    // (read under that lock) no wake-up can be missed. Bounded, so a broken counter
    // fails the test instead of hanging it.
    let give_up = std::time::Instant::now() + Duration::from_secs(30);
    while cache.stats().waiting == waiting {
        assert!(std::time::Instant::now() < give_up, "the waiter never answered 'in progress'");
        thread::yield_now();
    }
    waiter
}

#[test]
fn claim_wait_returns_the_result_once_the_owner_completes() {
    let (cache, _clock) = cache();
    let k = key("a");
    let owner = acquire(&cache, &k, fp("r"));
    let waiter = waiting_claim(&cache, &k);
    owner.complete(&b"done"[..]).unwrap();
    match waiter.join().unwrap() {
        Claim::Completed(replay) => assert_eq!(replay.body.unwrap(), "done"),
        other => panic!("expected the result, got {other:?}"),
    }
}

#[test]
fn claim_wait_acquires_when_the_owner_releases() {
    let (cache, _clock) = cache();
    let k = key("a");
    let owner = acquire(&cache, &k, fp("r"));
    let waiter = waiting_claim(&cache, &k);
    owner.release().unwrap();
    match waiter.join().unwrap() {
        Claim::Acquired(guard) => guard.complete(&b"second try"[..]).unwrap(),
        other => panic!("expected to acquire, got {other:?}"),
    }
    assert_eq!(replay(&cache, &k, fp("r")).body.unwrap(), "second try");
}

#[test]
fn claim_wait_reports_unknown_when_the_owner_marks_it() {
    let (cache, _clock) = cache();
    let k = key("a");
    let owner = acquire(&cache, &k, fp("r"));
    let waiter = waiting_claim(&cache, &k);
    owner.mark_unknown().unwrap();
    assert!(matches!(waiter.join().unwrap(), Claim::Unknown { .. }));
}

#[test]
fn claim_wait_acquires_when_the_entry_is_removed() {
    // An hour-long lease: only a wake-up from `remove` can end the wait within the
    // test's bound (30 s real time, so a missing notification fails instead of hanging).
    let clock = idemcache::ManualClock::new();
    let cache = builder(&clock).lease(Duration::from_secs(3600)).build().unwrap();
    let k = key("a");
    let _fenced = acquire(&cache, &k, fp("r"));
    let waiter = waiting_claim(&cache, &k);
    assert!(cache.remove(&k).is_some());
    let (done, result) = std::sync::mpsc::channel();
    thread::spawn(move || done.send(waiter.join().unwrap().is_acquired()));
    let acquired = result.recv_timeout(Duration::from_secs(30));
    assert_eq!(acquired, Ok(true), "removal must wake the waiter");
}

#[test]
fn claim_wait_with_zero_timeout_answers_in_progress_at_once() {
    let (cache, _clock) = cache();
    let k = key("a");
    let _owner = acquire(&cache, &k, fp("r"));
    assert!(matches!(
        cache.claim_wait(&k, fp("r"), Duration::ZERO).unwrap(),
        Claim::InProgress { .. }
    ));
    assert!(matches!(cache.claim_wait(&k, fp("x"), LONG).unwrap(), Claim::Mismatch));
}

/// Many threads hammer the same keys in different orders. Per key exactly one execution
/// happens, and every caller ends up holding the bytes that execution stored.
#[test]
fn every_key_executes_exactly_once_under_contention() {
    const THREADS: usize = 8;
    const KEYS: usize = 200;
    let (cache, _clock) = cache();
    let keys: Vec<_> = (0..KEYS).map(|i| key(&format!("k{i}"))).collect();
    let executions: Arc<Vec<AtomicU32>> = Arc::new((0..KEYS).map(|_| AtomicU32::new(0)).collect());
    let start = Arc::new(Barrier::new(THREADS));
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (cache, keys, executions, start) =
                (cache.clone(), keys.clone(), executions.clone(), start.clone());
            thread::spawn(move || {
                start.wait();
                let mut seen = HashMap::new();
                for step in 0..KEYS {
                    // Each thread walks the keys from a different offset and direction.
                    let i = if t % 2 == 0 {
                        (step + t * 25) % KEYS
                    } else {
                        KEYS - 1 - (step + t * 25) % KEYS
                    };
                    let body = match cache.claim_wait(&keys[i], fp("r"), LONG).unwrap() {
                        Claim::Acquired(guard) => {
                            executions[i].fetch_add(1, Ordering::SeqCst);
                            let body = Bytes::from(format!("k{i} by t{t}"));
                            guard.complete(body.clone()).unwrap();
                            body
                        }
                        Claim::Completed(replay) => replay.body.unwrap(),
                        other => panic!("thread {t} key {i}: unexpected {other:?}"),
                    };
                    seen.insert(i, body);
                }
                seen
            })
        })
        .collect();
    let seen: Vec<HashMap<usize, Bytes>> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(executions[i].load(Ordering::SeqCst), 1, "key {i} executed more than once");
        let stored = replay(&cache, k, fp("r")).body.unwrap();
        for per_thread in &seen {
            assert_eq!(per_thread[&i], stored, "key {i}: a caller saw other bytes");
        }
    }
    let stats = cache.stats();
    assert_eq!(stats.acquired, KEYS as u64);
    assert_eq!(stats.entries, KEYS as u64);
    cache.debug_validate();
}
