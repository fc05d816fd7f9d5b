//! [`SqliteStore`]: idemcache's durable records in SQLite (bundled), a file or in
//! memory; [`is_unique_violation`], rusqlite's classifier for your own tables; and, on
//! your own transaction, the consumer [`inbox`] and the transactional [`outbox`].
//!
//! This crate tracks rusqlite's current release and re-exports it ([`rusqlite`]), so
//! that your application and the store link one SQLite.
//!
//! Invariant: every operation is one transaction on one connection owned by the store's
//! worker thread; a claim that may write is a `BEGIN IMMEDIATE` transaction (it takes
//! the database's write lock before it reads), so a look and the write it decides on
//! cannot be split by another connection or process, and its "now" is SQLite's clock.
//! A claim that finds a live record answers from one read and takes no write lock.
//! Several processes may share one file: WAL mode, and a busy timeout instead of
//! `SQLITE_BUSY`.
//!
//! Lapses ([`SqliteStore::lapse_policy`]): under `LapsePolicy::MarkUnknown` a claim that
//! finds a PROCESSING record whose lease lapsed less than the unknown TTL ago turns it
//! UNKNOWN in its transaction (`settled_at` = the lease's end, `expires_at` = that plus
//! the TTL); until a claim does, the other statements read such a record as UNKNOWN too
//! (`unknown` lists it, `resolve` and `forget` settle it, `purge_expired` keeps it).
//!
//! The worker thread keeps blocking SQLite calls off async runtimes' threads; the
//! futures it answers need no runtime, so synchronous code runs them with
//! [`block_on`](idemcache::store::block_on).

#![cfg_attr(docsrs, feature(doc_cfg))]
// Where links to this crate's items go from documentation built without it (another
// crate's `cargo doc --no-deps`); `.ci/package` checks the version.
#![doc(html_root_url = "https://docs.rs/idemcache-sqlite/0.1.0")]

use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use rusqlite::Connection;

use idemcache::store::encoding::check_lapse_policy;
use idemcache::store::unique::is_unique_sqlite_code;
use idemcache::store::StoreError;
use idemcache::LapsePolicy;

pub use rusqlite;

pub mod inbox;
pub mod outbox;
mod transition;

mod errors;
mod in_transaction;
mod one_commit;
mod records;
mod schema;
mod statements;
mod store;
mod worker;

/// The records `Store::record` and `Store::records` read: the core's, re-exported here
/// for code written when they were this crate's own.
pub use idemcache::store::{Record, RecordState};
pub use in_transaction::complete_in;
pub use one_commit::SqliteTransaction;
pub use schema::{create_schema, SQLITE_SCHEMA};
pub use transition::transition;

use errors::opening;
use worker::Job;

/// Idempotency records in SQLite. See the module docs for the guarantees. Cheap to
/// clone: clones share the one connection and its worker thread, which ends when the
/// last clone is dropped.
///
/// ```
/// use idemcache::store::{block_on, Store, StoreClaim};
/// use idemcache::{Fingerprint, Key};
/// use idemcache_sqlite::SqliteStore;
/// use std::time::Duration;
///
/// let store = block_on(SqliteStore::connect("sqlite::memory:"))?;
/// block_on(store.ensure_schema())?;
/// let key = Key::new("POST /charges", "user:1", "k1")?;
/// let claim = block_on(store.claim(&key, Fingerprint::of(b"req"), Duration::from_secs(30)))?;
/// assert!(matches!(claim, StoreClaim::Acquired { .. }));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct SqliteStore {
    jobs: mpsc::Sender<Job>,
    /// The database, as `Debug` names it: its path, `:memory:`, or a connection of the
    /// application's own.
    database: Arc<str>,
    /// What a lapsed lease becomes, for this handle's statements.
    lapse: LapsePolicy,
    /// The database file, which another connection can open (one-commit mode's
    /// transactions do); `None` in memory.
    file: Option<Arc<PathBuf>>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore").field("database", &&*self.database).finish_non_exhaustive()
    }
}

/// Whether a rusqlite error is a uniqueness (or primary key) violation: for your own
/// business tables, whose `UNIQUE` constraint is the backstop behind the cache (see
/// [`idemcache::store::unique`]). Other constraint failures are real errors.
pub fn is_unique_violation(error: &rusqlite::Error) -> bool {
    matches!(error, rusqlite::Error::SqliteFailure(e, _) if is_unique_sqlite_code(e.extended_code))
}

impl SqliteStore {
    /// Opens (creating if needed) the database `url` names: `sqlite:PATH` (also
    /// `sqlite://PATH`, the scheme in any case, or a bare path; no `?` parameters), as
    /// [`open_path`](Self::open_path) does; or
    /// `sqlite::memory:`, a private in-memory database gone when the store is dropped
    /// (for tests and CLIs). The schema is not created: call
    /// [`ensure_schema`](idemcache::store::Store::ensure_schema).
    pub async fn connect(url: &str) -> Result<SqliteStore, StoreError> {
        let path = match url.split_once(':') {
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("sqlite") => {
                rest.strip_prefix("//").unwrap_or(rest)
            }
            _ => url,
        };
        if path.contains('?') {
            // sqlx's `?mode=rwc` and the like would become part of the file's name.
            return Err(StoreError::InvalidInput(format!(
                "{url:?}: SQLite URLs take no parameters (for a file whose name holds '?', \
                 use SqliteStore::open_path)"
            )));
        }
        match path {
            "" => Err(StoreError::InvalidInput(format!("{url:?} names no SQLite database"))),
            ":memory:" => {
                let open = || Connection::open_in_memory().map_err(|e| opening(":memory:", e));
                Self::opened(":memory:", open).await
            }
            path => Self::open_path(path).await,
        }
    }

    /// Opens (creating if needed) the database file at `path` in WAL mode with a 10 s
    /// busy timeout, so several processes can share it. The file is opened on the
    /// store's worker thread, never the caller's; the future needs no runtime. The
    /// schema is not created: call [`ensure_schema`](idemcache::store::Store::ensure_schema).
    pub async fn open_path(path: impl AsRef<Path>) -> Result<SqliteStore, StoreError> {
        let path = path.as_ref().to_owned();
        let database = path.display().to_string();
        let file = Arc::new(path.clone());
        let store = Self::opened(&database.clone(), move || {
            let named = database;
            let db = Connection::open(&path).map_err(|e| opening(&named, e))?;
            db.pragma_update(None, "journal_mode", "WAL").map_err(|e| opening(&named, e))?;
            db.busy_timeout(Duration::from_secs(10)).map_err(|e| opening(&named, e))?;
            Ok(db)
        })
        .await?;
        Ok(SqliteStore { file: Some(file), ..store })
    }

    /// A store whose worker thread opens its connection with `open`.
    async fn opened(
        database: &str,
        open: impl FnOnce() -> Result<Connection, StoreError> + Send + 'static,
    ) -> Result<SqliteStore, StoreError> {
        let (store, worker) = Self::start(database);
        worker
            .run(move |slot| {
                *slot = Some(open()?);
                Ok(())
            })
            .await?;
        Ok(store)
    }

    /// A store on your own connection, as you configured it (for a file several
    /// processes share: WAL mode and a busy timeout, as [`connect`](Self::connect) sets).
    /// The connection moves to the store's worker thread. Its `read_uncommitted` is
    /// turned off: a claim answers a live record from a read outside any write
    /// transaction, which must never see (and replay) another connection's uncommitted
    /// completion in a shared cache.
    pub fn from_connection(db: Connection) -> SqliteStore {
        // Setting this pragma does not fail on an open connection (it sets a flag).
        let _ = db.pragma_update(None, "read_uncommitted", false);
        let file = db.path().filter(|p| !p.is_empty()).map(|p| Arc::new(PathBuf::from(p)));
        let database = db.path().filter(|p| !p.is_empty()).unwrap_or(":memory:").to_owned();
        let (mut store, worker) = Self::start(&database);
        store.file = file;
        drop(worker.run(move |slot| {
            *slot = Some(db);
            Ok(())
        }));
        store
    }

    /// What a lapsed lease becomes for this handle's claims, listings and purges:
    /// taken over ([`LapsePolicy::TakeOver`], the default), or UNKNOWN from the lease's
    /// end for the policy's `ttl` ([`LapsePolicy::MarkUnknown`]; see the crate docs and
    /// [`LapsePolicy`] for what every store does, and why handles sharing a database should
    /// agree). Clones made after share the setting; the database's records do not keep
    /// it. A `ttl` of zero or over
    /// [`MAX_DURATION`](idemcache::MAX_DURATION) under `MarkUnknown` is
    /// [`StoreError::InvalidInput`].
    ///
    /// ```
    /// use idemcache::store::block_on;
    /// use idemcache::LapsePolicy;
    /// use idemcache_sqlite::SqliteStore;
    /// use std::time::Duration;
    ///
    /// let store = block_on(SqliteStore::connect("sqlite::memory:"))?
    ///     .with_lapse_policy(LapsePolicy::MarkUnknown { ttl: Duration::from_secs(24 * 3600) })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_lapse_policy(mut self, policy: LapsePolicy) -> Result<SqliteStore, StoreError> {
        self.lapse = check_lapse_policy(policy)?;
        Ok(self)
    }

    /// This handle's lapse policy.
    pub fn lapse_policy(&self) -> LapsePolicy {
        self.lapse
    }
}
