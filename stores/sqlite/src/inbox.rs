//! The consumer inbox in SQLite, on your own `rusqlite` transaction: [`receive`] claims
//! a (consumer, message id) with one `INSERT ... ON CONFLICT DO NOTHING` in the
//! transaction that applies the message, so the record and the business change commit
//! together, and a rollback leaves neither. See [`idemcache_sql::inbox`] for the flow
//! (apply on [`Receipt::New`], commit, then acknowledge).
//!
//! Invariant: a record exists only if the transaction that inserted it committed, and
//! [`Receipt::New`] is answered only when this transaction's `INSERT` wrote the row; a
//! row already there is read back (never read first, then inserted) to tell
//! [`Receipt::Duplicate`] from [`Receipt::Mismatch`].
//!
//! # Transactions and isolation
//!
//! SQLite runs one writer at a time and its transactions are serializable, so no
//! isolation level needs choosing. Open the transaction with
//! [`TransactionBehavior::Immediate`](rusqlite::TransactionBehavior::Immediate)
//! (`BEGIN IMMEDIATE`): it takes the write lock at `BEGIN`, waiting up to the
//! connection's busy timeout for another writer (another consumer applying a message)
//! to finish. (rusqlite sets a busy timeout of 5 s on every connection it opens;
//! [`Connection::busy_timeout`] changes it.) A deferred transaction that has already read cannot wait for the lock
//! when it writes: if another connection wrote since its read, SQLite answers
//! `SQLITE_BUSY` at once, whatever the busy timeout.
//!
//! `SQLITE_BUSY` (and `SQLITE_LOCKED`) from [`receive`]'s statements is answered
//! [`Receipt::InFlight`]: another connection holds the write lock (possibly applying this
//! very message), so this transaction can neither claim nor judge the message. Roll back
//! and reject it with requeue; the transaction is still open (only the statement
//! failed). With `BEGIN IMMEDIATE` that wait is spent in `BEGIN` instead, which fails
//! with the driver's busy error after the busy timeout: the bound on how long a second
//! delivery waits is the busy timeout, in both cases.
//!
//! # Retention
//!
//! `received_at` is microseconds since the Unix epoch on SQLite's clock (the process's
//! own). [`purge`] deletes records received before a cutoff, in bounded batches; take
//! the cutoff from an [`Purger`], which keeps the dedup window and
//! purges nothing in the first redelivery horizon after a start.
//! [`purge_loop`] does both for as long as the program runs, on a
//! connection of its own (here on a thread, as a program without an async runtime
//! would; under tokio, `tokio::spawn` it with `tokio::time::sleep`):
//!
//! ```no_run
//! use std::time::{Duration, SystemTime};
//!
//! use idemcache::purge::{self, Round, Schedule};
//! use idemcache_sqlite::inbox::{self, Purger, Retention};
//! use idemcache_sqlite::rusqlite::Connection;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let conn = Connection::open("ledger.db")?;
//! let hour = Duration::from_secs(3600);
//! let purger = Purger::new(Retention::new(24 * hour, hour)?, SystemTime::now());
//! let purging = idemcache_sqlite::inbox::purge_loop(
//!     purger,
//!     move |cutoff, limit| std::future::ready(inbox::purge(&conn, cutoff, limit)),
//!     Schedule::every(Duration::from_secs(60))?,
//!     |pause| {
//!         std::thread::sleep(pause);
//!         std::future::ready(())
//!     },
//!     |round| {
//!         if let Round::Failed { error, .. } = round {
//!             eprintln!("purging the inbox failed: {error}"); // the loop goes on
//!         }
//!     },
//! );
//! std::thread::spawn(move || idemcache::store::block_on(purging));
//! # Ok(())
//! # }
//! ```

use std::time::SystemTime;

use rusqlite::types::ValueRef;
use rusqlite::{params, Connection, OptionalExtension};

use idemcache::store::encoding::to_micros;
use idemcache::Fingerprint;
use idemcache_sql::inbox::check;
use idemcache_sql::inbox::receive::{Claimed, Receiving, Step, Vanished};

use crate::errors::is_busy;

// The inbox's vocabulary and its purge loop (`idemcache-sql`'s), re-exported so that one
// path imports the whole inbox of this driver.
pub use idemcache_sql::inbox::{
    purge_loop, InboxError, KnownMessages, Purger, Receipt, Retention, RetentionError,
};

/// The inbox's table, created by [`ensure_schema`] (idempotent). Keyed by consumer and
/// message id, so several consumers of one message each record it; text compares byte
/// for byte (SQLite's `BINARY` collation), so `"M-1"`, `"m-1"` and `"m-1 "` are three
/// messages. `fingerprint` is [`Fingerprint::to_bytes`]; `received_at` is microseconds
/// since the epoch, indexed for [`purge`].
pub const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS idemcache_inbox (
    consumer    TEXT NOT NULL,
    message_id  TEXT NOT NULL,
    fingerprint BLOB NOT NULL,
    received_at INTEGER NOT NULL,
    PRIMARY KEY (consumer, message_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS idemcache_inbox_received ON idemcache_inbox (received_at);
";

const CLAIM: &str = "
INSERT INTO idemcache_inbox (consumer, message_id, fingerprint, received_at)
VALUES (?1, ?2, ?3, CAST(unixepoch('subsec') * 1000000 AS INTEGER))
ON CONFLICT (consumer, message_id) DO NOTHING";

const READ: &str =
    "SELECT fingerprint FROM idemcache_inbox WHERE consumer = ?1 AND message_id = ?2";

const PURGE: &str = "
DELETE FROM idemcache_inbox WHERE (consumer, message_id) IN (
    SELECT consumer, message_id FROM idemcache_inbox
    WHERE received_at < ?1 ORDER BY received_at LIMIT ?2)";

/// Creates the inbox's table and index if they do not exist. Safe to run on every
/// start, and from several processes (SQLite serializes the DDL).
pub fn ensure_schema(conn: &Connection) -> Result<(), InboxError> {
    conn.execute_batch(SCHEMA).map_err(database)
}

/// Claims (consumer, message id) inside `tx`, the transaction that applies the message
/// (a `rusqlite::Transaction`, or the connection of a [`SqliteTransaction`](crate::SqliteTransaction) in the layer's
/// one-commit mode; a connection in no transaction is refused as `InvalidInput`):
/// [`Receipt::New`] if this transaction inserted the record (apply, commit, then
/// acknowledge), [`Receipt::Duplicate`] or [`Receipt::Mismatch`] if a record is there
/// with this or another fingerprint, [`Receipt::InFlight`] if another connection holds
/// the write lock (see the module docs). Consumer and id are checked by
/// [`idemcache_sql::inbox::check`].
///
/// ```
/// use idemcache_sqlite::inbox::Receipt;
/// use idemcache::Fingerprint;
/// use idemcache_sqlite::inbox;
/// use idemcache_sqlite::rusqlite::{Connection, TransactionBehavior};
///
/// let mut db = Connection::open_in_memory()?;
/// inbox::ensure_schema(&db)?;
/// db.execute_batch("CREATE TABLE accounts (id TEXT PRIMARY KEY, balance INTEGER NOT NULL);
///                   INSERT INTO accounts VALUES ('a1', 0);")?;
/// // The fields that make the message what it is, not its wire bytes: a producer that
/// // re-serializes a retry (another key order, other whitespace) sends the same message.
/// let (account, amount) = ("a1", 5_i64);
/// let fingerprint = Fingerprint::builder()
///     .bytes(account.as_bytes())
///     .bytes(&amount.to_be_bytes())
///     .finish();
/// for _delivery in 0..2 {
///     let tx = db.transaction_with_behavior(TransactionBehavior::Immediate)?;
///     match inbox::receive(&tx, "ledger", "m-1", fingerprint)? {
///         Receipt::New => {
///             tx.execute("UPDATE accounts SET balance = balance + 5 WHERE id = 'a1'", [])?;
///             tx.commit()?; // then acknowledge
///         }
///         Receipt::Duplicate | Receipt::Mismatch => {} // acknowledge (log a mismatch)
///         Receipt::InFlight => {} // reject with requeue
///     }
/// }
/// let balance: i64 = db.query_row("SELECT balance FROM accounts", [], |r| r.get(0))?;
/// assert_eq!(balance, 5);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn receive(
    tx: &Connection,
    consumer: &str,
    message_id: &str,
    fingerprint: Fingerprint,
) -> Result<Receipt, InboxError> {
    check(consumer, message_id)?;
    if tx.is_autocommit() {
        // The record would commit at once, before the change it records.
        return Err(InboxError::InvalidInput(
            "receive runs in the transaction that applies the message; this connection is \
             in none"
                .into(),
        ));
    }
    let fp = fingerprint.to_bytes();
    // From its INSERT on, this transaction holds the write lock: no one can delete the
    // row before the read.
    let mut receiving = Receiving::new(consumer, message_id, fingerprint, Vanished::Corrupt);
    loop {
        match receiving.next() {
            Step::Answer(receipt) => return Ok(receipt),
            Step::Claim => match tx.execute(CLAIM, params![consumer, message_id, &fp[..]]) {
                Ok(1) => receiving.claimed(Claimed::Inserted),
                Ok(_) => receiving.claimed(Claimed::Exists),
                Err(e) if is_busy(&e) => receiving.conflicted(),
                Err(e) => return Err(database(e)),
            },
            Step::Read => {
                let stored = tx
                    .query_row(READ, params![consumer, message_id], |row| {
                        Ok(match row.get_ref(0)? {
                            ValueRef::Blob(b) => Ok(b.to_vec()),
                            // Not a blob at all: as unreadable as a blob of the wrong length.
                            other => Err(other.data_type()),
                        })
                    })
                    .optional();
                match stored {
                    Ok(Some(Ok(bytes))) => receiving.read(Some(&bytes))?,
                    Ok(Some(Err(held))) => {
                        let why = format_args!("the fingerprint is not a blob (it holds {held})");
                        return Err(receiving.unreadable(why));
                    }
                    Ok(None) => receiving.read(None)?,
                    Err(e) if is_busy(&e) => receiving.conflicted(),
                    Err(e) => return Err(database(e)),
                }
            }
        }
    }
}

/// Deletes up to `limit` records received before `cutoff` (oldest first) and returns
/// how many it deleted: call it until it returns less than `limit`, with a pause between
/// batches so that consumers get the write lock in between. `limit` 0 deletes nothing.
/// Take `cutoff` from [`Purger::cutoff`]; purge nothing when it is `None`.
pub fn purge(conn: &Connection, cutoff: SystemTime, limit: usize) -> Result<usize, InboxError> {
    if limit == 0 {
        return Ok(0);
    }
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    conn.execute(PURGE, params![to_micros(cutoff), limit]).map_err(database)
}

fn database(e: rusqlite::Error) -> InboxError {
    InboxError::Database(Box::new(e))
}
