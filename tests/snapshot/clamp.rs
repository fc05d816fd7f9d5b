//! Deadlines on load when the wall clock moved between a save and a load: stepped back
//! a second, or at the far ends of its range between a save and a load keep every fact that did not expire (clamped to
//! what the cache can keep), never panic, and never count a mark as expired for a
//! reason other than its own deadline.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idemcache::snapshot::{Load, SnapshotFile};
use idemcache::{Cache, Claim, ManualClock, MAX_DURATION};

use super::{fp, key, scratch};

/// A cache holding a result, a mark and a running claim, each kept for `ttl`.
fn filled(clock: &ManualClock, ttl: Duration) -> Cache {
    let cache =
        Cache::builder().clock(clock.clone()).completed_ttl(ttl).unknown_ttl(ttl).build().unwrap();
    for (k, settle) in [("done", 0), ("unknown", 1), ("running", 2)] {
        match cache.claim(&key(k), fp(k)).unwrap() {
            Claim::Acquired(guard) if settle == 0 => guard.complete(&b"r"[..]).unwrap(),
            Claim::Acquired(guard) if settle == 1 => guard.mark_unknown().unwrap(),
            Claim::Acquired(guard) => std::mem::forget(guard),
            other => panic!("{other:?}"),
        }
    }
    cache
}

fn far_future() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(530 * 365 * 24 * 3600)
}

fn just_after_the_epoch() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1)
}

/// Saved on a wall clock five centuries ahead, loaded on one at the epoch (a clock
/// reset to 1970 on a board without a battery): every mark and completion time lies in
/// the load's future and every deadline centuries past the range. All three facts are
/// kept, clamped, with their key answered as before; none counts as expired.
#[test]
fn a_wall_clock_reset_to_the_epoch_keeps_every_fact() {
    let path = scratch("epoch");
    let clock = ManualClock::new();
    clock.advance(Duration::from_secs(3600));
    let cache = filled(&clock, Duration::from_secs(60));
    SnapshotFile::new(&path).wall_clock(far_future).save(&cache).unwrap();

    let clock = ManualClock::new();
    let restarted = Cache::builder().clock(clock.clone()).build().unwrap();
    let loaded = SnapshotFile::new(&path)
        .wall_clock(just_after_the_epoch)
        .load(&restarted, Load::Strict)
        .unwrap();
    assert_eq!((loaded.inserted, loaded.clamped, loaded.expired), (3, 3, 0));
    assert!(matches!(restarted.claim(&key("done"), fp("done")).unwrap(), Claim::Completed(_)));
    for k in ["unknown", "running"] {
        assert!(matches!(restarted.claim(&key(k), fp(k)).unwrap(), Claim::Unknown { .. }), "{k}");
    }
    clock.advance(MAX_DURATION);
    assert!(restarted.peek(&key("unknown")).is_none(), "kept no longer than the range");
}

/// Saved at the epoch, loaded five centuries later: everything expired long ago, and
/// says so; nothing panics on the arithmetic.
#[test]
fn a_wall_clock_five_centuries_on_expires_everything() {
    let path = scratch("centuries");
    let clock = ManualClock::new();
    let cache = filled(&clock, MAX_DURATION);
    SnapshotFile::new(&path).wall_clock(just_after_the_epoch).save(&cache).unwrap();
    let restarted = Cache::builder().clock(ManualClock::new()).build().unwrap();
    let loaded =
        SnapshotFile::new(&path).wall_clock(far_future).load(&restarted, Load::Strict).unwrap();
    assert_eq!((loaded.inserted, loaded.clamped, loaded.expired), (0, 0, 3));
}

fn saved_at() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

fn a_second_earlier() -> SystemTime {
    saved_at() - Duration::from_secs(1)
}

/// A cache that keeps results and marks as long as it can (`MAX_DURATION`, the natural
/// "keep it" choice) is restarted on a wall clock one second behind the save's (an NTP
/// step, a restored VM): every deadline lies past the new cache's range. Each fact is
/// kept, clamped to that range, and said so; none is dropped as if it had expired, so no
/// key executes again.
#[test]
fn a_wall_clock_stepped_back_clamps_deadlines_and_drops_no_fact() {
    let path = scratch("stepped-back");
    let cache = filled(&ManualClock::new(), MAX_DURATION);
    SnapshotFile::new(&path).wall_clock(saved_at).save(&cache).unwrap();

    let clock = ManualClock::new();
    let restarted = Cache::builder()
        .clock(clock.clone())
        .completed_ttl(MAX_DURATION)
        .unknown_ttl(MAX_DURATION)
        .build()
        .unwrap();
    let loaded = SnapshotFile::new(&path)
        .wall_clock(a_second_earlier)
        .load(&restarted, Load::Strict)
        .unwrap();
    assert_eq!((loaded.inserted, loaded.clamped, loaded.expired), (3, 3, 0));
    assert!(matches!(restarted.claim(&key("done"), fp("done")).unwrap(), Claim::Completed(_)));
    for k in ["unknown", "running"] {
        assert!(matches!(restarted.claim(&key(k), fp(k)).unwrap(), Claim::Unknown { .. }), "{k}");
    }
    // Kept as far as the cache can keep anything, and no further.
    clock.advance(MAX_DURATION - Duration::from_secs(1));
    assert!(restarted.peek(&key("unknown")).is_some());
    clock.advance(Duration::from_secs(2));
    assert!(restarted.peek(&key("unknown")).is_none());
}
