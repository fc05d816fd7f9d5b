//! `impl Store for PostgresStore`: each operation binds its parameters, runs
//! `idemcache-sql`'s PostgreSQL statement ([`idemcache_sql::records::postgres`]) and
//! decodes its row with [`idemcache_sql::records::decode`].
//!
//! Invariant: every operation is that one statement (a claim that meets a lapse under
//! `MarkUnknown`, two: the claim and the turn fenced by the lapsed token), so this file
//! decides nothing the statements and the decoding do not; a row it cannot read is
//! [`StoreError::Corrupt`] naming the key, never a panic.

use std::future::Future;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use tokio_postgres::types::{ToSql, Type};

use idemcache::store::encoding::{check_duration, lapse_ttl_micros, micros};
use idemcache::store::record::{judge, StoredRecord};
use idemcache::store::{Record, RecordFilter, RecordState, Store, StoreClaim, StoreError};
use idemcache::{CorrelationId, FencingToken, Fingerprint, Key, Replay, UnknownEntry};
use idemcache_sql::records::claim_loop::{ClaimAnswer, ClaimLoop, ClaimStatement};
use idemcache_sql::records::decode::{self, ClaimRow};
use idemcache_sql::records::listing::{removal_mask, removed, Listing};
use idemcache_sql::records::postgres as sql;

use crate::{column, PostgresStore};

impl PostgresStore {
    /// UNKNOWN → COMPLETED of `key`, of the execution claimed under `listed` only if
    /// given.
    async fn resolve_where(
        &self,
        key: Key,
        listed: Option<i64>,
        body: Option<Bytes>,
        ttl: Duration,
    ) -> Result<Replay<SystemTime>, StoreError> {
        check_duration("result TTL", ttl)?;
        let stored = body.as_deref();
        let lapse_ttl = lapse_ttl_micros(self.lapse);
        let params: [&(dyn ToSql + Sync); 5] =
            [&key.as_bytes(), &stored, &micros(ttl), &lapse_ttl, &listed];
        let (at, until) =
            self.settle(&key, sql::RESOLVE, &params, StoreError::NothingToSettle).await?;
        Ok(decode::replay(body, at, until))
    }

    /// UNKNOWN → absent of `key`, of the execution claimed under `listed` only if given.
    async fn forget_where(&self, key: Key, listed: Option<i64>) -> Result<(), StoreError> {
        let lapse_ttl = lapse_ttl_micros(self.lapse);
        let params: [&(dyn ToSql + Sync); 3] = [&key.as_bytes(), &lapse_ttl, &listed];
        self.settle(&key, sql::FORGET, &params, StoreError::NothingToSettle).await.map(drop)
    }
}

/// The claim statement's row, read as plain values.
fn claim_row(row: &tokio_postgres::Row, key: &[u8]) -> Result<ClaimRow, StoreError> {
    Ok(ClaimRow {
        state: column(row, 0, key)?,
        token: column(row, 1, key)?,
        fingerprint: column(row, 2, key)?,
        body: column(row, 3, key)?,
        settled_at: column(row, 4, key)?,
        expires_at: column(row, 5, key)?,
        live: column(row, 6, key)?,
        lapsed: column(row, 7, key)?,
        took_over: column(row, 8, key)?,
    })
}

/// A record read's row (`RECORD`, `RECORDS`, `REMOVE`): the server's now and the record
/// as stored.
fn stored_row(row: &tokio_postgres::Row) -> Result<(i64, StoredRecord), StoreError> {
    let key: Vec<u8> = column(row, 1, &[])?;
    let state: i16 = column(row, 3, &key)?;
    let stored = StoredRecord {
        fingerprint: Some(column(row, 2, &key)?),
        state: state.into(),
        token: column(row, 4, &key)?,
        body: column(row, 5, &key)?,
        started_at: Some(column(row, 6, &key)?),
        settled_at: column(row, 7, &key)?,
        expires_at: column(row, 8, &key)?,
        correlation_id: column(row, 9, &key)?,
        key,
    };
    Ok((column(row, 0, &stored.key)?, stored))
}

/// Where the claim's statements run: the store's pool (each statement a transaction of
/// its own) or a caller's transaction ([`PostgresStore::claim_in`]).
pub trait Statements: Sync {
    /// Runs `sql` with `params`, of the PostgreSQL `types` (for a connection that does
    /// not keep the statement prepared: one round trip), and returns its rows.
    fn rows(
        &self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
        types: &'static [Type],
    ) -> impl Future<Output = Result<Vec<tokio_postgres::Row>, StoreError>> + Send;
}

impl Statements for PostgresStore {
    /// Prepared once per pooled connection: the types are the server's.
    fn rows(
        &self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
        _: &'static [Type],
    ) -> impl Future<Output = Result<Vec<tokio_postgres::Row>, StoreError>> + Send {
        PostgresStore::rows(self, sql, params)
    }
}

/// The types of [`sql::CLAIM`]'s (and [`sql::CLAIM_ABSENT`]'s) parameters.
const CLAIM_TYPES: &[Type] = &[Type::BYTEA, Type::BYTEA, Type::INT8, Type::INT8, Type::TEXT];
/// The types of [`sql::TURN_UNKNOWN`]'s parameters.
const TURN_UNKNOWN_TYPES: &[Type] = &[Type::BYTEA, Type::INT8, Type::INT8];

/// The claim of `key`, starting with `first` ([`sql::CLAIM`], or in a caller's
/// transaction [`sql::CLAIM_ABSENT`]): the statements `idemcache-sql`'s [`ClaimLoop`]
/// names, run here, their rows decoded for it; it decides.
pub(crate) async fn claim_on(
    statements: &impl Statements,
    first: &'static str,
    key: &[u8],
    fp: Fingerprint,
    lease: Duration,
    lapse_ttl: i64,
    correlation_id: Option<&str>,
) -> Result<StoreClaim, StoreError> {
    check_duration("lease", lease)?;
    let fp_bytes = fp.to_bytes().to_vec();
    let mut claim = ClaimLoop::new(first, key, fp);
    loop {
        let statement = claim.next()?;
        let rows = match statement {
            ClaimStatement::Claim(text) => {
                let params: [&(dyn ToSql + Sync); 5] =
                    [&key, &fp_bytes, &micros(lease), &lapse_ttl, &correlation_id];
                statements.rows(text, &params, CLAIM_TYPES).await?
            }
            ClaimStatement::TurnUnknown { token } => {
                let params: [&(dyn ToSql + Sync); 3] = [&key, &token, &lapse_ttl];
                statements.rows(sql::TURN_UNKNOWN, &params, TURN_UNKNOWN_TYPES).await?
            }
        };
        let answer = match (statement, rows.first()) {
            (_, None) => claim.answer(ClaimAnswer::Nothing),
            (ClaimStatement::Claim(_), Some(row)) => {
                claim.answer(ClaimAnswer::Claimed(&claim_row(row, key)?))
            }
            (ClaimStatement::TurnUnknown { .. }, Some(row)) => {
                let fingerprint: Option<Vec<u8>> = column(row, 0, key)?;
                let marked_at = column(row, 1, key)?;
                let fingerprint = fingerprint.as_deref();
                claim.answer(ClaimAnswer::Turned { fingerprint, marked_at })
            }
        };
        if let Some(answer) = answer? {
            return Ok(answer);
        }
    }
}

impl Store for PostgresStore {
    /// Creates the sequence, table and index of [`POSTGRES_SCHEMA`](crate::POSTGRES_SCHEMA)
    /// if missing.
    async fn ensure_schema(&self) -> Result<(), StoreError> {
        let client = self.client().await?;
        client.batch_execute(&sql::ensure_schema()).await.map_err(|e| self.failed(e))
    }

    fn claim_correlated(
        &self,
        key: &Key,
        fp: Fingerprint,
        lease: Duration,
        correlation_id: Option<&CorrelationId>,
    ) -> impl Future<Output = Result<StoreClaim, StoreError>> + Send {
        let key = key.as_bytes().to_vec();
        let correlation_id = correlation_id.map(CorrelationId::as_str).map(str::to_owned);
        async move {
            let lapse_ttl = lapse_ttl_micros(self.lapse);
            claim_on(self, sql::CLAIM, &key, fp, lease, lapse_ttl, correlation_id.as_deref()).await
        }
    }

    fn complete(
        &self,
        key: &Key,
        token: FencingToken,
        body: Option<Bytes>,
        ttl: Duration,
    ) -> impl Future<Output = Result<Replay<SystemTime>, StoreError>> + Send {
        let key = key.clone();
        async move {
            check_duration("result TTL", ttl)?;
            let stored = body.as_deref();
            let params: [&(dyn ToSql + Sync); 4] =
                [&key.as_bytes(), &decode::token(token), &stored, &micros(ttl)];
            let (at, until) =
                self.settle(&key, sql::COMPLETE, &params, StoreError::LeaseLost).await?;
            Ok(decode::replay(body, at, until))
        }
    }

    fn extend_lease(
        &self,
        key: &Key,
        token: FencingToken,
        lease: Duration,
    ) -> impl Future<Output = Result<SystemTime, StoreError>> + Send {
        let key = key.clone();
        async move {
            check_duration("lease", lease)?;
            let params: [&(dyn ToSql + Sync); 3] =
                [&key.as_bytes(), &decode::token(token), &micros(lease)];
            let (_, until) = self.settle(&key, sql::EXTEND, &params, StoreError::LeaseLost).await?;
            Ok(idemcache::store::encoding::from_micros(until))
        }
    }

    fn release(
        &self,
        key: &Key,
        token: FencingToken,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let key = key.clone();
        async move {
            let params: [&(dyn ToSql + Sync); 2] = [&key.as_bytes(), &decode::token(token)];
            self.settle(&key, sql::RELEASE, &params, StoreError::LeaseLost).await.map(drop)
        }
    }

    fn mark_unknown(
        &self,
        key: &Key,
        token: FencingToken,
        ttl: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let key = key.clone();
        async move {
            check_duration("unknown TTL", ttl)?;
            let params: [&(dyn ToSql + Sync); 3] =
                [&key.as_bytes(), &decode::token(token), &micros(ttl)];
            self.settle(&key, sql::MARK_UNKNOWN, &params, StoreError::LeaseLost).await.map(drop)
        }
    }

    fn resolve_fenced(
        &self,
        key: &Key,
        execution: Option<FencingToken>,
        body: Option<Bytes>,
        ttl: Duration,
    ) -> impl Future<Output = Result<Replay<SystemTime>, StoreError>> + Send {
        self.resolve_where(key.clone(), execution.map(decode::token), body, ttl)
    }

    fn forget_fenced(
        &self,
        key: &Key,
        execution: Option<FencingToken>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.forget_where(key.clone(), execution.map(decode::token))
    }

    async fn list_unknown(
        &self,
        limit: usize,
    ) -> Result<Vec<UnknownEntry<SystemTime>>, StoreError> {
        let lapse_ttl = lapse_ttl_micros(self.lapse);
        let rows = self.rows(sql::UNKNOWN, &[&decode::limit(limit), &lapse_ttl]).await?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let stored: Vec<u8> = column(&row, 0, &[])?;
            let fp: Vec<u8> = column(&row, 1, &stored)?;
            let marked_at = column(&row, 2, &stored)?;
            let expires_at = column(&row, 3, &stored)?;
            let token = column(&row, 4, &stored)?;
            out.push(decode::unknown_entry(&stored, &fp, token, marked_at, expires_at)?);
        }
        Ok(out)
    }

    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        // A lapse this handle reads as UNKNOWN is kept until that mark would expire.
        let lapse_ttl = lapse_ttl_micros(self.lapse);
        let rows = self.rows(sql::PURGE, &[&decode::limit(limit), &lapse_ttl]).await?;
        let purged: i64 = match rows.first() {
            Some(row) => column(row, 0, &[])?,
            None => 0,
        };
        Ok(decode::purged(purged))
    }

    async fn record(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        let rows = self.rows(sql::RECORD, &[&key.as_bytes()]).await?;
        match rows.first() {
            Some(row) => {
                let (now, stored) = stored_row(row)?;
                judge(stored, now, lapse_ttl_micros(self.lapse))
            }
            None => Ok(None),
        }
    }

    /// Pages of [`RECORDS`](idemcache_sql::records::postgres::RECORDS) (its docs say what
    /// each reads) until `limit` records are found or the range ends.
    async fn records(
        &self,
        filter: &RecordFilter,
        after: Option<&Key>,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        let mut listing = Listing::new(filter, after, limit, lapse_ttl_micros(self.lapse));
        while !listing.done() {
            let (from, below, suffix) = (listing.from(), listing.below(), listing.suffix());
            let (mask, lapse_ttl, page) = (listing.mask(), listing.lapse_ttl(), listing.page());
            let params: [&(dyn ToSql + Sync); 6] =
                [&from, &below, &suffix, &mask, &lapse_ttl, &page];
            let rows = self.rows(sql::RECORDS, &params).await?;
            let rows = rows.iter().map(stored_row).collect::<Result<Vec<_>, _>>()?;
            listing.take(rows)?;
        }
        Ok(listing.into_records())
    }

    /// One statement ([`REMOVE`](idemcache_sql::records::postgres::REMOVE)): the look and
    /// the delete are one atomic step. A row in a state asked for that does not read is
    /// deleted all the same, and answered `Corrupt` saying so.
    async fn remove_record(
        &self,
        key: &Key,
        states: &[RecordState],
    ) -> Result<Option<Record>, StoreError> {
        let lapse_ttl = lapse_ttl_micros(self.lapse);
        let mask = removal_mask(states);
        let rows = self.rows(sql::REMOVE, &[&key.as_bytes(), &mask, &lapse_ttl]).await?;
        match rows.first() {
            Some(row) => {
                removed(stored_row(row).and_then(|(now, stored)| judge(stored, now, lapse_ttl)))
            }
            None => Ok(None),
        }
    }
}
