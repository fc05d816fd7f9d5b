//! The consumer inbox in PostgreSQL, on your own tokio-postgres transaction:
//! [`receive`] claims a (consumer, message id) with one
//! `INSERT ... ON CONFLICT DO NOTHING` in the transaction that applies the message, so
//! the record and the business change commit together and a rollback leaves neither.
//! See [`idemcache::inbox`] for the flow (apply on [`Receipt::New`], commit, then
//! acknowledge).
//!
//! Invariant: [`Receipt::New`] is answered only when this transaction's `INSERT` wrote
//! the row; a row already there is read back (never read first, then inserted) to tell
//! [`Receipt::Duplicate`] from [`Receipt::Mismatch`]; and no `receive` waits on another
//! `receive`'s uncommitted record. (A [`purge`] run inside a transaction that stays open
//! holds the rows it deleted, and a redelivery of one of them waits for it: run `purge`
//! on its own, as one short statement, not inside a long transaction.)
//!
//! # A second delivery does not wait: the advisory lock
//!
//! Before its `INSERT`, `receive` takes `pg_try_advisory_xact_lock` on a 32-bit hash of
//! (consumer, message id), in the same statement. A transaction holding an uncommitted
//! record of the message holds that lock until it commits or rolls back, so a second
//! delivery meanwhile is answered [`Receipt::InFlight`] at once, and its transaction
//! stays usable. Without it the `INSERT` would wait on the uncommitted row for the first
//! transaction's whole run. (The other bound, `SET LOCAL lock_timeout`, was not chosen:
//! its timeout is an error that aborts the caller's transaction, and it answers only
//! after waiting the timeout.) The lock is released by PostgreSQL itself at the end of
//! the transaction, after its commit is visible, so the next delivery's `INSERT` sees the
//! committed record.
//!
//! The lock keys are the two-integer form, whose key space is apart from the one-bigint
//! form (`pg_advisory_lock(bigint)`, as idemcache's store uses): the first integer names
//! the inbox (`0x1de0_1b0c`), the second is the hash. Two messages whose hashes collide
//! only share the lock: the second of them answers a spurious `InFlight` while the first
//! is in flight, and is redelivered. Only `receive` should write the inbox's table; a
//! row inserted otherwise, uncommitted, would still be waited on.
//! Advisory locks belong to the database, not to a schema: inbox tables in several
//! schemas of one database share them, so two schemas receiving the same (consumer,
//! message id) at the same moment make one of them answer a spurious `InFlight`.
//!
//! The lock is held to the end of the transaction whatever `receive` answered, so a
//! delivery that meets a transaction still judging the same message (one answered
//! `Duplicate` that has not ended yet) is `InFlight` too: end a duplicate's transaction
//! at once (roll it back); the redelivery after it is `Duplicate`.
//!
//! # Isolation
//!
//! READ COMMITTED (PostgreSQL's default) is what the inbox needs: the read after a
//! conflict is a new statement, with a new snapshot, so it sees the record the
//! conflict found. Under REPEATABLE READ or SERIALIZABLE, a record committed by another
//! transaction after this transaction's snapshot was taken makes the
//! `INSERT ... ON CONFLICT DO NOTHING` fail with a serialization failure (SQLSTATE
//! 40001: "could not serialize access due to concurrent update"): `receive` answers
//! [`Receipt::InFlight`] then, and **the transaction is aborted** (PostgreSQL refuses
//! every further statement in it): roll back and let the redelivery decide, as for any
//! `InFlight`. A record committed before the snapshot is seen as usual.
//!
//! # Retention
//!
//! `received_at` is microseconds since the Unix epoch on the server's clock
//! (`clock_timestamp()` at the `INSERT`). [`purge`] deletes records received before a
//! cutoff in bounded batches; take the cutoff from an [`idemcache::inbox::Purger`].

use std::time::SystemTime;

use tokio_postgres::error::SqlState;
use tokio_postgres::{GenericClient, Transaction};

use idemcache::inbox::check;
use idemcache::store::encoding::to_micros;
use idemcache::Fingerprint;

/// The inbox's vocabulary from the core, re-exported for one-path imports.
pub use idemcache::inbox::{InboxError, KnownMessages, Purger, Receipt, Retention, RetentionError};

/// The inbox's table, created by [`ensure_schema`] (idempotent). Keyed by consumer and
/// message id, so several consumers of one message each record it; `COLLATE "C"`
/// compares byte for byte (`"M-1"`, `"m-1"` and `"m-1 "` are three messages).
/// `fingerprint` is [`Fingerprint::to_bytes`]; `received_at` is microseconds since the
/// epoch on the server's clock, indexed for [`purge`].
pub const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS idemcache_inbox (
    consumer    TEXT COLLATE "C" NOT NULL,
    message_id  TEXT COLLATE "C" NOT NULL,
    fingerprint BYTEA NOT NULL,
    received_at BIGINT NOT NULL,
    PRIMARY KEY (consumer, message_id)
);
CREATE INDEX IF NOT EXISTS idemcache_inbox_received ON idemcache_inbox (received_at);
"#;

/// The first key of the inbox's advisory locks: names the inbox in `pg_locks`.
pub const ADVISORY_LOCK_CLASS: i32 = 0x1de0_1b0c;

/// Serializes concurrent schema creation (concurrent `CREATE ... IF NOT EXISTS` can
/// still collide on the catalog's unique indexes): a one-bigint key, like the store's.
const SCHEMA_LOCK: i64 = 7_315_993_122;

/// The lock, then the claim, in one statement (one round trip on the happy path): the
/// `INSERT` reads its one row from `held`, so it runs only after the lock was taken,
/// and inserts nothing if it was not. Returns (got the lock, rows inserted).
const CLAIM: &str = "
WITH held AS (SELECT pg_try_advisory_xact_lock($1::int4, $2::int4) AS got),
claimed AS (
    INSERT INTO idemcache_inbox (consumer, message_id, fingerprint, received_at)
    SELECT $3::text, $4::text, $5::bytea,
           (extract(epoch FROM clock_timestamp()) * 1000000)::bigint
    FROM held WHERE got
    ON CONFLICT (consumer, message_id) DO NOTHING
    RETURNING 1)
SELECT (SELECT got FROM held), (SELECT count(*) FROM claimed)";

const READ: &str =
    "SELECT fingerprint FROM idemcache_inbox WHERE consumer = $1::text AND message_id = $2::text";

/// Oldest first, by key; `SKIP LOCKED` so that two purgers never wait on each other.
const PURGE: &str = "
DELETE FROM idemcache_inbox WHERE (consumer, message_id) IN (
    SELECT consumer, message_id FROM idemcache_inbox
    WHERE received_at < $1::bigint ORDER BY received_at LIMIT $2::bigint
    FOR UPDATE SKIP LOCKED)";

/// Creates the inbox's table and index if they do not exist, holding an advisory lock
/// so that several processes may run it at once; when they exist it takes no lock at all
/// (a starting consumer never waits for the others' open transactions). One multi-statement query, so it is
/// one transaction of its own on a client (`&client`, or `&**object` for a deadpool
/// object), or part of yours on a [`Transaction`].
pub async fn ensure_schema<C: GenericClient + Sync>(client: &C) -> Result<(), InboxError> {
    let sql = crate::schema_once(SCHEMA_LOCK, "idemcache_inbox_received", SCHEMA);
    client.batch_execute(&sql).await.map_err(database)
}

/// Claims (consumer, message id) inside `tx`, the transaction that applies the message:
/// [`Receipt::New`] if this transaction inserted the record (apply, commit, then
/// acknowledge), [`Receipt::Duplicate`] or [`Receipt::Mismatch`] if a committed record
/// (or this transaction's own) is there with this or another fingerprint,
/// [`Receipt::InFlight`] if another transaction holds the message (see the module docs:
/// at once, with `tx` still usable) or, under snapshot isolation, committed it after
/// `tx`'s snapshot (`tx` is then aborted). Consumer and id are checked by
/// [`idemcache::inbox::check`]. One round trip, two on a conflict.
pub async fn receive(
    tx: &Transaction<'_>,
    consumer: &str,
    message_id: &str,
    fingerprint: Fingerprint,
) -> Result<Receipt, InboxError> {
    check(consumer, message_id)?;
    let lock = lock_key(consumer, message_id);
    let fp = fingerprint.to_bytes();
    // A record that a concurrent purge deletes between the conflict and the read is
    // claimed again (this transaction still holds the lock); twice in a row, the inbox
    // cannot judge the message and lets the redelivery decide.
    for _ in 0..2 {
        let claimed = tx
            .query_one(CLAIM, &[&ADVISORY_LOCK_CLASS, &lock, &consumer, &message_id, &&fp[..]])
            .await;
        let row = match claimed {
            Ok(row) => row,
            Err(e) if e.code() == Some(&SqlState::T_R_SERIALIZATION_FAILURE) => {
                return Ok(Receipt::InFlight)
            }
            Err(e) => return Err(database(e)),
        };
        let got: Option<bool> = row.try_get(0).map_err(database)?;
        let inserted: i64 = row.try_get(1).map_err(database)?;
        match (got, inserted) {
            (Some(true), 1) => return Ok(Receipt::New),
            (Some(true), _) => {}
            _ => return Ok(Receipt::InFlight),
        }
        let stored = match tx.query_opt(READ, &[&consumer, &message_id]).await {
            Ok(stored) => stored,
            Err(e) if e.code() == Some(&SqlState::T_R_SERIALIZATION_FAILURE) => {
                return Ok(Receipt::InFlight)
            }
            Err(e) => return Err(database(e)),
        };
        let Some(row) = stored else { continue };
        let bytes: &[u8] = row.try_get(0).map_err(|e| {
            InboxError::corrupt(consumer, message_id, format_args!("column fingerprint: {e}"))
        })?;
        let stored = Fingerprint::try_from(bytes).map_err(|_| {
            InboxError::corrupt(
                consumer,
                message_id,
                format_args!("the fingerprint is {} bytes, not 16", bytes.len()),
            )
        })?;
        return Ok(if stored == fingerprint { Receipt::Duplicate } else { Receipt::Mismatch });
    }
    Ok(Receipt::InFlight)
}

/// Deletes up to `limit` records received before `cutoff` (oldest first), skipping rows
/// another purge is deleting, and returns how many it deleted: call it until it returns
/// less than `limit`. `limit` 0 deletes nothing. Take `cutoff` from
/// [`Purger::cutoff`]; purge nothing when it is `None`. (Deleted rows leave dead tuples
/// until autovacuum; small batches let it keep up.)
pub async fn purge<C: GenericClient + Sync>(
    client: &C,
    cutoff: SystemTime,
    limit: usize,
) -> Result<usize, InboxError> {
    if limit == 0 {
        return Ok(0);
    }
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let deleted = client.execute(PURGE, &[&to_micros(cutoff), &limit]).await.map_err(database)?;
    Ok(usize::try_from(deleted).unwrap_or(usize::MAX))
}

/// The second key of (consumer, message id)'s advisory lock: 32 bits of the XXH3-128
/// digest of the pair, length-prefixed so that no two pairs share an input.
pub fn lock_key(consumer: &str, message_id: &str) -> i32 {
    let mut input = Vec::with_capacity(16 + consumer.len() + message_id.len());
    input.extend_from_slice(&(consumer.len() as u64).to_be_bytes());
    input.extend_from_slice(consumer.as_bytes());
    input.extend_from_slice(&(message_id.len() as u64).to_be_bytes());
    input.extend_from_slice(message_id.as_bytes());
    Fingerprint::of(&input).as_u128() as i32
}

fn database(e: tokio_postgres::Error) -> InboxError {
    InboxError::Database(Box::new(e))
}
