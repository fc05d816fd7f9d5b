//! One commit per first execution over SQLite: `SqliteStore::claim_in`, the business
//! write and `complete_in` in the caller's one `BEGIN IMMEDIATE` transaction.
//!
//! What is checked: the claim, the order and the record commit together; a rollback, or
//! a process killed with SIGKILL between the claim and the commit, leaves no record (a
//! retry acquires); a duplicate on another connection waits for the write lock and then
//! replays what the first committed; a reused key is `Mismatch`; a record the store's
//! own claim holds is `InProgress`; a zero lease is refused before anything is written.

use std::path::{Path, PathBuf};
use std::time::Duration;

use idemcache::store::conformance;
use idemcache::store::{block_on, OpenClaim, Store, StoreClaim, StoreError};
use idemcache::{Fingerprint, Key};
use idemcache_sqlite::rusqlite::{Connection, TransactionBehavior};
use idemcache_sqlite::{complete_in, SqliteStore};

const LEASE: Duration = Duration::from_secs(30);
const KEPT: Duration = Duration::from_secs(600);
/// The kill test's child: the database file it claims in.
const CHILD_DB: &str = "IDEMCACHE_SQLITE_ONE_COMMIT_CHILD_DB";

/// A database file of this test's own with the records' schema and an orders table.
fn database(name: &str) -> (PathBuf, SqliteStore) {
    let path =
        std::env::temp_dir().join(format!("idemcache-one-commit-{name}-{}.db", std::process::id()));
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    let store = block_on(SqliteStore::open_path(&path)).unwrap();
    block_on(store.ensure_schema()).unwrap();
    let db = connection(&path);
    db.execute_batch("CREATE TABLE orders (key TEXT PRIMARY KEY)").unwrap();
    (path, store)
}

fn connection(path: &Path) -> Connection {
    let db = Connection::open(path).unwrap();
    db.busy_timeout(Duration::from_secs(30)).unwrap();
    db
}

fn key() -> Key {
    Key::new("POST /orders", "one-commit", "k1").unwrap()
}

/// The first execution as a handler writes it; the claim's answer if not acquired.
fn execute(store: &SqliteStore, db: &mut Connection, commit: bool) -> Result<(), StoreClaim> {
    let tx = db.transaction_with_behavior(TransactionBehavior::Immediate).unwrap();
    match store.claim_in(&tx, &key(), Fingerprint::of(b"order"), LEASE).unwrap() {
        StoreClaim::Acquired { token, .. } => {
            tx.execute("INSERT INTO orders (key) VALUES ('k1')", []).unwrap();
            complete_in(&tx, &OpenClaim::new(key(), token, KEPT), Some(b"201 order")).unwrap();
            if commit {
                tx.commit().unwrap();
            }
            Ok(())
        }
        other => Err(other),
    }
}

fn orders(path: &Path) -> i64 {
    connection(path).query_row("SELECT count(*) FROM orders", [], |r| r.get(0)).unwrap()
}

fn replayed(answer: &StoreClaim) -> Option<&[u8]> {
    match answer {
        StoreClaim::Completed(replay) => replay.body.as_deref(),
        _ => None,
    }
}

#[test]
fn the_claim_the_order_and_the_record_commit_together() {
    let (path, store) = database("together");
    execute(&store, &mut connection(&path), true).unwrap();
    let again = block_on(store.claim(&key(), Fingerprint::of(b"order"), LEASE)).unwrap();
    assert_eq!(replayed(&again), Some(&b"201 order"[..]));
    let retry = execute(&store, &mut connection(&path), true).unwrap_err();
    assert_eq!(replayed(&retry), Some(&b"201 order"[..]));
    assert_eq!(orders(&path), 1);
}

#[test]
fn a_rollback_leaves_no_record_and_the_retry_runs() {
    let (path, store) = database("rollback");
    execute(&store, &mut connection(&path), false).unwrap(); // dropped: rolled back
    assert!(block_on(store.record(&key())).unwrap().is_none(), "nothing left PROCESSING");
    assert_eq!(orders(&path), 0);
    execute(&store, &mut connection(&path), true).unwrap();
    assert_eq!(orders(&path), 1);
}

#[test]
fn a_duplicate_waits_for_the_write_lock_and_replays() {
    let (path, store) = database("waits");
    let mut first = connection(&path);
    let tx = first.transaction_with_behavior(TransactionBehavior::Immediate).unwrap();
    let StoreClaim::Acquired { token, .. } =
        store.claim_in(&tx, &key(), Fingerprint::of(b"order"), LEASE).unwrap()
    else {
        panic!("a fresh key is acquired");
    };
    let (dup_path, dup_store) = (path.clone(), store.clone());
    let (started, is_started) = std::sync::mpsc::channel();
    let duplicate = std::thread::spawn(move || {
        let mut db = connection(&dup_path);
        started.send(()).unwrap();
        execute(&dup_store, &mut db, true)
    });
    is_started.recv().unwrap();
    tx.execute("INSERT INTO orders (key) VALUES ('k1')", []).unwrap();
    complete_in(&tx, &OpenClaim::new(key(), token, KEPT), Some(b"201 first")).unwrap();
    tx.commit().unwrap();
    let answer = duplicate.join().unwrap().unwrap_err();
    assert_eq!(replayed(&answer), Some(&b"201 first"[..]));
    assert_eq!(orders(&path), 1);
}

#[test]
fn a_reused_key_is_a_mismatch() {
    let (path, store) = database("mismatch");
    execute(&store, &mut connection(&path), true).unwrap();
    let mut db = connection(&path);
    let tx = db.transaction_with_behavior(TransactionBehavior::Immediate).unwrap();
    let answer = store.claim_in(&tx, &key(), Fingerprint::of(b"another"), LEASE).unwrap();
    assert!(matches!(answer, StoreClaim::Mismatch), "{answer:?}");
}

#[test]
fn a_record_the_stores_own_claim_holds_is_in_progress() {
    let (path, store) = database("held");
    let held = block_on(store.claim(&key(), Fingerprint::of(b"order"), LEASE)).unwrap();
    assert!(matches!(held, StoreClaim::Acquired { .. }));
    let answer = execute(&store, &mut connection(&path), true).unwrap_err();
    assert!(matches!(answer, StoreClaim::InProgress { .. }), "{answer:?}");
    assert_eq!(orders(&path), 0);
}

#[test]
fn a_zero_lease_is_refused_and_writes_nothing() {
    let (path, store) = database("zero");
    let mut db = connection(&path);
    let tx = db.transaction_with_behavior(TransactionBehavior::Immediate).unwrap();
    let refused = store.claim_in(&tx, &key(), Fingerprint::of(b"order"), Duration::ZERO);
    assert!(matches!(refused, Err(StoreError::InvalidInput(_))), "{refused:?}");
    tx.commit().unwrap();
    assert!(block_on(store.record(&key())).unwrap().is_none());
}

/// The kill test's child: claims in `CHILD_DB` and writes its order in one transaction,
/// says `claimed`, and waits to be killed, never committing. A no-op run on its own.
#[test]
fn child_claims_and_waits_to_be_killed() {
    let Ok(path) = std::env::var(CHILD_DB) else { return };
    let path = PathBuf::from(path);
    let store = block_on(SqliteStore::open_path(&path)).unwrap();
    let mut db = connection(&path);
    let tx = db.transaction_with_behavior(TransactionBehavior::Immediate).unwrap();
    let StoreClaim::Acquired { token, .. } =
        store.claim_in(&tx, &key(), Fingerprint::of(b"order"), LEASE).unwrap()
    else {
        panic!("the child acquires");
    };
    tx.execute("INSERT INTO orders (key) VALUES ('k1')", []).unwrap();
    complete_in(&tx, &OpenClaim::new(key(), token, KEPT), Some(b"never committed")).unwrap();
    conformance::wait_to_be_killed_at("claimed");
}

#[test]
fn a_process_killed_between_claim_and_commit_leaves_no_record() {
    let (path, store) = database("killed");
    conformance::kill_child_at(
        "child_claims_and_waits_to_be_killed",
        &[(CHILD_DB, path.to_str().unwrap())],
        "claimed",
    );
    assert!(block_on(store.record(&key())).unwrap().is_none(), "nothing left PROCESSING");
    execute(&store, &mut connection(&path), true).unwrap();
    assert_eq!(orders(&path), 1);
}
