//! A snapshot loaded into `Tiered`'s cache is a hint the store outranks: a stale
//! UNKNOWN mark in it (a claim in flight when the snapshot was taken) never hides the
//! store's completion, and a result the store keeps replays from memory.

use std::time::Duration;

use idemcache::snapshot::{Load, SnapshotFile};
use idemcache::store::{Store, Tiered, TieredClaim};
use idemcache::{Cache, Fingerprint, Key};
use idemcache_sqlite::SqliteStore;

#[tokio::test]
async fn a_stale_unknown_in_a_loaded_snapshot_never_hides_the_stores_completion() {
    let dir = std::env::temp_dir().join(format!("idemcache-snap-tiered-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let store = SqliteStore::open_path(dir.join("records.db")).await.unwrap();
    store.ensure_schema().await.unwrap();
    let tiered = Tiered::new(Cache::builder().build().unwrap(), store.clone());
    let (done, running) =
        (Key::new("POST /x", "u", "done").unwrap(), Key::new("POST /x", "u", "running").unwrap());
    let fp = Fingerprint::of(b"req");
    let TieredClaim::Acquired(guard) = tiered.claim(&done, fp).await.unwrap() else { panic!() };
    guard.complete(&b"kept"[..]).await.unwrap();
    let TieredClaim::Acquired(in_flight) = tiered.claim(&running, fp).await.unwrap() else {
        panic!()
    };
    // Taken while `running` executes: its cache claim is written as UNKNOWN.
    SnapshotFile::new(dir.join("cache.snap")).save(tiered.cache()).unwrap();
    in_flight.complete(&b"finished after the snapshot"[..]).await.unwrap();

    let restarted = Cache::builder().build().unwrap();
    let loaded = SnapshotFile::new(dir.join("cache.snap")).load(&restarted, Load::Strict).unwrap();
    assert_eq!(loaded.inserted, 2);
    let tiered = Tiered::new(restarted, store).with_lease(Duration::from_secs(30));
    for (key, body) in [(&done, &b"kept"[..]), (&running, &b"finished after the snapshot"[..])] {
        match tiered.claim(key, fp).await.unwrap() {
            TieredClaim::Completed(replay) => assert_eq!(replay.body.as_deref(), Some(body)),
            other => panic!("{key:?}: {other:?}"),
        }
    }
}
