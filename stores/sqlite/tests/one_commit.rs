//! One commit per first execution over SQLite: `SqliteStore::claim_in`, the business
//! write and `complete_in` in the caller's one `BEGIN IMMEDIATE` transaction.
//!
//! What is checked here is this API's own (the claims every engine shares, a kill
//! included, are `idemcache_sql::one_commit::testing`'s, run from `one_commit_layer.rs`
//! over the same claim code): the claim, the order and the record commit together on
//! your `rusqlite` transaction; a duplicate on another connection waits for the write
//! lock and then replays what the first committed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use idemcache::store::{block_on, OpenClaim, Store, StoreClaim};
use idemcache::{Fingerprint, Key};
use idemcache_sqlite::rusqlite::{Connection, TransactionBehavior};
use idemcache_sqlite::{complete_in, SqliteStore};

const LEASE: Duration = Duration::from_secs(30);
const KEPT: Duration = Duration::from_secs(600);

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
