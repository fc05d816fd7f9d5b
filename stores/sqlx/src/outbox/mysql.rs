//! The outbox on a sqlx MySQL or MariaDB transaction (InnoDB; MySQL 8.0+ or MariaDB
//! 10.6+ for `SKIP LOCKED`).
//!
//! Invariant: the one of [`idemcache_sql::outbox::mysql`], whose statements this module
//! runs: a claim is a short READ COMMITTED transaction that picks due rows
//! `FOR UPDATE SKIP LOCKED`, leases them under a new token each and reads them back, so
//! two relays never lease one row and never wait on each other; every mark is fenced by
//! the token. MySQL has no notification: relays poll.

use std::time::{Duration, SystemTime};

use sqlx::mysql::{MySqlDatabaseError, MySqlRow};
use sqlx::{AssertSqlSafe, Connection, Executor, MySql, MySqlConnection, MySqlPool, Transaction};

use idemcache::store::encoding::{micros, to_micros};
use idemcache_sql::outbox::decode::{self, RawRow};
use idemcache_sql::outbox::mysql::{
    claim_lease, claim_read, BEGIN_ATTEMPT, CLAIM_ISOLATION, CLAIM_PICK, DELIVERED, ENQUEUE,
    FAILED, INSPECT, KEY_LOCK, LIST_DEAD, PURGE, REQUEUE,
};
use idemcache_sql::outbox::{check_claim, clip_error};

use idemcache::store::unique::MYSQL_DUP_ENTRY;

use super::{
    database, raw_row, Batch, Lease, Mark, OutboxAdmin, OutboxError, OutboxMessage, OutboxRow,
    OutboxStorage, Retry,
};

pub use idemcache_sql::outbox::mysql::SCHEMA;

/// Creates the outbox's tables (and their indexes) if they do not exist: safe to run on
/// every start and from several processes.
pub async fn ensure_schema<'e, E>(executor: E) -> Result<(), OutboxError>
where
    E: Executor<'e, Database = MySql>,
{
    executor.execute(sqlx::raw_sql(SCHEMA)).await.map(drop).map_err(database)
}

/// Writes `message` inside `tx`, the transaction of the change it announces. A row with
/// the same message id is [`OutboxError::Duplicate`] (error 1062 fails the statement
/// only: `tx` stays usable).
pub async fn enqueue(
    tx: &mut Transaction<'_, MySql>,
    message: &OutboxMessage,
) -> Result<(), OutboxError> {
    message.check()?;
    if let Some(key) = message.aggregate_key() {
        // Waits while another open transaction enqueues this key (see KEY_LOCK).
        let locked = sqlx::query(KEY_LOCK)
            .bind(key.as_bytes())
            .fetch_optional(&mut **tx)
            .await
            .map_err(database)?;
        if locked.is_none() {
            return Err(OutboxError::Database(
                "idemcache_outbox_keys has no rows to lock a key with: run ensure_schema".into(),
            ));
        }
    }
    let done = sqlx::query(ENQUEUE)
        .bind(id(message.id()))
        .bind(message.topic().as_bytes())
        .bind(&message.payload()[..])
        .bind(message.encoded_headers())
        .bind(message.aggregate_key().map(str::as_bytes))
        .execute(&mut **tx)
        .await;
    match done {
        Ok(_) => Ok(()),
        Err(e) if number(&e) == Some(MYSQL_DUP_ENTRY) => {
            Err(OutboxError::Duplicate(message.id().to_owned()))
        }
        Err(e) => Err(database(e)),
    }
}

/// Most rows leased (and read back) by one statement of a claim: well under the 65,535
/// placeholders a MySQL statement takes.
const CLAIM_CHUNK: usize = 10_000;

/// Leases up to `batch` due rows until `now + lease`, oldest first, each under a new
/// fencing token, skipping rows another claim holds: a READ COMMITTED transaction of its
/// own on `conn` (which must not be in one). Four round trips (two more for each further
/// 10,000 rows), three with nothing due.
pub async fn claim_due(
    conn: &mut MySqlConnection,
    batch: usize,
    lease: Duration,
    now: SystemTime,
) -> Result<Batch, OutboxError> {
    check_claim(batch, lease)?;
    let now_us = to_micros(now);
    let until = now_us.saturating_add(micros(lease));
    conn.execute(CLAIM_ISOLATION).await.map_err(database)?;
    let mut tx = conn.begin().await.map_err(database)?;
    let picked: Vec<i64> = sqlx::query_scalar(CLAIM_PICK)
        .bind(now_us)
        .bind(limit(batch))
        .fetch_all(&mut *tx)
        .await
        .map_err(database)?;
    if picked.is_empty() {
        tx.commit().await.map_err(database)?;
        return Ok(Batch::default());
    }
    // A statement takes at most 65,535 placeholders: lease and read in chunks, all in the
    // one transaction, so that any batch `RelaySettings` takes can be claimed.
    let mut rows = Vec::with_capacity(picked.len());
    for chunk in picked.chunks(CLAIM_CHUNK) {
        let mut leasing =
            sqlx::query(AssertSqlSafe(claim_lease(chunk.len()))).bind(until).bind(until);
        for seq in chunk {
            leasing = leasing.bind(seq);
        }
        leasing.execute(&mut *tx).await.map_err(database)?;
        let mut reading = sqlx::query(AssertSqlSafe(claim_read(chunk.len())));
        for seq in chunk {
            reading = reading.bind(seq);
        }
        rows.extend(reading.fetch_all(&mut *tx).await.map_err(database)?);
    }
    tx.commit().await.map_err(database)?;
    Ok(decode::claimed_batch(rows.iter().map(raw)))
}

/// Counts an attempt of the row as its publish begins, if `lease` is still its lease.
pub async fn begin_attempt<'e, E>(executor: E, lease: &Lease) -> Result<Mark, OutboxError>
where
    E: Executor<'e, Database = MySql>,
{
    let done = sqlx::query(BEGIN_ATTEMPT)
        .bind(id(&lease.message_id))
        .bind(decode::lease_token(lease)?)
        .execute(executor)
        .await
        .map_err(database)?;
    Ok(decode::mark(done.rows_affected()))
}

/// [`mark_delivered`] of `lease`, then [`begin_attempt`] of `next`: two statements on
/// the pool (MySQL has no statement that answers both), each answered as alone.
pub async fn mark_delivered_and_begin(
    pool: &MySqlPool,
    lease: &Lease,
    now: SystemTime,
    next: &Lease,
) -> (Result<Mark, OutboxError>, Result<Mark, OutboxError>) {
    (mark_delivered(pool, lease, now).await, begin_attempt(pool, next).await)
}

/// Marks the row delivered at `now`, if `lease` is still its lease.
pub async fn mark_delivered<'e, E>(
    executor: E,
    lease: &Lease,
    now: SystemTime,
) -> Result<Mark, OutboxError>
where
    E: Executor<'e, Database = MySql>,
{
    let done = sqlx::query(DELIVERED)
        .bind(to_micros(now))
        .bind(id(&lease.message_id))
        .bind(decode::lease_token(lease)?)
        .execute(executor)
        .await
        .map_err(database)?;
    Ok(decode::mark(done.rows_affected()))
}

/// Marks the row failed with `error` (clipped), if `lease` is still its lease: pending
/// after `retry`'s backoff, or dead after its last attempt.
pub async fn mark_failed<'e, E>(
    executor: E,
    lease: &Lease,
    error: &str,
    now: SystemTime,
    retry: &Retry,
) -> Result<Mark, OutboxError>
where
    E: Executor<'e, Database = MySql>,
{
    let (state, due) = decode::failed_as(lease, now, retry);
    let done = sqlx::query(FAILED)
        .bind(state.code())
        .bind(due)
        .bind(clip_error(error).into_owned().into_bytes())
        .bind(id(&lease.message_id))
        .bind(decode::lease_token(lease)?)
        .execute(executor)
        .await
        .map_err(database)?;
    Ok(decode::mark(done.rows_affected()))
}

admin_operations!(MySql);

/// A message id as the table's `VARBINARY` column takes it: its bytes, compared byte
/// for byte.
fn id(message_id: &str) -> &[u8] {
    message_id.as_bytes()
}

/// A count as MySQL's `LIMIT` takes it.
fn limit(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

pool_storage!(MySqlPool, "A relay's and an operator's storage over a sqlx MySQL pool: a claim takes a connection for its transaction, every other operation one for its statement.");

/// The claim on a connection of the pool's, for its transaction.
async fn claim_from_pool(
    pool: &MySqlPool,
    batch: usize,
    lease: Duration,
    now: SystemTime,
) -> Result<Batch, OutboxError> {
    let mut conn = pool.acquire().await.map_err(database)?;
    claim_due(&mut conn, batch, lease, now).await
}

fn raw(row: &MySqlRow) -> Result<RawRow, OutboxError> {
    raw_row!(row, Vec<u8>, std::convert::identity)
}

/// The server's error number of a sqlx error, if it is one.
fn number(e: &sqlx::Error) -> Option<u16> {
    e.as_database_error()?.try_downcast_ref::<MySqlDatabaseError>().map(|m| m.number())
}
