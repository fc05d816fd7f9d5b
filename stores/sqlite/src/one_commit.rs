//! [`TransactionalStore`] for [`SqliteStore`]: the HTTP layer's one-commit mode
//! (`IdempotencyLayer::one_commit(OneCommit::new(store))`) over SQLite, each first
//! execution one [`SqliteTransaction`]: a connection of its own to the store's file, on
//! a thread of its own, lent to the async handler as PostgreSQL's pooled transaction is.
//!
//! Invariant: the claim is the store's own ([`claim_locked`], the statement
//! [`SqliteStore::claim_in`] runs) under `BEGIN IMMEDIATE`, the completion its own
//! `COMPLETE`; both run in the transaction the handler's writes run in, on one
//! connection that nothing else uses, so they commit together or not at all. The claim
//! waits for SQLite's one write lock at most the layer's wait (the connection's busy
//! timeout, for `BEGIN IMMEDIATE` alone), and every SQLite call runs on the
//! transaction's thread, never on the runtime's.
//!
//! SQLite has one writer per database: while a first execution's transaction is open,
//! every other write to the file waits for it, whatever its key (another first
//! execution's claim, the store's own claims and purges, other processes). One-commit
//! mode over SQLite so runs first executions one at a time per database file, and a
//! claim whose wait runs out answers `InProgress` (409, `Retry-After`) even when the
//! transaction it waited for holds another key. Give the layer a wait
//! (`IdempotencyLayer::wait`) longer than a handler runs.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rusqlite::Connection;

use idemcache::store::encoding::{check_duration, lapse_ttl_micros, micros};
use idemcache::store::{OpenClaim, StoreClaim, StoreError, TransactionalStore};
use idemcache::{CorrelationId, Fingerprint, Key};

use crate::errors::{backend, is_busy, opening};
use crate::in_transaction::complete_on;
use crate::store::claim_locked;
use crate::SqliteStore;

/// How long a transaction's statements after its claim wait for a lock (it holds the
/// write lock then; only a checkpoint or a reader's lock on the schema can make one
/// wait), as the store's own connection does.
const BUSY_AFTER_CLAIM: Duration = Duration::from_secs(10);

/// The longest busy timeout SQLite takes: `i32::MAX` milliseconds (24.8 days).
const LONGEST_BUSY_TIMEOUT: Duration = Duration::from_millis(i32::MAX as u64);

/// One first execution's transaction in the layer's one-commit mode over SQLite: a
/// connection of its own to the store's database file, owned by a thread of its own.
/// The handler finds it in `HeldTransaction<SqliteTransaction>` and writes with
/// [`run`](Self::run); the layer claims, completes and commits in it. Dropped
/// unfinished, its connection closes and SQLite rolls the transaction back.
pub struct SqliteTransaction {
    /// The thread and connection holding the transaction: a worker as the store's own,
    /// serving this transaction alone.
    own: SqliteStore,
}

impl std::fmt::Debug for SqliteTransaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteTransaction").field("database", &&*self.own.database).finish()
    }
}

impl SqliteTransaction {
    /// Runs `op` on the transaction's connection, on its thread (never the runtime's),
    /// and answers what it returned: your business writes, which commit with the
    /// layer's record of the request or not at all. Fails only if the transaction's
    /// thread is gone. Run nothing that ends the transaction (`COMMIT`, `ROLLBACK`):
    /// the layer does that; a statement of yours that fails leaves it open, so answer a
    /// 5xx for a failure that must not commit.
    ///
    /// ```no_run
    /// # async fn handler(tx: &mut idemcache_sqlite::SqliteTransaction) -> Result<(), Box<dyn std::error::Error>> {
    /// let inserted = tx
    ///     .run(|db| db.execute("INSERT INTO orders (item) VALUES (?1)", ["book"]))
    ///     .await??;
    /// assert_eq!(inserted, 1);
    /// # Ok(()) }
    /// ```
    pub async fn run<T: Send + 'static>(
        &mut self,
        op: impl FnOnce(&Connection) -> T + Send + 'static,
    ) -> Result<T, StoreError> {
        self.own.run(move |db| Ok(op(db))).await
    }
}

/// One transaction per first execution, each on a connection of its own to the store's
/// database file (a store over `:memory:` or an application's in-memory connection has
/// no file another connection can open: [`begin`](TransactionalStore::begin) refuses
/// it). The module docs say what SQLite's one writer means for this mode.
impl TransactionalStore for SqliteStore {
    type Transaction = SqliteTransaction;

    fn name(&self) -> &'static str {
        idemcache::store::Store::name(self)
    }

    async fn begin(&self) -> Result<SqliteTransaction, StoreError> {
        let Some(file) = self.file.clone() else {
            return Err(StoreError::InvalidInput(format!(
                "one-commit mode needs a database file another connection can open; this \
                 store's database is {:?}",
                &*self.database
            )));
        };
        let (own, worker) = SqliteStore::start(&self.database);
        worker
            .run(move |slot| {
                *slot = Some(open(&file)?);
                Ok(())
            })
            .await?;
        Ok(SqliteTransaction { own })
    }

    async fn claim_in(
        &self,
        tx: &mut SqliteTransaction,
        key: &Key,
        fp: Fingerprint,
        lease: Duration,
        wait: Duration,
        correlation_id: Option<&CorrelationId>,
    ) -> Result<StoreClaim, StoreError> {
        check_duration("lease", lease)?;
        let (lease, lapse_ttl) = (micros(lease), lapse_ttl_micros(self.lapse));
        let key = key.as_bytes().to_vec();
        let correlation_id = correlation_id.map(|c| c.as_str().to_owned());
        tx.own
            .run(move |db| {
                // SQLite counts the timeout in an `int` of milliseconds (rusqlite panics
                // above it): a longer wait is as long as SQLite can wait.
                db.busy_timeout(wait.min(LONGEST_BUSY_TIMEOUT)).map_err(backend)?;
                let began = db.execute_batch("BEGIN IMMEDIATE");
                db.busy_timeout(BUSY_AFTER_CLAIM).map_err(backend)?;
                match began {
                    // Another transaction holds the write lock, for this key or another.
                    Err(e) if is_busy(&e) => {
                        Ok(StoreClaim::InProgress { lease_ends_at: SystemTime::now() })
                    }
                    Err(e) => Err(backend(e)),
                    Ok(()) => claim_locked(db, &key, fp, lease, lapse_ttl, correlation_id),
                }
            })
            .await
    }

    async fn complete_in(
        &self,
        tx: &mut SqliteTransaction,
        claim: &OpenClaim,
        body: Option<&[u8]>,
    ) -> Result<(), StoreError> {
        let ttl = claim.result_ttl();
        check_duration("result TTL", ttl)?;
        claim.hand_over();
        let (key, token) = (claim.key().clone(), claim.token());
        let body = body.map(<[u8]>::to_vec);
        tx.own.run(move |db| complete_on(db, &key, token, body.as_deref(), ttl).map(drop)).await
    }

    async fn commit(&self, tx: SqliteTransaction) -> Result<(), StoreError> {
        tx.own.run(|db| db.execute_batch("COMMIT").map_err(backend)).await
    }

    async fn rollback(&self, tx: SqliteTransaction) -> Result<(), StoreError> {
        // A claim that found the write lock taken began nothing.
        tx.own
            .run(|db| match db.is_autocommit() {
                true => Ok(()),
                false => db.execute_batch("ROLLBACK").map_err(backend),
            })
            .await
    }
}

/// A connection of a transaction's own to `file`, which the store opened (and put in
/// WAL mode, which the file keeps) already.
fn open(file: &Arc<PathBuf>) -> Result<Connection, StoreError> {
    let named = file.display().to_string();
    let db = Connection::open(&**file).map_err(|e| opening(&named, e))?;
    db.busy_timeout(BUSY_AFTER_CLAIM).map_err(|e| opening(&named, e))?;
    Ok(db)
}
