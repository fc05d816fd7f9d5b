//! [`PostgresStore`]: idemcache's durable records in PostgreSQL, through a pool of
//! tokio-postgres connections (deadpool); and [`is_unique_violation`], tokio-postgres's
//! classifier for your own tables; and, on your own transaction, the consumer [`inbox`]
//! and the transactional [`outbox`] (with its relay woken by `LISTEN/NOTIFY`).
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
//! The statements and the decoding of their rows are `idemcache-sql`'s
//! ([`idemcache_sql::records::postgres`], [`idemcache_sql::records::decode`]), which
//! `idemcache-sqlx` runs too: a table either crate wrote behaves the same under the
//! other. This crate binds and runs them: the handle and its constructors here, the
//! [`Store`] implementation in `store.rs`, [`complete_in`] and
//! [`PostgresStore::claim_in`] in `in_transaction.rs`.
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
//! transaction ([`complete_in`]), or make the claim there too
//! ([`PostgresStore::claim_in`]: a first execution in one commit):
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
//!   its rows, not the table (a TID scan; the statement's docs, [`idemcache_sql::records::postgres::PURGE`],
//!   say what it replaced: 15 s a batch). Flat out, one purger deletes ~90,000 rows/s and raises the claims'
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
// Where links to this crate's items go from documentation built without it (another
// crate's `cargo doc --no-deps`); `.ci/package` checks the version.
#![doc(html_root_url = "https://docs.rs/idemcache-postgres/0.1.0")]

use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::types::ToSql;
use tokio_postgres::NoTls;

use idemcache::store::encoding::{at_server, check_lapse_policy, check_url};
use idemcache::store::StoreError;
use idemcache::{Key, LapsePolicy};

#[cfg(doc)]
use idemcache::store::Store;

pub use {deadpool_postgres, tokio_postgres};

mod errors;
mod in_transaction;
pub mod inbox;
mod one_commit;
pub mod outbox;
mod store;
mod transition;

pub use errors::is_unique_violation;
use errors::{backend, column, conflict, MAX_CONFLICTS};
pub use in_transaction::{complete_in, Transaction};
pub use one_commit::PooledTransaction;
pub use transition::transition;

/// The schema [`ensure_schema`](Store::ensure_schema) creates (idempotent, and safe to
/// run from several processes at once: it holds an advisory lock), as
/// [`idemcache_sql::records::postgres::SCHEMA`] holds it. Columns as in SQLite's:
/// `state` 1 PROCESSING, 2 COMPLETED, 3 UNKNOWN; `expires_at` the lease's end while
/// PROCESSING, the TTL's after; times in microseconds since the epoch (server clock).
///
/// The DDL, as this test checks it:
///
/// ```
/// assert_eq!(
///     idemcache_postgres::POSTGRES_SCHEMA.trim(),
///     "CREATE SEQUENCE IF NOT EXISTS idemcache_tokens;
/// CREATE TABLE IF NOT EXISTS idemcache_records (
///     key         BYTEA PRIMARY KEY,
///     fingerprint BYTEA NOT NULL,
///     state       SMALLINT NOT NULL CHECK (state IN (1, 2, 3)),
///     token       BIGINT NOT NULL,
///     body        BYTEA,
///     started_at  BIGINT NOT NULL,
///     settled_at  BIGINT,
///     expires_at  BIGINT NOT NULL,
///     correlation_id TEXT
/// );
/// CREATE INDEX IF NOT EXISTS idemcache_records_expiry ON idemcache_records (expires_at);"
/// );
/// ```
pub const POSTGRES_SCHEMA: &str = idemcache_sql::records::postgres::SCHEMA;

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
        // Each statement is a transaction of its own, so one a serialization failure or a
        // deadlock rolled back applied nothing: it runs again (a database or role whose
        // default isolation is REPEATABLE READ or SERIALIZABLE meets them where READ
        // COMMITTED waits).
        let mut conflicts = 0;
        loop {
            match client.query(&statement, params).await {
                Err(e) if conflict(&e) && conflicts < MAX_CONFLICTS => conflicts += 1,
                done => return done.map_err(|e| self.failed(e)),
            }
        }
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
