//! The consumer inbox on a sqlx PostgreSQL transaction: the same table and the same two
//! statements as `idemcache_postgres::inbox`, so both crates may share one table.
//!
//! Invariant: the one of [`idemcache_sql::inbox::postgres`], whose statements this module
//! runs: [`Receipt::New`] only when this transaction's `INSERT` wrote the row, and no
//! `receive` waits on another `receive`'s uncommitted record (an advisory try-lock in
//! the claiming statement answers [`Receipt::InFlight`] at once). Its docs explain the
//! lock, the isolation levels (under REPEATABLE READ or SERIALIZABLE a concurrent commit
//! is `InFlight` and aborts the transaction) and retention.

use std::time::SystemTime;

use sqlx::{Executor, Postgres, Transaction};

use idemcache::store::encoding::to_micros;
use idemcache::Fingerprint;
use idemcache_sql::inbox::check;

use super::{database, read_answer, InboxError, Receipt};

use idemcache_sql::inbox::postgres::{self, CLAIM, ENSURE_SCHEMA, PURGE, READ};
pub use idemcache_sql::inbox::postgres::{lock_key, ADVISORY_LOCK_CLASS, SCHEMA};
use idemcache_sql::inbox::receive::{Receiving, Step, Vanished};

/// SQLSTATE of a serialization failure.
const SERIALIZATION_FAILURE: &str = "40001";

/// Creates the inbox's table and index if they do not exist, under an advisory lock so
/// that several processes may run it at once. Takes a pool, a connection or a
/// transaction (`&mut *tx`).
pub async fn ensure_schema<'e, E>(executor: E) -> Result<(), InboxError>
where
    E: Executor<'e, Database = Postgres>,
{
    executor.execute(sqlx::raw_sql(ENSURE_SCHEMA)).await.map(drop).map_err(database)
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
    // A record a concurrent purge deletes between the claim and the read is claimed
    // again (the lock is still held).
    let mut receiving = Receiving::new(consumer, message_id, fingerprint, Vanished::ClaimAgain);
    loop {
        match receiving.next() {
            Step::Answer(receipt) => return Ok(receipt),
            Step::Claim => {
                let claimed = sqlx::query_as::<_, (Option<bool>, i64)>(CLAIM)
                    .bind(ADVISORY_LOCK_CLASS)
                    .bind(lock)
                    .bind(consumer)
                    .bind(message_id)
                    .bind(&fp[..])
                    .fetch_one(&mut **tx)
                    .await;
                match claimed {
                    Ok((got, inserted)) => receiving.claimed(postgres::claimed(got, inserted)),
                    Err(e) if is_serialization_failure(&e) => receiving.conflicted(),
                    Err(e) => return Err(database(e)),
                }
            }
            Step::Read => {
                let stored = sqlx::query_scalar::<_, Vec<u8>>(READ)
                    .bind(consumer)
                    .bind(message_id)
                    .fetch_optional(&mut **tx)
                    .await;
                read_answer(&mut receiving, stored, is_serialization_failure)?;
            }
        }
    }
}

purge_operation!(
    Postgres,
    i64,
    "Deletes up to `limit` records received before `cutoff` (oldest first, skipping rows another purge is deleting) and returns how many: call it until it returns less than `limit`. `limit` 0 deletes nothing. Take `cutoff` from [`Purger::cutoff`](super::Purger::cutoff)."
);

fn is_serialization_failure(e: &sqlx::Error) -> bool {
    e.as_database_error().and_then(|d| d.code()).is_some_and(|c| c == SERIALIZATION_FAILURE)
}
