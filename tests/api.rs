//! The public surface's small promises that the state-machine tests do not reach: every
//! builder bound at its exact edge, the documented constants, the real clock moving,
//! key accessors, hashing and ordering, and `Debug` output that shows what it names.
//! (Each test here was written for a mutant `cargo mutants` found the suite missing.)

mod common;

use std::collections::{BTreeSet, HashSet};
use std::hash::BuildHasher;
use std::time::{Duration, Instant};

use common::*;
use idemcache::{
    BuildError, Cache, Clock, DropPolicy, Fingerprint, Key, ManualClock, SystemClock, Timestamp,
    MAX_CLIENT_KEY_LEN, MAX_DURATION, MAX_RESULT_SIZE_LIMIT, MAX_SCOPE_AND_TENANT_LEN, MAX_SHARDS,
    MAX_TICK, MIN_TICK,
};

#[test]
fn the_documented_limits_have_their_documented_values() {
    assert_eq!(MAX_DURATION, Duration::from_secs(100 * 365 * 24 * 3600));
    assert_eq!(MAX_DURATION.as_secs(), 3_153_600_000);
    assert_eq!(MAX_SHARDS, 65_536);
    assert_eq!(MAX_RESULT_SIZE_LIMIT, 1_073_741_824);
    assert_eq!((MIN_TICK, MAX_TICK), (Duration::from_micros(1), Duration::from_secs(3600)));
    assert_eq!((MAX_CLIENT_KEY_LEN, MAX_SCOPE_AND_TENANT_LEN), (255, 1024));
}

/// Builds with one setting changed; `Ok(shard count)` or the error.
fn build(b: idemcache::CacheBuilder) -> Result<usize, BuildError> {
    b.build().map(|c| c.shard_count())
}

#[test]
fn every_builder_bound_accepts_its_edge_and_refuses_one_past_it() {
    let b = Cache::builder;
    let past = |d: Duration| d + Duration::from_nanos(1);
    assert!(build(b().shards(MAX_SHARDS).max_entries(usize::MAX).max_bytes(usize::MAX)).is_ok());
    assert_eq!(build(b().shards(MAX_SHARDS + 1)), Err(BuildError::Shards(MAX_SHARDS + 1)));
    assert_eq!(build(b().shards(1)), Ok(1));
    assert_eq!(build(b().max_entries(1)), Ok(1));
    assert_eq!(build(b().max_entries(0)), Err(BuildError::MaxEntries(0)));
    assert_eq!(build(b().max_bytes(64 * 1024)), Ok(1));
    assert_eq!(build(b().max_bytes(64 * 1024 - 1)), Err(BuildError::MaxBytes(64 * 1024 - 1)));
    assert_eq!(build(b().tick(MIN_TICK)).map(drop), Ok(()));
    assert_eq!(build(b().tick(MAX_TICK)).map(drop), Ok(()));
    assert_eq!(
        build(b().tick(MIN_TICK - Duration::from_nanos(1))),
        Err(BuildError::Tick(MIN_TICK - Duration::from_nanos(1)))
    );
    assert_eq!(build(b().tick(past(MAX_TICK))), Err(BuildError::Tick(past(MAX_TICK))));
    assert_eq!(build(b().lease(MAX_DURATION)).map(drop), Ok(()));
    assert_eq!(
        build(b().lease(past(MAX_DURATION))),
        Err(BuildError::Duration { setting: "lease", value: past(MAX_DURATION) })
    );
    let huge = b().max_bytes(usize::MAX);
    assert_eq!(build(huge.max_result_size(MAX_RESULT_SIZE_LIMIT)).map(drop), Ok(()));
    assert_eq!(
        build(b().max_bytes(usize::MAX).max_result_size(MAX_RESULT_SIZE_LIMIT + 1)),
        Err(BuildError::MaxResultSize(MAX_RESULT_SIZE_LIMIT + 1))
    );
    assert_eq!(build(b().max_bytes(64 * 1024).max_result_size(64 * 1024)), Ok(1));
    // Every refusal explains itself in terms of the setting.
    for (err, names) in [
        (BuildError::Shards(0), "shard count"),
        (BuildError::MaxEntries(0), "max_entries"),
        (BuildError::MaxBytes(1), "max_bytes"),
        (BuildError::Tick(Duration::ZERO), "tick"),
        (BuildError::MaxResultSize(0), "max_result_size"),
    ] {
        assert!(err.to_string().contains(names), "{err}");
    }
}

#[test]
fn small_caches_get_fewer_shards_a_power_of_two_that_fits_each_floor() {
    let b = || Cache::builder().shards(64);
    // Entries: 512 per shard at least. 1535 entries fit two shards of 512, not three or
    // four; a cache of 1,000 is one shard, so it holds 1,000 before it evicts.
    assert_eq!(build(b().max_entries(1535)), Ok(2));
    assert_eq!(build(b().max_entries(1536)), Ok(2));
    assert_eq!(build(b().max_entries(2048)), Ok(4));
    assert_eq!(build(b().max_entries(512 * 7)), Ok(4));
    assert_eq!(build(b().max_entries(1000)), Ok(1));
    assert_eq!(build(b().max_entries(511)), Ok(1));
    // Bytes: 64 KiB per shard, and four results of max_result_size.
    assert_eq!(build(b().max_bytes(5 * 64 * 1024).max_result_size(1024)), Ok(4));
    assert_eq!(build(b().max_bytes(8 * 64 * 1024)), Ok(2));
    // The default: four per core, rounded up to a power of two.
    let cores = std::thread::available_parallelism().map_or(4, |n| n.get());
    assert_eq!(build(Cache::builder()), Ok((cores * 4).next_power_of_two()));
    // The requested count is rounded up to a power of two, then lowered.
    assert_eq!(build(Cache::builder().shards(5)), Ok(8));
}

#[test]
fn the_system_clock_moves_with_real_time() {
    let clock = SystemClock::new();
    let started = Instant::now();
    let first = clock.now();
    // Spin (no sleep) until 30 ms of real time have passed, then compare: the coarse
    // clock lags real time by at most a kernel tick (4 ms at HZ=250).
    while started.elapsed() < Duration::from_millis(30) {
        std::hint::spin_loop();
    }
    let read = clock.now();
    let real = started.elapsed();
    assert!(read > first, "the system clock did not move");
    let moved = read.saturating_duration_since(first);
    assert!(moved >= Duration::from_millis(25), "{moved:?} in {real:?}");
    assert!(moved <= real + Duration::from_millis(5), "{moved:?} in {real:?}");
    // A fresh clock starts at its own origin.
    assert!(SystemClock::default().now() < Timestamp::from_nanos(1_000_000_000));
}

#[test]
fn key_parts_read_back_as_given() {
    let key = Key::new("POST /v1/orders", "user:42", "8e03978e").unwrap();
    assert_eq!(
        (key.scope(), key.tenant(), key.client_key()),
        ("POST /v1/orders", Some("user:42"), "8e03978e")
    );
    let anon = Key::without_tenant("POST /v1/orders", "k").unwrap();
    assert_eq!((anon.scope(), anon.tenant()), ("POST /v1/orders", None));
}

#[test]
fn keys_hash_and_order_by_their_stored_form() {
    let keys: Vec<Key> =
        ["b", "a", "c", "a"].iter().map(|c| Key::new("s", "t", c).unwrap()).collect();
    let distinct: HashSet<&Key> = keys.iter().collect();
    assert_eq!(distinct.len(), 3);
    // Equal keys hash equal; different keys differ (for these, under this hasher).
    let state = std::hash::RandomState::new();
    assert_eq!(state.hash_one(&keys[1]), state.hash_one(&keys[3]));
    assert_ne!(state.hash_one(&keys[0]), state.hash_one(&keys[1]));
    let ordered: Vec<&str> =
        keys.iter().collect::<BTreeSet<_>>().into_iter().map(Key::client_key).collect();
    assert_eq!(ordered, ["a", "b", "c"]);
    assert!(keys[1] < keys[0] && keys[0].partial_cmp(&keys[2]) == Some(std::cmp::Ordering::Less));
}

#[test]
fn debug_output_shows_what_each_value_holds() {
    let clock = ManualClock::new();
    clock.advance(secs(5));
    let cache = builder(&clock).drop_policy(DropPolicy::MarkUnknown).build().unwrap();
    let guard = acquire(&cache, &key("k"), fp("r"));
    let shown = [
        format!("{cache:?}"),
        format!("{:?}", builder(&clock)),
        format!("{guard:?}"),
        format!("{clock:?}"),
        format!("{:?}", Timestamp::from_nanos(1_500_000_000)),
        format!("{:?}", key("k")),
        format!("{:?}", Fingerprint::from_u128(0xab)),
        format!("{}", Fingerprint::from_u128(0xab)),
        format!("{:?}", Fingerprint::builder()),
    ];
    let expect = [
        "MarkUnknown",
        "completed_ttl: 100s",
        "lease_ends_at: Timestamp(15s)",
        "ManualClock(Timestamp(5s))",
        "Timestamp(1.5s)",
        "client_key: \"k\"",
        "Fingerprint(000000000000000000000000000000ab)",
        "000000000000000000000000000000ab",
        "FingerprintBuilder",
    ];
    for (shown, expect) in shown.iter().zip(expect) {
        assert!(shown.contains(expect), "{shown:?} lacks {expect:?}");
    }
    assert!(format!("{guard:?}").contains(&format!("{:?}", guard.token())));
    assert!(format!("{cache:?}").contains("listener: false"));
}

/// A store hands out tokens from its own counter; one prints as its number, as it goes
/// into a `WHERE fence < $token`.
#[test]
fn a_fencing_token_is_made_from_and_printed_as_its_number() {
    let token = idemcache::FencingToken::new(1_700_000_000_000_000_042);
    assert_eq!(token.get(), 1_700_000_000_000_000_042);
    assert_eq!(token.to_string(), "1700000000000000042");
    assert!(idemcache::FencingToken::new(2) > idemcache::FencingToken::new(1));
}

/// A cache reports the settings it was built with (layers over it read them to settle
/// what they hold the way the cache would), not the defaults.
#[test]
fn a_cache_reports_the_settings_it_was_built_with() {
    let clock = ManualClock::new();
    let cache = builder(&clock)
        .max_result_size(12_345)
        .drop_policy(DropPolicy::MarkUnknown)
        .lapse_policy(idemcache::LapsePolicy::MarkUnknown { ttl: UNKNOWN_TTL })
        .build()
        .unwrap();
    assert_eq!(cache.max_result_size(), 12_345);
    assert_eq!(cache.drop_policy(), DropPolicy::MarkUnknown);
    assert_eq!(cache.lapse_policy(), idemcache::LapsePolicy::MarkUnknown { ttl: UNKNOWN_TTL });
    let defaults = builder(&clock).build().unwrap();
    assert_eq!(defaults.drop_policy(), DropPolicy::Release);
    assert_eq!(defaults.lapse_policy(), idemcache::LapsePolicy::TakeOver);
}

/// A sweeper that could not start names the OS's refusal as its source; a bad interval
/// has none.
#[test]
fn a_sweeper_error_names_its_source() {
    use std::error::Error;
    let refused = idemcache::SweeperError::Spawn(std::io::Error::other("no more threads"));
    assert_eq!(refused.source().map(|e| e.to_string()), Some("no more threads".to_owned()));
    assert!(idemcache::SweeperError::InvalidInterval(Duration::ZERO).source().is_none());
}
