//! The transactional outbox in SQLite, on your own `rusqlite` transaction: [`enqueue`]
//! writes a message in the transaction that makes the business change, so both commit
//! together and a rollback leaves neither; a relay ([`Storage`] with
//! [`relay_loop`]) claims due rows, publishes them and
//! marks them. See [`idemcache_sql::outbox`] for the flow.
//!
//! Invariant: a row is leased by one claim at a time, under a token higher than every
//! earlier claim's of the row, and every mark is fenced by that token. SQLite runs one
//! writer at a time: [`claim_due`] is one `UPDATE ... RETURNING` in a `BEGIN IMMEDIATE`
//! transaction, so two relays' claims are serialized (the second waits up to the busy
//! timeout for the write lock) and never lease one row together.
//!
//! The table, the due rule (pending or lapsed, and no earlier undelivered row of its
//! aggregate key), the times (`created_at` SQLite's clock, the others the relay's `now`)
//! and the dead rows are PostgreSQL's, described in [`idemcache_sql::outbox::postgres`].
//! SQLite has no notification: relays poll.
//!
//! ```
//! use idemcache_sqlite::outbox::{self, OutboxMessage, Mark};
//! use idemcache_sqlite::rusqlite::{Connection, TransactionBehavior};
//! use std::time::{Duration, SystemTime};
//!
//! let mut db = Connection::open_in_memory()?;
//! outbox::ensure_schema(&db)?;
//! db.execute_batch("CREATE TABLE orders (id INTEGER PRIMARY KEY, total INTEGER NOT NULL);")?;
//!
//! // The order and the message announcing it: one commit.
//! let tx = db.transaction_with_behavior(TransactionBehavior::Immediate)?;
//! tx.execute("INSERT INTO orders VALUES (42, 1000)", [])?;
//! outbox::enqueue(&tx, &OutboxMessage::new("order-42", "orders.created", &b"{\"id\":42}"[..]))?;
//! tx.commit()?;
//!
//! // A relay: claim, publish (here: nothing), mark delivered under the claim's token.
//! let now = SystemTime::now();
//! let batch = outbox::claim_due(&db, 10, Duration::from_secs(30), now)?;
//! assert_eq!(batch.claimed.len(), 1);
//! let lease = &batch.claimed[0].lease;
//! assert_eq!(outbox::mark_delivered(&db, lease, now)?, Mark::Applied);
//! assert_eq!(outbox::mark_delivered(&db, lease, now)?, Mark::Stale); // once only
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use rusqlite::types::ValueRef;
use rusqlite::{params, Connection, OptionalExtension, Row, Transaction, TransactionBehavior};

use idemcache::store::encoding::{micros, to_micros};
use idemcache_sql::outbox::decode::{self, RawRow};
use idemcache_sql::outbox::{check_claim, clip_error};

// The outbox's vocabulary and relay (`idemcache-sql`'s), re-exported so that one path
// imports the whole outbox of this driver.
pub use idemcache_sql::outbox::{
    purge_loop, relay_batch, relay_loop, Batch, BatchReport, Claimed, Lease, Mark, OutboxAdmin,
    OutboxError, OutboxMessage, OutboxRow, OutboxStorage, PublishError, Publisher, RelaySettings,
    Retry,
};

/// The outbox's table, created by [`ensure_schema`] (idempotent): PostgreSQL's columns
/// ([`idemcache_sql::outbox::postgres::SCHEMA`]) in SQLite's types, text compared byte
/// for byte (`BINARY`).
pub const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS idemcache_outbox (
    seq             INTEGER PRIMARY KEY,
    message_id      TEXT NOT NULL UNIQUE,
    topic           TEXT NOT NULL,
    payload         BLOB NOT NULL,
    headers         BLOB NOT NULL,
    aggregate_key   TEXT,
    state           INTEGER NOT NULL,
    attempts        INTEGER NOT NULL,
    next_attempt_at INTEGER NOT NULL,
    lease_until     INTEGER,
    token           INTEGER NOT NULL,
    last_error      TEXT,
    created_at      INTEGER NOT NULL,
    delivered_at    INTEGER
);
CREATE INDEX IF NOT EXISTS idemcache_outbox_due ON idemcache_outbox (next_attempt_at)
    WHERE state IN (0, 1);
CREATE INDEX IF NOT EXISTS idemcache_outbox_key ON idemcache_outbox (aggregate_key, seq)
    WHERE aggregate_key IS NOT NULL AND state <> 2;
CREATE INDEX IF NOT EXISTS idemcache_outbox_delivered ON idemcache_outbox (delivered_at)
    WHERE state = 2;
CREATE INDEX IF NOT EXISTS idemcache_outbox_dead ON idemcache_outbox (seq) WHERE state = 3;
";

const COLUMNS: &str = "seq, message_id, topic, payload, headers, aggregate_key, state, \
                       attempts, next_attempt_at, lease_until, token, last_error, \
                       created_at, delivered_at";

const ENQUEUE: &str = "
INSERT INTO idemcache_outbox (message_id, topic, payload, headers, aggregate_key, state,
                              attempts, next_attempt_at, token, created_at)
VALUES (?1, ?2, ?3, ?4, ?5, 0, 0, 0, 0, CAST(unixepoch('subsec') * 1000000 AS INTEGER))";

const CLAIM: &str = "
UPDATE idemcache_outbox
SET state = 1, token = token + 1, lease_until = ?3, next_attempt_at = ?3
WHERE seq IN (
    SELECT c.seq FROM idemcache_outbox AS c
    WHERE c.state IN (0, 1) AND c.next_attempt_at <= ?1
      AND (c.aggregate_key IS NULL OR NOT EXISTS (
          SELECT 1 FROM idemcache_outbox AS e
          WHERE e.aggregate_key = c.aggregate_key AND e.seq < c.seq AND e.state <> 2))
    ORDER BY c.seq LIMIT ?2)
RETURNING seq, message_id, topic, payload, headers, aggregate_key, state, attempts,
          next_attempt_at, lease_until, token, last_error, created_at, delivered_at";

const BEGIN_ATTEMPT: &str = "
UPDATE idemcache_outbox
SET attempts = CASE WHEN attempts BETWEEN 0 AND 9223372036854775806 THEN attempts + 1 ELSE -1 END
WHERE message_id = ?1 AND token = ?2 AND state = 1";

const DELIVERED: &str = "
UPDATE idemcache_outbox SET state = 2, delivered_at = ?3, lease_until = NULL
WHERE message_id = ?1 AND token = ?2 AND state = 1";

const FAILED: &str = "
UPDATE idemcache_outbox SET state = ?3, next_attempt_at = ?4, lease_until = NULL, last_error = ?5
WHERE message_id = ?1 AND token = ?2 AND state = 1";

const REQUEUE: &str = "
UPDATE idemcache_outbox SET state = 0, attempts = 0, next_attempt_at = 0, lease_until = NULL
WHERE message_id = ?1 AND state = 3";

const PURGE: &str = "
DELETE FROM idemcache_outbox WHERE seq IN (
    SELECT seq FROM idemcache_outbox WHERE state = 2 AND delivered_at < ?1
    ORDER BY delivered_at LIMIT ?2)";

/// Creates the outbox's table and indexes if they do not exist. Safe to run on every
/// start, and from several processes (SQLite serializes the DDL).
pub fn ensure_schema(conn: &Connection) -> Result<(), OutboxError> {
    conn.execute_batch(SCHEMA).map_err(database)
}

/// Writes `message` inside `tx`, the transaction of the change it announces: pending,
/// due at once. Checked first by [`OutboxMessage::check`]; a row with the same message
/// id is [`OutboxError::Duplicate`] (the statement failed, `tx` is still usable).
pub fn enqueue(tx: &Transaction<'_>, message: &OutboxMessage) -> Result<(), OutboxError> {
    message.check()?;
    let inserted = tx.execute(
        ENQUEUE,
        params![
            message.id(),
            message.topic(),
            &message.payload()[..],
            message.encoded_headers(),
            message.aggregate_key(),
        ],
    );
    match inserted {
        Ok(_) => Ok(()),
        Err(e) if crate::is_unique_violation(&e) => {
            Err(OutboxError::Duplicate(message.id().to_owned()))
        }
        Err(e) => Err(database(e)),
    }
}

/// Leases up to `batch` due rows until `now + lease`, oldest first, each under a new
/// fencing token, in a `BEGIN IMMEDIATE` transaction of its own on `conn` (which must
/// not be in one already). Rows that cannot be read stay leased and are reported in
/// [`Batch::unreadable`].
pub fn claim_due(
    conn: &Connection,
    batch: usize,
    lease: Duration,
    now: SystemTime,
) -> Result<Batch, OutboxError> {
    check_claim(batch, lease)?;
    let now_us = to_micros(now);
    let until = now_us.saturating_add(micros(lease));
    let limit = i64::try_from(batch).unwrap_or(i64::MAX);
    let tx = Transaction::new_unchecked(conn, TransactionBehavior::Immediate).map_err(database)?;
    let rows = {
        let mut claim = tx.prepare_cached(CLAIM).map_err(database)?;
        let rows = claim.query_map(params![now_us, limit, until], raw).map_err(database)?;
        rows.collect::<Result<Vec<_>, _>>().map_err(database)?
    };
    tx.commit().map_err(database)?;
    Ok(decode::batch(rows))
}

/// Counts an attempt of the row as its publish begins, if `lease` is still its lease:
/// [`Mark::Stale`] (nothing changed) otherwise.
pub fn begin_attempt(conn: &Connection, lease: &Lease) -> Result<Mark, OutboxError> {
    let token = decode::lease_token(lease)?;
    let changed =
        conn.execute(BEGIN_ATTEMPT, params![lease.message_id, token]).map_err(database)?;
    Ok(decode::mark(changed as u64))
}

/// Marks the row delivered at `now`, if `lease` is still its lease: [`Mark::Stale`]
/// (nothing changed) otherwise.
pub fn mark_delivered(
    conn: &Connection,
    lease: &Lease,
    now: SystemTime,
) -> Result<Mark, OutboxError> {
    let token = decode::lease_token(lease)?;
    let changed = conn
        .execute(DELIVERED, params![lease.message_id, token, to_micros(now)])
        .map_err(database)?;
    Ok(decode::mark(changed as u64))
}

/// Marks the row failed with `error` (clipped), if `lease` is still its lease: pending
/// again after `retry`'s backoff, or dead after its last attempt. [`Mark::Stale`]
/// (nothing changed) otherwise.
pub fn mark_failed(
    conn: &Connection,
    lease: &Lease,
    error: &str,
    now: SystemTime,
    retry: &Retry,
) -> Result<Mark, OutboxError> {
    let token = decode::lease_token(lease)?;
    let (state, due) = decode::failed_as(lease, now, retry);
    let changed = conn
        .execute(FAILED, params![lease.message_id, token, state.code(), due, &*clip_error(error)])
        .map_err(database)?;
    Ok(decode::mark(changed as u64))
}

/// Up to `limit` dead rows, oldest first.
pub fn list_dead(conn: &Connection, limit: usize) -> Result<Vec<OutboxRow>, OutboxError> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let sql =
        format!("SELECT {COLUMNS} FROM idemcache_outbox WHERE state = 3 ORDER BY seq LIMIT ?1");
    let mut read = conn.prepare_cached(&sql).map_err(database)?;
    let rows = read.query_map(params![limit], raw).map_err(database)?;
    let rows = rows.collect::<Result<Vec<_>, _>>().map_err(database)?;
    rows.into_iter().map(|r| decode::row(r).map(|(_, row)| row)).collect()
}

/// The row of `message_id`, in any state, or `None`.
pub fn inspect(conn: &Connection, message_id: &str) -> Result<Option<OutboxRow>, OutboxError> {
    let sql = format!("SELECT {COLUMNS} FROM idemcache_outbox WHERE message_id = ?1");
    let found = conn.query_row(&sql, params![message_id], raw).optional().map_err(database)?;
    found.map(|r| decode::row(r).map(|(_, row)| row)).transpose()
}

/// Makes a dead row pending again, due at once, its attempts reset: `true` if
/// `message_id` was dead, `false` otherwise (nothing changed).
pub fn requeue(conn: &Connection, message_id: &str) -> Result<bool, OutboxError> {
    Ok(conn.execute(REQUEUE, params![message_id]).map_err(database)? == 1)
}

/// Deletes up to `limit` rows delivered before `cutoff` (oldest first) and returns how
/// many: call it until it returns less than `limit`. `limit` 0 deletes nothing.
pub fn purge_delivered(
    conn: &Connection,
    cutoff: SystemTime,
    limit: usize,
) -> Result<usize, OutboxError> {
    if limit == 0 {
        return Ok(0);
    }
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    conn.execute(PURGE, params![to_micros(cutoff), limit]).map_err(database)
}

/// A relay's storage over one connection of its own (its own, since a claim opens a
/// transaction on it). Each operation runs at once on the calling thread (SQLite is
/// synchronous), so its future is ready when first polled.
#[derive(Debug)]
pub struct Storage {
    conn: Mutex<Connection>,
}

impl Storage {
    /// The storage over `conn` (the schema is not created: [`ensure_schema`]).
    pub fn new(conn: Connection) -> Storage {
        Storage { conn: Mutex::new(conn) }
    }

    /// The connection, for the operations a relay does not run ([`list_dead`],
    /// [`requeue`], [`purge_delivered`]).
    pub fn connection(&self) -> MutexGuard<'_, Connection> {
        // A panic elsewhere while holding it leaves the connection as usable as before.
        self.conn.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl OutboxStorage for Storage {
    fn claim_due(
        &self,
        batch: usize,
        lease: Duration,
        now: SystemTime,
    ) -> impl std::future::Future<Output = Result<Batch, OutboxError>> + Send {
        std::future::ready(claim_due(&self.connection(), batch, lease, now))
    }

    fn begin_attempt(
        &self,
        lease: &Lease,
    ) -> impl std::future::Future<Output = Result<Mark, OutboxError>> + Send {
        std::future::ready(begin_attempt(&self.connection(), lease))
    }

    /// Both statements in turn on the connection (in-process: no round trip to save).
    fn mark_delivered_and_begin(
        &self,
        lease: &Lease,
        now: SystemTime,
        next: &Lease,
    ) -> impl std::future::Future<Output = (Result<Mark, OutboxError>, Result<Mark, OutboxError>)> + Send
    {
        let conn = self.connection();
        std::future::ready((mark_delivered(&conn, lease, now), begin_attempt(&conn, next)))
    }

    fn mark_delivered(
        &self,
        lease: &Lease,
        now: SystemTime,
    ) -> impl std::future::Future<Output = Result<Mark, OutboxError>> + Send {
        std::future::ready(mark_delivered(&self.connection(), lease, now))
    }

    fn mark_failed(
        &self,
        lease: &Lease,
        error: &str,
        now: SystemTime,
        retry: &Retry,
    ) -> impl std::future::Future<Output = Result<Mark, OutboxError>> + Send {
        std::future::ready(mark_failed(&self.connection(), lease, error, now, retry))
    }
}

impl OutboxAdmin for Storage {
    fn list_dead(
        &self,
        limit: usize,
    ) -> impl std::future::Future<Output = Result<Vec<OutboxRow>, OutboxError>> + Send {
        std::future::ready(list_dead(&self.connection(), limit))
    }

    fn inspect(
        &self,
        message_id: &str,
    ) -> impl std::future::Future<Output = Result<Option<OutboxRow>, OutboxError>> + Send {
        std::future::ready(inspect(&self.connection(), message_id))
    }

    fn requeue(
        &self,
        message_id: &str,
    ) -> impl std::future::Future<Output = Result<bool, OutboxError>> + Send {
        std::future::ready(requeue(&self.connection(), message_id))
    }

    fn purge_delivered(
        &self,
        cutoff: SystemTime,
        limit: usize,
    ) -> impl std::future::Future<Output = Result<usize, OutboxError>> + Send {
        std::future::ready(purge_delivered(&self.connection(), cutoff, limit))
    }
}

/// One row's columns as stored; a column of an unexpected type is read as a value
/// `decode` refuses (a state of -1, an id that is not UTF-8), so that it becomes
/// `Corrupt` naming the row rather than a driver error.
fn raw(row: &Row<'_>) -> rusqlite::Result<RawRow> {
    let bytes = |i: usize| -> rusqlite::Result<Option<Vec<u8>>> {
        Ok(match row.get_ref(i)? {
            ValueRef::Text(b) | ValueRef::Blob(b) => Some(b.to_vec()),
            ValueRef::Null => None,
            // A number where text belongs: not UTF-8 text, so decode says it is corrupt.
            ValueRef::Integer(_) | ValueRef::Real(_) => Some(vec![0xff]),
        })
    };
    let int = |i: usize| -> rusqlite::Result<Option<i64>> {
        Ok(match row.get_ref(i)? {
            ValueRef::Integer(n) => Some(n),
            ValueRef::Null => None,
            ValueRef::Real(_) | ValueRef::Text(_) | ValueRef::Blob(_) => Some(-1),
        })
    };
    Ok(RawRow {
        seq: int(0)?.unwrap_or(-1),
        message_id: bytes(1)?.unwrap_or_else(|| vec![0xff]),
        topic: bytes(2)?.unwrap_or_else(|| vec![0xff]),
        payload: bytes(3)?.unwrap_or_default(),
        headers: bytes(4)?.unwrap_or_default(),
        aggregate_key: bytes(5)?,
        state: int(6)?.unwrap_or(-1),
        attempts: int(7)?.unwrap_or(-1),
        next_attempt_at: int(8)?.unwrap_or(0),
        lease_until: int(9)?,
        token: int(10)?.unwrap_or(-1),
        last_error: bytes(11)?,
        created_at: int(12)?.unwrap_or(0),
        delivered_at: int(13)?,
    })
}

fn database(e: rusqlite::Error) -> OutboxError {
    OutboxError::Database(Box::new(e))
}
