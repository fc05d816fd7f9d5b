//! A holder killed with SIGKILL mid-execution under `Tiered`'s default lease: its key is
//! "in progress" until the lease ends, `DEFAULT_LEASE` (10 s) after its claim, and free
//! for the next claimer at that instant. SQLite's clock is pinned in both processes
//! (`unixepoch` overridden on the store's connection), so the boundary is exact and the
//! test waits for no clock.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use idemcache::store::conformance;
use idemcache::store::{block_on, Store, StoreClaim, Tiered, TieredClaim, DEFAULT_LEASE};
use idemcache::{Cache, Fingerprint, Key};
use idemcache_sqlite::rusqlite::functions::FunctionFlags;
use idemcache_sqlite::rusqlite::Connection;
use idemcache_sqlite::SqliteStore;

mod common;
use common::TempDb;

/// The child's database file.
const CHILD_DB: &str = "IDEMCACHE_SQLITE_TIERED_CRASH_DB";
/// The instant both processes' SQLite clocks start at (µs since the epoch).
const T0: i64 = 1_800_000_000_000_000;

fn key() -> Key {
    Key::without_tenant("POST /orders", "k1").unwrap()
}

/// A store on `path` whose SQLite clock reads `clock` (µs since the epoch).
fn pinned_store(conn: Connection, clock: &Arc<AtomicI64>) -> SqliteStore {
    let clock = clock.clone();
    conn.create_scalar_function("unixepoch", 1, FunctionFlags::SQLITE_UTF8, move |_| {
        Ok(clock.load(Ordering::SeqCst) as f64 / 1e6)
    })
    .unwrap();
    let store = SqliteStore::from_connection(conn);
    block_on(store.ensure_schema()).unwrap();
    store
}

fn open(path: &str) -> Connection {
    let conn = Connection::open(path).unwrap();
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    conn
}

/// The test's child: claims the key through `Tiered::new` (the default lease) at `T0`,
/// says `claimed`, and waits to be killed mid-execution. A no-op run on its own.
#[test]
fn child_claims_through_tiered_and_waits_to_be_killed() {
    let Ok(path) = std::env::var(CHILD_DB) else { return };
    let store = pinned_store(open(&path), &Arc::new(AtomicI64::new(T0)));
    let tiered = Tiered::new(Cache::builder().build().unwrap(), store);
    let claim = block_on(tiered.claim(&key(), Fingerprint::of(b"order"))).unwrap();
    let TieredClaim::Acquired(_held) = claim else { panic!("the child acquires") };
    conformance::wait_to_be_killed_at("claimed");
}

#[test]
fn a_killed_holders_key_is_free_when_the_default_lease_ends() {
    assert_eq!(DEFAULT_LEASE, Duration::from_secs(10), "the documented default");
    let file = TempDb::new("tiered-crash", "killed");
    let path = file.url().strip_prefix("sqlite:").unwrap().to_owned();
    let clock = Arc::new(AtomicI64::new(T0));
    let store = pinned_store(open(&path), &clock);
    conformance::kill_child_at(
        "child_claims_through_tiered_and_waits_to_be_killed",
        &[(CHILD_DB, &path)],
        "claimed",
    );

    let lease = DEFAULT_LEASE.as_micros() as i64;
    let ends = UNIX_EPOCH + Duration::from_micros((T0 + lease) as u64);
    let fp = Fingerprint::of(b"order");
    clock.store(T0 + lease - 1_000, Ordering::SeqCst); // 1 ms before the lease ends
    match block_on(store.claim(&key(), fp, DEFAULT_LEASE)).unwrap() {
        StoreClaim::InProgress { lease_ends_at } => assert_eq!(lease_ends_at, ends),
        other => panic!("a crashed holder's key is in progress within its lease: {other:?}"),
    }
    clock.store(T0 + lease, Ordering::SeqCst);
    match block_on(store.claim(&key(), fp, DEFAULT_LEASE)).unwrap() {
        StoreClaim::Acquired { token, .. } => assert!(token.get() > 1, "taken over: {token:?}"),
        other => panic!("the key is free when the lease ends: {other:?}"),
    }
}
