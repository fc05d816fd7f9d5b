//! What the store keeps its records in: the tables [`SQLITE_SCHEMA`] creates, and how a
//! record's state is written in them.
//!
//! Invariant: one row per key (`idemcache_records`, the key its primary key), and one
//! token counter row (`idemcache_tokens`, id 1) kept above every token a record holds,
//! so no token is handed out twice; creating the schema again changes nothing.

/// The schema [`ensure_schema`](idemcache::store::Store::ensure_schema) creates (idempotent).
///
/// `state` is 1 PROCESSING, 2 COMPLETED, 3 UNKNOWN; `expires_at` is the lease's end while
/// PROCESSING and the TTL's end after; `settled_at` is when it completed or was marked
/// unknown; times are microseconds since the Unix epoch on SQLite's clock;
/// `correlation_id` is the one the claim that made the record was given (NULL: none). A
/// table an earlier release created lacks that column: [`create_schema`] adds it.
pub const SQLITE_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS idemcache_records (
    key         BLOB PRIMARY KEY,
    fingerprint BLOB NOT NULL,
    state       INTEGER NOT NULL CHECK (state IN (1, 2, 3)),
    token       INTEGER NOT NULL,
    body        BLOB,
    started_at  INTEGER NOT NULL,
    settled_at  INTEGER,
    expires_at  INTEGER NOT NULL,
    correlation_id TEXT
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS idemcache_records_expiry ON idemcache_records (expires_at);
CREATE TABLE IF NOT EXISTS idemcache_tokens (
    id   INTEGER PRIMARY KEY CHECK (id = 1),
    last INTEGER NOT NULL
);
-- Above every token a record holds: a counter row deleted by hand and put back by
-- this statement never hands out a token a live record was claimed under.
INSERT OR IGNORE INTO idemcache_tokens (id, last)
    SELECT 1, coalesce(max(token), 0) FROM idemcache_records;
";

/// Creates what [`SQLITE_SCHEMA`] creates and brings a table an earlier release made up
/// to date (its `correlation_id` column); idempotent. It takes no transaction of its
/// own: run it in a `BEGIN IMMEDIATE` one, so processes doing it at once wait for each
/// other instead of both adding the column. The store's
/// [`ensure_schema`](idemcache::store::Store::ensure_schema) does.
pub fn create_schema(db: &rusqlite::Connection) -> rusqlite::Result<()> {
    db.execute_batch(SQLITE_SCHEMA)?;
    let has_correlation: bool = db.query_row(
        "SELECT count(*) > 0 FROM pragma_table_info('idemcache_records')
         WHERE name = 'correlation_id'",
        [],
        |r| r.get(0),
    )?;
    if !has_correlation {
        db.execute_batch("ALTER TABLE idemcache_records ADD COLUMN correlation_id TEXT")?;
    }
    Ok(())
}

/// A record's `state`, as the schema writes it.
pub(crate) const PROCESSING: i64 = 1;
pub(crate) const COMPLETED: i64 = 2;
pub(crate) const UNKNOWN: i64 = 3;
