//! [`MySqlStore`]: idemcache's records in MySQL or MariaDB over a sqlx `MySqlPool`,
//! with `idemcache-sql`'s MySQL statements ([`idemcache_sql::records::mysql`], whose
//! docs explain why the claim is atomic).
//!
//! Invariant: a claim is one transaction on one connection whose decision is made on
//! the record's row locked by `SELECT ... FOR UPDATE` (or, for an absent key, by the
//! primary key refusing a second insert), judged by the server's clock; its token is
//! minted from the durable counter before it begins; every other write is one
//! statement fenced by its token, with the server's now read just before and bound in,
//! applied only if it matched the row.
//!
//! Every operation runs in a transaction of its own, begun and committed explicitly, so
//! that it commits whatever the pool's sessions say of `autocommit` (a session at
//! `autocommit = 0` left a completion uncommitted, holding its row lock, and refused
//! the next claim's `SET TRANSACTION`). A claim that loses a deadlock or a duplicate-key
//! race at any of its statements claims again. The one exception is `claim_in`, whose
//! statements run in the caller's transaction: it commits nothing and retries nothing
//! there (a deadlock has rolled that transaction back), its token minted as above.

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use sqlx::mysql::{
    MySqlArguments, MySqlConnection, MySqlDatabaseError, MySqlPool, MySqlPoolOptions, MySqlRow,
};
use sqlx::{AssertSqlSafe, Connection, MySql};

use idemcache::store::encoding::{check_duration, check_url, from_micros, micros};
use idemcache::store::encoding::{check_lapse_policy, lapse_ttl_micros};
use idemcache::store::record::{judge, StoredRecord};
use idemcache::store::{Record, RecordFilter, RecordState, Store, StoreClaim, StoreError};
use idemcache::{CorrelationId, FencingToken, Fingerprint, Key, LapsePolicy, Replay, UnknownEntry};
use idemcache_sql::records::decode::{self, ClaimRow};
use idemcache_sql::records::listing::Listing;
use idemcache_sql::records::mysql::{self as sql, Param, Statement, Values};
use idemcache_sql::records::mysql_claim::{self, Next};

use super::{column, failed};

/// Idempotency records in MySQL or MariaDB (InnoDB), over a sqlx [`MySqlPool`] (yours,
/// or one [`connect`](MySqlStore::connect) builds). Cheap to clone (the pool is shared).
///
/// A known limit of its fencing tokens: a claim mints its token before it reads the
/// key's record, so a claim that minted and then stalled while a later execution's
/// record of the key was released, forgotten (`forget`, a reconciler's `DidNotHappen`),
/// purged or rolled back (a one-commit claim's) can insert a token below that record's. Tokens grow with every claim while the key
/// keeps a record; an authority that fences by `fence < token` should not rely on them
/// across a forget. (Found by the protocol's model, `model/` in the repository.)
#[derive(Clone)]
pub struct MySqlStore {
    pool: MySqlPool,
    /// The server, as errors name it (`MySQL at host:port/db`).
    server: String,
    /// What a lapsed lease becomes, for this handle's statements.
    lapse: LapsePolicy,
    /// Whether the server is MariaDB (its `SET STATEMENT` bounds a claim's waits),
    /// asked once, by the first `claim_in`; shared by clones.
    mariadb: Arc<OnceLock<bool>>,
}

impl std::fmt::Debug for MySqlStore {
    /// The server and the pool's size, never the password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MySqlStore")
            .field("server", &self.server)
            .field("size", &self.pool.size())
            .field("lapse", &self.lapse)
            .finish()
    }
}

/// `statement` with `values` bound in its parameters' order.
pub(crate) fn bind<'q>(
    statement: &Statement,
    values: &Values<'q>,
) -> sqlx::query::Query<'q, MySql, MySqlArguments> {
    bind_to(sqlx::query(statement.sql), statement.params, values)
}

/// `query` with `values` bound in the order of `params`.
fn bind_to<'q>(
    mut query: sqlx::query::Query<'q, MySql, MySqlArguments>,
    params: &[Param],
    values: &Values<'q>,
) -> sqlx::query::Query<'q, MySql, MySqlArguments> {
    for param in params {
        query = match param {
            Param::Key => query.bind(values.key),
            Param::Fingerprint => query.bind(values.fingerprint),
            Param::Token => query.bind(values.token),
            Param::Held => query.bind(values.held),
            Param::Now => query.bind(values.now),
            Param::Duration => query.bind(values.duration),
            Param::LapseTtl => query.bind(values.lapse_ttl),
            Param::Body => query.bind(values.body),
            Param::Limit => query.bind(values.limit),
            Param::CorrelationId => query.bind(values.correlation_id),
            Param::From => query.bind(values.from),
            Param::Below => query.bind(values.below),
            Param::Suffix => query.bind(values.suffix),
            Param::Mask => query.bind(values.mask),
        };
    }
    query
}

/// The server's now (µs), on `conn`.
pub(crate) async fn now(conn: &mut MySqlConnection) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(sql::NOW.sql).fetch_one(conn).await
}

/// Whether `e` means "a concurrent claim got between, claim again": a duplicate key or
/// a deadlock InnoDB rolled back.
fn raced(e: &sqlx::Error) -> bool {
    matches!(number(e), Some(sql::DUPLICATE_KEY | sql::DEADLOCK))
}

/// MySQL's error number of `e`, if the server answered with one.
fn number(e: &sqlx::Error) -> Option<u16> {
    e.as_database_error()
        .and_then(|d| d.try_downcast_ref::<MySqlDatabaseError>())
        .map(MySqlDatabaseError::number)
}

impl MySqlStore {
    /// A store over your own pool: the records and your handlers' tables share its
    /// connections, and a handler completes its claim in its own transaction
    /// ([`complete_in`](MySqlStore::complete_in)). The schema is not created: call
    /// [`ensure_schema`](Store::ensure_schema).
    pub fn from_pool(pool: MySqlPool) -> MySqlStore {
        let options = pool.connect_options();
        let server = format!(
            "MySQL at {}:{}/{}",
            options.get_host(),
            options.get_port(),
            options.get_database().unwrap_or("")
        );
        MySqlStore { pool, server, lapse: LapsePolicy::TakeOver, mariadb: Arc::default() }
    }

    /// A store over a new pool to `url` (`mysql://user@host:port/db`, MySQL or MariaDB)
    /// that waits 5 s for a connection, then fails as [`StoreError::Backend`]. Connects
    /// lazily: an unreachable server shows from the first operation. Needs a sqlx
    /// runtime feature on your `sqlx` dependency (`runtime-tokio`, ...).
    pub async fn connect(url: &str) -> Result<MySqlStore, StoreError> {
        check_url(url)?;
        let pool = MySqlPoolOptions::new()
            .acquire_timeout(Duration::from_secs(5))
            .connect_lazy(url)
            .map_err(|e| StoreError::InvalidInput(format!("not a MySQL URL: {e}")))?;
        Ok(MySqlStore::from_pool(pool))
    }

    /// The pool the store takes its connections from.
    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    /// What a lapsed lease becomes for this handle's claims, listings and purges: taken
    /// over ([`LapsePolicy::TakeOver`], the default), or UNKNOWN from the lease's end for
    /// the policy's `ttl` ([`LapsePolicy::MarkUnknown`]; see [`LapsePolicy`] for what every
    /// store does, and why handles sharing a database should agree). A `ttl` of zero or
    /// over [`MAX_DURATION`](idemcache::MAX_DURATION) under `MarkUnknown` is
    /// [`StoreError::InvalidInput`].
    pub fn with_lapse_policy(mut self, policy: LapsePolicy) -> Result<MySqlStore, StoreError> {
        self.lapse = check_lapse_policy(policy)?;
        Ok(self)
    }

    /// This handle's lapse policy.
    pub fn lapse_policy(&self) -> LapsePolicy {
        self.lapse
    }

    /// `e` as [`StoreError::Backend`], naming the server.
    fn failed(&self, e: sqlx::Error) -> StoreError {
        failed(&self.server, e)
    }

    /// A pooled connection.
    ///
    /// sqlx's pool retries a refused connection until its acquire timeout and then says
    /// only that it timed out; so while the pool holds no connection, one is also opened
    /// directly beside the pool's attempt, and its error, if it fails first, is the
    /// answer: at once, with the cause ("Connection refused"), naming the server. (It
    /// costs one extra connection each time the pool is empty; a server that accepts and
    /// never answers still ends at the acquire timeout.)
    async fn connection(&self) -> Result<sqlx::pool::PoolConnection<MySql>, StoreError> {
        use std::task::Poll;
        let mut acquire = std::pin::pin!(self.pool.acquire());
        let options = (self.pool.size() == 0).then(|| self.pool.connect_options());
        let mut direct = std::pin::pin!(async move {
            match options {
                Some(options) => MySqlConnection::connect_with(&*options).await.err(),
                None => std::future::pending().await,
            }
        });
        let mut direct_done = false;
        std::future::poll_fn(|cx| {
            if let Poll::Ready(acquired) = acquire.as_mut().poll(cx) {
                return Poll::Ready(acquired.map_err(|e| self.failed(e)));
            }
            if !direct_done {
                if let Poll::Ready(error) = direct.as_mut().poll(cx) {
                    direct_done = true;
                    if let Some(e) = error {
                        return Poll::Ready(Err(self.failed(e)));
                    }
                }
            }
            Poll::Pending
        })
        .await
    }

    /// A READ COMMITTED transaction on `conn` (the claim's and every write's: a row lock
    /// on what the statement matched, no gap locks to deadlock a purge on).
    async fn begin<'c>(
        &self,
        conn: &'c mut MySqlConnection,
    ) -> Result<sqlx::Transaction<'c, MySql>, StoreError> {
        let fail = |e| self.failed(e);
        // As text, not prepared: no server has to support preparing SET TRANSACTION.
        sqlx::raw_sql(sql::READ_COMMITTED).execute(&mut *conn).await.map_err(fail)?;
        conn.begin().await.map_err(fail)
    }

    /// A fenced write on `key`: `statement` with `values` and the server's now read just
    /// before, in a transaction of its own; returns that now. No row matched is `missing`
    /// of `key`. A deadlock rolled it back whole, so it runs again.
    async fn settle(
        &self,
        key: &Key,
        statement: &Statement,
        values: Values<'_>,
        missing: fn(Key) -> StoreError,
    ) -> Result<i64, StoreError> {
        let fail = |e| self.failed(e);
        let mut conn = self.connection().await?;
        let mut lost = 0;
        loop {
            let mut tx = self.begin(&mut conn).await?;
            let now = now(&mut tx).await.map_err(fail)?;
            let values = Values { now, ..values };
            match bind(statement, &values).execute(&mut *tx).await {
                Ok(done) => {
                    tx.commit().await.map_err(fail)?;
                    if done.rows_affected() == 0 {
                        return Err(missing(key.clone()));
                    }
                    return Ok(now);
                }
                Err(e) if raced(&e) && lost < 16 => {
                    tx.rollback().await.map_err(fail)?;
                    lost += 1;
                }
                Err(e) => return Err(fail(e)),
            }
        }
    }

    /// A new token, in a transaction of its own on `conn` (committed even on a pool
    /// whose sessions run with `autocommit` off).
    async fn mint_committed(&self, conn: &mut MySqlConnection) -> Result<i64, StoreError> {
        let fail = |e| self.failed(e);
        let mut tx = self.begin(conn).await?;
        let token = self.mint(&mut tx).await?;
        tx.commit().await.map_err(fail)?;
        Ok(token)
    }

    /// A new token ([`MINT`](sql::MINT), then [`MINTED`](sql::MINTED)) on `conn`, in
    /// the transaction it is in: the mint locks only its own row.
    async fn mint(&self, conn: &mut MySqlConnection) -> Result<i64, StoreError> {
        let fail = |e| self.failed(e);
        let done = sqlx::query(sql::MINT.sql).execute(&mut *conn).await.map_err(fail)?;
        let token = i64::try_from(done.last_insert_id())
            .map_err(|_| StoreError::Backend("the token sequence passed i64::MAX".into()))?;
        let minted = Values { token, ..Values::default() };
        bind(&sql::MINTED, &minted).execute(&mut *conn).await.map_err(fail)?;
        Ok(token)
    }

    /// One attempt of a claim, in a transaction on `conn`: the answer, or `None` when a
    /// concurrent claim got between (claim again).
    async fn claim_once(
        &self,
        conn: &mut MySqlConnection,
        values: Values<'_>,
        asked: Fingerprint,
    ) -> Result<Option<StoreClaim>, StoreError> {
        let fail = |e| self.failed(e);
        let key = values.key;
        let mut tx = self.begin(conn).await?;
        let look = match bind(&sql::LOOK, &values).fetch_one(&mut *tx).await {
            Ok(look) => look,
            Err(e) if raced(&e) => {
                tx.rollback().await.map_err(fail)?;
                return Ok(None);
            }
            Err(e) => return Err(fail(e)),
        };
        let mut values = Values { now: column(&look, 0, key)?, ..values };
        let found = look_row(&look, key)?;
        let (write, took_over) =
            match mysql_claim::after_look(key, asked, values.token, found.as_ref())? {
                Next::Answer(answer) => {
                    tx.rollback().await.map_err(fail)?;
                    return Ok(Some(answer));
                }
                Next::TakeNew => (bind(&sql::TAKE_NEW, &values), false),
                Next::TurnUnknown { held, turned } => {
                    // A purge scanning the expiry index can hold the lapse's entry while it
                    // waits for this row: InnoDB picks this claim as the deadlock's victim.
                    // The turn is then undone; look again.
                    let held = Values { held: Some(held), ..values };
                    let done = match bind(&sql::TURN_UNKNOWN, &held).execute(&mut *tx).await {
                        Ok(done) => done,
                        Err(e) if raced(&e) => {
                            tx.rollback().await.map_err(fail)?;
                            return Ok(None);
                        }
                        Err(e) => return Err(fail(e)),
                    };
                    if done.rows_affected() == 0 {
                        tx.rollback().await.map_err(fail)?;
                        return Ok(None);
                    }
                    tx.commit().await.map_err(fail)?;
                    return Ok(Some(turned));
                }
                Next::TakeOver { held, mint, took_over } => {
                    if mint {
                        values.token = self.mint(&mut tx).await?;
                    }
                    (bind(&sql::TAKE_OVER, &Values { held: Some(held), ..values }), took_over)
                }
            };
        match write.execute(&mut *tx).await {
            Ok(done) if done.rows_affected() == 1 => {}
            Ok(_) => {
                tx.rollback().await.map_err(fail)?;
                return Ok(None);
            }
            Err(e) if raced(&e) => {
                // InnoDB rolled a deadlock back already; a duplicate key leaves the
                // transaction open. Either way, nothing of this attempt stays.
                tx.rollback().await.map_err(fail)?;
                return Ok(None);
            }
            Err(e) => return Err(fail(e)),
        }
        tx.commit().await.map_err(fail)?;
        Ok(Some(mysql_claim::acquired(values.token, values.now, values.duration, took_over)))
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
        let values = Values {
            key: key.as_bytes(),
            held: listed,
            duration: micros(ttl),
            lapse_ttl: lapse_ttl_micros(self.lapse),
            body: body.as_deref(),
            ..Values::default()
        };
        let now = self.settle(&key, &sql::RESOLVE, values, StoreError::NothingToSettle).await?;
        let until = now.saturating_add(values.duration);
        Ok(decode::replay(body, now, until))
    }

    /// UNKNOWN → absent of `key`, of the execution claimed under `listed` only if given.
    async fn forget_where(&self, key: Key, listed: Option<i64>) -> Result<(), StoreError> {
        let values = Values {
            key: key.as_bytes(),
            held: listed,
            lapse_ttl: lapse_ttl_micros(self.lapse),
            ..Values::default()
        };
        self.settle(&key, &sql::FORGET, values, StoreError::NothingToSettle).await.map(drop)
    }
}

/// [`LOOK`](sql::LOOK)'s record (the columns after `now`), or `None` for an absent key.
fn look_row(look: &MySqlRow, key: &[u8]) -> Result<Option<ClaimRow>, StoreError> {
    let state: Option<i16> = column(look, 1, key)?;
    let Some(state) = state else { return Ok(None) };
    Ok(Some(ClaimRow {
        state,
        token: column(look, 2, key)?,
        fingerprint: column(look, 3, key)?,
        body: column(look, 4, key)?,
        settled_at: column(look, 5, key)?,
        expires_at: column(look, 6, key)?,
        live: column(look, 7, key)?,
        lapsed: column(look, 8, key)?,
        took_over: false,
    }))
}

/// The least `innodb_lock_wait_timeout` (whole seconds) that covers `wait`, within
/// what the servers accept (1 to 1,073,741,824).
fn wait_seconds(wait: Duration) -> u64 {
    let seconds = wait.as_secs().saturating_add(u64::from(wait.subsec_nanos() > 0));
    seconds.clamp(1, 1 << 30)
}

/// `e` as [`StoreError::Backend`] holding the driver's error itself, as the statements
/// in a caller's transaction answer (so that its number can be read: a deadlock, 1213,
/// rolled that transaction back).
fn in_tx(e: sqlx::Error) -> StoreError {
    StoreError::Backend(Box::new(e))
}

/// What a claim in a caller's transaction asks for, and the token minted for it.
#[derive(Clone, Copy)]
struct Asked<'a> {
    key: &'a Key,
    fp: Fingerprint,
    lease: Duration,
    token: i64,
    correlation_id: Option<&'a str>,
}

/// A record the claim's own lock should have kept from changing did change: a server
/// that does not lock as InnoDB does.
fn moved_under_lock(key: &Key) -> StoreError {
    StoreError::Backend(format!("the record of {key:?} changed under the claim's row lock").into())
}

impl MySqlStore {
    /// The claim of `key` in a caller's transaction on `conn` (`MySqlStore::claim_in`
    /// documents the contract): a token minted in that transaction (the mint locks only
    /// its own row, [`sql::MINT`]); then, with its lock waits bounded by `wait` in whole
    /// seconds, at least 1 (MariaDB: each waiting statement's own `SET STATEMENT`;
    /// MySQL: the session's, restored after, whatever happened), the claim under the
    /// key's row lock ([`take_locked`](Self::take_locked)), an acquired record keeping
    /// `correlation_id`. Never commits, rolls back or retries: an error of a statement
    /// comes back as it is.
    pub(crate) async fn claim_in_conn(
        &self,
        conn: &mut MySqlConnection,
        key: &Key,
        fp: Fingerprint,
        lease: Duration,
        wait: Duration,
        correlation_id: Option<&str>,
    ) -> Result<StoreClaim, StoreError> {
        check_duration("lease", lease)?;
        let token = self.mint(conn).await?;
        let claim = Asked { key, fp, lease, token, correlation_id };
        let seconds = wait_seconds(wait);
        if self.is_mariadb(conn).await? {
            // The bound is each waiting statement's own: nothing to restore, so a claim
            // dropped mid-way leaves the session as it was.
            return self.take_locked(conn, claim, Some(seconds)).await;
        }
        let bound = sql::bound_claim_wait(seconds);
        sqlx::raw_sql(AssertSqlSafe(bound)).execute(&mut *conn).await.map_err(in_tx)?;
        let answer = self.take_locked(conn, claim, None).await;
        let restored = sqlx::raw_sql(sql::RESTORE_CLAIM_WAIT).execute(&mut *conn).await;
        let answer = answer?;
        restored.map_err(in_tx)?;
        Ok(answer)
    }

    /// Whether the server is MariaDB, asked on `conn` the first time (a read that
    /// takes no lock, harmless in the caller's transaction) by a comment only MariaDB
    /// executes, not by `VERSION()`, which an operator can set to anything.
    async fn is_mariadb(&self, conn: &mut MySqlConnection) -> Result<bool, StoreError> {
        if let Some(&known) = self.mariadb.get() {
            return Ok(known);
        }
        let executed: i64 = sqlx::query_scalar("SELECT CAST(0 /*M! + 1 */ AS SIGNED)")
            .fetch_one(&mut *conn)
            .await
            .map_err(in_tx)?;
        Ok(*self.mariadb.get_or_init(|| executed == 1))
    }

    /// The claim of `key` under its row lock, in the caller's transaction on `conn`:
    /// [`TAKE_NEW_OR_LOCK`](sql::TAKE_NEW_OR_LOCK) with `token`, then
    /// [`LOOK`](sql::LOOK). With `bound` (MariaDB), each statement that can wait on a
    /// lock waits at most that many seconds ([`sql::waiting_at_most`]). The row holds
    /// `token` only if that insert wrote it; otherwise the row decides as the store's
    /// claim decides, and a dead record is taken over under a token above its own.
    async fn take_locked(
        &self,
        conn: &mut MySqlConnection,
        claim: Asked<'_>,
        bound: Option<u64>,
    ) -> Result<StoreClaim, StoreError> {
        let Asked { key: stored, fp: asked, lease, token, correlation_id } = claim;
        let key = stored.as_bytes();
        let fingerprint = asked.to_bytes();
        let values = Values {
            key,
            fingerprint: &fingerprint,
            token,
            duration: micros(lease),
            lapse_ttl: lapse_ttl_micros(self.lapse),
            correlation_id,
            ..Values::default()
        };
        let waiting = |statement: &Statement, values| match bound {
            Some(seconds) => {
                let text = sql::waiting_at_most(seconds, statement);
                bind_to(sqlx::query(AssertSqlSafe(text)), statement.params, values)
            }
            None => bind(statement, values),
        };
        waiting(&sql::TAKE_NEW_OR_LOCK, &values).execute(&mut *conn).await.map_err(in_tx)?;
        let look = bind(&sql::LOOK, &values).fetch_one(&mut *conn).await.map_err(in_tx)?;
        let now: i64 = column(&look, 0, key)?;
        let row = look_row(&look, key)?.ok_or_else(|| moved_under_lock(stored))?;
        match mysql_claim::after_look(key, asked, token, Some(&row))? {
            Next::Answer(answer) => Ok(answer),
            // The row is locked by this transaction's insert-or-lock: it cannot be absent.
            Next::TakeNew => Err(moved_under_lock(stored)),
            Next::TurnUnknown { held, turned } => {
                let held = Values { now, held: Some(held), ..values };
                let done = waiting(&sql::TURN_UNKNOWN, &held).execute(&mut *conn).await;
                if done.map_err(in_tx)?.rows_affected() != 1 {
                    return Err(moved_under_lock(stored));
                }
                Ok(turned)
            }
            Next::TakeOver { held, mint, took_over } => {
                let token = if mint { self.mint(conn).await? } else { token };
                let take = Values { now, token, held: Some(held), ..values };
                let done = waiting(&sql::TAKE_OVER, &take).execute(&mut *conn).await;
                if done.map_err(in_tx)?.rows_affected() != 1 {
                    return Err(moved_under_lock(stored));
                }
                Ok(mysql_claim::acquired(token, now, take.duration, took_over))
            }
        }
    }
}

/// A record read's row: the record columns from `at` on (after `now` in `RECORD` and
/// `LOOK_RECORD`, first in `RECORDS`), as stored.
fn stored_row(row: &MySqlRow, at: usize) -> Result<StoredRecord, StoreError> {
    let key: Vec<u8> = column(row, at, &[])?;
    let state: i16 = column(row, at + 2, &key)?;
    Ok(StoredRecord {
        fingerprint: Some(column(row, at + 1, &key)?),
        state: state.into(),
        token: column(row, at + 3, &key)?,
        body: column(row, at + 4, &key)?,
        started_at: Some(column(row, at + 5, &key)?),
        settled_at: column(row, at + 6, &key)?,
        expires_at: column(row, at + 7, &key)?,
        correlation_id: column(row, at + 8, &key)?,
        key,
    })
}

impl Store for MySqlStore {
    /// Creates the token counter (and its row) and the records table of
    /// [`idemcache_sql::records::mysql::SCHEMA`] if missing.
    async fn ensure_schema(&self) -> Result<(), StoreError> {
        let fail = |e| self.failed(e);
        let mut conn = self.connection().await?;
        let mut tx = conn.begin().await.map_err(fail)?;
        for ddl in sql::SCHEMA {
            sqlx::raw_sql(*ddl).execute(&mut *tx).await.map_err(fail)?;
        }
        let current: i64 =
            sqlx::query_scalar(sql::IS_CURRENT.sql).fetch_one(&mut *tx).await.map_err(fail)?;
        tx.commit().await.map_err(fail)?;
        // A table an earlier release made: the columns added since (DDL commits on its
        // own; another process adding them first is as good).
        if current == 0 {
            for ddl in sql::UPGRADE {
                match sqlx::raw_sql(*ddl).execute(&mut *conn).await {
                    Ok(_) => {}
                    Err(e) if number(&e) == Some(sql::DUPLICATE_COLUMN) => {}
                    Err(e) => return Err(fail(e)),
                }
            }
        }
        Ok(())
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
            check_duration("lease", lease)?;
            let fingerprint = fp.to_bytes();
            let mut conn = self.connection().await?;
            let values = Values {
                key: &key,
                fingerprint: &fingerprint,
                token: self.mint_committed(&mut conn).await?,
                duration: micros(lease),
                lapse_ttl: lapse_ttl_micros(self.lapse),
                correlation_id: correlation_id.as_deref(),
                ..Values::default()
            };
            for _ in 0..16 {
                if let Some(answer) = self.claim_once(&mut conn, values, fp).await? {
                    return Ok(answer);
                }
            }
            Err(StoreError::Backend("the claim kept racing a concurrent writer".into()))
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
            let values = Values {
                key: key.as_bytes(),
                token: decode::token(token),
                duration: micros(ttl),
                body: body.as_deref(),
                ..Values::default()
            };
            let now = self.settle(&key, &sql::COMPLETE, values, StoreError::LeaseLost).await?;
            let until = now.saturating_add(values.duration);
            Ok(decode::replay(body, now, until))
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
            let values = Values {
                key: key.as_bytes(),
                token: decode::token(token),
                duration: micros(lease),
                ..Values::default()
            };
            let now = self.settle(&key, &sql::EXTEND, values, StoreError::LeaseLost).await?;
            Ok(from_micros(now.saturating_add(values.duration)))
        }
    }

    fn release(
        &self,
        key: &Key,
        token: FencingToken,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let key = key.clone();
        async move {
            let values =
                Values { key: key.as_bytes(), token: decode::token(token), ..Values::default() };
            self.settle(&key, &sql::RELEASE, values, StoreError::LeaseLost).await.map(drop)
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
            let values = Values {
                key: key.as_bytes(),
                token: decode::token(token),
                duration: micros(ttl),
                ..Values::default()
            };
            self.settle(&key, &sql::MARK_UNKNOWN, values, StoreError::LeaseLost).await.map(drop)
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
        let fail = |e| self.failed(e);
        let mut conn = self.connection().await?;
        let mut tx = self.begin(&mut conn).await?;
        let values = Values {
            now: now(&mut tx).await.map_err(fail)?,
            lapse_ttl: lapse_ttl_micros(self.lapse),
            limit: decode::limit(limit),
            ..Values::default()
        };
        let rows = bind(&sql::UNKNOWN, &values).fetch_all(&mut *tx).await.map_err(fail)?;
        tx.commit().await.map_err(fail)?;
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
        let fail = |e| self.failed(e);
        let mut conn = self.connection().await?;
        let mut tx = self.begin(&mut conn).await?;
        let values = Values {
            now: now(&mut tx).await.map_err(fail)?,
            lapse_ttl: lapse_ttl_micros(self.lapse),
            limit: decode::limit(limit),
            ..Values::default()
        };
        let done = bind(&sql::PURGE, &values).execute(&mut *tx).await.map_err(fail)?;
        tx.commit().await.map_err(fail)?;
        Ok(usize::try_from(done.rows_affected()).unwrap_or(usize::MAX))
    }

    async fn record(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        let values = Values { key: key.as_bytes(), ..Values::default() };
        // In a transaction of its own, as every operation: a session with autocommit off
        // would otherwise keep the read's transaction (and its metadata lock) open.
        let fail = |e| self.failed(e);
        let mut conn = self.connection().await?;
        let mut tx = self.begin(&mut conn).await?;
        let row = bind(&sql::RECORD, &values).fetch_optional(&mut *tx).await.map_err(fail)?;
        tx.commit().await.map_err(fail)?;
        match row {
            Some(row) => {
                let stored = stored_row(&row, 1)?;
                judge(stored, column(&row, 0, key.as_bytes())?, lapse_ttl_micros(self.lapse))
            }
            None => Ok(None),
        }
    }

    /// Pages of [`RECORDS`](idemcache_sql::records::mysql::RECORDS) (its docs say what
    /// each reads), each after a read of the server's now, until `limit` records are
    /// found or the range ends.
    async fn records(
        &self,
        filter: &RecordFilter,
        after: Option<&Key>,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        let fail = |e| self.failed(e);
        let mut listing = Listing::new(filter, after, limit, lapse_ttl_micros(self.lapse));
        let mut conn = self.connection().await?;
        while !listing.done() {
            // Each page in a transaction of its own, as every operation (see `record`).
            let mut tx = self.begin(&mut conn).await?;
            let now = now(&mut tx).await.map_err(fail)?;
            let values = Values {
                now,
                lapse_ttl: listing.lapse_ttl(),
                limit: listing.page(),
                from: listing.from(),
                below: listing.below(),
                suffix: listing.suffix(),
                mask: listing.mask().into(),
                ..Values::default()
            };
            let rows = bind(&sql::RECORDS, &values).fetch_all(&mut *tx).await.map_err(fail)?;
            tx.commit().await.map_err(fail)?;
            let rows =
                rows.iter().map(|r| Ok((now, stored_row(r, 0)?))).collect::<Result<Vec<_>, _>>()?;
            listing.take(rows)?;
        }
        Ok(listing.into_records())
    }

    /// One READ COMMITTED transaction: the record read with its row locked
    /// ([`LOOK_RECORD`](idemcache_sql::records::mysql::LOOK_RECORD)), judged, and deleted
    /// if it is in one of `states`.
    async fn remove_record(
        &self,
        key: &Key,
        states: &[RecordState],
    ) -> Result<Option<Record>, StoreError> {
        let fail = |e| self.failed(e);
        let mut conn = self.connection().await?;
        let mut tx = self.begin(&mut conn).await?;
        let values = Values { key: key.as_bytes(), ..Values::default() };
        let row = bind(&sql::LOOK_RECORD, &values).fetch_optional(&mut *tx).await.map_err(fail)?;
        let record = match row {
            Some(row) => {
                let stored = stored_row(&row, 1)?;
                judge(stored, column(&row, 0, key.as_bytes())?, lapse_ttl_micros(self.lapse))?
            }
            None => None,
        };
        let Some(record) = record.filter(|r| states.contains(&r.state)) else {
            tx.rollback().await.map_err(fail)?;
            return Ok(None);
        };
        bind(&sql::DELETE_RECORD, &values).execute(&mut *tx).await.map_err(fail)?;
        tx.commit().await.map_err(fail)?;
        Ok(Some(record))
    }
}
