//! The consumer inbox on a sqlx PostgreSQL transaction: the same table and the same two
//! statements as `idemcache_postgres::inbox`, so both crates may share one table.
//!
//! Invariant: [`Receipt::New`] only when this transaction's
//! `INSERT ... ON CONFLICT DO NOTHING` wrote the row; no `receive` waits on another
//! `receive`'s uncommitted record (a `purge` left open in a transaction would hold the
//! rows it deleted: run it on its own, as one short statement).
//!
//! # A second delivery does not wait: the advisory lock
//!
//! In the statement of its `INSERT`, before it, `receive` takes
//! `pg_try_advisory_xact_lock(ADVISORY_LOCK_CLASS, <32-bit hash of (consumer, id)>)`.
//! A transaction that holds the message (uncommitted, or still judging it) holds the
//! lock until it ends, so another delivery meanwhile answers [`Receipt::InFlight`] at
//! once and its transaction stays usable; PostgreSQL releases the lock after the commit
//! is visible, so the next delivery sees the record. Chosen over `SET LOCAL
//! lock_timeout`, whose timeout is an error that aborts the caller's transaction, and
//! which answers only after waiting. A hash collision of two messages only yields a
//! spurious `InFlight` (a redelivery). The two-integer key space is apart from the
//! one-bigint one. Only `receive` should write the table.
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
//! READ COMMITTED (the default) is what the inbox needs: the read after a conflict is a
//! new statement with a new snapshot. Under REPEATABLE READ or SERIALIZABLE, a record
//! another transaction committed after this transaction's snapshot makes the `INSERT`
//! fail with SQLSTATE 40001 ("could not serialize access due to concurrent update"):
//! answered [`Receipt::InFlight`], and **the transaction is aborted**: roll back and let
//! the redelivery decide.
//!
//! # Retention
//!
//! `received_at` is microseconds since the epoch on the server's clock; [`purge`]
//! deletes in bounded batches before a cutoff from a [`Purger`](super::Purger).

use std::time::SystemTime;

use sqlx::{Executor, Postgres, Transaction};

use idemcache::inbox::check;
use idemcache::store::encoding::to_micros;
use idemcache::Fingerprint;

use super::{database, InboxError, Receipt};

macro_rules! schema {
    () => {
        r#"
CREATE TABLE IF NOT EXISTS idemcache_inbox (
    consumer    TEXT COLLATE "C" NOT NULL,
    message_id  TEXT COLLATE "C" NOT NULL,
    fingerprint BYTEA NOT NULL,
    received_at BIGINT NOT NULL,
    PRIMARY KEY (consumer, message_id)
);
CREATE INDEX IF NOT EXISTS idemcache_inbox_received ON idemcache_inbox (received_at);
"#
    };
}

/// The inbox's table, created by [`ensure_schema`] (idempotent); the same as
/// `idemcache_postgres::inbox::SCHEMA`. Keyed by consumer and message id; `COLLATE "C"`
/// compares byte for byte; `fingerprint` is [`Fingerprint::to_bytes`]; `received_at`
/// microseconds since the epoch (server clock), indexed for [`purge`].
pub const SCHEMA: &str = schema!();

/// The first key of the inbox's advisory locks (the same as idemcache-postgres's).
pub const ADVISORY_LOCK_CLASS: i32 = 0x1de0_1b0c;

/// The schema under an advisory lock, as one statement, skipped (no lock taken) when its
/// index exists: `CREATE INDEX IF NOT EXISTS` would take the table's lock before finding
/// the index, waiting for every open transaction on the inbox while later ones queue.
const ENSURE: &str = concat!(
    "DO $idemcache$ BEGIN IF to_regclass('idemcache_inbox_received') IS NULL THEN ",
    "PERFORM pg_advisory_xact_lock(7315993122);",
    schema!(),
    " END IF; END $idemcache$;"
);

/// The lock, then the claim, in one statement; returns (got the lock, rows inserted).
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

const PURGE: &str = "
DELETE FROM idemcache_inbox WHERE (consumer, message_id) IN (
    SELECT consumer, message_id FROM idemcache_inbox
    WHERE received_at < $1::bigint ORDER BY received_at LIMIT $2::bigint
    FOR UPDATE SKIP LOCKED)";

/// SQLSTATE of a serialization failure.
const SERIALIZATION_FAILURE: &str = "40001";

/// Creates the inbox's table and index if they do not exist, under an advisory lock so
/// that several processes may run it at once. Takes a pool, a connection or a
/// transaction (`&mut *tx`).
pub async fn ensure_schema<'e, E>(executor: E) -> Result<(), InboxError>
where
    E: Executor<'e, Database = Postgres>,
{
    executor.execute(sqlx::raw_sql(ENSURE)).await.map(drop).map_err(database)
}

/// Claims (consumer, message id) inside `tx`, the transaction that applies the message:
/// [`Receipt::New`] if this transaction inserted the record (apply, commit, then
/// acknowledge); [`Receipt::Duplicate`] / [`Receipt::Mismatch`] if a committed record (or
/// this transaction's own) has this or another fingerprint; [`Receipt::InFlight`] if
/// another transaction holds the message (at once; `tx` stays usable) or, under snapshot
/// isolation, committed it after `tx`'s snapshot (`tx` is aborted). One round trip, two
/// on a conflict.
pub async fn receive(
    tx: &mut Transaction<'_, Postgres>,
    consumer: &str,
    message_id: &str,
    fingerprint: Fingerprint,
) -> Result<Receipt, InboxError> {
    check(consumer, message_id)?;
    let lock = lock_key(consumer, message_id);
    let fp = fingerprint.to_bytes();
    // A record a concurrent purge deletes between the conflict and the read is claimed
    // again (the lock is still held); twice in a row, the redelivery decides.
    for _ in 0..2 {
        let claimed = sqlx::query_as::<_, (Option<bool>, i64)>(CLAIM)
            .bind(ADVISORY_LOCK_CLASS)
            .bind(lock)
            .bind(consumer)
            .bind(message_id)
            .bind(&fp[..])
            .fetch_one(&mut **tx)
            .await;
        let (got, inserted) = match claimed {
            Ok(row) => row,
            Err(e) if is_serialization_failure(&e) => return Ok(Receipt::InFlight),
            Err(e) => return Err(database(e)),
        };
        match (got, inserted) {
            (Some(true), 1) => return Ok(Receipt::New),
            (Some(true), _) => {}
            _ => return Ok(Receipt::InFlight),
        }
        let stored = sqlx::query_scalar::<_, Vec<u8>>(READ)
            .bind(consumer)
            .bind(message_id)
            .fetch_optional(&mut **tx)
            .await;
        let bytes = match stored {
            Ok(Some(bytes)) => bytes,
            Ok(None) => continue,
            Err(e) if is_serialization_failure(&e) => return Ok(Receipt::InFlight),
            Err(sqlx::Error::ColumnDecode { source, .. }) => {
                let why = format_args!("column fingerprint: {source}");
                return Err(InboxError::corrupt(consumer, message_id, why));
            }
            Err(e) => return Err(database(e)),
        };
        let stored = Fingerprint::try_from(&bytes[..]).map_err(|_| {
            let why = format_args!("the fingerprint is {} bytes, not 16", bytes.len());
            InboxError::corrupt(consumer, message_id, why)
        })?;
        return Ok(if stored == fingerprint { Receipt::Duplicate } else { Receipt::Mismatch });
    }
    Ok(Receipt::InFlight)
}

/// Deletes up to `limit` records received before `cutoff` (oldest first, skipping rows
/// another purge is deleting) and returns how many: call it until it returns less than
/// `limit`. `limit` 0 deletes nothing. Take `cutoff` from
/// [`Purger::cutoff`](super::Purger::cutoff).
pub async fn purge<'e, E>(
    executor: E,
    cutoff: SystemTime,
    limit: usize,
) -> Result<usize, InboxError>
where
    E: Executor<'e, Database = Postgres>,
{
    if limit == 0 {
        return Ok(0);
    }
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let done = sqlx::query(PURGE)
        .bind(to_micros(cutoff))
        .bind(limit)
        .execute(executor)
        .await
        .map_err(database)?;
    Ok(usize::try_from(done.rows_affected()).unwrap_or(usize::MAX))
}

/// The second key of (consumer, message id)'s advisory lock: 32 bits of the XXH3-128
/// digest of the length-prefixed pair (the same as idemcache-postgres's).
pub fn lock_key(consumer: &str, message_id: &str) -> i32 {
    let mut input = Vec::with_capacity(16 + consumer.len() + message_id.len());
    input.extend_from_slice(&(consumer.len() as u64).to_be_bytes());
    input.extend_from_slice(consumer.as_bytes());
    input.extend_from_slice(&(message_id.len() as u64).to_be_bytes());
    input.extend_from_slice(message_id.as_bytes());
    Fingerprint::of(&input).as_u128() as i32
}

fn is_serialization_failure(e: &sqlx::Error) -> bool {
    e.as_database_error().and_then(|d| d.code()).is_some_and(|c| c == SERIALIZATION_FAILURE)
}
