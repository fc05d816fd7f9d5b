//! Reading and clearing records for tools that inspect a store (a CLI's `status`,
//! `list` and `forget --force`): the statements behind this store's
//! [`Store::record`](idemcache::store::Store::record),
//! [`records`](idemcache::store::Store::records) and
//! [`remove_record`](idemcache::store::Store::remove_record) (`store.rs` calls them).
//!
//! Invariant: a record is read as this handle's claims would read it, by SQLite's clock
//! and the handle's lapse setting, judged by the core's [`judge`] (every store's): an
//! expired record, or a lapsed lease a claim would take over, is absent; under
//! `LapsePolicy::MarkUnknown` a lapsed lease within the unknown TTL is UNKNOWN, marked
//! at the lease's end (as `Store::list_unknown` lists it). A removal looks and deletes
//! in one `BEGIN IMMEDIATE` transaction, so it deletes only the record it judged. A
//! listing reads in key order from `after`: through the primary key's range when the
//! filter names a scope, else the rest of the table (a client key narrows the rows
//! SQLite hands back by the key's last bytes, not the rows it reads).

use rusqlite::{params, Connection, TransactionBehavior};

use idemcache::store::encoding::lapse_ttl_micros;
use idemcache::store::record::{judge, prefix_end, StoredRecord};
use idemcache::store::{Record, RecordFilter, RecordState, StoreError};
use idemcache::Key;

use crate::errors::{backend, read_error};
use crate::SqliteStore;

/// The columns every read selects, in the order [`raw`] reads them.
const COLUMNS: &str =
    "key, fingerprint, state, token, body, started_at, settled_at, expires_at, correlation_id";

/// A row as stored, before it is judged: its key first, so that a column that does not
/// read is named by it.
fn raw(r: &rusqlite::Row<'_>) -> Result<StoredRecord, StoreError> {
    let key: Vec<u8> = r.get(0).map_err(|e| read_error(&[], e))?;
    let column = |e| read_error(&key, e);
    Ok(StoredRecord {
        fingerprint: Some(r.get(1).map_err(column)?),
        state: r.get(2).map_err(column)?,
        token: r.get(3).map_err(column)?,
        body: r.get(4).map_err(column)?,
        started_at: Some(r.get(5).map_err(column)?),
        settled_at: r.get(6).map_err(column)?,
        expires_at: r.get(7).map_err(column)?,
        correlation_id: r.get(8).map_err(column)?,
        key,
    })
}

/// SQLite's now, in µs since the epoch.
fn now(db: &Connection) -> Result<i64, StoreError> {
    db.query_row("SELECT CAST(unixepoch('subsec') * 1000000 AS INTEGER)", [], |r| r.get(0))
        .map_err(backend)
}

/// The row of `key`, judged.
fn find(db: &Connection, key: &[u8], lapse: i64) -> Result<Option<Record>, StoreError> {
    let now = now(db)?;
    let sql = format!("SELECT {COLUMNS} FROM idemcache_records WHERE key = ?1");
    let mut statement = db.prepare(&sql).map_err(backend)?;
    let mut rows = statement.query(params![key]).map_err(backend)?;
    match rows.next().map_err(|e| read_error(key, e))? {
        Some(row) => judge(raw(row)?, now, lapse),
        None => Ok(None),
    }
}

/// The live record of `key` (see the module docs).
pub(crate) async fn record(store: &SqliteStore, key: &Key) -> Result<Option<Record>, StoreError> {
    let key = key.as_bytes().to_vec();
    let lapse = lapse_ttl_micros(store.lapse);
    store.run(move |db| find(db, &key, lapse)).await
}

/// Up to `limit` live records `filter` selects, in key order after `after`.
pub(crate) async fn records(
    store: &SqliteStore,
    filter: &RecordFilter,
    after: Option<&Key>,
    limit: usize,
) -> Result<Vec<Record>, StoreError> {
    let after = after.map(|k| k.as_bytes().to_vec()).unwrap_or_default();
    let prefix = filter.key_prefix();
    // Every key of the prefix's range sorts after the prefix itself.
    let from = match &prefix {
        Some(prefix) if *prefix > after => prefix.clone(),
        _ => after,
    };
    let below = prefix.as_deref().and_then(prefix_end);
    let suffix = filter.key_suffix().unwrap_or_default();
    // A key SQLite holds as TEXT or a number (a row written by hand) sorts before every
    // BLOB, the empty one included, so `key > ?1` never reaches it: a listing of the
    // whole table (no scope) looks below the empty BLOB first (a seek of the primary
    // key), so that such a row is named corrupt, not skipped.
    let whole_table = prefix.is_none();
    let filter = filter.clone();
    let lapse = lapse_ttl_micros(store.lapse);
    store
        .run(move |db| {
            let now = now(db)?;
            if whole_table {
                let sql = format!(
                    "SELECT {COLUMNS} FROM idemcache_records WHERE key < x'' ORDER BY key LIMIT 1"
                );
                let mut statement = db.prepare(&sql).map_err(backend)?;
                let mut rows = statement.query([]).map_err(backend)?;
                if let Some(row) = rows.next().map_err(backend)? {
                    // Its key does not read as bytes: `raw` names it corrupt.
                    judge(raw(row)?, now, lapse)?;
                }
            }
            // Every row that may be live, and every row of a state no store writes (which
            // `judge` names corrupt); `judge` decides. The empty blob sorts first.
            let sql = format!(
                "SELECT {COLUMNS} FROM idemcache_records
                 WHERE key > ?1 AND (?2 IS NULL OR key < ?2)
                   AND (length(?3) = 0 OR substr(key, -length(?3)) = ?3)
                   AND (expires_at > ?4 OR (state = 1 AND expires_at + ?5 > ?4)
                        OR state NOT IN (1, 2, 3))
                 ORDER BY key"
            );
            let mut statement = db.prepare(&sql).map_err(backend)?;
            let mut rows =
                statement.query(params![from, below, suffix, now, lapse]).map_err(backend)?;
            let mut out = Vec::new();
            while out.len() < limit {
                let Some(row) = rows.next().map_err(backend)? else { break };
                if let Some(record) = judge(raw(row)?, now, lapse)? {
                    if filter.matches(&record) {
                        out.push(record);
                    }
                }
            }
            Ok(out)
        })
        .await
}

/// Deletes the live record of `key` if it is in one of `states`, in one transaction.
pub(crate) async fn remove_record(
    store: &SqliteStore,
    key: &Key,
    states: &[RecordState],
) -> Result<Option<Record>, StoreError> {
    let key = key.as_bytes().to_vec();
    let states = states.to_vec();
    let lapse = lapse_ttl_micros(store.lapse);
    store
        .run(move |db| {
            let tx =
                db.transaction_with_behavior(TransactionBehavior::Immediate).map_err(backend)?;
            let Some(record) = find(&tx, &key, lapse)?.filter(|r| states.contains(&r.state)) else {
                return Ok(None);
            };
            tx.execute("DELETE FROM idemcache_records WHERE key = ?1", params![key])
                .map_err(backend)?;
            tx.commit().map_err(backend)?;
            Ok(Some(record))
        })
        .await
}
