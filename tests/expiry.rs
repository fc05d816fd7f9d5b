//! Expiry on the timing wheel: every state is reclaimed at its deadline, deadlines move
//! with the entry, time can jump, and sweeping gives the memory back. Manual clock only.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use idemcache::{Cache, Claim, ClaimError, Key, ManualClock, RemovalCause, SweeperError, MAX_TICK};

type Heard = Arc<Mutex<Vec<(String, RemovalCause)>>>;

fn listening(clock: &ManualClock) -> (Cache, Heard) {
    let heard: Heard = Arc::default();
    let sink = heard.clone();
    let cache = builder(clock)
        .removal_listener(move |key: &Key, cause| {
            sink.lock().unwrap().push((key.client_key().to_owned(), cause))
        })
        .build()
        .unwrap();
    (cache, heard)
}

#[test]
fn every_state_is_reclaimed_at_its_deadline_and_the_memory_returned() {
    let clock = ManualClock::new();
    let (cache, heard) = listening(&clock);
    let _lapsing = acquire(&cache, &key("processing"), fp("r"));
    acquire(&cache, &key("completed"), fp("r")).complete(&b"result"[..]).unwrap();
    acquire(&cache, &key("unknown"), fp("r")).mark_unknown().unwrap();
    assert_eq!(cache.stats().entries, 3);

    clock.advance(LEASE - Duration::from_nanos(1));
    assert_eq!(cache.run_pending(), 0, "nothing is due before the lease ends");
    clock.advance(Duration::from_nanos(1));
    assert_eq!(cache.run_pending(), 1);
    assert_eq!(heard.lock().unwrap().as_slice(), &[("processing".into(), RemovalCause::Expired)]);

    clock.advance(UNKNOWN_TTL - LEASE);
    assert_eq!(cache.run_pending(), 1);
    clock.advance(COMPLETED_TTL - UNKNOWN_TTL);
    assert_eq!(cache.run_pending(), 1);

    let stats = cache.stats();
    assert_eq!((stats.entries, stats.bytes), (0, 0), "memory is returned");
    assert_eq!((stats.expirations, stats.takeovers), (3, 1));
    let causes: Vec<_> = heard.lock().unwrap().iter().map(|(k, c)| (k.clone(), *c)).collect();
    assert_eq!(
        causes,
        vec![
            ("processing".into(), RemovalCause::Expired),
            ("unknown".into(), RemovalCause::Expired),
            ("completed".into(), RemovalCause::Expired),
        ]
    );
    cache.debug_validate();
}

#[test]
fn lease_extension_moves_the_entry_on_the_wheel() {
    let (cache, clock) = cache();
    let k = key("a");
    let mut guard = acquire(&cache, &k, fp("r"));
    guard.extend_lease(secs(60)).unwrap();
    clock.advance(LEASE + secs(1));
    assert_eq!(cache.run_pending(), 0, "the old lease end must not expire the entry");
    assert!(cache.peek(&k).is_some());
    clock.advance(secs(60));
    assert_eq!(cache.run_pending(), 1);
    assert_eq!(guard.complete(&b"late"[..]), Err(idemcache::LeaseLost));
}

#[test]
fn completion_reschedules_from_the_lease_end_to_the_result_ttl() {
    let (cache, clock) = cache();
    let k = key("a");
    acquire(&cache, &k, fp("r")).complete(&b"x"[..]).unwrap();
    clock.advance(LEASE * 2);
    assert_eq!(cache.run_pending(), 0);
    assert_eq!(replay(&cache, &k, fp("r")).body.unwrap(), "x");
    clock.advance(COMPLETED_TTL);
    assert_eq!(cache.run_pending(), 1);
}

#[test]
fn a_result_ttl_set_on_the_guard_overrides_the_default() {
    let (cache, clock) = cache();
    let k = key("a");
    let mut guard = acquire(&cache, &k, fp("r"));
    assert!(guard.set_result_ttl(Duration::ZERO).is_err());
    guard.set_result_ttl(secs(5)).unwrap();
    guard.complete(&b"short-lived"[..]).unwrap();
    assert_eq!(replay(&cache, &k, fp("r")).expires_at.since_origin(), secs(5));
    clock.advance(secs(5));
    assert_eq!(cache.run_pending(), 1);
    assert_eq!(cache.peek(&k), None);
}

#[test]
fn a_six_hour_jump_reclaims_everything_due_and_nothing_else() {
    let clock = ManualClock::new();
    let cache = builder(&clock).completed_ttl(secs(24 * 3600)).build().unwrap();
    // Half the results get an hour, half a day.
    for i in 0..2000 {
        let mut guard = acquire(&cache, &key(&format!("k{i}")), fp("r"));
        if i % 2 == 0 {
            guard.set_result_ttl(secs(3600)).unwrap();
        }
        guard.complete(&b"r"[..]).unwrap();
    }
    clock.advance(secs(6 * 3600));
    assert_eq!(cache.run_pending(), 1000);
    assert_eq!(cache.stats().entries, 1000);
    assert!(cache.peek(&key("k1")).is_some());
    assert_eq!(cache.peek(&key("k0")), None);
    cache.debug_validate();
}

#[test]
fn run_pending_reclaims_everything_due_however_many_steps_it_takes() {
    let clock = ManualClock::new();
    let cache = builder(&clock).shards(1).build().unwrap();
    for i in 0..3000 {
        acquire(&cache, &key(&format!("k{i}")), fp("r")).complete(&b"r"[..]).unwrap();
    }
    clock.advance(COMPLETED_TTL);
    // More than one locked step's worth of wheel work in one shard.
    assert_eq!(cache.run_pending(), 3000);
    assert_eq!(cache.stats().entries, 0);
}

#[test]
fn inserts_reclaim_expired_entries_a_bounded_amount_at_a_time() {
    let clock = ManualClock::new();
    let cache = builder(&clock).shards(1).build().unwrap();
    for i in 0..1000 {
        acquire(&cache, &key(&format!("old{i}")), fp("r")).complete(&b"r"[..]).unwrap();
    }
    clock.advance(COMPLETED_TTL);
    acquire(&cache, &key("new0"), fp("r")).release().unwrap();
    // One insert does a bounded amount of wheel work (cascading the due slot counts too),
    // so it cannot reclaim all 1000 at once...
    let after_one = cache.stats().expirations;
    assert!(after_one <= 16, "an insert must not reclaim everything at once ({after_one})");
    for i in 1..1000 {
        acquire(&cache, &key(&format!("new{i}")), fp("r")).release().unwrap();
    }
    // ...but inserts do reclaim, faster than they add.
    assert_eq!(cache.stats().expirations, 1000, "ordinary inserts keep up with expiry");
    assert_eq!(cache.stats().entries, 0);
}

#[test]
fn a_lapse_inside_a_wheel_tick_is_replaced_at_once_not_left_for_the_sweep() {
    // The lease ends half-way through a tick: dead by the clock, not yet due on the
    // wheel. Taking the key over must replace the dead entry there and then.
    let clock = ManualClock::new();
    let cache = builder(&clock).build().unwrap();
    let k = key("a");
    clock.advance(Duration::from_millis(500));
    let stale = acquire(&cache, &k, fp("r"));
    clock.advance(LEASE);
    let fresh = acquire(&cache, &k, fp("r"));
    let stats = cache.stats();
    assert_eq!((stats.entries, stats.takeovers, stats.expirations), (1, 1, 1));
    cache.debug_validate();
    assert_eq!(stale.complete(&b"stale"[..]), Err(idemcache::LeaseLost));
    fresh.complete(&b"fresh"[..]).unwrap();
}

#[test]
fn a_millisecond_tick_expires_at_millisecond_resolution() {
    let clock = ManualClock::new();
    let cache = builder(&clock).tick(Duration::from_millis(1)).build().unwrap();
    let k = key("a");
    let mut guard = acquire(&cache, &k, fp("r"));
    guard.set_result_ttl(Duration::from_millis(1500)).unwrap();
    guard.complete(&b"x"[..]).unwrap();
    clock.advance(Duration::from_millis(1499));
    assert_eq!(cache.run_pending(), 0);
    clock.advance(Duration::from_millis(1));
    assert_eq!(cache.run_pending(), 1);
}

#[test]
fn expired_entries_read_as_absent_before_any_sweep() {
    let clock = ManualClock::new();
    let cache = builder(&clock).tick(Duration::from_secs(3600)).build().unwrap();
    let k = key("a");
    acquire(&cache, &k, fp("r")).complete(&b"x"[..]).unwrap();
    clock.advance(COMPLETED_TTL);
    assert_eq!(cache.peek(&k), None);
    assert!(matches!(cache.claim(&k, fp("r")).unwrap(), Claim::Acquired(_)));
}

/// Waits (bounded, so a bug fails rather than hangs) until the cache holds nothing.
fn until_empty(cache: &Cache, what: &str) {
    let give_up = Instant::now() + Duration::from_secs(30);
    while cache.stats().entries > 0 {
        assert!(Instant::now() < give_up, "{what}");
        std::thread::yield_now();
    }
}

#[test]
fn the_sweeper_thread_reclaims_in_the_background_and_stops_on_drop() {
    let clock = ManualClock::new();
    let cache = roomy_builder(&clock).build().unwrap();
    acquire(&cache, &key("a"), fp("r")).complete(&b"x"[..]).unwrap();
    clock.advance(COMPLETED_TTL);
    let sweeper = cache.spawn_sweeper(Duration::from_millis(1)).unwrap();
    // Wait for the sweeper's effect, not for a time.
    until_empty(&cache, "the sweeper never ran");
    // It keeps sweeping, interval after interval.
    acquire(&cache, &key("b"), fp("r")).complete(&b"x"[..]).unwrap();
    clock.advance(COMPLETED_TTL);
    until_empty(&cache, "the sweeper stopped after its first sweep");
    // Dropping the handle stops and joins the thread, which lets go of the cache: the
    // last handle's drop then frees what the cache holds.
    let dropped = Arc::new(AtomicUsize::new(0));
    acquire(&cache, &key("c"), fp("r")).complete(tracked_body(&dropped)).unwrap();
    drop(sweeper);
    drop(cache);
    assert_eq!(dropped.load(Ordering::SeqCst), 1, "the sweeper thread still holds the cache");
}

#[test]
fn a_sweeper_interval_out_of_range_is_refused_with_a_reason() {
    let (cache, _clock) = cache();
    let err = cache.spawn_sweeper(Duration::ZERO).unwrap_err();
    assert!(matches!(err, SweeperError::InvalidInterval(d) if d == Duration::ZERO));
    assert!(err.to_string().contains("interval"), "{err}");
    assert!(std::error::Error::source(&err).is_none());
    assert!(cache.spawn_sweeper(idemcache::MAX_DURATION + Duration::from_secs(1)).is_err());
}

/// The epilogue runs for every reason it has: here a removal with nothing else to do (an
/// UNKNOWN entry forgotten: no body, not PROCESSING) is told before `forget` returns.
#[test]
fn the_listener_hears_a_forget_before_it_returns() {
    let clock = ManualClock::new();
    let (cache, heard) = listening(&clock);
    acquire(&cache, &key("u"), fp("r")).mark_unknown().unwrap();
    cache.forget(&key("u")).unwrap();
    assert_eq!(heard.lock().unwrap().len(), 1, "{:?}", heard.lock().unwrap());
    assert_eq!(heard.lock().unwrap()[0].0, "u");
}

/// ... and here a departed result with no listener and nothing else to do is freed by
/// the operation that removed it, not by some later one.
#[test]
fn a_removed_result_is_freed_by_the_removal_itself() {
    let clock = ManualClock::new();
    let cache = roomy_builder(&clock).build().unwrap();
    let drops = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    acquire(&cache, &key("k"), fp("r")).complete(tracked_body(&drops)).unwrap();
    cache.remove(&key("k")).unwrap();
    assert_eq!(drops.load(std::sync::atomic::Ordering::SeqCst), 1);
}

// The edges of the contract an adversarial review found; each test failed before its
// fix, and the comment above it says how.

// Before: `now + lease` saturated to `now`, so a fresh guard was born dead (its
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

// A fact inserted within an hour of the end of time was refused as `TtlTooLong`; it is
// kept until the last deadline, as a completion that late is.
#[test]
fn a_fact_inserted_near_the_end_of_time_is_kept_until_the_last_deadline() {
    let clock = ManualClock::new();
    let cache = builder(&clock).build().unwrap();
    clock.advance(Duration::from_nanos(u64::MAX - 2 * MAX_TICK.as_nanos() as u64));
    let now = cache.now();
    let fact =
        idemcache::Outcome::Unknown { marked_at: now, expires_at: now.saturating_add(secs(7200)) };
    cache.insert(&key("late"), fp("r"), fact).unwrap();
    let Ok(Claim::Unknown { expires_at, .. }) = cache.claim(&key("late"), fp("r")) else {
        panic!("expected the inserted mark")
    };
    assert_eq!(expires_at, now.saturating_add(MAX_TICK));
    clock.advance(MAX_TICK);
    let too_late = idemcache::Outcome::Unknown {
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
