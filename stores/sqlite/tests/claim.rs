//! The SQLite store's claim against a database whose write lock another connection
//! holds (as another process's long transaction would): a live record (completed, in
//! progress, UNKNOWN, or under another fingerprint) is answered from a read, without
//! waiting for the lock; a claim that must write (a new key) waits out the busy timeout,
//! fails typed, and changes nothing.

use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use idemcache::store::{block_on, Store, StoreClaim, StoreError};
use idemcache::{Fingerprint, Key};
use idemcache_sqlite::rusqlite::Connection;
use idemcache_sqlite::SqliteStore;

/// A fresh database file (and its WAL files), removed when dropped.
struct TempDb(PathBuf);

impl TempDb {
    fn new(name: &str) -> TempDb {
        let path =
            std::env::temp_dir().join(format!("idemcache-claim-{name}-{}.db", std::process::id()));
        let db = TempDb(path);
        db.remove();
        db
    }

    /// A connection in WAL mode whose statements wait `busy` for another's lock.
    fn open(&self, busy: Duration) -> Connection {
        let conn = Connection::open(&self.0).unwrap();
        conn.pragma_update(None, "journal_mode", "WAL").unwrap();
        conn.busy_timeout(busy).unwrap();
        conn
    }

    fn remove(&self) {
        for suffix in ["", "-wal", "-shm"] {
            let mut p = self.0.clone().into_os_string();
            p.push(suffix);
            let _ = std::fs::remove_file(p);
        }
    }
}

impl Drop for TempDb {
    fn drop(&mut self) {
        self.remove();
    }
}

fn key(k: &str) -> Key {
    Key::without_tenant("claim-test", k).unwrap()
}

const LEASE: Duration = Duration::from_secs(60);
const TTL: Duration = Duration::from_secs(60);

#[test]
fn a_live_record_is_answered_while_another_connection_holds_the_write_lock() {
    let file = TempDb::new("locked");
    // A busy timeout long enough that a claim waiting for the lock is told apart from
    // one that did not wait; short enough that the write below fails soon.
    let store = SqliteStore::from_connection(file.open(Duration::from_millis(300)));
    let (fp, other_fp) = (Fingerprint::of(b"request"), Fingerprint::of(b"another request"));
    block_on(async {
        store.ensure_schema().await.unwrap();
        let done = match store.claim(&key("done"), fp, LEASE).await.unwrap() {
            StoreClaim::Acquired { token, .. } => token,
            other => panic!("{other:?}"),
        };
        store.complete(&key("done"), done, Some(Bytes::from_static(b"result")), TTL).await.unwrap();
        let unknown = match store.claim(&key("unknown"), fp, LEASE).await.unwrap() {
            StoreClaim::Acquired { token, .. } => token,
            other => panic!("{other:?}"),
        };
        store.mark_unknown(&key("unknown"), unknown, TTL).await.unwrap();
        assert!(matches!(
            store.claim(&key("running"), fp, LEASE).await.unwrap(),
            StoreClaim::Acquired { .. }
        ));
    });

    let other = file.open(Duration::from_millis(300));
    other.execute_batch("BEGIN IMMEDIATE; CREATE TABLE held (x);").unwrap();
    block_on(async {
        match store.claim(&key("done"), fp, LEASE).await.unwrap() {
            StoreClaim::Completed(replay) => {
                assert_eq!(replay.body.as_deref(), Some(&b"result"[..]))
            }
            other => panic!("a completed key under a held lock: {other:?}"),
        }
        assert!(matches!(
            store.claim(&key("running"), fp, LEASE).await.unwrap(),
            StoreClaim::InProgress { .. }
        ));
        assert!(matches!(
            store.claim(&key("unknown"), fp, LEASE).await.unwrap(),
            StoreClaim::Unknown { .. }
        ));
        assert!(matches!(
            store.claim(&key("done"), other_fp, LEASE).await.unwrap(),
            StoreClaim::Mismatch
        ));
        // A new key must write: it waits out the busy timeout and fails, typed.
        match store.claim(&key("new"), fp, LEASE).await {
            Err(StoreError::Backend(_)) => {}
            other => panic!("a new key under a held lock: {other:?}"),
        }
    });
    other.execute_batch("ROLLBACK").unwrap();
    block_on(async {
        // The failed claim left nothing: the key is new, and now acquired.
        assert!(matches!(
            store.claim(&key("new"), fp, LEASE).await.unwrap(),
            StoreClaim::Acquired { .. }
        ));
        assert!(matches!(
            store.claim(&key("done"), fp, LEASE).await.unwrap(),
            StoreClaim::Completed(_)
        ));
    });
}
