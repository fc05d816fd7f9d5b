//! Helpers shared by the integration tests: a cache on a manual clock with short,
//! distinct TTLs, so every deadline in a test is a number you can read off.
#![allow(dead_code)]

pub mod model;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idemcache::{Cache, CacheBuilder, Claim, ClaimGuard, Fingerprint, Key, ManualClock, Replay};

pub const LEASE: Duration = Duration::from_secs(10);
pub const COMPLETED_TTL: Duration = Duration::from_secs(100);
pub const UNKNOWN_TTL: Duration = Duration::from_secs(50);
pub const MAX_RESULT: usize = 16;

pub fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

pub fn builder(clock: &ManualClock) -> CacheBuilder {
    Cache::builder()
        .clock(clock.clone())
        .shards(4)
        .lease(LEASE)
        .completed_ttl(COMPLETED_TTL)
        .unknown_ttl(UNKNOWN_TTL)
        .max_result_size(MAX_RESULT)
}

pub fn cache() -> (Cache, ManualClock) {
    let clock = ManualClock::new();
    (builder(&clock).build().unwrap(), clock)
}

/// A builder whose caches keep results of [`KEPT_AS_GIVEN`] bytes, for tracked bodies.
pub fn roomy_builder(clock: &ManualClock) -> CacheBuilder {
    builder(clock).max_result_size(KEPT_AS_GIVEN)
}

pub fn key(client: &str) -> Key {
    Key::new("POST /v1/orders", "user:42", client).unwrap()
}

pub fn fp(request: &str) -> Fingerprint {
    Fingerprint::of(request.as_bytes())
}

#[track_caller]
pub fn acquire(cache: &Cache, key: &Key, fp: Fingerprint) -> ClaimGuard {
    match cache.claim(key, fp).unwrap() {
        Claim::Acquired(guard) => guard,
        other => panic!("expected Acquired, got {other:?}"),
    }
}

#[track_caller]
pub fn replay(cache: &Cache, key: &Key, fp: Fingerprint) -> Replay {
    match cache.claim(key, fp).unwrap() {
        Claim::Completed(replay) => replay,
        other => panic!("expected Completed, got {other:?}"),
    }
}

/// A result body of `len` bytes that adds one to `drops` when its last handle is
/// dropped: shows when the cache really lets go of a caller's buffer.
pub fn tracked_body_of(len: usize, drops: &Arc<AtomicUsize>) -> Bytes {
    struct Tracked(Vec<u8>, Arc<AtomicUsize>);
    impl AsRef<[u8]> for Tracked {
        fn as_ref(&self) -> &[u8] {
            &self.0
        }
    }
    impl Drop for Tracked {
        fn drop(&mut self) {
            self.1.fetch_add(1, Ordering::SeqCst);
        }
    }
    Bytes::from_owner(Tracked(vec![b't'; len], drops.clone()))
}

/// Bytes in a result the cache keeps as given: above the size it copies into its own
/// chunks (512), so the cache holds the caller's buffer itself.
pub const KEPT_AS_GIVEN: usize = 1024;

/// A tracked result the cache keeps as given (see [`KEPT_AS_GIVEN`]).
pub fn tracked_body(drops: &Arc<AtomicUsize>) -> Bytes {
    tracked_body_of(KEPT_AS_GIVEN, drops)
}
