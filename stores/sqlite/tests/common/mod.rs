//! What the SQLite suites share: a database file of one test's own, named for its suite,
//! the test and this process, with its WAL, shared-memory and journal files removed
//! before it is used and when it is dropped.

// Each suite is a binary of its own and uses part of this.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idemcache_sqlite::rusqlite::Connection;

/// A database file of one test's own.
pub struct TempDb(PathBuf);

impl TempDb {
    /// A fresh file for `suite`'s test `name` (unique within this process too).
    pub fn new(suite: &str, name: &str) -> TempDb {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let file = format!("idemcache-{suite}-{name}-{}-{n}.db", std::process::id());
        let db = TempDb(std::env::temp_dir().join(file));
        db.remove();
        db
    }

    /// The file's URL, for `SqliteStore::connect` (which opens it in WAL mode with a
    /// busy timeout, as processes sharing it do).
    pub fn url(&self) -> String {
        format!("sqlite:{}", self.0.display())
    }

    /// A connection in `journal` mode (checked) whose statements wait `busy` for
    /// another connection's lock.
    pub fn open(&self, journal: &str, busy: Duration) -> Connection {
        let conn = Connection::open(&self.0).unwrap();
        let mode: String =
            conn.query_row(&format!("PRAGMA journal_mode = {journal}"), [], |r| r.get(0)).unwrap();
        assert!(mode.eq_ignore_ascii_case(journal), "{mode}");
        conn.busy_timeout(busy).unwrap();
        conn
    }

    fn remove(&self) {
        for suffix in ["", "-wal", "-shm", "-journal"] {
            let mut path = self.0.clone().into_os_string();
            path.push(suffix);
            let _ = std::fs::remove_file(path);
        }
    }
}

impl Drop for TempDb {
    fn drop(&mut self) {
        self.remove();
    }
}
