//! Reading and clearing records by key, for tools that inspect a store (a CLI's
//! `status`, `list` and `forget --force`): [`SqliteStore::record`],
//! [`SqliteStore::records`] and [`SqliteStore::remove_record`]. Inherent methods, not
//! [`Store`](idemcache::store::Store) methods: they are this store's, for operators.
//!
//! Invariant: a record is read as this handle's claims would read it, by SQLite's clock
//! and the handle's lapse setting: an expired record, or a lapsed lease a claim would
//! take over, is absent; under `LapsePolicy::MarkUnknown` a lapsed lease within the
//! unknown TTL is UNKNOWN, marked at the lease's end (as `Store::list_unknown` lists it). A
//! removal looks and deletes in one `BEGIN IMMEDIATE` transaction, so it deletes only
//! the record it judged.

use std::time::SystemTime;

use bytes::Bytes;
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use idemcache::store::encoding::{corrupt, fingerprint, from_micros, key, lapse_ttl_micros};
use idemcache::store::StoreError;
use idemcache::{FencingToken, Fingerprint, Key};

use crate::errors::{backend, read_error};
use crate::schema::{COMPLETED, PROCESSING, UNKNOWN};
use crate::SqliteStore;

/// A record's state, as a claim would find it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecordState {
    /// Executing: its lease is live.
    Processing,
    /// Completed: repeats replay its body.
    Completed,
    /// The outcome is unknown: marked so, or (under `LapsePolicy::MarkUnknown`) its
    /// lease lapsed while it executed.
    Unknown,
}

impl RecordState {
    /// The state's name as the docs write it: `PROCESSING`, `COMPLETED`, `UNKNOWN`.
    pub fn name(self) -> &'static str {
        match self {
            RecordState::Processing => "PROCESSING",
            RecordState::Completed => "COMPLETED",
            RecordState::Unknown => "UNKNOWN",
        }
    }
}

/// One live record, as [`SqliteStore::record`] and [`SqliteStore::records`] read it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Record {
    /// The record's key.
    pub key: Key,
    /// The request it was claimed for.
    pub fingerprint: Fingerprint,
    /// What a claim would find.
    pub state: RecordState,
    /// The fencing token of the claim that made it.
    pub token: FencingToken,
    /// When that claim was made.
    pub started_at: SystemTime,
    /// When it completed or was marked unknown (for a lapsed lease: the lease's end);
    /// `None` while PROCESSING.
    pub settled_at: Option<SystemTime>,
    /// When the lease ends (PROCESSING) or the record expires (otherwise).
    pub expires_at: SystemTime,
    /// The completed result's body (`None`: none, or kept without one).
    pub body: Option<Bytes>,
    /// Under `MarkUnknown`: an UNKNOWN record that is a lease which lapsed while it
    /// executed (its owner crashed or hung), not yet turned so by a claim.
    pub lapsed: bool,
}

/// The columns every read selects, in [`Raw`]'s order.
const COLUMNS: &str = "key, fingerprint, state, token, body, started_at, settled_at, expires_at";

/// A row as stored, before it is judged.
struct Raw {
    key: Vec<u8>,
    fingerprint: Vec<u8>,
    state: i64,
    token: i64,
    body: Option<Vec<u8>>,
    started_at: i64,
    settled_at: Option<i64>,
    expires_at: i64,
}

fn raw(r: &rusqlite::Row<'_>) -> rusqlite::Result<Raw> {
    Ok(Raw {
        key: r.get(0)?,
        fingerprint: r.get(1)?,
        state: r.get(2)?,
        token: r.get(3)?,
        body: r.get(4)?,
        started_at: r.get(5)?,
        settled_at: r.get(6)?,
        expires_at: r.get(7)?,
    })
}

/// SQLite's now, in µs since the epoch.
fn now(db: &Connection) -> Result<i64, StoreError> {
    db.query_row("SELECT CAST(unixepoch('subsec') * 1000000 AS INTEGER)", [], |r| r.get(0))
        .map_err(backend)
}

/// Judges `raw` at `now` with the lapse TTL `lapse` (µs, 0 under `TakeOver`): the
/// record a claim would find, or `None` if a claim would find the key absent.
fn judge(raw: Raw, now: i64, lapse: i64) -> Result<Option<Record>, StoreError> {
    let (state, settled_at, expires_at, lapsed) = match raw.state {
        PROCESSING if raw.expires_at > now => {
            (RecordState::Processing, None, raw.expires_at, false)
        }
        PROCESSING if raw.expires_at.saturating_add(lapse) > now => {
            (RecordState::Unknown, Some(raw.expires_at), raw.expires_at.saturating_add(lapse), true)
        }
        PROCESSING => return Ok(None),
        COMPLETED | UNKNOWN if raw.expires_at <= now => return Ok(None),
        COMPLETED => (RecordState::Completed, raw.settled_at, raw.expires_at, false),
        UNKNOWN => (RecordState::Unknown, raw.settled_at, raw.expires_at, false),
        other => return Err(corrupt(&raw.key, format_args!("its state is {other}"))),
    };
    let token = u64::try_from(raw.token)
        .map_err(|_| corrupt(&raw.key, format_args!("its token is {}", raw.token)))?;
    Ok(Some(Record {
        key: key(&raw.key)?,
        fingerprint: fingerprint(&raw.fingerprint).map_err(|e| corrupt(&raw.key, e))?,
        state,
        token: FencingToken::new(token),
        started_at: from_micros(raw.started_at),
        settled_at: settled_at.map(from_micros),
        expires_at: from_micros(expires_at),
        body: raw.body.map(Bytes::from),
        lapsed,
    }))
}

/// The row of `key`, judged.
fn find(db: &Connection, key: &[u8], lapse: i64) -> Result<Option<Record>, StoreError> {
    let now = now(db)?;
    let sql = format!("SELECT {COLUMNS} FROM idemcache_records WHERE key = ?1");
    let row = db.query_row(&sql, params![key], raw).optional().map_err(|e| read_error(key, e))?;
    match row {
        Some(row) => judge(row, now, lapse),
        None => Ok(None),
    }
}

impl SqliteStore {
    /// The live record of `key`, as a claim would find it (see the module docs), or
    /// `None`: a look that changes nothing, whatever the record's fingerprint.
    pub async fn record(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        let key = key.as_bytes().to_vec();
        let lapse = lapse_ttl_micros(self.lapse);
        self.run(move |db| find(db, &key, lapse)).await
    }

    /// Up to `limit` live records in key order, after the key `after` (for the next
    /// page: the last key of the previous one), only those in the state `only` if given.
    pub async fn records(
        &self,
        only: Option<RecordState>,
        after: Option<&Key>,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        let after = after.map(|k| k.as_bytes().to_vec()).unwrap_or_default();
        let lapse = lapse_ttl_micros(self.lapse);
        self.run(move |db| {
            let now = now(db)?;
            // Every row that may be live; `judge` decides. The empty blob sorts first.
            let sql = format!(
                "SELECT {COLUMNS} FROM idemcache_records
                 WHERE key > ?1 AND (expires_at > ?2 OR (state = 1 AND expires_at + ?3 > ?2))
                 ORDER BY key"
            );
            let mut statement = db.prepare(&sql).map_err(backend)?;
            let mut rows = statement.query(params![after, now, lapse]).map_err(backend)?;
            let mut out = Vec::new();
            while out.len() < limit {
                let Some(row) = rows.next().map_err(backend)? else { break };
                let row = raw(row).map_err(|e| read_error(&[], e))?;
                if let Some(record) = judge(row, now, lapse)? {
                    if only.is_none_or(|state| state == record.state) {
                        out.push(record);
                    }
                }
            }
            Ok(out)
        })
        .await
    }

    /// Deletes the live record of `key` if it is in one of `states` (as a claim would
    /// find it), looked at and deleted in one transaction; returns what it was, or
    /// `None` if there was no live record in those states (nothing is deleted).
    ///
    /// For an operator who checked the authority: an UNKNOWN record (as
    /// [`forget`](idemcache::store::Store::forget) does), a PROCESSING one stuck under a
    /// hung owner (whose own writes are then refused as
    /// [`LeaseLost`](StoreError::LeaseLost): the key may be claimed and executed again
    /// while that owner still runs), or a COMPLETED one to run it again.
    pub async fn remove_record(
        &self,
        key: &Key,
        states: &[RecordState],
    ) -> Result<Option<Record>, StoreError> {
        let key = key.as_bytes().to_vec();
        let states = states.to_vec();
        let lapse = lapse_ttl_micros(self.lapse);
        self.run(move |db| {
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
}
