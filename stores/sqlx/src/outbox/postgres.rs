//! The outbox on a sqlx PostgreSQL transaction: the same table and statements as
//! `idemcache_postgres::outbox` ([`idemcache_sql::outbox::postgres`]), so both crates
//! may share one table.
//!
//! Invariant: the one of [`idemcache_sql::outbox::postgres`], whose statements this
//! module runs: one claim leases a row at a time (`FOR UPDATE SKIP LOCKED`), under a new
//! token, and every mark is fenced by it. Its docs explain the per-key order, the times
//! and the notification [`enqueue`] sends (listen with sqlx's `PgListener` on
//! [`CHANNEL`], and end the relay's wait on its `recv`).

use std::time::{Duration, SystemTime};

use sqlx::postgres::PgRow;
use sqlx::{Executor, PgPool, Postgres, Transaction};

use idemcache::store::encoding::{micros, to_micros};
use idemcache_sql::outbox::decode::{self, RawRow};
use idemcache_sql::outbox::postgres::{
    BEGIN_ATTEMPT, CLAIM, DELIVERED, DELIVERED_AND_BEGIN, ENQUEUE, ENSURE_SCHEMA, FAILED, INSPECT,
    LIST_DEAD, PURGE, REQUEUE,
};
use idemcache_sql::outbox::{check_claim, clip_error};

use super::{
    database, raw_row, Batch, Lease, Mark, OutboxAdmin, OutboxError, OutboxMessage, OutboxRow,
    OutboxStorage, Retry,
};

pub use idemcache_sql::outbox::postgres::{CHANNEL, SCHEMA};

/// Creates the outbox's table and indexes if they do not exist, under an advisory lock
/// so that several processes may run it at once.
pub async fn ensure_schema<'e, E>(executor: E) -> Result<(), OutboxError>
where
    E: Executor<'e, Database = Postgres>,
{
    executor.execute(sqlx::raw_sql(ENSURE_SCHEMA)).await.map(drop).map_err(database)
}

/// Writes `message` inside `tx`, the transaction of the change it announces, and
/// notifies [`CHANNEL`] at the commit. A row with the same message id is
/// [`OutboxError::Duplicate`], and **`tx` is then aborted**: roll it back.
pub async fn enqueue(
    tx: &mut Transaction<'_, Postgres>,
    message: &OutboxMessage,
) -> Result<(), OutboxError> {
    message.check()?;
    let done = sqlx::query(ENQUEUE)
        .bind(message.id())
        .bind(message.topic())
        .bind(&message.payload()[..])
        .bind(message.encoded_headers())
        .bind(message.aggregate_key())
        .execute(&mut **tx)
        .await;
    match done {
        Ok(_) => Ok(()),
        Err(e) if crate::is_unique_violation(&e) => {
            Err(OutboxError::Duplicate(message.id().to_owned()))
        }
        Err(e) => Err(database(e)),
    }
}

/// Leases up to `batch` due rows until `now + lease`, oldest first, each under a new
/// fencing token, skipping rows another claim holds: one statement (outside a
/// transaction of yours, so that its leases commit at once).
pub async fn claim_due<'e, E>(
    executor: E,
    batch: usize,
    lease: Duration,
    now: SystemTime,
) -> Result<Batch, OutboxError>
where
    E: Executor<'e, Database = Postgres>,
{
    check_claim(batch, lease)?;
    let now_us = to_micros(now);
    let rows = sqlx::query(CLAIM)
        .bind(now_us)
        .bind(limit(batch))
        .bind(now_us.saturating_add(micros(lease)))
        .fetch_all(executor)
        .await
        .map_err(database)?;
    Ok(decode::claimed_batch(rows.iter().map(raw)))
}

/// Counts an attempt of the row as its publish begins, if `lease` is still its lease.
pub async fn begin_attempt<'e, E>(executor: E, lease: &Lease) -> Result<Mark, OutboxError>
where
    E: Executor<'e, Database = Postgres>,
{
    let done = sqlx::query(BEGIN_ATTEMPT)
        .bind(&lease.message_id)
        .bind(decode::lease_token(lease)?)
        .execute(executor)
        .await
        .map_err(database)?;
    Ok(decode::mark(done.rows_affected()))
}

/// [`mark_delivered`] of `lease` and [`begin_attempt`] of `next`, in one statement:
/// what each did (its failure is both's).
pub async fn mark_delivered_and_begin<'e, E>(
    executor: E,
    lease: &Lease,
    now: SystemTime,
    next: &Lease,
) -> (Result<Mark, OutboxError>, Result<Mark, OutboxError>)
where
    E: Executor<'e, Database = Postgres>,
{
    let both = async {
        let (delivered, begun): (i64, i64) = sqlx::query_as(DELIVERED_AND_BEGIN)
            .bind(&lease.message_id)
            .bind(decode::lease_token(lease)?)
            .bind(to_micros(now))
            .bind(&next.message_id)
            .bind(decode::lease_token(next)?)
            .fetch_one(executor)
            .await
            .map_err(database)?;
        Ok((decode::mark(delivered.unsigned_abs()), decode::mark(begun.unsigned_abs())))
    };
    decode::both(both.await)
}

/// Marks the row delivered at `now`, if `lease` is still its lease.
pub async fn mark_delivered<'e, E>(
    executor: E,
    lease: &Lease,
    now: SystemTime,
) -> Result<Mark, OutboxError>
where
    E: Executor<'e, Database = Postgres>,
{
    let done = sqlx::query(DELIVERED)
        .bind(&lease.message_id)
        .bind(decode::lease_token(lease)?)
        .bind(to_micros(now))
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
    E: Executor<'e, Database = Postgres>,
{
    let (state, due) = decode::failed_as(lease, now, retry);
    let done = sqlx::query(FAILED)
        .bind(&lease.message_id)
        .bind(decode::lease_token(lease)?)
        .bind(state.code())
        .bind(due)
        .bind(clip_error(error).into_owned())
        .execute(executor)
        .await
        .map_err(database)?;
    Ok(decode::mark(done.rows_affected()))
}

admin_operations!(Postgres);

/// A message id as the table's `TEXT` column takes it.
fn id(message_id: &str) -> &str {
    message_id
}

/// A count as PostgreSQL's `LIMIT` takes it.
fn limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

pool_storage!(PgPool, "A relay's and an operator's storage over a sqlx PostgreSQL pool.");

/// The claim, one statement, on the pool.
async fn claim_from_pool(
    pool: &PgPool,
    batch: usize,
    lease: Duration,
    now: SystemTime,
) -> Result<Batch, OutboxError> {
    claim_due(pool, batch, lease, now).await
}

fn raw(row: &PgRow) -> Result<RawRow, OutboxError> {
    raw_row!(row, String, String::into_bytes)
}
