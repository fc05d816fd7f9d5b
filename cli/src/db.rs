//! The state database: where it is (`--db`, `$IDEM_DB`, `$XDG_STATE_HOME/idem/idem.db`,
//! `~/.local/state/idem/idem.db`), opening it, and saying why it is unusable.
//!
//! Invariant: a store handed out is on a local file that SQLite opened read-write in WAL
//! mode, with the schema in place, under the `MarkUnknown` lapse policy; anything else
//! is a [`Failure`] with [`DB_UNUSABLE`] naming the file and the reason. Every error a
//! store operation returns later is named the same way, by [`Db::failure`].

use std::path::{Path, PathBuf};
use std::time::Duration;

use idemcache::store::StoreError;
use idemcache::LapsePolicy;
use idemcache_sqlite::rusqlite::{self, Connection, ErrorCode, OpenFlags};
use idemcache_sqlite::{create_schema, SqliteStore};

use crate::exit::{Failure, DB_UNUSABLE};
use crate::netfs;

/// An open state database.
#[derive(Debug)]
pub struct Db {
    /// The store on it.
    pub store: SqliteStore,
    /// Its file, for messages.
    pub path: PathBuf,
    busy_timeout: Duration,
}

/// The database's path: `flag` (`--db`, or `$IDEM_DB` through clap), else the user's
/// state directory.
pub fn path(flag: Option<PathBuf>) -> Result<PathBuf, Failure> {
    if let Some(path) = flag.filter(|p| !p.as_os_str().is_empty()) {
        return Ok(path);
    }
    let absolute = |var: &str| std::env::var_os(var).map(PathBuf::from).filter(|p| p.is_absolute());
    let state = match (absolute("XDG_STATE_HOME"), absolute("HOME")) {
        (Some(state), _) => state,
        (None, Some(home)) => home.join(".local").join("state"),
        (None, None) => {
            return Err(Failure::new(
                DB_UNUSABLE,
                "no state database: pass --db PATH or set $IDEM_DB (neither $XDG_STATE_HOME nor $HOME is set)",
            ))
        }
    };
    Ok(state.join("idem").join("idem.db"))
}

/// Opens the database at `path` (creating it and its directory, mode 0700, if missing),
/// with lapsed leases turning UNKNOWN for `unknown_ttl`, and statements waiting up to
/// `busy_timeout` for another process's lock before the database is called locked
/// (`$IDEM_BUSY_TIMEOUT_MS`, 5 s by default: idem's own transactions last milliseconds).
pub fn open(path: PathBuf, unknown_ttl: Duration, busy_timeout: Duration) -> Result<Db, Failure> {
    let unusable = |why: String| {
        Failure::new(
            DB_UNUSABLE,
            format!("the state database {} is unusable: {why}", path.display()),
        )
    };
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
        _ => PathBuf::from("."),
    };
    if !dir.exists() {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| unusable(format!("creating its directory {}: {e}", dir.display())))?;
    }
    if let Some((fstype, point)) = netfs::network_filesystem(&path) {
        return Err(unusable(format!(
            "it is on a network filesystem ({fstype} mounted at {point}): SQLite's WAL and \
             locks do not work there, so two runs could both execute one key; put it on a \
             local disk (--db or $IDEM_DB)"
        )));
    }
    if path.is_dir() {
        return Err(unusable("it is a directory".into()));
    }
    // Created 0600 (SQLite gives its -wal and -shm files the same mode): records hold
    // commands' output. An empty file is an empty database. A symlink leading nowhere
    // yet "exists" to `create_new`, which never follows one: its target is made here,
    // not by SQLite (0644).
    {
        use std::os::unix::fs::OpenOptionsExt;
        let mut options = std::fs::OpenOptions::new();
        options.write(true).mode(0o600);
        let made = match options.clone().create_new(true).open(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && !path.exists() => {
                options.create(true).open(&path)
            }
            other => other,
        };
        match made {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(unusable(format!("creating it: {e}"))),
        }
    }
    let db = connect(&path, busy_timeout).map_err(|e| unusable(explain(&e, busy_timeout)))?;
    let store = SqliteStore::from_connection(db)
        .with_lapse_policy(LapsePolicy::MarkUnknown { ttl: unknown_ttl })
        .map_err(|e| Failure::new(crate::exit::USAGE, e.to_string()))?;
    Ok(Db { store, path, busy_timeout })
}

/// Opens and checks the connection, trying again while another process holds a lock
/// SQLite will not wait for: two connections switching a new file to WAL at once, or
/// creating the schema, deadlock, and one is told "busy" at once without the busy
/// timeout. Bounded by the busy timeout, as any other wait for a lock.
fn connect(path: &Path, busy_timeout: Duration) -> Result<Connection, rusqlite::Error> {
    let deadline = std::time::Instant::now() + busy_timeout;
    let mut pause = Duration::from_millis(5);
    loop {
        match connect_once(path, busy_timeout) {
            Err(e)
                if matches!(
                    e.sqlite_error_code(),
                    Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
                ) && std::time::Instant::now() + pause < deadline =>
            {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(100));
            }
            other => return other,
        }
    }
}

/// Opens and checks the connection: writable, WAL, the schema in place.
fn connect_once(path: &Path, busy_timeout: Duration) -> Result<Connection, rusqlite::Error> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let mut db = Connection::open_with_flags(path, flags)?;
    // First: every statement after waits out another process's lock instead of failing.
    db.busy_timeout(busy_timeout)?;
    if db.is_readonly(rusqlite::MAIN_DB)? {
        // SQLite opens a file it may not write read-only, silently.
        return Err(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_READONLY),
            None,
        ));
    }
    // Reads the header: a file that is not a database fails here.
    let mode: String = db.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CANTOPEN),
            Some(format!("it cannot be put in WAL mode (journal mode stays {mode})")),
        ));
    }
    // The tables, with every column this release writes (a database an earlier release
    // made lacks the correlation id's).
    let current: bool = db.query_row(
        "SELECT (SELECT count(*) FROM sqlite_master WHERE type = 'table'
                 AND name IN ('idemcache_records', 'idemcache_tokens')) = 2
            AND EXISTS (SELECT 1 FROM pragma_table_info('idemcache_records')
                        WHERE name = 'correlation_id')",
        [],
        |r| r.get(0),
    )?;
    if !current {
        // One write transaction taken before reading, so runs creating it at once wait
        // for each other instead of failing on a stale read.
        let tx = db.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        create_schema(&tx)?;
        tx.commit()?;
    }
    Ok(db)
}

/// Why SQLite refused, for a person.
fn explain(e: &rusqlite::Error, busy_timeout: Duration) -> String {
    let why = match e.sqlite_error_code() {
        Some(ErrorCode::NotADatabase) => "it is not an SQLite database (damaged or another kind of file)".to_owned(),
        Some(ErrorCode::DatabaseCorrupt) => "it is corrupt".to_owned(),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => format!(
            "it is locked by another process (waited {:.1} s): something holds a lock on it",
            busy_timeout.as_secs_f64()
        ),
        Some(ErrorCode::ReadOnly) => "it is read-only: idem must write it, and its -wal and -shm files beside it (check the permissions of the file and its directory)".to_owned(),
        Some(ErrorCode::CannotOpen) => "it cannot be opened (does its directory exist, may you write there?)".to_owned(),
        Some(ErrorCode::PermissionDenied) => "permission denied".to_owned(),
        Some(ErrorCode::DiskFull) => "the disk is full".to_owned(),
        Some(ErrorCode::SystemIoFailure) => "reading or writing it failed (I/O error)".to_owned(),
        _ => return format!("SQLite: {e}"),
    };
    format!("{why} (SQLite: {e})")
}

impl Db {
    /// A failed store operation, named by the file and why.
    pub fn failure(&self, e: StoreError) -> Failure {
        let path = self.path.display();
        let why = match &e {
            StoreError::Backend(cause) => match cause.downcast_ref::<rusqlite::Error>() {
                Some(sqlite) => explain(sqlite, self.busy_timeout),
                None => cause.to_string(),
            },
            // A record, or the token counter, changed by hand: the store names which.
            StoreError::Corrupt(why) => format!("it holds what idem cannot read: {why}"),
            other => other.to_string(),
        };
        Failure::new(DB_UNUSABLE, format!("the state database {path} is unusable: {why}"))
    }

    /// A store on a second connection to the database, for renewing a lease while CMD
    /// runs (`extend_lease`, nothing else). It never waits for another connection's
    /// lock (no busy timeout): a renewal meeting one hears "busy" at once, and tries
    /// again within what is left of its lease, which it knows and SQLite's busy handler
    /// does not. Waiting out the busy timeout instead (5 s by default, half the default
    /// lease), a renewal that failed tried again only a third of the lease later: past
    /// the lease's end, so a live command's key lapsed to UNKNOWN.
    pub fn renewal_store(&self) -> Result<SqliteStore, Failure> {
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let db = Connection::open_with_flags(&self.path, flags)
            .and_then(|db| db.busy_timeout(Duration::ZERO).map(|()| db))
            .map_err(|e| {
                Failure::new(
                    DB_UNUSABLE,
                    format!(
                        "the state database {} is unusable: opening it again to renew the lease: {}",
                        self.path.display(),
                        explain(&e, self.busy_timeout)
                    ),
                )
            })?;
        Ok(SqliteStore::from_connection(db))
    }

    /// Runs a store operation to its end on this thread.
    pub fn wait<T>(
        &self,
        op: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, Failure> {
        idemcache::store::block_on(op).map_err(|e| self.failure(e))
    }
}
