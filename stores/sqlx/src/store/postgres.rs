//! [`PgStore`]: idemcache's records in PostgreSQL over a sqlx `PgPool`, with
//! `idemcache-sql`'s PostgreSQL statements ([`idemcache_sql::records::postgres`]).
//!
//! Invariant: every operation is one statement judged by the server's clock (a claim
//! that meets a lapse under `MarkUnknown`, two: the claim and the turn fenced by the
//! lapsed token), the same statements `idemcache-postgres` runs: a table either crate
//! wrote behaves the same under the other.

use std::future::Future;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use sqlx::postgres::{PgPool, PgPoolOptions, PgRow};
use sqlx::{AssertSqlSafe, Postgres};

use idemcache::store::encoding::{check_duration, check_url, from_micros, micros};
use idemcache::store::encoding::{check_lapse_policy, lapse_ttl_micros};
use idemcache::store::record::{judge, StoredRecord};
use idemcache::store::{Record, RecordFilter, RecordState, Store, StoreClaim, StoreError};
use idemcache::{CorrelationId, FencingToken, Fingerprint, Key, LapsePolicy, Replay, UnknownEntry};
use idemcache_sql::records::claim_loop::{ClaimAnswer, ClaimLoop, ClaimStatement};
use idemcache_sql::records::decode::{self, ClaimRow};
use idemcache_sql::records::listing::{removal_mask, removed, Listing};
use idemcache_sql::records::postgres as sql;

use super::{column, failed};

/// Idempotency records in PostgreSQL, over a sqlx [`PgPool`] (yours, or one
/// [`connect`](PgStore::connect) builds). Cheap to clone (the pool is shared).
#[derive(Clone)]
pub struct PgStore {
    pool: PgPool,
    /// The server, as errors name it (`PostgreSQL at host:port/db`).
    server: String,
    /// What a lapsed lease becomes, for this handle's statements.
    lapse: LapsePolicy,
}

impl std::fmt::Debug for PgStore {
    /// The server and the pool's size, never the password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("server", &self.server)
            .field("size", &self.pool.size())
            .field("lapse", &self.lapse)
            .finish()
    }
}

impl PgStore {
    /// A store over your own pool: the records and your handlers' tables share its
    /// connections, and a handler completes its claim in its own transaction
    /// ([`complete_in`](PgStore::complete_in)). The schema is not created: call
    /// [`ensure_schema`](Store::ensure_schema).
    pub fn from_pool(pool: PgPool) -> PgStore {
        let options = pool.connect_options();
        let server = format!(
            "PostgreSQL at {}:{}/{}",
            options.get_host(),
            options.get_port(),
            options.get_database().unwrap_or("")
        );
        PgStore { pool, server, lapse: LapsePolicy::TakeOver }
    }

    /// A store over a new pool to `url` (`postgres://user@host:port/db`) that waits 5 s
    /// for a connection, then fails as [`StoreError::Backend`]. Connects lazily: an
    /// unreachable server shows from the first operation. Needs a sqlx runtime feature
    /// on your `sqlx` dependency (`runtime-tokio`, ...).
    pub async fn connect(url: &str) -> Result<PgStore, StoreError> {
        check_url(url)?;
        let pool = PgPoolOptions::new()
            .acquire_timeout(Duration::from_secs(5))
            .connect_lazy(url)
            .map_err(|e| StoreError::InvalidInput(format!("not a PostgreSQL URL: {e}")))?;
        Ok(PgStore::from_pool(pool))
    }

    /// The pool the store takes its connections from.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// What a lapsed lease becomes for this handle's claims, listings and purges: taken
    /// over ([`LapsePolicy::TakeOver`], the default), or UNKNOWN from the lease's end for
    /// the policy's `ttl` ([`LapsePolicy::MarkUnknown`]; see [`LapsePolicy`] for what every
    /// store does, and why handles sharing a database should agree). A `ttl` of zero or
    /// over [`MAX_DURATION`](idemcache::MAX_DURATION) under `MarkUnknown` is
    /// [`StoreError::InvalidInput`].
    pub fn with_lapse_policy(mut self, policy: LapsePolicy) -> Result<PgStore, StoreError> {
        self.lapse = check_lapse_policy(policy)?;
        Ok(self)
    }

    /// This handle's lapse policy.
    pub fn lapse_policy(&self) -> LapsePolicy {
        self.lapse
    }

    /// Runs the query `build` makes on the pool and returns its rows. Each statement is
    /// a transaction of its own, so one a serialization failure or a deadlock rolled back
    /// applied nothing: it runs again (a pool whose sessions default to REPEATABLE READ
    /// or SERIALIZABLE meets them where READ COMMITTED waits).
    async fn rows<'q>(
        &self,
        build: impl Fn() -> sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>,
    ) -> Result<Vec<PgRow>, StoreError> {
        let mut conflicts = 0;
        loop {
            match build().fetch_all(&self.pool).await {
                Err(e) if conflict(&e) && conflicts < MAX_CONFLICTS => conflicts += 1,
                done => return done.map_err(|e| failed(&self.server, e)),
            }
        }
    }

    /// A settling write on `key` returning `(settled_at | started_at, expires_at)` of the
    /// one row it changed; no row is `missing` of `key`.
    async fn settle<'q>(
        &self,
        key: &Key,
        query: impl Fn() -> sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>,
        missing: fn(Key) -> StoreError,
    ) -> Result<(i64, i64), StoreError> {
        let rows = self.rows(query).await?;
        let row = rows.first().ok_or_else(|| missing(key.clone()))?;
        settled(row, key)
    }

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
        let query = || {
            sqlx::query(sql::RESOLVE)
                .bind(key.as_bytes())
                .bind(body.as_deref())
                .bind(micros(ttl))
                .bind(lapse_ttl_micros(self.lapse))
                .bind(listed)
        };
        let (at, until) = self.settle(&key, query, StoreError::NothingToSettle).await?;
        Ok(decode::replay(body, at, until))
    }

    /// UNKNOWN → absent of `key`, of the execution claimed under `listed` only if given.
    async fn forget_where(&self, key: Key, listed: Option<i64>) -> Result<(), StoreError> {
        let query = || {
            sqlx::query(sql::FORGET)
                .bind(key.as_bytes())
                .bind(lapse_ttl_micros(self.lapse))
                .bind(listed)
        };
        self.settle(&key, query, StoreError::NothingToSettle).await.map(drop)
    }
}

/// How many times a statement runs again after a serialization failure or a deadlock.
const MAX_CONFLICTS: usize = 16;

/// Whether `e` is a serialization failure or a deadlock (SQLSTATE 40001, 40P01).
fn conflict(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|code| idemcache_sql::transition::is_conflict_sqlstate(&code))
}

/// The two time columns a settling statement returns.
pub(crate) fn settled(row: &PgRow, key: &Key) -> Result<(i64, i64), StoreError> {
    Ok((column(row, 0, key.as_bytes())?, column(row, 1, key.as_bytes())?))
}

/// The claim statement's row, read as plain values.
fn claim_row(row: &PgRow, key: &[u8]) -> Result<ClaimRow, StoreError> {
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
fn stored_row(row: &PgRow) -> Result<(i64, StoredRecord), StoreError> {
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

/// One of the claim's statements with its values: where it runs (the store's pool, or a
/// caller's transaction) builds its query from it.
/// (Owned, so that the future running it need not borrow the loop's locals.)
pub(crate) enum BoundClaim {
    /// [`sql::CLAIM`], or [`sql::CLAIM_ABSENT`] (`statement`: they bind alike).
    Claim {
        statement: &'static str,
        key: Vec<u8>,
        fp: Vec<u8>,
        lease: i64,
        lapse_ttl: i64,
        correlation_id: Option<String>,
    },
    /// [`sql::TURN_UNKNOWN`].
    TurnUnknown { key: Vec<u8>, token: i64, lapse_ttl: i64 },
}

impl BoundClaim {
    /// The statement bound to its values.
    fn query(&self) -> sqlx::query::Query<'_, Postgres, sqlx::postgres::PgArguments> {
        match self {
            BoundClaim::Claim { statement, key, fp, lease, lapse_ttl, correlation_id } => {
                sqlx::query(*statement)
                    .bind(&key[..])
                    .bind(&fp[..])
                    .bind(*lease)
                    .bind(*lapse_ttl)
                    .bind(correlation_id.as_deref())
            }
            BoundClaim::TurnUnknown { key, token, lapse_ttl } => {
                sqlx::query(sql::TURN_UNKNOWN).bind(&key[..]).bind(*token).bind(*lapse_ttl)
            }
        }
    }
}

/// Where the claim's statements run: the store's pool (each statement a transaction of
/// its own, run again after a serialization conflict) or a caller's transaction.
pub(crate) trait RunsClaim {
    /// Runs `statement` and returns its rows.
    fn rows(
        &mut self,
        statement: BoundClaim,
    ) -> impl Future<Output = Result<Vec<PgRow>, StoreError>> + Send;
}

impl RunsClaim for &PgStore {
    fn rows(
        &mut self,
        statement: BoundClaim,
    ) -> impl Future<Output = Result<Vec<PgRow>, StoreError>> + Send {
        let store = *self;
        async move { store.rows(|| statement.query()).await }
    }
}

impl RunsClaim for &mut sqlx::PgConnection {
    async fn rows(&mut self, statement: BoundClaim) -> Result<Vec<PgRow>, StoreError> {
        let found = statement.query().fetch_all(&mut **self).await;
        found.map_err(|e| StoreError::Backend(Box::new(e)))
    }
}

/// The claim of `key`, starting with `first` ([`sql::CLAIM`], or in a caller's
/// transaction [`sql::CLAIM_ABSENT`]): the statements `idemcache-sql`'s [`ClaimLoop`]
/// names, run `on` the pool or the transaction, their rows decoded for it; it decides.
pub(crate) async fn claim_on(
    on: &mut impl RunsClaim,
    first: &'static str,
    key: &[u8],
    fp: Fingerprint,
    lease: Duration,
    lapse_ttl: i64,
    correlation_id: Option<&str>,
) -> Result<StoreClaim, StoreError> {
    check_duration("lease", lease)?;
    let mut claim = ClaimLoop::new(first, key, fp);
    loop {
        let statement = claim.next()?;
        let bound = match statement {
            ClaimStatement::Claim(text) => BoundClaim::Claim {
                statement: text,
                key: key.to_vec(),
                fp: fp.to_bytes().to_vec(),
                lease: micros(lease),
                lapse_ttl,
                correlation_id: correlation_id.map(str::to_owned),
            },
            ClaimStatement::TurnUnknown { token } => {
                BoundClaim::TurnUnknown { key: key.to_vec(), token, lapse_ttl }
            }
        };
        let rows = on.rows(bound).await?;
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

impl Store for PgStore {
    /// Creates the sequence, table and index of [`idemcache_sql::records::postgres::SCHEMA`]
    /// if missing (once per database, under an advisory lock).
    async fn ensure_schema(&self) -> Result<(), StoreError> {
        sqlx::raw_sql(AssertSqlSafe(sql::ensure_schema()))
            .execute(&self.pool)
            .await
            .map(drop)
            .map_err(|e| failed(&self.server, e))
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
            let correlation_id = correlation_id.as_deref();
            claim_on(&mut &*self, sql::CLAIM, &key, fp, lease, lapse_ttl, correlation_id).await
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
            let query = || {
                sqlx::query(sql::COMPLETE)
                    .bind(key.as_bytes())
                    .bind(decode::token(token))
                    .bind(body.as_deref())
                    .bind(micros(ttl))
            };
            let (at, until) = self.settle(&key, query, StoreError::LeaseLost).await?;
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
            let query = || {
                sqlx::query(sql::EXTEND)
                    .bind(key.as_bytes())
                    .bind(decode::token(token))
                    .bind(micros(lease))
            };
            let (_, until) = self.settle(&key, query, StoreError::LeaseLost).await?;
            Ok(from_micros(until))
        }
    }

    fn release(
        &self,
        key: &Key,
        token: FencingToken,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let key = key.clone();
        async move {
            let query =
                || sqlx::query(sql::RELEASE).bind(key.as_bytes()).bind(decode::token(token));
            self.settle(&key, query, StoreError::LeaseLost).await.map(drop)
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
            let query = || {
                sqlx::query(sql::MARK_UNKNOWN)
                    .bind(key.as_bytes())
                    .bind(decode::token(token))
                    .bind(micros(ttl))
            };
            self.settle(&key, query, StoreError::LeaseLost).await.map(drop)
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
        let query = || {
            sqlx::query(sql::UNKNOWN).bind(decode::limit(limit)).bind(lapse_ttl_micros(self.lapse))
        };
        let rows = self.rows(query).await?;
        let mut out = Vec::with_capacity(rows.len());
        for row in &rows {
            let stored: Vec<u8> = column(row, 0, &[])?;
            let fp: Vec<u8> = column(row, 1, &stored)?;
            let marked_at = column(row, 2, &stored)?;
            let expires_at = column(row, 3, &stored)?;
            let token = column(row, 4, &stored)?;
            out.push(decode::unknown_entry(&stored, &fp, token, marked_at, expires_at)?);
        }
        Ok(out)
    }

    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        let query = || {
            sqlx::query(sql::PURGE).bind(decode::limit(limit)).bind(lapse_ttl_micros(self.lapse))
        };
        let rows = self.rows(query).await?;
        let purged: i64 = match rows.first() {
            Some(row) => column(row, 0, &[])?,
            None => 0,
        };
        Ok(decode::purged(purged))
    }

    async fn record(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        let rows = self.rows(|| sqlx::query(sql::RECORD).bind(key.as_bytes())).await?;
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
            let query = || {
                sqlx::query(sql::RECORDS)
                    .bind(listing.from())
                    .bind(listing.below())
                    .bind(listing.suffix())
                    .bind(listing.mask())
                    .bind(listing.lapse_ttl())
                    .bind(listing.page())
            };
            let rows = self.rows(query).await?;
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
        let query = || {
            sqlx::query(sql::REMOVE).bind(key.as_bytes()).bind(removal_mask(states)).bind(lapse_ttl)
        };
        let rows = self.rows(query).await?;
        match rows.first() {
            Some(row) => {
                removed(stored_row(row).and_then(|(now, stored)| judge(stored, now, lapse_ttl)))
            }
            None => Ok(None),
        }
    }
}
