//! [`SqliteStore`]: idemcache's durable records in SQLite (bundled), a file or in
//! memory; and [`is_unique_violation`], rusqlite's classifier for your own tables.
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
//! (`list_unknown` lists it, `resolve` and `forget` settle it, `purge_expired` keeps it).
//!
//! The worker thread keeps blocking SQLite calls off async runtimes' threads; the
//! futures it answers need no runtime, so synchronous code runs them with
//! [`block_on`](idemcache::store::block_on).

#![cfg_attr(docsrs, feature(doc_cfg))]

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::{mpsc, Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use rusqlite::types::ValueRef;
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use idemcache::store::encoding::{check_duration, corrupt, fingerprint, from_micros, key, micros};
use idemcache::store::encoding::{check_lapse_policy, lapse_ttl_micros};
use idemcache::store::unique::is_unique_sqlite_code;
use idemcache::store::{Store, StoreClaim, StoreError};
use idemcache::{FencingToken, Fingerprint, Key, LapsePolicy, Replay, UnknownEntry};

pub use rusqlite;

pub mod inbox;
pub mod transition;

/// The schema [`ensure_schema`](Store::ensure_schema) creates (idempotent).
///
/// `state` is 1 PROCESSING, 2 COMPLETED, 3 UNKNOWN; `expires_at` is the lease's end while
/// PROCESSING and the TTL's end after; `settled_at` is when it completed or was marked
/// unknown; times are microseconds since the Unix epoch on SQLite's clock.
pub const SQLITE_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS idemcache_records (
    key         BLOB PRIMARY KEY,
    fingerprint BLOB NOT NULL,
    state       INTEGER NOT NULL CHECK (state IN (1, 2, 3)),
    token       INTEGER NOT NULL,
    body        BLOB,
    started_at  INTEGER NOT NULL,
    settled_at  INTEGER,
    expires_at  INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS idemcache_records_expiry ON idemcache_records (expires_at);
CREATE TABLE IF NOT EXISTS idemcache_tokens (
    id   INTEGER PRIMARY KEY CHECK (id = 1),
    last INTEGER NOT NULL
);
-- Above every token a record holds: a counter row deleted by hand and put back by
-- this statement never hands out a token a live record was claimed under.
INSERT OR IGNORE INTO idemcache_tokens (id, last)
    SELECT 1, coalesce(max(token), 0) FROM idemcache_records;
";

/// "Now" on SQLite's clock, in microseconds since the epoch: a macro, so every statement
/// is one `concat!`ed constant.
macro_rules! now {
    () => {
        "CAST(unixepoch('subsec') * 1000000 AS INTEGER)"
    };
}

/// PROCESSING → COMPLETED of `?1` under the token `?2`, the body `?3` kept for `?4` µs,
/// while the lease is live; returns `settled_at, expires_at`. The store's `complete` and
/// [`complete_in`] (the same write in the caller's transaction) share it.
const COMPLETE: &str = concat!(
    "UPDATE idemcache_records SET state = 2, body = ?3, settled_at = ",
    now!(),
    ", expires_at = ",
    now!(),
    " + ?4
     WHERE key = ?1 AND token = ?2 AND state = 1 AND expires_at > ",
    now!(),
    "
     RETURNING settled_at, expires_at"
);

mod in_transaction;
pub use in_transaction::complete_in;
mod records;
pub use records::{Record, RecordState};

const PROCESSING: i64 = 1;
const COMPLETED: i64 = 2;
const UNKNOWN: i64 = 3;

type Job = Box<dyn FnOnce(&mut Connection) + Send>;
/// The worker's first job: put a connection in its slot (or fail, and the worker ends).
type Open = Box<dyn FnOnce(&mut Option<Connection>) + Send>;

/// Gives a new store's worker its connection.
struct Opener {
    open: mpsc::Sender<Open>,
    /// Why the worker thread could not be spawned, if it could not.
    spawned: Option<String>,
}

impl Opener {
    /// Runs `op` on the worker with its connection slot; resolves with its result.
    fn run(
        self,
        op: impl FnOnce(&mut Option<Connection>) -> Result<(), StoreError> + Send + 'static,
    ) -> Answer<()> {
        let (reply, answer) = exchange();
        match self.spawned {
            Some(why) => {
                let why = format!("spawning the SQLite worker thread: {why}");
                reply.send(Err(StoreError::Backend(why.into())));
            }
            None => drop(self.open.send(Box::new(move |db| reply.send(op(db))))),
        }
        answer
    }
}

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
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore").field("database", &&*self.database).finish_non_exhaustive()
    }
}

fn backend(e: rusqlite::Error) -> StoreError {
    StoreError::Backend(Box::new(e))
}

/// An error opening `path`, naming it (SQLite's own message does not).
fn opening(path: &str, e: rusqlite::Error) -> StoreError {
    StoreError::Backend(format!("opening the SQLite database {path:?}: {e}").into())
}

/// An error reading the record of `key`: a column holding another type (SQLite lets
/// any column hold any type) or NULL where a value belongs is [`StoreError::Corrupt`]
/// naming the key; anything else is the database failing.
fn read_error(key: &[u8], e: rusqlite::Error) -> StoreError {
    use rusqlite::Error::{FromSqlConversionFailure, IntegralValueOutOfRange, InvalidColumnType};
    match e {
        InvalidColumnType(_, name, ty) => corrupt(key, format_args!("column {name} holds {ty}")),
        FromSqlConversionFailure(i, ty, why) => {
            corrupt(key, format_args!("column {i} holds {ty} that does not convert: {why}"))
        }
        IntegralValueOutOfRange(i, v) => corrupt(key, format_args!("column {i} holds {v}")),
        e => backend(e),
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
    /// [`ensure_schema`](Store::ensure_schema).
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
    /// schema is not created: call [`ensure_schema`](Store::ensure_schema).
    pub async fn open_path(path: impl AsRef<Path>) -> Result<SqliteStore, StoreError> {
        let path = path.as_ref().to_owned();
        let database = path.display().to_string();
        Self::opened(&database.clone(), move || {
            let named = database;
            let db = Connection::open(&path).map_err(|e| opening(&named, e))?;
            db.pragma_update(None, "journal_mode", "WAL").map_err(|e| opening(&named, e))?;
            db.busy_timeout(Duration::from_secs(10)).map_err(|e| opening(&named, e))?;
            Ok(db)
        })
        .await
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
        let database = db.path().filter(|p| !p.is_empty()).unwrap_or(":memory:").to_owned();
        let (store, worker) = Self::start(&database);
        drop(worker.run(move |slot| {
            *slot = Some(db);
            Ok(())
        }));
        store
    }

    /// A store whose worker thread has no connection yet, and the handle that gives it
    /// one (the first thing the worker does).
    fn start(database: &str) -> (SqliteStore, Opener) {
        let (jobs, inbox) = mpsc::channel::<Job>();
        let (open, opened) = mpsc::channel::<Open>();
        let spawned =
            std::thread::Builder::new().name("idemcache-sqlite".into()).spawn(move || {
                let mut db = None;
                if let Ok(open) = opened.recv() {
                    open(&mut db);
                }
                // No connection: the jobs are dropped unanswered, and each `Reply` answers
                // its caller with an error.
                let Some(mut db) = db else { return };
                // Ends when the store's last clone (the only senders) is dropped.
                for job in inbox {
                    job(&mut db);
                }
            });
        let store = SqliteStore { jobs, database: database.into(), lapse: LapsePolicy::TakeOver };
        (store, Opener { open, spawned: spawned.err().map(|e| e.to_string()) })
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

    /// Runs `op` on the worker thread; the future resolves with its result.
    fn run<T: Send + 'static>(
        &self,
        op: impl FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Answer<T> {
        let (reply, answer) = exchange();
        let job: Job = Box::new(move |db| reply.send(op(db)));
        // If the worker is gone, the job comes back in the error and is dropped here:
        // its `Reply` then answers the slot with an error.
        drop(self.jobs.send(job));
        answer
    }
}

/// The two halves of one answer from the worker: its [`Reply`] and the caller's
/// [`Answer`], sharing one slot.
fn exchange<T>() -> (Reply<T>, Answer<T>) {
    let slot = Arc::new(Mutex::new(Slot { value: None, waker: None }));
    (Reply(slot.clone()), Answer(slot))
}

struct Slot<T> {
    value: Option<Result<T, StoreError>>,
    waker: Option<Waker>,
}

/// The worker's half: answers once; dropped unanswered (the worker died), it answers
/// with an error so no caller waits forever.
struct Reply<T>(Arc<Mutex<Slot<T>>>);

impl<T> Reply<T> {
    fn send(self, value: Result<T, StoreError>) {
        self.put(value);
    }

    fn put(&self, value: Result<T, StoreError>) {
        let waker = {
            let mut slot = self.0.lock().unwrap_or_else(|p| p.into_inner());
            if slot.value.is_some() {
                return;
            }
            slot.value = Some(value);
            slot.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl<T> Drop for Reply<T> {
    fn drop(&mut self) {
        let gone = "the SQLite worker thread is gone".to_owned();
        self.put(Err(StoreError::Backend(gone.into())));
    }
}

/// The caller's half: a future of the worker's answer.
struct Answer<T>(Arc<Mutex<Slot<T>>>);

impl<T> Future for Answer<T> {
    type Output = Result<T, StoreError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut slot = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match slot.value.take() {
            Some(value) => Poll::Ready(value),
            None => {
                slot.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// A row as a claim sees it.
struct Row {
    fingerprint: Vec<u8>,
    state: i64,
    body: Option<Vec<u8>>,
    settled_at: Option<i64>,
    expires_at: i64,
}

/// A record "lapsed less than `?N` µs ago": PROCESSING, past its lease, and within the
/// unknown TTL of `LapsePolicy::MarkUnknown` (never true when the TTL is 0, `TakeOver`).
/// Such a record is UNKNOWN to every statement of a `MarkUnknown` handle.
macro_rules! lapsed_within {
    ($ttl:literal) => {
        concat!(
            "(state = 1 AND expires_at <= ",
            now!(),
            " AND expires_at + ",
            $ttl,
            " > ",
            now!(),
            ")"
        )
    };
}

/// A live UNKNOWN record, or one a lapse made so (see [`lapsed_within`]).
macro_rules! unknown_or_lapsed {
    ($ttl:literal) => {
        concat!("((state = 3 AND expires_at > ", now!(), ") OR ", lapsed_within!($ttl), ")")
    };
}

/// The record of `key` and the statement's "now" (one read: one snapshot, one clock).
fn record(db: &Connection, key: &[u8]) -> Result<Option<(i64, Row)>, StoreError> {
    let sql = concat!(
        "SELECT ",
        now!(),
        ", fingerprint, state, body, settled_at, expires_at FROM idemcache_records WHERE key = ?1"
    );
    db.query_row(sql, params![key], |r| {
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
) -> Result<StoreClaim, StoreError> {
    if let Some((now, row)) = record(db, &key)? {
        if row.expires_at > now {
            return live_answer(&key, row, fp);
        }
    }
    let tx = db.transaction_with_behavior(TransactionBehavior::Immediate).map_err(backend)?;
    let now: i64 = tx.query_row(concat!("SELECT ", now!()), [], |r| r.get(0)).map_err(backend)?;
    let row = record(&tx, &key)?.map(|(_, row)| row);
    let lapsed = |row: &Row| {
        row.state == PROCESSING
            && row.expires_at <= now
            && row.expires_at.saturating_add(lapse_ttl) > now
    };
    if let Some(row) = row.as_ref().filter(|row| lapsed(row)) {
        // MarkUnknown: the lapsed lease turns UNKNOWN, marked at its end, in this
        // transaction; nobody acquires it.
        let until = row.expires_at.saturating_add(lapse_ttl);
        tx.execute(
            "UPDATE idemcache_records SET state = 3, settled_at = expires_at, expires_at = ?2
             WHERE key = ?1",
            params![key, until],
        )
        .map_err(backend)?;
        tx.commit().map_err(backend)?;
        if fingerprint(&row.fingerprint).map_err(|e| corrupt(&key, e))? != fp {
            return Ok(StoreClaim::Mismatch);
        }
        return Ok(StoreClaim::Unknown { marked_at: from_micros(row.expires_at) });
    }
    if let Some(row) = row.filter(|row| row.expires_at > now) {
        // Live since the first look (another claim's, committed in between): answered
        // without writing (the transaction ends unchanged).
        return live_answer(&key, row, fp);
    }
    let token: i64 = tx
        .query_row(
            "UPDATE idemcache_tokens SET last = last + 1 WHERE id = 1 RETURNING last",
            [],
            |r| r.get(0),
        )
        .optional()
        .map_err(backend)?
        .ok_or_else(lost_token_counter)?;
    let lease_ends_at = now.saturating_add(lease);
    tx.execute(
        "INSERT OR REPLACE INTO idemcache_records
             (key, fingerprint, state, token, body, started_at, settled_at, expires_at)
         VALUES (?1, ?2, 1, ?3, NULL, ?4, NULL, ?5)",
        params![key, fp.to_bytes().to_vec(), token, now, lease_ends_at],
    )
    .map_err(backend)?;
    tx.commit().map_err(backend)?;
    Ok(StoreClaim::Acquired {
        token: FencingToken::new(token as u64),
        lease_ends_at: from_micros(lease_ends_at),
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
    fn of(entry: &UnknownEntry<SystemTime>) -> Listed {
        // The inverse of the listing's `as u64`: the row's own value, bit for bit.
        Listed { token: entry.token.get() as i64 }
    }
}

/// "The row is the listed one", binding `$token` (the listed token, or NULL: any row).
macro_rules! listed {
    ($token:literal) => {
        concat!("(", $token, " IS NULL OR token = ", $token, ")")
    };
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
            let sql = concat!(
                "UPDATE idemcache_records SET state = 2, body = ?2, settled_at = ",
                now!(),
                ", expires_at = ",
                now!(),
                " + ?3
                 WHERE key = ?1 AND ",
                unknown_or_lapsed!("?4"),
                " AND ",
                listed!("?5"),
                " RETURNING settled_at, expires_at"
            );
            let stored = body.as_deref().map(<[u8]>::to_vec);
            let token = listed.map(|l| l.token);
            let (at, until) = settle(
                db,
                &key,
                sql,
                &[&key.as_bytes(), &stored, &micros(ttl), &lapse_ttl, &token],
                StoreError::NotUnknown,
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
            let sql = concat!(
                "DELETE FROM idemcache_records WHERE key = ?1 AND ",
                unknown_or_lapsed!("?2"),
                " AND ",
                listed!("?3")
            );
            let token = listed.map(|l| l.token);
            let args = params![key.as_bytes(), lapse_ttl, token];
            match db.execute(sql, args).map_err(backend)? {
                0 => Err(StoreError::NotUnknown(key)),
                _ => Ok(()),
            }
        })
    }
}

impl Store for SqliteStore {
    fn ensure_schema(&self) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.run(|db| db.execute_batch(SQLITE_SCHEMA).map_err(backend))
    }

    fn claim(
        &self,
        key: &Key,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> impl Future<Output = Result<StoreClaim, StoreError>> + Send {
        let key = key.as_bytes().to_vec();
        let checked = check_duration("lease", lease);
        let lapse_ttl = lapse_ttl_micros(self.lapse);
        self.run(move |db| {
            checked?;
            claim(db, key, fingerprint, micros(lease), lapse_ttl)
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
            let sql = concat!(
                "UPDATE idemcache_records SET expires_at = ",
                now!(),
                " + ?3
                 WHERE key = ?1 AND token = ?2 AND state = 1 AND expires_at > ",
                now!(),
                "
                 RETURNING started_at, expires_at"
            );
            let (_, until) = settle(
                db,
                &key,
                sql,
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
            let sql = concat!("DELETE FROM idemcache_records WHERE key = ?1 AND token = ?2 AND state = 1 AND expires_at > ", now!());
            match db.execute(sql, params![key.as_bytes(), token.get() as i64]).map_err(backend)? {
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
            let sql = concat!(
                "UPDATE idemcache_records SET state = 3, settled_at = ",
                now!(),
                ", expires_at = ",
                now!(),
                " + ?3
                 WHERE key = ?1 AND token = ?2 AND state = 1 AND expires_at > ",
                now!(),
                "
                 RETURNING settled_at, expires_at"
            );
            settle(
                db,
                &key,
                sql,
                &[&key.as_bytes(), &(token.get() as i64), &micros(ttl)],
                StoreError::LeaseLost,
            )
            .map(drop)
        })
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

    fn list_unknown(
        &self,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<UnknownEntry<SystemTime>>, StoreError>> + Send {
        let lapse_ttl = lapse_ttl_micros(self.lapse);
        self.run(move |db| {
            // A lapse not yet turned by a claim reads as the UNKNOWN it will be.
            let sql = concat!(
                "SELECT key, fingerprint,
                        CASE WHEN state = 1 THEN expires_at ELSE settled_at END AS marked,
                        CASE WHEN state = 1 THEN expires_at + ?2 ELSE expires_at END,
                        token
                 FROM idemcache_records WHERE ",
                unknown_or_lapsed!("?2"),
                " ORDER BY marked, key LIMIT ?1"
            );
            let mut statement = db.prepare(sql).map_err(backend)?;
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
            let sql = concat!(
                "DELETE FROM idemcache_records WHERE key IN
                     (SELECT key FROM idemcache_records WHERE expires_at <= ",
                now!(),
                " AND NOT ",
                lapsed_within!("?2"),
                " LIMIT ?1)"
            );
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            db.execute(sql, params![limit, lapse_ttl]).map_err(backend)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_uniqueness_counts_in_a_real_sqlite() {
        let db = rusqlite::Connection::open_in_memory().unwrap();
        db.execute_batch(
            "CREATE TABLE t (id INTEGER PRIMARY KEY, u TEXT UNIQUE, n TEXT NOT NULL, c INTEGER CHECK (c > 0));
             INSERT INTO t VALUES (1, 'a', 'x', 1);",
        )
        .unwrap();
        let fails = |sql: &str| db.execute(sql, []).unwrap_err();
        assert!(is_unique_violation(&fails("INSERT INTO t VALUES (2, 'a', 'x', 1)")));
        assert!(is_unique_violation(&fails("INSERT INTO t VALUES (1, 'b', 'x', 1)")));
        assert!(!is_unique_violation(&fails("INSERT INTO t VALUES (3, 'c', NULL, 1)")));
        assert!(!is_unique_violation(&fails("INSERT INTO t VALUES (4, 'd', 'x', 0)")));
        assert!(!is_unique_violation(&fails("INSERT INTO nowhere VALUES (1)")));
    }
}
