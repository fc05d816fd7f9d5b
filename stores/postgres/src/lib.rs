//! [`PostgresStore`]: idemcache's durable records in PostgreSQL, through a pool of
//! tokio-postgres connections (deadpool); and [`is_unique_violation`], tokio-postgres's
//! classifier for your own tables.
//!
//! This crate tracks tokio-postgres's and deadpool-postgres's current releases and
//! re-exports them ([`tokio_postgres`], [`deadpool_postgres`]), so that the pool you
//! already have can be the store's ([`PostgresStore::from_pool`]).
//!
//! Invariant: every operation is one statement, judged by the server's clock
//! (`clock_timestamp()`, read once per statement). A claim is one
//! `INSERT ... ON CONFLICT DO UPDATE ... WHERE <the holder is dead>` that also reads the
//! live holder in the same statement, so a claim is one round trip and a claim plus its
//! completion two; every later write names its token in its `WHERE`, so a stale owner's
//! write matches no row. Tokens come from a sequence: they increase across processes and
//! restarts.
//!
//! Lapses ([`PostgresStore::lapse_policy`]): under `LapsePolicy::MarkUnknown` the claim
//! statement never takes over a PROCESSING record whose lease lapsed less than the
//! unknown TTL ago; it returns it, flagged, and a second statement fenced by its token
//! turns it UNKNOWN (`settled_at` = the lease's end, `expires_at` = that plus the TTL),
//! so the lapse path is two round trips and every other claim one. Until a claim turns
//! it, the other statements read such a record as UNKNOWN too (`list_unknown` lists it,
//! `resolve` and `forget` settle it, `purge_expired` keeps it).
//!
//! # One pool for the store and your handlers
//!
//! A service whose orders live in the store's database needs one pool, not two: take
//! your handlers' connections from the store's ([`PostgresStore::pool`]), or build the
//! store over yours ([`PostgresStore::from_pool`]). Either way the records and the
//! orders share the connections, and a handler can complete its claim in its own
//! transaction ([`complete_in`]):
//!
//! ```no_run
//! use idemcache::purge::{self, Round, Schedule};
//! use idemcache::store::Store;
//! use idemcache_postgres::{deadpool_postgres, PostgresStore};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = PostgresStore::connect("postgres://app@db.internal/shop").await?;
//! store.ensure_schema().await?;
//! let pool: deadpool_postgres::Pool = store.pool().clone(); // the same pool, shared
//!
//! // In a handler (the pool lives in your application's state):
//! let mut client = pool.get().await?;
//! let tx = client.transaction().await?;
//! tx.execute("INSERT INTO orders (item) VALUES ($1)", &[&"book"]).await?;
//! // idemcache_postgres::complete_in(&tx, held.claim(), Some(&record)).await?;
//! tx.commit().await?;
//!
//! // Or your own pool (TLS, hooks, sizes of your choosing), and the store over it:
//! let store = PostgresStore::from_pool(pool.clone());
//!
//! // Expired records purged every minute, in paced batches, for as long as it runs.
//! let every_minute = Schedule::every(std::time::Duration::from_secs(60))?;
//! tokio::spawn(purge::records_loop(store.clone(), every_minute, tokio::time::sleep, |round| {
//!     if let Round::Failed { error, .. } = round {
//!         eprintln!("purging idempotency records failed: {error}"); // the loop goes on
//!     }
//! }));
//! # Ok(())
//! # }
//! ```
//!
//! Size the pool for both: the handlers' transactions and the store's calls (a claim, a
//! lease renewal every third of the lease, a completion) draw from the same connections.
//! A pool built by [`connect`](PostgresStore::connect) waits 5 s for a free connection,
//! then the store's call fails as [`StoreError::Backend`] (a 503 for a new request; a
//! renewal tries again at its next beat); a pool of your own waits as you configured it
//! (deadpool's default is for ever: set `wait_timeout`).
//!
//! # At volume
//!
//! Measured with `benches/pg_volume.rs` (BENCHMARKS.md, "PostgreSQL at volume"; 10 million
//! records, 90% expired, on a stock PostgreSQL 15 with 2 cores shared with the load):
//!
//! - **Purge in paced batches.** A batch of [`purge_expired`](Store::purge_expired) costs
//!   its rows, not the table (a TID scan; the statement's note in the source says what
//!   it replaced: 15 s a batch). Flat out, one purger deletes ~90,000 rows/s and raises the claims'
//!   p99 ~9x, from the CPU and WAL it takes (a checkpoint every ~25 s); batches of 1000
//!   with a 50 ms pause delete ~17,000 rows/s (a 9-million-row backlog in 9 minutes, 1.4
//!   billion rows a day) with the claims' p99 at about 2x. A steady state needs only the
//!   claim rate purged. So: call it in a loop with a pause, again at once only while it
//!   returns a full batch, from one process or several (`SKIP LOCKED`: they never wait
//!   on each other's batch). `idemcache::purge::records_loop` is that loop, with these
//!   batches and pauses by default (the example above spawns it).
//! - **Vacuum.** Every record leaves two dead row versions (the claim's, updated by the
//!   completion, and the completed one the purge deletes), so the table needs vacuum as
//!   much as it needs the purge. Autovacuum's defaults keep it bounded (measured:
//!   BENCHMARKS.md); with autovacuum off the table and its indexes grow without bound,
//!   and so does every purge batch's walk of the expiry index past dead entries. On a big
//!   table, vacuum it more often than the default 20% of its rows (advice, not measured
//!   here): `ALTER TABLE idemcache_records SET (autovacuum_vacuum_scale_factor = 0.02)`. A purge
//!   backlog writes a full-page image of every page it first touches after a checkpoint:
//!   `max_wal_size` above the default 1 GB and `wal_compression` cut that.
//! - **Hash partitioning by key** is how the table grows past one table's comfort: create
//!   `idemcache_records` yourself before [`ensure_schema`](Store::ensure_schema) (which
//!   skips a schema whose expiry index exists), `PARTITION BY HASH (key)` with the same
//!   columns, the primary key on `key` and the expiry index on every partition. The key is
//!   the partition key, so each partition's primary key is the whole table's uniqueness,
//!   and the claim's `ON CONFLICT (key)` works as on one table. Vacuum works per
//!   partition, in parallel workers and on smaller heaps. Purging through the parent
//!   keeps its bound (tested: a batch is at most its limit over four partitions), and
//!   several purgers over the parent share the work (`SKIP LOCKED`). Create the sequence
//!   `idemcache_tokens` too: the skipped schema includes it.
//! - **Time partitioning cannot hold these records.** A unique constraint on a
//!   partitioned table must include the partition key; partitioned by time, the same key
//!   could live in two partitions (a record claimed again after its first one expired),
//!   there is no uniqueness on `key` alone, and the claim's `ON CONFLICT (key)` has no
//!   unique index to arbitrate on: two claims of one key would both insert. Dropping a
//!   day's partition, the attraction of time partitioning, is replaced by the purge and
//!   vacuum above.

#![cfg_attr(docsrs, feature(doc_cfg))]

use std::future::Future;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::types::ToSql;
use tokio_postgres::NoTls;

use idemcache::store::encoding::{
    at_server, check_duration, check_url, corrupt, fingerprint, from_micros, key, micros,
};
use idemcache::store::encoding::{check_lapse_policy, lapse_ttl_micros};
use idemcache::store::{Store, StoreClaim, StoreError};
use idemcache::{FencingToken, Fingerprint, Key, LapsePolicy, Replay, UnknownEntry};

pub use {deadpool_postgres, tokio_postgres};

pub mod inbox;
#[cfg(test)]
mod purge_tests;
pub mod transition;

/// The schema [`ensure_schema`](Store::ensure_schema) creates (idempotent, and safe to run from
/// several processes at once: it holds an advisory lock). Columns as in SQLite's:
/// `state` 1 PROCESSING, 2 COMPLETED, 3 UNKNOWN; `expires_at` the lease's end while
/// PROCESSING, the TTL's after; times in microseconds since the epoch (server clock).
pub const POSTGRES_SCHEMA: &str = "
CREATE SEQUENCE IF NOT EXISTS idemcache_tokens;
CREATE TABLE IF NOT EXISTS idemcache_records (
    key         BYTEA PRIMARY KEY,
    fingerprint BYTEA NOT NULL,
    state       SMALLINT NOT NULL CHECK (state IN (1, 2, 3)),
    token       BIGINT NOT NULL,
    body        BYTEA,
    started_at  BIGINT NOT NULL,
    settled_at  BIGINT,
    expires_at  BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS idemcache_records_expiry ON idemcache_records (expires_at);
";

/// `ddl` run once per database, as one statement: skipped when `last` (the object `ddl`
/// creates last) exists, else run under the advisory lock `lock`, so processes starting
/// together do not collide (concurrent `CREATE ... IF NOT EXISTS` can). The check comes
/// first because `CREATE INDEX IF NOT EXISTS` takes its table's lock before it finds the
/// index there: it would wait for every open transaction that wrote to the table (a
/// handler's, holding a record it completes in its own transaction), and every later
/// writer would queue behind it, so a restarting instance would stall the others.
pub(crate) fn schema_once(lock: i64, last: &str, ddl: &str) -> String {
    format!(
        "DO $idemcache$ BEGIN
           IF to_regclass('{last}') IS NULL THEN
             PERFORM pg_advisory_xact_lock({lock});
             {ddl}
           END IF;
         END $idemcache$;"
    )
}

/// "Now" on the server's clock, in microseconds, as a one-row CTE named `now`: a macro,
/// so every statement is one `concat!`ed constant.
macro_rules! now {
    () => {
        "now AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS us)"
    };
}

/// PROCESSING → COMPLETED of `$1` under the token `$2`, the body `$3` kept for `$4` µs,
/// while the lease is live; returns `settled_at, expires_at`. The store's `complete` and
/// [`complete_in`] (the same write in the caller's transaction) share it. The server's
/// `clock_timestamp()`, not `now()`: inside a caller's transaction `now()` is when the
/// transaction began, and a lease that lapsed since would still look live.
const COMPLETE: &str = concat!(
    "WITH ",
    now!(),
    " UPDATE idemcache_records r
     SET state = 2, body = $3, settled_at = now.us, expires_at = now.us + $4 FROM now
     WHERE r.key = $1 AND r.token = $2 AND r.state = 1 AND r.expires_at > now.us
     RETURNING r.settled_at, r.expires_at"
);

mod in_transaction;
pub use in_transaction::complete_in;
/// Record `r` "lapsed less than `$N` µs ago" (against the `now` CTE): PROCESSING, past
/// its lease, within the unknown TTL of `LapsePolicy::MarkUnknown` (never true when the
/// TTL is 0, `TakeOver`). Such a record is UNKNOWN to every statement of a
/// `MarkUnknown` handle.
macro_rules! lapsed_within {
    ($ttl:literal) => {
        concat!("(r.state = 1 AND r.expires_at <= now.us AND r.expires_at + ", $ttl, " > now.us)")
    };
}

/// A live UNKNOWN record, or one a lapse made so (see [`lapsed_within`]).
macro_rules! unknown_or_lapsed {
    ($ttl:literal) => {
        concat!("((r.state = 3 AND r.expires_at > now.us) OR ", lapsed_within!($ttl), ")")
    };
}

/// Idempotency records in PostgreSQL. See the module docs for the guarantees.
/// Cheap to clone (the pool is shared).
#[derive(Clone)]
pub struct PostgresStore {
    pool: Pool,
    /// The server, as connection errors name it (`host:port/db`), when the store built
    /// the pool from a URL.
    server: Option<String>,
    /// What a lapsed lease becomes, for this handle's statements.
    lapse: LapsePolicy,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("server", &self.server)
            .field("pool", &self.pool.status())
            .finish()
    }
}

/// Whether a tokio-postgres error is a unique violation (SQLSTATE 23505): for your own
/// business tables, whose `UNIQUE` constraint is the backstop behind the cache (see
/// [`idemcache::store::unique`]). Other constraint failures are real errors.
pub fn is_unique_violation(error: &tokio_postgres::Error) -> bool {
    error.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION)
}

/// `host:port/db` of `config`, as a connection error names the server.
fn server_of(config: &tokio_postgres::Config) -> String {
    use tokio_postgres::config::Host;
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(host)) => host.clone(),
        #[cfg(unix)]
        Some(Host::Unix(path)) => path.display().to_string(),
        None => "localhost".to_owned(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    format!("{host}:{port}/{}", config.get_dbname().unwrap_or(""))
}

fn backend(e: impl std::error::Error + Send + Sync + 'static) -> StoreError {
    StoreError::Backend(Box::new(e))
}

/// Column `i` of `row` as a `T`; a value of another type, or NULL where a value
/// belongs, is [`StoreError::Corrupt`] naming the record's key, never a panic.
fn column<'a, T: tokio_postgres::types::FromSql<'a>>(
    row: &'a tokio_postgres::Row,
    i: usize,
    key: &[u8],
) -> Result<T, StoreError> {
    row.try_get(i).map_err(|e| {
        let name = row.columns().get(i).map_or("?", |c| c.name());
        corrupt(key, format_args!("column {name}: {e}"))
    })
}

/// A count as a `LIMIT` takes it (a `bigint`; past `i64::MAX`, no limit).
fn sql_limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl PostgresStore {
    /// The pool size [`connect`](Self::connect) builds: a store's operations are one short
    /// statement each, so a few connections serve many requests.
    pub const MAX_CONNECTIONS: usize = 16;

    /// A store over a pool of up to [`MAX_CONNECTIONS`](Self::MAX_CONNECTIONS) connections
    /// to `url` (`postgres://user@host:port/db`, no TLS). Connects lazily: an unreachable
    /// server shows as [`StoreError::Backend`], naming its host and port, from the first
    /// operation. The schema is not created: call [`ensure_schema`](Store::ensure_schema).
    ///
    /// Another size: `store.pool().resize(n)`. TLS, hooks or timeouts of your own: build
    /// the pool yourself and [`from_pool`](Self::from_pool) it.
    pub async fn connect(url: &str) -> Result<PostgresStore, StoreError> {
        check_url(url)?;
        let config: tokio_postgres::Config = url.parse().map_err(|e| {
            StoreError::InvalidInput(format!("not a PostgreSQL connection string: {e}"))
        })?;
        let server = server_of(&config);
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig { recycling_method: RecyclingMethod::Fast },
        );
        let pool = Pool::builder(manager)
            .max_size(Self::MAX_CONNECTIONS)
            .runtime(Runtime::Tokio1)
            .create_timeout(Some(Duration::from_secs(5)))
            .wait_timeout(Some(Duration::from_secs(5)))
            .build()
            .map_err(backend)?;
        Ok(PostgresStore { pool, server: Some(server), lapse: LapsePolicy::TakeOver })
    }

    /// A store over your own pool (with the TLS and sizes you chose). The store cannot
    /// read where the pool connects, so its errors are the driver's own, not named by the
    /// server as [`connect`](Self::connect)'s are.
    pub fn from_pool(pool: Pool) -> PostgresStore {
        PostgresStore { pool, server: None, lapse: LapsePolicy::TakeOver }
    }

    /// The pool the store takes its connections from: clone it (a cheap handle on the
    /// same pool) for your handlers' own queries and transactions, so the records and
    /// your tables share one set of connections (see the crate docs, "One pool for the
    /// store and your handlers").
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// What a lapsed lease becomes for this handle's claims, listings and purges:
    /// taken over ([`LapsePolicy::TakeOver`], the default), or UNKNOWN from the lease's
    /// end for the policy's `ttl` ([`LapsePolicy::MarkUnknown`]; see the crate docs and
    /// [`LapsePolicy`] for what every store does, and why handles sharing a database should
    /// agree). Clones made after share the setting; the records do not keep it. A
    /// `ttl` of zero or over [`MAX_DURATION`](idemcache::MAX_DURATION) under
    /// `MarkUnknown` is [`StoreError::InvalidInput`].
    pub fn with_lapse_policy(mut self, policy: LapsePolicy) -> Result<PostgresStore, StoreError> {
        self.lapse = check_lapse_policy(policy)?;
        Ok(self)
    }

    /// This handle's lapse policy.
    pub fn lapse_policy(&self) -> LapsePolicy {
        self.lapse
    }

    /// A connection from the pool; failing, an error naming the server.
    async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        self.pool.get().await.map_err(|e| self.failed(e))
    }

    /// `e` as [`StoreError::Backend`], naming the server when the store knows it.
    fn failed(&self, e: impl std::error::Error + Send + Sync + 'static) -> StoreError {
        match &self.server {
            Some(server) => at_server(format!("PostgreSQL at {server}"), e),
            None => backend(e),
        }
    }

    /// Runs one statement (prepared once per connection) and returns its rows.
    async fn rows(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, StoreError> {
        let client = self.client().await?;
        let statement = client.prepare_cached(sql).await.map_err(|e| self.failed(e))?;
        client.query(&statement, params).await.map_err(|e| self.failed(e))
    }

    /// A settling write on `key` (the statement's `$1`) returning `settled_at,
    /// expires_at` of the one row it changed; no row is `missing` of `key`.
    async fn settle(
        &self,
        key: &Key,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
        missing: fn(Key) -> StoreError,
    ) -> Result<(i64, i64), StoreError> {
        let rows = self.rows(sql, params).await?;
        let row = rows.first().ok_or_else(|| missing(key.clone()))?;
        Ok((column(row, 0, key.as_bytes())?, column(row, 1, key.as_bytes())?))
    }
}

/// The claim: take the key if absent or dead, else read its live holder; one statement.
const CLAIM: &str = concat!(
    "WITH ",
    now!(),
    ",
         taken AS (
             INSERT INTO idemcache_records AS r
                 (key, fingerprint, state, token, body, started_at, settled_at, expires_at)
             SELECT $1, $2, 1, nextval('idemcache_tokens'), NULL, now.us, NULL, now.us + $3 FROM now
             ON CONFLICT (key) DO UPDATE SET
                 fingerprint = EXCLUDED.fingerprint, state = 1, token = EXCLUDED.token,
                 body = NULL, started_at = EXCLUDED.started_at, settled_at = NULL,
                 expires_at = EXCLUDED.expires_at
             WHERE r.expires_at <= EXCLUDED.started_at
               AND NOT (r.state = 1 AND r.expires_at + $4 > EXCLUDED.started_at)
             RETURNING token, expires_at
         )
         SELECT 0::smallint, token, NULL::bytea, NULL::bytea, NULL::bigint, expires_at, true, false
         FROM taken
         UNION ALL
         SELECT r.state, r.token, r.fingerprint, r.body, r.settled_at, r.expires_at,
                r.expires_at > now.us, ",
    lapsed_within!("$4"),
    "
         FROM idemcache_records r, now
         WHERE r.key = $1 AND NOT EXISTS (SELECT 1 FROM taken)"
);

/// One bounded batch of `purge_expired`: at most `$1` expired records (`$2` the unknown
/// TTL of `LapsePolicy::MarkUnknown`: a lapse it reads as UNKNOWN stays), one count back.
///
/// The batch is picked through the expiry index (`LIMIT $1`, `SKIP LOCKED`: two purgers
/// never wait on each other's batch, and a claim's row being written is skipped) and
/// deleted by row address (`ctid = ANY(ARRAY(...))`, a TID scan), so its cost is the
/// batch's rows whatever the table holds. It used to join the batch back on `key`; in
/// the generic plan a prepared statement gets after five runs, the planner does not
/// know the limit and hashed every expired row for that join: 15 s for a batch of 1000
/// over 9 million expired rows, against 3 ms now (BENCHMARKS.md, "PostgreSQL at
/// volume"). A row address is a partition's own, so the address is matched with its
/// table (`tableoid`, a semi-join against the picked batch only): on a table you
/// partitioned by key, one batch is still at most `$1`. The `DELETE` checks expiry again
/// on the version it deletes, so a record a claim took over since it was picked is kept.
const PURGE: &str = concat!(
    "WITH ",
    now!(),
    ",
         picked AS (
             SELECT r.tableoid AS rel, r.ctid AS addr FROM idemcache_records r, now
             WHERE r.expires_at <= now.us AND NOT ",
    lapsed_within!("$2"),
    "
             LIMIT $1 FOR UPDATE OF r SKIP LOCKED
         ),
         gone AS (
             DELETE FROM idemcache_records r USING now
             WHERE r.ctid = ANY(ARRAY(SELECT addr FROM picked))
               AND EXISTS (SELECT 1 FROM picked p WHERE p.rel = r.tableoid AND p.addr = r.ctid)
               AND r.expires_at <= now.us AND NOT ",
    lapsed_within!("$2"),
    "
             RETURNING 1
         )
     SELECT count(*) FROM gone"
);

/// `LapsePolicy::MarkUnknown`: the lapsed lease of `$2` turns UNKNOWN, marked at its
/// end; no row if the record moved on since the claim read it.
const TURN_UNKNOWN: &str = concat!(
    "WITH ",
    now!(),
    " UPDATE idemcache_records r
     SET state = 3, settled_at = r.expires_at, expires_at = r.expires_at + $3 FROM now
     WHERE r.key = $1 AND r.token = $2 AND ",
    lapsed_within!("$3"),
    " RETURNING r.fingerprint, r.settled_at"
);

/// The UNKNOWN record a listing saw, by the token its execution was claimed under
/// (from `idemcache_tokens`, never handed out twice): a settling write "of it" matches
/// only that execution's row, never a later one's, whatever their fingerprints and mark
/// times.
struct Listed {
    token: i64,
}

impl Listed {
    fn of(entry: &UnknownEntry<SystemTime>) -> Listed {
        // The inverse of the listing's `as u64`: the row's own value, bit for bit.
        Listed { token: entry.token.get() as i64 }
    }
}

/// "Record `r` is the listed one", binding `$token` (the listed token, or NULL: any
/// record).
macro_rules! listed {
    ($token:literal) => {
        concat!("(", $token, "::bigint IS NULL OR r.token = ", $token, "::bigint)")
    };
}

impl PostgresStore {
    /// UNKNOWN → COMPLETED of `key`, of the `listed` record only if given.
    async fn resolve_where(
        &self,
        key: Key,
        listed: Option<Listed>,
        body: Option<Bytes>,
        ttl: Duration,
    ) -> Result<Replay<SystemTime>, StoreError> {
        check_duration("result TTL", ttl)?;
        let sql = concat!(
            "WITH ",
            now!(),
            " UPDATE idemcache_records r
             SET state = 2, body = $2, settled_at = now.us, expires_at = now.us + $3 FROM now
             WHERE r.key = $1 AND ",
            unknown_or_lapsed!("$4"),
            " AND ",
            listed!("$5"),
            " RETURNING r.settled_at, r.expires_at"
        );
        let stored = body.as_deref();
        let lapse_ttl = lapse_ttl_micros(self.lapse);
        let token = listed.map(|l| l.token);
        let params: [&(dyn ToSql + Sync); 5] =
            [&key.as_bytes(), &stored, &micros(ttl), &lapse_ttl, &token];
        let (at, until) = self.settle(&key, sql, &params, StoreError::NotUnknown).await?;
        Ok(Replay::new(body, from_micros(at), from_micros(until)))
    }

    /// UNKNOWN → absent of `key`, of the `listed` record only if given.
    async fn forget_where(&self, key: Key, listed: Option<Listed>) -> Result<(), StoreError> {
        let sql = concat!(
            "WITH ",
            now!(),
            " DELETE FROM idemcache_records r USING now
             WHERE r.key = $1 AND ",
            unknown_or_lapsed!("$2"),
            " AND ",
            listed!("$3"),
            " RETURNING r.started_at, r.expires_at"
        );
        let lapse_ttl = lapse_ttl_micros(self.lapse);
        let token = listed.map(|l| l.token);
        let params: [&(dyn ToSql + Sync); 3] = [&key.as_bytes(), &lapse_ttl, &token];
        self.settle(&key, sql, &params, StoreError::NotUnknown).await.map(drop)
    }
}

impl Store for PostgresStore {
    /// Creates the sequence, table and index of [`POSTGRES_SCHEMA`] if missing.
    async fn ensure_schema(&self) -> Result<(), StoreError> {
        let client = self.client().await?;
        let ensure = schema_once(7_315_993_121, "idemcache_records_expiry", POSTGRES_SCHEMA);
        client.batch_execute(&ensure).await.map_err(|e| self.failed(e))
    }

    fn claim(
        &self,
        key: &Key,
        fp_in: Fingerprint,
        lease: Duration,
    ) -> impl Future<Output = Result<StoreClaim, StoreError>> + Send {
        let key = key.as_bytes().to_vec();
        async move {
            check_duration("lease", lease)?;
            let fp = fp_in.to_bytes().to_vec();
            let sql = CLAIM;
            let lapse_ttl = lapse_ttl_micros(self.lapse);
            // A holder committed after this statement's snapshot was taken blocks the
            // insert but is not yet visible to the read: no row. Look again.
            for _ in 0..16 {
                let rows = self.rows(sql, &[&key, &fp, &micros(lease), &lapse_ttl]).await?;
                let Some(row) = rows.first() else { continue };
                let state: i16 = column(row, 0, &key)?;
                let expires_at: i64 = column(row, 5, &key)?;
                let live: bool = column(row, 6, &key)?;
                if state == 0 {
                    let token: i64 = column(row, 1, &key)?;
                    return Ok(StoreClaim::Acquired {
                        token: FencingToken::new(token as u64),
                        lease_ends_at: from_micros(expires_at),
                    });
                }
                if column::<bool>(row, 7, &key)? {
                    let token: i64 = column(row, 1, &key)?;
                    let turned = self.rows(TURN_UNKNOWN, &[&key, &token, &lapse_ttl]).await?;
                    // None: the record moved on since (settled, turned by another
                    // claim's statement): look again.
                    let Some(turned) = turned.first() else { continue };
                    let stored_fp: Vec<u8> = column(turned, 0, &key)?;
                    if fingerprint(&stored_fp).map_err(|e| corrupt(&key, e))? != fp_in {
                        return Ok(StoreClaim::Mismatch);
                    }
                    return Ok(StoreClaim::Unknown {
                        marked_at: from_micros(column(turned, 1, &key)?),
                    });
                }
                if !live {
                    continue;
                }
                let stored_fp: Vec<u8> = column(row, 2, &key)?;
                if fingerprint(&stored_fp).map_err(|e| corrupt(&key, e))? != fp_in {
                    return Ok(StoreClaim::Mismatch);
                }
                let settled =
                    from_micros(column::<Option<i64>>(row, 4, &key)?.unwrap_or(expires_at));
                return Ok(match state {
                    1 => StoreClaim::InProgress { lease_ends_at: from_micros(expires_at) },
                    2 => StoreClaim::Completed(Replay::new(
                        column::<Option<Vec<u8>>>(row, 3, &key)?.map(Bytes::from),
                        settled,
                        from_micros(expires_at),
                    )),
                    3 => StoreClaim::Unknown { marked_at: settled },
                    other => return Err(corrupt(&key, format_args!("its state is {other}"))),
                });
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
            let stored = body.as_deref();
            let params: [&(dyn ToSql + Sync); 4] =
                [&key.as_bytes(), &(token.get() as i64), &stored, &micros(ttl)];
            let (at, until) = self.settle(&key, COMPLETE, &params, StoreError::LeaseLost).await?;
            Ok(Replay::new(body, from_micros(at), from_micros(until)))
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
            let sql = concat!(
                "WITH ",
                now!(),
                " UPDATE idemcache_records r SET expires_at = now.us + $3 FROM now
                 WHERE r.key = $1 AND r.token = $2 AND r.state = 1 AND r.expires_at > now.us
                 RETURNING r.started_at, r.expires_at"
            );
            let params: [&(dyn ToSql + Sync); 3] =
                [&key.as_bytes(), &(token.get() as i64), &micros(lease)];
            let (_, until) = self.settle(&key, sql, &params, StoreError::LeaseLost).await?;
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
            let sql = concat!(
                "WITH ",
                now!(),
                " DELETE FROM idemcache_records r USING now
                 WHERE r.key = $1 AND r.token = $2 AND r.state = 1 AND r.expires_at > now.us
                 RETURNING r.started_at, r.expires_at"
            );
            self.settle(&key, sql, &[&key.as_bytes(), &(token.get() as i64)], StoreError::LeaseLost)
                .await
                .map(drop)
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
            let sql = concat!(
                "WITH ",
                now!(),
                " UPDATE idemcache_records r
                 SET state = 3, settled_at = now.us, expires_at = now.us + $3 FROM now
                 WHERE r.key = $1 AND r.token = $2 AND r.state = 1 AND r.expires_at > now.us
                 RETURNING r.settled_at, r.expires_at"
            );
            let params: [&(dyn ToSql + Sync); 3] =
                [&key.as_bytes(), &(token.get() as i64), &micros(ttl)];
            self.settle(&key, sql, &params, StoreError::LeaseLost).await.map(drop)
        }
    }

    fn resolve(
        &self,
        key: &Key,
        body: Option<Bytes>,
        ttl: Duration,
    ) -> impl Future<Output = Result<Replay<SystemTime>, StoreError>> + Send {
        self.resolve_where(key.clone(), None, body, ttl)
    }

    fn forget(&self, key: &Key) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.forget_where(key.clone(), None)
    }

    fn resolve_listed(
        &self,
        listed: &UnknownEntry<SystemTime>,
        body: Option<Bytes>,
        ttl: Duration,
    ) -> impl Future<Output = Result<Replay<SystemTime>, StoreError>> + Send {
        self.resolve_where(listed.key.clone(), Some(Listed::of(listed)), body, ttl)
    }

    fn forget_listed(
        &self,
        listed: &UnknownEntry<SystemTime>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.forget_where(listed.key.clone(), Some(Listed::of(listed)))
    }

    async fn list_unknown(
        &self,
        limit: usize,
    ) -> Result<Vec<UnknownEntry<SystemTime>>, StoreError> {
        // A lapse not yet turned by a claim reads as the UNKNOWN it will be.
        let sql = concat!(
            "WITH ",
            now!(),
            " SELECT r.key, r.fingerprint,
                     CASE WHEN r.state = 1 THEN r.expires_at ELSE r.settled_at END AS marked,
                     CASE WHEN r.state = 1 THEN r.expires_at + $2 ELSE r.expires_at END,
                     r.token
              FROM idemcache_records r, now
              WHERE ",
            unknown_or_lapsed!("$2"),
            " ORDER BY marked, r.key LIMIT $1"
        );
        let mut out = Vec::new();
        let lapse_ttl = lapse_ttl_micros(self.lapse);
        for row in self.rows(sql, &[&sql_limit(limit), &lapse_ttl]).await? {
            let stored: Vec<u8> = column(&row, 0, &[])?;
            let marked_at: Option<i64> = column(&row, 2, &stored)?;
            let fp: Vec<u8> = column(&row, 1, &stored)?;
            let token: i64 = column(&row, 4, &stored)?;
            out.push(UnknownEntry::new(
                key(&stored)?,
                fingerprint(&fp).map_err(|e| corrupt(&stored, e))?,
                FencingToken::new(token as u64),
                from_micros(
                    marked_at
                        .ok_or_else(|| corrupt(&stored, "it has no mark time (settled_at)"))?,
                ),
                from_micros(column(&row, 3, &stored)?),
            ));
        }
        Ok(out)
    }

    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        // A lapse this handle reads as UNKNOWN is kept until that mark would expire.
        let lapse_ttl = lapse_ttl_micros(self.lapse);
        let rows = self.rows(PURGE, &[&sql_limit(limit), &lapse_ttl]).await?;
        let purged: i64 = match rows.first() {
            Some(row) => column(row, 0, &[])?,
            None => 0,
        };
        Ok(usize::try_from(purged).unwrap_or(0))
    }
}
