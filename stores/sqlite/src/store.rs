//! `impl Store for SqliteStore`: each operation as the statements it runs, on the
//! store's worker thread.
//!
//! Invariant: every operation is one transaction on the store's one connection; a claim
//! that may write takes the write lock first (`BEGIN IMMEDIATE`) and looks again, so a
//! look and the write it decides on cannot be split by another connection or process;
//! a claim that finds a live record answers from one read and writes nothing; a
//! settling write changes only the record it names, under the caller's token or the
//! listed one.

use std::future::Future;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use rusqlite::types::ValueRef;
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use idemcache::store::encoding::{
    check_duration, corrupt, fingerprint, from_micros, key, lapse_ttl_micros, micros,
};
use idemcache::store::{Record, RecordFilter, RecordState, Store, StoreClaim, StoreError};
use idemcache::{CorrelationId, FencingToken, Fingerprint, Key, Replay, UnknownEntry};

use crate::errors::{backend, read_error};
use crate::schema::{create_schema, COMPLETED, PROCESSING, UNKNOWN};
use crate::statements::{
    ACQUIRE, COMPLETE, EXTEND_LEASE, FORGET, LIST_UNKNOWN, MARK_UNKNOWN, NEXT_TOKEN, NOW,
    PURGE_EXPIRED, RECORD, RELEASE, RESOLVE, TURN_UNKNOWN,
};
use crate::SqliteStore;

/// A row as a claim sees it.
struct Row {
    fingerprint: Vec<u8>,
    state: i64,
    body: Option<Vec<u8>>,
    settled_at: Option<i64>,
    expires_at: i64,
}

/// The record of `key` and the statement's "now" (one read: one snapshot, one clock).
fn record(db: &Connection, key: &[u8]) -> Result<Option<(i64, Row)>, StoreError> {
    db.query_row(RECORD, params![key], |r| {
        let row = Row {
            fingerprint: r.get(1)?,
            state: r.get(2)?,
            body: r.get(3)?,
            settled_at: r.get(4)?,
            expires_at: r.get(5)?,
        };
        Ok((r.get(0)?, row))
    })
    .optional()
    .map_err(|e| read_error(key, e))
}

/// A claim's answer for a live record (within its lease or TTL): it writes nothing.
fn live_answer(key: &[u8], row: Row, fp: Fingerprint) -> Result<StoreClaim, StoreError> {
    if fingerprint(&row.fingerprint).map_err(|e| corrupt(key, e))? != fp {
        return Ok(StoreClaim::Mismatch);
    }
    let settled = || from_micros(row.settled_at.unwrap_or(row.expires_at));
    Ok(match row.state {
        PROCESSING => StoreClaim::InProgress { lease_ends_at: from_micros(row.expires_at) },
        COMPLETED => StoreClaim::Completed(Replay::new(
            row.body.map(Bytes::from),
            settled(),
            from_micros(row.expires_at),
        )),
        UNKNOWN => StoreClaim::Unknown { marked_at: settled() },
        other => return Err(corrupt(key, format_args!("its state is {other}"))),
    })
}

/// Where a claim becomes PROCESSING in SQLite.
///
/// A live record is answered from one read outside any write transaction (in WAL mode a
/// reader takes no lock a writer waits for): callers polling a key in progress, or
/// replaying a completed one, never queue for the write lock, so they cannot starve the
/// holder's lease renewal (SQLite's busy handler is not fair) nor fail for a lock held
/// elsewhere. What that read answers was the record's state at its snapshot. Anything
/// else (no record, an expired one, a lapsed lease) takes the write lock first
/// (`BEGIN IMMEDIATE`) and looks again, so the look and the write it decides on are one
/// transaction.
fn claim(
    db: &mut Connection,
    key: Vec<u8>,
    fp: Fingerprint,
    lease: i64,
    lapse_ttl: i64,
    correlation_id: Option<String>,
) -> Result<StoreClaim, StoreError> {
    if let Some((now, row)) = record(db, &key)? {
        if row.expires_at > now {
            return live_answer(&key, row, fp);
        }
    }
    let tx = db.transaction_with_behavior(TransactionBehavior::Immediate).map_err(backend)?;
    let answer = claim_locked(&tx, &key, fp, lease, lapse_ttl, correlation_id)?;
    tx.commit().map_err(backend)?;
    Ok(answer)
}

/// The claim's look and write in `tx`, which holds the write lock (`BEGIN IMMEDIATE`):
/// the store's own claim commits it at once, [`SqliteStore::claim_in`] leaves it to the
/// caller's transaction. Changes nothing unless it acquires or turns a lapse UNKNOWN.
pub(crate) fn claim_locked(
    tx: &Connection,
    key: &[u8],
    fp: Fingerprint,
    lease: i64,
    lapse_ttl: i64,
    correlation_id: Option<String>,
) -> Result<StoreClaim, StoreError> {
    let now: i64 = tx.query_row(NOW, [], |r| r.get(0)).map_err(backend)?;
    let row = record(tx, key)?.map(|(_, row)| row);
    let lapsed = |row: &Row| {
        row.state == PROCESSING
            && row.expires_at <= now
            && row.expires_at.saturating_add(lapse_ttl) > now
    };
    if let Some(row) = row.as_ref().filter(|row| lapsed(row)) {
        // MarkUnknown: the lapsed lease turns UNKNOWN, marked at its end, in this
        // transaction; nobody acquires it.
        let until = row.expires_at.saturating_add(lapse_ttl);
        tx.execute(TURN_UNKNOWN, params![key, until]).map_err(backend)?;
        if fingerprint(&row.fingerprint).map_err(|e| corrupt(key, e))? != fp {
            return Ok(StoreClaim::Mismatch);
        }
        return Ok(StoreClaim::Unknown { marked_at: from_micros(row.expires_at) });
    }
    // Dead from here on; still PROCESSING, it is an earlier execution whose lease lapsed.
    let took_over = row.as_ref().is_some_and(|row| row.state == PROCESSING);
    if let Some(row) = row.filter(|row| row.expires_at > now) {
        // Live since the first look (another claim's, committed in between): answered
        // without writing.
        return live_answer(key, row, fp);
    }
    let token: i64 = tx
        .query_row(NEXT_TOKEN, [], |r| r.get(0))
        .optional()
        .map_err(backend)?
        .ok_or_else(lost_token_counter)?;
    let lease_ends_at = now.saturating_add(lease);
    let acquired = params![key, fp.to_bytes().to_vec(), token, now, lease_ends_at, correlation_id];
    tx.execute(ACQUIRE, acquired).map_err(backend)?;
    Ok(StoreClaim::Acquired {
        token: FencingToken::new(token as u64),
        lease_ends_at: from_micros(lease_ends_at),
        took_over,
    })
}

/// The token counter's one row is gone (deleted by hand; `ensure_schema` would put it
/// back at 0, reissuing tokens): no claim can acquire until it is restored above every
/// token issued, since a token issued twice could let a stale holder settle its
/// successor's claim.
fn lost_token_counter() -> StoreError {
    StoreError::Corrupt(
        "the table idemcache_tokens has lost its one row (id 1: the last fencing token \
         issued), so no claim can acquire; restore it above every token issued: \
         `INSERT INTO idemcache_tokens (id, last) SELECT 1, coalesce(max(token), 0) FROM \
         idemcache_records`"
            .into(),
    )
}

/// A settling write: `sql` updates the live row in `state` (and under the token, if
/// the statement names `?2`), returning `settled_at, expires_at`; no row is `missing` of `key`.
fn settle(
    db: &Connection,
    key: &Key,
    sql: &str,
    args: &[&dyn rusqlite::ToSql],
    missing: fn(Key) -> StoreError,
) -> Result<(i64, i64), StoreError> {
    db.query_row(sql, args, |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()
        .map_err(backend)?
        .ok_or_else(|| missing(key.clone()))
}

/// The UNKNOWN record a listing saw, by the token its execution was claimed under
/// (from `idemcache_tokens`, never handed out twice): a settling write "of it" matches
/// only that execution's row, never a later one's, whatever their fingerprints and mark
/// times.
struct Listed {
    token: i64,
}

impl Listed {
    fn of(token: FencingToken) -> Listed {
        // The inverse of the listing's `as u64`: the row's own value, bit for bit.
        Listed { token: token.get() as i64 }
    }
}

impl SqliteStore {
    /// UNKNOWN → COMPLETED of `key`, of the `listed` record only if given.
    fn resolve_where(
        &self,
        key: Key,
        listed: Option<Listed>,
        body: Option<Bytes>,
        ttl: Duration,
    ) -> impl Future<Output = Result<Replay<SystemTime>, StoreError>> + Send {
        let checked = check_duration("result TTL", ttl);
        let lapse_ttl = lapse_ttl_micros(self.lapse);
        self.run(move |db| {
            checked?;
            let stored = body.as_deref().map(<[u8]>::to_vec);
            let token = listed.map(|l| l.token);
            let (at, until) = settle(
                db,
                &key,
                RESOLVE,
                &[&key.as_bytes(), &stored, &micros(ttl), &lapse_ttl, &token],
                StoreError::NothingToSettle,
            )?;
            Ok(Replay::new(body, from_micros(at), from_micros(until)))
        })
    }

    /// UNKNOWN → absent of `key`, of the `listed` record only if given.
    fn forget_where(
        &self,
        key: Key,
        listed: Option<Listed>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let lapse_ttl = lapse_ttl_micros(self.lapse);
        self.run(move |db| {
            let token = listed.map(|l| l.token);
            let args = params![key.as_bytes(), lapse_ttl, token];
            match db.execute(FORGET, args).map_err(backend)? {
                0 => Err(StoreError::NothingToSettle(key)),
                _ => Ok(()),
            }
        })
    }
}

impl Store for SqliteStore {
    fn ensure_schema(&self) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.run(|db| {
            let tx = db.transaction_with_behavior(TransactionBehavior::Immediate);
            let tx = tx.map_err(backend)?;
            create_schema(&tx).map_err(backend)?;
            tx.commit().map_err(backend)
        })
    }

    fn claim_correlated(
        &self,
        key: &Key,
        fingerprint: Fingerprint,
        lease: Duration,
        correlation_id: Option<&CorrelationId>,
    ) -> impl Future<Output = Result<StoreClaim, StoreError>> + Send {
        let key = key.as_bytes().to_vec();
        let checked = check_duration("lease", lease);
        let lapse_ttl = lapse_ttl_micros(self.lapse);
        let correlation_id = correlation_id.map(|id| id.as_str().to_owned());
        self.run(move |db| {
            checked?;
            claim(db, key, fingerprint, micros(lease), lapse_ttl, correlation_id)
        })
    }

    fn complete(
        &self,
        key: &Key,
        token: FencingToken,
        body: Option<Bytes>,
        ttl: Duration,
    ) -> impl Future<Output = Result<Replay<SystemTime>, StoreError>> + Send {
        let key = key.clone();
        let checked = check_duration("result TTL", ttl);
        self.run(move |db| {
            checked?;
            let stored = body.as_deref().map(<[u8]>::to_vec);
            let (at, until) = settle(
                db,
                &key,
                COMPLETE,
                &[&key.as_bytes(), &(token.get() as i64), &stored, &micros(ttl)],
                StoreError::LeaseLost,
            )?;
            Ok(Replay::new(body, from_micros(at), from_micros(until)))
        })
    }

    fn extend_lease(
        &self,
        key: &Key,
        token: FencingToken,
        lease: Duration,
    ) -> impl Future<Output = Result<SystemTime, StoreError>> + Send {
        let key = key.clone();
        let checked = check_duration("lease", lease);
        self.run(move |db| {
            checked?;
            let (_, until) = settle(
                db,
                &key,
                EXTEND_LEASE,
                &[&key.as_bytes(), &(token.get() as i64), &micros(lease)],
                StoreError::LeaseLost,
            )?;
            Ok(from_micros(until))
        })
    }

    fn release(
        &self,
        key: &Key,
        token: FencingToken,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let key = key.clone();
        self.run(move |db| {
            match db
                .execute(RELEASE, params![key.as_bytes(), token.get() as i64])
                .map_err(backend)?
            {
                0 => Err(StoreError::LeaseLost(key)),
                _ => Ok(()),
            }
        })
    }

    fn mark_unknown(
        &self,
        key: &Key,
        token: FencingToken,
        ttl: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let key = key.clone();
        let checked = check_duration("unknown TTL", ttl);
        self.run(move |db| {
            checked?;
            settle(
                db,
                &key,
                MARK_UNKNOWN,
                &[&key.as_bytes(), &(token.get() as i64), &micros(ttl)],
                StoreError::LeaseLost,
            )
            .map(drop)
        })
    }

    fn resolve_fenced(
        &self,
        key: &Key,
        execution: Option<FencingToken>,
        body: Option<Bytes>,
        ttl: Duration,
    ) -> impl Future<Output = Result<Replay<SystemTime>, StoreError>> + Send {
        self.resolve_where(key.clone(), execution.map(Listed::of), body, ttl)
    }

    fn forget_fenced(
        &self,
        key: &Key,
        execution: Option<FencingToken>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.forget_where(key.clone(), execution.map(Listed::of))
    }

    fn list_unknown(
        &self,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<UnknownEntry<SystemTime>>, StoreError>> + Send {
        let lapse_ttl = lapse_ttl_micros(self.lapse);
        self.run(move |db| {
            // A lapse not yet turned by a claim reads as the UNKNOWN it will be.
            let mut statement = db.prepare(LIST_UNKNOWN).map_err(backend)?;
            let rows = statement
                .query_map(params![i64::try_from(limit).unwrap_or(i64::MAX), lapse_ttl], |r| {
                    // The key first, as bytes whatever its type (text too), so whatever
                    // else fails to read can name it.
                    let key = match r.get_ref(0)? {
                        ValueRef::Blob(b) | ValueRef::Text(b) => b.to_vec(),
                        ValueRef::Integer(i) => i.to_string().into_bytes(),
                        ValueRef::Real(f) => f.to_string().into_bytes(),
                        ValueRef::Null => Vec::new(),
                    };
                    let (fp, marked, expires) = (r.get(1), r.get(2), r.get(3));
                    Ok((key, fp, marked, expires, r.get::<_, i64>(4)))
                })
                .map_err(backend)?;
            let mut out = Vec::new();
            for row in rows {
                let (stored, fp, marked_at, expires_at, token) =
                    row.map_err(|e| read_error(&[], e))?;
                let fp: Vec<u8> = fp.map_err(|e| read_error(&stored, e))?;
                out.push(UnknownEntry::new(
                    key(&stored)?,
                    fingerprint(&fp).map_err(|e| corrupt(&stored, e))?,
                    FencingToken::new(token.map_err(|e| read_error(&stored, e))? as u64),
                    from_micros(marked_at.map_err(|e| read_error(&stored, e))?),
                    from_micros(expires_at.map_err(|e| read_error(&stored, e))?),
                ));
            }
            Ok(out)
        })
    }

    fn purge_expired(
        &self,
        limit: usize,
    ) -> impl Future<Output = Result<usize, StoreError>> + Send {
        let lapse_ttl = lapse_ttl_micros(self.lapse);
        self.run(move |db| {
            // A lapse this handle reads as UNKNOWN is kept until that mark would expire.
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            db.execute(PURGE_EXPIRED, params![limit, lapse_ttl]).map_err(backend)
        })
    }

    async fn record(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        crate::records::record(self, key).await
    }

    async fn records(
        &self,
        filter: &RecordFilter,
        after: Option<&Key>,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        crate::records::records(self, filter, after, limit).await
    }

    async fn remove_record(
        &self,
        key: &Key,
        states: &[RecordState],
    ) -> Result<Option<Record>, StoreError> {
        crate::records::remove_record(self, key, states).await
    }
}
